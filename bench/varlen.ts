// Packed variable-length batches on the gpu arm, per kernel set: what a packed batch costs against
// its longest sequence alone (cost should follow the chunks of its sequences, Σ⌈len/C⌉, not
// N × longest), and flash-linear-attention's own varlen case (H = 4, K = V = 256, cu_seqlens
// [0, 100, 300, 1200, 3000, 4096]), and a batch of many sequences that the split set cuts into
// many slices. Each case: host wall of kda and of kdaVjp on GpuTensors (one read each, as a
// chained step pays: ht for kda, dbeta for kdaVjp), median of the runs; a set that cannot run a
// case says why.
// Prints one JSON line per case and set, and writes them all to KDA_BENCH_OUT when set.
//
// Run: deno run --allow-env --allow-read --allow-write bench/varlen.ts [--kernels=a,b] [--runs=N]

import { kda, kdaVjp } from "../kda/op/op.ts";
import { releaseTensors, toGpu } from "../kda/gpu/tensor.ts";
import { toGpuInputs } from "../kda/op/device_inputs.ts";
import { kernelSet, kernelSetNames } from "../kda/gpu/kernel_set.ts";
import { gpuStatus } from "../kda/gpu/mod.ts";
import "../kda/gpu/kernels/mod.ts";
import { timed } from "./_run.ts";
import type { KdaProblem } from "../kda/_types.ts";

interface Case {
  name: string;
  H: number;
  K: number;
  lengths: number[];
}

const CASES: Case[] = [
  { name: "512 alone", H: 4, K: 64, lengths: [512] },
  { name: "512 + 63 x 1", H: 4, K: 64, lengths: [512, ...Array(63).fill(1)] },
  { name: "fla varlen (H=4, K=V=256)", H: 4, K: 256, lengths: [100, 200, 900, 1800, 1096] },
  // Many sequences in many slices: at H = 16, K = V = 128 a slice of the split set's scratch holds
  // fewer chunks than one chunk index of the 256 sequences, so each index is cut into runs of
  // sequences and a slice's scan holds only some of them.
  { name: "256 x 128 (H=16, K=V=128)", H: 16, K: 128, lengths: Array(256).fill(128) },
];

/** Untimed kdaVjp calls before a case's timed ones. */
const WARMUP = 20;

function inputs(c: Case): KdaProblem<Float32Array> & { cuSeqlens: Int32Array } {
  const T = c.lengths.reduce((a, b) => a + b, 0);
  const { H, K } = c;
  const wave = (n: number, f: number, a = 1) =>
    Float32Array.from({ length: n }, (_, i) => a * Math.sin(f * i + 0.3));
  const cu = new Int32Array(c.lengths.length + 1);
  c.lengths.forEach((n, i) => cu[i + 1] = cu[i] + n);
  return {
    B: 1,
    T,
    H,
    K,
    V: K,
    scale: 1 / Math.sqrt(K),
    q: wave(T * H * K, 0.37),
    k: wave(T * H * K, 0.23, 1 / Math.sqrt(K)),
    v: wave(T * H * K, 0.11),
    g: Float32Array.from({ length: T * H * K }, (_, i) => -0.05 - 0.05 * ((i * 7) % 11) / 11),
    beta: Float32Array.from({ length: T * H }, (_, i) => 0.2 + 0.6 * ((i * 5) % 7) / 7),
    cuSeqlens: cu,
  };
}

async function main(): Promise<void> {
  const status = await gpuStatus();
  if (!status.available) {
    console.error(`No GPU: ${status.reason}`);
    Deno.exit(1);
  }
  const runsArg = Deno.args.find((a) => a.startsWith("--runs="));
  const runs = runsArg ? Number(runsArg.slice(7)) : 5;
  const kernelsArg = Deno.args.find((a) => a.startsWith("--kernels="));
  const sets = (kernelsArg ? kernelsArg.slice(10).split(",") : kernelSetNames())
    .map((n) => kernelSet(n, "--kernels"))
    .filter((s) => s.backward !== null);
  const rows: Record<string, unknown>[] = [];
  for (const c of CASES) {
    const x = inputs(c);
    const device = await toGpuInputs(x);
    const dout = await toGpu(new Float32Array(x.T * c.H * c.K).fill(0.01), [1, x.T, c.H, c.K]);
    for (const set of sets) {
      const options = { arm: "gpu", strict: true, chunkSize: 64, kernels: set.name } as const;
      const row: Record<string, unknown> = {
        case: c.name,
        kernels: set.name,
        T: x.T,
        N: c.lengths.length,
        chunks: c.lengths.reduce((a, n) => a + Math.ceil(n / 64), 0),
        // the forward's one read is ht, N states of K x V: with many sequences it sets the time
        forwardReadBytes: c.lengths.length * c.H * c.K * c.K * 4,
      };
      try {
        // Warm up first: on the H200 a new process's first two dozen calls read up to 2.4x
        // slower (bench/results/ANALYSIS.md), which one warm-up call leaves in the median.
        for (let i = 0; i < WARMUP; i++) {
          releaseTensors(await kdaVjp(device, { dout }, options));
        }
        row.forwardMs = await timed(runs, async () => {
          const out = await kda(device, options);
          await out.ht.read();
          releaseTensors(out);
        });
        row.vjpMs = await timed(runs, async () => {
          const grads = await kdaVjp(device, { dout }, options);
          await grads.dbeta.read();
          releaseTensors(grads);
        });
      } catch (error) {
        row.failed = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
      }
      console.log(JSON.stringify(row));
      rows.push(row);
    }
    releaseTensors(device, dout);
  }
  const out = Deno.env.get("KDA_BENCH_OUT");
  if (out !== undefined) {
    const doc = { adapter: status.info, date: new Date().toISOString(), runs, rows };
    await Deno.writeTextFile(out, JSON.stringify(doc, null, 2) + "\n");
  }
}

if (import.meta.main) await main();
