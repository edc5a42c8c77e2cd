import assert from "node:assert/strict";
import { CONV_GROUPS, EXPECTED_GROUPS, runProof } from "../checks/prove.ts";
import {
  agreement,
  derivedStep,
  probeCoordinate,
  probeIndices,
  resolvableFloor,
} from "../checks/compare.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

const small = { dModel: 16, heads: 2, keyDim: 8, valueDim: 8, decayRank: 4 };

Deno.test("runProof() holds on the cpu arm: every group resolved, falsification red, rerun identical", async () => {
  const report = await runProof({ arm: "cpu", config: small, dims: [2, 40] });
  assert.deepEqual(report.groups, { missing: [], extra: [] });
  assert.equal(report.rows.length, EXPECTED_GROUPS.length);
  for (const row of report.rows) {
    assert.ok(row.resolved, `${row.name} unresolved`);
    if (!(row.rel <= 1e-6)) throw new Error(`${row.name}: rel ${row.rel}`);
  }
  assert.ok(report.falsification.ok);
  assert.equal(report.falsification.red.length, 8);
  assert.ok(report.reproducible.ok);
  assert.equal(report.seam.fusedFwd, 1);
  assert.equal(report.seam.customNodeBwd, 1);
  assert.equal(report.seam.opsPath, 0);
  assert.ok(report.ok);
});

Deno.test("runProof() with the short conv proves 14 groups", async () => {
  const report = await runProof({
    arm: "cpu",
    config: { ...small, shortConv: true },
    dims: [1, 24],
  });
  assert.deepEqual(
    report.rows.map((r) => r.name).sort(),
    [...EXPECTED_GROUPS, ...CONV_GROUPS].sort(),
  );
  assert.ok(report.ok, JSON.stringify(report.rows.filter((r) => !r.ok)));
});

Deno.test("the falsification goes red: detached outputs zero every upstream group", async () => {
  const report = await runProof({ arm: "cpu", config: small, dims: [1, 20] });
  assert.deepEqual(
    report.falsification.red.sort(),
    EXPECTED_GROUPS.filter((n) => !["o_norm_w", "o_gate.weight", "o_proj.weight"].includes(n))
      .sort(),
  );
});

Deno.test("agreement() reports NaN as a failure and keeps both magnitudes", () => {
  const nan = agreement([1, NaN], [1, 2]);
  assert.ok(!(nan.rel <= 1));
  const a = agreement([1, 2.5], [1, 2]);
  assert.equal(a.absDiff, 0.5);
  assert.equal(a.refMax, 2);
  assert.equal(a.rel, 0.25);
  assert.equal(agreement([1], [0]).rel, Infinity);
  assert.throws(() => agreement([1], [1, 2]), RangeError);
});

Deno.test("probeCoordinate() refuses to judge a derivative below the resolvable floor", async () => {
  // L(θ) = 1e3 + 1e-12·θ: the slope is far below what rounding of a loss of size 1e3 resolves.
  const probe = await probeCoordinate(
    (d) => Promise.resolve(1e3 + 1e-12 * d),
    1e-12,
    0,
    1e-3,
    Number.EPSILON,
    1e3,
  );
  assert.equal(probe.resolved, false);
  assert.ok(Number.isNaN(probe.rel));
  assert.ok(probe.floor[0] > 1e-12);
  // A resolvable slope with a wrong claimed gradient gives a large relative error.
  const wrong = await probeCoordinate((d) => Promise.resolve(3 * d), 2, 0, 1e-3, Number.EPSILON, 1);
  assert.ok(wrong.resolved);
  assert.ok(Math.abs(wrong.rel - 0.5) < 1e-9);
});

Deno.test("derivedStep() and resolvableFloor() follow DESIGN.md 4", () => {
  const h = derivedStep(Number.EPSILON, 10, 2, 1);
  assert.ok(Math.abs(h - Math.cbrt(3 * Number.EPSILON * 10 / 2)) < 1e-18);
  assert.equal(derivedStep(Number.EPSILON, 1e30, 1e-30, 0.02), 0.002);
  assert.equal(resolvableFloor(Number.EPSILON, 4, 1e-3), 32 * Number.EPSILON * 4 / 1e-3);
});

Deno.test("probeIndices() picks the argmax and two large coordinates spread over the tensor", () => {
  assert.deepEqual(probeIndices([0.1, 5, 0.2, 3, 0.01, 2, 0.3]), [1, 3, 5]);
  assert.deepEqual(probeIndices([0, 1]), [1]);
});

reportMissingGpu("prove_test");
gpuTest("runProof() holds on the gpu arm against the f64 reference on the same bytes", async () => {
  const report = await runProof({ arm: "gpu", config: small, dims: [2, 40] });
  assert.equal(report.dtype, "f32");
  assert.ok(report.forward.ok, `forward ${report.forward.rel}`);
  for (const row of report.reference) assert.ok(row.ok, `${row.name} ${row.agreement.rel}`);
  assert.ok(report.falsification.ok);
  assert.ok(report.reproducible.ok, report.reproducible.mismatched.join(", "));
  assert.equal(report.seam.opsPath, 0);
  assert.equal(report.seam.declined, 0);
  assert.ok(report.ok);
});
