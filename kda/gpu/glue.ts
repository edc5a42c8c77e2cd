// The glue passes that let a kernel set run what its kernels do not take natively
// (KernelSet.native): grouped value heads by expanding q and k to one copy per value head before
// the forward and summing dq and dk over each group after the backward (docs/kda.md 2.5), and
// packed batches by padding the token rows to [N, longest] before and unpacking after (docs/kda.md
// 2.6; pad rows have k = v = g = beta = 0, which leaves every state and real output unchanged).
// Each is a compute pass of kda/gpu/kernels/glue.wgsl, encoded into the call's one submit.

import { type GpuContext, wgslText } from "./device.ts";
import { type BufferSet, UNIFORM_USAGE } from "./buffers.ts";
import type { ExtraPass } from "./encode.ts";
import { compilePipelines, oncePerContext, type Pipelines } from "./_pipelines.ts";

const GLUE_URL = new URL("./kernels/glue.wgsl", import.meta.url);
const ENTRIES = ["expandHeads", "sumHeads", "padRows", "unpadRows"] as const;
/** One glue entry point. */
export type GlueEntry = typeof ENTRIES[number];
const GLUE_WG = 256;

type CompiledGlue = Pipelines<GlueEntry>;

const compiledGlue = new WeakMap<GpuContext, Promise<CompiledGlue>>();

async function compile(ctx: GpuContext): Promise<CompiledGlue> {
  const buffers = ["uniform", "read-only-storage", "storage", "read-only-storage"] as const;
  return await compilePipelines(ctx, "glue", await wgslText(GLUE_URL), buffers, ENTRIES);
}

/**
 * The glue pipelines of a device, compiled on first use.
 *
 * @param ctx The device context.
 * @returns A maker of glue passes for one call's buffers.
 * @example
 * ```ts
 * import { getContext } from "./device.ts";
 * const glue = await glueOf(await getContext());
 * console.log(typeof glue.pass); // "function"
 * ```
 */
export async function glueOf(ctx: GpuContext): Promise<Glue> {
  return new Glue(ctx, await oncePerContext(compiledGlue, ctx, compile));
}

/**
 * Makes glue passes: each a dispatch of one glue entry point over a destination's elements.
 *
 * @example
 * ```ts
 * // const pass = glue.pass(scratch, "sumHeads", { src, dst, n, width: K, g: G });
 * ```
 */
export class Glue {
  /**
   * @param ctx The device context.
   * @param compiled The glue pipelines.
   */
  constructor(readonly ctx: GpuContext, readonly compiled: CompiledGlue) {}

  /**
   * One glue pass: `entry` over `n` destination elements.
   *
   * @param scratch The call's buffers (the pass's uniform goes there).
   * @param entry The entry point.
   * @param args The source and destination buffers, the element count, the row width, the
   *   group size or padded length `g`, and for the packed entries the offsets buffer and the
   *   sequence count.
   * @returns The pass.
   */
  pass(
    scratch: BufferSet,
    entry: GlueEntry,
    args: {
      src: GPUBuffer;
      dst: GPUBuffer;
      n: number;
      width: number;
      g: number;
      offsets?: GPUBuffer;
      seqs?: number;
    },
  ): ExtraPass {
    const { device } = this.ctx;
    const params = scratch.make(`glue ${entry} params`, 16, UNIFORM_USAGE);
    device.queue.writeBuffer(
      params,
      0,
      new Uint32Array([args.n, args.width, args.g, args.seqs ?? 0]),
    );
    const bindGroup = device.createBindGroup({
      label: `glue ${entry}`,
      layout: this.compiled.layout,
      entries: [
        { binding: 0, resource: { buffer: params } },
        { binding: 1, resource: { buffer: args.src } },
        { binding: 2, resource: { buffer: args.dst } },
        { binding: 3, resource: { buffer: args.offsets ?? this.ctx.readPlaceholder } },
      ],
    });
    const pipeline = this.compiled.pipelines.get(entry)!;
    const groups = Math.max(
      1,
      Math.min(Math.ceil(args.n / GLUE_WG), this.ctx.info.limits.maxComputeWorkgroupsPerDimension),
    );
    return {
      label: `glue ${entry}`,
      encode(pass) {
        pass.setPipeline(pipeline);
        pass.setBindGroup(0, bindGroup);
        pass.dispatchWorkgroups(groups);
      },
    };
  }
}
