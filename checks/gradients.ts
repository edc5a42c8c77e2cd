// Per-group gradient checks that know nothing of KDA: central differences with a derived step and a
// resolvable floor, an exact directional check by forward mode, and a bit-identical rerun. The
// layer proof (prove.ts) uses the row builders; `proveGradients` runs them on anyone's layer.

import { type Data, jvp, Tape, Tensor } from "../tape/mod.ts";
import { checkKnownKeys, checkObject, shown, typeName } from "../base/check.ts";
import { mulberry32 } from "../kda/layer/_random.ts";
import {
  type CoordinateProbe,
  derivedStep,
  epsilonOf,
  probeCoordinate,
  probeIndices,
  sameBits,
} from "./compare.ts";

/** Tolerance of a resolved central difference in f64 (docs/kda.md 4). */
export const FD_TOL = 1e-6;
/**
 * Tolerance of a resolved central difference in the f32 arm's own precision. At the step derived
 * for f32 the truncation and rounding errors are of a few percent (5.3% measured on decay.a_log at
 * the trainer shape), so this column shows what f32 can resolve and catches only gross errors (a
 * wrong sign, a factor of two); the f64 differences and the exact directional check carry the
 * precision of the proof.
 */
export const FD32_TOL = 0.5;

/** One group's central-difference row. */
export interface FdRow {
  /** Group name. */
  name: string;
  /** Whether any gradient entry is non-zero. */
  nonZero: boolean;
  /** Whether every gradient entry is finite. */
  finite: boolean;
  /** The first entry that is NaN or infinite, when one is. */
  nonFinite?: { index: number; value: number };
  /** `max|grad|` (NaN when an entry is NaN). */
  gradMax: number;
  /** The derived step h*. */
  step: number;
  /** Epsilon of the precision the differences were taken in. */
  eps: number;
  /** The probed coordinates. */
  probes: CoordinateProbe[];
  /** The worst probe's `min(rel(h), rel(h/10))` (NaN when nothing was probed). */
  rel: number;
  /** Whether every probe cleared its floor. */
  resolved: boolean;
  /** Whether the row holds: non-zero, finite, resolved and within the tolerance. */
  ok: boolean;
}

/** Options of {@linkcode fdRow}. */
export interface FdRowOptions {
  /** The precision the loss is computed in. */
  dtype: "f64" | "f32";
  /** The loss's magnitude |L|. */
  lossScale: number;
  /** Tolerance of a resolved probe. */
  tol: number;
  /** How many of {@linkcode probeIndices}'s coordinates to probe (default 3). */
  probes?: number;
  /** The coordinates to probe instead, as flat indices (`probes` is then ignored). */
  indices?: readonly number[];
}

/**
 * Central differences of one group at up to three coordinates (docs/kda.md 4), or at the given
 * ones.
 *
 * @param name The group's name.
 * @param data The group's live values (moved and restored by `lossAt`).
 * @param grad The gradient under test.
 * @param lossAt The loss with coordinate `index` moved by `delta`; it must restore the value.
 * @param options Precision, loss magnitude, tolerance, and the coordinates.
 * @returns The row.
 */
export async function fdRow(
  name: string,
  data: ArrayLike<number>,
  grad: ArrayLike<number>,
  lossAt: (index: number, delta: number) => Promise<number | { loss: number; step: number }>,
  options: FdRowOptions,
): Promise<FdRow> {
  let gradMax = 0, sumSq = 0, nonZero = false;
  let nonFinite: { index: number; value: number } | undefined;
  for (let i = 0; i < grad.length; i++) {
    if (!Number.isFinite(grad[i]) && nonFinite === undefined) {
      nonFinite = { index: i, value: grad[i] };
    }
    // NaN !== 0: a NaN gradient is not a zero one.
    if (grad[i] !== 0) nonZero = true;
    gradMax = Math.max(gradMax, Math.abs(grad[i]));
  }
  const finite = nonFinite === undefined;
  for (let i = 0; i < data.length; i++) sumSq += data[i] * data[i];
  const rms = Math.sqrt(sumSq / Math.max(1, data.length));
  const eps = epsilonOf(options.dtype);
  const step = nonZero && finite ? derivedStep(eps, options.lossScale, gradMax, rms) : NaN;
  const probes: CoordinateProbe[] = [];
  if (nonZero && finite) {
    const indices = options.indices ?? probeIndices(grad).slice(0, options.probes ?? 3);
    for (const index of indices) {
      if (!(Number.isInteger(index) && index >= 0 && index < grad.length)) {
        throw new RangeError(
          `options.indices must hold flat indices below ${grad.length}: got ${index}`,
        );
      }
      probes.push(
        await probeCoordinate(
          (delta) => lossAt(index, delta),
          grad[index],
          index,
          step,
          eps,
          options.lossScale,
        ),
      );
    }
  }
  const resolved = probes.length > 0 && probes.every((p) => p.resolved);
  const rel = probes.reduce((m, p) => Math.max(m, p.resolved ? p.rel : 0), probes.length ? 0 : NaN);
  return {
    name,
    nonZero,
    finite,
    ...(nonFinite === undefined ? {} : { nonFinite }),
    gradMax,
    step,
    eps,
    probes,
    rel,
    resolved,
    ok: nonZero && finite && resolved && rel <= options.tol,
  };
}

/** An exact directional check of one group: ⟨∇L, u⟩ against the forward-mode J·u. */
export interface DirectionalRow {
  /** Group name. */
  name: string;
  /** J·u of the loss, by forward mode on the reference. */
  jvp: number;
  /** ⟨∇L, u⟩ from the gradient under test. */
  vjp: number;
  /** `|jvp − vjp| / Σ|∇L ⊙ u|` (the scale of the inner product, immune to cancellation). */
  rel: number;
  /** Whether `rel` is within the tolerance. */
  ok: boolean;
  /** Why the check could not run, when it could not. */
  skipped?: string;
}

/** A seeded direction of `n` entries, uniform in [−1, 1). */
export function direction(n: number, seed: number): Float64Array {
  if (!(Number.isSafeInteger(n) && n >= 0)) {
    throw new RangeError(`n must be a non-negative integer: got ${shown(n)}`);
  }
  if (!Number.isSafeInteger(seed)) {
    throw new RangeError(`seed must be an integer: got ${shown(seed)}`);
  }
  const uniform = mulberry32(seed);
  return Float64Array.from({ length: n }, () => 2 * uniform() - 1);
}

/**
 * Compares a forward-mode directional derivative with the inner product of a gradient and the
 * direction.
 *
 * @param name The group's name.
 * @param jvpValue J·u from forward mode.
 * @param grad The gradient under test.
 * @param u The direction.
 * @param tol The tolerance on the scaled difference.
 * @returns The row.
 */
export function directionalRow(
  name: string,
  jvpValue: number,
  grad: ArrayLike<number>,
  u: ArrayLike<number>,
  tol: number,
): DirectionalRow {
  if (grad.length !== u.length) {
    throw new RangeError(
      `grad and u must have equal lengths: got ${grad.length} and ${u.length}`,
    );
  }
  let vjp = 0, scale = 0;
  for (let i = 0; i < u.length; i++) {
    vjp += grad[i] * u[i];
    scale += Math.abs(grad[i] * u[i]);
  }
  const diff = Math.abs(jvpValue - vjp);
  const rel = scale === 0 ? (diff === 0 ? 0 : Infinity) : diff / scale;
  return { name, jvp: jvpValue, vjp, rel, ok: rel <= tol };
}

/** A layer to prove: its named parameters and its scalar loss as a function of them. */
export interface GradientSubject {
  /** The parameter groups, f64. */
  parameters: Map<string, { data: Float64Array; shape: number[] }>;
  /** The loss (one element) built from tape ops on the given parameter tensors. */
  loss: (params: Map<string, Tensor>) => Tensor | Promise<Tensor>;
}

/** Options of {@linkcode proveGradients}. */
export interface ProveGradientsOptions {
  /** Seed of the directions (default 0). */
  seed?: number;
  /** Tolerance of the directional check (default 1e-10). */
  directionalTol?: number;
  /** Tolerance of resolved central differences (default 1e-6). */
  fdTol?: number;
  /**
   * When a group's directional check cannot run (a custom node on its path has no JVP rule),
   * central differences probe every coordinate of a group of at most this many entries, and the
   * group holds only if every one is resolved and agrees; a larger group is probed at this many
   * coordinates spread over it and is reported NOT PROVEN (default 128).
   */
  probeAllUpTo?: number;
}

/** One group's verdict from {@linkcode proveGradients}. */
export interface ProveGradientsRow {
  /** Group name. */
  name: string;
  /** Whether every check of the group holds. */
  ok: boolean;
  /**
   * A one-line status: RESOLVED ok, UNRESOLVED by FD but exact by JVP, NOT PROVEN (no exact check
   * could run and central differences did not cover the group), or FAIL and why.
   */
  status: string;
  /** The central differences. */
  fd: FdRow;
  /** The directional check. */
  directional: DirectionalRow;
}

/** What {@linkcode proveGradients} measured. */
export interface ProveGradientsReport {
  /** Whether every group holds (none failed, none left unproven) and the rerun is bit-identical. */
  ok: boolean;
  /** One row per group. */
  rows: ProveGradientsRow[];
  /** The groups that did not fail but could not be proven (see `probeAllUpTo`). */
  notProven: string[];
  /** The loss. */
  loss: number;
  /** Whether a second backward gave the same bits. */
  reproducible: boolean;
}

/**
 * The coordinates central differences probe when no exact check can run: all of a group of at
 * most `limit` entries, else the usual three and the rest of `limit` spread evenly over the group.
 */
function coverageIndices(grad: ArrayLike<number>, limit: number): number[] {
  const n = grad.length;
  if (n <= limit) return Array.from({ length: n }, (_, i) => i);
  const picks = new Set(probeIndices(grad));
  for (let i = 0; picks.size < limit; i++) picks.add(Math.floor(i * n / limit));
  return [...picks];
}

const e2 = (x: number) => x.toExponential(2);

/** One group's verdict and status line from its central differences and directional check. */
function verdict(
  fd: FdRow,
  directional: DirectionalRow,
  fdTol: number,
  size: number,
): { ok: boolean; status: string; proven: boolean } {
  if (!fd.finite) {
    const { index, value } = fd.nonFinite!;
    const what = Number.isNaN(value) ? "NaN" : "infinite";
    return { ok: false, proven: true, status: `FAIL (${what} gradient at index ${index})` };
  }
  if (!fd.nonZero) return { ok: false, proven: true, status: "FAIL (zero gradient)" };
  const failed = fd.probes.filter((p) => p.resolved && !(p.rel <= fdTol));
  const worst = failed.reduce((w, p) => (p.rel > w.rel ? p : w), failed[0]);
  const fdFail = worst === undefined
    ? ""
    : `central differences ${e2(worst.rel)} at index ${worst.index}`;
  if (directional.skipped === undefined) {
    if (!directional.ok) {
      return { ok: false, proven: true, status: `FAIL (directional ${e2(directional.rel)})` };
    }
    if (!fd.resolved) {
      // Unresolved by central differences is no pass by itself: the exact check ran and held.
      return { ok: true, proven: true, status: "UNRESOLVED by FD, exact by JVP ok" };
    }
    return fd.ok
      ? { ok: true, proven: true, status: "RESOLVED ok" }
      : { ok: false, proven: true, status: `FAIL (${fdFail})` };
  }
  // No exact check: the central differences must carry the whole group.
  const why = `no directional check: ${directional.skipped}`;
  if (worst !== undefined) return { ok: false, proven: true, status: `FAIL (${fdFail}; ${why})` };
  const resolved = fd.probes.filter((p) => p.resolved).length;
  if (fd.probes.length === size && resolved === size) {
    return { ok: true, proven: true, status: `RESOLVED ok at all ${size} coordinates (${why})` };
  }
  return {
    ok: false,
    proven: false,
    status: `NOT PROVEN (${why}; central differences resolved and agree at ${resolved} of ` +
      `${size} coordinates, ${fd.probes.length - resolved} probed UNRESOLVED)`,
  };
}

async function lossAndGrads(
  subject: GradientSubject,
): Promise<{ loss: number; grads: Map<string, Data> }> {
  const tape = new Tape("f64");
  try {
    const vars = new Map<string, Tensor>();
    for (const [name, p] of subject.parameters) vars.set(name, tape.variable(p.data, p.shape));
    const y = await subject.loss(vars);
    if (!(y instanceof Tensor) || y.size !== 1) {
      throw new TypeError(
        `subject.loss must return a one-element Tensor: got ${
          y instanceof Tensor ? `${y.size} elements` : typeof y
        }`,
      );
    }
    const byTensor = await tape.backward(y);
    const grads = new Map<string, Data>();
    for (const [name, t] of vars) grads.set(name, byTensor.get(t) ?? new Float64Array(t.size));
    return { loss: y.data[0], grads };
  } finally {
    tape.dispose();
  }
}

/**
 * Proves the gradients of any f64 layer, group by group: central differences at a derived step
 * with a resolvable floor, an exact directional check by forward mode, and a bit-identical rerun
 * of the backward. Where a custom node on a group's path has no JVP rule the exact check cannot
 * run: central differences then probe every coordinate of a small group (`probeAllUpTo`), and a
 * group they cannot cover entirely is reported NOT PROVEN, which fails the report.
 *
 * @param subject The named parameters and the loss built from tape ops on them.
 * @param options Seed and tolerances.
 * @returns Whether it holds, a row per group, and the groups left unproven.
 *
 * @example Proving a small layer
 * ```ts
 * import { proveGradients } from "@deltanet/kda/checks";
 * import { linear, mul, sum, Tensor } from "@deltanet/kda/tape";
 * const x = new Tensor(Float64Array.from({ length: 6 }, (_, i) => i / 6), [2, 3]);
 * const report = await proveGradients({
 *   parameters: new Map([["w", { data: Float64Array.of(0.1, -0.2, 0.3, 0.4, 0.5, -0.6), shape: [2, 3] }]]),
 *   loss: (p) => {
 *     const y = linear(x, p.get("w")!);
 *     return sum(sum(mul(y, y), 1), 0);
 *   },
 * });
 * console.log(report.ok, report.rows[0].status);
 * ```
 */
export async function proveGradients(
  subject: GradientSubject,
  options: ProveGradientsOptions = {},
): Promise<ProveGradientsReport> {
  if (!(subject?.parameters instanceof Map) || typeof subject.loss !== "function") {
    const got = subject === null || typeof subject !== "object"
      ? typeName(subject)
      : `parameters ${typeName(subject.parameters)} and loss ${typeName(subject.loss)}`;
    throw new TypeError(`subject must have parameters (a Map) and loss (a function): got ${got}`);
  }
  checkKnownKeys("options", checkObject("options", options), [
    "seed",
    "directionalTol",
    "fdTol",
    "probeAllUpTo",
  ]);
  const seed = options.seed ?? 0;
  if (!Number.isSafeInteger(seed) || !Number.isSafeInteger(seed * 1000)) {
    throw new RangeError(`options.seed must be an integer: got ${shown(seed)}`);
  }
  const dirTol = options.directionalTol ?? 1e-10;
  const fdTol = options.fdTol ?? FD_TOL;
  const probeAllUpTo = options.probeAllUpTo ?? 128;
  if (!(Number.isInteger(probeAllUpTo) && probeAllUpTo >= 1)) {
    throw new RangeError(`options.probeAllUpTo must be a positive integer: got ${probeAllUpTo}`);
  }
  const { loss, grads } = await lossAndGrads(subject);
  if (!Number.isFinite(loss)) {
    throw new RangeError(`subject.loss must return a finite value: got ${loss}`);
  }
  const again = await lossAndGrads(subject);
  const reproducible = [...grads].every(([name, g]) => sameBits(g, again.grads.get(name)!));
  const lossScale = Math.max(Math.abs(loss), Number.MIN_VALUE);
  const constants = () => {
    const m = new Map<string, Tensor>();
    for (const [name, p] of subject.parameters) m.set(name, new Tensor(p.data, p.shape));
    return m;
  };
  const rows: ProveGradientsRow[] = [];
  const notProven: string[] = [];
  const names = [...subject.parameters.keys()];
  for (const [gi, name] of names.entries()) {
    const p = subject.parameters.get(name)!;
    const grad = grads.get(name)!;
    const u = direction(p.data.length, seed * 1000 + gi);
    let directional: DirectionalRow;
    try {
      const primals = names.map((n) =>
        new Tensor(subject.parameters.get(n)!.data, subject.parameters.get(n)!.shape)
      );
      const tangents = names.map((n) =>
        n === name ? u : new Float64Array(subject.parameters.get(n)!.data.length)
      );
      const { tangents: [dl] } = await jvp(
        (...ps: Tensor[]) => subject.loss(new Map(names.map((n, i) => [n, ps[i]]))),
        primals,
        tangents,
      );
      directional = directionalRow(name, dl[0], grad, u, dirTol);
    } catch (error) {
      directional = {
        name,
        jvp: NaN,
        vjp: NaN,
        rel: NaN,
        ok: true,
        skipped: error instanceof Error ? error.message : String(error),
      };
    }
    // Without the exact check, three probes leave every other coordinate unchecked: probe all of a
    // small group, or many of a large one (which then stays unproven).
    const exact = directional.skipped === undefined;
    const indices = exact ? undefined : coverageIndices(grad, probeAllUpTo);
    const fd = await fdRow(name, p.data, grad, async (index, delta) => {
      const original = p.data[index];
      p.data[index] = original + delta;
      try {
        return (await subject.loss(constants())).data[0];
      } finally {
        p.data[index] = original;
      }
    }, { dtype: "f64", lossScale, tol: fdTol, ...(indices ? { indices } : {}) });
    const { ok, status, proven } = verdict(fd, directional, fdTol, grad.length);
    if (!proven) notProven.push(name);
    rows.push({ name, ok, status, fd, directional });
  }
  return { ok: reproducible && rows.every((r) => r.ok), rows, notProven, loss, reproducible };
}
