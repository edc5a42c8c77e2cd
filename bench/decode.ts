// deno task bench:decode: tokens per second of decoding with kdaStep (docs/kda.md 2.7) at
// H = 16, K = V = 128, f32, for B = 1 and 32 sequences and T tokens per call:
//   - device loop: the gpu arm on GpuTensors, CALLS calls in a row with the state chained as a
//     DeviceTensor and one readback at the end (what a decode loop on the device pays);
//     tokens/s = B·T·CALLS / wall seconds;
//   - kernel: the decode set's stage alone, timed on the GPU by timestamp queries where the
//     adapter has them, REPEAT times back to back in one submit (median); tokens/s = B·T / kernel
//     seconds;
//   - typed arrays: the gpu arm from Float32Arrays, one upload and one readback per call;
//   - cpu: the cpu arm from Float32Arrays (f64 inside).
// Each figure is the median over its runs. Writes bench/results/<adapter>-<YYYY-MM-DD>-decode.json
// (KDA_BENCH_OUT overrides the path).
//
// Run: deno run --allow-env --allow-read --allow-write=bench/results bench/decode.ts [flags]
//   --quick          few calls and runs (for the software adapter)
//   --batches=1,32   the batch sizes
//   --tokens=1,16    tokens per call
//   --calls=N        calls per device loop (default 64, quick 4)
//   --runs=N         timed runs per figure (default 5, quick 2)
//   --no-cpu         skip the cpu arm (slow at B = 32)

import { kdaStep, type KdaStepToken } from "../kda/op/step.ts";
import { gpuStatus, kernelSet } from "../kda/gpu/mod.ts";
import { DECODE_KERNELS } from "../kda/gpu/kernels/mod.ts";
import { getContext } from "../kda/gpu/device.ts";
import { ForwardJob } from "../kda/gpu/job.ts";
import { type DeviceTensor, releaseTensors, toGpu } from "../kda/gpu/tensor.ts";
import { mulberry32, normal } from "../kda/layer/_random.ts";
import { median, slug, timed, uploadProblem } from "./_run.ts";
import { checkBenchArgs } from "./_args.ts";

const H = 16, K = 128, V = 128;
const REPEAT = 20;

function flag(name: string): string | undefined {
  return Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
}

checkBenchArgs("bench:decode", Deno.args, {
  valued: ["batches", "tokens", "calls", "runs"],
  integers: {
    batches: { min: 1, list: true },
    tokens: { min: 1, list: true },
    calls: { min: 1 },
    runs: { min: 1 },
  },
  bare: ["quick", "no-cpu"],
});
const quick = Deno.args.includes("--quick");
const batches = (flag("batches") ?? "1,32").split(",").map(Number);
const tokensPerCall = (flag("tokens") ?? "1,16").split(",").map(Number);
const calls = Number(flag("calls") ?? (quick ? 4 : 64));
const runs = Number(flag("runs") ?? (quick ? 2 : 5));
const withCpu = !Deno.args.includes("--no-cpu");

/** The tokens of one call: q, k [B, T, H, K] (k of unit length), v, g, beta as a model makes. */
function tokens(B: number, T: number, seed: number): KdaStepToken<Float32Array> {
  const rand = mulberry32(seed), gauss = normal(rand);
  const make = (n: number, f: () => number) => Float32Array.from({ length: n }, f);
  const k = make(B * T * H * K, gauss);
  for (let r = 0; r < B * T * H; r++) {
    let s = 0;
    for (let d = 0; d < K; d++) s += k[r * K + d] ** 2;
    for (let d = 0; d < K; d++) k[r * K + d] /= Math.sqrt(s);
  }
  return {
    B,
    T,
    H,
    K,
    V,
    q: make(B * T * H * K, gauss),
    k,
    v: make(B * T * H * V, gauss),
    g: make(B * T * H * K, () => Math.log(0.9) * rand()),
    beta: make(B * T * H, rand),
  };
}

/** One row of results: the tokens per second of each way, and the milliseconds behind them. */
async function benchShape(B: number, T: number): Promise<Record<string, unknown>> {
  const label = `B=${B} T=${T} H=${H} K=V=${K}`;
  const host = tokens(B, T, 7);
  const state0 = Float32Array.from({ length: B * H * K * V }, (_, i) => 0.01 * Math.sin(i));
  const perCall = B * T;
  const row: Record<string, unknown> = { B, T, H, K, V, tokensPerCall: perCall, calls };

  // device loop: every call's tokens uploaded once, outside the timed region
  const shape = (w: number) => [B, T, H, w];
  const q = await toGpu(host.q, shape(K)), k = await toGpu(host.k, shape(K));
  const v = await toGpu(host.v, shape(V)), g = await toGpu(host.g, shape(K));
  const beta = await toGpu(host.beta, [B, T, H]);
  const start = await toGpu(state0, [B, H, K, V]);
  const token: KdaStepToken<DeviceTensor> = { B, T, H, K, V, q, k, v, g, beta };
  try {
    const loopMs = await timed(runs, async () => {
      let state = start;
      const outs: DeviceTensor[] = [];
      for (let c = 0; c < calls; c++) {
        const step = await kdaStep(state, token, { arm: "gpu", strict: true });
        outs.push(step.o);
        if (state !== start) state.release();
        state = step.state;
      }
      await state.read(); // the loop's one host sync
      releaseTensors(outs, state);
    });
    row.deviceLoopMs = loopMs;
    row.deviceLoopTokensPerSecond = (perCall * calls) / (loopMs / 1000);

    // the decode set's stage alone, timed on the GPU
    const ctx = await getContext();
    if (ctx.info.timestamps) {
      const problem = await uploadProblem({ ...host, T, scale: K ** -0.5, h0: state0 });
      const job = await ForwardJob.create(ctx, kernelSet(DECODE_KERNELS), problem, {
        chunkSize: 16,
      });
      try {
        const ns: number[] = [];
        for (let r = 0; r < Math.max(2, runs); r++) {
          const { stageNs } = await job.run({ timing: { repeat: REPEAT, readData: false } });
          ns.push(stageNs!.reduce((a, b) => a + b, 0));
        }
        const kernelMs = median(ns) / 1e6;
        row.kernelMs = kernelMs;
        row.kernelTokensPerSecond = perCall / (kernelMs / 1000);
      } finally {
        job.destroy();
        releaseTensors(problem);
      }
    } else {
      row.kernelMs = null;
      row.kernelNote = "the adapter has no timestamp queries";
    }
  } finally {
    releaseTensors(q, k, v, g, beta, start);
  }

  // typed arrays on the gpu arm: upload, kernels, one readback per call
  const typedMs = await timed(runs, async () => {
    await kdaStep(state0, host, { arm: "gpu", strict: true });
  });
  row.typedCallMs = typedMs;
  row.typedTokensPerSecond = perCall / (typedMs / 1000);

  if (withCpu) {
    const cpuMs = await timed(Math.min(runs, 3), async () => {
      await kdaStep(state0, host, { arm: "cpu", strict: true });
    });
    row.cpuCallMs = cpuMs;
    row.cpuTokensPerSecond = perCall / (cpuMs / 1000);
  }
  const fmt = (x: unknown) => typeof x === "number" ? x.toExponential(3) : "—";
  console.log(
    `${label}: device loop ${fmt(row.deviceLoopTokensPerSecond)} tok/s, kernel ${
      fmt(row.kernelTokensPerSecond)
    } tok/s, typed arrays ${fmt(row.typedTokensPerSecond)} tok/s, cpu ${
      fmt(row.cpuTokensPerSecond)
    } tok/s`,
  );
  return row;
}

async function main(): Promise<void> {
  const status = await gpuStatus();
  if (!status.available) {
    console.error(`No GPU: ${status.reason}`);
    Deno.exit(1);
  }
  const info = status.info;
  console.log(
    `adapter: ${info.description} (software ${info.software}, timestamps ${info.timestamps}); ` +
      `${calls} calls per device loop, ${runs} runs${quick ? ", quick" : ""}`,
  );
  const results: Record<string, unknown>[] = [];
  for (const B of batches) {
    for (const T of tokensPerCall) results.push(await benchShape(B, T));
  }
  const date = new Date().toISOString().slice(0, 10);
  const dir = new URL("./results/", import.meta.url);
  await Deno.mkdir(dir, { recursive: true });
  const name = Deno.env.get("KDA_BENCH_OUT") ??
    new URL(`${slug(info.description)}-${date}-decode.json`, dir).pathname;
  const doc = {
    what: "kdaStep decode throughput, f32, H=16, K=V=128 (bench/decode.ts)",
    adapter: info,
    date: new Date().toISOString(),
    deno: Deno.version.deno,
    kernels: DECODE_KERNELS,
    quick,
    calls,
    runs,
    results,
  };
  await Deno.writeTextFile(name, JSON.stringify(doc, null, 2) + "\n");
  console.log(`wrote ${name}`);
}

if (import.meta.main) await main();
