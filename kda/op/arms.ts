// The KDA op's three arms, handed to one generic seam: `ops` records the plain recurrence on the
// tape, `cpu` and `gpu` are fused custom nodes with hand-written chunked backwards. Every input
// reaching here has been checked once at the public boundary (kda/_check.ts). Grouped value heads
// are expanded here, before the seam, so no arm sees HV ≠ H (docs/kda.md 2.5); a packed batch
// (cuSeqlens, docs/kda.md 2.6) reaches every arm, and each handles it natively or by padding.

import {
  alloc,
  concat,
  constant,
  type Data,
  mul,
  reshape,
  slice,
  type Tensor,
} from "../../tape/mod.ts";
import {
  type CompositeArm,
  type DispatchOptions,
  type FusedArm,
  Seam,
  type SeamPolicy,
} from "../../seam/seam.ts";
import type { Arm, ChunkSize, Float, KdaDims, KdaLayout, KdaProblem } from "../_types.ts";
import { headDimProblem } from "./_check.ts";
import { recurrentKda } from "../cpu/recurrent.ts";
import { chunkBackward, chunkForward } from "../chunk.ts";
import {
  gpuBackward,
  gpuForward,
  type GpuSaved,
  gpuStatus,
  gpuUnsupportedReason,
} from "../gpu/mod.ts";
import { longestSequence, padProblem, padRows, unpadRows } from "../cpu/varlen.ts";
import { stepForward } from "../cpu/_step_math.ts";
import { type ComputeDType, computeDtypeOf } from "../../base/dtype.ts";

/**
 * What the seam is told about one KDA call. `HV` (value heads, default H) and `cuSeqlens` (a
 * packed batch) are optional; `step` marks a one-token decode step (T = 1), which the cpu arm runs
 * as the plain recurrence on the host.
 */
export interface KdaRequest extends KdaDims, KdaLayout {
  /** The resolved query scale. */
  scale: number;
  /** Chunk size of the chunked arms; absent, each takes its default (DEFAULT_CHUNK_SIZES). */
  chunkSize?: ChunkSize;
  /** A decode step (docs/kda.md 2.7): T = 1, inference only. */
  step?: boolean;
}

/**
 * The chunk size each chunked arm runs when a call names none, picked by measurement: the cpu arm
 * is fastest at 16 (kdaVjp at B=2, T=256, H=2, K=V=32 in f64: 13.7 ms at C=16, 16.1 at 32, 28.6 at
 * 64, medians here), the gpu arm at 64 (H200, bench/results/REPORT.md: fwd+bwd 38.8 ms at C=64
 * against 39.6 at 32 and 56.9 at 16 for (4, 4096, 16, 128)).
 */
export const DEFAULT_CHUNK_SIZES: Readonly<{ cpu: ChunkSize; gpu: ChunkSize }> = Object.freeze({
  cpu: 16,
  gpu: 64,
});

function problemOf(request: KdaRequest, inputs: readonly (Data | undefined)[]): KdaProblem {
  const [q, k, v, g, beta, h0] = inputs as (Float | undefined)[];
  const { B, T, H, K, V, scale, cuSeqlens } = request;
  return {
    B,
    T,
    H,
    K,
    V,
    scale,
    q: q!,
    k: k!,
    v: v!,
    g: g!,
    beta: beta!,
    ...(h0 ? { h0 } : {}),
    ...(cuSeqlens ? { cuSeqlens } : {}),
  };
}

/** Sequences of a packed call (N), else the batch (B): the leading axis of h0 and ht. */
function statesOf(request: KdaRequest): number {
  return request.cuSeqlens === undefined ? request.B : request.cuSeqlens.length - 1;
}

/** dq..dbeta, and dh0 only where h0 was an input. */
function gradList(
  grads: { dq: Data; dk: Data; dv: Data; dg: Data; dbeta: Data; dh0: Data },
  hasH0: boolean,
): (Data | null)[] {
  return [grads.dq, grads.dk, grads.dv, grads.dg, grads.dbeta, hasH0 ? grads.dh0 : null];
}

const opsArm: CompositeArm<KdaRequest> = {
  name: "ops",
  kind: "composite",
  dtypes: ["f64", "f32"],
  whyNot: () => null,
  record(request, [q, k, v, g, beta, h0]) {
    const cu = request.cuSeqlens;
    if (cu === undefined) {
      const { o, ht } = recurrentKda(
        { q: q!, k: k!, v: v!, g: g!, beta: beta!, h0 },
        request,
        request.scale,
      );
      return [o, ht];
    }
    // A packed batch: the recurrence of each sequence on its own slice of the tokens and its own
    // initial state (docs/kda.md 2.6).
    const os: Tensor[] = [], hts: Tensor[] = [];
    for (let i = 0; i + 1 < cu.length; i++) {
      const tokens = { start: cu[i], end: cu[i + 1] };
      const cut = (t: Tensor) => slice(t, 1, tokens);
      const { o, ht } = recurrentKda(
        {
          q: cut(q!),
          k: cut(k!),
          v: cut(v!),
          g: cut(g!),
          beta: cut(beta!),
          h0: h0 === undefined ? undefined : slice(h0, 0, { start: i, end: i + 1 }),
        },
        { ...request, B: 1, T: cu[i + 1] - cu[i] },
        request.scale,
      );
      os.push(o);
      hts.push(ht);
    }
    return [concat(os, 1), concat(hts, 0)];
  },
};

interface CpuSaved {
  problem: KdaProblem;
  states: Float;
  chunkSize: ChunkSize;
}

const cpuArm: FusedArm<KdaRequest, CpuSaved> = {
  name: "cpu",
  kind: "fused",
  dtypes: ["f64", "f32"],
  whyNot: (request) => headDimProblem(request.K, request.V, "cpu"),
  forward(request, inputs, save) {
    const problem = problemOf(request, inputs);
    if (request.step === true && !save) {
      // A decode step: the recurrence of docs/kda.md 2.1 for one token, no chunk scratch.
      const { o, ht } = stepForward(problem);
      return { outputs: [o, ht] };
    }
    const chunkSize = request.chunkSize ?? DEFAULT_CHUNK_SIZES.cpu;
    const { o, ht, states } = chunkForward(problem, { chunkSize, saveStates: save });
    return { outputs: [o, ht], saved: save ? { problem, states: states!, chunkSize } : undefined };
  },
  backward({ problem, states, chunkSize }, [dout, dht]) {
    const { B, T, H, V } = problem;
    const grads = chunkBackward(problem, states, {
      dout: (dout ?? alloc(computeDtypeOf(problem.q), B * T * H * V)) as Float,
      ...(dht ? { dht: dht as Float } : {}),
    }, { chunkSize });
    return gradList(grads, problem.h0 !== undefined);
  },
};

/** Whether an adapter is a software (CPU) implementation, where the gpu arm is slow. */
export function isSoftwareAdapter(info: { description: string; software?: boolean }): boolean {
  return info.software ?? /llvmpipe|lavapipe|swiftshader|software|cpu/i.test(info.description);
}

interface GpuNodeSaved {
  handle: GpuSaved;
  outputLength: number;
  hasH0: boolean;
  /** The packed layout the gpu arm ran padded, with its padded length. */
  packed?: { cuSeqlens: Int32Array; Tmax: number; H: number; K: number; V: number };
}

/** The gpu arm's dimensions: a packed batch runs padded to [N, Tmax] (see padProblem). */
function gpuDims(request: KdaRequest): KdaRequest {
  const cu = request.cuSeqlens;
  if (cu === undefined) return request;
  return { ...request, B: cu.length - 1, T: longestSequence(cu), cuSeqlens: undefined };
}

const gpuArm: FusedArm<KdaRequest, GpuNodeSaved> = {
  name: "gpu",
  kind: "fused",
  dtypes: ["f32"],
  async whyNot(request) {
    const dims = headDimProblem(request.K, request.V, "gpu");
    if (dims !== null) return dims;
    const status = await gpuStatus();
    if (!status.available) return `the gpu arm is unavailable: ${status.reason}`;
    const { cuSeqlens: _, ...dimsOnGpu } = gpuDims(request);
    return gpuUnsupportedReason(dimsOnGpu, request.chunkSize ?? DEFAULT_CHUNK_SIZES.gpu);
  },
  async forward(request, inputs, save) {
    // The kernels know no packed layout, so a packed batch runs as a padded [N, Tmax] batch whose
    // pad rows leave every state and real output unchanged (docs/kda.md 2.6, padProblem).
    const packed = problemOf(request, inputs) as KdaProblem<Float32Array>;
    const cu = packed.cuSeqlens;
    const { problem, Tmax } = cu === undefined
      ? { problem: packed, Tmax: packed.T }
      : padProblem(packed) as { problem: KdaProblem<Float32Array>; Tmax: number };
    const { o, ht, saved } = await gpuForward(problem, {
      chunkSize: request.chunkSize ?? DEFAULT_CHUNK_SIZES.gpu,
      saveForBackward: save,
    });
    const { H, K, V } = request;
    return {
      outputs: [cu === undefined ? o : unpadRows(o, cu, Tmax, H * V), ht],
      saved: saved === undefined ? undefined : {
        handle: saved,
        outputLength: o.length,
        hasH0: problem.h0 !== undefined,
        ...(cu === undefined ? {} : { packed: { cuSeqlens: cu, Tmax, H, K, V } }),
      },
    };
  },
  async backward({ handle, outputLength, hasH0, packed }, [dout, dht]) {
    let dPadded = (dout ?? undefined) as Float32Array | undefined;
    if (packed !== undefined && dPadded !== undefined) {
      dPadded = padRows(
        dPadded,
        packed.cuSeqlens,
        packed.Tmax,
        packed.H * packed.V,
      ) as Float32Array;
    }
    const grads = await gpuBackward(handle, {
      dout: dPadded ?? new Float32Array(outputLength),
      ...(dht ? { dht: dht as Float32Array } : {}),
    });
    if (packed === undefined) return gradList(grads, hasH0);
    const { cuSeqlens: cu, Tmax, H, K, V } = packed;
    return gradList({
      dq: unpadRows(grads.dq, cu, Tmax, H * K),
      dk: unpadRows(grads.dk, cu, Tmax, H * K),
      dv: unpadRows(grads.dv, cu, Tmax, H * V),
      dg: unpadRows(grads.dg, cu, Tmax, H * K),
      dbeta: unpadRows(grads.dbeta, cu, Tmax, H),
      dh0: grads.dh0,
    }, hasH0);
  },
  release({ handle }) {
    if (!handle.released) handle.release();
  },
};

const policy: SeamPolicy<KdaRequest> = {
  op: "KDA",
  arms: [gpuArm, cpuArm, opsArm] as SeamPolicy<KdaRequest>["arms"],
  async defaultArm(_request, dtype) {
    if (dtype === "f64") return { arm: "cpu", note: null };
    const status = await gpuStatus();
    if (status.available && isSoftwareAdapter(status.info)) {
      return {
        arm: "cpu",
        note: `default arm for f32 work is cpu: the WebGPU adapter "${status.info.description}" ` +
          `is a software adapter, where the gpu arm is slower than the cpu arm (ask for arm "gpu" ` +
          `to run it there)`,
      };
    }
    return { arm: "gpu", note: null };
  },
  outputShapes: (r) => [[r.B, r.T, r.H, r.V], [statesOf(r), r.H, r.K, r.V]],
  env: { force: "KDA_ARM", require: "KDA_REQUIRE_ARM", quiet: "KDA_QUIET" },
};

/** The one seam of the KDA op: its counters and decision log are the package's. */
export const kdaSeam: Seam<KdaRequest> = new Seam(policy);

/** The seam `runKda` dispatches on while `withKdaSeam` runs; otherwise none (kdaSeam). */
let seamInUse: Seam<KdaRequest> | undefined;

/**
 * Runs `fn` with every KDA call dispatched on `seam` instead of {@linkcode kdaSeam}, then restores
 * it. This is how the gradient proof's planted defects and its falsification (checks/mutants.ts:
 * seams derived from kdaSeam's policy) reach the calls the layer makes, with no option of the layer
 * or the op to carry them: the production signatures stay what users see, and nothing the
 * package's entry points export leads here. A module variable rather than an async context: the
 * proof runs its calls one after another and awaits each, so no other KDA call is in flight while
 * `fn` runs; nesting is refused, so one seam is in use at a time.
 *
 * @param seam The seam to dispatch on (one derived from `kdaSeam.policy`).
 * @param fn The calls to run on it.
 * @returns What `fn` returns.
 *
 * @example Usage
 * ```ts
 * import { kdaSeam, withKdaSeam } from "./arms.ts";
 * import { Seam } from "../../seam/seam.ts";
 * const other = new Seam(kdaSeam.policy);
 * await withKdaSeam(other, () => Promise.resolve());
 * ```
 */
export async function withKdaSeam<T>(seam: Seam<KdaRequest>, fn: () => Promise<T>): Promise<T> {
  if (seamInUse !== undefined) {
    throw new Error("withKdaSeam must not be nested: a seam is already in use");
  }
  seamInUse = seam;
  try {
    return await fn();
  } finally {
    seamInUse = undefined;
  }
}

/**
 * The precision an arm computes in when it is proven or compared: the most precise it takes.
 *
 * @param arm The arm.
 * @returns "f64" for the cpu and ops arms, "f32" for the gpu arm.
 *
 * @example Usage
 * ```ts
 * import { armPrecision } from "./arms.ts";
 * armPrecision("gpu"); // "f32"
 * ```
 */
export function armPrecision(arm: Arm): ComputeDType {
  return kdaSeam.armDtypes(arm)[0];
}

/**
 * Repeats each of H heads G times along the head axis of a [B, T, H, K] tensor, as a broadcasting
 * product with ones: head j of the result is head floor(j / G) (docs/kda.md 2.5). The tape's VJP
 * of the product sums the gradient of each group, in one fixed order.
 */
function repeatHeads(x: Tensor, G: number): Tensor {
  const [B, T, H, K] = x.shape;
  const ones = constant(x.dtype, new Float64Array(G).fill(1), [G, 1]);
  return reshape(mul(reshape(x, [B, T, H, 1, K]), ones), [B, T, H * G, K]);
}

/**
 * Runs the op through the seam on tape tensors.
 *
 * @param x The inputs as tensors of one dtype (h0 optional): q, k [B,T,H,K], v [B,T,HV,V],
 *   g [B,T,HV,K], beta [B,T,HV], h0 [N,HV,K,V] (N = B unless packed).
 * @param request Dimensions, resolved scale and chunk size (already validated); optional `HV`
 *   (grouped value heads) and `cuSeqlens` (a packed batch).
 * @param options Arm, strictness and quietness.
 * @returns `o` [B,T,HV,V], `ht` [N,HV,K,V] and the arm that ran.
 *
 * @example Usage
 * ```ts
 * import { runKda } from "./arms.ts";
 * import { Tensor } from "../../tape/mod.ts";
 * const t = (n: number, v: number, shape: number[]) =>
 *   new Tensor(new Float64Array(n).fill(v), shape);
 * const { o } = await runKda(
 *   {
 *     q: t(4, 0.5, [1, 2, 1, 2]),
 *     k: t(4, 0.5, [1, 2, 1, 2]),
 *     v: t(8, 1, [1, 2, 2, 2]),
 *     g: t(8, -0.1, [1, 2, 2, 2]),
 *     beta: t(4, 0.5, [1, 2, 2]),
 *   },
 *   { B: 1, T: 2, H: 1, HV: 2, K: 2, V: 2, scale: 0.7, chunkSize: 16 },
 *   { arm: "cpu" },
 * );
 * console.log(o.shape); // [1, 2, 2, 2]
 * ```
 */
export async function runKda(
  x: { q: Tensor; k: Tensor; v: Tensor; g: Tensor; beta: Tensor; h0?: Tensor },
  request: KdaRequest,
  options: DispatchOptions,
): Promise<{ o: Tensor; ht: Tensor; arm: Arm }> {
  let { q, k } = x;
  const HV = request.HV ?? request.H;
  if (HV !== request.H) {
    // Grouped value heads, before the seam: every arm then sees HV query/key heads.
    q = repeatHeads(q, HV / request.H);
    k = repeatHeads(k, HV / request.H);
  }
  const { HV: _, ...rest } = request;
  const { outputs: [o, ht], arm } = await (seamInUse ?? kdaSeam).dispatch(
    [q, k, x.v, x.g, x.beta, x.h0],
    { ...rest, H: HV },
    options,
  );
  return { o, ht, arm: arm as Arm };
}
