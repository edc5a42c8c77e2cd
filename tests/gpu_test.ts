// Tests of the `gpu` arm (kda/gpu.ts, kda/chunk.wgsl) against the f64 references: the hand-written
// recurrence and BPTT of tests/_bptt.ts, and the f64 chunked arm (kda/chunk.ts) where the
// recurrence's per-token states would not fit in memory. Both sides see the same input bytes: the
// draw is rounded to f32 once and the reference runs in f64 on those rounded values.
//
// Without an adapter every test prints why and is ignored, unless KDA_REQUIRE_GPU=1 makes it fail.
// Every GPU output buffer is pre-filled with NaN and scanned for NaN/Inf from the bits, so a missing
// write cannot pass as a zero.

import assert from "node:assert/strict";
import type { ChunkSize, KdaGrads, KdaProblem } from "../kda/_types.ts";
import { chunkBackward, chunkForward } from "../kda/chunk.ts";
import {
  gpuBackward,
  gpuForward,
  gpuLiveBuffers,
  gpuStatus,
  gpuUnsupportedReason,
} from "../kda/gpu/mod.ts";
import { recurrentBackward, recurrentForward } from "./_bptt.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import * as fixtures from "./_fixtures.ts";
import type { KdaShape } from "./_fixtures.ts";

const { agreement, mulberry32, randomKda, toF64 } = fixtures;
import { gpuTest, reportMissingGpu, runChild, withNaNPrefill } from "./_gpu.ts";

reportMissingGpu("gpu_test");

/** randomKda drawn in f32 (its type says Float; the arrays are Float32Array). */
function randomKda32(
  shape: KdaShape,
  seed: number,
  options: Parameters<typeof randomKda>[2] = {},
): KdaProblem<Float32Array> {
  return randomKda(shape, seed, { ...options, dtype: "f32" }) as KdaProblem<Float32Array>;
}

const LN_09 = Math.log(0.9);

/** Fails on any NaN or Inf, read from the exponent bits rather than through float compares. */
function assertFiniteBits(name: string, a: Float32Array): void {
  const bits = new Uint32Array(a.buffer, a.byteOffset, a.length);
  for (let i = 0; i < bits.length; i++) {
    if ((bits[i] & 0x7f800000) === 0x7f800000) {
      throw new Error(`${name}[${i}] is not finite (bits 0x${bits[i].toString(16)})`);
    }
  }
}

function check(label: string, name: string, a: Float32Array, b: ArrayLike<number>, tol: number) {
  assertFiniteBits(`${label} ${name}`, a);
  const { rel: ratio, absDiff: maxDiff, refMax: maxRef } = agreement(a, b);
  console.log(
    `  ${label} ${name.padEnd(5)} max|a−b|/max|b| = ${ratio.toExponential(2)} ` +
      `(max|a−b| ${maxDiff.toExponential(2)}, max|b| ${maxRef.toExponential(2)}, tol ${tol})`,
  );
  if (!(maxRef > 0)) throw new Error(`${label} ${name}: the reference is all zeros`);
  if (!(ratio <= tol)) {
    throw new Error(`${label} ${name}: max|a−b|/max|b| = ${ratio} exceeds ${tol}`);
  }
}

function randomF32(n: number, seed: number): Float32Array {
  const rand = mulberry32(seed);
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = rand() * 2 - 1;
  return a;
}

interface Case {
  shape: KdaShape;
  chunkSize: ChunkSize;
  gateMin: number;
  gateMax: number;
  withH0: boolean;
  withDht: boolean;
  seed: number;
}

function draw(c: Case): { x: KdaProblem<Float32Array>; dout: Float32Array; dht?: Float32Array } {
  const { B, T, H, K, V } = c.shape;
  const x = randomKda32(c.shape, c.seed, {
    gateMin: c.gateMin,
    gateMax: c.gateMax,
    withH0: c.withH0,
    dtype: "f32",
  });
  const dout = randomF32(B * T * H * V, c.seed + 1);
  const dht = c.withDht ? randomF32(B * H * K * V, c.seed + 2) : undefined;
  return { x, dout, dht };
}

async function runGpu(
  x: KdaProblem<Float32Array>,
  chunkSize: ChunkSize,
  dout: Float32Array,
  dht: Float32Array | undefined,
): Promise<{ o: Float32Array; ht: Float32Array; grads: KdaGrads }> {
  return await withNaNPrefill(async () => {
    const { o, ht, saved } = await gpuForward(x, { chunkSize, saveForBackward: true });
    const grads = await gpuBackward(saved!, { dout, ...(dht ? { dht } : {}) });
    assert.equal(saved!.released, false);
    saved!.release();
    return { o, ht, grads };
  });
}

/** Compares the GPU arm with the f64 recurrence (or, with `viaChunk`, the f64 chunked arm). */
async function compare(
  c: Case,
  tolOut: number,
  tolGrad: number,
  viaChunk = false,
): Promise<void> {
  const { x, dout, dht } = draw(c);
  const gpu = await runGpu(x, c.chunkSize, dout, dht);
  const x64 = toF64(x);
  const cot = { dout: Float64Array.from(dout), ...(dht ? { dht: Float64Array.from(dht) } : {}) };
  let ref: { o: ArrayLike<number>; ht: ArrayLike<number> };
  let refGrads: KdaGrads;
  if (viaChunk) {
    const fwd = chunkForward(x64, { chunkSize: 64, saveStates: true });
    ref = fwd;
    refGrads = chunkBackward(x64, fwd.states!, cot, { chunkSize: 64 });
  } else {
    ref = recurrentForward(x64);
    refGrads = recurrentBackward(x64, cot);
  }
  const { B, T, H, K, V } = c.shape;
  const label = `B=${B} T=${T} H=${H} K=${K} V=${V} C=${c.chunkSize} ` +
    `g∈[${c.gateMin.toFixed(3)},${c.gateMax}] h0=${c.withH0 ? "yes" : "no"} ` +
    `dht=${c.withDht ? "yes" : "no"}:`;
  console.log(label);
  check("", "o", gpu.o, ref.o, tolOut);
  check("", "ht", gpu.ht, ref.ht, tolOut);
  for (const name of GRAD_NAMES) {
    check("", name, gpu.grads[name] as Float32Array, refGrads[name], tolGrad);
  }
}

function hashBits(arrays: Float32Array[]): string {
  // FNV-1a over the 32-bit words: any flipped bit changes it.
  let hash = 0x811c9dc5;
  for (const a of arrays) {
    const words = new Uint32Array(a.buffer, a.byteOffset, a.length);
    for (let i = 0; i < words.length; i++) hash = Math.imul(hash ^ words[i], 0x01000193) >>> 0;
  }
  return hash.toString(16).padStart(8, "0");
}

const DEFAULT_SHAPE: KdaShape = { B: 2, T: 256, H: 2, K: 32, V: 32 };

gpuTest("gpuStatus() reports the adapter and the limits it requested", async () => {
  const s = await gpuStatus();
  assert.equal(s.available, true);
  if (!s.available) return;
  console.log(`  adapter: ${s.info.description} (vendor ${s.info.vendor})`);
  console.log(`  limits: ${JSON.stringify(s.info.limits)}`);
  assert.ok(s.info.limits.maxComputeWorkgroupStorageSize >= 16384);
});

gpuTest(
  "gpuForward() and gpuBackward() match the f64 reference at the default config",
  async () => {
    await compare(
      {
        shape: DEFAULT_SHAPE,
        chunkSize: 16,
        gateMin: LN_09,
        gateMax: 0,
        withH0: false,
        withDht: true,
        seed: 0,
      },
      2e-6,
      2e-5,
    );
  },
);

gpuTest(
  "gpuForward() and gpuBackward() match the f64 reference with gates in [−5, 0]",
  async () => {
    for (const chunkSize of [16, 64] as const) {
      await compare(
        {
          shape: DEFAULT_SHAPE,
          chunkSize,
          gateMin: -5,
          gateMax: 0,
          withH0: true,
          withDht: true,
          seed: 1,
        },
        2e-6,
        2e-5,
      );
    }
  },
);

gpuTest("constant gates of exactly −5 and exactly 0 stay finite and match", async () => {
  for (const gate of [-5, 0]) {
    await compare(
      {
        shape: { B: 1, T: 100, H: 2, K: 16, V: 16 },
        chunkSize: 64,
        gateMin: gate,
        gateMax: gate,
        withH0: true,
        withDht: true,
        seed: 2,
      },
      2e-6,
      2e-5,
    );
  }
});

gpuTest(
  "ragged T (1, 17, 100) at chunk sizes 16, 32, 64 with K ≠ V, with and without h0 and dht",
  async () => {
    let i = 0;
    for (const T of [1, 17, 100]) {
      for (const chunkSize of [16, 32, 64] as const) {
        i++;
        await compare(
          {
            shape: { B: 2, T, H: 2, K: 12, V: 20 },
            chunkSize,
            gateMin: -1,
            gateMax: 0,
            // without h0, T = 1 has dg = 0 exactly (S̃ = diag(a)·0): nothing to compare
            withH0: T === 1 || i % 2 === 0,
            withDht: i % 3 !== 0,
            seed: 10 + i,
          },
          2e-6,
          2e-5,
        );
      }
    }
  },
);

gpuTest("the largest heads, K = V = 256, match at small T and chunk sizes 32 and 64", async () => {
  for (const chunkSize of [32, 64] as const) {
    await compare(
      {
        shape: { B: 1, T: 70, H: 1, K: 256, V: 256 },
        chunkSize,
        gateMin: -1,
        gateMax: 0,
        withH0: true,
        withDht: true,
        seed: 3,
      },
      2e-6,
      2e-5,
    );
  }
});

gpuTest("gpuForward() and gpuBackward() match at B=1, T=4096, H=2, K=V=128", async () => {
  await compare(
    {
      shape: { B: 1, T: 4096, H: 2, K: 128, V: 128 },
      chunkSize: 64,
      gateMin: LN_09,
      gateMax: 0,
      withH0: true,
      withDht: true,
      seed: 4,
    },
    1e-5,
    1e-4,
    true,
  );
});

const DETERMINISM_CASE: Case = {
  shape: DEFAULT_SHAPE,
  chunkSize: 16,
  gateMin: -5,
  gateMax: 0,
  withH0: true,
  withDht: true,
  seed: 7,
};

async function determinismHash(): Promise<string> {
  const { x, dout, dht } = draw(DETERMINISM_CASE);
  const r = await runGpu(x, DETERMINISM_CASE.chunkSize, dout, dht);
  return hashBits([r.o, r.ht, ...GRAD_NAMES.map((n) => r.grads[n] as Float32Array)]);
}

gpuTest(
  "20 consecutive forward+backward runs give bit-identical outputs and gradients",
  async () => {
    const { x, dout, dht } = draw(DETERMINISM_CASE);
    const first = await runGpu(x, DETERMINISM_CASE.chunkSize, dout, dht);
    const firstArrays = [
      first.o,
      first.ht,
      ...GRAD_NAMES.map((n) => first.grads[n] as Float32Array),
    ];
    const names = ["o", "ht", ...GRAD_NAMES];
    for (let run = 1; run < 20; run++) {
      const r = await runGpu(x, DETERMINISM_CASE.chunkSize, dout, dht);
      const arrays = [r.o, r.ht, ...GRAD_NAMES.map((n) => r.grads[n] as Float32Array)];
      arrays.forEach((a, i) => {
        const j = fixtures.firstBitDifference(a, firstArrays[i]);
        if (j >= 0) throw new Error(`Run ${run}: ${names[i]}[${j}] differs from run 0 in its bits`);
      });
    }
    console.log(`  20 runs bit-identical, hash ${hashBits(firstArrays)}`);
  },
);

gpuTest("concurrent calls give the same bits as consecutive ones", async () => {
  const here = await determinismHash();
  const hashes = await Promise.all(Array.from({ length: 6 }, () => determinismHash()));
  console.log(`  consecutive ${here}, concurrent ${hashes.join(", ")}`);
  for (const h of hashes) assert.equal(h, here);
});

gpuTest("two separate processes give bit-identical outputs and gradients", async () => {
  const here = await determinismHash();
  const gpuUrl = new URL("../kda/gpu/mod.ts", import.meta.url).href;
  const script = `
    import { gpuBackward, gpuForward } from ${JSON.stringify(gpuUrl)};
    import { gpuDebug } from ${
    JSON.stringify(new URL("../kda/gpu/_debug.ts", import.meta.url).href)
  };
    gpuDebug.prefillNaN = true;
    import { mulberry32, randomKda } from ${
    JSON.stringify(new URL("./_fixtures.ts", import.meta.url).href)
  };
    const c = ${JSON.stringify(DETERMINISM_CASE)};
    const { B, T, H, K, V } = c.shape;
    const x = randomKda(c.shape, c.seed, { gateMin: c.gateMin, gateMax: c.gateMax, withH0: c.withH0, dtype: "f32" });
    const rf = (n, seed) => { const r = mulberry32(seed); const a = new Float32Array(n); for (let i = 0; i < n; i++) a[i] = r() * 2 - 1; return a; };
    const dout = rf(B * T * H * V, c.seed + 1), dht = rf(B * H * K * V, c.seed + 2);
    const f = await gpuForward(x, { chunkSize: c.chunkSize, saveForBackward: true });
    const g = await gpuBackward(f.saved, { dout, dht });
    let hash = 0x811c9dc5;
    for (const a of [f.o, f.ht, g.dq, g.dk, g.dv, g.dg, g.dbeta, g.dh0]) {
      const w = new Uint32Array(a.buffer, a.byteOffset, a.length);
      for (let i = 0; i < w.length; i++) hash = Math.imul(hash ^ w[i], 0x01000193) >>> 0;
    }
    console.log("HASH " + hash.toString(16).padStart(8, "0"));
  `;
  const hashes: string[] = [];
  for (let i = 0; i < 2; i++) {
    const out = await runChild(script);
    const match = out.stdout.match(/HASH ([0-9a-f]{8})/);
    if (!out.success || match === null) {
      throw new Error(`Child process ${i} failed (code ${out.code}): ${out.stderr}`);
    }
    hashes.push(match[1]);
  }
  console.log(`  this process ${here}, children ${hashes.join(", ")}`);
  assert.equal(hashes[0], hashes[1]);
  assert.equal(hashes[0], here);
});

gpuTest(
  "gpuLiveBuffers() returns to its starting value after 1,000 forward+backward calls",
  async () => {
    const shape = { B: 1, T: 3, H: 1, K: 4, V: 4 };
    const x = randomKda32(shape, 5, { withH0: true, dtype: "f32" });
    const dout = randomF32(12, 6);
    const start = gpuLiveBuffers();
    for (let i = 0; i < 1000; i++) {
      const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
      await gpuBackward(saved!, { dout });
      saved!.release();
    }
    // The other ways a handle ends: released without a backward, and never saved at all.
    const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
    saved!.release();
    saved!.release();
    await gpuForward(x, { chunkSize: 16 });
    console.log(`  live buffers: ${start} before, ${gpuLiveBuffers()} after`);
    assert.equal(gpuLiveBuffers(), start);
  },
);

gpuTest("bad inputs and shapes over a device limit throw clear errors", async () => {
  const shape = { B: 1, T: 5, H: 1, K: 4, V: 4 };
  const x = randomKda32(shape, 8);
  const start = gpuLiveBuffers();
  await assert.rejects(
    gpuForward(toF64(x) as unknown as KdaProblem<Float32Array>, { chunkSize: 16 }),
    (e: unknown) =>
      e instanceof TypeError && /^q must be a Float32Array: got Float64Array$/.test(e.message),
  );
  await assert.rejects(
    gpuForward({ ...x, v: new Float32Array(3) }, { chunkSize: 16 }),
    (e: unknown) =>
      e instanceof RangeError && /^v must have 20 elements \[B, T, H, V\]: got 3$/.test(e.message),
  );
  await assert.rejects(
    gpuForward(x, { chunkSize: 8 as ChunkSize }),
    (e: unknown) =>
      e instanceof RangeError && /^chunkSize must be 16, 32 or 64: got 8$/.test(e.message),
  );
  const wide = { B: 1, T: 2, H: 1, K: 257, V: 4 };
  assert.match(gpuUnsupportedReason(wide, 16) ?? "", /^K must be at most 256: got 257$/);
  await assert.rejects(
    gpuForward(randomKda32(wide, 9), { chunkSize: 16 }),
    (e: unknown) => e instanceof RangeError && /K must be at most 256/.test(e.message),
  );
  // Over the storage binding limit: refused before any array is read, never truncated.
  const huge = { B: 64, T: 1 << 20, H: 16, K: 256, V: 256 };
  const reason = gpuUnsupportedReason(huge, 64);
  console.log(`  over-limit reason: ${reason}`);
  assert.match(reason ?? "", /over the device's storage binding limit/);
  const dummy = new Float32Array(1);
  await assert.rejects(
    gpuForward(
      { ...huge, q: dummy, k: dummy, v: dummy, g: dummy, beta: dummy, scale: 1 },
      { chunkSize: 64 },
    ),
    (e: unknown) => e instanceof RangeError && /storage binding limit/.test(e.message),
  );
  assert.equal(gpuUnsupportedReason(DEFAULT_SHAPE, 16), null);

  const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
  await assert.rejects(
    gpuBackward(saved!, { dout: new Float32Array(7) }),
    (e: unknown) =>
      e instanceof RangeError &&
      /^dout must have 20 elements \[B, T, H, V\]: got 7$/.test(e.message),
  );
  // A refused backward leaves the handle usable; after release() a backward names the cause.
  assert.equal(saved!.released, false);
  await gpuBackward(saved!, { dout: new Float32Array(20) });
  saved!.release();
  await assert.rejects(
    gpuBackward(saved!, { dout: new Float32Array(20) }),
    (e: unknown) =>
      e instanceof Error && /the tape that recorded the forward was disposed/.test(e.message),
  );
  await assert.rejects(
    gpuBackward({ release() {}, released: false }, { dout: new Float32Array(20) }),
    (e: unknown) => e instanceof TypeError && /handle returned by gpuForward/.test(e.message),
  );
  assert.equal(gpuLiveBuffers(), start);
});

// ---- issue 8 regressions ----

function sameBits(label: string, a: Float32Array, b: Float32Array): void {
  assert.equal(a.length, b.length, `${label}: lengths differ`);
  const i = fixtures.firstBitDifference(a, b);
  if (i >= 0) throw new Error(`${label}[${i}] differs in its bits`);
}

gpuTest(
  "defect 1: concurrent gpuBackward calls on one saved forward equal sequential calls bit for bit",
  async () => {
    const { x, dout } = draw(DETERMINISM_CASE);
    const { B, T, H, K, V } = DETERMINISM_CASE.shape;
    const douts = [dout, randomF32(B * T * H * V, 101), randomF32(B * T * H * V, 102)];
    const dhts = [undefined, randomF32(B * H * K * V, 103), undefined];
    const cot = (i: number) => ({ dout: douts[i], ...(dhts[i] ? { dht: dhts[i] } : {}) });
    const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
    const sequential: KdaGrads<Float32Array>[] = [];
    for (let i = 0; i < 3; i++) sequential.push(await gpuBackward(saved!, cot(i)));
    for (let round = 0; round < 3; round++) {
      const concurrent = await Promise.all(
        [0, 1, 2, 0, 1, 2].map((i) => gpuBackward(saved!, cot(i))),
      );
      concurrent.forEach((grads, j) => {
        for (const name of GRAD_NAMES) {
          sameBits(`round ${round} call ${j} ${name}`, grads[name], sequential[j % 3][name]);
        }
      });
    }
    saved!.release();
  },
);

gpuTest("defect 2: a second gpuBackward on the same saved forward works and agrees", async () => {
  const { x, dout, dht } = draw(DETERMINISM_CASE);
  const start = gpuLiveBuffers();
  const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
  const first = await gpuBackward(saved!, { dout, dht });
  assert.equal(saved!.released, false);
  const second = await gpuBackward(saved!, { dout, dht });
  for (const name of GRAD_NAMES) sameBits(name, second[name], first[name]);
  // release() during a backward defers the free until that backward ends
  const pending = gpuBackward(saved!, { dout, dht });
  saved!.release();
  const third = await pending;
  for (const name of GRAD_NAMES) sameBits(name, third[name], first[name]);
  assert.equal(gpuLiveBuffers(), start);
});

gpuTest("defect 6: every returned array owns its own ArrayBuffer", async () => {
  const { x, dout, dht } = draw(DETERMINISM_CASE);
  const { o, ht, saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
  const grads = await gpuBackward(saved!, { dout, dht });
  saved!.release();
  const arrays = [o, ht, ...GRAD_NAMES.map((n) => grads[n])];
  for (const a of arrays) {
    assert.equal(a.byteOffset, 0);
    assert.equal(a.buffer.byteLength, a.byteLength);
  }
  assert.equal(new Set(arrays.map((a) => a.buffer)).size, arrays.length);
  const htCopy = ht.slice();
  (o.buffer as ArrayBuffer).transfer(); // detaches o only
  sameBits("ht after transferring o", ht, htCopy);
});

gpuTest("defect 7: a scale that is not finite in f32 is refused with a named reason", async () => {
  const x = randomKda32({ B: 1, T: 2, H: 1, K: 1, V: 1 }, 12);
  for (const scale of [1e39, -1e39, 1e-50]) {
    const reason = gpuUnsupportedReason({ B: 1, T: 2, H: 1, K: 1, V: 1, scale }, 16);
    assert.match(reason ?? "", /^scale must be (finite|representable) in f32: got /);
    await assert.rejects(
      gpuForward({ ...x, scale }, { chunkSize: 16 }),
      (e: unknown) => e instanceof RangeError && /^scale must be/.test(e.message),
    );
  }
  assert.equal(gpuUnsupportedReason({ B: 1, T: 2, H: 1, K: 1, V: 1, scale: 3e38 }, 16), null);
});

gpuTest("the buffer-limit reason says what fits instead of a larger chunk size", async () => {
  const s = await gpuStatus();
  if (!s.available) return;
  const long = { B: 4, T: 1 << 22, H: 16, K: 128, V: 128 };
  const reason = gpuUnsupportedReason(long, 64) ?? "";
  console.log(`  ${reason}`);
  assert.doesNotMatch(reason, /larger chunk size/);
  const m1 = reason.match(/at B=1 a sequence of T=(\d+) fits/);
  assert.ok(m1 !== null, reason);
  const fitT = Number(m1[1]);
  assert.equal(gpuUnsupportedReason({ ...long, B: 1, T: fitT }, 64), null);
  assert.notEqual(gpuUnsupportedReason({ ...long, B: 1, T: fitT + 64 }, 64), null);
  const wide = { B: 100000, T: 4096, H: 2, K: 32, V: 32 };
  const big = gpuUnsupportedReason(wide, 16) ?? "";
  console.log(`  ${big}`);
  const m2 = big.match(/largest batch that fits is B=(\d+)/);
  assert.ok(m2 !== null, big);
  const fitB = Number(m2[1]);
  assert.equal(gpuUnsupportedReason({ ...wide, B: fitB }, 16), null);
  assert.notEqual(gpuUnsupportedReason({ ...wide, B: fitB + 1 }, 16), null);
});
