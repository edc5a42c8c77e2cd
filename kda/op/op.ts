// The raw KDA op and its vector-Jacobian product, on typed arrays or on GpuTensors: the inputs are
// checked once here (kda/op/_check.ts, for both kinds), then the seam runs whichever arm the
// options, the environment and the arms' limits pick (kda/op/arms.ts). Typed arrays go through a
// tape; GpuTensors are pinned to the gpu arm, which runs them with no host sync.

import { alloc, Tape, Tensor } from "../../tape/mod.ts";
import type { SeamCounts, SeamDecision } from "../../seam/seam.ts";
import type {
  Arm,
  ChunkSize,
  Float,
  KdaArrays,
  KdaCotangents,
  KdaDims,
  KdaGrads,
  KdaLayout,
  KdaOutputs,
  KdaProblem,
  PublicFloat,
} from "../_types.ts";
import {
  type CheckedOptions,
  checkKdaCotangents,
  checkKdaInputs,
  checkKdaOptions,
} from "./_check.ts";
import { checkObject } from "../../base/check.ts";
import { isHalf, narrowHalf, widenHalf } from "./_half.ts";
import { DEFAULT_CHUNK_SIZES, type KdaRequest, kdaSeam, runKda } from "./arms.ts";
import { type DeviceTensor, type GpuTensor, pinTensors } from "../gpu/tensor.ts";
import { chooseKernels, gpuBackward, gpuForward } from "../gpu/mod.ts";

export { DEFAULT_CHUNK_SIZES };

/**
 * The inputs of the raw KDA op (docs/kda.md 2.1): its dimensions and arrays, all of one element
 * type `F`, an optional query scale (default K^(-1/2)), optional grouped value heads `HV`
 * (docs/kda.md 2.5) and an optional packed batch `cuSeqlens` (docs/kda.md 2.6).
 *
 * `F` may be Float16Array where the runtime has it: the op then computes in f32 and returns
 * Float16Array outputs and gradients (docs/kda.md 3).
 *
 * `F` may be {@linkcode GpuTensor} (every array on the gpu arm's device, none on the host): the
 * gpu arm then runs with no host copy and no host sync, and returns {@linkcode DeviceTensor}s
 * (see {@linkcode ResultArray}). Their elements are not checked (reading them would be a host
 * sync): non-finite values or positive gates are the caller's to rule out.
 */
export interface KdaInputs<F extends PublicFloat | GpuTensor = Float>
  extends KdaDims, KdaArrays<F>, KdaLayout {
  /** Query scale; default K^(-1/2). */
  scale?: number;
}

/**
 * The array type of a call's results: a {@linkcode DeviceTensor} (owned by the caller, who
 * releases it) for GpuTensor inputs, else the inputs' own type.
 */
export type ResultArray<F> = F extends GpuTensor ? DeviceTensor : F;

/** Options of {@linkcode kda} and {@linkcode kdaVjp}. */
export interface KdaOptions {
  /** The arm to run; default `KDA_REQUIRE_ARM`, else by dtype and adapter (see the README). */
  arm?: Arm;
  /** Chunk size of the chunked arms (default: 16 on cpu, 64 on gpu, as measured; DEFAULT_CHUNK_SIZES). */
  chunkSize?: ChunkSize;
  /**
   * The gpu arm's kernel set (default `KDA_GPU_KERNELS`, else the fastest set for the adapter:
   * see docs/kda.md 3.2); the seam's counters and decisions name the set that ran.
   */
  kernels?: string;
  /** Throw instead of declining to another arm (default: on when `KDA_REQUIRE_ARM` is set). */
  strict?: boolean;
  /** No stderr warning when the call declines (it is still counted and recorded). */
  quiet?: boolean;
}

const INPUT_ARRAYS = ["q", "k", "v", "g", "beta", "h0"] as const;

/**
 * Half-precision inputs (docs/kda.md 3): a call whose q is a Float16Array has every array widened
 * to Float32Array here, computes as an f32 call, and has its results rounded back by narrowHalf.
 */
function widenInputs(inputs: unknown): { inputs: unknown; half: boolean } {
  const half = isHalf((inputs as { q?: unknown } | null)?.q);
  if (!half) return { inputs, half };
  return { inputs: widenHalf("inputs", checkObject("inputs", inputs), INPUT_ARRAYS), half };
}

function requestOf(problem: KdaProblem<unknown>, options: CheckedOptions): KdaRequest {
  const { B, T, H, K, V, scale, HV, cuSeqlens } = problem;
  return {
    B,
    T,
    H,
    K,
    V,
    scale,
    chunkSize: options.chunkSize,
    ...(HV !== undefined ? { HV } : {}),
    ...(cuSeqlens !== undefined ? { cuSeqlens } : {}),
    ...(options.kernels !== undefined ? { kernels: options.kernels } : {}),
  };
}

/** The seam's options of a call: arm, strictness and quietness. */
function seamOptions({ arm, strict, quiet }: CheckedOptions) {
  return { arm, strict, quiet };
}

/**
 * Runs a call on GpuTensors on the gpu arm, through the seam, which counts it like every call and
 * refuses a wish for another arm (the data is pinned to the gpu arm's device). The checked problem
 * holds the buffers that passed; the caller's DeviceTensors (`caller`) are held for the call from
 * here, before its first await, so that one the caller releases meanwhile is handed to no other
 * upload before this call has read it.
 */
function onGpu<T>(
  problem: KdaProblem<GpuTensor>,
  options: CheckedOptions,
  backward: boolean,
  run: (chunkSize: ChunkSize, kernels: string) => Promise<T>,
  caller: readonly unknown[],
): Promise<T> {
  const unpin = pinTensors(caller);
  const request = requestOf(problem, options);
  const C = options.chunkSize ?? DEFAULT_CHUNK_SIZES.gpu;
  return kdaSeam.runOnDevice(
    request,
    { arm: "gpu", dtype: "f32", backward, run: () => run(C, chooseKernels(request.kernels).name) },
    seamOptions(options),
  ).finally(unpin);
}

function tensorsOf(problem: KdaProblem<Float>, wrap: (data: Float, shape: number[]) => Tensor) {
  const { B, T, H, K, V } = problem;
  const HV = problem.HV ?? H;
  const N = problem.cuSeqlens === undefined ? B : problem.cuSeqlens.length - 1;
  return {
    q: wrap(problem.q, [B, T, H, K]),
    k: wrap(problem.k, [B, T, H, K]),
    v: wrap(problem.v, [B, T, HV, V]),
    g: wrap(problem.g, [B, T, HV, K]),
    beta: wrap(problem.beta, [B, T, HV]),
    h0: problem.h0 === undefined ? undefined : wrap(problem.h0, [N, HV, K, V]),
  };
}

/**
 * The KDA op forward (inference: no gradient is recorded).
 *
 * @param inputs q, k, v, g, beta (and optionally h0, scale) with their dimensions; optionally
 *   `HV` value heads sharing the H query/key heads (docs/kda.md 2.5) and a packed batch
 *   `cuSeqlens` (B = 1, docs/kda.md 2.6).
 * @param options `arm`, `chunkSize`, `strict`, `quiet`.
 * @returns The outputs `o` [B, T, HV, V] and the final state `ht` [B, HV, K, V] (`[N, HV, K, V]`
 *   when packed), of the inputs' element type (Float16Array inputs compute in f32 and come back
 *   as Float16Array); each array owns its buffer.
 *
 * @example Usage
 * ```ts
 * import { kda } from "@deltanet/kda";
 * const [B, T, H, K, V] = [1, 4, 1, 2, 2];
 * const { o, ht } = await kda({
 *   B, T, H, K, V,
 *   q: new Float64Array(B * T * H * K).fill(0.5),
 *   k: new Float64Array(B * T * H * K).fill(0.5),
 *   v: new Float64Array(B * T * H * V).fill(1),
 *   g: new Float64Array(B * T * H * K).fill(-0.1),
 *   beta: new Float64Array(B * T * H).fill(0.5),
 * }, { arm: "cpu" });
 * ```
 */
export async function kda<F extends PublicFloat | GpuTensor>(
  inputs: KdaInputs<F>,
  options: KdaOptions = {},
): Promise<KdaOutputs<ResultArray<F>>> {
  const widened = widenInputs(inputs);
  const checked = checkKdaInputs(widened.inputs);
  const opts = checkKdaOptions(options);
  if (checked.device) {
    const problem = checked.problem;
    const out = await onGpu(
      problem,
      opts,
      false,
      (chunkSize, kernels) => gpuForward(problem, { chunkSize, kernels }),
      [inputs],
    );
    return { o: out.o, ht: out.ht } as KdaOutputs<ResultArray<F>>;
  }
  const { problem } = checked;
  const { o, ht } = await runKda(
    tensorsOf(problem, (data, shape) => new Tensor(data, shape)),
    requestOf(problem, opts),
    seamOptions(opts),
  );
  const out = { o: o.data, ht: ht.data };
  return (widened.half ? narrowHalf(out) : out) as KdaOutputs<ResultArray<F>>;
}

/**
 * The KDA op's vector-Jacobian product: runs the forward on a tape and pulls the cotangents of
 * `o` and `ht` back to every input.
 *
 * @param inputs q, k, v, g, beta (and optionally h0, scale, HV, cuSeqlens) as for {@linkcode kda}.
 * @param cotangents `dout` [B, T, HV, V] and optional `dht` [B, HV, K, V] (`[N, HV, K, V]` when
 *   packed), of the inputs' element type.
 * @param options `arm`, `chunkSize`, `strict`, `quiet`.
 * @returns dq, dk, dv, dg, dbeta and dh0, of the inputs' element type and shapes (dh0 also
 *   without h0: the gradient at a zero initial state; with HV > H, dq and dk are summed over each
 *   group of value heads; Float16Array inputs give Float16Array gradients).
 *
 * @example Usage
 * ```ts
 * import { kdaVjp } from "@deltanet/kda";
 * const [B, T, H, K, V] = [1, 4, 1, 2, 2];
 * const { dq, dg } = await kdaVjp({
 *   B, T, H, K, V,
 *   q: new Float64Array(B * T * H * K).fill(0.5),
 *   k: new Float64Array(B * T * H * K).fill(0.5),
 *   v: new Float64Array(B * T * H * V).fill(1),
 *   g: new Float64Array(B * T * H * K).fill(-0.1),
 *   beta: new Float64Array(B * T * H).fill(0.5),
 * }, { dout: new Float64Array(B * T * H * V).fill(1) }, { arm: "cpu" });
 * ```
 */
export async function kdaVjp<F extends PublicFloat | GpuTensor>(
  inputs: KdaInputs<F>,
  cotangents: KdaCotangents<F>,
  options: KdaOptions = {},
): Promise<KdaGrads<ResultArray<F>>> {
  const widened = widenInputs(inputs);
  const checked = checkKdaInputs(widened.inputs);
  if (checked.device) {
    const problem = checked.problem;
    const cot = checkKdaCotangents(cotangents, { ...checked, problem });
    const opts = checkKdaOptions(options);
    return await onGpu(problem, opts, true, async (chunkSize, kernels) => {
      const { saved } = await gpuForward(problem, {
        chunkSize,
        kernels,
        saveForBackward: true,
        outputs: false,
      });
      try {
        return await gpuBackward(saved!, cot);
      } finally {
        // the backward was only submitted: its buffers go once the queue is done with them
        saved!.release(true);
      }
    }, [inputs, cotangents]) as KdaGrads<ResultArray<F>>;
  }
  const { problem, dtype } = checked;
  const { dout, dht } = checkKdaCotangents(
    widened.half
      ? widenHalf("cotangents", checkObject("cotangents", cotangents), ["dout", "dht"])
      : cotangents,
    { ...checked, problem },
  );
  const opts = checkKdaOptions(options);
  const { B, K, V } = problem;
  const HV = problem.HV ?? problem.H;
  const N = problem.cuSeqlens === undefined ? B : problem.cuSeqlens.length - 1;
  const tape = new Tape(dtype);
  try {
    // h0 is always a variable so that dh0 exists; absent, it is a zero state.
    const x = tensorsOf(
      { ...problem, h0: problem.h0 ?? alloc(dtype, N * HV * K * V) },
      (data, shape) => tape.variable(data, shape),
    );
    const { o, ht } = await runKda(x, requestOf(problem, opts), seamOptions(opts));
    const seeds = [{ output: o, cotangent: dout }];
    if (dht !== undefined) seeds.push({ output: ht, cotangent: dht });
    const grads = await tape.backwardFrom(seeds);
    const grad = (t: Tensor | undefined) => grads.get(t!) ?? alloc(dtype, t!.size);
    const out = {
      dq: grad(x.q),
      dk: grad(x.k),
      dv: grad(x.v),
      dg: grad(x.g),
      dbeta: grad(x.beta),
      dh0: grad(x.h0),
    };
    return (widened.half ? narrowHalf(out) : out) as KdaGrads<ResultArray<F>>;
  } finally {
    tape.dispose();
  }
}

/**
 * A snapshot of the KDA seam's counters.
 *
 * @returns `{ asked, fusedFwd, fusedBwd, declined, opsPath, customNodeBwd }` since the last
 *   {@linkcode resetSeamCounts}.
 *
 * @example Usage
 * ```ts
 * import { seamCounts } from "@deltanet/kda";
 * const { asked, declined } = seamCounts();
 * ```
 */
export function seamCounts(): SeamCounts {
  return kdaSeam.counts();
}

/**
 * Zeroes the KDA seam's counters and forgets its recorded decisions.
 *
 * @example Usage
 * ```ts
 * import { resetSeamCounts } from "@deltanet/kda";
 * resetSeamCounts();
 * ```
 */
export function resetSeamCounts(): void {
  kdaSeam.reset();
}

/**
 * The KDA seam's most recent decisions (at most 64, oldest first): declines with their reasons,
 * notes on calls that ran as wanted (an environment variable not honoured), and default-arm
 * choices worth telling. Each carries its `index` among all
 * decisions since the last reset, so a long run shows how many were dropped.
 *
 * @returns A copy of the kept decisions.
 *
 * @example Usage
 * ```ts
 * import { seamDecisions } from "@deltanet/kda";
 * for (const d of seamDecisions()) console.log(d.wanted, "->", d.ran, d.reason);
 * ```
 */
export function seamDecisions(): SeamDecision[] {
  return kdaSeam.decisions();
}
