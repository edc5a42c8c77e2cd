// The tape at the ends of f64's range, and what it hands back: sigmoid's gradient where 1 − σ(x)
// would cancel, l2norm and rmsnorm of rows whose Σx² overflows or (eps = 0) underflows, rows that
// do not exist, constant's dtype, gradients that must be arrays of their own, and a custom node's
// VJP of the wrong type, and shapes and ranges of the wrong kind.

import assert from "node:assert/strict";
import {
  constant,
  customNode,
  l2norm,
  reshape,
  rmsnorm,
  sigmoid,
  slice,
  Tape,
  Tensor,
} from "../tape/mod.ts";

Deno.test("sigmoid's gradient is exact where 1 − σ(x) would cancel (x up to 100)", async () => {
  for (const x of [10, 20, 30, 37, 40, 100]) {
    const tape = new Tape("f64");
    const v = tape.variable(new Float64Array([x]));
    const g = (await tape.backward(sigmoid(v))).get(v)![0];
    // σ'(x) = e^{−x} / (1 + e^{−x})², computed where it cannot cancel
    const exact = Math.exp(-x) / (1 + Math.exp(-x)) ** 2;
    const rel = Math.abs(g - exact) / exact;
    if (!(rel <= 1e-14)) assert.fail(`x = ${x}: got ${g}, exact ${exact}, relative error ${rel}`);
  }
});

Deno.test("l2norm and rmsnorm keep rows whose Σx² overflows f64, or underflows with eps = 0, finite and right", async () => {
  const cases: [string, (t: Tensor) => Tensor, number[], number[]][] = [
    ["l2norm", (t) => l2norm(t), [3e200, 4e200], [0.6, 0.8]],
    ["l2norm eps 0", (t) => l2norm(t, { eps: 0 }), [3e-170, 4e-170], [0.6, 0.8]],
    ["rmsnorm", (t) => rmsnorm(t), [3e160, 4e160], [0.6 * Math.SQRT2, 0.8 * Math.SQRT2]],
    ["rmsnorm eps 0", (t) => rmsnorm(t, { eps: 0 }), [3e-170, 4e-170], [
      0.6 * Math.SQRT2,
      0.8 * Math.SQRT2,
    ]],
  ];
  for (const [label, op, x, want] of cases) {
    const tape = new Tape("f64");
    const v = tape.variable(new Float64Array(x), [1, 2]);
    const y = op(v);
    for (let i = 0; i < 2; i++) {
      const err = Math.abs(y.data[i] - want[i]);
      if (!(err <= 1e-15)) assert.fail(`${label}: y[${i}] = ${y.data[i]}, want ${want[i]}`);
    }
    // the gradient of y0: (r)(e0 − y y0·) — finite, and orthogonal to x as a norm's must be
    const g = (await tape.backward(y, new Float64Array([1, 0]))).get(v)!;
    assert.ok(g.every(Number.isFinite), `${label}: gradient ${g}`);
    const dot = Math.abs(g[0] * x[0] + g[1] * x[1]) /
      (Math.hypot(g[0], g[1]) * Math.hypot(x[0], x[1]));
    if (!(dot <= 1e-14)) assert.fail(`${label}: the gradient is not orthogonal to x (${dot})`);
  }
  // an ordinary row keeps the plain formula's bits
  const plain = l2norm(new Tensor(new Float64Array([3, 4]), [1, 2]));
  assert.deepEqual(Array.from(plain.data), [3 / Math.sqrt(25 + 1e-6), 4 / Math.sqrt(25 + 1e-6)]);
});

Deno.test("l2norm and rmsnorm of a scalar, and constant() of an unknown dtype, are named errors", () => {
  const scalar = new Tensor(new Float64Array([2]), []);
  assert.throws(
    () => l2norm(scalar),
    /^RangeError: l2norm\(\) x must have at least one axis \(its rows\): got a scalar$/,
  );
  assert.throws(() => rmsnorm(scalar), /^RangeError: rmsnorm\(\) x must have at least one axis/);
  for (const dtype of ["f16", "F64"]) {
    assert.throws(
      () => constant(dtype as "f64", [1, 2]),
      new RegExp(`^TypeError: constant\\(\\) dtype must be "f64" or "f32": got ${dtype}$`),
    );
  }
});

Deno.test("each gradient backward returns is an array of its own, not the caller's cotangent or another's", async () => {
  const tape = new Tape("f64");
  const x = tape.variable(new Float64Array([1, 2]));
  const dy = new Float64Array([5, 6]);
  const g = (await tape.backward(reshape(x, [2, 1]), dy)).get(x)!;
  assert.notEqual(g, dy);
  g[0] = 0; // clipping in place
  assert.deepEqual(Array.from(dy), [5, 6]);
  const a = tape.variable(new Float64Array([1]));
  const b = tape.variable(new Float64Array([2]));
  const seed = new Float64Array([3]);
  const grads = await tape.backwardFrom([{ output: a, cotangent: seed }, {
    output: b,
    cotangent: seed,
  }]);
  assert.notEqual(grads.get(a), grads.get(b));
  assert.notEqual(grads.get(a), seed);
  assert.deepEqual([grads.get(a)![0], grads.get(b)![0]], [3, 3]);
});

Deno.test("a custom node whose VJP returns another dtype than the tape's is named", async () => {
  const tape = new Tape("f64");
  const x = tape.variable(new Float64Array([1, 2]));
  const [y] = customNode("halver", {
    inputs: [x],
    outputs: [{ data: x.data.map((v) => v / 2), shape: [2] }],
    vjp: ([g]) => [Float32Array.from(g!, (v) => v / 2)],
  });
  await assert.rejects(
    () => tape.backward(y),
    /^TypeError: halver's VJP result for input 0 must match the tape's dtype f64: got f32$/,
  );
});

Deno.test("a shape or range of the wrong kind is a named TypeError, not a JavaScript one", () => {
  const d = new Float64Array(2);
  assert.throws(
    () => new Tensor(d, 2 as never),
    /^TypeError: Tensor shape must be an array of dimensions: got number$/,
  );
  const x = new Tensor(d, [2]);
  assert.throws(
    () => reshape(x, 2 as never),
    /^TypeError: reshape\(\) shape must be an array of dimensions: got number$/,
  );
  assert.throws(
    () => slice(x, 0, undefined as never),
    /^TypeError: slice\(\) range must be an object \{ start, end \}: got undefined$/,
  );
});
