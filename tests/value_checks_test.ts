// A call's value checks give the same error wherever they run (kda/op/_value_checks.ts): checked
// by workers (large copies, in shared memory) or at once, the error is the first failing check's
// in the call's order, with the same message, and a later synchronous error loses to an earlier
// failing check; the workers' scan (kda/op/_range_scan.ts) finds the first element outside in
// every part of an array; and kda and kdaVjp on inputs large enough for the workers report a bad
// value exactly as a small call does, on the cpu and gpu arms.

import assert from "node:assert/strict";
import { kda, type KdaInputs, kdaVjp } from "../mod.ts";
import { firstOutside, ValueChecks } from "../kda/op/_value_checks.ts";
import { SCAN_WORKERS, scanRanges } from "../kda/op/_range_scan.ts";
import { DEFER_CHECK_BYTES } from "../kda/op/_value_checks.ts";
import { mulberry32 } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("value_checks_test.ts");

function shared(n: number, f64 = false, seed = 1): Float32Array | Float64Array {
  const rand = mulberry32(seed);
  const bytes = n * (f64 ? 8 : 4);
  const a = f64
    ? new Float64Array(new SharedArrayBuffer(bytes))
    : new Float32Array(new SharedArrayBuffer(bytes));
  for (let i = 0; i < n; i++) a[i] = rand() - 0.5;
  return a;
}

const BAD = [Number.NaN, Infinity, -Infinity, 7];

Deno.test("scanRanges finds the first element outside in each part, as a loop does", async () => {
  const rand = mulberry32(5);
  for (let trial = 0; trial < 12; trial++) {
    const scans = Array.from({ length: 4 }, (_, s) => {
      const n = [0, 1, SCAN_WORKERS - 1, 97, 4099][(trial + s) % 5];
      const array = shared(n, s % 2 === 1, trial * 7 + s);
      // up to two bad values, anywhere (the later one must not win)
      for (let b = 0; b < (trial + s) % 3 && n > 0; b++) {
        array[Math.floor(rand() * n)] = BAD[(trial + b) % BAD.length];
      }
      return { array, lo: -0.5, hi: 0.5 };
    });
    const got = await scanRanges(scans);
    assert.deepEqual(got, scans.map(({ array, lo, hi }) => firstOutside(array, lo, hi)));
  }
  await assert.rejects(
    () => scanRanges([{ array: new Float32Array(4), lo: 0, hi: 1 }]),
    /scans\[0\]\.array must be a view of a SharedArrayBuffer/,
  );
});

/** Runs one call's checks (a list of arrays, each with its interval) and returns its error. */
async function errorOf(
  arrays: (Float32Array | Float64Array)[],
  deferBytes: number,
  later?: Error,
): Promise<string> {
  const checks = new ValueChecks({ deferBytes });
  try {
    arrays.forEach((a, i) =>
      checks.check(
        a,
        -0.5,
        0.5,
        (v, j) => new RangeError(`a${i} must lie in ±0.5: got ${v} at index ${j}`),
      )
    );
    if (later !== undefined) throw later;
    await checks.verdict();
    return "none";
  } catch (error) {
    try {
      await checks.settle(error);
    } catch (settled) {
      return String(settled);
    }
    return "settle did not throw";
  }
}

Deno.test("value checks give the first failure in order, with its message, at once or in workers", async () => {
  const rand = mulberry32(9);
  for (let trial = 0; trial < 20; trial++) {
    const sizes = [300, 5, 2000, 40, 1000];
    const arrays = sizes.map((n, i) => shared(n, i % 2 === 0, trial * 11 + i));
    for (const [i, a] of arrays.entries()) {
      if (rand() < 0.35) a[Math.floor(rand() * a.length)] = BAD[(trial + i) % BAD.length];
    }
    const later = trial % 3 === 0 ? new TypeError("a later structural error") : undefined;
    const atOnce = await errorOf(arrays, Infinity, later);
    // every array in workers, and the large ones only (small failures met while large ones wait)
    assert.equal(await errorOf(arrays, 0, later), atOnce, `trial ${trial}, all in workers`);
    assert.equal(
      await errorOf(arrays, 1000 * 4, later),
      atOnce,
      `trial ${trial}, large in workers`,
    );
  }
});

Deno.test("a check that runs at once and fails throws at once; settled, an earlier one wins", async () => {
  const small = shared(4);
  small[2] = Number.NaN;
  const error = (v: number, i: number) => new RangeError(`got ${v} at ${i}`);
  const checks = new ValueChecks({ deferBytes: 64 });
  assert.throws(() => checks.check(small, -1, 1, error), /got NaN at 2/);
  const waiting = new ValueChecks({ deferBytes: 64 });
  const large = shared(100);
  large[50] = Infinity;
  waiting.check(large, -1, 1, () => new RangeError("the large one first"));
  let thrown: unknown;
  try {
    waiting.check(small, -1, 1, error);
  } catch (e) {
    thrown = e;
  }
  assert.match(String(thrown), /got NaN at 2/);
  await assert.rejects(() => waiting.settle(thrown), /the large one first/);
});

/** Inputs of (1, T, H, 128, 128), with q alone at least DEFER_CHECK_BYTES in f32. */
function largeInputs(): KdaInputs<Float32Array> {
  const [B, H, K, V] = [1, 1, 128, 128];
  const T = DEFER_CHECK_BYTES / 4 / (H * K);
  const n = B * T * H * K;
  const fill = (m: number, v: number) => new Float32Array(m).fill(v);
  return {
    B,
    T,
    H,
    K,
    V,
    q: fill(n, 0.01),
    k: fill(n, 0.01),
    v: fill(B * T * H * V, 0.1),
    g: fill(n, -0.05),
    beta: fill(B * T * H, 0.5),
  };
}

Deno.test("a large kda or kdaVjp reports a bad value as a small call does, before a later error", async () => {
  const x = largeInputs();
  const options = { arm: "cpu", strict: true, quiet: true } as const;
  const dout = new Float32Array(x.v.length).fill(0.01);
  // q is large (checked in workers); beta is small (checked at once)
  const cases: [string, (y: KdaInputs<Float32Array>) => void, RegExp][] = [
    ["q", (y) => (y.q[123457] = Number.NaN), /inputs\.q must be finite: got NaN at index 123457/],
    ["g", (y) => (y.g[99] = 0.25), /inputs\.g must be <= 0 \(a log decay\): got 0\.25 at index 99/],
    ["beta", (y) => (y.beta[3] = 1.5), /inputs\.beta must be in \[0, 1\].*got 1\.5 at index 3/],
  ];
  for (const [name, spoil, message] of cases) {
    const y = { ...x, [name]: (x[name as "q"] as Float32Array).slice() } as KdaInputs<Float32Array>;
    spoil(y);
    await assert.rejects(() => kda(y, options), message, `kda, ${name}`);
    await assert.rejects(() => kdaVjp(y, { dout }, options), message, `kdaVjp, ${name}`);
    // a cotangent of the wrong length comes later: the value error still wins
    await assert.rejects(
      () => kdaVjp(y, { dout: new Float32Array(3) }, options),
      message,
      `kdaVjp with a bad dout, ${name}`,
    );
  }
  // and a bad cotangent value after good inputs
  const badDout = dout.slice();
  badDout[777] = -Infinity;
  await assert.rejects(
    () => kdaVjp(x, { dout: badDout }, options),
    /cotangents\.dout must be finite: got -Infinity at index 777/,
  );
  // a structural error with good values is itself reported
  await assert.rejects(
    () => kdaVjp(x, { dout: new Float32Array(3) }, options),
    /cotangents\.dout must have/,
  );
});

gpuTest("a large typed kdaVjp on the gpu arm returns nothing computed on a bad value", async () => {
  const x = largeInputs();
  const y = { ...x, k: x.k.slice() };
  y.k[4242] = Infinity;
  await assert.rejects(
    () =>
      kdaVjp(y, { dout: new Float32Array(x.v.length).fill(0.01) }, { arm: "gpu", strict: true }),
    /inputs\.k must be finite: got Infinity at index 4242/,
  );
});
