// The one place that decides which arm runs the KDA op, and keeps count of what really ran.
// Every decision is made before any arm computes, so no forward ever runs and is then discarded:
// the custom node's forward values are the values the caller receives.

import { alloc, customNode, type Data, tapeOf, type Tensor } from "../tape/mod.ts";
import type { Arm, ChunkSize, Float, RawKda } from "../kda/_types.ts";
import { MAX_HEAD_DIM } from "../kda/_types.ts";
import { type KdaDims, type KdaTensors, recurrentKda } from "../kda/recurrent.ts";
import { chunkBackward, chunkForward } from "../kda/chunk.ts";
import {
  gpuBackward,
  gpuForward,
  type GpuSaved,
  gpuStatus,
  gpuUnsupportedReason,
} from "../kda/gpu.ts";

/** How often each path of the seam was taken since the last reset. */
export interface SeamCounts {
  /** Calls of the KDA op. */
  asked: number;
  /** Forwards run by a fused (chunked custom-node) arm, `cpu` or `gpu`. */
  fusedFwd: number;
  /** Backwards a fused arm completed. */
  fusedBwd: number;
  /** Calls that ran another arm than the one wanted. */
  declined: number;
  /** Calls run by the `ops` arm (the tape's recurrence). */
  opsPath: number;
  /** Entries into a custom node's backward. */
  customNodeBwd: number;
}

/** A call that did not run as wanted, or ran with its outputs detached on request. */
export interface SeamDecision {
  /** The arm the call wanted. */
  wanted: Arm;
  /** The arm that ran. */
  ran: Arm;
  /** Why, in words. */
  reason: string;
}

/** Options of one dispatch. */
export interface SeamOptions {
  /** The arm to run; default: `KDA_REQUIRE_ARM`, else `gpu` for f32 and `cpu` for f64 work. */
  arm?: Arm;
  /** Chunk size of the chunked arms (default 16). */
  chunkSize?: ChunkSize;
  /** Throw instead of declining; default: on when `KDA_REQUIRE_ARM` is set. */
  strict?: boolean;
  /**
   * Falsification switch for the gradient checks: return the custom node's outputs as leaves, so
   * nothing upstream of the op gets a gradient. Recorded in the decisions.
   */
  detachOutputs?: boolean;
}

const counts: SeamCounts = {
  asked: 0,
  fusedFwd: 0,
  fusedBwd: 0,
  declined: 0,
  opsPath: 0,
  customNodeBwd: 0,
};
const decisions: SeamDecision[] = [];

/**
 * A snapshot of the seam's counters.
 *
 * @returns The counts since the last {@linkcode resetSeamCounts}.
 *
 * @example Usage
 * ```ts
 * import { seamCounts } from "@deltanet/kda";
 * const { asked, declined } = seamCounts();
 * ```
 */
export function seamCounts(): SeamCounts {
  return { ...counts };
}

/**
 * Zeroes the counters and forgets the recorded decisions.
 *
 * @example Usage
 * ```ts
 * import { resetSeamCounts } from "@deltanet/kda";
 * resetSeamCounts();
 * ```
 */
export function resetSeamCounts(): void {
  for (const key of Object.keys(counts) as (keyof SeamCounts)[]) counts[key] = 0;
  decisions.length = 0;
}

/**
 * The declines (and detached runs) recorded since the last reset, oldest first.
 *
 * @returns A copy of the decision list.
 *
 * @example Usage
 * ```ts
 * import { seamDecisions } from "@deltanet/kda";
 * for (const d of seamDecisions()) console.log(d.wanted, "->", d.ran, d.reason);
 * ```
 */
export function seamDecisions(): SeamDecision[] {
  return decisions.map((d) => ({ ...d }));
}

const ARMS: readonly Arm[] = ["ops", "cpu", "gpu"];

// A GPU node whose tape is dropped without a backward or a dispose would hold its device buffers
// forever; once its output is collected nothing can run that backward, so free them then.
const releaseWhenCollected = new FinalizationRegistry<GpuSaved>((saved) => {
  if (!saved.released) saved.release();
});

function readEnv(name: string): string | undefined {
  // Without env permission the variable cannot have been meant for us; read it only when granted.
  if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
    return undefined;
  }
  const value = Deno.env.get(name);
  if (value === undefined || value === "") return undefined;
  if (!(ARMS as readonly string[]).includes(value)) {
    throw new RangeError(`${name} must be one of ops, cpu, gpu: got ${value}`);
  }
  return value;
}

function checkArm(value: unknown): Arm | undefined {
  if (value === undefined) return undefined;
  if (!(ARMS as readonly unknown[]).includes(value)) {
    throw new RangeError(`options.arm must be "ops", "cpu" or "gpu": got ${String(value)}`);
  }
  return value as Arm;
}

/** Why `arm` cannot run this call, or null when it can. Asks the GPU only when needed. */
async function unsupportedReason(
  arm: Arm,
  dims: KdaDims,
  dtype: "f64" | "f32",
  chunkSize: ChunkSize,
): Promise<string | null> {
  if (arm === "ops") return null;
  if (dims.K > MAX_HEAD_DIM || dims.V > MAX_HEAD_DIM) {
    return `K = ${dims.K} and V = ${dims.V} must be at most ${MAX_HEAD_DIM} on the ${arm} arm`;
  }
  if (arm === "cpu") return null;
  if (dtype !== "f32") return "the gpu arm runs f32 only: got an f64 tape";
  const status = await gpuStatus();
  if (!status.available) return `the gpu arm is unavailable: ${status.reason}`;
  return gpuUnsupportedReason(dims, chunkSize);
}

/** The arm a call runs, after the caller's wish, the environment and each arm's limits. */
async function chooseArm(
  dims: KdaDims,
  dtype: "f64" | "f32",
  chunkSize: ChunkSize,
  options: SeamOptions,
): Promise<{ wanted: Arm; ran: Arm; reasons: string[] }> {
  const requireArm = readEnv("KDA_REQUIRE_ARM") as Arm | undefined;
  const explicit = checkArm(options.arm);
  const wanted: Arm = explicit ?? requireArm ?? (dtype === "f32" ? "gpu" : "cpu");
  if (options.strict !== undefined && typeof options.strict !== "boolean") {
    throw new TypeError(`options.strict must be a boolean: got ${typeof options.strict}`);
  }
  const strict = options.strict ?? requireArm !== undefined;
  const reasons: string[] = [];
  let arm = wanted;
  const forced = explicit === undefined ? readEnv("KDA_ARM") as Arm | undefined : undefined;
  if (forced !== undefined && forced !== wanted) {
    reasons.push(`forced by KDA_ARM=${forced}`);
    arm = forced;
  }
  // Fall back gpu -> cpu -> ops, recording each reason; ops always runs.
  for (;;) {
    const reason = await unsupportedReason(arm, dims, dtype, chunkSize);
    if (reason === null) break;
    reasons.push(reason);
    arm = arm === "gpu" ? "cpu" : "ops";
  }
  if (arm !== wanted && strict) {
    throw new Error(
      `KDA arm ${wanted} was required but cannot run: ${reasons.join("; ")}`,
    );
  }
  return { wanted, ran: arm, reasons };
}

function rawOf(x: KdaTensors, dims: KdaDims, queryScale: number): RawKda {
  return {
    ...dims,
    q: x.q.data,
    k: x.k.data,
    v: x.v.data,
    g: x.g.data,
    beta: x.beta.data,
    h0: x.h0?.data,
    scale: queryScale,
  };
}

/** The op's inputs in the order the custom nodes list them. */
function inputList(x: KdaTensors): (Tensor | undefined)[] {
  return [x.q, x.k, x.v, x.g, x.beta, x.h0];
}

function gradList(
  grads: { dq: Data; dk: Data; dv: Data; dg: Data; dbeta: Data; dh0: Data },
  hasH0: boolean,
): (Data | null)[] {
  return [grads.dq, grads.dk, grads.dv, grads.dg, grads.dbeta, hasH0 ? grads.dh0 : null];
}

/**
 * Runs the KDA op on the arm the options, the environment and the arms' limits pick, counting
 * what ran and recording every decline with its reason.
 *
 * @param x The op's inputs as tape tensors (all of one dtype).
 * @param dims `{ B, T, H, K, V, scale }`: the dimensions and the query scale.
 * @param options Arm, chunk size, strictness, and the falsification switch.
 * @returns The output `o` [B,T,H,V], the final state `ht` [B,H,K,V] and the arm that ran.
 *
 * @example Usage
 * ```ts
 * import { dispatchKda } from "@deltanet/kda";
 * import { constant } from "@deltanet/kda/tape";
 * const [B, T, H, K, V] = [1, 3, 1, 2, 2];
 * const t = (n: number, v: number) => constant("f64", new Array(n).fill(v), [n]);
 * const { o } = await dispatchKda({
 *   q: t(B * T * H * K, 0.5), k: t(B * T * H * K, 0.5), v: t(B * T * H * V, 1),
 *   g: t(B * T * H * K, -0.1), beta: t(B * T * H, 0.5),
 * }, { B, T, H, K, V, scale: K ** -0.5 }, { arm: "cpu" });
 * ```
 */
export async function dispatchKda(
  x: KdaTensors,
  dims: KdaDims & { scale: number },
  options: SeamOptions = {},
): Promise<{ o: Tensor; ht: Tensor; arm: Arm }> {
  counts.asked++;
  const { scale: queryScale, ...shape } = dims;
  const chunkSize = options.chunkSize ?? 16;
  const dtype = x.q.dtype;
  const { wanted, ran, reasons } = await chooseArm(shape, dtype, chunkSize, options);
  if (ran !== wanted) {
    counts.declined++;
    decisions.push({ wanted, ran, reason: reasons.join("; ") });
  }
  const detach = options.detachOutputs === true;
  if (detach && ran === "ops") {
    throw new TypeError(
      "options.detachOutputs applies to the custom-node arms cpu and gpu: got the ops arm",
    );
  }
  if (detach) {
    decisions.push({ wanted, ran, reason: "outputs detached on request (falsification switch)" });
  }

  if (ran === "ops") {
    counts.opsPath++;
    return { ...recurrentKda(x, shape, queryScale), arm: ran };
  }

  const inputs = inputList(x);
  const needsGrad = !detach && tapeOf(inputs) !== undefined;
  const raw = rawOf(x, shape, queryScale);
  const { B, T, H, V } = shape;
  const zerosDout = (): Float => alloc(dtype, B * T * H * V);
  const oShape = [B, T, H, V], htShape = [B, H, shape.K, V];

  if (ran === "cpu") {
    const fwd = chunkForward(raw, { chunkSize, saveStates: needsGrad });
    counts.fusedFwd++;
    const [o, ht] = customNode("kda.cpu", {
      inputs: needsGrad ? inputs : [],
      outputs: [{ data: fwd.o, shape: oShape }, { data: fwd.ht, shape: htShape }],
      vjp: ([dout, dht]) => {
        counts.customNodeBwd++;
        const grads = chunkBackward(raw, fwd.states!, {
          dout: dout ?? zerosDout(),
          dht: dht ?? undefined,
        }, { chunkSize });
        counts.fusedBwd++;
        return gradList(grads, x.h0 !== undefined);
      },
    });
    return { o, ht, arm: ran };
  }

  const fwd = await gpuForward(raw, { chunkSize, saveForBackward: needsGrad });
  counts.fusedFwd++;
  const [o, ht] = customNode("kda.gpu", {
    inputs: needsGrad ? inputs : [],
    outputs: [{ data: fwd.o, shape: oShape }, { data: fwd.ht, shape: htShape }],
    vjp: async ([dout, dht]) => {
      counts.customNodeBwd++;
      const grads = await gpuBackward(fwd.saved!, {
        dout: (dout ?? zerosDout()) as Float32Array,
        dht: (dht ?? undefined) as Float32Array | undefined,
      });
      counts.fusedBwd++;
      return gradList(grads, x.h0 !== undefined);
    },
    dispose: () => {
      if (fwd.saved !== undefined && !fwd.saved.released) fwd.saved.release();
    },
  });
  if (fwd.saved !== undefined) releaseWhenCollected.register(o, fwd.saved);
  return { o, ht, arm: ran };
}
