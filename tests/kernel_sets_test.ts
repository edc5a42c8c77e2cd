// Every registered kernel set, by name, against the f64 cpu arm on the same f32 bytes: outputs to
// 2e-6 and gradients to 2e-5 (max|a−b|/max|b|), across ragged lengths at each chunk size, the
// largest heads, strong gates, packed batches and grouped value heads; each set reruns
// bit-identically, and the seam names the set that ran. Whatever the default rule picks, each
// set keeps its own proof here.

import assert from "node:assert/strict";
import { type Float, kda, type KdaCotangents, type KdaInputs, kdaVjp } from "../mod.ts";
import { kdaSeam } from "../kda/op/arms.ts";
import type { ChunkSize } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { kernelSet, kernelSetNames } from "../kda/gpu/kernel_set.ts";
import { bufferElements, makePlan } from "../kda/gpu/layout.ts";
import { gpuDebug } from "../kda/gpu/_debug.ts";
import "../kda/gpu/kernels/mod.ts";
import { firstBitDifference, mulberry32, randomKda, Worst } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu, withNaNPrefill } from "./_gpu.ts";

reportMissingGpu("kernel_sets_test");

const SETS = kernelSetNames();
/** Whether a set has a backward (the decode set "recurrent" is forward only: its gradients are not asked). */
const hasBackward = (set: string) => kernelSet(set).backward !== null;

interface Case {
  label: string;
  B: number;
  T: number;
  H: number;
  HV?: number;
  K: number;
  V: number;
  chunkSize: ChunkSize;
  gateMin: number;
  h0: boolean;
  dht: boolean;
  lengths?: number[];
  seed: number;
}

const CASES: Case[] = [
  {
    label: "ragged T=17",
    B: 2,
    T: 17,
    H: 2,
    K: 12,
    V: 20,
    chunkSize: 16,
    gateMin: -1,
    h0: true,
    dht: false,
    seed: 1,
  },
  {
    label: "ragged T=100",
    B: 2,
    T: 100,
    H: 2,
    K: 12,
    V: 20,
    chunkSize: 32,
    gateMin: -5,
    h0: false,
    dht: true,
    seed: 2,
  },
  {
    label: "T=130 C=64",
    B: 1,
    T: 130,
    H: 2,
    K: 32,
    V: 32,
    chunkSize: 64,
    gateMin: -1,
    h0: true,
    dht: true,
    seed: 3,
  },
  {
    label: "K=V=256",
    B: 1,
    T: 70,
    H: 1,
    K: 256,
    V: 256,
    chunkSize: 64,
    gateMin: -1,
    h0: true,
    dht: true,
    seed: 4,
  },
  {
    // the width of the benchmarked shapes: K = 128 fills the split set's 32 channel quads of the
    // gate sums in one turn (K = 256 above takes two) and splits its pairwise sums over two turns
    // of channels, and four 16-row blocks a chunk take every path of Stage E's anchors (a short
    // last chunk too)
    label: "K=V=128",
    B: 1,
    T: 150,
    H: 1,
    K: 128,
    V: 128,
    chunkSize: 64,
    gateMin: -5,
    h0: true,
    dht: true,
    seed: 9,
  },
  {
    // K and V not multiples of four put every other (chunk, head) block of the per-chunk buffers
    // off the vec4 grid and end each row in a partial run: the vec4 views' lane-by-lane path
    label: "K=6 V=10",
    B: 1,
    T: 45,
    H: 2,
    K: 6,
    V: 10,
    chunkSize: 16,
    gateMin: -2,
    h0: true,
    dht: true,
    seed: 10,
  },
  {
    label: "strong gates",
    B: 1,
    T: 90,
    H: 2,
    K: 16,
    V: 24,
    chunkSize: 64,
    gateMin: -40,
    h0: true,
    dht: true,
    seed: 5,
  },
  {
    // decays near 1 across a whole chunk: the many terms of every pairwise sum carry their
    // decay's full weight, where the built-in exp of the split set's gradient stages is off by
    // its few ulps (docs/kda.md 3.2), and the rows of a chunk cancel least
    label: "weak gates",
    B: 1,
    T: 170,
    H: 2,
    K: 64,
    V: 64,
    chunkSize: 64,
    gateMin: -0.02,
    h0: true,
    dht: true,
    seed: 11,
  },
  {
    label: "packed",
    B: 1,
    T: 0,
    H: 2,
    K: 16,
    V: 12,
    chunkSize: 32,
    gateMin: -3,
    h0: true,
    dht: true,
    lengths: [5, 70, 0, 1, 33],
    seed: 6,
  },
  {
    label: "grouped heads",
    B: 2,
    T: 40,
    H: 2,
    HV: 4,
    K: 16,
    V: 8,
    chunkSize: 16,
    gateMin: -2,
    h0: true,
    dht: true,
    seed: 7,
  },
  {
    label: "grouped heads, packed",
    B: 1,
    T: 0,
    H: 1,
    HV: 3,
    K: 8,
    V: 16,
    chunkSize: 16,
    gateMin: -2,
    h0: true,
    dht: true,
    lengths: [17, 3, 40],
    seed: 8,
  },
];

function like(f32: boolean, n: number, seed: number): Float {
  const rand = mulberry32(seed);
  const a = f32 ? new Float32Array(n) : new Float64Array(n);
  for (let i = 0; i < n; i++) a[i] = rand() * 2 - 1;
  return a;
}

/** The case's inputs and cotangents in f32, and the same bytes widened to f64. */
function draw(c: Case) {
  const T = c.lengths ? c.lengths.reduce((a, b) => a + b, 0) : c.T;
  const HV = c.HV ?? c.H;
  const N = c.lengths ? c.lengths.length : c.B;
  const base = randomKda({ B: c.B, T, H: HV, K: c.K, V: c.V }, c.seed, {
    gateMin: c.gateMin,
    withH0: false,
    dtype: "f32",
  });
  // q and k have H heads: the first H of the draw's HV
  const heads = (a: Float) => {
    if (HV === c.H) return a;
    const out = new Float32Array(c.B * T * c.H * c.K);
    for (let row = 0; row < c.B * T; row++) {
      out.set(a.subarray(row * HV * c.K, (row * HV + c.H) * c.K), row * c.H * c.K);
    }
    return out;
  };
  const x32: KdaInputs = {
    B: c.B,
    T,
    H: c.H,
    K: c.K,
    V: c.V,
    q: heads(base.q),
    k: heads(base.k),
    v: base.v,
    g: base.g,
    beta: base.beta,
    ...(c.HV !== undefined ? { HV: c.HV } : {}),
    ...(c.h0 ? { h0: like(true, N * HV * c.K * c.V, c.seed + 10) } : {}),
    ...(c.lengths
      ? {
        cuSeqlens: Int32Array.from([
          0,
          ...c.lengths.map((_, i) => c.lengths!.slice(0, i + 1).reduce((a, b) => a + b, 0)),
        ]),
      }
      : {}),
  };
  const ct32: KdaCotangents = {
    dout: like(true, c.B * T * HV * c.V, c.seed + 11),
    ...(c.dht ? { dht: like(true, N * HV * c.K * c.V, c.seed + 12) } : {}),
  };
  const wide = <T extends object>(o: T): T =>
    Object.fromEntries(
      Object.entries(o).map(([k, v]) => [k, v instanceof Float32Array ? Float64Array.from(v) : v]),
    ) as T;
  return { x32, ct32, x64: wide(x32), ct64: wide(ct32) };
}

async function onSet(set: string, c: Case) {
  const { x32, ct32 } = draw(c);
  const options = { arm: "gpu" as const, chunkSize: c.chunkSize, kernels: set, strict: true };
  return await withNaNPrefill(async () => {
    const out = await kda(x32, options);
    const grads = hasBackward(set) ? await kdaVjp(x32, ct32, options) : undefined;
    return { out, grads };
  });
}

for (const set of SETS) {
  gpuTest(
    `kernel set ${set}: outputs${
      hasBackward(set) ? " and gradients" : " (a forward-only set)"
    } match the f64 cpu arm on every case`,
    async () => {
      const worst = new Worst();
      for (const c of CASES) {
        const { x64, ct64 } = draw(c);
        const ref = await kda(x64, { arm: "cpu", chunkSize: 16, strict: true });
        const refGrads = await kdaVjp(x64, ct64, { arm: "cpu", chunkSize: 16, strict: true });
        const { out, grads } = await onSet(set, c);
        worst.check(`${set} ${c.label} o`, out.o, ref.o, 2e-6);
        worst.check(`${set} ${c.label} ht`, out.ht, ref.ht, 2e-6);
        for (const name of grads === undefined ? [] : GRAD_NAMES) {
          if (name === "dh0" && !c.h0) continue;
          worst.check(`${set} ${c.label} ${name}`, grads![name]!, refGrads[name]!, 2e-5);
        }
      }
      worst.report(`kernel set ${set}`);
    },
  );

  gpuTest(`kernel set ${set}: reruns are bit-identical and the seam names the set`, async () => {
    const before = kdaSeam.counts().variants?.[`gpu:${set}`] ?? 0;
    for (const c of [CASES[2], CASES[5], CASES[6]]) {
      const a = await onSet(set, c), b = await onSet(set, c);
      const arrays = (r: typeof a) => [r.out.o, r.out.ht, ...GRAD_NAMES.map((n) => r.grads?.[n])];
      const [xs, ys] = [arrays(a), arrays(b)];
      xs.forEach((x, i) => {
        if (x === undefined) return;
        const j = firstBitDifference(x, ys[i]!);
        if (j >= 0) throw new Error(`${set} ${c.label}: array ${i} differs at ${j} between runs`);
      });
    }
    const after = kdaSeam.counts().variants?.[`gpu:${set}`] ?? 0;
    // three cases, two runs, a forward and a vjp each (no vjp on a forward-only set)
    const calls = hasBackward(set) ? 12 : 6;
    assert.equal(after - before, calls, `gpu:${set} counted ${after - before} calls`);
  });
}

gpuTest(
  "kernel set split: a run slice by slice, and scans over chunk ranges, give the bits of one pass over every chunk",
  async () => {
    const set = kernelSet("split");
    // the benchmarked width, K and V off the vec4 grid, a packed batch (an empty sequence in it,
    // sequences across slices), grouped heads packed
    for (const c of [CASES[4], CASES[5], CASES[7], CASES[9]]) {
      const whole = await onSet("split", c);
      // one chunk a slice, then two (the last slice shorter where the chunks are odd); then scans
      // of one chunk a dispatch, over slices of up to two chunks (so of one index of each
      // sequence) and over no budget (so slices of one index of every sequence)
      const runs: [slice: number | null, scan: number | null][] = [
        [1, null],
        [2, null],
        [2, 1],
        [null, 1],
      ];
      for (const [slice, scan] of runs) {
        const { x32 } = draw(c);
        gpuDebug.sliceBytes = null;
        const dims = { ...x32, ...(c.HV !== undefined ? { HV: c.HV } : {}) };
        const plain = makePlan(set, dims, c.chunkSize);
        const perChunk = set.buffers.filter((b) => b.perSlice === true)
          .reduce((n, b) => n + bufferElements(b, plain) * 4, 0) / plain.NCT;
        const what = `${c.label}, ${slice ?? "all"} chunks a slice, ${scan ?? "all"} a scan`;
        let got;
        try {
          gpuDebug.sliceBytes = slice === null ? null : slice * perChunk;
          gpuDebug.scanChunks = scan;
          const sliced = makePlan(set, dims, c.chunkSize);
          if (slice !== null) {
            assert.ok(sliced.sliceChunks <= slice, `${what}: ${sliced.sliceChunks} chunks a slice`);
            assert.ok(sliced.slices.length > 1, `${what}: ${plain.NCT} chunks, one slice`);
          }
          if (scan !== null) {
            assert.equal(set.scanRanges(sliced).length, plain.NC, `${what}: scan ranges`);
          }
          got = await onSet("split", c);
        } finally {
          gpuDebug.sliceBytes = null;
          gpuDebug.scanChunks = null;
        }
        const outs: (readonly [string, Float | undefined, Float | undefined])[] = [
          ["o", whole.out.o, got.out.o],
          ["ht", whole.out.ht, got.out.ht],
          ...GRAD_NAMES.map((name) => [name, whole.grads![name], got.grads![name]] as const),
        ];
        for (const [name, a, b] of outs) {
          assert.equal(
            a === undefined,
            b === undefined,
            `${what}: ${name} returned by one run only`,
          );
          if (a === undefined || b === undefined) continue;
          const at = firstBitDifference(a, b);
          if (at >= 0) throw new Error(`${what}: ${name} differs at ${at}`);
        }
      }
    }
  },
);
