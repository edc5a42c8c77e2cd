// The one "encode passes, submit, read back" routine every kernel set's forward and backward run
// through. It knows a set only by its declaration: each stage is one compute pass (so that, when
// the device has `timestamp-query`, each stage is timed on the GPU by its pass's timestampWrites),
// a scan stage dispatches once per chunk range, sliced stages next to each other run one pass each
// per slice (all of them on a slice, then the next, from the last slice in a direction whose scans
// run from the last chunk; a stage's time is the sum of its passes), and
// glue passes (glue.ts) may run before and after the set's stages. Everything goes in one submit,
// followed by at most one readback: Deno polls the device on a timer, so each host round trip costs
// about 10 ms whatever the work.

import type { CompiledSet, GpuContext } from "./device.ts";
import { GpuError } from "./device.ts";
import { type BufferSet, UNIFORM_USAGE } from "./buffers.ts";
import { countSync } from "./tensor.ts";
import { RANGE_BYTES } from "./layout.ts";
import { type ReadPiece, type StagedReads, stageReads } from "./readback.ts";
import type { FreshArrays } from "./fresh_arrays.ts";
import type { DirectionDecl, Plan, StageDecl } from "./kernel_set.ts";

/** One buffer-to-buffer copy on the GPU, in bytes. */
export interface BufferCopy {
  /** Copied from. */
  source: GPUBuffer;
  /** Byte offset in the source. */
  sourceOffset: number;
  /** Copied to. */
  target: GPUBuffer;
  /** Byte offset in the target. */
  targetOffset: number;
  /** Bytes (a multiple of 4). */
  bytes: number;
}

/** Compute passes that run around a set's stages (glue.ts): each encodes itself into a pass. */
export interface ExtraPass {
  /** A label, for messages and timing. */
  label: string;
  /** Encodes its dispatches into the pass. */
  encode(pass: GPUComputePassEncoder): void;
}

/** What one submit runs and reads back. */
export interface PassJob {
  /** The call, for messages ("gpuForward"). */
  what: string;
  /** The compiled kernel set. */
  compiled: CompiledSet;
  /** The call's plan. */
  plan: Plan;
  /** The direction whose stages run. */
  direction: DirectionDecl;
  /** Whether the scans run from the last chunk to the first. */
  reverse: boolean;
  /** Group 0 of each stage: the bindings it uses. */
  bindGroups: ReadonlyMap<StageDecl, GPUBindGroup>;
  /** Passes before anything else (glue: expand heads, pad rows). */
  before: readonly ExtraPass[];
  /** Copies before the set's stages (inputs on the device into the set's packed buffers). */
  copiesIn: readonly BufferCopy[];
  /** Copies after the set's stages (results into the buffers the caller gave). */
  copiesOut: readonly BufferCopy[];
  /** Passes after those copies (glue: unpad rows, sum heads). */
  after: readonly ExtraPass[];
  /** What to read back to the host, in order; empty: the call returns after its submit. */
  reads: readonly ReadPiece[];
  /**
   * The arrays the reads are copied into, being made ready while the GPU works (taken after the
   * map, given up when the data is not read or the call fails); absent: new arrays.
   */
  into?: FreshArrays;
}

/** What a submit returned. */
export interface PassResult {
  /** The pieces read back, one Float32Array each (owning its buffer), in the order asked. */
  arrays: Float32Array[];
  /**
   * GPU time of each stage that ran (`stages`) in nanoseconds, when timing was asked and the device
   * can (the median over the repeats).
   */
  stageNs?: number[];
  /** The entry points of the stages that ran, in order (a stage may not run for every call). */
  stages?: string[];
}

/**
 * How a timed submit runs: the stages `repeat` times back to back, with or without reading the
 * data back (repeats keep the GPU busy, so its clocks settle; for the benchmark).
 */
export interface TimingOptions {
  /** Times to run the stages in the one submit. */
  repeat: number;
  /** Whether to read the data back (else `arrays` is empty). */
  readData: boolean;
}

/** A job's chunk ranges: the scans' (in reverse order in the backward), then the slices'. */
function rangesOf(job: PassJob): { scans: [number, number][]; slices: Plan["slices"] } {
  const scans = job.compiled.set.scanRanges(job.plan);
  if (job.reverse) scans.reverse();
  return { scans, slices: job.plan.slices };
}

/**
 * One chunk-range uniform: the dispatch's chunks [n0, n1) (for a sliced stage, its slice's
 * positions in slice order: n0 is block 0 of the per-slice buffers).
 */
type RangeUniform = readonly [n0: number, n1: number];

/** The chunk-range uniforms, one per dispatch, and their bind group. */
function makeRanges(ctx: GpuContext, set: BufferSet, ranges: readonly RangeUniform[]) {
  const stride = ctx.rangeAlign;
  const buffer = set.make("chunk ranges", ranges.length * stride, UNIFORM_USAGE);
  const words = new Uint32Array((ranges.length * stride) / Uint32Array.BYTES_PER_ELEMENT);
  ranges.forEach((range, i) => words.set(range, (i * stride) / Uint32Array.BYTES_PER_ELEMENT));
  ctx.device.queue.writeBuffer(buffer, 0, words);
  const bindGroup = ctx.device.createBindGroup({
    label: "kda chunk ranges",
    layout: ctx.rangeLayout,
    entries: [{ binding: 0, resource: { buffer, size: RANGE_BYTES } }],
  });
  return bindGroup;
}

/** One compute pass: a stage, and the range uniforms of its dispatches (one dispatch each). */
interface Pass {
  stage: StageDecl;
  stageIndex: number;
  ranges: number[];
}

/**
 * The passes of a direction in order, and the range uniforms their dispatches read. A stage that
 * is not sliced is one pass, dispatched once per scan range for a scan (the scans' ranges over
 * each sequence's own chunks, in the job's order). A run of sliced stages next to each other goes
 * slice by slice, every stage of the run on a slice (one dispatch, a sliced scan's too), then the
 * next; from the last slice when `reverse`, so that a sliced scan's carry runs from the later
 * chunks to the earlier.
 */
function passesOf(
  stages: readonly StageDecl[],
  ranges: { scans: readonly [number, number][]; slices: Plan["slices"] },
  reverse: boolean,
): { passes: Pass[]; uniforms: RangeUniform[] } {
  const uniforms: RangeUniform[] = ranges.scans.map(([n0, n1]) => [n0, n1]);
  const scanUniforms = uniforms.map((_, i) => i);
  const passes: Pass[] = [];
  for (let i = 0; i < stages.length;) {
    if (stages[i].sliced !== true) {
      passes.push({ stage: stages[i], stageIndex: i, ranges: stages[i].scan ? scanUniforms : [0] });
      i++;
      continue;
    }
    let end = i;
    while (end < stages.length && stages[end].sliced === true) end++;
    const slices = reverse ? [...ranges.slices].reverse() : ranges.slices;
    for (const [n0, n1] of slices) {
      const slice = uniforms.push([n0, n1]) - 1;
      for (let j = i; j < end; j++) {
        passes.push({ stage: stages[j], stageIndex: j, ranges: [slice] });
      }
    }
    i = end;
  }
  if (uniforms.length === 0) uniforms.push([0, 0]);
  return { passes, uniforms };
}

function copy(encoder: GPUCommandEncoder, c: BufferCopy): void {
  if (c.bytes > 0) {
    encoder.copyBufferToBuffer(c.source, c.sourceOffset, c.target, c.targetOffset, c.bytes);
  }
}

/**
 * Encodes the job (glue, copies in, the set's stages, copies out, glue), submits it with the copies
 * of what to read into staging pieces (readback.ts), and reads those back with one wait; with
 * `timing` on a device with timestamp queries, also each stage's GPU time. The stages' dispatches
 * share one compute pass, except when timed (timestamps are written at a pass's bounds, so each
 * stage gets a pass of its own): WebGPU makes each dispatch a usage scope of its own, so the
 * writes of one are visible to the next either way, and one pass took a chained kdaVjp 0.5 ms a
 * step faster on an H200 (docs/kda.md 3.2). Buffers it creates go to `set` (the caller destroys
 * them).
 *
 * @param ctx The device context.
 * @param set The call's buffers.
 * @param job What to run.
 * @param timing Whether to time the stages; options to repeat them without reading back.
 * @returns The pieces read back, and the stage times.
 * @throws {GpuError} On a GPU error or a lost device (never returns numbers from a lost device).
 * @example
 * ```ts
 * // ForwardJob.run and BackwardJob.run (job.ts) are the callers: each builds a PassJob.
 * import { getContext } from "./device.ts";
 * import { ForwardJob } from "./job.ts";
 * import { kernelSet } from "./kernel_set.ts";
 * import { releaseTensors, toGpu } from "./tensor.ts";
 * import "./kernels/mod.ts";
 * const up = (n: number, v: number, shape: number[]) => toGpu(new Float32Array(n).fill(v), shape);
 * const x = {
 *   B: 1, T: 4, H: 1, K: 4, V: 4, scale: 0.5,
 *   q: await up(16, 0.1, [1, 4, 1, 4]), k: await up(16, 0.5, [1, 4, 1, 4]),
 *   v: await up(16, 1, [1, 4, 1, 4]), g: await up(16, -0.1, [1, 4, 1, 4]),
 *   beta: await up(4, 0.5, [1, 4, 1]),
 * };
 * const job = await ForwardJob.create(await getContext(), kernelSet("fused"), x, { chunkSize: 16 });
 * const { stageNs } = await job.run({ timing: { repeat: 2, readData: false } }); // runPasses
 * console.log(stageNs); // per-stage GPU ns where the device has timestamp queries
 * job.destroy();
 * releaseTensors(x);
 * ```
 */
export async function runPasses(
  ctx: GpuContext,
  set: BufferSet,
  job: PassJob,
  timing: boolean | TimingOptions = false,
): Promise<PassResult> {
  const { device } = ctx;
  const timed = timing !== false && ctx.info.timestamps;
  const repeat = typeof timing === "object" ? Math.max(1, timing.repeat) : 1;
  const readData = typeof timing === "object" ? timing.readData : true;
  const stages = job.direction.stages.filter((s) => s.when?.(job.plan) ?? true);
  const { passes, uniforms } = passesOf(stages, rangesOf(job), job.reverse);
  const nPasses = passes.length;
  const nQueries = Math.max(1, 2 * nPasses * repeat);
  const reads = readData ? job.reads : [];
  // the arrays of the reads, if any: taken once the GPU's results are mapped (workers make them
  // meanwhile), checked against the reads by copyOut
  const taken = reads.length > 0 && job.into !== undefined
    ? job.into.take()
    : Promise.resolve([] as Float32Array[]);
  // awaited below on success; a failure before then is the call's own error
  taken.catch(() => {});
  let querySet: GPUQuerySet | undefined;
  let staged: StagedReads | null = null;
  try {
    staged = await ctx.scoped(
      `${job.what} (encoding ${stages.map((s) => s.entry).join(" -> ")})`,
      () => {
        // every pipeline's layout has group 1 (the header declares the range), scans or not
        const rangeGroup = makeRanges(ctx, set, uniforms);
        let resolve: GPUBuffer | undefined;
        if (timed) {
          querySet = device.createQuerySet({ type: "timestamp", count: nQueries });
          resolve = set.make(
            `${job.what} timestamps`,
            nQueries * 8,
            GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
          );
        }
        const encoder = device.createCommandEncoder({ label: job.what });
        const extra = (passes: readonly ExtraPass[]) => {
          if (passes.length === 0) return;
          const pass = encoder.beginComputePass({ label: passes.map((p) => p.label).join(", ") });
          for (const p of passes) p.encode(pass);
          pass.end();
        };
        extra(job.before);
        for (const c of job.copiesIn) copy(encoder, c);
        // one pass for every stage unless each needs its own timestamps (see above)
        const shared = querySet === undefined
          ? encoder.beginComputePass({ label: job.what })
          : undefined;
        for (let rep = 0; rep < repeat; rep++) {
          passes.forEach(({ stage, ranges: passRanges }, passIndex) => {
            const i = rep * nPasses + passIndex;
            const pass = shared ?? encoder.beginComputePass({
              label: stage.entry,
              ...(querySet !== undefined
                ? {
                  timestampWrites: {
                    querySet,
                    beginningOfPassWriteIndex: 2 * i,
                    endOfPassWriteIndex: 2 * i + 1,
                  },
                }
                : {}),
            });
            pass.setBindGroup(0, job.bindGroups.get(stage)!);
            pass.setPipeline(job.compiled.pipelines.get(stage.entry)!);
            const [x, y, z] = stage.grid(job.plan);
            for (const r of passRanges) {
              pass.setBindGroup(1, rangeGroup, [r * ctx.rangeAlign]);
              pass.dispatchWorkgroups(x, y, z);
            }
            if (shared === undefined) pass.end();
          });
        }
        shared?.end();
        for (const c of job.copiesOut) copy(encoder, c);
        extra(job.after);
        // the resolved timestamps are read back after the data, as one more read
        const all = [...reads];
        if (querySet !== undefined && resolve !== undefined) {
          encoder.resolveQuerySet(querySet, 0, nQueries, resolve, 0);
          all.push({ buffer: resolve, offset: 0, bytes: nQueries * 8 });
        }
        const staged = stageReads((l, b, u) => set.make(l, b, u), encoder, all, job.what);
        device.queue.submit([encoder.finish()]);
        return staged;
      },
    );
    // On the device the results wait for the next call or read: queue order keeps them valid.
    if (staged.pieces === 0) return { arrays: staged.copyOut(await taken) };
    try {
      countSync();
      await staged.map();
    } catch (error) {
      ctx.assertAlive(job.what);
      throw new GpuError(
        "internal",
        `${job.what} failed while reading back its results: ${
          error instanceof Error ? error.message : String(error)
        }`,
      );
    }
    // A device lost after the submit may have left the results unwritten: never return them.
    ctx.assertAlive(job.what);
    const arrays = staged.copyOut(await taken);
    let stageNs: number[] | undefined;
    if (querySet !== undefined) {
      // the ticks' bytes, copied exactly (a Float32Array set from one copies its bytes)
      const stamps = arrays.pop()!;
      const ticks = new BigUint64Array(stamps.buffer, stamps.byteOffset, nQueries);
      // a stage's time in one repeat is the sum of its passes (one per slice when sliced)
      stageNs = stages.map((_, stageIndex) => {
        const all = Array.from(
          { length: repeat },
          (_, rep) =>
            passes.reduce((sum, p, passIndex) => {
              if (p.stageIndex !== stageIndex) return sum;
              const i = rep * nPasses + passIndex;
              return sum + Number(ticks[2 * i + 1] - ticks[2 * i]);
            }, 0),
        ).sort((a, b) => a - b);
        return all[all.length >> 1];
      });
    }
    return stageNs === undefined
      ? { arrays }
      : { arrays, stageNs, stages: stages.map((s) => s.entry) };
  } finally {
    querySet?.destroy();
    // the staging buffers go back to the pool with the set: never mapped, whatever failed
    staged?.unmapAll();
    // arrays not taken (a failure, or a timed run that reads no data) stop being made
    job.into?.cancel();
  }
}
