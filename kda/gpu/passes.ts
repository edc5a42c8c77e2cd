// The one "encode passes, submit, read back" routine that the forward and the backward share.
// Each stage is one compute pass (so that, when the device has `timestamp-query`, each stage is
// timed on the GPU by its pass's timestampWrites); a scan stage dispatches once per chunk range.
// Everything goes in one submit, followed by one readback: Deno polls the device on a timer, so
// each host round trip costs about 10 ms whatever the work.

import type { GpuContext } from "./device.ts";
import { GpuError } from "./device.ts";
import { type BufferSet, UNIFORM_USAGE } from "./buffers.ts";
import { countSync } from "./tensor.ts";
import {
  type Plan,
  RANGE_BYTES,
  SCAN_STAGES,
  scanRanges,
  type Stage,
  stageGrid,
} from "./layout.ts";

/** What one submit runs and reads back. */
export interface PassJob {
  /** The call, for messages ("gpuForward"). */
  what: string;
  /** The call's plan. */
  plan: Plan;
  /** Group 0, every binding of the call. */
  bindGroup: GPUBindGroup;
  /** The stages, in order. */
  stages: readonly Stage[];
  /** Whether the scans run from the last chunk to the first. */
  reverse: boolean;
  /** The buffer to read back, and how many floats of it. */
  source: GPUBuffer;
  /** Floats to read back. */
  floats: number;
  /** The [offset, length] (floats) of each array to return, each copied once into its own buffer. */
  split: readonly (readonly [number, number])[];
  /** GPU-side copies into the job's buffers before the passes (inputs already on the device). */
  copiesIn?: readonly BufferCopy[];
  /**
   * Where the `split` arrays go on the device, one buffer each: then nothing is read back and the
   * call returns right after its submit (no host sync), with `arrays` empty.
   */
  targets?: readonly GPUBuffer[];
}

/** One buffer-to-buffer copy on the GPU, in bytes. */
export interface BufferCopy {
  /** Copied from, at byte 0. */
  source: GPUBuffer;
  /** Copied to. */
  target: GPUBuffer;
  /** Byte offset in the target. */
  targetOffset: number;
  /** Bytes (a multiple of 4). */
  bytes: number;
}

/** What a submit returned. */
export interface PassResult {
  /** The arrays read back, one per `split` entry, each owning its ArrayBuffer. */
  arrays: Float32Array[];
  /** GPU time of each stage in nanoseconds, when timing was asked and the device can (the
   * median over the repeats). */
  stageNs?: number[];
}

/** How a timed submit runs: the passes `repeat` times back to back, with or without reading the
 * data back (repeats keep the GPU busy, so its clocks settle; for the benchmark). */
export interface TimingOptions {
  /** Times to run the stages in the one submit. */
  repeat: number;
  /** Whether to read the data back (else `arrays` is empty). */
  readData: boolean;
}

/** The chunk-range uniforms of the scans, one per dispatch, and their bind group. */
function makeRanges(ctx: GpuContext, set: BufferSet, plan: Plan, reverse: boolean) {
  const ranges = scanRanges(plan);
  if (reverse) ranges.reverse();
  const stride = ctx.rangeAlign;
  const buffer = set.make("chunk ranges", (ranges.length * stride) / 4, UNIFORM_USAGE);
  const words = new Uint32Array((ranges.length * stride) / 4);
  ranges.forEach(([n0, n1], i) => words.set([n0, n1], (i * stride) / 4));
  ctx.device.queue.writeBuffer(buffer, 0, words);
  const bindGroup = ctx.device.createBindGroup({
    label: "kda chunk ranges",
    layout: ctx.rangeLayout,
    entries: [{ binding: 0, resource: { buffer, size: RANGE_BYTES } }],
  });
  return { bindGroup, count: ranges.length };
}

/**
 * Encodes the job's stages (one pass each), submits them with the copy to a staging buffer, and
 * reads the result back; with `timing` on a device with timestamp queries, also each stage's GPU
 * time. Buffers it creates go to `set` (the caller destroys them).
 *
 * @param ctx The device context.
 * @param set The call's buffers.
 * @param job What to run.
 * @param timing Whether to time the stages; options to repeat them without reading back.
 * @returns The floats read back, and the stage times.
 * @throws {GpuError} On a GPU error or a lost device (never returns numbers from a lost device).
 * @example
 * ```ts
 * // ForwardJob.run and BackwardJob.run are the callers: each builds a PassJob and runs it.
 * import { getContext } from "./device.ts";
 * import { ForwardJob } from "./calls.ts";
 * const job = await ForwardJob.create(await getContext(), {
 *   B: 1, T: 4, H: 1, K: 4, V: 4, scale: 0.5,
 *   q: new Float32Array(16).fill(0.1), k: new Float32Array(16).fill(0.5),
 *   v: new Float32Array(16).fill(1), g: new Float32Array(16).fill(-0.1),
 *   beta: new Float32Array(4).fill(0.5),
 * }, { chunkSize: 16 });
 * const { stageNs } = await job.run({ repeat: 2, readData: false }); // runPasses underneath
 * console.log(stageNs); // per-stage GPU ns where the device has timestamp queries
 * job.destroy();
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
  const resident = job.targets !== undefined;
  if (resident && timing !== false) throw new Error("internal: a resident job is never timed");
  const readData = resident ? false : typeof timing === "object" ? timing.readData : true;
  const nStages = job.stages.length;
  const nQueries = 2 * nStages * repeat;
  const dataBytes = readData ? job.floats * 4 : 0;
  // the staging buffer holds the data, then (8-byte aligned) the resolved timestamps
  const tsOffset = Math.ceil(dataBytes / 256) * 256;
  const stagingBytes = Math.max(16, timed ? tsOffset + nQueries * 8 : dataBytes);
  let querySet: GPUQuerySet | undefined;
  try {
    const staging = await ctx.scoped(`${job.what} (encoding ${job.stages.join(" -> ")})`, () => {
      const ranges = makeRanges(ctx, set, job.plan, job.reverse);
      const staging = resident ? null : set.make(
        `${job.what} staging`,
        stagingBytes / 4,
        GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      );
      let resolve: GPUBuffer | undefined;
      if (timed) {
        querySet = device.createQuerySet({ type: "timestamp", count: nQueries });
        resolve = set.make(
          `${job.what} timestamps`,
          nQueries * 2,
          GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
        );
      }
      const encoder = device.createCommandEncoder({ label: job.what });
      for (const c of job.copiesIn ?? []) {
        encoder.copyBufferToBuffer(c.source, 0, c.target, c.targetOffset, c.bytes);
      }
      for (let rep = 0; rep < repeat; rep++) {
        job.stages.forEach((stage, stageIndex) => {
          const i = rep * nStages + stageIndex;
          const pass = encoder.beginComputePass({
            label: stage,
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
          pass.setBindGroup(0, job.bindGroup);
          pass.setPipeline(ctx.pipelines.get(stage)!);
          const [x, y, z] = stageGrid(job.plan, stage);
          const count = SCAN_STAGES.has(stage) ? ranges.count : 1;
          for (let r = 0; r < count; r++) {
            pass.setBindGroup(1, ranges.bindGroup, [r * ctx.rangeAlign]);
            pass.dispatchWorkgroups(x, y, z);
          }
          pass.end();
        });
      }
      job.targets?.forEach((target, i) => {
        const [at, n] = job.split[i];
        if (n > 0) encoder.copyBufferToBuffer(job.source, at * 4, target, 0, n * 4);
      });
      if (staging !== null && dataBytes > 0) {
        encoder.copyBufferToBuffer(job.source, 0, staging, 0, dataBytes);
      }
      if (staging !== null && querySet !== undefined && resolve !== undefined) {
        encoder.resolveQuerySet(querySet, 0, nQueries, resolve, 0);
        encoder.copyBufferToBuffer(resolve, 0, staging, tsOffset, nQueries * 8);
      }
      device.queue.submit([encoder.finish()]);
      return staging;
    });
    // On the device the results wait for the next call or read: queue order keeps them valid.
    if (staging === null) return { arrays: [] };
    try {
      countSync();
      await staging.mapAsync(GPUMapMode.READ, 0, stagingBytes);
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
    const mapped = staging.getMappedRange(0, stagingBytes);
    const arrays = readData
      ? job.split.map(([at, n]) => new Float32Array(mapped, at * 4, n).slice())
      : [];
    let stageNs: number[] | undefined;
    if (timed) {
      const ticks = new BigUint64Array(mapped.slice(tsOffset, tsOffset + nQueries * 8));
      stageNs = job.stages.map((_, stageIndex) => {
        const all = Array.from({ length: repeat }, (_, rep) => {
          const i = rep * nStages + stageIndex;
          return Number(ticks[2 * i + 1] - ticks[2 * i]);
        }).sort((a, b) => a - b);
        return all[all.length >> 1];
      });
    }
    staging.unmap();
    return stageNs === undefined ? { arrays } : { arrays, stageNs };
  } finally {
    querySet?.destroy();
  }
}
