// The in-kernel options on the gpu arm (docs/kda.md 2.8): compute passes of
// kda/gpu/kernels/options.wgsl in the call's one submit, so that a call on GpuTensors with options
// still costs no host sync. Before a kernel set's forward (and before the glue passes, since the
// options act on the caller's layouts), q and k are L2-normalised, the raw gate becomes the log
// decay and the logits become beta; what the backward needs stays on the device with the saved
// forward. After the set's backward (and after the glue passes), the gradients are pulled back
// through those maps and daLog, ddtBias are reduced, in a fixed order.

import type { GpuContext } from "./device.ts";
import { SHARED_WGSL, wgslText } from "./device.ts";
import { type BufferSet, fillNaN, UNIFORM_USAGE, upload } from "./buffers.ts";
import type { ExtraPass } from "./encode.ts";
import type { JobArrays } from "./job.ts";
import { bytesOf } from "./layout.ts";
import { type GpuTensor, isGpuTensor } from "./tensor.ts";
import { gpuDebug } from "./_debug.ts";
import { compilePipelines, oncePerContext, type Pipelines } from "./_pipelines.ts";
import { type InKernel, L2NORM_EPS } from "../_types.ts";

const OPTIONS_URL = new URL("./kernels/options.wgsl", import.meta.url);
const ENTRIES = [
  "l2normFwd",
  "l2normBwd",
  "gateFwd",
  "gateBwd",
  "gateReduce1",
  "gateReduce2",
  "gateReduce3",
  "betaFwd",
  "betaBwd",
  "copyArray",
] as const;
/** One entry point of the options' passes. */
type Entry = typeof ENTRIES[number];
const WG = 256;
/** Rows one invocation of gateReduce1 sums (ROW_BLOCK in the WGSL). */
const ROW_BLOCK = 256;
const FLAGS = { HAS_ALOG: 1, HAS_DTBIAS: 2, LOWER_BOUND: 4, SAVE: 8 } as const;

interface Compiled extends Pipelines<Entry> {
  /** Bound in the slots a pass leaves empty: one per slot, so no buffer is bound twice. */
  empty: GPUBuffer[];
}

const compiled = new WeakMap<GpuContext, Promise<Compiled>>();

async function compile(ctx: GpuContext): Promise<Compiled> {
  // the eps of the in-kernel l2norm has one source, kda/_types.ts, generated in here
  const eps = `const L2NORM_EPS: f32 = ${L2NORM_EPS.toExponential()};\n`;
  const code = (await wgslText(SHARED_WGSL.shared)) + "\n" + eps +
    (await wgslText(OPTIONS_URL));
  const read = "read-only-storage", write = "storage";
  const buffers = ["uniform", read, read, read, write, write] as const;
  const { layout, pipelines } = await compilePipelines(ctx, "options", code, buffers, ENTRIES);
  const { device } = ctx;
  return await ctx.scoped("the in-kernel options' placeholders", () => {
    const empty = Array.from(
      { length: 5 },
      (_, i) =>
        device.createBuffer({
          label: `options placeholder ${i}`,
          size: 16,
          usage: GPUBufferUsage.STORAGE,
        }),
    );
    return { layout, pipelines, empty };
  });
}

/** The buffers of one pass, by slot: three read, two written. */
interface Slots {
  a?: GPUBuffer;
  b?: GPUBuffer;
  c?: GPUBuffer;
  out0?: GPUBuffer;
  out1?: GPUBuffer;
}

/** The uniform fields of one pass (the rest default to 0). */
interface PassParams {
  n: number;
  K?: number;
  HV?: number;
  rows?: number;
  nblk?: number;
  flags?: number;
  lowerBound?: number;
  c?: number;
}

/** Makes the options' passes of one call (get one with {@linkcode inKernelPasses}). */
export class InKernelPasses {
  /**
   * @param ctx The device context.
   * @param c The compiled pipelines.
   */
  constructor(readonly ctx: GpuContext, readonly c: Compiled) {}

  /**
   * One pass: `entry` over `params.n` elements (or rows).
   *
   * @param scratch The call's buffers (the pass's uniform goes there).
   * @param entry The entry point.
   * @param slots Its buffers: three read, two written (placeholders where absent).
   * @param params Its uniform fields.
   * @returns The pass.
   */
  pass(scratch: BufferSet, entry: Entry, slots: Slots, params: PassParams): ExtraPass {
    const { device } = this.ctx;
    const uniform = scratch.make(`options ${entry} params`, 32, UNIFORM_USAGE);
    const bytes = new ArrayBuffer(32);
    const u = new Uint32Array(bytes), f = new Float32Array(bytes);
    u.set([
      params.n,
      params.K ?? 0,
      params.HV ?? 0,
      params.rows ?? 0,
      params.nblk ?? 0,
      params.flags ?? 0,
    ]);
    f[6] = params.lowerBound ?? 0;
    f[7] = params.c ?? 0;
    device.queue.writeBuffer(uniform, 0, bytes);
    const order = [slots.a, slots.b, slots.c, slots.out0, slots.out1];
    const bindGroup = device.createBindGroup({
      label: `options ${entry}`,
      layout: this.c.layout,
      entries: [
        { binding: 0, resource: { buffer: uniform } },
        ...order.map((buffer, i) => ({
          binding: i + 1,
          resource: { buffer: buffer ?? this.c.empty[i] },
        })),
      ],
    });
    const pipeline = this.c.pipelines.get(entry)!;
    const groups = Math.max(
      1,
      Math.min(Math.ceil(params.n / WG), this.ctx.info.limits.maxComputeWorkgroupsPerDimension),
    );
    return {
      label: `options ${entry}`,
      encode(pass) {
        pass.setPipeline(pipeline);
        pass.setBindGroup(0, bindGroup);
        pass.dispatchWorkgroups(groups);
      },
    };
  }
}

/**
 * The options' pass maker of a device, its pipelines compiled on first use.
 *
 * @param ctx The device context.
 * @returns The pass maker.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const passes = await inKernelPasses(await getContext());
 * ```
 */
export async function inKernelPasses(ctx: GpuContext): Promise<InKernelPasses> {
  return new InKernelPasses(ctx, await oncePerContext(compiled, ctx, compile));
}

/** A buffer of `n` f32 elements in `set` (NaN-filled in tests, so a missing write shows). */
function make(ctx: GpuContext, set: BufferSet, label: string, n: number): GPUBuffer {
  const buffer = set.make(label, bytesOf(Math.max(n, 4), "f32"));
  if (gpuDebug.prefillNaN) fillNaN(ctx.device.queue, buffer, n);
  return buffer;
}

/** What the options' backward needs, on the device, kept with the saved forward. */
export interface InKernelSaved {
  inKernel: InKernel;
  /** Rows of tokens (B·T) and heads of the caller's layouts. */
  rows: number;
  H: number;
  HV: number;
  K: number;
  qHat?: GPUBuffer;
  qR?: GPUBuffer;
  kHat?: GPUBuffer;
  kR?: GPUBuffer;
  /** z = g + dtBias. */
  z?: GPUBuffer;
  aLog?: GPUBuffer;
  /** The raw beta logits. */
  betaRaw?: GPUBuffer;
}

/** A call's dims and options as the passes see them. */
export interface InKernelCall {
  B: number;
  T: number;
  H: number;
  HV: number;
  K: number;
  inKernel: InKernel;
  /** The gate's parameters: host arrays (uploaded here) or GpuTensors. */
  aLog?: Float32Array | GpuTensor;
  dtBias?: Float32Array | GpuTensor;
}

/**
 * The forward passes of a call's options: the caller's q, k, g, beta (on the device) replaced by
 * the op's own, computed by passes that run before everything else in the submit.
 *
 * @param p The pass maker (inKernelPasses).
 * @param scratch The call's buffers (freed after it).
 * @param kept Buffers kept with the saved forward (freed when it is released).
 * @param save Whether a backward will follow.
 * @param call The call's dims, options and gate parameters.
 * @param arrays The caller's arrays on the device (uploads or the caller's tensors).
 * @returns The arrays the glue and the set see, the passes, and what the backward needs.
 */
export function inKernelForward(
  p: InKernelPasses,
  scratch: BufferSet,
  kept: BufferSet,
  save: boolean,
  call: InKernelCall,
  arrays: JobArrays,
): { view: JobArrays; passes: ExtraPass[]; saved?: InKernelSaved } {
  const { ctx } = p;
  const { B, T, H, HV, K, inKernel } = call;
  const rows = B * T;
  // with a backward to follow, the op's own arrays live as long as the saved forward: a set may
  // bind them directly as its saved inputs
  const home = save ? kept : scratch;
  const passes: ExtraPass[] = [];
  const view: JobArrays = { ...arrays };
  const saved: InKernelSaved = { inKernel, rows, H, HV, K };
  const tensor = (buffer: GPUBuffer, shape: number[]): GpuTensor => ({
    buffer,
    shape,
    dtype: "f32",
  });
  if (inKernel.l2norm) {
    for (const name of ["q", "k"] as const) {
      const n = rows * H * K;
      const y = make(ctx, home, `l2normed ${name}`, n), r = make(ctx, home, `${name} rstd`, n / K);
      passes.push(p.pass(scratch, "l2normFwd", { a: arrays[name]!.buffer, out0: y, out1: r }, {
        n: rows * H,
        K,
      }));
      view[name] = tensor(y, [B, T, H, K]);
      if (name === "q") Object.assign(saved, { qHat: y, qR: r });
      else Object.assign(saved, { kHat: y, kR: r });
    }
  }
  const gate = inKernel.gate;
  if (gate !== null) {
    // the gate's parameters on the device: uploads, or copies of the caller's tensors when kept
    const param = (x: Float32Array | GpuTensor | undefined, label: string, n: number) => {
      if (x === undefined) return undefined;
      if (!isGpuTensor(x)) {
        const buffer = make(ctx, home, label, n);
        upload(ctx.device.queue, buffer, 0, x);
        return buffer;
      }
      if (!save) return x.buffer;
      const copy = make(ctx, kept, label, n);
      passes.push(p.pass(scratch, "copyArray", { a: x.buffer, out0: copy }, { n }));
      return copy;
    };
    const aLog = param(call.aLog, "aLog", HV);
    const dtBias = param(call.dtBias, "dtBias", HV * K);
    const n = rows * HV * K;
    const g = make(ctx, home, "in-kernel gate", n);
    const z = save ? make(ctx, kept, "gate input z", n) : undefined;
    passes.push(
      p.pass(scratch, "gateFwd", { a: arrays.g!.buffer, b: aLog, c: dtBias, out0: g, out1: z }, {
        n,
        K,
        HV,
        flags: gateFlags(inKernel) | (save ? FLAGS.SAVE : 0),
        lowerBound: gate.lowerBound ?? 0,
      }),
    );
    view.g = tensor(g, [B, T, HV, K]);
    Object.assign(saved, { z, aLog });
  }
  if (inKernel.betaSigmoid !== 0) {
    const n = rows * HV;
    const beta = make(ctx, home, "in-kernel beta", n);
    const raw = save ? make(ctx, kept, "beta logits", n) : undefined;
    passes.push(p.pass(scratch, "betaFwd", { a: arrays.beta!.buffer, out0: beta, out1: raw }, {
      n,
      flags: save ? FLAGS.SAVE : 0,
      c: inKernel.betaSigmoid,
    }));
    view.beta = tensor(beta, [B, T, HV]);
    saved.betaRaw = raw;
  }
  return save ? { view, passes, saved } : { view, passes };
}

/** The gate's flag bits of a call. */
function gateFlags(inKernel: InKernel): number {
  const gate = inKernel.gate!;
  return (gate.aLog ? FLAGS.HAS_ALOG : 0) | (gate.dtBias ? FLAGS.HAS_DTBIAS : 0) |
    (gate.lowerBound !== null ? FLAGS.LOWER_BOUND : 0);
}

/**
 * The backward passes of a call's options: the buffers the glue and the set write the core's
 * gradients into (in place of the caller's), and the passes, run after everything else in the
 * submit, that pull them back to the caller's dq, dk, dg, dbeta and write daLog, ddtBias.
 *
 * @param p The pass maker (inKernelPasses).
 * @param scratch The call's buffers.
 * @param saved What the forward kept.
 * @param results The caller's gradient tensors (daLog and ddtBias where the forward had them).
 * @returns The core's gradient targets and the passes.
 */
export function inKernelBackward(
  p: InKernelPasses,
  scratch: BufferSet,
  saved: InKernelSaved,
  results: Record<"dq" | "dk" | "dg" | "dbeta", GpuTensor> & {
    daLog?: GpuTensor;
    ddtBias?: GpuTensor;
  },
): { view: JobArrays; passes: ExtraPass[] } {
  const { ctx } = p;
  const { inKernel, rows, H, HV, K } = saved;
  const view: JobArrays = {};
  const passes: ExtraPass[] = [];
  const core = (name: "dq" | "dk" | "dg" | "dbeta", n: number) => {
    const t = results[name];
    const buffer = make(ctx, scratch, `core ${name}`, n);
    view[name] = { buffer, shape: t.shape, dtype: "f32" };
    return buffer;
  };
  if (inKernel.l2norm) {
    const pairs = [["dq", saved.qHat!, saved.qR!], ["dk", saved.kHat!, saved.kR!]] as const;
    for (const [name, y, r] of pairs) {
      const dy = core(name, rows * H * K);
      passes.push(p.pass(scratch, "l2normBwd", { a: y, b: r, c: dy, out0: results[name].buffer }, {
        n: rows * H,
        K,
      }));
    }
  }
  const gate = inKernel.gate;
  if (gate !== null) {
    const n = rows * HV * K, HK = HV * K;
    const dy = core("dg", n);
    const params = {
      K,
      HV,
      rows,
      flags: gateFlags(inKernel),
      lowerBound: gate.lowerBound ?? 0,
    };
    const common = { a: saved.z!, b: saved.aLog, c: dy };
    passes.push(p.pass(scratch, "gateBwd", { ...common, out0: results.dg.buffer }, {
      ...params,
      n,
    }));
    if (gate.aLog || gate.dtBias) {
      const nblk = Math.ceil(rows / ROW_BLOCK);
      const blocks = make(ctx, scratch, "gate block sums", 2 * nblk * HK);
      const perChannel = make(ctx, scratch, "daLog per channel", HK);
      passes.push(
        p.pass(scratch, "gateReduce1", { ...common, out0: blocks }, { ...params, n: nblk * HK }),
        p.pass(scratch, "gateReduce2", {
          a: blocks,
          out0: results.ddtBias?.buffer,
          out1: perChannel,
        }, { ...params, n: HK, nblk }),
      );
      if (gate.aLog) {
        passes.push(p.pass(scratch, "gateReduce3", {
          a: perChannel,
          out0: results.daLog!.buffer,
        }, { ...params, n: HV }));
      }
    }
  }
  if (inKernel.betaSigmoid !== 0) {
    const dy = core("dbeta", rows * HV);
    passes.push(p.pass(scratch, "betaBwd", {
      a: saved.betaRaw!,
      b: dy,
      out0: results.dbeta.buffer,
    }, { n: rows * HV, c: inKernel.betaSigmoid }));
  }
  return { view, passes };
}
