// The gpu arm on tensors that stay on the device: the inputs are copied into the kernels' packed
// buffers on the GPU, the results are copied out into DeviceTensors on the GPU, and nothing is
// read back, so a call returns right after its submit and costs no host sync. Queue order keeps
// the results valid for whatever is queued next (another call, or DeviceTensor.read).

import type { ChunkSize, KdaGrads, KdaProblem } from "../_types.ts";
import { BufferSet } from "./buffers.ts";
import { BackwardJob, ForwardJob } from "./calls.ts";
import { getContext, type GpuContext } from "./device.ts";
import { DeviceTensor, type GpuTensor } from "./tensor.ts";

/** Buffers of the call's results (pooled or new), owned by DeviceTensors (released if the call fails). */
function allocate(ctx: GpuContext, shapes: readonly (readonly number[])[]): DeviceTensor[] {
  return shapes.map((shape) => {
    const bytes = shape.reduce((a, b) => a * b, 1) * 4;
    return new DeviceTensor(
      ctx,
      BufferSet.acquire(ctx.device, "DeviceTensor", bytes),
      shape,
    );
  });
}

async function owning<T>(tensors: DeviceTensor[], body: () => Promise<T>): Promise<T> {
  try {
    return await body();
  } catch (error) {
    for (const t of tensors) t.release();
    throw error;
  }
}

/**
 * The chunked KDA forward on device tensors: one submit, no readback.
 *
 * @param x The problem (checked at the public boundary) with GpuTensor arrays of the shapes of
 *   {@linkcode gpuForward}'s.
 * @param chunkSize The chunk size.
 * @returns `o` [B,T,H,V] and `ht` [B,H,K,V] as DeviceTensors owned by the caller.
 * @example
 * ```ts
 * import { toGpu } from "./tensor.ts";
 * const [B, T, H, K, V] = [1, 8, 1, 4, 4];
 * const up = (n: number, v: number, shape: number[]) => toGpu(new Float32Array(n).fill(v), shape);
 * const x = {
 *   B, T, H, K, V, scale: 0.5,
 *   q: await up(32, 0.1, [B, T, H, K]), k: await up(32, 0.5, [B, T, H, K]),
 *   v: await up(32, 1, [B, T, H, V]), g: await up(32, -0.1, [B, T, H, K]),
 *   beta: await up(8, 0.5, [B, T, H]),
 * };
 * const { o, ht } = await gpuForwardOnDevice(x, 16);
 * console.log((await o.read()).length); // 32
 * for (const t of [o, ht, x.q, x.k, x.v, x.g, x.beta]) t.release();
 * ```
 */
export async function gpuForwardOnDevice(
  x: KdaProblem<GpuTensor>,
  chunkSize: ChunkSize,
): Promise<{ o: DeviceTensor; ht: DeviceTensor }> {
  const ctx = await getContext();
  const { B, T, H, K, V } = x;
  const [o, ht] = allocate(ctx, [[B, T, H, V], [B, H, K, V]]);
  return await owning([o, ht], async () => {
    const job = await ForwardJob.create(ctx, x, { chunkSize });
    try {
      await job.run(false, [o.buffer, ht.buffer]);
      return { o, ht };
    } finally {
      job.destroy(true);
    }
  });
}

/**
 * The forward and the backward of the chunked KDA on device tensors, in two submits and no
 * readback: the vector-Jacobian product of `o` and `ht` with the cotangents.
 *
 * @param x The problem (checked at the public boundary) with GpuTensor arrays.
 * @param cotangents `dout` [B,T,H,V] and optional `dht` [B,H,K,V] on the device.
 * @param chunkSize The chunk size.
 * @returns dq, dk, dv, dg, dbeta and dh0 as DeviceTensors owned by the caller.
 * @example
 * ```ts
 * import { toGpu } from "./tensor.ts";
 * const [B, T, H, K, V] = [1, 8, 1, 4, 4];
 * const up = (n: number, v: number, shape: number[]) => toGpu(new Float32Array(n).fill(v), shape);
 * const x = {
 *   B, T, H, K, V, scale: 0.5,
 *   q: await up(32, 0.1, [B, T, H, K]), k: await up(32, 0.5, [B, T, H, K]),
 *   v: await up(32, 1, [B, T, H, V]), g: await up(32, -0.1, [B, T, H, K]),
 *   beta: await up(8, 0.5, [B, T, H]),
 * };
 * const dout = await up(32, 1, [B, T, H, V]);
 * const grads = await gpuVjpOnDevice(x, { dout }, 16);
 * console.log((await grads.dbeta.read()).length); // 8: the one host sync
 * for (const t of [...Object.values(grads), dout, x.q, x.k, x.v, x.g, x.beta]) t.release();
 * ```
 */
export async function gpuVjpOnDevice(
  x: KdaProblem<GpuTensor>,
  cotangents: { dout: GpuTensor; dht?: GpuTensor },
  chunkSize: ChunkSize,
): Promise<KdaGrads<DeviceTensor>> {
  const ctx = await getContext();
  const { B, T, H, K, V } = x;
  const grads = allocate(ctx, [
    [B, T, H, K],
    [B, T, H, K],
    [B, T, H, V],
    [B, T, H, K],
    [B, T, H],
    [B, H, K, V],
  ]);
  return await owning(grads, async () => {
    const forward = await ForwardJob.create(ctx, x, { chunkSize, saveForBackward: true });
    let saved;
    try {
      // o and ht are not wanted: no target, no copy, no readback
      await forward.run(false, []);
      saved = forward.takeSaved();
    } finally {
      forward.destroy(true);
    }
    try {
      const backward = await BackwardJob.create(saved, cotangents.dout, cotangents.dht, false);
      try {
        await backward.run(false, grads.map((t) => t.buffer));
      } finally {
        backward.destroy(true);
      }
    } finally {
      saved.release(true);
    }
    const [dq, dk, dv, dg, dbeta, dh0] = grads;
    return { dq, dk, dv, dg, dbeta, dh0 };
  });
}
