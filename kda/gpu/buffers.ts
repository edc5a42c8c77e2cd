// GPU buffer ownership and the live-buffer count, in one place. Every buffer the arm creates
// comes from a BufferSet (or createBuffer) and is counted until it is destroyed; a set destroys
// what it still owns in one call, and hands a buffer over (to a saved handle) by `take`.

let live = 0;

/**
 * The number of GPU buffers the gpu arm has created and not yet destroyed (for leak tests).
 *
 * @returns The live buffer count, including each device's one long-lived placeholder buffer.
 *
 * @example
 * ```ts
 * const before = gpuLiveBuffers();
 * // ... forward and backward calls, each saved handle released ...
 * console.log(gpuLiveBuffers() === before);
 * ```
 */
export function gpuLiveBuffers(): number {
  return live;
}

/**
 * Creates one counted buffer (its size rounded up to 4 bytes, at least 16).
 *
 * @param device The device.
 * @param label A label for GPU error messages.
 * @param bytes The size wanted.
 * @param usage GPUBufferUsage bits.
 * @returns The buffer; pass it to {@linkcode destroyBuffer} exactly once.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const ctx = await getContext();
 * const buffer = createBuffer(ctx.device, "scratch", 64, GPUBufferUsage.STORAGE);
 * destroyBuffer(buffer);
 * ```
 */
export function createBuffer(
  device: GPUDevice,
  label: string,
  bytes: number,
  usage: number,
): GPUBuffer {
  const buffer = device.createBuffer({
    label,
    size: Math.max(16, Math.ceil(bytes / 4) * 4),
    usage,
  });
  live++;
  return buffer;
}

/**
 * Destroys one counted buffer.
 *
 * @param buffer A buffer from {@linkcode createBuffer}.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const before = gpuLiveBuffers();
 * destroyBuffer(createBuffer((await getContext()).device, "x", 16, GPUBufferUsage.STORAGE));
 * console.log(gpuLiveBuffers() === before); // true
 * ```
 */
export function destroyBuffer(buffer: GPUBuffer): void {
  buffer.destroy();
  live--;
}

/** Storage usage of every kernel buffer (writable from the queue, copyable out). */
export const STORAGE_USAGE: number = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST |
  GPUBufferUsage.COPY_SRC;
/** Usage of uniform buffers. */
export const UNIFORM_USAGE: number = GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST;

/**
 * The buffers of one call: created together, destroyed together unless taken.
 *
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const set = new BufferSet((await getContext()).device);
 * const a = set.make("a", 16);
 * set.make("b", 16);
 * set.take([a]); // a is the caller's now
 * set.destroyAll(); // destroys b
 * destroyBuffer(a);
 * ```
 */
export class BufferSet {
  #device: GPUDevice;
  #owned: GPUBuffer[] = [];

  /**
   * An empty set.
   *
   * @param device The device every buffer of the set lives on.
   */
  constructor(device: GPUDevice) {
    this.#device = device;
  }

  /**
   * Creates a buffer owned by this set.
   *
   * @param label Label.
   * @param floats Size in 32-bit words.
   * @param usage GPUBufferUsage bits (default: STORAGE_USAGE).
   * @returns The buffer.
   */
  make(label: string, floats: number, usage: number = STORAGE_USAGE): GPUBuffer {
    const buffer = createBuffer(this.#device, label, floats * 4, usage);
    this.#owned.push(buffer);
    return buffer;
  }

  /**
   * Hands buffers over to a new owner: this set no longer destroys them.
   *
   * @param buffers Buffers of this set.
   * @returns The same buffers.
   */
  take(buffers: GPUBuffer[]): GPUBuffer[] {
    for (const b of buffers) {
      const i = this.#owned.indexOf(b);
      if (i < 0) throw new Error(`Buffer ${b.label} is not owned by this set`);
      this.#owned.splice(i, 1);
    }
    return buffers;
  }

  /** Destroys every buffer the set still owns. */
  destroyAll(): void {
    for (const b of this.#owned) destroyBuffer(b);
    this.#owned = [];
  }
}

/**
 * Queues a typed array into a buffer (views of SharedArrayBuffers upload as well).
 *
 * @param queue The device's queue.
 * @param buffer Destination.
 * @param floatOffset Offset in floats.
 * @param data The floats.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const ctx = await getContext();
 * const set = new BufferSet(ctx.device);
 * upload(ctx.device.queue, set.make("data", 4), 0, new Float32Array([1, 2, 3, 4]));
 * set.destroyAll();
 * ```
 */
export function upload(
  queue: GPUQueue,
  buffer: GPUBuffer,
  floatOffset: number,
  data: Float32Array,
): void {
  queue.writeBuffer(buffer, floatOffset * 4, data as Float32Array<ArrayBuffer>);
}

const NAN_BLOCK = new Float32Array(1 << 20).fill(NaN);

/**
 * Fills a buffer's first floats with NaN, so that a missing write cannot pass as a zero.
 *
 * @param queue The device's queue.
 * @param buffer Destination.
 * @param floats How many floats.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const ctx = await getContext();
 * const set = new BufferSet(ctx.device);
 * fillNaN(ctx.device.queue, set.make("out", 8), 8);
 * set.destroyAll();
 * ```
 */
export function fillNaN(queue: GPUQueue, buffer: GPUBuffer, floats: number): void {
  for (let at = 0; at < floats; at += NAN_BLOCK.length) {
    const n = Math.min(NAN_BLOCK.length, floats - at);
    queue.writeBuffer(buffer, at * 4, NAN_BLOCK, 0, n);
  }
}
