// Tensors whose data stays on the gpu arm's device, so that calls can be chained (a forward, a
// backward, the next step's forward) without a host round trip in between: each host sync costs
// about 10 ms in Deno's WebGPU whatever the work, so a training step should pay one. Reading a
// tensor back is that sync, and the package counts every one it makes (gpuSyncs).

import { getContext, type GpuContext, GpuError } from "./device.ts";
import { BufferSet, recycleBuffer, upload } from "./buffers.ts";
import { typeName } from "../../base/check.ts";
import { bytesOf } from "./layout.ts";
import { ownStaging, stageReads } from "./readback.ts";

let syncs = 0;

/**
 * How many host syncs (buffer readbacks) the gpu arm has made since the process started: one per
 * typed-array call, none for a call on {@linkcode GpuTensor}s, one per {@linkcode DeviceTensor.read}.
 *
 * @returns The count.
 * @example
 * ```ts
 * const before = gpuSyncs();
 * // ... a step on GpuTensors, then one read of its loss ...
 * console.log(gpuSyncs() - before); // 1
 * ```
 */
export function gpuSyncs(): number {
  return syncs;
}

/** Counts one host sync (called by every readback of the package). */
export function countSync(): void {
  syncs++;
}

/**
 * An f32 tensor in a GPUBuffer of the gpu arm's device (see {@linkcode gpuDevice}), row-major in
 * `shape`, starting at byte 0. {@linkcode kda} and {@linkcode kdaVjp} take these in place of typed
 * arrays (all inputs or none) and then return {@linkcode DeviceTensor}s, with no host copy in
 * between. The buffer needs `COPY_SRC` usage (the kernels read a packed copy made on the GPU) and
 * at least 4 bytes per element.
 *
 * @example
 * ```ts
 * import { gpuDevice, type GpuTensor } from "@deltanet/kda";
 * const device = await gpuDevice();
 * const q: GpuTensor = {
 *   buffer: device.createBuffer({ size: 64, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC }),
 *   shape: [1, 4, 1, 4],
 *   dtype: "f32",
 * };
 * ```
 */
export interface GpuTensor {
  /** Holds the elements, f32, from byte 0. */
  readonly buffer: GPUBuffer;
  /** The tensor's shape, row-major. */
  readonly shape: readonly number[];
  /** The element type: f32 only. */
  readonly dtype: "f32";
}

/**
 * Whether a value is a {@linkcode GpuTensor} (an object holding a GPUBuffer).
 *
 * @param x Any value.
 * @returns True for a GpuTensor.
 * @example
 * ```ts
 * isGpuTensor(new Float32Array(4)); // false
 * ```
 */
export function isGpuTensor(x: unknown): x is GpuTensor {
  if (x instanceof DeviceTensor) return true; // even released (its buffer getter would throw)
  return typeof GPUBuffer !== "undefined" && typeof x === "object" && x !== null &&
    (x as { buffer?: unknown }).buffer instanceof GPUBuffer;
}

/**
 * A {@linkcode GpuTensor} the package allocated: an output or gradient of a call on GpuTensors,
 * or an upload by {@linkcode toGpu}. It owns its buffer, which counts in `gpuLiveBuffers()` until
 * {@linkcode DeviceTensor.release}.
 *
 * @example
 * ```ts
 * import { toGpu } from "@deltanet/kda";
 * const t = await toGpu(new Float32Array([1, 2, 3, 4]), [2, 2]);
 * console.log(await t.read()); // Float32Array [1, 2, 3, 4]: one host sync
 * t.release();
 * ```
 */
export class DeviceTensor implements GpuTensor {
  /** The element type. */
  readonly dtype = "f32" as const;
  #buffer: GPUBuffer | null;
  #ctx: GpuContext;
  /** Calls that have checked this tensor and not yet submitted their work (pinTensors). */
  #pins = 0;
  /** The buffer of a tensor released while pinned, given back when the last pin ends. */
  #parked: GPUBuffer | null = null;

  /**
   * Wraps a counted buffer (from the package's pool or createBuffer) that this tensor now owns.
   *
   * @param ctx The device context the buffer lives on.
   * @param buffer The buffer, at least 4 bytes per element.
   * @param shape The shape (copied and frozen: the size and reads follow it).
   */
  constructor(ctx: GpuContext, buffer: GPUBuffer, shape: readonly number[]) {
    this.#ctx = ctx;
    this.#buffer = buffer;
    this.shape = Object.freeze([...shape]);
  }

  /** The shape, frozen. */
  readonly shape: readonly number[];

  /** The buffer; reading it after {@linkcode DeviceTensor.release} throws. */
  get buffer(): GPUBuffer {
    if (this.#buffer === null) {
      throw new TypeError("This DeviceTensor was released: its buffer is gone");
    }
    return this.#buffer;
  }

  /** Elements of the tensor. */
  get size(): number {
    return this.shape.reduce((a, b) => a * b, 1);
  }

  /** Whether {@linkcode DeviceTensor.release} has run. */
  get released(): boolean {
    return this.#buffer === null;
  }

  /**
   * Copies the tensor to the host: one host sync (after every call queued before it).
   *
   * @returns The elements, in a Float32Array of their own.
   */
  async read(): Promise<Float32Array> {
    const source = this.buffer;
    const ctx = this.#ctx;
    const bytes = bytesOf(this.size, "f32");
    const staging = ownStaging(ctx.device);
    try {
      const staged = await ctx.scoped("DeviceTensor.read", () => {
        const encoder = ctx.device.createCommandEncoder({ label: "DeviceTensor.read" });
        // an empty tensor still reads a word: the call waits for the queue like any other read
        const read = { buffer: source, offset: 0, bytes: Math.max(4, bytes) };
        const staged = stageReads(staging.make, encoder, [read], "DeviceTensor.read");
        ctx.device.queue.submit([encoder.finish()]);
        return staged;
      });
      countSync();
      try {
        await staged.map();
      } catch (error) {
        ctx.assertAlive("DeviceTensor.read");
        throw new GpuError(
          "internal",
          `DeviceTensor.read failed while reading back: ${
            error instanceof Error ? error.message : String(error)
          }`,
        );
      }
      // a device lost after the submit may have left the copy unwritten: never return it
      ctx.assertAlive("DeviceTensor.read");
      const out = staged.copyOut()[0];
      return bytes === 0 ? new Float32Array(0) : out;
    } finally {
      staging.destroy();
    }
  }

  /**
   * Frees the buffer once the GPU work queued on it is done (`gpuSettled` waits for that), or
   * gives it to the buffer pool (`gpuPool`); a second call does nothing. A call that took this
   * tensor and has not yet queued its work keeps the buffer until it has: the tensor reads as
   * released at once, and no upload can be handed its buffer before that call has read it.
   */
  release(): void {
    if (this.#buffer === null) return;
    if (this.#pins > 0) this.#parked = this.#buffer;
    else recycleBuffer(this.#ctx.device, this.#buffer, true);
    this.#buffer = null;
  }

  /** Holds the buffer for a call until the returned function runs (see pinTensors). */
  pin(): () => void {
    this.#pins++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.#pins--;
      if (this.#pins === 0 && this.#parked !== null) {
        recycleBuffer(this.#ctx.device, this.#parked, true);
        this.#parked = null;
      }
    };
  }
}

/**
 * A plain view of a tensor's buffer and shape, as a call holds what it checked: whatever the
 * tensor object does later (a DeviceTensor released, a getter changed), the view stays.
 *
 * @param t A GpuTensor (a live DeviceTensor included).
 * @returns `{ buffer, shape, dtype }`, its own copy of the shape.
 * @example
 * ```ts
 * import { toGpu } from "@deltanet/kda";
 * const t = await toGpu(new Float32Array(4), [4]);
 * const view = bufferView(t);
 * t.release();
 * console.log(view.buffer.size); // 16: the view still names the buffer
 * ```
 */
export function bufferView(t: GpuTensor): GpuTensor {
  return { buffer: t.buffer, shape: [...t.shape], dtype: "f32" };
}

/**
 * Pins every unreleased DeviceTensor among the values (and among the values of each plain object
 * given) for a call: a release() meanwhile hands its buffer back only when the call unpins, after
 * it has queued the work that reads it. Call it before the call's first await.
 *
 * @param values Tensors, or objects holding them (a call's inputs).
 * @returns The unpin, to run once the call's work is queued (or the call has failed); running it
 *   again does nothing.
 * @example
 * ```ts
 * import { toGpu } from "@deltanet/kda";
 * const t = await toGpu(new Float32Array(4), [4]);
 * const unpin = pinTensors([t]);
 * t.release(); // reads as released; its buffer waits for the unpin
 * unpin();
 * ```
 */
export function pinTensors(values: readonly unknown[]): () => void {
  const unpins: (() => void)[] = [];
  const visit = (value: unknown) => {
    if (value instanceof DeviceTensor) {
      if (!value.released) unpins.push(value.pin());
    }
  };
  for (const value of values) {
    if (value instanceof DeviceTensor) visit(value);
    else if (typeof value === "object" && value !== null && !isGpuTensor(value)) {
      for (const inner of Object.values(value)) visit(inner);
    }
  }
  return () => {
    for (const unpin of unpins) unpin();
  };
}

/**
 * Releases every DeviceTensor among the values, and among the values of each plain object or
 * array given (outputs, gradients, uploaded inputs); anything else is skipped.
 *
 * @param values DeviceTensors, or objects and arrays holding them.
 * @example
 * ```ts
 * import { releaseTensors, toGpu } from "@deltanet/kda";
 * const a = await toGpu(new Float32Array(4), [4]);
 * releaseTensors({ a, n: 3 }); // releases a
 * ```
 */
export function releaseTensors(...values: unknown[]): void {
  for (const value of values) {
    if (value instanceof DeviceTensor) value.release();
    else if (typeof value === "object" && value !== null && !isGpuTensor(value)) {
      for (const inner of Object.values(value)) {
        if (inner instanceof DeviceTensor) inner.release();
      }
    }
  }
}

/**
 * Uploads a typed array to the gpu arm's device, as a tensor the calls take in place of the array.
 *
 * @param data The elements, f32.
 * @param shape Their shape (its product must be `data.length`).
 * @returns A DeviceTensor; release it when done.
 * @example
 * ```ts
 * import { toGpu } from "@deltanet/kda";
 * const beta = await toGpu(new Float32Array(8).fill(0.5), [1, 8, 1]);
 * beta.release();
 * ```
 */
export async function toGpu(data: Float32Array, shape: readonly number[]): Promise<DeviceTensor> {
  if (!(data instanceof Float32Array)) {
    throw new TypeError(`data must be a Float32Array: got ${typeName(data)}`);
  }
  if (!Array.isArray(shape) || !shape.every((n) => Number.isSafeInteger(n) && n >= 0)) {
    throw new TypeError(
      `shape must be an array of non-negative integers: got ${
        Array.isArray(shape) ? `[${shape.join(", ")}]` : typeName(shape)
      }`,
    );
  }
  const size = shape.reduce((a, b) => a * b, 1);
  if (size !== data.length) {
    throw new RangeError(
      `data must have ${size} elements for shape [${shape.join(", ")}]: got ${data.length}`,
    );
  }
  const ctx = await getContext();
  const buffer = BufferSet.acquire(ctx.device, "toGpu", data.byteLength);
  upload(ctx.device.queue, buffer, 0, data);
  return new DeviceTensor(ctx, buffer, [...shape]);
}

/**
 * The device the gpu arm runs on, for making {@linkcode GpuTensor}s of one's own.
 *
 * @returns The GPUDevice (a fresh one after a device loss).
 * @throws {Error} When no WebGPU adapter is available (the reason says why).
 * @example
 * ```ts
 * import { gpuDevice } from "@deltanet/kda";
 * const device = await gpuDevice();
 * console.log(device.limits.maxStorageBufferBindingSize);
 * ```
 */
export async function gpuDevice(): Promise<GPUDevice> {
  return (await getContext()).device;
}
