// One forward or backward call of any kernel set on device tensors, split into "allocate and
// place" and "run" so that the benchmark can time runs with the inputs already in place. The job
// knows a set only by its declaration (kernel_set.ts): it makes the set's buffers for the call,
// places each input array into its region (a GPU copy) or binds the caller's buffer directly
// where the set's layout lets it, binds every binding, runs the direction's stages through
// encode.ts, and copies each result into the buffer the caller gave for it (or binds that buffer
// directly). Calls from typed arrays upload first and read back after (mod.ts).

import type { ChunkSize, KdaProblem } from "../_types.ts";
import type { CompiledSet, GpuContext } from "./device.ts";
import { GpuError } from "./device.ts";
import { BufferSet, fillNaN, recycleBuffer, UNIFORM_USAGE } from "./buffers.ts";
import {
  bufferElements,
  bytesOf,
  makePlan,
  maxBindingOf,
  packParams,
  paramWords,
  tableOffsets,
} from "./layout.ts";
import {
  type ArrayName,
  type BufferDecl,
  type DirectionDecl,
  IN_ARRAYS,
  type KernelSet,
  type Lifetime,
  type Plan,
  type StageDecl,
} from "./kernel_set.ts";
import {
  type BufferCopy,
  type PassJob,
  type PassResult,
  runPasses,
  type TimingOptions,
} from "./encode.ts";
import type { GpuTensor } from "./tensor.ts";
import { gpuDebug } from "./_debug.ts";

/** The arrays of one call on the device, by the op's names. */
export type JobArrays = Partial<Record<ArrayName, GpuTensor>>;

/** Where one call array lives in a set's buffer: its region's byte offset and size. */
interface ArraySpot {
  decl: BufferDecl;
  offset: number;
  bytes: number;
  /** The region is the whole buffer, so the array's own buffer can be bound in its place. */
  whole: boolean;
}

/** Where every array a set's buffers hold lives, for a plan. */
function arraySpots(set: KernelSet, plan: Plan): Map<ArrayName, ArraySpot> {
  const spots = new Map<ArrayName, ArraySpot>();
  for (const decl of set.buffers) {
    if (decl.arrays === undefined) continue;
    const { offsets } = tableOffsets(decl.table, plan.dims);
    const total = bufferElements(decl, plan);
    for (const [region, name] of Object.entries(decl.arrays)) {
      if (name === undefined) continue;
      const r = decl.table.regions.find((x) => x.name === region);
      if (r === undefined) throw new Error(`internal: ${decl.name} has no region ${region}`);
      const elements = tableOffsets({ prefix: "", regions: [r] }, plan.dims).total;
      spots.set(name, {
        decl,
        offset: bytesOf(offsets[region], decl.dtype),
        bytes: bytesOf(elements, decl.dtype),
        whole: !decl.perChunk && decl.table.regions.length === 1 && elements === total,
      });
    }
  }
  return spots;
}

/**
 * What the backward needs, kept on the GPU (for the fused set: the packed inputs, the per-chunk
 * work and the chunk-start states): nothing is read back until a backward. It stays valid for any
 * number of backward calls, concurrent or not, until {@linkcode GpuSaved.release}.
 *
 * @example
 * ```ts
 * import { gpuForward } from "./mod.ts";
 * const B = 1, T = 8, H = 1, K = 4, V = 4;
 * const { saved } = await gpuForward({
 *   B, T, H, K, V, scale: 0.5,
 *   q: new Float32Array(B * T * H * K).fill(0.1),
 *   k: new Float32Array(B * T * H * K).fill(0.5),
 *   v: new Float32Array(B * T * H * V).fill(1),
 *   g: new Float32Array(B * T * H * K).fill(-0.1),
 *   beta: new Float32Array(B * T * H).fill(0.5),
 * }, { chunkSize: 16, saveForBackward: true });
 * saved!.release(); // no backward after all
 * ```
 */
export interface GpuSaved {
  /**
   * Frees the GPU buffers (once no backward is running on them); calling it twice is harmless.
   *
   * @param whenIdle Whether work already submitted may still use them (they go once it is done).
   */
  release(whenIdle?: boolean): void;
  /** Whether {@linkcode GpuSaved.release} has run. */
  readonly released: boolean;
}

/**
 * The one implementation of GpuSaved.
 *
 * @example
 * ```ts
 * import { gpuForward } from "./mod.ts";
 * const x = {
 *   B: 1, T: 8, H: 1, K: 4, V: 4, scale: 0.5,
 *   q: new Float32Array(32).fill(0.1), k: new Float32Array(32).fill(0.5),
 *   v: new Float32Array(32).fill(1), g: new Float32Array(32).fill(-0.1),
 *   beta: new Float32Array(8).fill(0.5),
 * };
 * const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
 * console.log(saved instanceof SavedState); // true
 * saved!.release();
 * ```
 */
export class SavedState implements GpuSaved {
  #owned: GPUBuffer[];
  #released = false;
  #whenIdle = false;
  #busy = 0;

  /**
   * Takes over the buffers a forward saved.
   *
   * @param ctx The device the buffers live on.
   * @param compiled The kernel set that ran the forward.
   * @param plan The forward's plan.
   * @param scale The query scale.
   * @param flags The forward's flag bits.
   * @param buffers The saved buffers by name (bound by the backward).
   * @param owned Those of them this handle frees.
   */
  constructor(
    readonly ctx: GpuContext,
    readonly compiled: CompiledSet,
    readonly plan: Plan,
    readonly scale: number,
    readonly flags: number,
    readonly buffers: ReadonlyMap<string, GPUBuffer>,
    owned: GPUBuffer[],
  ) {
    this.#owned = owned;
  }

  /** Whether release() has run. */
  get released(): boolean {
    return this.#released;
  }

  /**
   * Frees the buffers now, or when the last running backward ends.
   *
   * @param whenIdle Whether submitted work may still use them (destroy them once it is done).
   */
  release(whenIdle = false): void {
    if (this.#released) return;
    this.#released = true;
    this.#whenIdle = whenIdle;
    if (this.#busy === 0) this.#free();
  }

  /** Marks a backward as using the buffers (release waits for it). */
  acquire(): void {
    this.#busy++;
  }

  /** Ends a backward's use; frees the buffers if release() came meanwhile. */
  unacquire(): void {
    this.#busy--;
    if (this.#busy === 0 && this.#released) this.#free();
  }

  #free(): void {
    for (const b of this.#owned) recycleBuffer(this.ctx.device, b, this.#whenIdle);
    this.#owned = [];
  }
}

/** The buffers one direction of a call binds, and the copies that fill them. */
interface Bound {
  buffers: Map<string, GPUBuffer>;
  copiesIn: BufferCopy[];
}

/**
 * Makes the call's buffers of the given lifetimes (or binds a caller's buffer where a region is a
 * whole buffer), and the copies that place each input array into its region.
 */
function makeBuffers(
  ctx: GpuContext,
  set: KernelSet,
  plan: Plan,
  lifetimes: readonly Lifetime[],
  want: { save: boolean; outputs: boolean },
  scratch: BufferSet,
  arrays: JobArrays,
  targets: JobArrays | undefined,
  bound: Map<string, GPUBuffer>,
): BufferCopy[] {
  const spots = arraySpots(set, plan);
  const copies: BufferCopy[] = [];
  for (const decl of set.buffers) {
    if (!lifetimes.includes(decl.lifetime)) continue;
    if (decl.onlyWhenSaving === true && !want.save) continue;
    if (decl.onlyForOutputs === true && !want.outputs) continue;
    if (decl.when !== undefined && !decl.when(plan)) continue;
    // A buffer that is one whole array binds the caller's buffer: no copy in or out.
    const [only] = Object.values(decl.arrays ?? {});
    const spot = only === undefined ? undefined : spots.get(only);
    if (only !== undefined && spot?.whole === true) {
      const given = IN_ARRAYS.has(only) ? arrays[only] : targets?.[only];
      // a caller's buffer made without STORAGE usage cannot be bound: it is copied instead
      if (given !== undefined && (given.buffer.usage & GPUBufferUsage.STORAGE) !== 0) {
        bound.set(decl.name, given.buffer);
        continue;
      }
    }
    const bytes = bytesOf(bufferElements(decl, plan), decl.dtype);
    const buffer = scratch.make(decl.name, bytes);
    if (decl.init !== undefined) {
      ctx.device.queue.writeBuffer(buffer, 0, decl.init(plan) as Uint32Array<ArrayBuffer>);
    } else if (gpuDebug.prefillNaN && decl.dtype === "f32") {
      fillNaN(ctx.device.queue, buffer, bufferElements(decl, plan));
    }
    bound.set(decl.name, buffer);
    for (const name of Object.values(decl.arrays ?? {})) {
      if (name === undefined || !IN_ARRAYS.has(name)) continue;
      const data = arrays[name];
      if (data === undefined) continue;
      const s = spots.get(name)!;
      copies.push({
        source: data.buffer,
        sourceOffset: 0,
        target: buffer,
        targetOffset: s.offset,
        bytes: s.bytes,
      });
    }
  }
  return copies;
}

/** The copies of each result into the caller's buffer (none where it was bound directly). */
function copiesOut(
  set: KernelSet,
  plan: Plan,
  buffers: ReadonlyMap<string, GPUBuffer>,
  targets: JobArrays,
): BufferCopy[] {
  const spots = arraySpots(set, plan);
  const copies: BufferCopy[] = [];
  for (const [name, target] of Object.entries(targets) as [ArrayName, GpuTensor][]) {
    const spot = spots.get(name);
    if (spot === undefined) throw new Error(`internal: ${set.name} holds no array ${name}`);
    const source = buffers.get(spot.decl.name)!;
    if (source === target.buffer) continue;
    copies.push({
      source,
      sourceOffset: spot.offset,
      target: target.buffer,
      targetOffset: 0,
      bytes: spot.bytes,
    });
  }
  return copies;
}

/** Group 0 of each stage of a direction: the params, then each binding the stage uses. */
function bindGroupsOf(
  ctx: GpuContext,
  compiled: CompiledSet,
  direction: DirectionDecl,
  buffers: ReadonlyMap<string, GPUBuffer>,
  params: GPUBuffer,
  label: string,
): Map<StageDecl, GPUBindGroup> {
  const groups = new Map<StageDecl, GPUBindGroup>();
  for (const stage of direction.stages) {
    const uses = stage.uses;
    groups.set(
      stage,
      ctx.device.createBindGroup({
        label: `${label} ${stage.entry}`,
        layout: compiled.layouts.get(stage)!,
        entries: [
          { binding: 0, resource: { buffer: params } },
          ...compiled.set.bindings.flatMap((b, i) => {
            if (uses !== undefined && !uses.includes(b.name)) return [];
            const name = direction.bind[b.name];
            const buffer = name === undefined ? undefined : buffers.get(name);
            const placeholder = b.type === "storage" ? ctx.placeholder : ctx.readPlaceholder;
            return [{ binding: i + 1, resource: { buffer: buffer ?? placeholder } }];
          }),
        ],
      }),
    );
  }
  return groups;
}

/** The flags of a call: the set's standard flag bits, and those its plan sets. */
function flagsOf(
  set: KernelSet,
  plan: Plan,
  has: { h0: boolean; dht: boolean; save: boolean },
): number {
  return (has.h0 ? set.flags.HAS_H0 : 0) | (has.dht ? set.flags.HAS_DHT : 0) |
    (has.save ? set.flags.SAVE_STATES : 0) | (set.planFlags?.(plan) ?? 0);
}

function paramsBuffer(
  ctx: GpuContext,
  scratch: BufferSet,
  set: KernelSet,
  plan: Plan,
  flags: number,
  scale: number,
): GPUBuffer {
  const params = scratch.make(
    "params",
    paramWords(set) * Uint32Array.BYTES_PER_ELEMENT,
    UNIFORM_USAGE,
  );
  ctx.device.queue.writeBuffer(params, 0, packParams(set, plan, flags, scale));
  return params;
}

/**
 * What a run of a job gets besides its buffers: the glue passes around its stages, the host
 * readbacks of its submit and their arrays, as runPasses takes them (encode.ts's PassJob).
 */
export interface RunOptions extends Partial<Pick<PassJob, "before" | "after" | "reads" | "into">> {
  /** Time each stage on the GPU (the benchmark; options to repeat without reading back). */
  timing?: boolean | TimingOptions;
}

/** The parts of a job's submit that its run's options give. */
function runParts({ before = [], after = [], reads = [], into }: RunOptions) {
  return { before, after, reads, ...(into !== undefined ? { into } : {}) };
}

/**
 * A forward of one kernel set on device tensors: run it any number of times, then destroy it.
 *
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * import { kernelSet } from "./kernel_set.ts";
 * import { toGpu } from "./tensor.ts";
 * import "./kernels/mod.ts";
 * const up = (n: number, v: number, shape: number[]) => toGpu(new Float32Array(n).fill(v), shape);
 * const x = {
 *   B: 1, T: 8, H: 1, K: 4, V: 4, scale: 0.5,
 *   q: await up(32, 0.1, [1, 8, 1, 4]), k: await up(32, 0.5, [1, 8, 1, 4]),
 *   v: await up(32, 1, [1, 8, 1, 4]), g: await up(32, -0.1, [1, 8, 1, 4]),
 *   beta: await up(8, 0.5, [1, 8, 1]),
 * };
 * const job = await ForwardJob.create(await getContext(), kernelSet("fused"), x, { chunkSize: 16 });
 * await job.run(); // may run again, e.g. for timing
 * job.destroy();
 * for (const t of [x.q, x.k, x.v, x.g, x.beta]) t.release();
 * ```
 */
export class ForwardJob {
  #scratch: BufferSet;
  #buffers: Map<string, GPUBuffer>;
  #copiesIn: BufferCopy[];
  #bindGroups: Map<StageDecl, GPUBindGroup>;
  #targets: JobArrays;
  #direction: DirectionDecl;

  private constructor(
    readonly ctx: GpuContext,
    readonly compiled: CompiledSet,
    readonly plan: Plan,
    readonly scale: number,
    readonly flags: number,
    parts: {
      scratch: BufferSet;
      bound: Bound;
      bindGroups: Map<StageDecl, GPUBindGroup>;
      targets: JobArrays;
      direction: DirectionDecl;
    },
  ) {
    this.#scratch = parts.scratch;
    this.#buffers = parts.bound.buffers;
    this.#copiesIn = parts.bound.copiesIn;
    this.#bindGroups = parts.bindGroups;
    this.#targets = parts.targets;
    this.#direction = parts.direction;
  }

  /**
   * Makes the call's buffers and the copies that place its inputs (arguments already checked).
   *
   * @param ctx The device context.
   * @param set The kernel set (its device problem already ruled out).
   * @param x The problem in the set's view (no grouped heads or packing it does not take), with
   *   GpuTensor arrays.
   * @param options chunkSize, saveForBackward, and the buffers for `o` and `ht` (results stay in
   *   the job's own buffers without them); `outputs: false` for a forward run only for its
   *   backward, which then leaves out the stages that compute nothing but the outputs.
   * @returns The job.
   */
  static async create(
    ctx: GpuContext,
    set: KernelSet,
    x: KdaProblem<GpuTensor>,
    options: {
      chunkSize: ChunkSize;
      saveForBackward?: boolean;
      targets?: JobArrays;
      outputs?: boolean;
    },
  ): Promise<ForwardJob> {
    const compiled = await ctx.compiled(set);
    const plan = makePlan(set, x, options.chunkSize, maxBindingOf(ctx.info.limits));
    const save = options.saveForBackward === true;
    const outputs = options.outputs !== false;
    const direction: DirectionDecl = {
      ...set.forward,
      stages: set.forward.stages.filter((stage) => outputs || stage.onlyOutputs !== true),
    };
    const flags = flagsOf(set, plan, { h0: x.h0 !== undefined, dht: false, save });
    const scratch = new BufferSet(ctx.device);
    const targets = options.targets ?? {};
    try {
      const made = await ctx.scoped("gpuForward (allocation and placement)", () => {
        const params = paramsBuffer(ctx, scratch, set, plan, flags, x.scale);
        const buffers = new Map<string, GPUBuffer>();
        const arrays: JobArrays = { q: x.q, k: x.k, v: x.v, g: x.g, beta: x.beta, h0: x.h0 };
        const copiesIn = makeBuffers(
          ctx,
          set,
          plan,
          ["forward", "saved"],
          { save, outputs },
          scratch,
          arrays,
          targets,
          buffers,
        );
        const bindGroups = bindGroupsOf(ctx, compiled, direction, buffers, params, "kda forward");
        return { bound: { buffers, copiesIn }, bindGroups, direction };
      });
      return new ForwardJob(ctx, compiled, plan, x.scale, flags, { scratch, targets, ...made });
    } catch (error) {
      scratch.destroyAll();
      throw error;
    }
  }

  /** The job's buffer of a set's buffer name (the benchmark reads the results from here). */
  buffer(name: string): GPUBuffer | undefined {
    return this.#buffers.get(name);
  }

  /**
   * Runs the forward: one submit; results go to the targets given at creation.
   *
   * @param options Timing, glue passes, and host readbacks to add to the submit.
   * @returns What was read back, and the stage times.
   */
  run(options: RunOptions = {}): Promise<PassResult> {
    const { set } = this.compiled;
    return runPasses(this.ctx, this.#scratch, {
      what: "gpuForward",
      compiled: this.compiled,
      plan: this.plan,
      direction: this.#direction,
      reverse: false,
      bindGroups: this.#bindGroups,
      copiesIn: this.#copiesIn,
      copiesOut: copiesOut(set, this.plan, this.#buffers, this.#targets),
      ...runParts(options),
    }, options.timing ?? false);
  }

  /**
   * Hands the saved buffers to a new handle (after a successful run with saveForBackward).
   *
   * @returns The handle; the job no longer owns those buffers.
   */
  takeSaved(): SavedState {
    const { set } = this.compiled;
    if ((this.flags & set.flags.SAVE_STATES) === 0) {
      throw new Error("The forward ran without saveForBackward: nothing to save");
    }
    const saved = new Map<string, GPUBuffer>();
    const owned: GPUBuffer[] = [];
    for (const decl of set.buffers) {
      if (decl.lifetime !== "saved") continue;
      const buffer = this.#buffers.get(decl.name);
      if (buffer === undefined) continue;
      saved.set(decl.name, buffer);
      if (this.#scratch.owns(buffer)) owned.push(buffer);
    }
    this.#scratch.take(owned);
    return new SavedState(this.ctx, this.compiled, this.plan, this.scale, this.flags, saved, owned);
  }

  /**
   * Destroys every buffer the job still owns.
   *
   * @param whenIdle Whether submitted work may still use them (destroy them once it is done).
   */
  destroy(whenIdle = false): void {
    this.#scratch.destroyAll(whenIdle);
  }
}

/**
 * A backward on a saved forward, with its own cotangent and scratch buffers.
 *
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * import { kernelSet } from "./kernel_set.ts";
 * import { releaseTensors, toGpu } from "./tensor.ts";
 * import "./kernels/mod.ts";
 * const up = (n: number, v: number, shape: number[]) => toGpu(new Float32Array(n).fill(v), shape);
 * const x = {
 *   B: 1, T: 8, H: 1, K: 4, V: 4, scale: 0.5,
 *   q: await up(32, 0.1, [1, 8, 1, 4]), k: await up(32, 0.5, [1, 8, 1, 4]),
 *   v: await up(32, 1, [1, 8, 1, 4]), g: await up(32, -0.1, [1, 8, 1, 4]),
 *   beta: await up(8, 0.5, [1, 8, 1]),
 * };
 * const set = kernelSet("fused");
 * const fjob = await ForwardJob.create(await getContext(), set, x, {
 *   chunkSize: 16,
 *   saveForBackward: true,
 * });
 * await fjob.run();
 * const saved = fjob.takeSaved();
 * fjob.destroy();
 * const dout = await up(32, 1, [1, 8, 1, 4]);
 * const bjob = await BackwardJob.create(saved, { dout });
 * await bjob.run();
 * bjob.destroy();
 * saved.release();
 * releaseTensors(x, dout);
 * ```
 */
export class BackwardJob {
  #scratch: BufferSet;
  #buffers: Map<string, GPUBuffer>;
  #copiesIn: BufferCopy[];
  #bindGroups: Map<StageDecl, GPUBindGroup>;
  #targets: JobArrays;

  private constructor(
    readonly saved: SavedState,
    parts: {
      scratch: BufferSet;
      bound: Bound;
      bindGroups: Map<StageDecl, GPUBindGroup>;
      targets: JobArrays;
    },
  ) {
    this.#scratch = parts.scratch;
    this.#buffers = parts.bound.buffers;
    this.#copiesIn = parts.bound.copiesIn;
    this.#bindGroups = parts.bindGroups;
    this.#targets = parts.targets;
  }

  /**
   * Makes the call's buffers and places its cotangents (arguments already checked). The caller
   * holds `saved` (acquire) for the job's life.
   *
   * @param saved The forward's saved state.
   * @param cotangents `dout` and optional `dht` (absent: zero) on the device.
   * @param targets Buffers for the gradients (they stay in the job's own buffers without them).
   * @returns The job.
   */
  static async create(
    saved: SavedState,
    cotangents: { dout: GpuTensor; dht?: GpuTensor },
    targets: JobArrays = {},
  ): Promise<BackwardJob> {
    const { ctx, compiled, plan } = saved;
    const { set } = compiled;
    if (set.backward === null) {
      throw new Error(`internal: the kernel set ${set.name} has no backward`);
    }
    const backward = set.backward;
    const flags = saved.flags | (cotangents.dht !== undefined ? set.flags.HAS_DHT : 0);
    const scratch = new BufferSet(ctx.device);
    try {
      const made = await ctx.scoped("gpuBackward (allocation and placement)", () => {
        const params = paramsBuffer(ctx, scratch, set, plan, flags, saved.scale);
        const buffers = new Map<string, GPUBuffer>(saved.buffers);
        const arrays: JobArrays = { dout: cotangents.dout, dht: cotangents.dht };
        const copiesIn = makeBuffers(
          ctx,
          set,
          plan,
          ["backward"],
          { save: true, outputs: false },
          scratch,
          arrays,
          targets,
          buffers,
        );
        const bindGroups = bindGroupsOf(ctx, compiled, backward, buffers, params, "kda backward");
        return { bound: { buffers, copiesIn }, bindGroups };
      });
      return new BackwardJob(saved, { scratch, targets, ...made });
    } catch (error) {
      scratch.destroyAll();
      throw error;
    }
  }

  /** The job's buffer of a set's buffer name (the benchmark reads the results from here). */
  buffer(name: string): GPUBuffer | undefined {
    return this.#buffers.get(name);
  }

  /**
   * Runs the backward: one submit; gradients go to the targets given at creation.
   *
   * @param options Timing, glue passes, and host readbacks to add to the submit.
   * @returns What was read back, and the stage times.
   */
  run(options: RunOptions = {}): Promise<PassResult> {
    const { ctx, compiled, plan } = this.saved;
    return runPasses(ctx, this.#scratch, {
      what: "gpuBackward",
      compiled,
      plan,
      direction: compiled.set.backward!,
      reverse: true,
      bindGroups: this.#bindGroups,
      copiesIn: this.#copiesIn,
      copiesOut: copiesOut(compiled.set, plan, this.#buffers, this.#targets),
      ...runParts(options),
    }, options.timing ?? false);
  }

  /**
   * Destroys the job's own buffers (never the saved ones).
   *
   * @param whenIdle Whether submitted work may still use them (destroy them once it is done).
   */
  destroy(whenIdle = false): void {
    this.#scratch.destroyAll(whenIdle);
  }
}

/**
 * Throws unless `saved` can run a backward now.
 *
 * @param saved The handle.
 * @param current The current context.
 * @example
 * ```ts
 * import { gpuForward } from "./mod.ts";
 * import { getContext } from "./device.ts";
 * const x = {
 *   B: 1, T: 8, H: 1, K: 4, V: 4, scale: 0.5,
 *   q: new Float32Array(32).fill(0.1), k: new Float32Array(32).fill(0.5),
 *   v: new Float32Array(32).fill(1), g: new Float32Array(32).fill(-0.1),
 *   beta: new Float32Array(8).fill(0.5),
 * };
 * const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
 * saved!.release();
 * try {
 *   assertUsable(saved as SavedState, await getContext());
 * } catch (e) {
 *   console.log((e as Error).message); // "... the tape that recorded the forward was disposed ..."
 * }
 * ```
 */
export function assertUsable(saved: SavedState, current: GpuContext): void {
  if (saved.released) {
    throw new Error(
      "Cannot run the gpu backward: the tape that recorded the forward was disposed " +
        "(its saved GPU state was released)",
    );
  }
  if (saved.ctx !== current || saved.ctx.lostReason !== null) {
    throw new GpuError(
      "device-lost",
      "Cannot run the gpu backward: the device that ran the forward was lost " +
        `(${saved.ctx.lostReason ?? "replaced by a fresh device"}); run the forward again`,
    );
  }
}
