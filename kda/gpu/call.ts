// The gpu arm's one road: every call, from typed arrays or from tensors already on the device,
// is "upload (host arrays only), the set's job on device tensors, one readback (host arrays
// only)". Grouped value heads and packed batches that a set does not take natively go through the
// glue passes in the same submit. A call on device tensors returns right after its submit, with
// DeviceTensors the caller owns; queue order keeps them valid for whatever is queued next.

import type { ChunkSize, KdaGateGrads, KdaGrads, KdaProblem } from "../_types.ts";
import { getContext, type GpuContext, readyContext } from "./device.ts";
import { BufferSet, upload } from "./buffers.ts";
import {
  bytesOf,
  f32Problem,
  limitProblem,
  makePlan,
  maxBindingOf,
  shapeProblem,
} from "./layout.ts";
import {
  assertUsable,
  BackwardJob,
  ForwardJob,
  type GpuSaved,
  type JobArrays,
  type SavedState,
} from "./job.ts";
import { bufferView, DeviceTensor, type GpuTensor, isGpuTensor, pinTensors } from "./tensor.ts";
import { glueOf } from "./glue.ts";
import { glueIn, glueOut, type Layout, layoutFor, scratchTensor, viewDims } from "./_call_view.ts";
import { type FreshArrays, freshArrays } from "./fresh_arrays.ts";
import { CallChecks, type RangeChecks } from "./range_checks.ts";
import {
  allocate,
  gradShapes,
  releaseAll,
  resultLengths,
  resultReads,
  startedArrays,
} from "./_call_results.ts";
import { type ArrayName, type KernelSet, kernelSet } from "./kernel_set.ts";
import { chooseKernels } from "./kernels/mod.ts";
import { typeName } from "../../base/check.ts";
import { sizeOf } from "../../tape/mod.ts";
import {
  inKernelBackward,
  inKernelForward,
  inKernelPasses,
  type InKernelSaved,
} from "./options.ts";

export { resultLengths };

/** An array of a gpu call: all of a call's arrays are host arrays, or all are device tensors. */
export type GpuArray = Float32Array | GpuTensor;

/** The result array of a call on arrays of kind A: a Float32Array, or a DeviceTensor. */
export type GpuResult<A extends GpuArray> = A extends Float32Array ? Float32Array : DeviceTensor;

/** What a forward keeps for its backward: the set's saved state and the call's layout. */
class SavedCall implements GpuSaved {
  #offsets: BufferSet;
  #unpin: () => void;
  #gradsInto: FreshArrays | undefined;
  #checks: CallChecks | undefined;
  constructor(
    readonly state: SavedState,
    readonly layout: Layout,
    offsets: BufferSet,
    unpin: () => void,
    /** What the in-kernel options' backward needs (its buffers are in `offsets`). */
    readonly inKernel?: InKernelSaved,
    /** The host arrays of the first backward's gradients, being made since the forward began. */
    gradsInto?: FreshArrays,
    /** The value checks the forward ran and did not read, for the first backward to read. */
    checks?: CallChecks,
  ) {
    this.#offsets = offsets;
    this.#unpin = unpin;
    this.#gradsInto = gradsInto;
    this.#checks = checks;
  }

  get released(): boolean {
    return this.state.released;
  }

  /** The gradients' host arrays the forward started, for the first backward that reads to typed arrays. */
  takeGradsInto(): FreshArrays | undefined {
    const into = this.#gradsInto;
    this.#gradsInto = undefined;
    return into;
  }

  /** The forward's value checks, unread, for the first backward (its flags live in `offsets`). */
  takeChecks(): CallChecks | undefined {
    const checks = this.#checks;
    this.#checks = undefined;
    return checks;
  }

  release(whenIdle = false): void {
    this.#gradsInto?.cancel();
    this.#gradsInto = undefined;
    this.#checks = undefined;
    if (this.state.released) return;
    this.state.release(whenIdle);
    this.#offsets.destroyAll(whenIdle);
    this.#unpin();
  }
}

function shapeText(dims: number[]): string {
  return `[${dims.join(", ")}]`;
}

/** Throws unless `value` is a call array of the call's kind with `n` elements (internal guard). */
function checkArray(
  name: string,
  value: unknown,
  dims: number[],
  labels: string,
  device: boolean,
): GpuArray {
  const n = sizeOf(dims);
  if (device) {
    if (!isGpuTensor(value)) {
      throw new TypeError(
        `${name} must be a GpuTensor like the other arrays: got ${typeName(value)}`,
      );
    }
    if (value.buffer.size < bytesOf(n, "f32")) {
      throw new RangeError(
        `${name} must hold ${n} elements ${labels} = ${shapeText(dims)}: its buffer has ` +
          `${value.buffer.size} bytes`,
      );
    }
    return value;
  }
  if (!(value instanceof Float32Array)) {
    throw new TypeError(`${name} must be a Float32Array: got ${typeName(value)}`);
  }
  if (value.length !== n) {
    throw new RangeError(`${name} must have ${n} elements ${labels}: got ${value.length}`);
  }
  return value;
}

/** A check of a call's arrays against its layout (the public boundary checked them already). */
function checkArrays(x: KdaProblem<GpuArray>, layout: Layout): boolean {
  const device = isGpuTensor(x.q);
  const { B, T, H, HV, K, V, N } = layout;
  const hv = x.HV === undefined ? "H" : "HV", n = x.cuSeqlens === undefined ? "B" : "N";
  checkArray("q", x.q, [B, T, H, K], "[B, T, H, K]", device);
  checkArray("k", x.k, [B, T, H, K], "[B, T, H, K]", device);
  checkArray("v", x.v, [B, T, HV, V], `[B, T, ${hv}, V]`, device);
  checkArray("g", x.g, [B, T, HV, K], `[B, T, ${hv}, K]`, device);
  checkArray("beta", x.beta, [B, T, HV], `[B, T, ${hv}]`, device);
  if (x.h0 !== undefined) checkArray("h0", x.h0, [N, HV, K, V], `[${n}, ${hv}, K, V]`, device);
  return device;
}

/**
 * Why the gpu arm cannot run a call with this set here, or null: the set's own limits, the
 * device's (features, workgroup memory, bindings), the shape, the scale, and the buffer and grid
 * limits of the call the set would run (padded, or with expanded heads, where the glue does).
 *
 * @param ctx The device context.
 * @param set The kernel set.
 * @param x The call's dims, layout and scale.
 * @param chunkSize The chunk size.
 * @returns A reason, or null.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * import { kernelSet } from "./kernel_set.ts";
 * import "./kernels/mod.ts";
 * const ctx = await getContext();
 * callProblem(ctx, kernelSet("fused"), { B: 1, T: 4, H: 1, K: 4, V: 4, scale: 0.5 }, 16); // null
 * ```
 */
export function callProblem(
  ctx: GpuContext,
  set: KernelSet,
  x: Omit<KdaProblem<unknown>, "q" | "k" | "v" | "g" | "beta" | "h0">,
  chunkSize: ChunkSize,
): string | null {
  const shape = shapeProblem(x, chunkSize);
  if (shape !== null) return shape;
  const scale = f32Problem("scale", x.scale);
  if (scale !== null) return scale;
  // the gate's bound is a log decay the kernels scale in f32: past f32's range it would be −∞,
  // and the gradients NaN
  const lowerBound = x.inKernel?.gate?.lowerBound ?? null;
  const bound = lowerBound === null ? null : f32Problem("lowerBound", lowerBound);
  if (bound !== null) return bound;
  const device = ctx.setProblem(set);
  if (device !== null) return device;
  const own = set.whyNot(x, chunkSize);
  if (own !== null) return `the kernel set ${set.name} cannot run this call: ${own}`;
  const layout = layoutFor(set, x);
  const view = { ...viewDims(layout), K: x.K, V: x.V };
  const limits = ctx.info.limits;
  const limit = limitProblem(set, makePlan(set, view, chunkSize, maxBindingOf(limits)), limits);
  if (limit === null) return null;
  const { B, T, H } = view;
  // the caller's shape first: the padded or expanded one is the set's, not theirs
  // both where the glue both pads and expands
  const changes = [
    ...(layout.padded !== null
      ? [`the packed batch of ${layout.N} sequences (T=${x.T}) runs padded to B=${B}, T=${T}`]
      : []),
    ...(layout.expand > 1
      ? [`the grouped value heads (H=${x.H}, HV=${layout.HV}) run expanded to H=${H}`]
      : []),
  ];
  if (changes.length === 0) return limit;
  return `${changes.join(" and ")} on the kernel set ${set.name}, and there ` +
    limit[0].toLowerCase() + limit.slice(1);
}

/** Whether a set keeps an input's own buffer for its backward (a saved buffer of one array). */
function bindsSavedInputs(set: KernelSet): boolean {
  return set.buffers.some((b) =>
    b.lifetime === "saved" && !b.perChunk && b.table.regions.length === 1 &&
    Object.keys(b.arrays ?? {}).length === 1
  );
}

/** Host arrays uploaded into scratch buffers; device tensors as they are. */
function onDevice(
  ctx: GpuContext,
  scratch: BufferSet,
  arrays: Partial<Record<ArrayName, GpuArray>>,
): JobArrays {
  const out: JobArrays = {};
  for (const [name, a] of Object.entries(arrays) as [ArrayName, GpuArray | undefined][]) {
    if (a === undefined) continue;
    if (isGpuTensor(a)) {
      out[name] = a;
      continue;
    }
    const t = scratchTensor(scratch, `upload ${name}`, [a.length]);
    upload(ctx.device.queue, t.buffer, 0, a);
    out[name] = t;
  }
  return out;
}

/** The set a call names (a RangeError listing the known ones), else the rule's choice. */
function setOf(kernels: string | undefined): KernelSet {
  return kernelSet(chooseKernels(kernels).name, "options.kernels");
}

/**
 * The chunked KDA forward on the GPU with a kernel set: from Float32Arrays (one upload, one
 * submit, one readback) or from GpuTensors (one submit, no readback: DeviceTensors back).
 *
 * @param x The problem: q, k, g, v, beta and optional h0, all Float32Arrays or all GpuTensors, with
 *   optional grouped value heads `HV` and packed offsets `cuSeqlens` (docs/kda.md 2.5, 2.6).
 * @param options `chunkSize`; `kernels`, the set to run (default: the rule's choice);
 *   `saveForBackward` keeps what {@linkcode gpuBackward} needs on the GPU; `outputs: false` returns
 *   no outputs (`o` and `ht` undefined; from typed arrays nothing is read back), for a forward run
 *   only for its backward; `outputsToHost` reads the outputs back to typed arrays from
 *   GpuTensors too; `gradsToHost` (with `saveForBackward`) says the first backward will read its
 *   gradients back to typed arrays (from GpuTensors too), whose pages are then faulted in by
 *   worker threads from now on, while this call uploads (kda/gpu/fresh_arrays.ts);
 *   `outputsInto` and `gradsInto`, those arrays when the caller started making them itself,
 *   earlier (of resultLengths' lengths); `checks`,
 *   value checks of the call's host arrays (or of its snapshots of them, kda/gpu/snapshot.ts)
 *   that the call runs on the bytes it computes on (kda/gpu/range_checks.ts), read back with its
 *   outputs, or with the gradients of the first backward on `saved` (the backward also runs those
 *   of its cotangents); the checks of arrays it does not take are left unreported.
 * @returns `o` and `ht` (Float32Arrays owning their buffers, or DeviceTensors), and `saved` with
 *   `saveForBackward` (release it when no more backward calls will come).
 * @throws {TypeError} When an array is not of the call's kind.
 * @throws {RangeError} When a length, the shape, the chunk size or the scale is wrong, or the call
 *   exceeds a device limit.
 * @throws {Error} When no GPU is available; a GpuError on a GPU error or device loss.
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
 * }, { chunkSize: 16, kernels: "fused" });
 * console.log((o as Float32Array).length, (ht as Float32Array).length); // 80 16
 * ```
 */
export async function gpuForward<A extends GpuArray>(
  x: KdaProblem<A>,
  options: {
    chunkSize: ChunkSize;
    kernels?: string;
    saveForBackward?: boolean;
    outputs?: boolean;
    outputsToHost?: boolean;
    gradsToHost?: boolean;
    outputsInto?: FreshArrays;
    gradsInto?: FreshArrays;
    checks?: RangeChecks;
  },
): Promise<{ o: GpuResult<A>; ht: GpuResult<A>; saved?: GpuSaved }> {
  // before the first await: the buffers the call computes on are those it was given, and the
  // caller's DeviceTensors stay the call's until its work is queued, whatever the caller releases
  const set = setOf(options.kernels);
  const unpinCall = pinTensors([x]);
  // a set that reads the inputs again in the backward holds them until the handle is released
  const unpinSaved = options.saveForBackward === true && bindsSavedInputs(set)
    ? pinTensors([x])
    : () => {};
  let handed = false;
  try {
    const result = await forward(
      set,
      held(x, ["q", "k", "v", "g", "beta", "h0", "aLog", "dtBias"]),
      options,
      unpinSaved,
    );
    handed = true;
    return result;
  } finally {
    unpinCall();
    if (!handed) unpinSaved();
  }
}

/** `o` with each live DeviceTensor among the named fields replaced by a view of its buffer. */
function held<T>(o: T, names: readonly string[]): T {
  if (typeof o !== "object" || o === null) return o;
  const out = { ...o } as Record<string, unknown>;
  for (const name of names) {
    const a = out[name];
    if (a instanceof DeviceTensor && !a.released) out[name] = bufferView(a);
  }
  return out as T;
}

async function forward<A extends GpuArray>(
  set: KernelSet,
  x: KdaProblem<A>,
  options: {
    chunkSize: ChunkSize;
    saveForBackward?: boolean;
    outputs?: boolean;
    outputsToHost?: boolean;
    gradsToHost?: boolean;
    outputsInto?: FreshArrays;
    gradsInto?: FreshArrays;
    checks?: RangeChecks;
  },
  unpinSaved: () => void,
): Promise<{ o: GpuResult<A>; ht: GpuResult<A>; saved?: GpuSaved }> {
  const ctx = await getContext();
  const problem = callProblem(ctx, set, x, options.chunkSize);
  if (problem !== null) throw new RangeError(problem);
  const layout = layoutFor(set, x);
  const device = checkArrays(x, layout);
  const save = options.saveForBackward === true;
  const scratch = new BufferSet(ctx.device);
  const kept = new BufferSet(ctx.device);
  const { B, T, HV, K, V, N } = layout;
  // a forward run only for its backward keeps no outputs (and reads none back)
  const keepOutputs = options.outputs !== false;
  const inKernel = x.inKernel;
  // without the final state, ht stays in the set's own buffers: no copy, no readback
  const finalState = inKernel?.finalState ?? true;
  // and where the set computes o in stages of its own, it leaves them out (onlyOutputs)
  const withO = keepOutputs ||
    !set.buffers.some((b) =>
      b.onlyForOutputs === true && Object.values(b.arrays ?? {}).includes("o")
    );
  // outputs read back to typed arrays: always from typed arrays, on request from GpuTensors
  const toHost = !device || options.outputsToHost === true;
  const results = allocate(ctx, scratch, !toHost && keepOutputs, {
    ...(withO ? { o: [B, T, HV, V] } : {}),
    ...(finalState ? { ht: [N, HV, K, V] } : {}),
  } as Record<"o" | "ht", number[]>);
  // typed arrays read back what they return: its arrays are made ready while the call uploads;
  // likewise the gradients of the backward to come, when the caller says it will read them back
  const outLengths = resultLengths(layout, { grads: false, finalState });
  const gate = inKernel?.gate ?? null;
  const gradLengths = resultLengths(layout, { grads: true, gate });
  // arrays the caller started are checked before any is made here
  const outStarted = startedArrays(options.outputsInto, outLengths, "outputsInto");
  const gradsStarted = startedArrays(options.gradsInto, gradLengths, "gradsInto");
  const into = !toHost || !keepOutputs ? undefined : outStarted ?? freshArrays(outLengths);
  const gradsInto = save && options.gradsToHost === true
    ? gradsStarted ?? freshArrays(gradLengths)
    : undefined;
  // arrays started for results this call does not read back are given up
  if (options.outputsInto !== into) options.outputsInto?.cancel();
  if (options.gradsInto !== gradsInto) options.gradsInto?.cancel();
  try {
    const glue = await glueOf(ctx);
    const optionPasses = inKernel === undefined ? undefined : await inKernelPasses(ctx);
    // a forward that reads nothing back leaves its checks' flags to its backward
    const checks = await CallChecks.make(
      ctx,
      save && into === undefined ? kept : scratch,
      options.checks,
    );
    const made = await ctx.scoped("gpuForward (upload and glue)", () => {
      if (layout.padded !== null) {
        const cu = layout.padded.cuSeqlens;
        const offsets = kept.make("packed offsets", bytesOf(cu.length, "f32"));
        ctx.device.queue.writeBuffer(offsets, 0, new Uint32Array(cu));
        layout.padded.offsets = offsets;
      }
      // a set that binds saved inputs directly reads the uploads again in the backward: they
      // then live as long as what the forward saved
      const uploads = save && bindsSavedInputs(set) ? kept : scratch;
      const arrays = onDevice(ctx, uploads, {
        q: x.q,
        k: x.k,
        v: x.v,
        g: x.g,
        beta: x.beta,
        h0: x.h0,
      });
      // the value checks read the uploads as the caller gave them, before any pass
      const checkPasses = checks?.passes(
        scratch,
        (["q", "k", "v", "g", "beta", "h0"] as const).flatMap((name) =>
          arrays[name] === undefined ? [] : [[x[name], arrays[name]] as const]
        ),
      ) ?? [];
      // the in-kernel options act on the caller's layouts, before the glue
      const pre = inKernel === undefined
        ? undefined
        : inKernelForward(optionPasses!, scratch, kept, save, {
          ...layout,
          inKernel,
          aLog: x.aLog,
          dtBias: x.dtBias,
        }, arrays);
      const input = glueIn(glue, scratch, layout, pre?.view ?? arrays);
      return {
        input: {
          view: input.view,
          passes: [...checkPasses, ...(pre?.passes ?? []), ...input.passes],
        },
        output: glueOut(glue, scratch, layout, withO ? { o: results.o } : {}),
        saved: pre?.saved,
      };
    });
    const { q, k, v, g, beta, h0 } = made.input.view;
    // the problem in the set's view: what the glue expanded or padded, and what the set takes itself
    const inView: KdaProblem<GpuTensor> = {
      ...viewDims(layout),
      K,
      V,
      scale: x.scale,
      q: q!,
      k: k!,
      v: v!,
      g: g!,
      beta: beta!,
      ...(h0 !== undefined ? { h0 } : {}),
    };
    const job = await ForwardJob.create(ctx, set, inView, {
      chunkSize: options.chunkSize,
      saveForBackward: save,
      outputs: keepOutputs,
      targets: { ...made.output.view, ...(finalState ? { ht: results.ht } : {}) },
    });
    let saved: GpuSaved | undefined;
    // the checks' flags come back with the outputs, if they are read
    const read = resultReads(finalState ? [results.o, results.ht] : [results.o], into, checks);
    try {
      const arrays = read.settle(
        (await job.run({ before: made.input.passes, after: made.output.passes, ...read.run }))
          .arrays,
      );
      // a set that reads the inputs again in the backward keeps the DeviceTensors among them
      // until the handle is released
      if (save) {
        saved = new SavedCall(
          job.takeSaved(),
          layout,
          kept,
          unpinSaved,
          made.saved,
          gradsInto,
          into === undefined ? checks : undefined,
        );
      }
      const [o, ht] = !keepOutputs
        ? [undefined, undefined]
        : into === undefined
        ? [results.o, results.ht]
        : [arrays[0], arrays[1]];
      return { o: o as GpuResult<A>, ht: ht as GpuResult<A>, ...(saved ? { saved } : {}) };
    } finally {
      job.destroy(device);
    }
  } catch (error) {
    releaseAll(results);
    kept.destroyAll();
    gradsInto?.cancel();
    throw error;
  } finally {
    into?.cancel();
    scratch.destroyAll(device);
    if (!save) kept.destroyAll(device);
  }
}

/**
 * The chunked KDA backward on the GPU: from Float32Array cotangents (one upload, one submit, one
 * readback) or GpuTensors (one submit, DeviceTensors back). `saved` stays valid: any number of
 * backward calls may run on it, concurrently or not, each with its own cotangent and scratch
 * buffers (the same inputs give the same bits), until `saved.release()`.
 *
 * @param saved The handle returned by {@linkcode gpuForward} with `saveForBackward: true`.
 * @param cotangents `dout` [B, T, HV, V] and optional `dht` [N, HV, K, V] (absent means zero),
 *   Float32Arrays or GpuTensors.
 * @returns `dq, dk, dv, dg, dbeta, dh0` of the cotangents' kind.
 * @throws {TypeError} When `saved` is not a handle from gpuForward or a cotangent is of the wrong
 *   kind.
 * @throws {RangeError} When a cotangent has the wrong length.
 * @throws {Error} When `saved` was released; a GpuError when the forward's device was lost or a
 *   GPU error occurred.
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
 * }, { chunkSize: 16, kernels: "fused", saveForBackward: true });
 * const grads = await gpuBackward(saved!, { dout: new Float32Array(B * T * H * V).fill(1) });
 * saved!.release();
 * console.log((grads.dq as Float32Array).length); // 80
 * ```
 */
export async function gpuBackward<A extends GpuArray>(
  saved: GpuSaved,
  cotangents: { dout: A; dht?: A },
): Promise<KdaGrads<GpuResult<A>> & KdaGateGrads<GpuResult<A>>> {
  if (!(saved instanceof SavedCall)) {
    throw new TypeError("saved must be the handle returned by gpuForward: got another object");
  }
  const unpinCall = pinTensors([cotangents]);
  try {
    return await backward(saved, held(cotangents, ["dout", "dht"]));
  } finally {
    unpinCall();
  }
}

async function backward<A extends GpuArray>(
  saved: SavedCall,
  cotangents: { dout: A; dht?: A },
): Promise<KdaGrads<GpuResult<A>>> {
  const { layout } = saved;
  const { B, T, H, HV, K, V, N } = layout;
  const device = isGpuTensor(cotangents?.dout);
  const hv = HV === H ? "H" : "HV", n = N === B ? "B" : "N";
  checkArray("dout", cotangents?.dout, [B, T, HV, V], `[B, T, ${hv}, V]`, device);
  if (cotangents.dht !== undefined) {
    checkArray("dht", cotangents.dht, [N, HV, K, V], `[${n}, ${hv}, K, V]`, device);
  }
  // checked and held before any await, so that a release() right after this call waits for it
  const ready = readyContext();
  assertUsable(saved.state, typeof ready === "string" ? saved.state.ctx : ready);
  saved.state.acquire();
  const ctx = saved.state.ctx;
  const scratch = new BufferSet(ctx.device);
  // with the gate in the kernel, the gradients of its parameters that the forward had
  const gate = saved.inKernel?.inKernel.gate ?? null;
  const shapes = gradShapes(layout, gate);
  // typed arrays read the gradients back: into the arrays the forward started making, if it did
  // (the first such backward on the handle, from GpuTensors too), else arrays made while this
  // call uploads
  const started = saved.takeGradsInto();
  const toHost = !device || started !== undefined;
  const results = allocate(ctx, scratch, !toHost, shapes);
  const into = toHost ? started ?? freshArrays(Object.values(shapes).map(sizeOf)) : undefined;
  // the forward's value checks, and this call's on its cotangents, read with the gradients
  const checks = saved.takeChecks();
  try {
    const glue = await glueOf(ctx);
    const optionPasses = saved.inKernel === undefined ? undefined : await inKernelPasses(ctx);
    const made = await ctx.scoped("gpuBackward (upload and glue)", () => {
      const arrays = onDevice(ctx, scratch, { dout: cotangents.dout, dht: cotangents.dht });
      const checkPasses = checks?.passes(scratch, [
        [cotangents.dout, arrays.dout!],
        ...(arrays.dht !== undefined ? [[cotangents.dht, arrays.dht] as const] : []),
      ]) ?? [];
      const { dh0, daLog: _a, ddtBias: _d, ...rest } = results;
      // the in-kernel options pull the core's gradients back after the glue
      const post = saved.inKernel === undefined
        ? undefined
        : inKernelBackward(optionPasses!, scratch, saved.inKernel, results);
      const output = glueOut(glue, scratch, layout, { ...rest, ...post?.view });
      const input = glueIn(glue, scratch, layout, arrays);
      return {
        input: { view: input.view, passes: [...checkPasses, ...input.passes] },
        output: { view: output.view, passes: [...output.passes, ...(post?.passes ?? [])] },
        dh0,
      };
    });
    const { dout, dht } = made.input.view;
    const job = await BackwardJob.create(
      saved.state,
      { dout: dout!, ...(dht !== undefined ? { dht } : {}) },
      { ...made.output.view, dh0: made.dh0 },
    );
    try {
      const order = [
        "dq",
        "dk",
        "dv",
        "dg",
        "dbeta",
        "dh0",
        ...(gate?.aLog ? ["daLog" as const] : []),
        ...(gate?.dtBias ? ["ddtBias" as const] : []),
      ] as const;
      const read = resultReads(order.map((k) => results[k]), into, checks);
      const arrays = read.settle(
        (await job.run({ before: made.input.passes, after: made.output.passes, ...read.run }))
          .arrays,
      );
      const got = toHost ? arrays : order.map((k) => results[k]);
      return Object.fromEntries(order.map((k, i) => [k, got[i]])) as unknown as
        & KdaGrads<GpuResult<A>>
        & KdaGateGrads<GpuResult<A>>;
    } finally {
      job.destroy(device);
    }
  } catch (error) {
    releaseAll(results);
    throw error;
  } finally {
    into?.cancel();
    scratch.destroyAll(device);
    saved.state.unacquire();
  }
}
