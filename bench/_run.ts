// What the gpu benchmarks share: a kernel set's forward job and the backward job on what it saved,
// on inputs uploaded once, with every GPU resource freed on every path, so that a failing run
// does not leak buffers into the next; the median of timed runs; a results file's name.

import type { ChunkSize, KdaProblem } from "../kda/_types.ts";
import { gpuCreatedBytes, gpuPool } from "../kda/gpu/buffers.ts";
import { getContext } from "../kda/gpu/device.ts";
import { BackwardJob, ForwardJob } from "../kda/gpu/job.ts";
import type { KernelSet } from "../kda/gpu/kernel_set.ts";
import { type DeviceTensor, releaseTensors, toGpu } from "../kda/gpu/tensor.ts";

/**
 * Uploads a problem's arrays as DeviceTensors (release them with releaseTensors).
 *
 * @param x The problem, f32.
 * @returns The same problem on the device.
 */
export async function uploadProblem(
  x: KdaProblem<Float32Array>,
): Promise<KdaProblem<DeviceTensor>> {
  const { B, T, H, K, V, h0: _, aLog: _a, dtBias: _d, ...dims } = x;
  return {
    ...dims,
    B,
    T,
    H,
    K,
    V,
    q: await toGpu(x.q, [B, T, H, K]),
    k: await toGpu(x.k, [B, T, H, K]),
    v: await toGpu(x.v, [B, T, H, V]),
    g: await toGpu(x.g, [B, T, H, K]),
    beta: await toGpu(x.beta, [B, T, H]),
    ...(x.h0 !== undefined ? { h0: await toGpu(x.h0, [B, H, K, V]) } : {}),
  };
}

/**
 * Builds a set's forward job on the inputs (saving for the backward) and runs `onForward` with
 * it, then builds the backward job on what the forward saved and runs `onBackward` with both
 * jobs. Everything is freed afterwards, also when a step throws.
 *
 * @param set The kernel set.
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
 *   set,
 *   x,
 *   dout,
 *   64,
 *   async (fjob) => (await fjob.run({ timing: true })).stageNs,
 *   async (bjob) => (await bjob.run({ timing: true })).stageNs,
 * );
 * ```
 */
export async function withGpuJobs<F, R>(
  set: KernelSet,
  x: KdaProblem<Float32Array>,
  dout: Float32Array,
  chunkSize: ChunkSize,
  onForward: (fjob: ForwardJob) => Promise<F>,
  onBackward: (bjob: BackwardJob, fjob: ForwardJob) => Promise<R>,
): Promise<[F, R]> {
  const ctx = await getContext();
  const device = await uploadProblem(x);
  const cot = await toGpu(dout, [x.B, x.T, x.H, x.V]);
  try {
    const fjob = await ForwardJob.create(ctx, set, device, { chunkSize, saveForBackward: true });
    try {
      const forward = await onForward(fjob);
      const saved = fjob.takeSaved();
      try {
        const bjob = await BackwardJob.create(saved, { dout: cot });
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
  } finally {
    releaseTensors(device, cot);
  }
}

/**
 * n floats of a smooth wave, sin(0.37 i) scale: inputs that need no random generator, so that two
 * runs (and two benchmarks) see the same bytes.
 *
 * @param n The length.
 * @param scale The amplitude.
 * @returns The wave.
 */
export function wave(n: number, scale: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.sin(i * 0.37) * scale;
  return a;
}

/**
 * The host benchmarks' problem at a shape, from waves: g <= 0 (gates that decay), beta in
 * (0.05, 0.95), scale 1 / sqrt(K).
 *
 * @param dims B, T, H, K, V.
 * @returns The problem, f32.
 */
export function waveProblem(
  dims: { B: number; T: number; H: number; K: number; V: number },
): KdaProblem<Float32Array> {
  const { B, T, H, K, V } = dims;
  const rows = B * T * H;
  return {
    B,
    T,
    H,
    K,
    V,
    scale: 1 / Math.sqrt(K),
    q: wave(rows * K, 0.5),
    k: wave(rows * K, 0.1),
    v: wave(rows * V, 0.5),
    g: wave(rows * K, 0.01).map((a) => -Math.abs(a)),
    beta: wave(rows, 0.45).map((b) => 0.5 + b),
  };
}

/**
 * The median of some numbers (the upper one of the middle two for an even count; NaN for none).
 *
 * @param xs The numbers.
 * @returns Their median.
 */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)];
}

/**
 * Host wall of `run`: one warm-up run (pipelines compiled, buffers pooled), then the median of
 * `n` timed runs, in milliseconds.
 *
 * @param n Timed runs.
 * @param run The work.
 * @returns The median wall.
 */
export async function timed(n: number, run: () => Promise<void>): Promise<number> {
  await run();
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await run();
    ms.push(performance.now() - t0);
  }
  return median(ms);
}

/**
 * An adapter's description as a file name part ("NVIDIA H200" -> "nvidia-h200").
 *
 * @param text The description.
 * @returns The slug.
 */
export function slug(text: string): string {
  return text.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "");
}

/**
 * Bytes of GPU buffers `step` creates from an empty pool (every buffer it needs, made new); the
 * pool's bound is restored after.
 *
 * @param step The work; what it returns (to read back after the count) is passed on.
 * @returns Its result and the bytes.
 */
export async function coldBytes<R>(step: () => Promise<R>): Promise<[R, number]> {
  const bound = gpuPool().isDefault ? null : gpuPool().maxBytes;
  gpuPool({ maxBytes: 0 });
  gpuPool({ maxBytes: bound });
  const before = gpuCreatedBytes();
  const result = await step();
  return [result, gpuCreatedBytes() - before];
}

/**
 * Seeded inputs of a shape, the same for every benchmark: q, v uniform in ±0.5, k the same
 * L2-normalised per row, g in [log 0.9, 0], beta in [0.02, 0.98], scale K^(-1/2).
 *
 * @param s The shape.
 * @param seed The seed.
 * @returns The problem, f32.
 */
export function randomInputs(
  s: { B: number; T: number; H: number; K: number; V: number },
  seed: number,
): KdaProblem<Float32Array> {
  let state = seed >>> 0;
  const rand = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state / 4294967296;
  };
  const fill = (n: number, f: () => number) => {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = f();
    return a;
  };
  const { B, T, H, K, V } = s;
  const k = fill(B * T * H * K, () => rand() - 0.5);
  for (let row = 0; row < B * T * H; row++) {
    let ss = 0;
    for (let d = 0; d < K; d++) ss += k[row * K + d] ** 2;
    for (let d = 0; d < K; d++) k[row * K + d] /= Math.sqrt(ss);
  }
  return {
    B,
    T,
    H,
    K,
    V,
    scale: 1 / Math.sqrt(K),
    q: fill(B * T * H * K, () => rand() - 0.5),
    k,
    v: fill(B * T * H * V, () => rand() - 0.5),
    g: fill(B * T * H * K, () => Math.log(0.9) * rand()),
    beta: fill(B * T * H, () => 0.02 + 0.96 * rand()),
  };
}
