// A generic dispatcher for an op with several implementations ("arms"). It knows no particular op:
// the op hands it its arms, its policy (default arm, environment variable names) and its output
// shapes. The seam picks the arm that runs each call, builds the one custom tape node of a fused
// arm (or lets a composite arm record itself on the tape; or runs a fused arm's forward and
// backward as one, where the caller wants only the inputs' cotangents), counts what ran, and
// records every decline with its reason. Every decision is made before any arm computes, so no fused forward
// ever runs and is then discarded: the node's forward values are exactly what the caller receives.
// A subclass can run a call otherwise through three protected members (run, count, record); only
// the proof's planted defects (checks/mutants.ts) do, on seams of their own.

import { customNode, type Data, tapeOf, type Tensor } from "../tape/mod.ts";
import type { ComputeDType } from "../base/dtype.ts";
import { readEnv } from "./_env.ts";
import type {
  DispatchOptions,
  FusedArm,
  SeamArm,
  SeamCounts,
  SeamDecision,
  SeamPolicy,
} from "./types.ts";

export type * from "./types.ts";

/** The arm chosen for a call, and what the choice must record. */
interface Choice {
  /** The arm the call wanted. */
  wanted: string;
  /** The arm that runs. */
  ran: string;
  /** Why it is not the one wanted (or why a wish was not honoured). */
  reasons: string[];
  /** No stderr warnings. */
  quiet: boolean;
  /** The environment variables that could not be read, in words. */
  envNote: string | null;
  /** The default rule's note, worth recording for this call. */
  defaultNote?: string;
}

/** How many decisions a seam keeps; older ones are dropped (their count is kept in `index`). */
const DECISION_LOG_SIZE = 64;

/**
 * A dispatcher for one op: it owns the counters and the decision log of that op.
 *
 * @example Usage
 * ```ts
 * import { Seam } from "./seam.ts";
 * import { constant, scale } from "../tape/mod.ts";
 * const seam = new Seam<{ n: number }>({
 *   op: "double",
 *   arms: [{
 *     name: "plain",
 *     kind: "composite",
 *     dtypes: ["f64", "f32"],
 *     whyNot: () => null,
 *     record: (_r, [x]) => [scale(x!, 2)],
 *   }],
 *   defaultArm: () => ({ arm: "plain", note: null }),
 *   outputShapes: (r) => [[r.n]],
 *   env: { force: "DOUBLE_ARM", require: "DOUBLE_REQUIRE_ARM", quiet: "DOUBLE_QUIET" },
 * });
 * const { outputs } = await seam.dispatch([constant("f64", [1, 2])], { n: 2 });
 * ```
 */
export class Seam<R> {
  readonly #policy: SeamPolicy<R>;
  readonly #counts: SeamCounts = {
    asked: 0,
    fusedFwd: 0,
    fusedBwd: 0,
    declined: 0,
    opsPath: 0,
    customNodeBwd: 0,
    variants: {},
  };
  readonly #decisions: SeamDecision[] = [];
  #recorded = 0;
  readonly #warned = new Set<string>();
  // A fused node whose tape is dropped without a dispose would hold what it saved forever; once
  // its output is collected nothing can run that backward, so release it then.
  readonly #releaseWhenCollected = new FinalizationRegistry<() => void>((release) => release());

  /**
   * Makes a seam for one op.
   *
   * @param policy The op's arms, default rule, output shapes and environment variable names.
   */
  constructor(policy: SeamPolicy<R>) {
    if (policy.arms.length === 0) throw new RangeError("policy.arms must not be empty: got 0 arms");
    this.#policy = policy;
  }

  /**
   * The policy this seam was made with, so that a seam can be derived from it: the same op over
   * wrapped arms is `new Seam({ ...seam.policy, arms })`, a subclass overriding `run` is
   * `new Sub(seam.policy)`.
   */
  get policy(): SeamPolicy<R> {
    return this.#policy;
  }

  /** The arms' names, fastest first. */
  get armNames(): string[] {
    return this.#policy.arms.map((a) => a.name);
  }

  /**
   * The element types an arm computes in, the most precise first.
   *
   * @param name The arm's name.
   * @returns Its dtypes.
   */
  armDtypes(name: string): readonly ComputeDType[] {
    return this.#arm(this.#checkArmName("arm", name)).dtypes;
  }

  /** Why an arm cannot run a call: a dtype it does not take, else the arm's own reason. */
  async #whyNot(
    arm: SeamArm<R>,
    request: R,
    dtype: ComputeDType,
    backward: boolean,
  ): Promise<string | null> {
    if (!arm.dtypes.includes(dtype)) {
      return `the ${arm.name} arm runs ${arm.dtypes.join(" or ")} only: got an ${dtype} tape`;
    }
    return await arm.whyNot(request, dtype, { backward });
  }

  /** Counts a forward of an arm, under its variant when it has one (recording a rule's note). */
  #countVariant(arm: SeamArm<R>, request: R, wanted: string): string | undefined {
    const v = arm.variant?.(request);
    if (v === undefined) return undefined;
    const key = `${arm.name}:${v.name}`;
    this.#counts.variants[key] = (this.#counts.variants[key] ?? 0) + 1;
    if (v.note !== null) this.record(wanted, arm.name, v.note, v.name);
    return v.name;
  }

  /**
   * A snapshot of the counters.
   *
   * @returns The counts since the last reset.
   */
  counts(): SeamCounts {
    return { ...this.#counts, variants: { ...this.#counts.variants } };
  }

  /**
   * The most recent decisions (at most 64), oldest first; `index` counts all since the last reset.
   *
   * @returns A copy of the kept decisions.
   */
  decisions(): SeamDecision[] {
    return this.#decisions.map((d) => ({ ...d }));
  }

  /** Zeroes the counters and forgets the decisions (the once-per-process warnings stay given). */
  reset(): void {
    for (const key of Object.keys(this.#counts) as (keyof SeamCounts)[]) {
      if (key !== "variants") this.#counts[key] = 0;
    }
    this.#counts.variants = {};
    this.#decisions.length = 0;
    this.#recorded = 0;
  }

  /**
   * Records a decision (for a subclass that runs a call otherwise, see {@linkcode Seam.run}).
   *
   * @param wanted The arm the call wanted.
   * @param ran The arm that ran.
   * @param reason Why, in words.
   * @param variant The variant of the arm that ran, where the arm has variants.
   */
  protected record(wanted: string, ran: string, reason: string, variant?: string): void {
    this.#recorded++;
    this.#decisions.push({
      wanted,
      ran,
      reason,
      index: this.#recorded,
      ...(variant !== undefined ? { variant } : {}),
    });
    if (this.#decisions.length > DECISION_LOG_SIZE) this.#decisions.shift();
  }

  /** Prints `line` on stderr unless quiet or already said under `key` in this process. */
  #say(quiet: boolean, key: string, line: string): void {
    if (quiet || this.#warned.has(key)) return;
    this.#warned.add(key);
    console.error(line);
  }

  #warn(quiet: boolean, wanted: string, ran: string, reason: string): void {
    const what = wanted === ran
      ? `the ${ran} arm ran, but ${reason}`
      : `the ${wanted} arm was wanted but the ${ran} arm ran: ${reason}`;
    this.#say(
      quiet,
      `${wanted}\u0000${ran}\u0000${reason}`,
      `${this.#policy.op}: ${what} (said once per process; quiet: true or ` +
        `${this.#policy.env.quiet}=1 silences it)`,
    );
  }

  #arm(name: string): SeamArm<R> {
    const arm = this.#policy.arms.find((a) => a.name === name);
    if (arm === undefined) throw new Error(`internal: no arm ${name}`);
    return arm;
  }

  #checkArmName(what: string, value: unknown): string {
    if (typeof value !== "string" || !this.armNames.includes(value)) {
      throw new RangeError(
        `${what} must be one of ${this.armNames.join(", ")}: got ${String(value)}`,
      );
    }
    return value;
  }

  /**
   * The arm a call runs, after the caller's wish, the environment and each arm's limits (recording
   * nothing but a pinned call's decline: the caller records the choice, see #note). A call
   * whose data is `pinned` to one arm's device runs there or nowhere: a binding wish for another
   * arm is refused (`options.arm`, or the require variable for a call that names no arm), a
   * forcing one (the force variable, for a call that names no arm) recorded as not honoured, and
   * a reason that arm cannot run the call is a counted, recorded decline thrown as a RangeError.
   */
  async #choose(
    request: R,
    dtype: ComputeDType,
    options: DispatchOptions,
    backward: boolean,
    pinned?: string,
  ): Promise<Choice> {
    const { env, op } = this.#policy;
    const explicit = options.arm === undefined
      ? undefined
      : this.#checkArmName("options.arm", options.arm);
    const require = readEnv(env.require), force = readEnv(env.force), quietEnv = readEnv(env.quiet);
    const required = require.value === undefined
      ? undefined
      : this.#checkArmName(env.require, require.value);
    const forced = force.value === undefined
      ? undefined
      : this.#checkArmName(env.force, force.value);
    if (pinned !== undefined) {
      const where = `the data lives on the ${pinned} arm's device`;
      if (explicit !== undefined && explicit !== pinned) {
        throw new RangeError(`options.arm must be ${pinned} when ${where}: got ${explicit}`);
      }
      // as for any call, an arm the call names beats the variables (which apply to calls that
      // name none)
      if (explicit === undefined && required !== undefined && required !== pinned) {
        throw new Error(
          `${op}: ${env.require}=${required} requires the ${required} arm, but ${where}`,
        );
      }
      const reason = await this.#whyNot(this.#arm(pinned), request, dtype, backward);
      if (reason !== null) {
        this.#counts.declined++;
        this.record(pinned, "none", reason);
        throw new RangeError(`${op}: ${where}, but that arm cannot run this call: ${reason}`);
      }
      const reasons = explicit === undefined && forced !== undefined && forced !== pinned
        ? [`${env.force}=${forced} is not honoured: ${where}`]
        : [];
      // only the require variable could have changed such a call (by refusing it)
      const envNote = require.unreadable && explicit === undefined
        ? `${env.require} could not be read (no env permission), so it is not honoured`
        : null;
      return {
        wanted: pinned,
        ran: pinned,
        reasons,
        quiet: options.quiet ?? quietEnv.value === "1",
        envNote,
      };
    }
    if (options.strict !== undefined && typeof options.strict !== "boolean") {
      throw new TypeError(`options.strict must be a boolean: got ${typeof options.strict}`);
    }
    if (options.quiet !== undefined && typeof options.quiet !== "boolean") {
      throw new TypeError(`options.quiet must be a boolean: got ${typeof options.quiet}`);
    }
    const quiet = options.quiet ?? quietEnv.value === "1";
    const strict = options.strict ?? required !== undefined;
    let wanted: string;
    let defaultNote: string | null = null;
    if (explicit !== undefined) wanted = explicit;
    else if (required !== undefined) wanted = required;
    else ({ arm: wanted, note: defaultNote } = await this.#policy.defaultArm(request, dtype));
    const reasons: string[] = [];
    let arm = wanted;
    if (explicit === undefined && forced !== undefined && forced !== wanted) {
      reasons.push(`forced by ${env.force}=${forced}`);
      arm = forced;
    }
    // Fall back along the arms' order, recording each reason; the last arm must run.
    const order = this.armNames;
    for (;;) {
      const reason = await this.#whyNot(this.#arm(arm), request, dtype, backward);
      if (reason === null) break;
      reasons.push(reason);
      const next = order.indexOf(arm) + 1;
      if (next >= order.length) {
        throw new Error(`${this.#policy.op}: no arm can run this call: ${reasons.join("; ")}`);
      }
      arm = order[next];
    }
    if (arm !== wanted && strict) {
      // say where the wanted arm came from: a caller who named none did not require the default
      const source = explicit !== undefined
        ? "asked for by options.arm"
        : required !== undefined
        ? `required by ${env.require}`
        : "the default arm";
      throw new Error(
        `${this.#policy.op} arm ${wanted} (${source}) did not run, and strict mode runs no other: ` +
          reasons.join("; "),
      );
    }
    // A policy the caller may have set must not be lost in silence, but a variable that could not
    // have changed this call is not worth a word: the force variable matters only to a call that
    // names no arm; the require variable to such a call too, or by making a decline an error when
    // the call left strict unsaid.
    const matters = [
      require.unreadable &&
      (explicit === undefined || (options.strict === undefined && arm !== wanted)),
      force.unreadable && explicit === undefined,
    ];
    const unreadable = [env.require, env.force].filter((_, i) => matters[i]);
    const envNote = unreadable.length === 0
      ? null
      : `${unreadable.join(" and ")} could not be read (no env permission), so ${
        unreadable.length > 1 ? "neither is" : "it is not"
      } honoured`;
    return {
      wanted,
      ran: arm,
      reasons,
      quiet,
      envNote,
      ...(defaultNote !== null && arm === wanted ? { defaultNote } : {}),
    };
  }

  /**
   * Runs the op on the arm the options, the environment and the arms' limits pick, counting what
   * ran and recording every decline with its reason.
   *
   * @param inputs The op's inputs as tape tensors of one dtype, in the op's order (undefined for
   *   an absent optional input).
   * @param request The op's request (dimensions and settings), validated by the caller.
   * @param options Arm, strictness and quietness.
   * @returns The outputs and the arm that ran.
   */
  async dispatch(
    inputs: readonly (Tensor | undefined)[],
    request: R,
    options: DispatchOptions = {},
  ): Promise<{ outputs: Tensor[]; arm: string }> {
    this.#counts.asked++;
    const first = inputs.find((t) => t !== undefined);
    if (first === undefined) throw new RangeError("inputs must hold a tensor: got none");
    const dtype = first.dtype;
    const choice = await this.#choose(request, dtype, options, tapeOf(inputs) !== undefined);
    this.#note(choice);
    const { wanted, ran } = choice;
    return { outputs: await this.run(this.#arm(ran), inputs, request, wanted), arm: ran };
  }

  /** Counts a chosen call's decline, and records and warns of what its choice must tell. */
  #note({ wanted, ran, reasons, quiet, envNote, defaultNote }: Choice): void {
    if (defaultNote !== undefined) this.record(wanted, ran, defaultNote);
    const noted = envNote === null ? reasons : [...reasons, envNote];
    if (ran !== wanted) this.#counts.declined++;
    if (noted.length > 0) this.record(wanted, ran, noted.join("; "));
    if (ran !== wanted || reasons.length > 0) this.#warn(quiet, wanted, ran, reasons.join("; "));
    if (envNote !== null) {
      // One line per process, whatever the calls: the decisions carry it for each call it touched.
      this.#say(quiet, "unreadable env", `${this.#policy.op}: ${envNote} (said once per process)`);
    }
  }

  /**
   * The inputs' cotangents of one call, for a caller that wants those alone, without a tape: the
   * chosen fused arm's `vjp` runs forward and backward as one and hands out no output. The arm is
   * chosen as `dispatch` chooses one for a call with a backward, its declines recorded and warned
   * of as there, and the call counted as a fused node's forward and backward (not customNodeBwd: no
   * node is entered). Where the chosen arm has no `vjp`, nothing runs and nothing is counted or
   * recorded: null says so, and the caller records the call on a tape, where `dispatch` makes the
   * same choice. A subclass that runs calls otherwise through {@linkcode Seam.run} should refuse
   * this route (return null) too.
   *
   * @param request The op's request (dimensions and settings), validated by the caller.
   * @param call The inputs' dtype, the inputs' values in the op's order (undefined for an absent
   *   optional input), and the outputs' cotangents (null for none).
   * @param options Arm, strictness and quietness.
   * @returns The inputs' cotangents (null for none) and the arm that ran, or null (see above).
   */
  async vjp(
    request: R,
    call: {
      dtype: ComputeDType;
      inputs: readonly (Data | undefined)[];
      cotangents: readonly (Data | null)[];
    },
    options: DispatchOptions = {},
  ): Promise<{ grads: (Data | null)[]; arm: string } | null> {
    const choice = await this.#choose(request, call.dtype, options, true).catch((error) => {
      this.#counts.asked++; // a refused call is asked for, as in dispatch
      throw error;
    });
    const arm = this.#arm(choice.ran);
    if (arm.kind !== "fused" || arm.vjp === undefined) return null;
    this.#counts.asked++;
    this.#note(choice);
    const grads = await arm.vjp(request, call.inputs, call.cotangents);
    this.#counts.fusedFwd++;
    this.#countVariant(arm, request, choice.wanted);
    this.#counts.fusedBwd++;
    return { grads, arm: arm.name };
  }

  /**
   * Runs the arm `dispatch` chose for one call: a composite arm records itself on the tape
   * (counted as opsPath), a fused arm becomes one custom tape node (counted as fusedFwd, and its
   * backward as customNodeBwd and fusedBwd).
   *
   * This, {@linkcode Seam.count} and {@linkcode Seam.record} are the seam's whole extension
   * surface. A subclass that runs a call differently must say so through them, so that what it did
   * shows in the counters and the decisions; no production seam overrides it. The gradient proof's
   * planted defects and its falsification are such subclasses (checks/mutants.ts), built outside
   * the production path.
   *
   * @param arm The arm chosen for the call.
   * @param inputs The op's inputs, as given to `dispatch`.
   * @param request The op's request, as given to `dispatch`.
   * @param wanted The arm the call wanted (for the decisions).
   * @returns The op's outputs.
   */
  protected async run(
    arm: SeamArm<R>,
    inputs: readonly (Tensor | undefined)[],
    request: R,
    wanted: string,
  ): Promise<Tensor[]> {
    if (arm.kind === "composite") {
      this.#counts.opsPath++;
      this.#countVariant(arm, request, wanted);
      return arm.record(request, inputs);
    }
    return await this.#runFused(arm, inputs, request, wanted);
  }

  /**
   * Adds one to a counter (for a subclass that runs a call itself, see {@linkcode Seam.run}).
   *
   * @param counter The counter.
   */
  protected count(counter: Exclude<keyof SeamCounts, "variants">): void {
    this.#counts[counter]++;
  }

  /**
   * Whether nothing in the options or the environment (both variables readable) wants another arm
   * than `arm`: a caller that knows `arm` to be the default and able to run the call may then pin
   * it there ({@linkcode Seam.runOnDevice}), which counts and records what `dispatch` would.
   *
   * @param arm The arm.
   * @param options The call's options.
   * @returns Whether nothing but the default and the arm's limits decide the call.
   */
  leavesTo(arm: string, options: DispatchOptions = {}): boolean {
    if (options.arm !== undefined && options.arm !== arm) return false;
    const { env } = this.#policy;
    return [env.require, env.force].every((name) => {
      const { value, unreadable } = readEnv(name);
      return !unreadable && (value === undefined || value === arm);
    });
  }

  /**
   * Runs a call whose data already lives on one fused arm's device, so that no other arm can take
   * it without a host copy the caller did not ask for. The call is counted like any other. A wish
   * for another arm is refused when it is binding (`options.arm`, the require variable) and
   * recorded as not honoured when it is not (the force variable). When the arm cannot run the
   * call, the decline is counted, recorded with its reason and thrown: there is nowhere to fall
   * back to.
   *
   * @param request The op's request (dimensions and settings), validated by the caller.
   * @param call `arm` (whose device holds the data), `dtype`, whether `run` also runs the arm's
   *   `backward`, and `run`, which runs the call on that arm.
   * @param options Arm, strictness and quietness.
   * @returns What `run` returns.
   */
  async runOnDevice<T>(
    request: R,
    call: { arm: string; dtype: ComputeDType; backward: boolean; run: () => Promise<T> },
    options: DispatchOptions = {},
  ): Promise<T> {
    this.#counts.asked++;
    const arm = this.#arm(this.#checkArmName("call.arm", call.arm));
    if (arm.kind !== "fused") {
      throw new TypeError(`call.arm must be a fused arm: got the composite arm ${arm.name}`);
    }
    const { reasons, quiet, envNote } = await this.#choose(
      request,
      call.dtype,
      options,
      call.backward,
      arm.name,
    );
    for (const note of reasons) {
      this.record(arm.name, arm.name, note);
      this.#warn(quiet, arm.name, arm.name, note);
    }
    if (envNote !== null) {
      this.record(arm.name, arm.name, envNote);
      this.#say(quiet, "unreadable env", `${this.#policy.op}: ${envNote} (said once per process)`);
    }
    const result = await call.run();
    this.#counts.fusedFwd++;
    this.#countVariant(arm, request, arm.name);
    if (call.backward) this.#counts.fusedBwd++;
    return result;
  }

  async #runFused(
    arm: FusedArm<R>,
    inputs: readonly (Tensor | undefined)[],
    request: R,
    wanted: string,
  ): Promise<Tensor[]> {
    const needsGrad = tapeOf(inputs) !== undefined;
    const { outputs, saved } = await arm.forward(request, inputs.map((t) => t?.data), needsGrad);
    this.#counts.fusedFwd++;
    this.#countVariant(arm, request, wanted);
    let released = false;
    const release = () => {
      if (released || saved === undefined) return;
      released = true;
      arm.release?.(saved);
    };
    const shapes = this.#policy.outputShapes(request);
    let tensors: Tensor[];
    try {
      tensors = customNode(`${this.#policy.op}.${arm.name}`, {
        inputs: needsGrad ? inputs : [],
        outputs: outputs.map((data, i) => ({ data, shape: shapes[i] })),
        vjp: async (cotangents) => {
          this.#counts.customNodeBwd++;
          if (released) {
            throw new Error(
              `${this.#policy.op}: backward after the tape that recorded the forward was disposed`,
            );
          }
          const grads = await arm.backward(saved, cotangents);
          this.#counts.fusedBwd++;
          return grads;
        },
        dispose: release,
      });
    } catch (error) {
      // Recording failed (a disposed tape, say): nothing can run the backward, so free it now.
      release();
      throw error;
    }
    if (needsGrad && saved !== undefined) {
      this.#releaseWhenCollected.register(tensors[0], release);
    } else {
      release();
    }
    return tensors;
  }
}
