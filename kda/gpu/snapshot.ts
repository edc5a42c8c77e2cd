// A call's snapshot of a caller's typed array on the device, in place of a host copy.
//
// A call from typed arrays must compute on the values it checked, whatever the caller does to its
// arrays while the call is pending (docs/kda.md 3.3). The host copy that guarantees it costs a
// pass over the array on the calling thread, and the gpu arm then uploads the copy: two passes
// over host memory where one would do. When the call is sure to run on the gpu arm from the
// moment it checks its arguments (kda/op/arms.ts, gpuRunsNow), it uploads each array there
// instead: `writeBuffer` copies the bytes before it returns, so the upload is the snapshot, taken
// before the call's first await. The call then runs on the uploads as on GpuTensors, and reads
// its results back to typed arrays.
//
// A value check of a snapshot (kda/op/_value_checks.ts) runs at once on the caller's array while
// the call is still checking (the same bytes as the upload, nothing having run in between), or on
// the device over the upload; an element outside its interval is found by reading the upload back.

import { BufferSet, upload } from "./buffers.ts";
import type { GpuContext } from "./device.ts";
import { DeviceTensor, type GpuTensor } from "./tensor.ts";

let taken = 0;

/**
 * Snapshots taken in this process so far (for tests: that a call took the route it should).
 *
 * @returns The count.
 * @example
 * ```ts
 * import { snapshotsTaken } from "./snapshot.ts";
 * console.log(snapshotsTaken()); // 0 before any call uploaded as it checked
 * ```
 */
export function snapshotsTaken(): number {
  return taken;
}

/**
 * One array of a call, uploaded when the call checked it. A GpuTensor to the kernels; to the
 * call's value checks, the caller's array until the call seals its snapshots, and the upload
 * (read back) after.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { getContext } from "./device.ts";
 * import { DeviceSnapshots } from "./snapshot.ts";
 * const snapshots = new DeviceSnapshots(await getContext());
 * const host = new Float32Array([1, 2, 3, 4]);
 * const s = snapshots.take(host, [2, 2]);
 * snapshots.seal();
 * host[0] = 9; // the call's snapshot keeps what it uploaded
 * assert.deepEqual([...await s.read()], [1, 2, 3, 4]);
 * snapshots.release();
 * ```
 */
export class DeviceSnapshot implements GpuTensor {
  /** The element type. */
  readonly dtype = "f32" as const;
  /** The shape the call checked. */
  readonly shape: readonly number[];
  /** Elements. */
  readonly length: number;
  /** Bytes. */
  readonly byteLength: number;
  readonly #tensor: DeviceTensor;
  #host: Float32Array | null;

  /**
   * Uploads `host` now (see {@linkcode DeviceSnapshots.take}).
   *
   * @param ctx The device context.
   * @param host The caller's array.
   * @param shape Its shape.
   */
  constructor(ctx: GpuContext, host: Float32Array, shape: readonly number[]) {
    const buffer = BufferSet.acquire(ctx.device, "snapshot", Math.max(4, host.byteLength));
    upload(ctx.device.queue, buffer, 0, host);
    this.#tensor = new DeviceTensor(ctx, buffer, [...shape]);
    this.shape = [...shape];
    this.length = host.length;
    this.byteLength = host.byteLength;
    this.#host = host;
  }

  /** The upload's buffer. */
  get buffer(): GPUBuffer {
    return this.#tensor.buffer;
  }

  /**
   * The caller's array, only while the call that took it is still checking (before its first
   * await, when it holds the same bytes as the upload).
   */
  get host(): Float32Array {
    if (this.#host === null) {
      throw new Error("internal: a sealed snapshot's host array was asked for");
    }
    return this.#host;
  }

  /**
   * The uploaded elements: one host sync.
   *
   * @returns A Float32Array of their own.
   */
  read(): Promise<Float32Array> {
    return this.#tensor.read();
  }

  /** Lets the caller's array go: from here on the snapshot is the upload alone. */
  seal(): void {
    this.#host = null;
  }

  /** Gives the upload's buffer back once the work queued on it is done. */
  release(): void {
    this.#host = null;
    this.#tensor.release();
  }
}

/**
 * The snapshots one call takes: made while it checks its arguments, sealed before its first
 * await, released when it is done (after its value checks' verdict, which may read them).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { getContext } from "./device.ts";
 * import { gpuLiveBuffers, gpuSettled } from "./buffers.ts";
 * import { DeviceSnapshots } from "./snapshot.ts";
 * const ctx = await getContext();
 * await gpuSettled();
 * const before = gpuLiveBuffers();
 * const snapshots = new DeviceSnapshots(ctx);
 * snapshots.take(new Float32Array(8), [8]);
 * snapshots.release();
 * await gpuSettled(); // the upload's buffer goes once the queue is done with it
 * assert.equal(gpuLiveBuffers(), before);
 * ```
 */
export class DeviceSnapshots {
  readonly #ctx: GpuContext;
  readonly #made: DeviceSnapshot[] = [];

  /**
   * Snapshots on one device.
   *
   * @param ctx The device context (ready: taking a snapshot never awaits).
   */
  constructor(ctx: GpuContext) {
    this.#ctx = ctx;
  }

  /**
   * Uploads the caller's array now, as the call's snapshot of it.
   *
   * @param host The array, checked for its type and length.
   * @param shape Its shape.
   * @returns The snapshot.
   */
  take(host: Float32Array, shape: readonly number[]): DeviceSnapshot {
    const snapshot = new DeviceSnapshot(this.#ctx, host, shape);
    this.#made.push(snapshot);
    taken++;
    return snapshot;
  }

  /** Seals every snapshot (the call is about to await). */
  seal(): void {
    for (const s of this.#made) s.seal();
  }

  /** Releases every snapshot; a second call does nothing. */
  release(): void {
    for (const s of this.#made.splice(0)) s.release();
  }
}
