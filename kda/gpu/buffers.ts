// GPU buffer ownership and the live-buffer count, in one place. Every buffer the arm creates
// comes from a BufferSet (or createBuffer) and is counted until it is destroyed; a set destroys
// what it still owns in one call, and hands a buffer over (to a saved handle) by `take`.

import { checkKnownKeys, checkObject, shown } from "../../base/check.ts";

let live = 0;
let createdBytes = 0;

/**
 * Bytes of the GPU buffers the gpu arm has created since the process started (buffers taken from
 * the pool are not counted again): the benchmark's measure of what a call allocates.
 *
 * @returns The bytes.
 * @example
 * ```ts
 * const before = gpuCreatedBytes();
 * // ... one call ...
 * console.log(gpuCreatedBytes() - before); // bytes that call created
 * ```
 */
export function gpuCreatedBytes(): number {
  return createdBytes;
}

/**
 * The number of GPU buffers the gpu arm has created and not yet destroyed, less those the buffer
 * pool keeps (for leak tests: `gpuPool().pooledBuffers` counts those).
 *
 * @returns The live buffer count, including each device's two long-lived placeholder buffers.
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
  // whole vec4s, so that a vec4 view of the buffer reaches its last float
  const size = Math.max(16, Math.ceil(bytes / 16) * 16);
  const buffer = device.createBuffer({ label, size, usage });
  live++;
  createdBytes += size;
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

// ---- the buffer pool ----
//
// A call creates its buffers and frees them when it ends; at (8, 4096, 16, 128) a kdaVjp creates
// gigabytes, and creating them (about 175 ms on the host) and clearing them on first use (on the
// GPU) cost more than the kernels. With the pool, what a call frees is kept, up to a bound, and the
// next call of the same sizes takes it back. It is on by default, bounded by four times the
// device's maxBufferSize (docs/kda.md 3.3: 16 GiB on the H200, a little over a tenth of its
// memory); `gpuPool({ maxBytes })` sets another bound, 0 turns it off and frees what it holds, and
// a lost device's buffers leave it. Reuse is safe because the kernels never read what they did
// not write (the prefillNaN tests hold them to it), one queue orders every call's work, and a
// DeviceTensor a pending call still reads returns to the pool only once that call has submitted
// (pinTensors).

/** The default bound of the pool, as a multiple of the device's maxBufferSize. */
export const POOL_BUFFER_SIZES = 4;

interface Pooled {
  device: GPUDevice;
  buffer: GPUBuffer;
  bytes: number;
  usage: number;
}

const pool: Pooled[] = [];
/** The caller's bound (gpuPool), or null for the default of the device. */
let chosenMaxBytes: number | null = null;
/** The default bound of the current device (POOL_BUFFER_SIZES x maxBufferSize), once one exists. */
let defaultMaxBytes = 0;
let pooledBytes = 0;

/** The bound in force. */
function poolMaxBytes(): number {
  return chosenMaxBytes ?? defaultMaxBytes;
}

/**
 * Sets the pool's default bound from a new device's limits (called when a device is created).
 *
 * @param limits The device's limits.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * setPoolDefault((await getContext()).device.limits);
 * ```
 */
export function setPoolDefault(limits: { maxBufferSize: number }): void {
  defaultMaxBytes = POOL_BUFFER_SIZES * limits.maxBufferSize;
  trimPool(() => pooledBytes > poolMaxBytes());
}

/** What the pool holds and may hold. */
export interface GpuPoolStatus {
  /** The most bytes it keeps (0: off). */
  maxBytes: number;
  /** Whether that bound is the default (POOL_BUFFER_SIZES x the device's maxBufferSize). */
  isDefault: boolean;
  /** Bytes it keeps now. */
  pooledBytes: number;
  /** Buffers it keeps now (they do not count in gpuLiveBuffers). */
  pooledBuffers: number;
}

/**
 * Sets the gpu arm's buffer pool's bound and says what it holds. The pool is on by default,
 * bounded by four times the device's maxBufferSize; each call of a loop of one shape (a training
 * loop) then reuses the previous one's buffers instead of creating and clearing them. A bound of 0
 * turns it off and frees what it holds; `maxBytes: null` restores the default.
 *
 * @param options `maxBytes`: the most bytes kept between calls, or null for the default
 *   (absent: unchanged).
 * @returns The pool's status after the change.
 * @example
 * ```ts
 * import { gpuPool } from "@deltanet/kda";
 * gpuPool({ maxBytes: 2 ** 30 }); // keep at most 1 GiB between calls
 * const off = gpuPool({ maxBytes: 0 }); // free it and keep nothing
 * console.log(off.pooledBytes === 0 && off.maxBytes === 0); // true
 * gpuPool({ maxBytes: null }); // the default again
 * ```
 */
export function gpuPool(options: { maxBytes?: number | null } = {}): GpuPoolStatus {
  // a misspelt maxBytes must not leave the pool as it was without a word
  checkKnownKeys("options", checkObject("options", options), ["maxBytes"]);
  const { maxBytes } = options;
  if (maxBytes !== undefined) {
    if (maxBytes !== null && typeof maxBytes !== "number") {
      throw new TypeError(
        `options.maxBytes must be a non-negative integer or null: got ${shown(maxBytes)}`,
      );
    }
    if (maxBytes !== null && (!Number.isSafeInteger(maxBytes) || maxBytes < 0)) {
      throw new RangeError(
        `options.maxBytes must be a non-negative integer or null: got ${maxBytes}`,
      );
    }
    chosenMaxBytes = maxBytes;
    trimPool(() => pooledBytes > poolMaxBytes());
  }
  return {
    maxBytes: poolMaxBytes(),
    isDefault: chosenMaxBytes === null,
    pooledBytes,
    pooledBuffers: pool.length,
  };
}

/** Destroys pooled buffers, oldest first, while `more()` holds (once the GPU is done with them). */
function trimPool(more: () => boolean): void {
  while (pool.length > 0 && more()) {
    const { device, buffer, bytes } = pool.shift()!;
    pooledBytes -= bytes;
    live++; // back among the live buffers until destroyed
    destroyWhenIdle(device, buffer);
  }
}

// Buffers released while work submitted before may still use them are destroyed when the queue
// has finished that work. WebGPU allows destroying them at once, but with Deno's WebGPU on the
// software adapter, runs that did so (a call on GpuTensors frees its scratch right after its
// submit) sometimes ended in a glibc abort at exit; waiting costs nothing on the calling path.
const retiring = new Set<Promise<void>>();

/** Destroys a buffer once the work submitted so far on its device is done. */
function destroyWhenIdle(device: GPUDevice, buffer: GPUBuffer): void {
  const done = () => {
    destroyBuffer(buffer);
    retiring.delete(retired);
  };
  // should a lost device never report its queue done, its loss settles the wait
  const retired: Promise<void> = Promise.race([device.queue.onSubmittedWorkDone(), device.lost])
    .then(done, done);
  retiring.add(retired);
}

/**
 * Waits until every buffer the gpu arm released while the GPU might still be using it is
 * destroyed (they count in gpuLiveBuffers until then): for leak checks right after calls on
 * GpuTensors. Costs a host sync when any is pending.
 *
 * @returns When none is pending.
 * @example
 * ```ts
 * import { gpuSettled } from "@deltanet/kda";
 * await gpuSettled(); // then gpuDiagnostics().liveBuffers counts only what is held
 * ```
 */
export async function gpuSettled(): Promise<void> {
  while (retiring.size > 0) await Promise.all([...retiring]);
}

/**
 * Forgets the pooled buffers of a device (lost or replaced): they are destroyed.
 *
 * @param device The device.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * dropPooled((await getContext()).device); // nothing pooled: nothing happens
 * ```
 */
export function dropPooled(device: GPUDevice): void {
  for (let i = pool.length - 1; i >= 0; i--) {
    if (pool[i].device !== device) continue;
    pooledBytes -= pool[i].bytes;
    live++;
    destroyBuffer(pool[i].buffer);
    pool.splice(i, 1);
  }
}

/** A pooled buffer of exactly this size and usage on this device, or a new one. */
function acquire(device: GPUDevice, label: string, bytes: number, usage: number): GPUBuffer {
  // one device at a time: what a lost or replaced device left in the pool is of no use
  for (const stale of new Set(pool.filter((p) => p.device !== device).map((p) => p.device))) {
    dropPooled(stale);
  }
  // whole vec4s, so that a vec4 view of the buffer reaches its last float
  const size = Math.max(16, Math.ceil(bytes / 16) * 16);
  const i = pool.findIndex((p) => p.device === device && p.bytes === size && p.usage === usage);
  if (i < 0) return createBuffer(device, label, size, usage);
  const [{ buffer }] = pool.splice(i, 1);
  pooledBytes -= size;
  live++;
  return buffer;
}

/**
 * Gives a buffer back: kept in the pool while it has room, else destroyed (at once, or with
 * `whenIdle` once the GPU has finished the work submitted so far).
 *
 * @param device The device it lives on.
 * @param buffer A buffer from {@linkcode BufferSet.make} or {@linkcode createBuffer}.
 * @param whenIdle Whether work submitted before may still use it.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const { device } = await getContext();
 * recycleBuffer(device, createBuffer(device, "x", 16, STORAGE_USAGE)); // destroyed: pool off
 * ```
 */
export function recycleBuffer(device: GPUDevice, buffer: GPUBuffer, whenIdle = false): void {
  const bytes = buffer.size;
  if (bytes > poolMaxBytes()) {
    if (whenIdle) destroyWhenIdle(device, buffer);
    else destroyBuffer(buffer);
    return;
  }
  pool.push({ device, buffer, bytes, usage: buffer.usage });
  pooledBytes += bytes;
  live--; // the pool's, not a call's
  trimPool(() => pooledBytes > poolMaxBytes());
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
 * const a = set.make("a", 64);
 * set.make("b", 64);
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
   * @param bytes Size in bytes (see bytesOf in layout.ts).
   * @param usage GPUBufferUsage bits (default: STORAGE_USAGE).
   * @returns The buffer.
   */
  make(label: string, bytes: number, usage: number = STORAGE_USAGE): GPUBuffer {
    const buffer = acquire(this.#device, label, bytes, usage);
    this.#owned.push(buffer);
    return buffer;
  }

  /**
   * Whether the set owns a buffer.
   *
   * @param buffer The buffer.
   * @returns True when the set made it and still owns it.
   */
  owns(buffer: GPUBuffer): boolean {
    return this.#owned.includes(buffer);
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

  /**
   * Gives back every buffer the set still owns (to the pool, or destroyed).
   *
   * @param whenIdle Whether submitted work may still use them (destroy them once it is done).
   */
  destroyAll(whenIdle = false): void {
    for (const b of this.#owned) recycleBuffer(this.#device, b, whenIdle);
    this.#owned = [];
  }

  /**
   * A buffer for a caller to own (an output tensor): from the pool, or new.
   *
   * @param device The device.
   * @param label Label.
   * @param bytes Size.
   * @returns The buffer; give it back with {@linkcode recycleBuffer}.
   */
  static acquire(device: GPUDevice, label: string, bytes: number): GPUBuffer {
    return acquire(device, label, bytes, STORAGE_USAGE);
  }
}

/**
 * Queues a typed array into a buffer at an element offset (views of SharedArrayBuffers upload as
 * well).
 *
 * @param queue The device's queue.
 * @param buffer Destination.
 * @param elementOffset Offset in elements of the array's type.
 * @param data The elements.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const ctx = await getContext();
 * const set = new BufferSet(ctx.device);
 * upload(ctx.device.queue, set.make("data", 16), 0, new Float32Array([1, 2, 3, 4]));
 * set.destroyAll();
 * ```
 */
export function upload(
  queue: GPUQueue,
  buffer: GPUBuffer,
  elementOffset: number,
  data: Float32Array,
): void {
  // nothing to write; Deno 2.9.6 panics on a writeBuffer of an empty array (no backing store)
  if (data.length === 0) return;
  queue.writeBuffer(
    buffer,
    elementOffset * data.BYTES_PER_ELEMENT,
    data as Float32Array<ArrayBuffer>,
  );
}

const NAN_BLOCK = new Float32Array(1 << 20).fill(NaN);

/**
 * Fills a buffer of f32 elements with NaN, so that a missing write cannot pass as a zero.
 *
 * @param queue The device's queue.
 * @param buffer Destination.
 * @param elements How many f32 elements.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const ctx = await getContext();
 * const set = new BufferSet(ctx.device);
 * fillNaN(ctx.device.queue, set.make("out", 32), 8);
 * set.destroyAll();
 * ```
 */
export function fillNaN(queue: GPUQueue, buffer: GPUBuffer, elements: number): void {
  for (let at = 0; at < elements; at += NAN_BLOCK.length) {
    const n = Math.min(NAN_BLOCK.length, elements - at);
    queue.writeBuffer(buffer, at * NAN_BLOCK.BYTES_PER_ELEMENT, NAN_BLOCK, 0, n);
  }
}
