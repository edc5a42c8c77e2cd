// Gradient checks for every tape op against central differences, plus the tape's semantics.

import assert from "node:assert/strict";
import {
  BINARY,
  type Domain,
  dotOnTape,
  expectClose,
  FD_TOL,
  gradCheck,
  mlp,
  MLP_SPECS,
  mulberry32,
  randomData,
  squareNode,
  UNARY,
  worstSeen,
} from "./_tape_check.ts";
import * as T from "../tape/mod.ts";
import { Tape, Tensor } from "../tape/mod.ts";
import type { Data } from "../tape/mod.ts";

// ---------------------------------------------------------------------------------------------
// Elementwise binary ops with broadcasting

const BROADCAST_CASES: [number[], number[]][] = [
  [[2, 3], [2, 3]],
  [[2, 3], [3]],
  [[3], [2, 3]],
  [[2, 3], [2, 1]],
  [[2, 1, 4], [3, 1]],
  [[3, 1], [2, 1, 4]],
  [[2, 3], [1]],
  [[1], [2, 3]],
  [[2, 3], []],
  [[1, 3], [2, 1]],
];

for (const [name, fn] of Object.entries(BINARY)) {
  const bDomain: Domain = name === "div" ? "awayFromZero" : "real";
  Deno.test(`${name}() VJP matches central differences with broadcasting, both operands requiring grad`, async () => {
    let seed = 10;
    for (const [sa, sb] of BROADCAST_CASES) {
      await gradCheck(
        `${name}([${sa}], [${sb}])`,
        ([a, b]) => fn(a, b),
        [{ shape: sa }, { shape: sb, domain: bDomain }],
        seed++,
      );
    }
  });

  Deno.test(`${name}() VJP matches central differences when one operand is a constant`, async () => {
    await gradCheck(`${name}(var, const)`, ([a, b]) => fn(a, b), [
      { shape: [2, 3] },
      { shape: [3], domain: bDomain, constant: true },
    ], 3);
    await gradCheck(`${name}(const, var)`, ([a, b]) => fn(a, b), [
      { shape: [2, 1], constant: true },
      { shape: [2, 3], domain: bDomain },
    ], 4);
  });

  Deno.test(`${name}() sums the broadcast cotangent back to each operand's shape`, async () => {
    const tape = new Tape("f64");
    const a = tape.variable(new Float64Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    const b = tape.variable(new Float64Array([2]), [1]);
    const y = fn(a, b);
    assert.deepEqual(y.shape, [2, 3]);
    const grads = await tape.backward(y);
    assert.equal(grads.get(a)!.length, 6);
    assert.equal(grads.get(b)!.length, 1);
    const expectB = { add: 6, sub: -6, mul: 21, div: -21 / 4 }[name]!;
    assert.ok(Math.abs(grads.get(b)![0] - expectB) < 1e-12, `${name}: got ${grads.get(b)![0]}`);
  });
}

Deno.test("add() of a tensor with itself accumulates both cotangents", async () => {
  await gradCheck("add(x, x)", ([x]) => T.add(x, x), [{ shape: [2, 3] }], 5);
  await gradCheck("mul(x, x)", ([x]) => T.mul(x, x), [{ shape: [2, 3] }], 6);
});

// ---------------------------------------------------------------------------------------------
// Unary ops

Deno.test("scale() VJP matches central differences", async () => {
  await gradCheck("scale(x, -2.5)", ([x]) => T.scale(x, -2.5), [{ shape: [3, 4] }], 20);
});

for (const [name, fn, domain] of UNARY) {
  Deno.test(`${name}() VJP matches central differences on ${domain} inputs`, async () => {
    await gradCheck(name, ([x]) => fn(x), [{ shape: [3, 5], domain }], 30);
  });
}

Deno.test("unary ops compute the right forward values, also far in the tails", () => {
  const x = T.constant("f64", [-800, -3, 0, 0.5, 3, 800]);
  const ref: [string, (x: Tensor) => Tensor, (v: number) => number][] = [
    ["sigmoid", T.sigmoid, (v) => 1 / (1 + Math.exp(-v))],
    ["silu", T.silu, (v) => v / (1 + Math.exp(-v))],
    ["softplus", T.softplus, (v) => v > 30 ? v : Math.log(1 + Math.exp(v))],
  ];
  for (const [name, fn, f] of ref) {
    const y = fn(x);
    y.data.forEach((v, i) => {
      const want = f(x.data[i]);
      assert.ok(Math.abs(v - want) <= 1e-15 * Math.max(1, Math.abs(want)), `${name}(${x.data[i]})`);
    });
  }
  const p = T.constant("f64", [0.25, 4]);
  assert.deepEqual([...T.exp(T.constant("f64", [0, 1])).data], [1, Math.E]);
  assert.deepEqual([...T.log(p).data], [Math.log(0.25), Math.log(4)]);
  assert.deepEqual([...T.sqrt(p).data], [0.5, 2]);
  assert.deepEqual([...T.rsqrt(p).data], [2, 0.5]);
  assert.deepEqual([...T.scale(p, 3).data], [0.75, 12]);
});

// ---------------------------------------------------------------------------------------------
// Linear algebra

Deno.test("matmul() VJP matches central differences", async () => {
  await gradCheck("matmul", ([a, b]) => T.matmul(a, b), [{ shape: [3, 4] }, { shape: [4, 2] }], 40);
  await gradCheck("matmul(const, var)", ([a, b]) => T.matmul(a, b), [
    { shape: [1, 3], constant: true },
    { shape: [3, 5] },
  ], 41);
  await gradCheck("matmul(var, const)", ([a, b]) => T.matmul(a, b), [
    { shape: [2, 3] },
    { shape: [3, 1], constant: true },
  ], 42);
});

Deno.test("matmul() forward computes the matrix product", () => {
  const a = T.constant("f64", [1, 2, 3, 4, 5, 6], [2, 3]);
  const b = T.constant("f64", [1, 0, 0, 1, 1, 1], [3, 2]);
  const y = T.matmul(a, b);
  assert.deepEqual(y.shape, [2, 2]);
  assert.deepEqual([...y.data], [4, 5, 10, 11]);
});

Deno.test("transpose() VJP matches central differences", async () => {
  await gradCheck("transpose", ([x]) => T.transpose(x), [{ shape: [3, 5] }], 50);
  const t = T.transpose(T.constant("f64", [1, 2, 3, 4, 5, 6], [2, 3]));
  assert.deepEqual(t.shape, [3, 2]);
  assert.deepEqual([...t.data], [1, 4, 2, 5, 3, 6]);
});

Deno.test("linear() VJP matches central differences for input and weight", async () => {
  await gradCheck("linear", ([x, w]) => T.linear(x, w), [{ shape: [4, 3] }, { shape: [5, 3] }], 60);
});

// ---------------------------------------------------------------------------------------------
// Shape ops

Deno.test("sum() VJP matches central differences on every axis, with and without keepDims", async () => {
  let seed = 70;
  for (const axis of [0, 1, 2, -1, -3]) {
    for (const keepDims of [false, true]) {
      await gradCheck(
        `sum(axis ${axis}, keepDims ${keepDims})`,
        ([x]) => T.sum(x, axis, { keepDims }),
        [{ shape: [2, 3, 4] }],
        seed++,
      );
    }
  }
  const x = T.constant("f64", [1, 2, 3, 4, 5, 6], [2, 3]);
  assert.deepEqual([...T.sum(x, 0).data], [5, 7, 9]);
  assert.deepEqual(T.sum(x, 1, { keepDims: true }).shape, [2, 1]);
  assert.deepEqual([...T.sum(x, -1).data], [6, 15]);
});

Deno.test("reshape() VJP matches central differences", async () => {
  await gradCheck("reshape", ([x]) => T.reshape(x, [4, 6]), [{ shape: [2, 3, 4] }], 80);
  await gradCheck("reshape to scalar", ([x]) => T.reshape(x, []), [{ shape: [1, 1] }], 81);
});

Deno.test("slice() VJP matches central differences on inner and outer axes", async () => {
  await gradCheck(
    "slice(axis 1, [1, 3))",
    ([x]) => T.slice(x, 1, { start: 1, end: 3 }),
    [{ shape: [2, 4, 3] }],
    90,
  );
  await gradCheck(
    "slice(axis 0, [0, 1))",
    ([x]) => T.slice(x, 0, { start: 0, end: 1 }),
    [{ shape: [3, 2] }],
    91,
  );
  await gradCheck(
    "slice(axis -1, [2, 3))",
    ([x]) => T.slice(x, -1, { start: 2, end: 3 }),
    [{ shape: [2, 2, 3] }],
    92,
  );
  const y = T.slice(T.constant("f64", [1, 2, 3, 4, 5, 6], [2, 3]), 1, { start: 1, end: 3 });
  assert.deepEqual([...y.data], [2, 3, 5, 6]);
});

Deno.test("concat() VJP matches central differences, with a constant piece", async () => {
  await gradCheck(
    "concat(axis 1)",
    ([a, b, c]) => T.concat([a, b, c], 1),
    [{ shape: [2, 1, 3] }, { shape: [2, 3, 3], constant: true }, { shape: [2, 2, 3] }],
    100,
  );
  await gradCheck(
    "concat(axis 0)",
    ([a, b]) => T.concat([a, b], 0),
    [{ shape: [1, 4] }, { shape: [2, 4] }],
    101,
  );
  await gradCheck(
    "concat(axis -1)",
    ([a, b]) => T.concat([a, b], -1),
    [{ shape: [2, 2] }, { shape: [2, 3] }],
    102,
  );
  const y = T.concat(
    [T.constant("f64", [1, 2], [2, 1]), T.constant("f64", [3, 4, 5, 6], [2, 2])],
    1,
  );
  assert.deepEqual([...y.data], [1, 3, 4, 2, 5, 6]);
});

Deno.test("unstack() VJP matches central differences on every axis", async () => {
  let seed = 110;
  for (const axis of [0, 1, 2, -1]) {
    await gradCheck(
      `unstack(axis ${axis})`,
      ([x]) => T.unstack(x, axis),
      [{ shape: [2, 3, 4] }],
      seed++,
    );
  }
});

Deno.test("unstack() sends no cotangent to unused pieces and still gets the used ones right", async () => {
  await gradCheck("unstack(...)[1]", ([x]) => T.unstack(x, 1)[1], [{ shape: [2, 3, 2] }], 115);
  const pieces = T.unstack(T.constant("f64", [1, 2, 3, 4, 5, 6], [2, 3]), 1);
  assert.equal(pieces.length, 3);
  assert.deepEqual([...pieces[2].data], [3, 6]);
  assert.deepEqual(pieces[2].shape, [2]);
});

Deno.test("stack() VJP matches central differences on every axis", async () => {
  let seed = 120;
  for (const axis of [0, 1, 2, -1, -3]) {
    await gradCheck(
      `stack(axis ${axis})`,
      ([a, b, c]) => T.stack([a, b, c], axis),
      [{ shape: [2, 3] }, { shape: [2, 3], constant: true }, { shape: [2, 3] }],
      seed++,
    );
  }
  const y = T.stack([T.constant("f64", [1, 2]), T.constant("f64", [3, 4])], 1);
  assert.deepEqual(y.shape, [2, 2]);
  assert.deepEqual([...y.data], [1, 3, 2, 4]);
  // a negative axis counts from the end of the result's axes, as numpy's does
  const last = T.stack([T.constant("f64", [1, 2]), T.constant("f64", [3, 4])], -1);
  assert.deepEqual([...last.data], [1, 3, 2, 4]);
  const first = T.stack([T.constant("f64", [1, 2]), T.constant("f64", [3, 4])], -2);
  assert.deepEqual([...first.data], [1, 2, 3, 4]);
  assert.throws(
    () => T.stack([T.constant("f64", [1, 2])], -3),
    { name: "RangeError", message: "stack() axis must be an integer in [-2, 1]: got -3" },
  );
});

// ---------------------------------------------------------------------------------------------
// Convolution and normalisation

Deno.test("causalConv() VJP matches central differences for u and w", async () => {
  await gradCheck("causalConv(T 5, W 4)", ([u, w]) => T.causalConv(u, w), [
    { shape: [2, 5, 3] },
    { shape: [3, 4] },
  ], 130);
  await gradCheck("causalConv(T 2, W 3)", ([u, w]) => T.causalConv(u, w), [
    { shape: [1, 2, 2] },
    { shape: [2, 3] },
  ], 131);
});

Deno.test("causalConv() forward is causal and uses the last tap for the current token", () => {
  const u = T.constant("f64", [1, 2, 3], [1, 3, 1]);
  assert.deepEqual([...T.causalConv(u, T.constant("f64", [0.5, 1], [1, 2])).data], [1, 2.5, 4]);
  // Two channels, each its own taps.
  const u2 = T.constant("f64", [1, 10, 2, 20], [1, 2, 2]);
  const w2 = T.constant("f64", [1, 0, 0, 1], [2, 2]);
  assert.deepEqual([...T.causalConv(u2, w2).data], [0, 10, 1, 20]);
});

Deno.test("l2norm() VJP matches central differences, default and zero eps", async () => {
  await gradCheck("l2norm", ([x]) => T.l2norm(x), [{ shape: [3, 4] }], 140);
  await gradCheck("l2norm(eps 0)", ([x]) => T.l2norm(x, { eps: 0 }), [{ shape: [2, 5] }], 141);
  await gradCheck("l2norm(eps 0.3)", ([x]) => T.l2norm(x, { eps: 0.3 }), [{ shape: [2, 3] }], 142);
  const y = T.l2norm(T.constant("f64", [3, 4], [1, 2]), { eps: 0 });
  expectClose("l2norm([3, 4])", y.data, [0.6, 0.8], 1e-15);
});

Deno.test("rmsnorm() VJP matches central differences, default and large eps", async () => {
  await gradCheck("rmsnorm", ([x]) => T.rmsnorm(x), [{ shape: [3, 5] }], 150);
  await gradCheck(
    "rmsnorm(eps 0.5)",
    ([x]) => T.rmsnorm(x, { eps: 0.5 }),
    [{ shape: [2, 4] }],
    151,
  );
  const y = T.rmsnorm(T.constant("f64", [3, 4], [1, 2]), { eps: 0 });
  const r = Math.sqrt(12.5);
  expectClose("rmsnorm([3, 4])", y.data, [3 / r, 4 / r], 1e-15);
});

// ---------------------------------------------------------------------------------------------
// Custom nodes and constants

Deno.test("customNode() with a synchronous or an async VJP matches central differences", async () => {
  await gradCheck("customNode(sync)", ([x]) => squareNode(x, 1.5, false), [{ shape: [2, 3] }], 160);
  await gradCheck(
    "customNode(async) inside a graph",
    ([x, w]) => T.add(squareNode(T.linear(x, w), -0.5, true), x),
    [{ shape: [3, 3] }, { shape: [3, 3] }],
    161,
  );
});

Deno.test("constant() makes a tensor that takes part in the graph but gets no gradient", async () => {
  const c = T.constant("f64", [1, 2, 3, 4], [2, 2]);
  assert.equal(c.requiresGrad, false);
  assert.ok(c.data instanceof Float64Array);
  assert.deepEqual(T.constant("f32", [0.1]).data, new Float32Array([0.1]));
  await gradCheck(
    "mul(x, constant)",
    ([x]) => T.mul(x, T.constant("f64", [0.5, -2, 3], [3])),
    [{ shape: [2, 3] }],
    170,
  );
});

// ---------------------------------------------------------------------------------------------
// Chained graphs: cotangent accumulation

Deno.test("a chained MLP-ish graph with reused tensors accumulates cotangents correctly", async () => {
  await gradCheck("mlp", mlp, MLP_SPECS, 200);
  await gradCheck("mlp, other seed", mlp, MLP_SPECS, 201);
});

Deno.test("a reshape that shares data, used twice, gets both cotangents", async () => {
  await gradCheck(
    "reshape used twice",
    ([x]) => {
      const r = T.reshape(x, [3, 2]);
      return T.add(T.mul(r, r), T.exp(r));
    },
    [{ shape: [2, 3] }],
    210,
  );
  await gradCheck(
    "reshape of a reshape",
    ([x]) => {
      const r = T.reshape(x, [6]);
      const r2 = T.reshape(r, [2, 3]);
      return T.add(r2, T.mul(T.reshape(r, [2, 3]), x));
    },
    [{ shape: [2, 3] }],
    211,
  );
});

Deno.test("backward() with a given dy equals backward of Σ y ⊙ dy built on the tape", async () => {
  const rng = mulberry32(220);
  const xv = randomData(rng, 6, "real"), dy = randomData(rng, 6, "real");
  const t1 = new Tape("f64");
  const x1 = t1.variable(xv.slice(), [2, 3]);
  const g1 = (await t1.backward(T.exp(x1), dy)).get(x1)!;
  const t2 = new Tape("f64");
  const x2 = t2.variable(xv.slice(), [2, 3]);
  const g2 = (await t2.backward(dotOnTape([T.exp(x2)], [dy]))).get(x2)!;
  expectClose("dy seed vs tape loss", g1, g2, 1e-15);
  // The caller's dy is left untouched.
  assert.deepEqual(dy, randomData(mulberry32(220), 12, "real").subarray(6));
});

// ---------------------------------------------------------------------------------------------
// Tape semantics

Deno.test("an op on constants only records nothing and returns a constant", () => {
  const tape = new Tape("f64");
  const v = tape.variable(new Float64Array([1, 2]), [2]);
  T.exp(v);
  assert.equal(tape.size, 1);
  const a = T.constant("f64", [1, 2]), b = T.constant("f64", [3, 4]);
  const ys = [
    T.add(a, b),
    T.mul(a, b),
    T.exp(a),
    T.matmul(T.reshape(a, [1, 2]), T.reshape(b, [2, 1])),
    T.sum(a, 0),
    T.concat([a, b], 0),
    T.stack([a, b], 0),
    ...T.unstack(T.stack([a, b], 0), 0),
    squareNode(a, 2, false),
  ];
  for (const y of ys) {
    assert.equal(y.requiresGrad, false);
    assert.equal(y.tape, undefined);
  }
  assert.equal(tape.size, 1);
});

Deno.test("mixing f32 and f64 inputs throws TypeError", () => {
  const tape = new Tape("f64");
  const v = tape.variable(new Float64Array([1, 2]), [2]);
  const c32 = T.constant("f32", [1, 2]);
  assert.throws(() => T.add(v, c32), TypeError);
  // the message names the op and which input differs
  assert.throws(() => T.mul(T.constant("f64", [1, 2]), c32), {
    name: "TypeError",
    message: "mul() inputs must share one dtype: input 0 is f64, input 1 is f32",
  });
  assert.throws(() => T.concat([v, v, c32], 0), {
    name: "TypeError",
    message: "concat() inputs must share one dtype: input 0 is f64, input 2 is f32",
  });
  assert.throws(() => T.stack([v, c32], 0), /^TypeError: stack\(\) inputs must share/);
  assert.throws(
    () => T.linear(T.constant("f64", [1, 2], [1, 2]), T.constant("f32", [1, 2], [1, 2])),
    /^TypeError: linear\(\) inputs must share one dtype/,
  );
  assert.throws(() => tape.variable(new Float32Array(2), [2]), TypeError);
  assert.throws(() => new Tape("f16" as "f32"), TypeError);
});

Deno.test("linear() names its own arguments when their shapes do not fit", () => {
  assert.throws(
    () => T.linear(T.constant("f64", [1, 2], [1, 2]), T.constant("f64", [1, 2, 3], [1, 3])),
    {
      name: "RangeError",
      message: "linear() shapes must be x [n, in] and w [out, in]: got [1, 2] and [1, 3]",
    },
  );
  assert.throws(() => T.linear(T.constant("f64", [1, 2]), T.constant("f64", [1, 2], [1, 2])), {
    name: "RangeError",
    message: "linear() shapes must be x [n, in] and w [out, in]: got [2] and [1, 2]",
  });
});

Deno.test("mixing tensors of two different tapes throws TypeError", () => {
  const t1 = new Tape("f64"), t2 = new Tape("f64");
  const a = t1.variable(new Float64Array([1, 2]), [2]);
  const b = t2.variable(new Float64Array([3, 4]), [2]);
  assert.throws(() => T.add(a, b), TypeError);
  assert.throws(() => T.concat([a, b], 0), /one tape/);
  assert.throws(() => T.matmul(T.reshape(a, [1, 2]), T.reshape(b, [2, 1])), TypeError);
  assert.equal(t1.size, 1); // only the reshape of a
  assert.equal(t2.size, 1); // only the reshape of b
});

Deno.test("backward() on a tensor of another tape, or a constant, throws TypeError", async () => {
  const t1 = new Tape("f64"), t2 = new Tape("f64");
  const y = T.exp(t1.variable(new Float64Array([1]), [1]));
  await assert.rejects(() => t2.backward(y), TypeError);
  await assert.rejects(() => t2.backward(T.constant("f64", [1])), TypeError);
  await assert.rejects(() => t1.backward(y, new Float32Array(1)), TypeError);
});

Deno.test("backward() with a dy of the wrong length throws RangeError", async () => {
  const tape = new Tape("f64");
  const y = T.exp(tape.variable(new Float64Array([1, 2, 3]), [3]));
  await assert.rejects(() => tape.backward(y, new Float64Array(2)), RangeError);
  await assert.rejects(() => tape.backward(y, new Float64Array(4)), /must have 3 elements: got 4/);
});

Deno.test("bad shapes throw RangeError naming the argument", () => {
  const x = T.constant("f64", [1, 2, 3, 4, 5, 6], [2, 3]);
  assert.throws(() => T.matmul(x, x), RangeError);
  assert.throws(() => T.matmul(x, x), /matmul\(\) shapes/);
  assert.throws(() => T.add(x, T.constant("f64", [1, 2], [2])), RangeError);
  assert.throws(() => T.div(x, T.constant("f64", [1, 2], [2])), /div\(\) shapes must broadcast/);
  assert.throws(() => T.sum(x, 2), RangeError);
  assert.throws(() => T.sum(x, -3), /sum\(\) axis/);
  assert.throws(() => T.sum(x, 0.5), /sum\(\) axis/);
  assert.throws(() => T.unstack(x, 5), /unstack\(\) axis/);
  assert.throws(() => T.concat([x], 2), /concat\(\) axis/);
  assert.throws(() => T.stack([x], 3), /stack\(\) axis/);
  assert.throws(() => T.slice(x, 1, { start: 2, end: 4 }), RangeError);
  assert.throws(() => T.slice(x, 1, { start: 2, end: 1 }), /slice\(\) range/);
  assert.throws(() => T.slice(x, 1, { start: -1, end: 1 }), /slice\(\) range/);
  assert.throws(() => T.slice(x, 2, { start: 0, end: 1 }), /slice\(\) axis/);
  assert.throws(() => T.reshape(x, [4, 2]), RangeError);
  assert.throws(() => T.reshape(x, [4, 2]), /reshape\(\) shape must have 6 elements/);
  assert.throws(() => T.reshape(x, [-2, -3]), /reshape\(\) shape/);
  assert.throws(() => new Tensor(new Float64Array(5), [2, 3]), RangeError);
  assert.throws(() => new Tensor(new Float64Array(5), [2, 3]), /Tensor data length/);
  assert.throws(() => new Tensor(new Float64Array(6), [2, 3.5]), /Tensor shape/);
  assert.throws(() => new Tape("f64").variable(new Float64Array(5), [2, 3]), /data length/);
  assert.throws(() => T.concat([x, T.constant("f64", [1, 2], [2, 1, 1])], 1), /concat\(\) shapes/);
  assert.throws(() => T.stack([x, T.constant("f64", [1, 2], [2, 1])], 0), /stack\(\) shapes/);
  assert.throws(() => T.causalConv(x, x), /causalConv\(\) shapes/);
  assert.throws(() => T.transpose(T.constant("f64", [1, 2])), /transpose\(\) x must be 2-D/);
  assert.throws(() => T.l2norm(x, { eps: -1 }), /l2norm\(\) eps/);
  assert.throws(() => T.rmsnorm(x, { eps: NaN }), /rmsnorm\(\) eps/);
  assert.throws(() => T.scale(x, Infinity), /scale\(\) argument c/);
  assert.throws(() => T.add(x, null as unknown as Tensor), /add\(\) argument b must be a Tensor/);
});

Deno.test("f32 tape ops give Float32Array results and gradients agreeing with f64 to ~1e-5", async () => {
  const rng = mulberry32(300);
  // f32 inputs; the f64 reference runs on exactly the same (rounded) values.
  const values = MLP_SPECS.map((s) => new Float32Array(randomData(rng, T.sizeOf(s.shape), "real")));
  const dyValues = new Float32Array(randomData(rng, 40, "real"));
  const run = async (dtype: "f32" | "f64") => {
    const tape = new Tape(dtype);
    const xs = values.map((v, i) =>
      tape.variable(dtype === "f32" ? v.slice() : Float64Array.from(v), MLP_SPECS[i].shape)
    );
    const y = mlp(xs);
    const dy = dtype === "f32" ? dyValues.slice() : Float64Array.from(dyValues);
    const g = await tape.backward(y, dy);
    return { y, grads: xs.map((x) => g.get(x)!) };
  };
  const r32 = await run("f32"), r64 = await run("f64");
  assert.ok(r32.y.data instanceof Float32Array);
  assert.ok(r64.y.data instanceof Float64Array);
  expectClose("f32 vs f64 forward", r32.y.data, r64.y.data, 1e-5);
  r32.grads.forEach((g, i) => {
    assert.ok(g instanceof Float32Array, `f32 gradient ${i} is a ${g?.constructor.name}`);
    expectClose(`f32 vs f64 gradient ${i}`, g, r64.grads[i], 1e-5);
  });
});

Deno.test("every op on an f32 tape produces Float32Array outputs and gradients", async () => {
  const tape = new Tape("f32");
  const rng = mulberry32(310);
  const v = (shape: number[], domain: Domain = "real") =>
    tape.variable(new Float32Array(randomData(rng, T.sizeOf(shape), domain)), shape);
  const x = v([2, 3]), p = v([2, 3], "positive"), m = v([3, 2]), u = v([1, 3, 3]), w = v([3, 2]);
  const c = T.constant("f32", [1, 2, 3]);
  const ys = [
    T.add(x, c),
    T.sub(x, p),
    T.mul(x, p),
    T.div(x, p),
    T.scale(x, 2),
    T.exp(x),
    T.log(p),
    T.sqrt(p),
    T.rsqrt(p),
    T.sigmoid(x),
    T.silu(x),
    T.softplus(x),
    T.matmul(x, m),
    T.transpose(x),
    T.linear(x, x),
    T.sum(x, 1, { keepDims: true }),
    T.reshape(x, [6]),
    T.slice(x, 1, { start: 0, end: 2 }),
    T.concat([x, p], 0),
    ...T.unstack(x, 0),
    T.stack([x, p], 2),
    T.causalConv(u, w),
    T.l2norm(x),
    T.rmsnorm(x),
    squareNode(x, 2, true),
  ];
  let loss: Tensor | undefined;
  for (const y of ys) {
    assert.ok(y.data instanceof Float32Array);
    assert.equal(y.dtype, "f32");
    const s = T.sum(T.reshape(y, [y.size]), 0);
    loss = loss === undefined ? s : T.add(loss, s);
  }
  const grads = await tape.backward(loss!);
  for (const t of [x, p, m, u, w]) {
    const g = grads.get(t);
    assert.ok(g instanceof Float32Array);
    assert.ok(g.every(Number.isFinite));
  }
});

Deno.test("an unused variable gets no gradient entry", async () => {
  const tape = new Tape("f64");
  const used = tape.variable(new Float64Array([1, 2]), [2]);
  const unused = tape.variable(new Float64Array([3, 4]), [2]);
  const sideBranch = T.exp(unused); // recorded, but y does not depend on it
  const y = T.sum(T.mul(used, used), 0);
  const grads = await tape.backward(y);
  assert.equal(sideBranch.requiresGrad, true);
  assert.equal(grads.has(unused), false);
  assert.equal(grads.has(sideBranch), false);
  assert.equal(grads.size, 1);
  assert.deepEqual([...grads.get(used)!], [2, 4]);
});

Deno.test("backward() of a variable itself returns dy as its gradient", async () => {
  const tape = new Tape("f64");
  const v = tape.variable(new Float64Array([1, 2]), [2]);
  const grads = await tape.backward(v, new Float64Array([5, 6]));
  assert.deepEqual([...grads.get(v)!], [5, 6]);
});

Deno.test("customNode() with an async VJP and several outputs gives the right gradients", async () => {
  const tape = new Tape("f64");
  const a = tape.variable(new Float64Array([1, 2]), [2]);
  const b = tape.variable(new Float64Array([3, 4]), [2]);
  const [s, d] = T.customNode("sumdiff", {
    inputs: [a, undefined, b],
    outputs: [
      { data: new Float64Array([4, 6]), shape: [2] },
      { data: new Float64Array([-2, -2]), shape: [2] },
    ],
    vjp: async ([gs, gd]) => {
      await Promise.resolve();
      const ga = new Float64Array(2), gb = new Float64Array(2);
      for (let i = 0; i < 2; i++) {
        ga[i] = (gs?.[i] ?? 0) + (gd?.[i] ?? 0);
        gb[i] = (gs?.[i] ?? 0) - (gd?.[i] ?? 0);
      }
      return [ga, null, gb];
    },
  });
  assert.equal(tape.size, 1);
  // y = Σ 2s + Σ 3d = 5a − b summed: da = 5, db = −1
  const y = T.add(T.sum(T.scale(s, 2), 0), T.sum(T.scale(d, 3), 0));
  const grads = await tape.backward(y);
  assert.deepEqual([...grads.get(a)!], [5, 5]);
  assert.deepEqual([...grads.get(b)!], [-1, -1]);
  // Only one output used: the other cotangent arrives as null.
  const tape2 = new Tape("f64");
  const x = tape2.variable(new Float64Array([1]), [1]);
  let seen: readonly (Data | null)[] = [];
  const [, o2] = T.customNode("two", {
    inputs: [x],
    outputs: [{ data: new Float64Array([1]), shape: [1] }, {
      data: new Float64Array([2]),
      shape: [1],
    }],
    vjp: (gys) => {
      seen = gys;
      return [new Float64Array([7])];
    },
  });
  const g2 = await tape2.backward(o2);
  assert.equal(seen[0], null);
  assert.deepEqual([...seen[1]!], [1]);
  assert.deepEqual([...g2.get(x)!], [7]);
});

Deno.test("customNode() returning one cotangent array for two inputs keeps their gradients apart", async () => {
  const tape = new Tape("f64");
  const a = tape.variable(new Float64Array([1, 2]), [2]);
  const b = tape.variable(new Float64Array([3, 4]), [2]);
  const early = T.sum(T.mul(a, T.constant("f64", [10, 10])), 0); // a used before the custom node
  const [t] = T.customNode("sum2", {
    inputs: [a, b],
    outputs: [{ data: new Float64Array([4, 6]), shape: [2] }],
    vjp: ([g]) => [g, g], // the same array for both inputs
  });
  // t used twice, so its cotangent is accumulated (owned by the tape) before the custom VJP.
  const y = T.add(T.add(T.sum(t, 0), T.sum(T.scale(t, 2), 0)), early);
  const grads = await tape.backward(y);
  assert.deepEqual([...grads.get(b)!], [3, 3]);
  assert.deepEqual([...grads.get(a)!], [13, 13]);
});

Deno.test("tape.dispose() calls custom nodes' dispose and forbids further use", async () => {
  const tape = new Tape("f64");
  const x = tape.variable(new Float64Array([1, 2]), [2]);
  let disposed = 0;
  const def = {
    inputs: [x],
    outputs: [{ data: new Float64Array([1, 2]), shape: [2] }],
    vjp: (gys: readonly (Data | null)[]) => [gys[0]],
    dispose: () => void disposed++,
  };
  const [y] = T.customNode("held", def);
  T.customNode("held", def);
  T.exp(x); // a built-in node, no dispose
  assert.equal(tape.size, 3);
  assert.equal(disposed, 0);
  await tape.backward(y);
  assert.equal(disposed, 0, "backward must not dispose");
  tape.dispose();
  assert.equal(disposed, 2);
  assert.equal(tape.size, 0);
  tape.dispose();
  assert.equal(disposed, 2, "a second dispose frees nothing twice");
  assert.throws(() => T.exp(x), /disposed/);
  await assert.rejects(() => tape.backward(y), /disposed/);
  // Constants never record, so a disposed tape leaves them alone.
  assert.deepEqual([...T.exp(T.constant("f64", [0])).data], [1]);
});

Deno.test("worst gradient-check error stays within tolerance", () => {
  const worst = worstSeen();
  console.log(`worst max|a-b|/max|b| = ${worst.ratio.toExponential(2)} at ${worst.where}`);
  assert.ok(worst.ratio <= FD_TOL);
});
