// The `gpu` arm of the KDA op: WebGPU kernels in kda/chunk.wgsl, f32 only.
//
//   device.ts     the device context (adapter, device, pipelines, lost state)
//   layout.ts     pure: plan, buffer regions, limits, scan ranges, parameters, the WGSL header
//   accessors.ts  pure: the WGSL vec4 accessors, generated per buffer
//   buffers.ts    buffer ownership, the live count and the optional pool
//   passes.ts     encode passes, submit, read back (shared by forward and backward)
//   calls.ts      one forward or backward call: allocate and upload, run, free
//   tensor.ts     GpuTensor, DeviceTensor and the host-sync count
//   resident.ts   calls on GpuTensors: copies in and out on the GPU, no readback
//
// A forward is one submit and one readback, a backward likewise (none on GpuTensors). What the
// backward needs stays on the GPU in a GpuSaved handle, valid for any number of backward calls
// until it is released.

import type { ChunkSize, KdaDims, KdaGrads, KdaProblem } from "../_types.ts";
import { gpuLiveBuffers, gpuPool, type GpuPoolStatus, gpuSettled } from "./buffers.ts";
import { gpuSyncs } from "./tensor.ts";
import { assertUsable, BackwardJob, ForwardJob, type GpuSaved, SavedState } from "./calls.ts";
import {
  getContext,
  type GpuContext,
  type GpuInfo,
  lastDeviceLoss,
  readyContext,
} from "./device.ts";
import { limitProblem, makePlan, scaleProblem, shapeProblem } from "./layout.ts";

export { gpuLiveBuffers, gpuPool, type GpuPoolStatus, gpuSettled };
export type { GpuInfo, GpuSaved };
export { GpuError, type GpuErrorKind } from "./device.ts";

/** Whether the gpu arm can run here: the adapter's info, or the reason it cannot. */
export type GpuStatus = { available: true; info: GpuInfo } | { available: false; reason: string };

/**
 * Whether the gpu arm can run here. The first call creates the device (lazily, requesting the
 * adapter's own limits, and `timestamp-query` when offered); after a device loss, the next call
 * creates a fresh one.
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
 * Why the gpu arm cannot run a problem, or null when it can. Synchronous: call it after
 * {@linkcode gpuStatus} reported the device available (the answer depends on its limits).
 *
 * @param dims B, T, H, K, V of the problem, and its resolved `scale` if known.
 * @param chunkSize The chunk size the forward and backward would use.
 * @returns null when the problem runs, else a readable reason: no device or a lost one, a bad
 *   shape, K or V over 256, a scale that is not finite in f32, or a buffer over the device's
 *   storage binding limit (saying what does fit).
 *
 * @example
 * ```ts
 * if ((await gpuStatus()).available) {
 *   console.log(gpuUnsupportedReason({ B: 1, T: 64, H: 1, K: 512, V: 64 }, 16)); // K too large
 * }
 * ```
 */
export function gpuUnsupportedReason(
  dims: KdaDims & { scale?: number },
  chunkSize: ChunkSize,
): string | null {
  const ctx = readyContext();
  if (typeof ctx === "string") return ctx;
  return problemOf(ctx, dims, chunkSize);
}

function problemOf(
  ctx: GpuContext,
  dims: KdaDims & { scale?: number },
  chunkSize: number,
): string | null {
  const shape = shapeProblem(dims, chunkSize);
  if (shape !== null) return shape;
  if (dims.scale !== undefined) {
    const scale = scaleProblem(dims.scale);
    if (scale !== null) return scale;
  }
  return limitProblem(makePlan(dims, chunkSize as ChunkSize), ctx.info.limits);
}

/**
 * A snapshot of the gpu arm's state, for people and for leak checks.
 *
 * @returns Live buffers (pooled ones included), the buffer pool, host syncs so far (gpuSyncs),
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

function checkArray(name: string, value: unknown, expected: number, dims: string): Float32Array {
  if (!(value instanceof Float32Array)) {
    const actual = value === undefined || value === null
      ? String(value)
      : (value as object).constructor?.name ?? typeof value;
    throw new TypeError(`${name} must be a Float32Array: got ${actual}`);
  }
  if (value.length !== expected) {
    throw new RangeError(`${name} must have ${expected} elements ${dims}: got ${value.length}`);
  }
  return value;
}

/**
 * The chunked KDA forward on the GPU, in f32: one submit, one readback.
 *
 * @param x The problem with Float32Array fields (q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H];
 *   optional h0 [B,H,K,V]) and the resolved scale.
 * @param options `chunkSize` (16, 32 or 64); `saveForBackward` keeps what
 *   {@linkcode gpuBackward} needs on the GPU; `prefillNaN` fills every output and scratch buffer
 *   with NaN first, so that a missing write cannot pass as a zero (for tests).
 * @returns `o` [B,T,H,V] and `ht` [B,H,K,V], each owning its ArrayBuffer, and `saved` when
 *   `saveForBackward` was set (release it when no more backward calls will come).
 * @throws {TypeError} When an array is not a Float32Array.
 * @throws {RangeError} When a length, the shape or the scale is wrong, or the shape exceeds a
 *   device limit.
 * @throws {Error} When no GPU is available; a {@linkcode GpuError} on a GPU error or device loss.
 *
 * @example
 * ```ts
 * const B = 1, T = 20, H = 1, K = 4, V = 4;
 * const { o, ht } = await gpuForward({
 *   B, T, H, K, V, scale: 0.5,
 *   q: new Float32Array(B * T * H * K).fill(0.1),
 *   k: new Float32Array(B * T * H * K).fill(0.5),
 *   v: new Float32Array(B * T * H * V).fill(1),
 *   g: new Float32Array(B * T * H * K).fill(-0.1),
 *   beta: new Float32Array(B * T * H).fill(0.5),
 * }, { chunkSize: 16 });
 * console.log(o.length, ht.length); // 80 16
 * ```
 */
export async function gpuForward(
  x: KdaProblem<Float32Array>,
  options: { chunkSize: ChunkSize; saveForBackward?: boolean; prefillNaN?: boolean },
): Promise<{ o: Float32Array; ht: Float32Array; saved?: GpuSaved }> {
  const shape = shapeProblem(x, options?.chunkSize);
  if (shape !== null) throw new RangeError(shape);
  const scale = scaleProblem(x.scale);
  if (scale !== null) throw new RangeError(scale);
  const ctx = await getContext();
  const limit = limitProblem(makePlan(x, options.chunkSize), ctx.info.limits);
  if (limit !== null) throw new RangeError(limit);
  const { B, T, H, K, V } = x;
  const checked: KdaProblem<Float32Array> = {
    B,
    T,
    H,
    K,
    V,
    scale: x.scale,
    q: checkArray("q", x.q, B * T * H * K, "[B, T, H, K]"),
    k: checkArray("k", x.k, B * T * H * K, "[B, T, H, K]"),
    v: checkArray("v", x.v, B * T * H * V, "[B, T, H, V]"),
    g: checkArray("g", x.g, B * T * H * K, "[B, T, H, K]"),
    beta: checkArray("beta", x.beta, B * T * H, "[B, T, H]"),
    ...(x.h0 !== undefined ? { h0: checkArray("h0", x.h0, B * H * K * V, "[B, H, K, V]") } : {}),
  };
  const job = await ForwardJob.create(ctx, checked, options);
  try {
    const { o, ht } = await job.run();
    if (options.saveForBackward !== true) return { o, ht };
    return { o, ht, saved: job.takeSaved() };
  } finally {
    job.destroy();
  }
}

/**
 * The chunked KDA backward on the GPU, in f32: one submit, one readback. `saved` stays valid: any
 * number of backward calls may run on it, concurrently or not, each with its own cotangent and
 * scratch buffers (the same inputs give the same bits), until `saved.release()`.
 *
 * @param saved The handle returned by {@linkcode gpuForward} with `saveForBackward: true`.
 * @param cotangents `dout` [B,T,H,V] and optional `dht` [B,H,K,V] (absent means zero).
 * @param options `prefillNaN` fills every output and scratch buffer with NaN first (for tests).
 * @returns `dq, dk, dv, dg, dbeta, dh0`, each a Float32Array owning its ArrayBuffer.
 * @throws {TypeError} When `saved` is not a handle from gpuForward or a cotangent is not a
 *   Float32Array.
 * @throws {RangeError} When a cotangent has the wrong length.
 * @throws {Error} When `saved` was released (the tape that recorded the forward was disposed);
 *   a {@linkcode GpuError} when the forward's device was lost or a GPU error occurred.
 *
 * @example
 * ```ts
 * const B = 1, T = 20, H = 1, K = 4, V = 4;
 * const { saved } = await gpuForward({
 *   B, T, H, K, V, scale: 0.5,
 *   q: new Float32Array(B * T * H * K).fill(0.1),
 *   k: new Float32Array(B * T * H * K).fill(0.5),
 *   v: new Float32Array(B * T * H * V).fill(1),
 *   g: new Float32Array(B * T * H * K).fill(-0.1),
 *   beta: new Float32Array(B * T * H).fill(0.5),
 * }, { chunkSize: 16, saveForBackward: true });
 * const grads = await gpuBackward(saved!, { dout: new Float32Array(B * T * H * V).fill(1) });
 * saved!.release();
 * console.log(grads.dq.length); // 80
 * ```
 */
export async function gpuBackward(
  saved: GpuSaved,
  cotangents: { dout: Float32Array; dht?: Float32Array },
  options: { prefillNaN?: boolean } = {},
): Promise<KdaGrads<Float32Array>> {
  if (!(saved instanceof SavedState)) {
    throw new TypeError("saved must be the handle returned by gpuForward: got another object");
  }
  const { plan } = saved;
  const dout = checkArray(
    "dout",
    cotangents?.dout,
    plan.B * plan.T * plan.H * plan.V,
    "[B, T, H, V]",
  );
  const dht = cotangents.dht === undefined
    ? undefined
    : checkArray("dht", cotangents.dht, plan.B * plan.H * plan.K * plan.V, "[B, H, K, V]");
  assertUsable(saved, readyContextOr(saved));
  saved.acquire();
  try {
    const job = await BackwardJob.create(saved, dout, dht, options.prefillNaN === true);
    try {
      const [dq, dk, dv, dg, dbeta, dh0] = (await job.run()).arrays;
      return { dq, dk, dv, dg, dbeta, dh0 };
    } finally {
      job.destroy();
    }
  } finally {
    saved.unacquire();
  }
}

/** The current live context, or `saved`'s own if none is ready (assertUsable then explains). */
function readyContextOr(saved: SavedState): GpuContext {
  const ctx = readyContext();
  return typeof ctx === "string" ? saved.ctx : ctx;
}
