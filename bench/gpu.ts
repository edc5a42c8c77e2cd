// Benchmark of the `gpu` arm, per shape:
//   - the GPU kernel time of each stage and their total (timestamp queries, one compute pass per
//     stage, when the adapter has `timestamp-query`), steady state: the stages run REPEAT times
//     back to back in one submit and each stage's median is kept, after a warm-up that lets the
//     GPU's clocks settle (single-submit times, with a readback between runs, are recorded too);
//   - host wall-clock with the inputs already on the GPU (one submit + one readback), and end to
//     end from typed arrays (kda, kdaVjp as a user calls them: checked copies, upload, run, read
//     back; the median after a first call, whose wall is kept too);
//   - effective TFLOP/s (formula below) and GB/s against the bytes that must move.
// Writes bench/results/<adapter-slug>-<YYYY-MM-DD>.json; bench/report.ts turns every results
// file into bench/results/REPORT.md and the SVG charts.
//
// Run: deno run --allow-env --allow-read --allow-write bench/gpu.ts [--quick] [--runs=N]
//   --quick   a small subset with few runs (for the software adapter: minutes, not hours)
//   --groups=issue,sweep,chunk   only these groups of shapes
//   --kernels=a,b   the kernel sets to time side by side (default: every registered set that
//                   has a backward)
//   --pool=BYTES   the buffer pool's bound (gpuPool; default: the package's default)
//   --only=kernels   kernel times alone (no end-to-end or GpuTensor-step walls)
//   --only=steps     the GpuTensor-step walls and kernel times, no typed-array walls

import type { ChunkSize, KdaProblem } from "../kda/_types.ts";
import { gpuStatus, gpuUnsupportedReason, kernelSet, kernelSetNames } from "../kda/gpu/mod.ts";
import type { BackwardJob, ForwardJob } from "../kda/gpu/job.ts";
import type { KernelSet } from "../kda/gpu/kernel_set.ts";
import { makePlan } from "../kda/gpu/layout.ts";
import { coldBytes, median, randomInputs, slug, withGpuJobs } from "./_run.ts";
import { checkBenchArgs } from "./_args.ts";
import { kda, kdaVjp } from "../kda/op/op.ts";
import { gpuDevice, type GpuTensor, releaseTensors, toGpu } from "../kda/gpu/tensor.ts";
import { gpuCreatedBytes, gpuPool } from "../kda/gpu/buffers.ts";
import { toGpuInputs } from "../kda/op/device_inputs.ts";

/** One benchmarked problem. */
export interface BenchShape {
  /** Group of the shape in the report ("issue", "sweep", "chunk"). */
  group: string;
  B: number;
  T: number;
  H: number;
  K: number;
  V: number;
  C: ChunkSize;
}

const FULL: BenchShape[] = [
  { group: "issue", B: 2, T: 256, H: 2, K: 32, V: 32, C: 16 },
  { group: "issue", B: 1, T: 4096, H: 2, K: 128, V: 128, C: 64 },
  { group: "issue", B: 4, T: 4096, H: 16, K: 128, V: 128, C: 64 },
  { group: "issue", B: 8, T: 4096, H: 16, K: 128, V: 128, C: 64 },
  ...[1024, 2048, 4096, 8192, 16384].map((T) => ({
    group: "sweep",
    B: 1,
    T,
    H: 16,
    K: 128,
    V: 128,
    C: 64 as ChunkSize,
  })),
  ...([16, 32] as ChunkSize[]).map((C) => ({
    group: "chunk",
    B: 4,
    T: 4096,
    H: 16,
    K: 128,
    V: 128,
    C,
  })),
];

const QUICK: BenchShape[] = [
  { group: "issue", B: 2, T: 256, H: 2, K: 32, V: 32, C: 16 },
  { group: "issue", B: 1, T: 4096, H: 2, K: 128, V: 128, C: 64 },
  ...[1024, 2048].map((T) => ({
    group: "sweep",
    B: 1,
    T,
    H: 2,
    K: 128,
    V: 128,
    C: 64 as ChunkSize,
  })),
  ...([16, 32] as ChunkSize[]).map((C) => ({
    group: "chunk",
    B: 1,
    T: 4096,
    H: 2,
    K: 128,
    V: 128,
    C,
  })),
];

/**
 * Useful multiply-adds of the chunked forward per chunk (docs 2.2), at C tokens, K, V:
 * L and P (lower triangles, C²K/2 each), T = (I+L)^-1 (C³/6), W (C²K/2), U (C²V/2),
 * Vn = U − W S (CKV), O = Qg S + P Vn (CKV + C²V/2), S' = γS + Kdᵀ Vn (CKV).
 *
 * @param s The shape.
 * @returns FLOPs (2 per multiply-add) of one forward.
 */
export function forwardFlops(s: BenchShape): number {
  const { B, T, H, K, V, C } = s;
  const macs = 3 * C * K * V + 1.5 * C * C * K + C * C * V + (C * C * C) / 6;
  return 2 * macs * B * H * Math.ceil(T / C);
}

/**
 * Useful multiply-adds of the chunked backward per chunk (docs 2.3): the recomputed Vn (CKV);
 * dKd, dVn, dQΓ, dS (two terms) and dW (5 CKV); dP and Pᵀ dO (C²V); dT (C²K/2 + C²V/2), dKβ
 * (C²K/2), dVβ (C²V/2); dL = −Tᵀ dT Tᵀ (C³/3); the pairwise pieces XL, XP and the four row and
 * column sums of dK, dQ (3 C²K).
 *
 * @param s The shape.
 * @returns FLOPs (2 per multiply-add) of one backward.
 */
export function backwardFlops(s: BenchShape): number {
  const { B, T, H, K, V, C } = s;
  const macs = 6 * C * K * V + 4 * C * C * K + 2 * C * C * V + (C * C * C) / 3;
  return 2 * macs * B * H * Math.ceil(T / C);
}

/**
 * Bytes that must move: each input read once and each output written once, in f32.
 *
 * @param s The shape.
 * @returns Forward and backward bytes.
 */
export function mustMoveBytes(s: BenchShape): { forward: number; backward: number } {
  const { B, T, H, K, V } = s;
  const nQK = B * T * H * K, nV = B * T * H * V, nB = B * T * H, nS = B * H * K * V;
  const inputs = 3 * nQK + nV + nB;
  return {
    forward: 4 * (inputs + nV + nS),
    // inputs and dout in, six gradients out
    backward: 4 * (inputs + nV + 3 * nQK + nV + nB + nS),
  };
}

/** --only=kernels or --only=steps, else undefined. */
const ONLY = Deno.args.find((a) => a.startsWith("--only="))?.slice(7);
if (import.meta.main) {
  checkBenchArgs("bench:gpu", Deno.args, {
    valued: ["runs", "pool", "groups", "kernels", "only"],
    // --pool=0 turns the pool off (gpuPool)
    integers: { runs: { min: 1 }, pool: { min: 0 } },
    bare: ["quick"],
  });
  if (ONLY !== undefined && ONLY !== "kernels" && ONLY !== "steps") {
    console.error(`bench:gpu: --only must be kernels or steps: got ${ONLY}`);
    Deno.exit(2);
  }
}

/** Whether only the kernel times are measured (--only=kernels). */
const KERNELS_ONLY = ONLY === "kernels";
/** Whether the typed-array walls are skipped and the resident walls run once (--only=steps). */
const STEPS_ONLY = ONLY === "steps";

/** Steps chained on GpuTensors with one read at the end, for the per-step wall. */
const CHAIN = 10;

/** Repeats of the stages in the one submit that measures steady-state kernel time. */
const REPEAT = 8;

/** GPU time of warm-up submits before the steady-state kernel time is taken, in ms. */
const WARM_GPU_MS = 250;
/** Wall time after which the warm-up stops however little GPU time it ran (small shapes), in ms. */
const WARM_WALL_MS = 400;
/** Steady-state submits measured after the warm-up; the one with the median total is kept. */
const STEADY_RUNS = 3;

/**
 * The per-stage steady-state kernel time (ns) of a job: steady submits until WARM_GPU_MS of GPU
 * time (or WARM_WALL_MS of wall) have run, so that the GPU's clocks have left the state an idle
 * spell (a readback before) left them in, then STEADY_RUNS submits, of which the one with the
 * median total is kept. Taken right after a readback, the forward's stages at (4, 4096, 16, 128)
 * once read 2.5 times their settled time (bench/results/ANALYSIS.md, thirteenth pass).
 *
 * @param run One steady submit, returning its per-stage times in ns (undefined without timestamps).
 * @returns The kept submit's per-stage times, or undefined without timestamps.
 */
async function steadyStages(
  run: () => Promise<number[] | undefined>,
): Promise<number[] | undefined> {
  const total = (ns: number[]) => ns.reduce((a, b) => a + b, 0);
  const t0 = performance.now();
  let gpuMs = 0;
  do {
    const ns = await run();
    if (ns === undefined) return undefined;
    gpuMs += total(ns) / 1e6;
  } while (gpuMs < WARM_GPU_MS && performance.now() - t0 < WARM_WALL_MS);
  const kept: number[][] = [];
  for (let i = 0; i < STEADY_RUNS; i++) {
    const ns = await run();
    if (ns === undefined) return undefined;
    kept.push(ns);
  }
  kept.sort((a, b) => total(a) - total(b));
  return kept[Math.floor(kept.length / 2)];
}

async function timeRuns(
  runs: number,
  budgetMs: number,
  run: () => Promise<number[] | undefined>,
): Promise<
  {
    wallMs: number;
    firstMs: number;
    stageMs: number[] | null;
    totalMinMs: number | null;
    runs: number;
  }
> {
  // warm-up (pipelines, first allocations); its wall is kept as the first call's
  const first = performance.now();
  await run();
  const firstMs = performance.now() - first;
  const walls: number[] = [];
  const stages: number[][] = [];
  const start = performance.now();
  while (walls.length < runs && (walls.length < 2 || performance.now() - start < budgetMs)) {
    const t0 = performance.now();
    const ns = await run();
    walls.push(performance.now() - t0);
    if (ns !== undefined) stages.push(ns);
  }
  const stageMs = stages.length === 0
    ? null
    : stages[0].map((_, i) => median(stages.map((s) => s[i])) / 1e6);
  // the fastest run's total: the GPU's clocks ramp between runs, so the median also carries that
  const totalMinMs = stages.length === 0
    ? null
    : Math.min(...stages.map((s) => s.reduce((a, b) => a + b, 0))) / 1e6;
  return { wallMs: median(walls), firstMs, stageMs, totalMinMs, runs: walls.length };
}

/**
 * Host wall of kda and kdaVjp on GpuTensors, each with the one read a step needs, and the bytes of
 * buffers one kdaVjp creates in the steady state (after the first steps filled the pool).
 */
async function onDeviceWall(
  s: BenchShape,
  kernels: string,
  x: KdaProblem<Float32Array>,
  dout: Float32Array,
  runs: number,
  budgetMs: number,
): Promise<{
  forward: number;
  forwardBackward: number;
  chainedForward: number;
  chainedForwardBackward: number;
  createdBytesPerVjp: number;
  coldBytesPerVjp: number;
}> {
  const { B, T, H, V } = s;
  const inputs = await toGpuInputs(x);
  const cotangent = await toGpu(dout, [B, T, H, V]);
  const options = { arm: "gpu", strict: true, chunkSize: s.C, kernels } as const;
  try {
    const forward = await timeRuns(runs, budgetMs, async () => {
      const { o, ht } = await kda(inputs, options);
      await ht.read();
      o.release();
      ht.release();
      return undefined;
    });
    const both = await timeRuns(runs, budgetMs, async () => {
      const grads = await kdaVjp(inputs, { dout: cotangent }, options);
      await grads.dbeta.read();
      releaseTensors(grads);
      return undefined;
    });
    // CHAIN steps queued back to back, one read at the end: the wall per step of a training loop
    // that reads once in a while (as the issue's figures were taken)
    const chainedForward = await timeRuns(3, budgetMs, async () => {
      let last: Awaited<ReturnType<typeof kda<GpuTensor>>> | null = null;
      for (let i = 0; i < CHAIN; i++) {
        if (last !== null) releaseTensors(last);
        last = await kda(inputs, options);
      }
      await last!.ht.read();
      releaseTensors(last);
      return undefined;
    });
    const chainedBoth = await timeRuns(3, budgetMs, async () => {
      let last: Awaited<ReturnType<typeof kdaVjp<GpuTensor>>> | null = null;
      for (let i = 0; i < CHAIN; i++) {
        if (last !== null) releaseTensors(last);
        last = await kdaVjp(inputs, { dout: cotangent }, options);
      }
      await last!.dbeta.read();
      releaseTensors(last);
      return undefined;
    });
    const created = async () => {
      const before = gpuCreatedBytes();
      const grads = await kdaVjp(inputs, { dout: cotangent }, options);
      const bytes = gpuCreatedBytes() - before;
      await grads.dbeta.read();
      releaseTensors(grads);
      return bytes;
    };
    const createdBytesPerVjp = await created();
    // with the pool emptied first: every buffer one kdaVjp needs, its gradients included (its
    // footprint on the device beyond the inputs)
    const [grads, coldBytesPerVjp] = await coldBytes(() =>
      kdaVjp(inputs, { dout: cotangent }, options)
    );
    await grads.dbeta.read();
    releaseTensors(grads);
    return {
      forward: forward.wallMs,
      forwardBackward: both.wallMs,
      chainedForward: chainedForward.wallMs / CHAIN,
      chainedForwardBackward: chainedBoth.wallMs / CHAIN,
      createdBytesPerVjp,
      coldBytesPerVjp,
    };
  } finally {
    releaseTensors(inputs, cotangent);
  }
}

const fmt = (ms: number | null | undefined) => ms == null ? "—" : ms.toFixed(ms < 10 ? 3 : 1);

/** Times one shape with one kernel set; returns its results row. */
async function benchShape(
  s: BenchShape,
  set: KernelSet,
  runs: number,
  budgetMs: number,
): Promise<Record<string, unknown>> {
  const { B, T, H, K, V, C } = s;
  const kernels = set.name;
  const label = `(${B}, ${T}, ${H}, ${K}) C=${C} ${kernels}`;
  const reason = gpuUnsupportedReason(s, C, kernels);
  if (reason !== null) {
    console.log(`${label}: skipped (${reason})`);
    return { ...s, kernels, skipped: reason };
  }
  // the stages this shape runs (a set's stage may run for some calls only)
  const plan = makePlan(set, s, C);
  const runs_ = (st: { when?: (p: typeof plan) => boolean }) => st.when?.(plan) ?? true;
  const FORWARD_STAGES = set.forward.stages.filter(runs_).map((st) => st.entry);
  const BACKWARD_STAGES = set.backward?.stages.filter(runs_).map((st) => st.entry) ?? [];
  try {
    const x = randomInputs(s, 1);
    const dout = new Float32Array(B * T * H * V).fill(0.01);
    // end to end from typed arrays (not with --only=kernels)
    const none = { wallMs: NaN, firstMs: NaN, stageMs: null, totalMinMs: null, runs: 0 };
    const skipTyped = KERNELS_ONLY || STEPS_ONLY;
    // the public calls, as a user makes them (checked copies, upload, run, read back)
    const typed = { arm: "gpu", strict: true, quiet: true, chunkSize: C, kernels } as const;
    const e2eFwd = skipTyped ? none : await timeRuns(runs, budgetMs, async () => {
      await kda(x, typed);
      return undefined;
    });
    const e2eBoth = skipTyped ? none : await timeRuns(runs, budgetMs, async () => {
      await kdaVjp(x, { dout }, typed);
      return undefined;
    });
    // inputs resident: one submit + one readback per run, stages timed on the GPU; then the
    // steady-state kernel time: the stages REPEAT times back to back in one submit (no
    // readback between), median per stage, after a warm-up that keeps the GPU busy long enough
    // for its clocks to settle (steadyStages)
    const steady = { timing: { repeat: REPEAT, readData: false } };
    const time = async (job: ForwardJob | BackwardJob) => {
      const timed = await timeRuns(
        STEPS_ONLY ? 1 : runs,
        budgetMs,
        async () => (await job.run({ timing: true })).stageNs,
      );
      return [timed, await steadyStages(async () => (await job.run(steady)).stageNs)] as const;
    };
    const [[fwd, fwdSteady], [bwd, bwdSteady]] = await withGpuJobs(set, x, dout, C, time, time);
    const device = KERNELS_ONLY
      ? {
        forward: NaN,
        forwardBackward: NaN,
        chainedForward: NaN,
        chainedForwardBackward: NaN,
        createdBytesPerVjp: NaN,
        coldBytesPerVjp: NaN,
      }
      : await onDeviceWall(s, kernels, x, dout, runs, budgetMs);
    const sum = (xs: number[] | null | undefined) => xs ? xs.reduce((a, b) => a + b, 0) : null;
    const steadyMs = [...(fwdSteady ?? []), ...(bwdSteady ?? [])].map((ns) => ns / 1e6);
    const kFwd = fwdSteady ? sum(fwdSteady)! / 1e6 : null;
    const kBwd = bwdSteady ? sum(bwdSteady)! / 1e6 : null;
    const flops = { forward: forwardFlops(s), backward: backwardFlops(s) };
    const bytes = mustMoveBytes(s);
    const tflops = (f: number, ms: number | null) => ms === null ? null : f / (ms * 1e-3) / 1e12;
    const gbps = (b: number, ms: number | null) => ms === null ? null : b / (ms * 1e-3) / 1e9;
    const r = {
      ...s,
      kernels,
      kernelMs: {
        forward: kFwd,
        backward: kBwd,
        total: kFwd !== null && kBwd !== null ? kFwd + kBwd : null,
        repeat: REPEAT,
        stages: Object.fromEntries(
          [...FORWARD_STAGES, ...BACKWARD_STAGES].map((st, i) => [st, steadyMs[i] ?? null]),
        ),
      },
      // the same stages timed in single submits with a readback between (clocks may drop)
      singleSubmitKernelMs: {
        forward: sum(fwd.stageMs),
        backward: sum(bwd.stageMs),
        forwardMin: fwd.totalMinMs,
        backwardMin: bwd.totalMinMs,
      },
      residentMs: { forward: fwd.wallMs, backward: bwd.wallMs },
      // kda / kdaVjp on GpuTensors, each followed by the one host sync a step pays (reading
      // ht, or dbeta): the host wall of a chained training step
      deviceMs: device,
      endToEndMs: {
        forward: e2eFwd.wallMs,
        forwardBackward: e2eBoth.wallMs,
        firstForward: e2eFwd.firstMs,
        firstForwardBackward: e2eBoth.firstMs,
      },
      runs: { e2e: e2eFwd.runs, resident: fwd.runs },
      flops,
      tflops: {
        forward: tflops(flops.forward, kFwd),
        forwardBackward: tflops(
          flops.forward + flops.backward,
          kFwd !== null && kBwd !== null ? kFwd + kBwd : null,
        ),
      },
      bytes,
      gbps: { forward: gbps(bytes.forward, kFwd), backward: gbps(bytes.backward, kBwd) },
    };
    const st = r.kernelMs.stages as Record<string, number | null>;
    console.log(
      `${label}: kernel fwd ${fmt(kFwd)} ms [${
        FORWARD_STAGES.map((n) => `${n} ${fmt(st[n])}`).join(", ")
      }], bwd ${fmt(kBwd)} ms [${BACKWARD_STAGES.map((n) => `${n} ${fmt(st[n])}`).join(", ")}]`,
    );
    console.log(
      `    resident wall fwd ${fmt(fwd.wallMs)} / bwd ${fmt(bwd.wallMs)} ms; GpuTensor step fwd ` +
        `${fmt(device.forward)} / fwd+bwd ${fmt(device.forwardBackward)} ms (chained ` +
        `${fmt(device.chainedForward)} / ${
          fmt(device.chainedForwardBackward)
        } ms a step); end to end fwd ` +
        `${fmt(e2eFwd.wallMs)} / fwd+bwd ${fmt(e2eBoth.wallMs)} ms; ` +
        `${r.tflops.forward?.toPrecision(3) ?? "—"} TFLOP/s fwd, ` +
        `${r.tflops.forwardBackward?.toPrecision(3) ?? "—"} fwd+bwd; ` +
        `${r.gbps.forward?.toPrecision(3) ?? "—"} GB/s fwd (kernel time vs must-move bytes); ` +
        `single-submit kernel fwd ${fmt(r.singleSubmitKernelMs.forward)} / bwd ` +
        `${fmt(r.singleSubmitKernelMs.backward)} ms`,
    );
    return r;
  } catch (error) {
    const why = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    console.log(`${label}: failed (${why})`);
    return { ...s, kernels, failed: why };
  }
}

/** Runs the benchmark; returns the results object written to JSON. */
async function main(): Promise<void> {
  const quick = Deno.args.includes("--quick");
  const runsArg = Deno.args.find((a) => a.startsWith("--runs="));
  const runs = runsArg ? Number(runsArg.slice(7)) : quick ? 3 : 10;
  const budgetMs = quick ? 20000 : 8000;
  const status = await gpuStatus();
  if (!status.available) {
    console.error(`No GPU: ${status.reason}`);
    Deno.exit(1);
  }
  const info = status.info;
  console.log(
    `adapter: ${info.description} (vendor ${info.vendor}, software ${info.software}, ` +
      `timestamps ${info.timestamps})${quick ? ", quick subset" : ""}`,
  );
  const poolArg = Deno.args.find((a) => a.startsWith("--pool="));
  if (poolArg !== undefined) gpuPool({ maxBytes: Number(poolArg.slice(7)) });
  // the pool's default bound exists once the device does
  await gpuDevice();
  const poolBytes = gpuPool().maxBytes;
  const groupsArg = Deno.args.find((a) => a.startsWith("--groups="));
  const groups = groupsArg ? groupsArg.slice(9).split(",") : null;
  const kernelsArg = Deno.args.find((a) => a.startsWith("--kernels="));
  // by default every set that trains (a forward-only set, like the decode set, has nothing to time here)
  const sets: KernelSet[] = kernelsArg
    ? kernelsArg.slice(10).split(",").map((name) => kernelSet(name, "--kernels"))
    : kernelSetNames().map((name) => kernelSet(name)).filter((set) => set.backward !== null);
  const shapes = (quick ? QUICK : FULL).filter((s) => groups === null || groups.includes(s.group));
  const results: Record<string, unknown>[] = [];
  for (const s of shapes) {
    for (const set of sets) {
      results.push(await benchShape(s, set, runs, budgetMs));
    }
  }
  const date = new Date().toISOString().slice(0, 10);
  const dir = new URL("./results/", import.meta.url);
  await Deno.mkdir(dir, { recursive: true });
  const name = Deno.env.get("KDA_BENCH_OUT") ??
    new URL(`${slug(info.description)}-${date}.json`, dir).pathname;
  const doc = {
    adapter: info,
    date: new Date().toISOString(),
    deno: Deno.version.deno,
    quick,
    runs,
    poolMaxBytes: poolBytes,
    results,
  };
  await Deno.writeTextFile(name, JSON.stringify(doc, null, 2) + "\n");
  console.log(`wrote ${name}`);
}

if (import.meta.main) await main();
