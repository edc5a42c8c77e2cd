// A typed f32 call sure, as it is checked, to run on the gpu arm uploads its arrays as it checks
// them instead of copying them on the host (kda/gpu/snapshot.ts): it gives the copying route's
// bits, computes on what it checked whatever the caller does next, is counted and recorded as a
// dispatched call is, leaks no buffer (a failed call neither), and reports a bad value as the
// copying route does (a large array's found by reading its upload back). Every call that could run
// elsewhere copies as before.

import assert from "node:assert/strict";
import {
  kda,
  type KdaInputs,
  type KdaOptions,
  kdaVjp,
  resetSeamCounts,
  seamCounts,
  seamDecisions,
} from "../mod.ts";
import { kdaSeam, withKdaSeam } from "../kda/op/arms.ts";
import { Seam } from "../seam/seam.ts";
import { snapshotsTaken } from "../kda/gpu/snapshot.ts";
import { gpuLiveBuffers, gpuSettled } from "../kda/gpu/buffers.ts";
import { gpuStatus } from "../kda/gpu/mod.ts";
import { DEFER_CHECK_BYTES } from "../kda/op/_value_checks.ts";
import { bitsEqual, randomKda, toF32 } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("typed_snapshots_test.ts");

const GPU = { arm: "gpu", strict: true, quiet: true, chunkSize: 16 } as const;

function inputs(seed: number): KdaInputs<Float32Array> {
  return toF32(randomKda({ B: 2, T: 37, H: 2, K: 8, V: 6 }, seed, { withH0: true }));
}

/** The same call on a seam of kdaSeam's policy: no snapshot, the copying route. */
function copying<T>(fn: () => Promise<T>): Promise<T> {
  return withKdaSeam(new Seam(kdaSeam.policy), fn);
}

function sameBits(a: object, b: object, what: string): void {
  const [x, y] = [a as Record<string, Float32Array>, b as Record<string, Float32Array>];
  assert.deepEqual(Object.keys(x).sort(), Object.keys(y).sort(), `${what}: keys`);
  for (const key of Object.keys(x)) assert.ok(bitsEqual(x[key], y[key]), `${what}: ${key}`);
}

gpuTest(
  "a typed call sure to run on the gpu arm uploads as it checks, with the copying route's bits",
  async () => {
    await gpuStatus(); // a device ready: the first call knows where it runs
    const x = inputs(21);
    const dout = Float32Array.from({ length: x.v.length }, (_, i) => Math.cos(i));
    const dht = Float32Array.from({ length: x.h0!.length }, (_, i) => Math.sin(i));
    const live = gpuLiveBuffers();
    // q, k, v, g, beta, h0; and dout, dht
    let taken = snapshotsTaken();
    const out = await kda(x, GPU);
    assert.equal(snapshotsTaken() - taken, 6, "kda took its six arrays as snapshots");
    taken = snapshotsTaken();
    const grads = await kdaVjp(x, { dout, dht }, GPU);
    assert.equal(snapshotsTaken() - taken, 8, "kdaVjp took its inputs and cotangents as snapshots");
    await gpuSettled();
    assert.equal(gpuLiveBuffers(), live, "every snapshot's buffer was given back");

    taken = snapshotsTaken();
    const outCopied = await copying(() => kda(x, GPU));
    const gradsCopied = await copying(() => kdaVjp(x, { dout, dht }, GPU));
    assert.equal(snapshotsTaken(), taken, "a seam of the proof's kind takes no snapshot");
    sameBits(out, outCopied, "kda");
    sameBits(grads, gradsCopied, "kdaVjp");
  },
);

gpuTest(
  "a call on snapshots computes on what it checked, whatever the caller writes next",
  async () => {
    await gpuStatus();
    const x = inputs(22);
    const dout = Float32Array.from({ length: x.v.length }, (_, i) => Math.cos(i));
    const want = await kda(x, GPU);
    const wantGrads = await kdaVjp(x, { dout }, GPU);
    const y = { ...x, q: x.q.slice(), g: x.g.slice() };
    const cot = dout.slice();
    const taken = snapshotsTaken();
    const pending = kda(y, GPU);
    const pendingVjp = kdaVjp(y, { dout: cot }, GPU);
    // the calls have returned their promises: their snapshots are taken
    y.q.fill(Number.NaN);
    y.g.fill(5);
    cot.fill(Number.NaN);
    assert.equal(snapshotsTaken() - taken, 13, "both calls took snapshots before returning");
    sameBits(await pending, want, "kda");
    sameBits(await pendingVjp, wantGrads, "kdaVjp");
  },
);

gpuTest(
  "a call on snapshots is counted and recorded as the copying route's dispatch is",
  async () => {
    await gpuStatus();
    const x = inputs(23);
    const dout = new Float32Array(x.v.length).fill(0.5);
    const calls: [string, () => Promise<unknown>][] = [
      ["kda", () => kda(x, GPU)],
      ["kdaVjp", () => kdaVjp(x, { dout }, GPU)],
    ];
    for (const [name, call] of calls) {
      resetSeamCounts();
      const before = seamDecisions().length;
      const taken = snapshotsTaken();
      await call();
      assert.ok(snapshotsTaken() > taken, `${name}: on snapshots`);
      const counts = seamCounts();
      const decisions = seamDecisions().slice(before);
      // the same call dispatched, on a seam of the same policy (which copies)
      const seam = new Seam(kdaSeam.policy);
      await withKdaSeam(seam, call);
      assert.deepEqual(counts, seam.counts(), `${name}: counts`);
      assert.deepEqual(decisions, seam.decisions(), `${name}: decisions`);
      assert.equal(counts.asked, 1, `${name}: asked once`);
      assert.equal(counts.declined, 0, `${name}: no decline`);
    }
  },
);

gpuTest("calls that may run elsewhere copy their arrays as before", async () => {
  const status = await gpuStatus();
  assert.ok(status.available);
  const x = inputs(24);
  const none = async (what: string, fn: () => Promise<unknown>) => {
    const taken = snapshotsTaken();
    await fn();
    assert.equal(snapshotsTaken(), taken, `${what}: no snapshot`);
  };
  await none("arm cpu", () => kda(x, { ...GPU, arm: "cpu" }));
  const x64 = randomKda({ B: 1, T: 9, H: 1, K: 4, V: 4 }, 25);
  await none("f64 arrays", () => kda(x64, { arm: "gpu", quiet: true }));
  // no arm named: the default on a software adapter is the cpu arm, on hardware the gpu arm
  const taken = snapshotsTaken();
  await kda(x, { quiet: true, chunkSize: 16 } as KdaOptions);
  assert.equal(
    snapshotsTaken() - taken,
    status.info.software ? 0 : 6,
    "no arm named: snapshots only where the gpu arm is the default",
  );
  // a shape the gpu arm declines (K over 256) falls back, so it copies
  const big = toF32(randomKda({ B: 1, T: 3, H: 1, K: 260, V: 4 }, 26));
  await none(
    "a shape the gpu arm declines",
    () => kda(big, { arm: "gpu", quiet: true } as KdaOptions),
  );
  // the environment may want another arm
  Deno.env.set("KDA_ARM", "cpu");
  try {
    await none("KDA_ARM=cpu", () => kda(x, { quiet: true, chunkSize: 16 } as KdaOptions));
  } finally {
    Deno.env.delete("KDA_ARM");
  }
});

gpuTest("a failed call on snapshots leaks none and reports the copying route's error", async () => {
  await gpuStatus();
  const x = inputs(27);
  const live = gpuLiveBuffers();
  const badBeta = { ...x, beta: x.beta.slice() };
  badBeta.beta[5] = 3;
  const message = /inputs\.beta must be in \[0, 1\].*got 3 at index 5/;
  const taken = snapshotsTaken();
  await assert.rejects(() => kda(badBeta, GPU), message);
  assert.ok(snapshotsTaken() > taken, "the call took snapshots before it met the bad value");
  await assert.rejects(() => copying(() => kda(badBeta, GPU)), message);
  // a structural error after the arrays were taken
  await assert.rejects(
    () => kdaVjp(x, { dout: new Float32Array(3) }, GPU),
    /cotangents\.dout must have/,
  );
  await gpuSettled();
  assert.equal(gpuLiveBuffers(), live, "the failed calls' snapshots were given back");
});

gpuTest(
  "a large array's bad value on snapshots is named from the upload read back, as the copying route names it",
  async () => {
    await gpuStatus();
    // q of DEFER_CHECK_BYTES: its check is left to the device
    const [B, H, K, V] = [1, 1, 128, 128];
    const T = DEFER_CHECK_BYTES / 4 / (H * K);
    const fill = (n: number, v: number) => new Float32Array(n).fill(v);
    const x = {
      B,
      T,
      H,
      K,
      V,
      q: fill(B * T * H * K, 0.01),
      k: fill(B * T * H * K, 0.01),
      v: fill(B * T * H * V, 0.1),
      g: fill(B * T * H * K, -0.05),
      beta: fill(B * T * H, 0.5),
    };
    x.q[123457] = Number.NaN;
    const dout = fill(B * T * H * V, 0.01);
    const message = /inputs\.q must be finite: got NaN at index 123457/;
    const live = gpuLiveBuffers();
    const calls: [string, () => Promise<unknown>][] = [
      ["kda", () => kda(x, GPU)],
      ["kdaVjp", () => kdaVjp(x, { dout }, GPU)],
    ];
    for (const [name, call] of calls) {
      const taken = snapshotsTaken();
      await assert.rejects(call, message, name);
      assert.ok(snapshotsTaken() > taken, `${name}: on snapshots`);
      await assert.rejects(() => copying(call), message, `${name}, copying`);
    }
    await gpuSettled();
    assert.equal(gpuLiveBuffers(), live, "no snapshot left behind");
  },
);

gpuTest(
  "a typed call whose arrays disagree with its dimensions is refused by name before anything is planned",
  async () => {
    await gpuStatus();
    const a = new Float32Array(160);
    const live = gpuLiveBuffers();
    // T = 2^40 tokens claimed by arrays of 160 floats: planning the job from the dimensions first
    // built tables of 2^34 chunks and ran the process out of memory
    for (const T of [2 ** 40, 21]) {
      await assert.rejects(
        kda({ B: 1, T, H: 1, K: 8, V: 8, q: a, k: a, v: a, g: a, beta: a }, GPU),
        (e: Error) =>
          e instanceof RangeError && /^inputs\.q must have/.test(e.message) &&
          e.message.includes("got 160"),
      );
    }
    await gpuSettled();
    assert.equal(gpuLiveBuffers(), live, "no buffer left behind");
  },
);
