// The KDA op's three arms, handed to one generic seam: `ops` records the plain recurrence on the
// tape, `cpu` and `gpu` are fused custom nodes with hand-written chunked backwards. Every input
// reaching here has been checked once at the public boundary (kda/op/_check.ts). Grouped value
// heads (HV, docs/kda.md 2.5) and packed batches (cuSeqlens, docs/kda.md 2.6) reach every arm,
// and each takes them its own way: the ops arm on the tape, the cpu arm on the host, the gpu arm
// in its kernels or its glue passes. The gpu arm has variants, its kernel sets.

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
import type { Arm, ChunkSize, Float, InKernel, KdaDims, KdaLayout, KdaProblem } from "../_types.ts";
import { headDimProblem } from "./_check.ts";
import { recurrentKda } from "../cpu/recurrent.ts";
import { chunkBackward, chunkForward } from "../chunk.ts";
import {
  chooseKernels,
  DECODE_KERNELS,
  gpuBackward,
  gpuForward,
  type GpuSaved,
  gpuStatus,
  gpuUnsupportedReason,
  kernelSet,
  type RangeChecks,
} from "../gpu/mod.ts";
import { type GpuContext, readyContext } from "../gpu/device.ts";
import { recurrentForward } from "../cpu/_step_math.ts";
import {
  type HostInKernelSaved,
  inKernelBackward,
  inKernelForward,
} from "../cpu/_in_kernel_host.ts";
import { inKernelOnTape } from "../cpu/_in_kernel_tape.ts";
import { expandHeads, sumHeads } from "../cpu/_heads.ts";
import { type ComputeDType, computeDtypeOf } from "../../base/dtype.ts";

/**
 * What the seam is told about one KDA call. `HV` (value heads, default H) and `cuSeqlens` (a
 * packed batch) are optional; `step` marks a decode call (T ≥ 1 tokens from a state, inference
 * only), which the cpu arm runs as the plain recurrence on the host and the gpu arm with its
 * decode kernel set; `inKernel` carries the in-kernel options (docs/kda.md 2.8). The inputs are
 * q, k, v, g, beta, h0, aLog, dtBias (absent ones undefined); the outputs o and, unless
 * `inKernel.finalState` is false, ht.
 */
export interface KdaRequest extends KdaDims, KdaLayout {
  /** The resolved query scale. */
  scale: number;
  /** Chunk size of the chunked arms; absent, each takes its default (DEFAULT_CHUNK_SIZES). */
  chunkSize?: ChunkSize;
  /** A decode call (docs/kda.md 2.7): the plain recurrence over T ≥ 1 tokens, inference only. */
  step?: boolean;
  /** The in-kernel options; absent: none. */
  inKernel?: InKernel;
  /** The gpu arm's kernel set; absent, its rule picks one (kda/gpu/kernels/mod.ts). */
  kernels?: string;
  /**
   * The call's pending value checks of its host arrays (kda/op/_value_checks.ts): an arm that
   * uploads those arrays may run them on what it uploaded and report them (the gpu arm does);
   * whatever it leaves unreported the call checks on the host.
   */
  checks?: RangeChecks;
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
  const [q, k, v, g, beta, h0, aLog, dtBias] = inputs as (Float | undefined)[];
  const { B, T, H, K, V, scale, cuSeqlens, HV, inKernel } = request;
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
    ...(aLog ? { aLog } : {}),
    ...(dtBias ? { dtBias } : {}),
    ...(cuSeqlens ? { cuSeqlens } : {}),
    ...(HV !== undefined && HV !== H ? { HV } : {}),
    ...(inKernel !== undefined ? { inKernel } : {}),
  };
}

/** Whether a call returns ht (and takes its cotangent). */
function hasFinalState(request: KdaRequest): boolean {
  return request.inKernel?.finalState ?? true;
}

/**
 * Value heads of a call (HV, default H).
 *
 * @param request The call's request.
 * @returns HV.
 * @example Usage
 * ```ts
 * import { valueHeads } from "./arms.ts";
 * valueHeads({ B: 1, T: 4, H: 2, K: 4, V: 4, scale: 0.5 }); // 2
 * ```
 */
export function valueHeads(request: KdaRequest): number {
  return request.HV ?? request.H;
}

/**
 * Sequences of a packed call (N), else the batch (B): the leading axis of h0 and ht.
 *
 * @param request The call's request.
 * @returns N or B.
 * @example Usage
 * ```ts
 * import { statesOf } from "./arms.ts";
 * statesOf({ B: 1, T: 4, H: 1, K: 4, V: 4, scale: 0.5, cuSeqlens: new Int32Array([0, 1, 4]) }); // 2
 * ```
 */
export function statesOf(request: KdaRequest): number {
  return request.cuSeqlens === undefined ? request.B : request.cuSeqlens.length - 1;
}

/** dq..dbeta, dh0 only where h0 was an input, daLog and ddtBias where given. */
function gradList(
  grads: {
    dq: Data;
    dk: Data;
    dv: Data;
    dg: Data;
    dbeta: Data;
    dh0: Data;
    daLog?: Data;
    ddtBias?: Data;
  },
  hasH0: boolean,
): (Data | null)[] {
  return [
    grads.dq,
    grads.dk,
    grads.dv,
    grads.dg,
    grads.dbeta,
    hasH0 ? grads.dh0 : null,
    grads.daLog ?? null,
    grads.ddtBias ?? null,
  ];
}

const opsArm: CompositeArm<KdaRequest> = {
  name: "ops",
  kind: "composite",
  dtypes: ["f64", "f32"],
  whyNot: () => null,
  record(request, inputs) {
    const [, , v, , , h0, aLog, dtBias] = inputs;
    let [q, k, , g, beta] = inputs;
    if (request.inKernel !== undefined) {
      ({ q, k, g, beta } = inKernelOnTape(
        { q: q!, k: k!, g: g!, beta: beta!, aLog, dtBias },
        request.inKernel,
      ));
    }
    const HV = valueHeads(request);
    if (HV !== request.H) {
      // Grouped value heads: each value head's own copy of its q and k on the tape, whose VJP sums
      // the gradient of each group.
      q = repeatHeads(q!, HV / request.H);
      k = repeatHeads(k!, HV / request.H);
    }
    const dims = { ...request, H: HV };
    const cu = request.cuSeqlens;
    if (cu === undefined) {
      const { o, ht } = recurrentKda(
        { q: q!, k: k!, v: v!, g: g!, beta: beta!, h0 },
        dims,
        request.scale,
      );
      return hasFinalState(request) ? [o, ht] : [o];
    }
    // A packed batch: the recurrence of each sequence on its own slice of the tokens and its own
    // initial state (docs/kda.md 2.6). T ≥ 1, so at least one sequence has rows.
    const os: Tensor[] = [], hts: Tensor[] = [];
    for (let i = 0; i + 1 < cu.length; i++) {
      const tokens = { start: cu[i], end: cu[i + 1] };
      const state = h0 === undefined ? undefined : slice(h0, 0, { start: i, end: i + 1 });
      if (tokens.end === tokens.start) {
        // A zero-length sequence has no rows and passes its state through: ht = h0 (or zeros),
        // so dh0 = dht for it.
        const { K, V } = request;
        hts.push(state ?? constant(q!.dtype, new Float64Array(HV * K * V), [1, HV, K, V]));
        continue;
      }
      const cut = (t: Tensor) => slice(t, 1, tokens);
      const { o, ht } = recurrentKda(
        {
          q: cut(q!),
          k: cut(k!),
          v: cut(v!),
          g: cut(g!),
          beta: cut(beta!),
          h0: state,
        },
        { ...dims, B: 1, T: cu[i + 1] - cu[i] },
        request.scale,
      );
      os.push(o);
      hts.push(ht);
    }
    return hasFinalState(request) ? [concat(os, 1), concat(hts, 0)] : [concat(os, 1)];
  },
};

interface CpuSaved {
  problem: KdaProblem;
  states: Float;
  chunkSize: ChunkSize;
  /** Value heads per query/key head, expanded on the host for the chunked kernels. */
  G: number;
  /** The in-kernel options' saved state (their host backward), when the call has them. */
  options?: HostInKernelSaved;
  /** The call's own element type (the core runs in f64 when the call has options). */
  dtype: ComputeDType;
  hasH0: boolean;
}

/** A problem with grouped value heads expanded to one query/key head per value head. */
function expanded(problem: KdaProblem): { problem: KdaProblem; G: number } {
  const HV = problem.HV ?? problem.H;
  if (HV === problem.H) return { problem, G: 1 };
  const { B, T, H, K } = problem;
  const G = HV / H;
  const { HV: _, ...rest } = problem;
  return {
    problem: {
      ...rest,
      H: HV,
      q: expandHeads(problem.q, B * T, H, G, K),
      k: expandHeads(problem.k, B * T, H, G, K),
    },
    G,
  };
}

/** An array in a compute dtype (the same array when it already is one). */
function asDtype(x: Float, dtype: ComputeDType): Float {
  return computeDtypeOf(x) === dtype
    ? x
    : dtype === "f64"
    ? Float64Array.from(x)
    : Float32Array.from(x);
}

const cpuArm: FusedArm<KdaRequest, CpuSaved> = {
  name: "cpu",
  kind: "fused",
  dtypes: ["f64", "f32"],
  // The head-width limit is the chunked path's; a decode call runs recurrentForward, which has none.
  whyNot: (request) => request.step === true ? null : headDimProblem(request.K, request.V, "cpu"),
  forward(request, inputs, save) {
    // this arm computes on the call's copies themselves: their pending value checks come first
    request.checks?.decideNow();
    const raw = problemOf(request, inputs);
    const dtype = computeDtypeOf(raw.q);
    // With in-kernel options, the host maps the raw arrays to the op's own ones, in f64
    // (docs/kda.md 2.8); the core then runs on those, and its results return in the call's type.
    const prepared = raw.inKernel === undefined ? undefined : inKernelForward(raw, save);
    const { problem, G } = expanded(prepared?.problem ?? raw);
    const finalState = hasFinalState(request);
    const out = (o: Float, ht: Float) =>
      finalState ? [asDtype(o, dtype), asDtype(ht, dtype)] : [asDtype(o, dtype)];
    if (request.step === true && !save) {
      // A decode call: the recurrence of docs/kda.md 2.1 token by token, no chunk scratch.
      const { o, ht } = recurrentForward(problem);
      return { outputs: out(o, ht) };
    }
    const chunkSize = request.chunkSize ?? DEFAULT_CHUNK_SIZES.cpu;
    const { o, ht, states } = chunkForward(problem, { chunkSize, saveStates: save });
    return {
      outputs: out(o, ht),
      saved: save
        ? {
          problem,
          states: states!,
          chunkSize,
          G,
          dtype,
          hasH0: raw.h0 !== undefined,
          ...(prepared?.saved !== undefined ? { options: prepared.saved } : {}),
        }
        : undefined,
    };
  },
  backward({ problem, states, chunkSize, G, options, dtype, hasH0 }, [dout, dht]) {
    const { B, T, H, K, V } = problem;
    const core = computeDtypeOf(problem.q);
    const grads = chunkBackward(problem, states, {
      dout: dout ? asDtype(dout as Float, core) : alloc(core, B * T * H * V),
      ...(dht ? { dht: asDtype(dht as Float, core) } : {}),
    }, { chunkSize });
    if (G > 1) {
      grads.dq = sumHeads(grads.dq, B * T, H / G, G, K);
      grads.dk = sumHeads(grads.dk, B * T, H / G, G, K);
    }
    if (options === undefined) return gradList(grads, hasH0);
    const raw = inKernelBackward(options, grads);
    const cast = (x: Float | undefined) => x === undefined ? undefined : asDtype(x, dtype);
    return gradList({
      dq: cast(raw.dq)!,
      dk: cast(raw.dk)!,
      dv: cast(grads.dv)!,
      dg: cast(raw.dg)!,
      dbeta: cast(raw.dbeta)!,
      dh0: cast(grads.dh0)!,
      ...(raw.daLog !== undefined ? { daLog: cast(raw.daLog) } : {}),
      ...(raw.ddtBias !== undefined ? { ddtBias: cast(raw.ddtBias) } : {}),
    }, hasH0);
  },
};

/** Whether an adapter is a software (CPU) implementation, where the gpu arm is slow. */
export function isSoftwareAdapter(info: { description: string; software?: boolean }): boolean {
  return info.software ?? /llvmpipe|lavapipe|swiftshader|software|cpu/i.test(info.description);
}

interface GpuNodeSaved {
  handle: GpuSaved;
  hasH0: boolean;
  /** Elements of `o`, for a backward that got no cotangent of it. */
  outputLength: number;
}

/**
 * The kernel set a gpu call runs: the decode set for a decode call (the plain recurrence), else
 * the one the call names or the rule picks.
 */
function gpuKernelsOf(request: KdaRequest): { name: string; note: string | null } {
  return request.step === true
    ? { name: DECODE_KERNELS, note: null }
    : chooseKernels(request.kernels);
}

/**
 * Why the gpu arm cannot run a call on the device it has now, or null: synchronous (no device
 * ready is a reason), as its whyNot decides once the device is there.
 */
function gpuWhyNotNow(request: KdaRequest, backward: boolean): string | null {
  const dims = headDimProblem(request.K, request.V, "gpu");
  if (dims !== null) return dims;
  const kernels = gpuKernelsOf(request).name;
  if (backward && kernelSet(kernels).backward === null) {
    return `the kernel set ${kernels} has no backward, and this call needs one`;
  }
  return gpuUnsupportedReason(request, request.chunkSize ?? DEFAULT_CHUNK_SIZES.gpu, kernels);
}

const gpuArm: FusedArm<KdaRequest, GpuNodeSaved> = {
  name: "gpu",
  kind: "fused",
  dtypes: ["f32"],
  async whyNot(request, _dtype, call) {
    const dims = headDimProblem(request.K, request.V, "gpu");
    if (dims !== null) return dims;
    const status = await gpuStatus();
    if (!status.available) return `the gpu arm is unavailable: ${status.reason}`;
    return gpuWhyNotNow(request, call.backward);
  },
  variant: gpuKernelsOf,
  async forward(request, inputs, save) {
    const problem = problemOf(request, inputs) as KdaProblem<Float32Array>;
    const { o, ht, saved } = await gpuForward(problem, {
      chunkSize: request.chunkSize ?? DEFAULT_CHUNK_SIZES.gpu,
      kernels: gpuKernelsOf(request).name,
      saveForBackward: save,
      ...(request.checks !== undefined ? { checks: request.checks } : {}),
    });
    return {
      outputs: hasFinalState(request)
        ? [o as Float32Array, ht as Float32Array]
        : [o as Float32Array],
      saved: saved === undefined ? undefined : {
        handle: saved,
        hasH0: problem.h0 !== undefined,
        outputLength: (o as Float32Array).length,
      },
    };
  },
  async backward({ handle, hasH0, outputLength }, [dout, dht]) {
    const grads = await gpuBackward(handle, {
      dout: (dout ?? new Float32Array(outputLength)) as Float32Array,
      ...(dht ? { dht: dht as Float32Array } : {}),
    });
    return gradList(grads as Parameters<typeof gradList>[0], hasH0);
  },
  release({ handle }) {
    if (!handle.released) handle.release();
  },
  async vjp(request, inputs, [dout, dht]) {
    // the forward reads nothing back (outputs: false), and the gradients' host arrays are made
    // ready by worker threads while it uploads (gradsToHost)
    const problem = problemOf(request, inputs) as KdaProblem<Float32Array>;
    const { saved } = await gpuForward(problem, {
      chunkSize: request.chunkSize ?? DEFAULT_CHUNK_SIZES.gpu,
      kernels: gpuKernelsOf(request).name,
      saveForBackward: true,
      outputs: false,
      gradsToHost: true,
      ...(request.checks !== undefined ? { checks: request.checks } : {}),
    });
    try {
      const grads = await gpuBackward(saved!, {
        dout: (dout ??
          new Float32Array(
            request.B * request.T * valueHeads(request) * request.V,
          )) as Float32Array,
        ...(dht ? { dht: dht as Float32Array } : {}),
      });
      return gradList(grads as Parameters<typeof gradList>[0], problem.h0 !== undefined);
    } finally {
      // the backward was only read back: its buffers go once the queue is done with them
      saved!.release(true);
    }
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
  outputShapes: (r) =>
    hasFinalState(r)
      ? [[r.B, r.T, valueHeads(r), r.V], [statesOf(r), valueHeads(r), r.K, r.V]]
      : [[r.B, r.T, valueHeads(r), r.V]],
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
 * The gpu arm's device when a call of f32 arrays, as it is checked, is sure to run there: on
 * kdaSeam (no seam of the proof's in use), with nothing in its options or the environment wanting
 * another arm, the gpu arm its default (a hardware adapter) or its wish, a device ready, and
 * nothing the arm would decline. Such a call may upload its arrays as it checks them
 * (kda/gpu/snapshot.ts) and run pinned to the gpu arm, which chooses, counts and records what
 * dispatching it would. Null otherwise: the call copies its arrays and dispatches.
 *
 * @param request The call's request.
 * @param options The call's arm, strictness and quietness.
 * @param backward Whether the call runs a backward too.
 * @returns The device context, or null.
 *
 * @example Usage
 * ```ts
 * import { gpuRunsNow } from "./arms.ts";
 * const request = { B: 1, T: 4, H: 1, K: 4, V: 4, scale: 0.5 };
 * console.log(gpuRunsNow(request, { arm: "cpu" }, false)); // null: the call wants the cpu arm
 * ```
 */
export function gpuRunsNow(
  request: KdaRequest,
  options: DispatchOptions,
  backward: boolean,
): GpuContext | null {
  if (seamInUse !== undefined || !kdaSeam.leavesTo("gpu", options)) return null;
  const ctx = readyContext();
  if (typeof ctx === "string") return null;
  if (options.arm === undefined && isSoftwareAdapter(ctx.info)) return null;
  return gpuWhyNotNow(request, backward) === null ? ctx : null;
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
 *   g [B,T,HV,K], beta [B,T,HV], h0 [N,HV,K,V] (N = B unless packed); with the gate in the
 *   kernel, aLog [HV] and dtBias [HV·K] (each optional).
 * @param request Dimensions, resolved scale and chunk size (already validated); optional `HV`
 *   (grouped value heads), `cuSeqlens` (a packed batch) and `inKernel` (docs/kda.md 2.8).
 * @param options Arm, strictness and quietness.
 * @returns `o` [B,T,HV,V], `ht` [N,HV,K,V] (undefined when `request.inKernel.finalState` is
 *   false) and the arm that ran.
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
/**
 * The inputs' cotangents of one KDA call on the seam in use, without a tape, where the arm chosen
 * for it runs its forward and backward as one (Seam.vjp: the gpu arm); else null, and the call
 * belongs on a tape ({@linkcode runKda}).
 *
 * @param inputs q, k, v, g, beta, h0, aLog, dtBias (undefined where absent): checked copies.
 * @param cotangents The cotangents of o and (when the call returns it) ht, null where none.
 * @param request The call's request.
 * @param options Arm, strictness and quietness.
 * @returns The cotangents of the inputs, in their order (null where none), or null.
 * @example
 * ```ts
 * import { vjpKda } from "./arms.ts";
 * const f = (n: number, v: number) => new Float64Array(n).fill(v);
 * const request = { B: 1, T: 2, H: 1, K: 2, V: 2, scale: 0.7, chunkSize: 16 } as const;
 * const inputs = [f(4, 0.5), f(4, 0.5), f(4, 1), f(4, -0.1), f(2, 0.5), undefined];
 * // the cpu arm records itself on a tape: no direct route
 * console.log(await vjpKda(inputs, [f(4, 1)], request, { arm: "cpu" })); // null
 * ```
 */
export async function vjpKda(
  inputs: readonly (Data | undefined)[],
  cotangents: readonly (Data | null)[],
  request: KdaRequest,
  options: DispatchOptions,
): Promise<(Data | null)[] | null> {
  const dtype = computeDtypeOf(inputs[0], "inputs.q");
  const direct = await (seamInUse ?? kdaSeam).vjp(request, { dtype, inputs, cotangents }, options);
  return direct === null ? null : direct.grads;
}

export async function runKda(
  x: {
    q: Tensor;
    k: Tensor;
    v: Tensor;
    g: Tensor;
    beta: Tensor;
    h0?: Tensor;
    aLog?: Tensor;
    dtBias?: Tensor;
  },
  request: KdaRequest,
  options: DispatchOptions,
): Promise<{ o: Tensor; ht: Tensor; arm: Arm }> {
  const { outputs: [o, ht], arm } = await (seamInUse ?? kdaSeam).dispatch(
    [x.q, x.k, x.v, x.g, x.beta, x.h0, x.aLog, x.dtBias],
    request,
    options,
  );
  // ht is undefined when the request's inKernel.finalState is false
  return { o, ht, arm: arm as Arm };
}
