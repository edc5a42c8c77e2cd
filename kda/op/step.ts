// Decoding: T ≥ 1 tokens per sequence from a state, the plain recurrence with no chunking
// (docs/kda.md 2.7), inference only. The arguments are checked once here; the seam picks the arm as
// for every other call (kda/op/arms.ts), and on GpuTensors the gpu arm's decode kernel set runs
// with no host sync.

import { Tensor } from "../../tape/mod.ts";
import type { Arm, Float, KdaProblem, PublicFloat } from "../_types.ts";
import { checkKdaStep, checkStepOptions } from "./_check.ts";
import { checkInKernelArrays } from "./_options.ts";
import { checkObject } from "../../base/check.ts";
import { checkArrayTypesAgree, storageDtypeOf } from "../../base/dtype.ts";
import { narrowHalf, widenHalf, widenOne } from "./_half.ts";
import { type KdaRequest, kdaSeam, runKda } from "./arms.ts";
import { type DeviceTensor, type GpuTensor, pinTensors } from "../gpu/tensor.ts";
import { DECODE_KERNELS, gpuForward } from "../gpu/mod.ts";

/**
 * The tokens of one {@linkcode kdaStep} call: `T` per sequence (default 1), their dimensions and
 * arrays, all of type `F`. Without `T` the arrays are one token per sequence ([B, H, K] and so
 * on); with it [B, T, H, K] and so on.
 */
export interface KdaStepToken<F extends PublicFloat | GpuTensor = Float> {
  /** Sequences decoded side by side. */
  B: number;
  /** Tokens per sequence in this call; default 1 (and the arrays without their T axis). */
  T?: number;
  /** Query/key heads. */
  H: number;
  /** Key dimension per head. */
  K: number;
  /** Value dimension per head. */
  V: number;
  /** Value heads, a multiple of H (docs/kda.md 2.5); default H. */
  HV?: number;
  /** Queries [B, (T,) H, K]. */
  q: F;
  /** Keys [B, (T,) H, K]. */
  k: F;
  /** Values [B, (T,) HV, V]. */
  v: F;
  /** Log decays [B, (T,) HV, K], each ≤ 0 (the raw gate with `useGateInKernel`). */
  g: F;
  /** Write strengths [B, (T,) HV] (logits with `useBetaSigmoidInKernel`). */
  beta: F;
  /** With `useGateInKernel`: [HV] (docs/kda.md 2.8). */
  aLog?: F;
  /** With `useGateInKernel`: [HV·K] (docs/kda.md 2.8). */
  dtBias?: F;
  /** Query scale; default K^(-1/2). */
  scale?: number;
}

/** What one {@linkcode kdaStep} returns. */
export interface KdaStepResult<F = Float> {
  /** The tokens' outputs [B, (T,) HV, V]. */
  o: F;
  /** The state after the last token [B, HV, K, V]: hand it to the next call. */
  state: F;
}

/**
 * Options of {@linkcode kdaStep}: those of `kda` without `chunkSize`, `kernels` and
 * `outputFinalState` (a decode call runs the plain recurrence and always returns its state).
 */
export interface KdaStepOptions {
  /** The arm to run; default `KDA_REQUIRE_ARM`, else by dtype and adapter (see the README). */
  arm?: Arm;
  /** Throw instead of declining to another arm (default: on when `KDA_REQUIRE_ARM` is set). */
  strict?: boolean;
  /** No stderr warning when the call declines (it is still counted and recorded). */
  quiet?: boolean;
  /** As for `kda` (docs/kda.md 2.8). */
  useQkL2NormInKernel?: boolean;
  /** As for `kda` (docs/kda.md 2.8). */
  useGateInKernel?: boolean;
  /** As for `kda` (docs/kda.md 2.8). */
  lowerBound?: number;
  /** As for `kda` (docs/kda.md 2.8). */
  useBetaSigmoidInKernel?: boolean;
  /** As for `kda` (docs/kda.md 2.8). */
  allowNegEigval?: boolean;
}

const TOKEN_ARRAYS = ["q", "k", "v", "g", "beta", "aLog", "dtBias"] as const;

/** The chunk size of a decode call's plan (the recurrence has no chunks; it only sets ranges). */
const DECODE_CHUNK = 16;

/** A call's results: DeviceTensors for GpuTensor inputs, else arrays of the inputs' type. */
export type StepResultArray<F> = F extends GpuTensor ? DeviceTensor : F;

/**
 * Decoding with the KDA op (docs/kda.md 2.7): reads `T` ≥ 1 tokens per sequence (default 1),
 * runs the recurrence of docs/kda.md 2.1 over them from each sequence's state, with no chunking,
 * and returns their outputs with the state after the last one. Feeding a sequence through
 * `kdaStep` in pieces of any lengths gives the outputs and the final state of {@linkcode kda} on
 * the whole sequence with `h0` the first state.
 *
 * Arms: `ops` runs the recurrence with the tape's ops, `cpu` directly on the host (in f64 inside;
 * results in the inputs' type), `gpu` with its decode kernel set (`recurrent`: the tokens in
 * sequence inside one kernel, the state in registers). On GpuTensors (the state too) the call
 * runs on the gpu arm with no host sync and returns DeviceTensors, so a decode loop pays one sync
 * when it reads a result. Inference only: like flash-linear-attention's fused_recurrent_kda,
 * decoding has no backward. Float16Array and BFloat16Array inputs compute in f32 and return
 * results of their type. The in-kernel options of {@linkcode kda} apply (docs/kda.md 2.8).
 *
 * @param state The state before the tokens, [B, HV, K, V], of the tokens' array type (zeros for
 *   a fresh sequence, or the `ht` of a prefill run by {@linkcode kda}).
 * @param token q, k [B, (T,) H, K], v [B, (T,) HV, V], g [B, (T,) HV, K], beta [B, (T,) HV],
 *   with B, H, K, V and optionally T, HV and scale (and aLog, dtBias with the gate in the kernel).
 * @param options `arm`, `strict`, `quiet`, and the in-kernel options.
 * @returns `o` [B, (T,) HV, V] and the new `state` [B, HV, K, V]: new arrays of the inputs'
 *   type, or DeviceTensors (the caller's to release) for GpuTensor inputs.
 *
 * @example A generation loop: prefill with kda, then decode one token at a time
 * ```ts
 * import { kda, kdaStep } from "@deltanet/kda";
 *
 * const [B, H, K, V] = [1, 2, 4, 4];
 * const fill = (n: number, x: number) => new Float32Array(n).fill(x);
 * // Prefill: the prompt's 8 tokens in one chunked call; its final state seeds the decoding.
 * const T = 8;
 * const prompt = {
 *   B, T, H, K, V,
 *   q: fill(B * T * H * K, 0.1), k: fill(B * T * H * K, 0.5), v: fill(B * T * H * V, 1),
 *   g: fill(B * T * H * K, -0.05), beta: fill(B * T * H, 0.5),
 * };
 * let { ht: state } = await kda(prompt, { arm: "cpu" });
 * for (let t = 0; t < 4; t++) {
 *   // In a model, q, k, v, g and beta come from the previous output; here they are constants.
 *   const token = {
 *     B, H, K, V,
 *     q: fill(B * H * K, 0.1), k: fill(B * H * K, 0.5), v: fill(B * H * V, 1),
 *     g: fill(B * H * K, -0.05), beta: fill(B * H, 0.5),
 *   };
 *   const step = await kdaStep(state, token, { arm: "cpu" });
 *   state = step.state; // o: [B, H, V], this token's output
 * }
 * ```
 */
export async function kdaStep<F extends PublicFloat | GpuTensor>(
  state: F,
  token: KdaStepToken<F>,
  options: KdaStepOptions = {},
): Promise<KdaStepResult<StepResultArray<F>>> {
  if (token !== null && typeof token === "object") {
    checkArrayTypesAgree("token", token as unknown as Record<string, unknown>, TOKEN_ARRAYS, {
      name: "state",
      value: state,
    });
  }
  const storage = storageDtypeOf((token as { q?: unknown } | null)?.q);
  let stateIn: unknown = state, tokenIn: unknown = token;
  if (storage !== null) {
    tokenIn = widenHalf("token", checkObject("token", token), TOKEN_ARRAYS, storage);
    stateIn = widenOne("state", state, storage);
  }
  const opts = checkStepOptions(options);
  const checked = checkKdaStep(stateIn, tokenIn, {
    gateInKernel: (opts.inKernel?.gate ?? null) !== null,
  });
  const inKernel = checkInKernelArrays(
    checked.problem,
    opts.inKernel,
    opts.allowNegEigval,
    "token",
    checked.device ? undefined : checked.dtype,
  );
  const problem = { ...checked.problem, ...(inKernel !== undefined ? { inKernel } : {}) };
  const { B, T, H, K, V, scale } = problem;
  const HV = problem.HV ?? H;
  const request: KdaRequest = {
    B,
    T,
    H,
    K,
    V,
    scale,
    chunkSize: DECODE_CHUNK,
    step: true,
    ...(HV !== H ? { HV } : {}),
    ...(inKernel !== undefined ? { inKernel } : {}),
  };
  const seamOptions = { arm: opts.arm, strict: opts.strict, quiet: opts.quiet };
  if (checked.device) {
    const onDevice = problem as KdaProblem<GpuTensor>;
    // the caller's DeviceTensors stay this call's until its work is queued, whatever it releases
    const unpin = pinTensors([state, token]);
    const out = await kdaSeam.runOnDevice(request, {
      arm: "gpu",
      dtype: "f32",
      backward: false,
      run: () => gpuForward(onDevice, { chunkSize: DECODE_CHUNK, kernels: DECODE_KERNELS }),
    }, seamOptions).finally(unpin);
    return { o: out.o, state: out.ht } as KdaStepResult<StepResultArray<F>>;
  }
  const host = problem as KdaProblem<Float>;
  const wrap = (data: Float | undefined, shape: number[]) =>
    data === undefined ? undefined : new Tensor(data, shape);
  const { o, ht } = await runKda(
    {
      q: wrap(host.q, [B, T, H, K])!,
      k: wrap(host.k, [B, T, H, K])!,
      v: wrap(host.v, [B, T, HV, V])!,
      g: wrap(host.g, [B, T, HV, K])!,
      beta: wrap(host.beta, [B, T, HV])!,
      h0: wrap(host.h0, [B, HV, K, V]),
      aLog: wrap(host.aLog, [HV]),
      dtBias: wrap(host.dtBias, [HV * K]),
    },
    request,
    seamOptions,
  );
  const result = { o: o.data as Float, state: ht.data as Float };
  return (storage !== null ? narrowHalf(result, storage) : result) as KdaStepResult<
    StepResultArray<F>
  >;
}
