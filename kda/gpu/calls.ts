// One forward or backward call on the GPU, split into "allocate and upload" and "run" so that
// the benchmark can time runs with the inputs already on the GPU. gpuForward and gpuBackward
// (mod.ts) create a job, run it once and destroy it.

import type { ChunkSize, KdaProblem } from "../_types.ts";
import type { GpuContext } from "./device.ts";
import { GpuError } from "./device.ts";
import { BufferSet, fillNaN, recycleBuffer, UNIFORM_USAGE, upload } from "./buffers.ts";
import {
  BACKWARD_STAGES,
  type BindingName,
  BINDINGS,
  COTANGENTS,
  FLAGS,
  FORWARD_STAGES,
  GRADS,
  INPUTS,
  makePlan,
  OUTPUTS,
  packParams,
  PARAM_WORDS,
  type Plan,
  type RegionTable,
  sizeOf,
  tableOffsets,
} from "./layout.ts";
import { type BufferCopy, type PassResult, runPasses, type TimingOptions } from "./passes.ts";
import { type GpuTensor, isGpuTensor } from "./tensor.ts";

/** An array a job reads: on the host (uploaded at creation) or on the device (copied per run). */
export type JobArray = Float32Array | GpuTensor;

/**
 * Queues each array into its region of `target` (laid out by `table`): a host array now, a device
 * tensor as a copy that each run encodes before its passes (returned). Absent arrays are skipped.
 */
function place(
  queue: GPUQueue,
  target: GPUBuffer,
  table: RegionTable,
  plan: Plan,
  arrays: readonly (readonly [region: string, data: JobArray | undefined])[],
): BufferCopy[] {
  const { offsets } = tableOffsets(table, plan.dims);
  const copies: BufferCopy[] = [];
  for (const [region, data] of arrays) {
    if (data === undefined) continue;
    if (isGpuTensor(data)) {
      const floats = sizeOf(table.regions.find((r) => r.name === region)!.size, plan.dims);
      copies.push({
        source: data.buffer,
        target,
        targetOffset: offsets[region] * 4,
        bytes: floats * 4,
      });
    } else {
      upload(queue, target, offsets[region], data);
    }
  }
  return copies;
}

/**
 * What the backward needs, kept on the GPU (the packed inputs, the per-chunk work and the
 * chunk-start states): nothing is read back until gpuBackward. It stays valid for any number of
 * backward calls, concurrent or not, until {@linkcode GpuSaved.release}.
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
  /** Frees the GPU buffers (once no backward is running on them); calling it twice is harmless. */
  release(): void;
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
  #buffers: GPUBuffer[];
  #released = false;
  #whenIdle = false;
  #busy = 0;

  /**
   * Takes over the buffers a forward saved.
   *
   * @param ctx The device the buffers live on.
   * @param plan The forward's plan.
   * @param scale The query scale.
   * @param flags The forward's flag bits.
   * @param buffers inputs, work, states.
   */
  constructor(
    readonly ctx: GpuContext,
    readonly plan: Plan,
    readonly scale: number,
    readonly flags: number,
    readonly buffers: { inputs: GPUBuffer; work: GPUBuffer; states: GPUBuffer },
  ) {
    this.#buffers = [buffers.inputs, buffers.work, buffers.states];
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
    for (const b of this.#buffers) recycleBuffer(this.ctx.device, b, this.#whenIdle);
    this.#buffers = [];
  }
}

/** A job's own buffers: all it owns, its bind group, what it reads back, and its device copies. */
interface JobBuffers {
  set: BufferSet;
  bindGroup: GPUBindGroup;
  source: GPUBuffer;
  copiesIn: BufferCopy[];
}

/** [offset, length] of every region of a table, in order. */
function splitOf(table: RegionTable, plan: Plan): [number, number][] {
  const { offsets } = tableOffsets(table, plan.dims);
  return table.regions.map((r) => [offsets[r.name], sizeOf(r.size, plan.dims)]);
}

function bindAll(
  ctx: GpuContext,
  label: string,
  buffers: Partial<Record<BindingName, GPUBuffer>>,
): GPUBindGroup {
  return ctx.device.createBindGroup({
    label,
    layout: ctx.layout,
    entries: BINDINGS.map((b, binding) => ({
      binding,
      resource: { buffer: buffers[b.name] ?? ctx.placeholder },
    })),
  });
}

/**
 * A forward whose inputs are on the GPU: run it any number of times, then destroy it.
 *
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const x = {
 *   B: 1, T: 8, H: 1, K: 4, V: 4, scale: 0.5,
 *   q: new Float32Array(32).fill(0.1), k: new Float32Array(32).fill(0.5),
 *   v: new Float32Array(32).fill(1), g: new Float32Array(32).fill(-0.1),
 *   beta: new Float32Array(8).fill(0.5),
 * };
 * const job = await ForwardJob.create(await getContext(), x, { chunkSize: 16 });
 * try {
 *   const { o } = await job.run(); // may run again, e.g. for timing
 *   console.log(o.length); // 32
 * } finally {
 *   job.destroy();
 * }
 * ```
 */
export class ForwardJob {
  #job: JobBuffers;
  #kept: { inputs: GPUBuffer; work: GPUBuffer; states: GPUBuffer };

  private constructor(
    readonly ctx: GpuContext,
    readonly plan: Plan,
    readonly scale: number,
    readonly flags: number,
    job: JobBuffers,
    kept: { inputs: GPUBuffer; work: GPUBuffer; states: GPUBuffer },
  ) {
    this.#job = job;
    this.#kept = kept;
  }

  /**
   * Allocates the call's buffers and uploads its host inputs; device inputs are copied on the
   * GPU at each run (arguments already checked).
   *
   * @param ctx The device context.
   * @param x The problem, with Float32Array or GpuTensor arrays.
   * @param options chunkSize, saveForBackward, prefillNaN.
   * @returns The job.
   */
  static async create(
    ctx: GpuContext,
    x: KdaProblem<JobArray>,
    options: { chunkSize: ChunkSize; saveForBackward?: boolean; prefillNaN?: boolean },
  ): Promise<ForwardJob> {
    const plan = makePlan(x, options.chunkSize);
    const save = options.saveForBackward === true;
    const withH0 = x.h0 !== undefined;
    const flags = (withH0 ? FLAGS.HAS_H0 : 0) | (save ? FLAGS.SAVE_STATES : 0);
    const set = new BufferSet(ctx.device);
    try {
      const made = await ctx.scoped("gpuForward (allocation and upload)", () => {
        const f = plan.floats;
        const inputFloats = withH0 ? f.inputsWithH0 : f.inputs;
        const inputs = set.make("inputs", inputFloats);
        const work = set.make("work", f.work);
        const states = save ? set.make("states", f.states) : ctx.placeholder;
        const out = set.make("o | ht", f.outputs);
        const params = set.make("params", PARAM_WORDS, UNIFORM_USAGE);
        const queue = ctx.device.queue;
        queue.writeBuffer(params, 0, packParams(plan, flags, x.scale));
        if (options.prefillNaN === true) {
          fillNaN(queue, inputs, inputFloats);
          fillNaN(queue, work, f.work);
          if (save) fillNaN(queue, states, f.states);
          fillNaN(queue, out, f.outputs);
        }
        const copies = place(queue, inputs, INPUTS, plan, [
          ["Q", x.q],
          ["K", x.k],
          ["V", x.v],
          ["G", x.g],
          ["Beta", x.beta],
          ["H0", x.h0],
        ]);
        const bindGroup = bindAll(ctx, "kda forward", {
          p: params,
          x: inputs,
          work,
          states,
          outp: out,
          // read-only like x (a writable placeholder there would conflict with states, bw, gs)
          cot: inputs,
        });
        return { inputs, work, states, out, bindGroup, copies };
      });
      const { inputs, work, states, out, bindGroup, copies } = made;
      return new ForwardJob(
        ctx,
        plan,
        x.scale,
        flags,
        { set, bindGroup, source: out, copiesIn: copies },
        { inputs, work, states },
      );
    } catch (error) {
      set.destroyAll();
      throw error;
    }
  }

  /**
   * Runs the forward: one submit, and one readback unless `targets` keep the results on the GPU.
   *
   * @param timing Whether to time each stage on the GPU (options: repeat, without readback).
   * @param targets Buffers for `o` and `ht` on the device: then nothing is read back.
   * @returns `o` and `ht`, each with its own ArrayBuffer (empty without readback), and the stage
   *   times.
   */
  async run(
    timing: boolean | TimingOptions = false,
    targets?: readonly GPUBuffer[],
  ): Promise<{ o: Float32Array; ht: Float32Array; stageNs?: number[] }> {
    const { plan } = this;
    const { set, ...buffers } = this.#job;
    const result: PassResult = await runPasses(this.ctx, set, {
      what: "gpuForward",
      plan,
      ...buffers,
      stages: FORWARD_STAGES,
      reverse: false,
      floats: plan.floats.outputs,
      split: splitOf(OUTPUTS, plan),
      ...(targets !== undefined ? { targets } : {}),
    }, timing);
    const [o = new Float32Array(0), ht = new Float32Array(0)] = result.arrays;
    return {
      o,
      ht,
      ...(result.stageNs !== undefined ? { stageNs: result.stageNs } : {}),
    };
  }

  /**
   * Hands the saved buffers to a new handle (after a successful run with saveForBackward).
   *
   * @returns The handle; the job no longer owns those buffers.
   */
  takeSaved(): SavedState {
    if ((this.flags & FLAGS.SAVE_STATES) === 0) {
      throw new Error("The forward ran without saveForBackward: nothing to save");
    }
    const { inputs, work, states } = this.#kept;
    this.#job.set.take([inputs, work, states]);
    return new SavedState(this.ctx, this.plan, this.scale, this.flags, this.#kept);
  }

  /**
   * Destroys every buffer the job still owns.
   *
   * @param whenIdle Whether submitted work may still use them (destroy them once it is done).
   */
  destroy(whenIdle = false): void {
    this.#job.set.destroyAll(whenIdle);
  }
}

/**
 * A backward on a saved forward, with its own cotangent and scratch buffers.
 *
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const x = {
 *   B: 1, T: 8, H: 1, K: 4, V: 4, scale: 0.5,
 *   q: new Float32Array(32).fill(0.1), k: new Float32Array(32).fill(0.5),
 *   v: new Float32Array(32).fill(1), g: new Float32Array(32).fill(-0.1),
 *   beta: new Float32Array(8).fill(0.5),
 * };
 * const fjob = await ForwardJob.create(await getContext(), x, { chunkSize: 16, saveForBackward: true });
 * await fjob.run();
 * const saved = fjob.takeSaved();
 * fjob.destroy();
 * const bjob = await BackwardJob.create(saved, new Float32Array(32).fill(1), undefined, false);
 * const [dq] = (await bjob.run()).arrays;
 * bjob.destroy();
 * saved.release();
 * console.log(dq.length); // 32
 * ```
 */
export class BackwardJob {
  #job: JobBuffers;

  private constructor(readonly saved: SavedState, job: JobBuffers) {
    this.#job = job;
  }

  /**
   * Allocates the call's buffers and uploads its cotangents (arguments already checked). The
   * caller holds `saved` (acquire) for the job's life.
   *
   * @param saved The forward's saved state.
   * @param dout Cotangent of o.
   * @param dht Cotangent of ht, or undefined for zero.
   * @param prefillNaN Whether to fill outputs and scratch with NaN first.
   * @returns The job.
   */
  static async create(
    saved: SavedState,
    dout: JobArray,
    dht: JobArray | undefined,
    prefillNaN: boolean,
  ): Promise<BackwardJob> {
    const { ctx, plan } = saved;
    const flags = saved.flags | (dht !== undefined ? FLAGS.HAS_DHT : 0);
    const set = new BufferSet(ctx.device);
    try {
      const made = await ctx.scoped("gpuBackward (allocation and upload)", () => {
        const f = plan.floats;
        const cot = set.make("cotangents", f.cotangents);
        const bw = set.make("backward scratch", f.bw);
        const gs = set.make("gradient scratch", f.gs);
        const grads = set.make("gradients", f.grads);
        const params = set.make("params", PARAM_WORDS, UNIFORM_USAGE);
        const queue = ctx.device.queue;
        queue.writeBuffer(params, 0, packParams(plan, flags, saved.scale));
        if (prefillNaN) {
          fillNaN(queue, cot, f.cotangents);
          fillNaN(queue, bw, f.bw);
          fillNaN(queue, gs, f.gs);
          fillNaN(queue, grads, f.grads);
        }
        const copies = place(queue, cot, COTANGENTS, plan, [["Dout", dout], ["Dht", dht]]);
        const bindGroup = bindAll(ctx, "kda backward", {
          p: params,
          x: saved.buffers.inputs,
          work: saved.buffers.work,
          states: saved.buffers.states,
          outp: grads,
          bw,
          gs,
          cot,
        });
        return { bindGroup, grads, copies };
      });
      return new BackwardJob(saved, {
        set,
        bindGroup: made.bindGroup,
        source: made.grads,
        copiesIn: made.copies,
      });
    } catch (error) {
      set.destroyAll();
      throw error;
    }
  }

  /**
   * Runs the backward: one submit, and one readback unless `targets` keep the gradients on the
   * GPU.
   *
   * @param timing Whether to time each stage on the GPU.
   * @param targets Buffers for dq, dk, dv, dg, dbeta, dh0 on the device: then nothing is read back.
   * @returns The gradients dq, dk, dv, dg, dbeta, dh0 (in that order; none with `targets`), and
   *   the stage times.
   */
  run(
    timing: boolean | TimingOptions = false,
    targets?: readonly GPUBuffer[],
  ): Promise<PassResult> {
    const { plan, ctx } = this.saved;
    // arrays: dq, dk, dv, dg, dbeta, dh0
    const { set, ...buffers } = this.#job;
    return runPasses(ctx, set, {
      what: "gpuBackward",
      plan,
      ...buffers,
      stages: BACKWARD_STAGES,
      reverse: true,
      floats: plan.floats.grads,
      split: splitOf(GRADS, plan),
      ...(targets !== undefined ? { targets } : {}),
    }, timing);
  }

  /**
   * Destroys the job's own buffers (never the saved ones).
   *
   * @param whenIdle Whether submitted work may still use them (destroy them once it is done).
   */
  destroy(whenIdle = false): void {
    this.#job.set.destroyAll(whenIdle);
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
