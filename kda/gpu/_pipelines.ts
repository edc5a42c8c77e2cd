// The small passes beside the kernel sets (glue.ts, options.ts, range_checks.ts) compile alike:
// one WGSL module of their own, one bind group layout of buffers, one pipeline an entry point,
// compiled once per device context on first use (a failed compile is forgotten, so the next call
// tries again).

import type { GpuContext } from "./device.ts";

/** A module's bind group layout and its pipelines by entry point. */
export interface Pipelines<E extends string> {
  layout: GPUBindGroupLayout;
  pipelines: Map<E, GPUComputePipeline>;
}

/**
 * Compiles one module's entry points with one bind group layout (group 0) whose bindings 0.. are
 * buffers of the given types, in a GPU error scope.
 *
 * @param ctx The device context.
 * @param what The module's label, for labels and messages.
 * @param code The WGSL.
 * @param buffers The bindings' buffer types, in binding order.
 * @param entries The entry points.
 * @returns The layout and the pipelines.
 * @example
 * ```ts
 * import { getContext, wgslText } from "./device.ts";
 * import { compilePipelines } from "./_pipelines.ts";
 * const ctx = await getContext();
 * const code = await wgslText(new URL("./kernels/range_flags.wgsl", import.meta.url));
 * const { pipelines } = await compilePipelines(ctx, "example", code, ["uniform", "read-only-storage", "storage"], ["rangeFlags"]);
 * console.log(pipelines.size); // 1
 * ```
 */
export async function compilePipelines<E extends string>(
  ctx: GpuContext,
  what: string,
  code: string,
  buffers: readonly GPUBufferBindingType[],
  entries: readonly E[],
): Promise<Pipelines<E>> {
  const { device } = ctx;
  return await ctx.scoped(`the ${what} pipelines`, () => {
    const module = device.createShaderModule({ label: what, code });
    const layout = device.createBindGroupLayout({
      label: what,
      entries: buffers.map((type, binding) => ({
        binding,
        visibility: GPUShaderStage.COMPUTE,
        buffer: { type },
      })),
    });
    const pipelineLayout = device.createPipelineLayout({ bindGroupLayouts: [layout] });
    const pipelines = new Map<E, GPUComputePipeline>();
    for (const entry of entries) {
      pipelines.set(
        entry,
        device.createComputePipeline({
          label: `${what}.${entry}`,
          layout: pipelineLayout,
          compute: { module, entryPoint: entry },
        }),
      );
    }
    return { layout, pipelines };
  });
}

/**
 * What `make` makes for a context, made once per context (a failure is forgotten, so the next
 * call makes it again).
 *
 * @param cache The per-context cache of one kind of thing.
 * @param ctx The device context.
 * @param make Makes it.
 * @returns It.
 * @example
 * ```ts
 * import { getContext, type GpuContext } from "./device.ts";
 * import { oncePerContext } from "./_pipelines.ts";
 * const cache = new WeakMap<GpuContext, Promise<number>>();
 * const ctx = await getContext();
 * console.log(await oncePerContext(cache, ctx, async () => 7)); // 7
 * ```
 */
export function oncePerContext<T>(
  cache: WeakMap<GpuContext, Promise<T>>,
  ctx: GpuContext,
  make: (ctx: GpuContext) => Promise<T>,
): Promise<T> {
  let made = cache.get(ctx);
  if (made === undefined) {
    made = make(ctx);
    cache.set(ctx, made);
    made.catch(() => cache.delete(ctx));
  }
  return made;
}
