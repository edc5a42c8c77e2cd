// A call's value checks give the same error wherever they run (kda/op/_value_checks.ts): at once,
// left pending and decided on the host after the run, or run by the gpu arm over the bytes it
// uploaded (kda/gpu/range_checks.ts), the error is the first failing check's in the call's order,
// with the same message, and a later synchronous error loses to an earlier failing check. The
// device's flags agree with the host's comparison for every f32 (NaNs of either sign, infinities,
// both zeros, subnormals, the bounds' neighbours), also for an array larger than one storage
// binding; the gpu arm reports every pending check of the arrays it uploads, forward and backward;
// and kda and kdaVjp on large inputs report a bad value exactly as a small call does, on the cpu
// and gpu arms.

import assert from "node:assert/strict";
import { kda, type KdaInputs, kdaVjp, resetSeamCounts, seamCounts } from "../mod.ts";
import { DEFER_CHECK_BYTES, firstOutside, ValueChecks } from "../kda/op/_value_checks.ts";
import { CallChecks, intervalKeys, orderKey } from "../kda/gpu/range_checks.ts";
import { getContext } from "../kda/gpu/device.ts";
import { BufferSet, upload } from "../kda/gpu/buffers.ts";
import { stageReads } from "../kda/gpu/readback.ts";
import { gpuBackward, gpuForward } from "../kda/gpu/mod.ts";
import { mulberry32 } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu, status } from "./_gpu.ts";

reportMissingGpu("value_checks_test.ts");

function randomArray(n: number, f64 = false, seed = 1): Float32Array | Float64Array {
  const rand = mulberry32(seed);
  const a = f64 ? new Float64Array(n) : new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = rand() - 0.5;
  return a;
}

const BAD = [Number.NaN, Infinity, -Infinity, 7];
const F32_MAX = 3.4028234663852886e38;

/** The f32 of these bits. */
function f32Of(bits: number): number {
  return new Float32Array(new Uint32Array([bits]).buffer)[0];
}

/** The intervals the op checks, and some whose bounds no f32 holds. */
const INTERVALS: [number, number][] = [
  [-Number.MAX_VALUE, Number.MAX_VALUE],
  [-Number.MAX_VALUE, 0],
  [0, 1],
  [0, 2],
  [-0.5, 0.5],
  [0.1, 0.3],
  [-1e-45, 1e-45],
  [-F32_MAX, F32_MAX],
  [1, 0],
  [-Infinity, Infinity],
];

/** f32 values at the edges: NaNs of both signs, infinities, zeros, subnormals, the bounds' neighbours. */
function edgeValues(): number[] {
  const bits = [
    0x7fc00000,
    0xffc00000,
    0x7f800001,
    0xff800001,
    0x7f800000,
    0xff800000,
    0,
    0x80000000,
    1,
    0x80000001,
    0x007fffff,
    0x807fffff,
    0x7f7fffff,
    0xff7fffff,
    0x3f800000,
    0x3f800001,
    0x3f7fffff,
    0x40000000,
    0x40000001,
    0xbf000000,
    0x3f000000,
    0x3f000001,
  ];
  const values = bits.map(f32Of);
  for (const [lo, hi] of INTERVALS) {
    for (const b of [lo, hi]) {
      const f = Math.fround(b);
      if (Number.isFinite(f)) {
        values.push(f, f32Of(new Uint32Array(new Float32Array([f]).buffer)[0] + 1));
      }
    }
  }
  return values;
}

Deno.test("the order keys of an interval hold exactly the f32 values the host's check passes", () => {
  const rand = mulberry32(3);
  const bits = new Uint32Array(4000);
  for (let i = 0; i < bits.length; i++) bits[i] = Math.floor(rand() * 2 ** 32);
  const values = [...new Float32Array(bits.buffer), ...edgeValues()];
  const bitsOf = (v: number) => new Uint32Array(new Float32Array([v]).buffer)[0];
  for (const [lo, hi] of INTERVALS) {
    const keys = intervalKeys(lo, hi);
    for (const v of values) {
      // the NaN of edgeValues' bits keeps its payload through Float32Array only when read there
      const key = orderKey(bitsOf(v));
      assert.equal(key >= keys.lo && key <= keys.hi, v >= lo && v <= hi, `${v} in [${lo}, ${hi}]`);
    }
  }
});

/** Runs checks of `arrays` on the device through CallChecks and returns what it reported. */
async function deviceOutcomes(
  checks: { array: Float32Array; lo: number; hi: number }[],
): Promise<Map<number, boolean>> {
  const ctx = await getContext();
  const set = new BufferSet(ctx.device);
  const outcomes = new Map<number, boolean>();
  try {
    const call = (await CallChecks.make(ctx, set, {
      list: checks,
      report: (i, passed) => outcomes.set(i, passed),
      decideNow() {},
    }))!;
    const arrays = [...new Set(checks.map((c) => c.array))];
    const uploaded = arrays.map((a) => {
      const buffer = set.make("checked", Math.max(16, 4 * a.length));
      upload(ctx.device.queue, buffer, 0, a);
      return [a, { buffer, shape: [a.length], dtype: "f32" as const }] as const;
    });
    const encoder = ctx.device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    for (const p of call.passes(set, uploaded)) p.encode(pass);
    pass.end();
    const staged = stageReads((l, b, u) => set.make(l, b, u), encoder, [call.read()], "flags");
    ctx.device.queue.submit([encoder.finish()]);
    await staged.map();
    call.report(staged.copyOut()[0]);
  } finally {
    set.destroyAll();
  }
  return outcomes;
}

gpuTest("the device's value flags agree with the host's check for every edge value", async () => {
  const edges = new Float32Array(edgeValues());
  // the NaNs' payloads and signs as bits: a Float32Array from numbers would canonicalise them
  const nanBits = new Uint32Array([0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0xffffffff]);
  const checks = [];
  for (const [lo, hi] of INTERVALS) {
    for (const [i, v] of edges.entries()) {
      const array = randomArray(300, false, i) as Float32Array;
      array[(i * 37) % 300] = v;
      if (v >= -0.5 && v <= 0.5) array[(i * 37 + 1) % 300] = 0; // a passing edge alone
      checks.push({ array, lo, hi });
    }
    for (const b of nanBits) {
      const array = randomArray(64, false, b) as Float32Array;
      new Uint32Array(array.buffer)[17] = b;
      checks.push({ array, lo, hi });
    }
  }
  const got = await deviceOutcomes(checks);
  assert.equal(got.size, checks.length, "every check reported");
  checks.forEach(({ array, lo, hi }, i) => {
    assert.equal(got.get(i), firstOutside(array, lo, hi) < 0, `check ${i}: [${lo}, ${hi}]`);
  });
});

// An array longer than one storage binding needs a buffer longer than one binding: an adapter
// whose buffers are no larger than a binding never slices a check, and cannot run this test.
const limits = status.available ? status.info.limits : undefined;
const sliceable = limits === undefined ||
  limits.maxBufferSize >= limits.maxStorageBufferBindingSize + 4 * 4096 + 256;

gpuTest("an array larger than one storage binding is checked in every slice", async () => {
  const ctx = await getContext();
  const n = ctx.info.limits.maxStorageBufferBindingSize / 4 + 4096;
  const array = new Float32Array(n).fill(0.25);
  array[5] = 0.75; // in the first slice
  array[n - 3] = -0.75; // in the second
  const got = await deviceOutcomes([
    { array, lo: -1, hi: 1 },
    { array, lo: -1, hi: 0.5 }, // fails in the first slice only
    { array, lo: -0.5, hi: 1 }, // fails in the second slice only
  ]);
  assert.deepEqual([...got.entries()], [[0, true], [1, false], [2, false]]);
}, { ignore: !sliceable });

/** Runs one call's checks (a list of arrays, each with its interval) and returns its error. */
async function errorOf(
  arrays: (Float32Array | Float64Array)[],
  deferBytes: number,
  options: { later?: Error; armReports?: boolean } = {},
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
    if (options.later !== undefined) throw options.later;
    // an arm that ran every other pending check reports it, as the gpu arm does
    if (options.armReports === true) {
      checks.list.forEach(({ array, lo, hi }, i) => {
        if (i % 2 === 0) checks.report(i, firstOutside(array as Float32Array, lo, hi) < 0);
      });
    }
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

Deno.test("value checks give the first failure in order, with its message, at once or pending", async () => {
  const rand = mulberry32(9);
  for (let trial = 0; trial < 20; trial++) {
    const sizes = [300, 5, 2000, 40, 1000];
    const arrays = sizes.map((n, i) => randomArray(n, i % 2 === 0, trial * 11 + i));
    for (const [i, a] of arrays.entries()) {
      if (rand() < 0.35) a[Math.floor(rand() * a.length)] = BAD[(trial + i) % BAD.length];
    }
    const later = trial % 3 === 0 ? new TypeError("a later structural error") : undefined;
    const atOnce = await errorOf(arrays, Infinity, { later });
    for (const armReports of [false, true]) {
      // every array pending, and the large ones only (small failures met while large ones wait)
      const how = armReports ? "with an arm's reports" : "decided on the host";
      assert.equal(
        await errorOf(arrays, 0, { later, armReports }),
        atOnce,
        `trial ${trial}, all, ${how}`,
      );
      assert.equal(
        await errorOf(arrays, 1000 * 4, { later, armReports }),
        atOnce,
        `trial ${trial}, large, ${how}`,
      );
    }
  }
});

Deno.test("a pending check is decided once: reports after the verdict change nothing, and a failure the copy does not hold is an error", async () => {
  const error = (v: number, i: number) => new RangeError(`got ${v} at ${i}`);
  const checks = new ValueChecks({ deferBytes: 0 });
  const a = new Float32Array([0.1, 0.2]);
  checks.check(a, -1, 1, error);
  assert.throws(() => checks.report(1, true), /index must name a pending check \(0 to 0\): got 1/);
  await checks.verdict();
  assert.equal(checks.list.length, 0);
  checks.report(0, false); // too late: ignored
  await checks.verdict();
  // an arm that says a check failed where the copy holds no such element: never a pass
  const wrong = new ValueChecks({ deferBytes: 0 });
  wrong.check(a, -1, 1, error);
  wrong.report(0, false);
  await assert.rejects(
    () => wrong.verdict(),
    /internal: pending value check 0 failed on the device/,
  );
  // one that says a check passed is believed: the host does not scan it again
  const trusted = new ValueChecks({ deferBytes: 0 });
  trusted.check(new Float32Array([Number.NaN]), -1, 1, error);
  trusted.report(0, true);
  await trusted.verdict();
});

Deno.test("a check that runs at once and fails throws at once; settled, an earlier one wins", async () => {
  const small = randomArray(4);
  small[2] = Number.NaN;
  const error = (v: number, i: number) => new RangeError(`got ${v} at ${i}`);
  const checks = new ValueChecks({ deferBytes: 64 });
  assert.throws(() => checks.check(small, -1, 1, error), /got NaN at 2/);
  const waiting = new ValueChecks({ deferBytes: 64 });
  const large = randomArray(100);
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

/** The bad values of the large calls' cases, each with the error a small call gives. */
const SPOILS: [string, (y: KdaInputs<Float32Array>) => void, RegExp][] = [
  ["q", (y) => (y.q[123457] = Number.NaN), /inputs\.q must be finite: got NaN at index 123457/],
  ["g", (y) => (y.g[99] = 0.25), /inputs\.g must be <= 0 \(a log decay\): got 0\.25 at index 99/],
  ["beta", (y) => (y.beta[3] = 1.5), /inputs\.beta must be in \[0, 1\].*got 1\.5 at index 3/],
];

async function largeCallsReport(arm: "cpu" | "gpu"): Promise<void> {
  const x = largeInputs();
  const options = { arm, strict: true, quiet: true } as const;
  const dout = new Float32Array(x.v.length).fill(0.01);
  for (const [name, spoil, message] of SPOILS) {
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
}

Deno.test("a large kda or kdaVjp on the cpu arm reports a bad value as a small call does, before a later error", async () => {
  await largeCallsReport("cpu");
});

Deno.test("a large kda on the cpu arm decides its pending checks before it computes", async () => {
  const x = largeInputs();
  const y = { ...x, v: x.v.slice() };
  y.v[5] = Number.NaN;
  resetSeamCounts();
  await assert.rejects(
    () => kda(y, { arm: "cpu", strict: true, quiet: true }),
    /inputs\.v must be finite: got NaN at index 5/,
  );
  // asked for, and no forward ran (the seam counts a fused forward once it returned)
  const { asked, fusedFwd } = seamCounts();
  assert.deepEqual({ asked, fusedFwd }, { asked: 1, fusedFwd: 0 });
  await kda(x, { arm: "cpu", strict: true, quiet: true });
  assert.equal(seamCounts().fusedFwd, 1);
});

gpuTest(
  "a large kda or kdaVjp on the gpu arm reports a bad value as a small call does, before a later error",
  async () => {
    await largeCallsReport("gpu");
  },
);

gpuTest(
  "the gpu arm reports every pending check of the arrays it uploads, from its flags",
  async () => {
    const x = largeInputs();
    const problem = { ...x, scale: 1 / Math.sqrt(x.K) };
    const dout = new Float32Array(x.v.length).fill(0.01);
    problem.k = x.k.slice();
    problem.k[31] = Number.NaN;
    const dht = new Float32Array(x.K * x.V);
    const other = new Float32Array(4);
    const list = [
      { array: problem.q, lo: -1, hi: 1 },
      { array: problem.k, lo: -1, hi: 1 },
      { array: problem.g, lo: -1, hi: 0 },
      { array: problem.g, lo: -1, hi: -0.1 }, // every g is -0.05: fails
      { array: dout, lo: -1, hi: 1 },
      { array: other, lo: -1, hi: 1 }, // no call uploads it: left unreported
      { array: dht, lo: 0, hi: 0 },
    ];
    const spy = () => {
      const got = new Map<number, boolean>();
      const checks = {
        list,
        report: (i: number, ok: boolean) => got.set(i, ok),
        decideNow: () => assert.fail("the gpu arm decides no check on the host"),
      };
      return { got, checks };
    };
    // a forward that reads its outputs reports its inputs' checks with them
    const fwd = spy();
    await gpuForward(problem, { chunkSize: 64, checks: fwd.checks });
    assert.deepEqual([...fwd.got.entries()], [[0, true], [1, false], [2, true], [3, false]]);
    // a forward run for its backward leaves them to the backward, which adds its cotangents'
    const vjp = spy();
    const { saved } = await gpuForward(problem, {
      chunkSize: 64,
      saveForBackward: true,
      outputs: false,
      checks: vjp.checks,
    });
    assert.equal(vjp.got.size, 0, "nothing reported before the backward's read");
    try {
      await gpuBackward(saved!, { dout, dht });
    } finally {
      saved!.release();
    }
    assert.deepEqual(
      [...vjp.got.entries()].sort((a, b) => a[0] - b[0]),
      [[0, true], [1, false], [2, true], [3, false], [4, true], [6, true]],
    );
  },
);
