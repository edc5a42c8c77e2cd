// The calls of the KDA op that run pinned to the gpu arm: on GpuTensors (onGpu), or on snapshots
// of typed arrays taken as the call checked them (snapshotCall, onSnapshots; kda/gpu/snapshot.ts),
// and the request and seam options every call of the op is dispatched with.

import type { ChunkSize, KdaProblem } from "../_types.ts";
import type { CallDims, CheckedOptions } from "./_check.ts";
import type { ValueChecks } from "./_value_checks.ts";
import {
  DEFAULT_CHUNK_SIZES,
  gpuRunsNow,
  type KdaRequest,
  kdaSeam,
  statesOf,
  valueHeads,
} from "./arms.ts";
import { DeviceSnapshots } from "../gpu/snapshot.ts";
import { type GpuTensor, pinTensors } from "../gpu/tensor.ts";
import { chooseKernels } from "../gpu/mod.ts";
import { resultLengths } from "../gpu/call.ts";
import { type FreshArrays, freshArrays } from "../gpu/fresh_arrays.ts";

/** The seam's request of a call: its dimensions and options (and value checks, when typed). */
export function requestOf(
  problem: Pick<
    KdaProblem<unknown>,
    "B" | "T" | "H" | "K" | "V" | "scale" | "HV" | "cuSeqlens" | "inKernel"
  >,
  options: CheckedOptions,
  checks?: ValueChecks,
): KdaRequest {
  const { B, T, H, K, V, scale, HV, cuSeqlens, inKernel } = problem;
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
    ...(inKernel !== undefined ? { inKernel } : {}),
    ...(checks !== undefined ? { checks } : {}),
  };
}

/** The seam's options of a call: arm, strictness and quietness. */
export function seamOptions(
  { arm, strict, quiet }: CheckedOptions,
): { arm?: string; strict?: boolean; quiet?: boolean } {
  return { arm, strict, quiet };
}

/**
 * A call's snapshots, taken as it checks its f32 arrays, when it is sure to run on the gpu arm
 * (gpuRunsNow); `made` holds them for the call to release whatever happens, and the host arrays of
 * its results, which worker threads start making before the first upload, so that they are ready
 * when the readback comes (kda/gpu/fresh_arrays.ts; the uploads are the calling thread's longest
 * wait on such a call).
 */
export function snapshotCall(backward: boolean): {
  made: { snapshots: DeviceSnapshots | null; results: FreshArrays | undefined };
  snapshotsFor: (dims: CallDims, opts: CheckedOptions) => DeviceSnapshots | null;
} {
  const made = {
    snapshots: null as DeviceSnapshots | null,
    results: undefined as FreshArrays | undefined,
  };
  return {
    made,
    snapshotsFor(dims, opts) {
      // the in-kernel options too: the gpu arm's answer depends on them (the gate's lowerBound)
      const inKernel = opts.inKernel;
      const request = requestOf({ ...dims, ...(inKernel !== undefined ? { inKernel } : {}) }, opts);
      const ctx = gpuRunsNow(request, seamOptions(opts), backward);
      if (ctx === null) return null;
      const gate = opts.inKernel?.gate ?? null;
      made.results = freshArrays(resultLengths(
        { ...dims, HV: valueHeads(request), N: statesOf(request) },
        backward
          ? { grads: true, gate: gate === null ? null : dims.gateArrays }
          : { grads: false, finalState: opts.inKernel?.finalState ?? true },
      ));
      made.snapshots = new DeviceSnapshots(ctx);
      return made.snapshots;
    },
  };
}

/** Releases a call's snapshots and gives up its result arrays unless taken (after its verdict). */
export function releaseSnapshotCall(made: ReturnType<typeof snapshotCall>["made"]): void {
  made.snapshots?.release();
  made.results?.cancel();
}

/**
 * Runs a call on its snapshots on the gpu arm (as onGpu runs one on GpuTensors) and returns
 * nothing unless its value checks pass; the snapshots are sealed first and released once the
 * verdict is in (which may read them back).
 */
export async function onSnapshots<T>(
  made: ReturnType<typeof snapshotCall>["made"],
  problem: KdaProblem<GpuTensor>,
  options: CheckedOptions,
  checks: ValueChecks,
  backward: boolean,
  run: (chunkSize: ChunkSize, kernels: string) => Promise<T>,
): Promise<T> {
  made.snapshots!.seal();
  try {
    const out = await onGpu(problem, options, backward, run, []);
    await checks.verdict();
    return out;
  } catch (error) {
    return await checks.settle(error);
  } finally {
    releaseSnapshotCall(made);
  }
}

/**
 * Runs a call on GpuTensors on the gpu arm, through the seam, which counts it like every call and
 * refuses a wish for another arm (the data is pinned to the gpu arm's device). The checked problem
 * holds the buffers that passed; the caller's DeviceTensors (`caller`) are held for the call from
 * here, before its first await, so that one the caller releases meanwhile is handed to no other
 * upload before this call has read it.
 */
export function onGpu<T>(
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
