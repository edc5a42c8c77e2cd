// What the gpu benchmarks share: a forward job and the backward job on what it saved, with every
// GPU resource freed on every path, so that a failing run does not leak buffers into the next.

import type { ChunkSize, KdaProblem } from "../kda/_types.ts";
import { getContext } from "../kda/gpu/device.ts";
import { BackwardJob, ForwardJob } from "../kda/gpu/calls.ts";

/**
 * Builds a forward job on the inputs (saving for the backward) and runs `onForward` with it, then
 * builds the backward job on what the forward saved and runs `onBackward` with both jobs. The
 * backward job, the saved state and the forward job are freed afterwards, also when a step throws.
 *
 * @param x The inputs, f32.
 * @param dout The cotangent of the output.
 * @param chunkSize The chunk size.
 * @param onForward Runs the forward job; it must run it at least once, since the backward reads
 * what that run saved.
 * @param onBackward Runs the backward job (and the forward job again, if it wants).
 * @returns What `onForward` and `onBackward` returned, in that order.
 *
 * @example Usage
 * ```ts ignore
 * import { withGpuJobs } from "./_run.ts";
 *
 * const [fwd, bwd] = await withGpuJobs(
 *   x,
 *   dout,
 *   64,
 *   async (fjob) => (await fjob.run(true)).stageNs,
 *   async (bjob) => (await bjob.run(true)).stageNs,
 * );
 * ```
 */
export async function withGpuJobs<F, R>(
  x: KdaProblem<Float32Array>,
  dout: Float32Array,
  chunkSize: ChunkSize,
  onForward: (fjob: ForwardJob) => Promise<F>,
  onBackward: (bjob: BackwardJob, fjob: ForwardJob) => Promise<R>,
): Promise<[F, R]> {
  const ctx = await getContext();
  const fjob = await ForwardJob.create(ctx, x, { chunkSize, saveForBackward: true });
  try {
    const forward = await onForward(fjob);
    const saved = fjob.takeSaved();
    try {
      const bjob = await BackwardJob.create(saved, dout, undefined, false);
      try {
        return [forward, await onBackward(bjob, fjob)];
      } finally {
        bjob.destroy();
      }
    } finally {
      saved.release();
    }
  } finally {
    fjob.destroy();
  }
}
