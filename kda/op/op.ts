// The raw KDA op and its vector-Jacobian product, on typed arrays or on GpuTensors: the inputs are
// checked once here (kda/op/_check.ts, for both kinds), then the seam runs whichever arm the
// options, the environment and the arms' limits pick (kda/op/arms.ts). Typed arrays go through a
// tape; GpuTensors are pinned to the gpu arm, which runs them with no host sync. Typed f32 arrays
// of a call sure to run on the gpu arm are uploaded as they are checked, instead of copied, and
// the call runs pinned to the gpu arm on its snapshots (kda/gpu/snapshot.ts).

import { alloc, Tape, Tensor } from "../../tape/mod.ts";
import type { SeamCounts, SeamDecision } from "../../seam/seam.ts";
import type {
  Arm,
  ChunkSize,
  Float,
  KdaArrays,
  KdaCotangents,
  KdaDims,
  KdaGateArrays,
  KdaGateGrads,
  KdaGrads,
  KdaLayout,
  KdaOutputs,
  KdaProblem,
  PublicFloat,
} from "../_types.ts";
import { ARRAY_KEYS } from "./_fields.ts";
import {
  type CallDims,
  type CheckedInputs,
  type CheckedOptions,
  checkKdaCotangents,
  checkKdaInputs,
  checkKdaOptions,
} from "./_check.ts";
import { checkInKernelArrays } from "./_options.ts";
import { checkObject, typeName } from "../../base/check.ts";
import { checkArrayTypesAgree, type StorageDType, storageDtypeOf } from "../../base/dtype.ts";
import { narrowHalf, widenHalf } from "./_half.ts";
import { giveBackCopies } from "./_copies.ts";
import { DEFER_CHECK_BYTES, ValueChecks } from "./_value_checks.ts";
import { DEFAULT_CHUNK_SIZES, kdaSeam, runKda, vjpKda } from "./arms.ts";
import {
  onGpu,
  onSnapshots,
  releaseSnapshotCall,
  requestOf,
  seamOptions,
  snapshotCall,
} from "./_gpu_calls.ts";
import type { DeviceTensor, GpuTensor } from "../gpu/tensor.ts";
import type { DeviceSnapshots } from "../gpu/snapshot.ts";
import { gpuBackward, gpuForward } from "../gpu/mod.ts";

export { DEFAULT_CHUNK_SIZES };

/**
 * The inputs of the raw KDA op (docs/kda.md 2.1): its dimensions and arrays, all of one element
 * type `F`, an optional query scale (default K^(-1/2)), optional grouped value heads `HV`
 * (docs/kda.md 2.5), an optional packed batch `cuSeqlens` (docs/kda.md 2.6), and with
 * `options.useGateInKernel` the gate's parameters `aLog` [HV] and `dtBias` [HV·K] (docs/kda.md
 * 2.8; flash-linear-attention's `A_log` and `dt_bias`).
 *
 * `F` may be Float16Array (where the runtime has it) or BFloat16Array: the op then computes in
 * f32 and returns outputs and gradients of that type (docs/kda.md 3).
 *
 * `F` may be {@linkcode GpuTensor} (every array on the gpu arm's device, none on the host): the
 * gpu arm then runs with no host copy and no host sync, and returns {@linkcode DeviceTensor}s
 * (see {@linkcode ResultArray}). Their elements are not checked (reading them would be a host
 * sync): non-finite values or positive gates are the caller's to rule out.
 */
export interface KdaInputs<F extends PublicFloat | GpuTensor = Float>
  extends KdaDims, KdaArrays<F>, KdaGateArrays<F>, KdaLayout {
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
  /**
   * L2-normalise q and k per token and head, q / sqrt(Σq² + 1e-6), before the op (fla's
   * `use_qk_l2norm_in_kernel`; docs/kda.md 2.8). Default false.
   */
  useQkL2NormInKernel?: boolean;
  /**
   * g is the raw gate: the op's log decay is −exp(aLog[h])·softplus(g + dtBias[h]), or with
   * `lowerBound` lowerBound·sigmoid(exp(aLog[h])·(g + dtBias[h])) (without aLog:
   * lowerBound·sigmoid(g + dtBias[h])); `inputs.aLog` [HV] is needed unless `lowerBound` is set,
   * `inputs.dtBias` [HV·K] is optional (fla's `use_gate_in_kernel`; docs/kda.md 2.8). Default false.
   */
  useGateInKernel?: boolean;
  /** With `useGateInKernel`: the gate's lower bound, a negative number (fla's `lower_bound`). */
  lowerBound?: number;
  /**
   * beta holds logits: the op's beta is sigmoid(beta), or 2·sigmoid(beta) with `allowNegEigval`
   * (fla's `use_beta_sigmoid_in_kernel`). Without it beta must lie in [0, 1]. Default false.
   */
  useBetaSigmoidInKernel?: boolean;
  /**
   * Allow beta in [0, 2], so the write's eigenvalue 1 − beta may be negative (fla's
   * `allow_neg_eigval`): doubles the in-kernel sigmoid, or widens the range beta is checked
   * against when it is given after its activation. Default false.
   */
  allowNegEigval?: boolean;
  /**
   * Return the final state `ht` (and take its cotangent `dht`). Default true (fla's
   * `output_final_state` defaults to false; this op has always returned ht). With false, no ht is
   * returned, read back or copied.
   */
  outputFinalState?: boolean;
}

/**
 * What {@linkcode kda} returns for options of type `O`: `o`, and `ht` unless
 * `outputFinalState` is false. A literal `false` drops `ht` from the type; a required flag of
 * type `boolean` makes it optional; an absent or optional flag (the default, true) keeps it, so
 * code that builds its options dynamically should check `ht` when it may have set the flag false.
 */
export type KdaResult<A, O = KdaOptions> = O extends { outputFinalState: false } ? { o: A }
  : O extends { outputFinalState: true } ? KdaOutputs<A>
  : O extends { outputFinalState: boolean } ? { o: A; ht?: A }
  : KdaOutputs<A>;

/**
 * What {@linkcode kdaVjp} returns: the six gradients, and `daLog`, `ddtBias` where those inputs
 * were given.
 */
export type KdaVjpResult<A> = KdaGrads<A> & KdaGateGrads<A>;

/**
 * 16-bit storage inputs (docs/kda.md 3): a call whose q is a Float16Array or a BFloat16Array has
 * every array widened to Float32Array here, computes as an f32 call, and has its results rounded
 * back by narrowHalf.
 */
function widenInputs(inputs: unknown): { inputs: unknown; storage: StorageDType | null } {
  if (inputs !== null && typeof inputs === "object") {
    checkArrayTypesAgree("inputs", inputs as Record<string, unknown>, ARRAY_KEYS);
  }
  const storage = storageDtypeOf((inputs as { q?: unknown } | null)?.q);
  if (storage === null) return { inputs, storage };
  return {
    inputs: widenHalf("inputs", checkObject("inputs", inputs), ARRAY_KEYS, storage),
    storage,
  };
}

/**
 * Checks a call's options and inputs once: the options first (they say whether g is a raw gate),
 * then the arrays, then what ties the two together; the problem carries the resolved options.
 * `snapshotsFor`, given the checked options, may have the f32 arrays uploaded as they are checked.
 */
function checkCall(
  inputs: unknown,
  options: unknown,
  checks: ValueChecks,
  snapshotsFor?: (dims: CallDims, opts: CheckedOptions) => DeviceSnapshots | null,
): {
  checked: CheckedInputs;
  opts: CheckedOptions;
  finalState: boolean;
} {
  const opts = checkKdaOptions(options);
  const checked = checkKdaInputs(inputs, {
    gateInKernel: (opts.inKernel?.gate ?? null) !== null,
    checks,
    ...(snapshotsFor !== undefined ? { snapshotsFor: (dims) => snapshotsFor(dims, opts) } : {}),
  });
  const inKernel = checkInKernelArrays(
    checked.problem,
    opts.inKernel,
    opts.allowNegEigval,
    "inputs",
    checked.device ? undefined : checked.dtype,
    checks,
  );
  if (inKernel !== undefined) (checked.problem as KdaProblem<unknown>).inKernel = inKernel;
  return { checked, opts, finalState: inKernel?.finalState ?? true };
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
    aLog: problem.aLog === undefined ? undefined : wrap(problem.aLog, [HV]),
    dtBias: problem.dtBias === undefined ? undefined : wrap(problem.dtBias, [HV * K]),
  };
}

/**
 * The KDA op forward (inference: no gradient is recorded).
 *
 * @param inputs q, k, v, g, beta (and optionally h0, scale) with their dimensions; optionally
 *   `HV` value heads sharing the H query/key heads (docs/kda.md 2.5), a packed batch
 *   `cuSeqlens` (B = 1, docs/kda.md 2.6), and `aLog`, `dtBias` with the gate in the kernel.
 * @param options `arm`, `chunkSize`, `kernels`, `strict`, `quiet`, and the in-kernel options
 *   `useQkL2NormInKernel`, `useGateInKernel`, `lowerBound`, `useBetaSigmoidInKernel`,
 *   `allowNegEigval`, `outputFinalState` (docs/kda.md 2.8).
 * @returns The outputs `o` [B, T, HV, V] and, unless `outputFinalState` is false, the final state
 *   `ht` [B, HV, K, V] (`[N, HV, K, V]` when packed), of the inputs' element type (Float16Array
 *   and BFloat16Array inputs compute in f32 and come back in their type); each array owns its
 *   buffer.
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
 *
 * @example The in-kernel options, as a Kimi layer calls fla's chunk_kda
 * ```ts
 * import { kda } from "@deltanet/kda";
 * const [B, T, H, K, V] = [1, 4, 1, 2, 2];
 * const out = await kda({
 *   B, T, H, K, V,
 *   q: new Float64Array(B * T * H * K).fill(0.5),
 *   k: new Float64Array(B * T * H * K).fill(0.5),
 *   v: new Float64Array(B * T * H * V).fill(1),
 *   g: new Float64Array(B * T * H * K).fill(0.3), // the raw gate: any sign
 *   beta: new Float64Array(B * T * H).fill(-1), // logits
 *   aLog: new Float64Array(H).fill(0.5),
 *   dtBias: new Float64Array(H * K).fill(-2),
 * }, {
 *   arm: "cpu",
 *   useQkL2NormInKernel: true,
 *   useGateInKernel: true,
 *   useBetaSigmoidInKernel: true,
 *   outputFinalState: false,
 * });
 * console.log(out.o.length, "ht" in out); // 8 false
 * ```
 */
export async function kda<F extends PublicFloat | GpuTensor, O extends KdaOptions = KdaOptions>(
  inputs: KdaInputs<F>,
  options: O = {} as O,
): Promise<KdaResult<ResultArray<F>, O>> {
  // the values of large copies are checked by the arm that uploads them, else after the run
  // (_value_checks.ts)
  const checks = new ValueChecks({ deferBytes: DEFER_CHECK_BYTES });
  const snap = snapshotCall(false);
  let widened: ReturnType<typeof widenInputs>, call: ReturnType<typeof checkCall>;
  try {
    widened = widenInputs(inputs);
    call = checkCall(
      widened.inputs,
      options,
      checks,
      widened.storage === null ? snap.snapshotsFor : undefined,
    );
  } catch (error) {
    // the verdict may read the snapshots back: they go after it
    try {
      return await checks.settle(error);
    } finally {
      releaseSnapshotCall(snap.made);
    }
  }
  const { checked, opts, finalState } = call;
  const result = (o: unknown, ht: unknown) =>
    (finalState ? { o, ht } : { o }) as KdaResult<ResultArray<F>, O>;
  if (checked.snapshots !== undefined) {
    const problem = checked.problem;
    const outputsInto = snap.made.results;
    const out = await onSnapshots(
      snap.made,
      problem,
      opts,
      checks,
      false,
      (chunkSize, kernels) =>
        gpuForward(problem, { chunkSize, kernels, outputsToHost: true, outputsInto, checks }),
    );
    return result(out.o, out.ht);
  }
  if (checked.device) {
    const problem = checked.problem;
    const out = await onGpu(
      problem,
      opts,
      false,
      (chunkSize, kernels) => gpuForward(problem, { chunkSize, kernels }),
      [inputs],
    );
    return result(out.o, out.ht);
  }
  const { problem } = checked;
  // a large call runs before its pending checks are decided, and returns nothing unless they pass
  let ran: Awaited<ReturnType<typeof runKda>>;
  try {
    ran = await runKda(
      tensorsOf(problem, (data, shape) => new Tensor(data, shape)),
      requestOf(problem, opts, checks),
      seamOptions(opts),
    );
  } catch (error) {
    return await checks.settle(error);
  }
  await checks.verdict();
  const { o, ht, arm } = ran;
  if (arm === "gpu") {
    // the gpu arm has uploaded the checked copies and holds none: the next call may copy into them
    const { q, k, v, g, beta, h0, aLog, dtBias } = problem;
    giveBackCopies([q, k, v, g, beta, h0, aLog, dtBias]);
  }
  const out = finalState ? { o: o.data, ht: ht.data } : { o: o.data };
  const back = widened.storage === null ? out : narrowHalf(out, widened.storage);
  return back as unknown as KdaResult<ResultArray<F>, O>;
}

/**
 * Refuses a cotangent of ht for a call that returns none (outputFinalState false).
 */
function checkNoDht(cotangents: unknown, finalState: boolean): void {
  const dht = (cotangents as { dht?: unknown } | null)?.dht;
  if (!finalState && dht !== undefined) {
    throw new TypeError(
      "cotangents.dht must be absent with options.outputFinalState false (the call returns no " +
        `ht): got ${typeName(dht)}`,
    );
  }
}

/**
 * The KDA op's vector-Jacobian product: runs the forward on a tape and pulls the cotangents of
 * `o` and `ht` back to every input.
 *
 * @param inputs q, k, v, g, beta (and optionally h0, scale, HV, cuSeqlens, aLog, dtBias) as for
 *   {@linkcode kda}.
 * @param cotangents `dout` [B, T, HV, V] and optional `dht` [B, HV, K, V] (`[N, HV, K, V]` when
 *   packed; refused with `outputFinalState: false`), of the inputs' element type.
 * @param options As for {@linkcode kda}.
 * @returns dq, dk, dv, dg, dbeta and dh0, of the inputs' element type and shapes (dh0 also
 *   without h0: the gradient at a zero initial state; with HV > H, dq and dk are summed over each
 *   group of value heads; 16-bit inputs give gradients of their type), and daLog, ddtBias when
 *   those inputs were given. With in-kernel options each gradient is of the raw input (the
 *   logits, the raw gate, q and k before normalisation).
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
): Promise<KdaVjpResult<ResultArray<F>>> {
  // the values of large copies are checked by the arm that uploads them, else before a tape runs
  // (_value_checks.ts)
  const checks = new ValueChecks({ deferBytes: DEFER_CHECK_BYTES });
  const snap = snapshotCall(true);
  let widened: ReturnType<typeof widenInputs>, call: ReturnType<typeof checkCall>;
  let hostCot: KdaCotangents<Float> | undefined;
  try {
    widened = widenInputs(inputs);
    call = checkCall(
      widened.inputs,
      options,
      checks,
      widened.storage === null ? snap.snapshotsFor : undefined,
    );
    checkNoDht(cotangents, call.finalState);
    if (!call.checked.device) {
      const storage = widened.storage;
      hostCot = checkKdaCotangents(
        storage !== null
          ? widenHalf("cotangents", checkObject("cotangents", cotangents), ["dout", "dht"], storage)
          : cotangents,
        // a call on snapshots takes its cotangents into them too
        { ...call.checked, problem: call.checked.problem as KdaProblem<Float>, checks },
      );
    }
  } catch (error) {
    // the verdict may read the snapshots back: they go after it
    try {
      return await checks.settle(error);
    } finally {
      releaseSnapshotCall(snap.made);
    }
  }
  const { checked, opts, finalState } = call;
  if (checked.snapshots !== undefined) {
    // the cotangents were taken into the call's snapshots as they were checked
    const problem = checked.problem;
    const cot = hostCot as unknown as KdaCotangents<GpuTensor>;
    const gradsInto = snap.made.results;
    return await onSnapshots(snap.made, problem, opts, checks, true, async (C, kernels) => {
      const { saved } = await gpuForward(problem, {
        chunkSize: C,
        kernels,
        saveForBackward: true,
        outputs: false,
        gradsToHost: true,
        gradsInto,
        checks,
      });
      try {
        return await gpuBackward(saved!, cot);
      } finally {
        saved!.release(true);
      }
    }) as unknown as KdaVjpResult<ResultArray<F>>;
  }
  if (checked.device) {
    const problem = checked.problem;
    const cot = checkKdaCotangents(cotangents, { ...checked, problem });
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
    }, [inputs, cotangents]) as KdaVjpResult<ResultArray<F>>;
  }
  const { problem, dtype } = checked;
  const { dout, dht } = hostCot!;
  const { B, K, V } = problem;
  const HV = problem.HV ?? problem.H;
  const N = problem.cuSeqlens === undefined ? B : problem.cuSeqlens.length - 1;
  // h0 is always an input so that dh0 exists; absent, it is a zero state.
  const withH0 = { ...problem, h0: problem.h0 ?? alloc(dtype, N * HV * K * V) };
  const request = requestOf(problem, opts, checks);
  const back = (out: KdaVjpResult<Float>) =>
    (widened.storage === null ? out : narrowHalf(out, widened.storage)) as unknown as KdaVjpResult<
      ResultArray<F>
    >;
  // an arm that runs the forward and the backward as one takes the call without a tape (the gpu
  // arm: no output is read back, the pending checks run on its uploads); otherwise it is recorded
  // on one, once they have passed
  let direct: Awaited<ReturnType<typeof vjpKda>>;
  try {
    direct = await vjpKda(
      [
        withH0.q,
        withH0.k,
        withH0.v,
        withH0.g,
        withH0.beta,
        withH0.h0,
        withH0.aLog,
        withH0.dtBias,
      ],
      finalState ? [dout, dht ?? null] : [dout],
      request,
      seamOptions(opts),
    );
  } catch (error) {
    return await checks.settle(error);
  }
  await checks.verdict();
  if (direct !== null) {
    // the arm has uploaded the checked copies and holds none: the next call may copy into them
    const { q, k, v, g, beta, h0, aLog, dtBias } = withH0;
    giveBackCopies([q, k, v, g, beta, h0, aLog, dtBias, dout, dht]);
    // an input the arm gave no cotangent has a zero one, as on the tape
    const grad = (i: number, x: Float) => (direct[i] as Float | null) ?? alloc(dtype, x.length);
    return back({
      dq: grad(0, withH0.q),
      dk: grad(1, withH0.k),
      dv: grad(2, withH0.v),
      dg: grad(3, withH0.g),
      dbeta: grad(4, withH0.beta),
      dh0: grad(5, withH0.h0),
      ...(withH0.aLog !== undefined ? { daLog: grad(6, withH0.aLog) } : {}),
      ...(withH0.dtBias !== undefined ? { ddtBias: grad(7, withH0.dtBias) } : {}),
    });
  }
  const tape = new Tape(dtype);
  try {
    const x = tensorsOf(withH0, (data, shape) => tape.variable(data, shape));
    const { o, ht } = await runKda(x, request, seamOptions(opts));
    const seeds = [{ output: o, cotangent: dout }];
    if (dht !== undefined) seeds.push({ output: ht, cotangent: dht });
    const grads = await tape.backwardFrom(seeds);
    const grad = (t: Tensor | undefined) => grads.get(t!) ?? alloc(dtype, t!.size);
    return back({
      dq: grad(x.q),
      dk: grad(x.k),
      dv: grad(x.v),
      dg: grad(x.g),
      dbeta: grad(x.beta),
      dh0: grad(x.h0),
      ...(x.aLog !== undefined ? { daLog: grad(x.aLog) } : {}),
      ...(x.dtBias !== undefined ? { ddtBias: grad(x.dtBias) } : {}),
    });
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
