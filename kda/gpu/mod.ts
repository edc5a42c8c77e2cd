// The `gpu` arm of the KDA op: WebGPU kernel sets, f32 compute.
//
//   kernel_set.ts  what a kernel set declares, and the registry of sets by name
//   kernels/       the sets of the package (fused/, ...), the shared WGSL and the glue WGSL,
//                  and the rule that picks a set when a call names none (kernels/mod.ts)
//   layout.ts      pure: the size algebra, a set's plan and limits, parameters, its WGSL header
//   accessors.ts   pure: the WGSL vec4 accessors, generated per buffer from a set's table
//   device.ts      the device context (adapter, device, each set's pipelines, lost state)
//   buffers.ts     buffer ownership, the live count and the optional pool
//   encode.ts      encode passes, submit, read back (any set, either direction)
//   job.ts         one forward or backward of a set on device tensors
//   glue.ts        grouped value heads and packed batches for sets that do not take them
//   call.ts        the one road: upload, the job, one readback (none for device tensors)
//   tensor.ts      GpuTensor, DeviceTensor and the host-sync count
//   snapshot.ts    a typed call's arrays uploaded as the call checks them, in place of host copies
//   _debug.ts      switches for tests and benchmarks
//
// A forward is one submit and (from typed arrays) one readback, a backward likewise. What the
// backward needs stays on the GPU in a GpuSaved handle, valid for any number of backward calls
// until it is released.

import type { ChunkSize, InKernel, KdaDims } from "../_types.ts";
import { gpuLiveBuffers, gpuPool, type GpuPoolStatus, gpuSettled } from "./buffers.ts";
import { gpuSyncs } from "./tensor.ts";
import type { GpuSaved } from "./job.ts";
import { getContext, type GpuInfo, lastDeviceLoss, readyContext } from "./device.ts";
import { kernelSet } from "./kernel_set.ts";
import { callProblem } from "./call.ts";
import { chooseKernels, DECODE_KERNELS } from "./kernels/mod.ts";

export { gpuLiveBuffers, gpuPool, type GpuPoolStatus, gpuSettled };
export type { GpuInfo, GpuSaved };
export { GpuError, type GpuErrorKind } from "./device.ts";
export { type GpuArray, gpuBackward, gpuForward } from "./call.ts";
export type { RangeCheck, RangeChecks } from "./range_checks.ts";
export { kernelSet, kernelSetNames } from "./kernel_set.ts";
export { chooseKernels, DECODE_KERNELS };

/** Whether the gpu arm can run here: the adapter's info, or the reason it cannot. */
export type GpuStatus = { available: true; info: GpuInfo } | { available: false; reason: string };

/**
 * Whether the gpu arm can run here. The first call creates the device (lazily, requesting the
 * adapter's own limits, and `timestamp-query` and `shader-f16` when offered); after a device
 * loss, the next call creates a fresh one.
 *
 * @returns `{ available: true, info }` with the adapter's description, kind (`info.software`) and
 *   limits, or `{ available: false, reason }` with a readable reason.
 *
 * @example
 * ```ts
 * const status = await gpuStatus();
 * console.log(status.available ? status.info.description : status.reason);
 * ```
 */
export async function gpuStatus(): Promise<GpuStatus> {
  try {
    const ctx = await getContext();
    return { available: true, info: ctx.info };
  } catch (error) {
    return { available: false, reason: error instanceof Error ? error.message : String(error) };
  }
}

/**
 * Why the gpu arm cannot run a problem with a kernel set, or null when it can. Synchronous: call
 * it after {@linkcode gpuStatus} reported the device available (the answer depends on its limits).
 *
 * @param dims B, T, H, K, V of the problem, and its resolved `scale`, grouped value heads `HV`,
 *   packed offsets `cuSeqlens` and in-kernel options `inKernel` if any.
 * @param chunkSize The chunk size the forward and backward would use.
 * @param kernels The kernel set (default: the rule's choice).
 * @returns null when the problem runs, else a readable reason: no device or a lost one, a bad
 *   shape, K or V over 256, a scale or the gate's lowerBound that f32 cannot hold, a set the device
 *   cannot run, or a buffer over the device's storage binding limit (saying what does fit).
 *
 * @example
 * ```ts
 * if ((await gpuStatus()).available) {
 *   console.log(gpuUnsupportedReason({ B: 1, T: 64, H: 1, K: 512, V: 64 }, 16)); // K too large
 * }
 * ```
 */
export function gpuUnsupportedReason(
  dims: KdaDims & { scale?: number; HV?: number; cuSeqlens?: Int32Array; inKernel?: InKernel },
  chunkSize: ChunkSize,
  kernels?: string,
): string | null {
  const ctx = readyContext();
  if (typeof ctx === "string") return ctx;
  const set = kernelSet(chooseKernels(kernels).name);
  return callProblem(ctx, set, { scale: 1, ...dims }, chunkSize);
}

/**
 * A snapshot of the gpu arm's state, for people and for leak checks.
 *
 * @returns Live buffers (pooled ones apart, in `pool`), the buffer pool, host syncs so far (gpuSyncs),
 *   the device status (with the adapter info), and the last device loss.
 *
 * @example
 * ```ts
 * const d = await gpuDiagnostics();
 * console.log(d.liveBuffers, d.status.available);
 * ```
 */
export async function gpuDiagnostics(): Promise<{
  liveBuffers: number;
  pool: GpuPoolStatus;
  syncs: number;
  status: GpuStatus;
  adapter: GpuInfo | null;
  lastDeviceLoss: string | null;
}> {
  const status = await gpuStatus();
  return {
    liveBuffers: gpuLiveBuffers(),
    pool: gpuPool(),
    syncs: gpuSyncs(),
    status,
    adapter: status.available ? status.info : null,
    lastDeviceLoss: lastDeviceLoss(),
  };
}
