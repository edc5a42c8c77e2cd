// Wall-clock benchmark of the `gpu` arm: per shape, the median time of one forward call and of one
// forward+backward pair (each call is one submit and one readback, so small shapes measure mostly
// Deno's ~10 ms host round trip), and the throughput derived from it.
//
// Run: deno run --allow-env --allow-read bench/gpu.ts   (deno task bench:gpu)

import type { ChunkSize, RawKda } from "../kda/_types.ts";
import { gpuBackward, gpuForward, gpuStatus, gpuUnsupportedReason } from "../kda/gpu.ts";

interface BenchShape {
  name: string;
  B: number;
  T: number;
  H: number;
  K: number;
  V: number;
  chunkSize: ChunkSize;
}

const SHAPES: BenchShape[] = [
  { name: "default config", B: 2, T: 256, H: 2, K: 32, V: 32, chunkSize: 16 },
  { name: "long heads", B: 1, T: 4096, H: 2, K: 128, V: 128, chunkSize: 64 },
  { name: "long heads, C=16", B: 1, T: 4096, H: 2, K: 128, V: 128, chunkSize: 16 },
  { name: "large", B: 8, T: 4096, H: 16, K: 128, V: 128, chunkSize: 64 },
];

// Enough calls for a stable median without spending more than a few seconds per shape.
const WARMUP = 2;
const MAX_RUNS = 20;
const TIME_BUDGET_MS = 6000;

function randomInputs(s: BenchShape, seed: number): RawKda {
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

function rate(perSecond: number, unit: string): string {
  const [scale, prefix] = perSecond >= 1e12
    ? [1e12, "T"]
    : perSecond >= 1e9
    ? [1e9, "G"]
    : perSecond >= 1e6
    ? [1e6, "M"]
    : [1e3, "k"];
  return `${(perSecond / scale).toFixed(2)} ${prefix}${unit}/s`;
}

async function medianMs(run: () => Promise<void>): Promise<{ median: number; runs: number }> {
  for (let i = 0; i < WARMUP; i++) await run();
  const times: number[] = [];
  const start = performance.now();
  while (
    times.length < MAX_RUNS && (times.length < 3 || performance.now() - start < TIME_BUDGET_MS)
  ) {
    const t0 = performance.now();
    await run();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return { median: times[Math.floor(times.length / 2)], runs: times.length };
}

/** Forward flops of the chunked form, counting a multiply-add as two (DESIGN.md 2.2, per chunk). */
function forwardFlops(s: BenchShape): number {
  const { B, T, H, K, V, chunkSize: C } = s;
  const perChunk = 6 * C * K * V + 3 * C * C * K + 2 * C * C * V + (C * C * C) / 3;
  return B * H * Math.ceil(T / C) * perChunk;
}

const status = await gpuStatus();
if (!status.available) {
  console.error(`No GPU: ${status.reason}`);
  Deno.exit(1);
}
console.log(`adapter: ${status.info.description} (vendor ${status.info.vendor})`);

for (const shape of SHAPES) {
  const { B, T, H, K, V, chunkSize } = shape;
  const label = `${shape.name.padEnd(16)} B=${B} T=${T} H=${H} K=${K} V=${V} C=${chunkSize}`;
  const reason = gpuUnsupportedReason(shape, chunkSize);
  if (reason !== null) {
    console.log(`${label}: skipped (${reason})`);
    continue;
  }
  const x = randomInputs(shape, 1);
  const dout = new Float32Array(B * T * H * V).fill(0.01);
  try {
    const fwd = await medianMs(async () => {
      await gpuForward(x, { chunkSize });
    });
    const both = await medianMs(async () => {
      const { saved } = await gpuForward(x, { chunkSize, saveForBackward: true });
      await gpuBackward(saved!, { dout });
    });
    const tokens = B * T;
    const flops = forwardFlops(shape) / (fwd.median * 1e-3);
    console.log(
      `${label}: forward ${fwd.median.toFixed(2)} ms (${rate(tokens / fwd.median * 1e3, "tok")}, ` +
        `~${rate(flops, "FLOP")}, median of ${fwd.runs}); forward+backward ` +
        `${both.median.toFixed(2)} ms (${rate(tokens / both.median * 1e3, "tok")}, ` +
        `median of ${both.runs})`,
    );
  } catch (error) {
    console.log(`${label}: failed (${error instanceof Error ? error.message : error})`);
  }
}
