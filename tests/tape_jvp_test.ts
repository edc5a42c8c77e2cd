// Forward mode on the tape: every op's JVP against central differences along a random direction,
// the transpose identity ⟨J u, v⟩ = ⟨u, Jᵀ v⟩ between each op's JVP and its VJP, the same for a
// composite graph and for the whole KDA recurrence of the ops arm, and jvp()'s errors.

import assert from "node:assert/strict";
import * as tp from "../tape/mod.ts";
import {
  asArray,
  BINARY,
  type Domain,
  mlp,
  MLP_SPECS,
  mulberry32,
  type Op,
  randomData,
  type Spec,
  squareNode,
  UNARY,
} from "./_tape_check.ts";
import { recurrentKda } from "../kda/cpu/recurrent.ts";
import { chunkBackward, chunkForward } from "../kda/chunk.ts";
import { agreement, randomKda } from "./_fixtures.ts";

interface Case {
  name: string;
  op: Op;
  specs: Spec[];
}

const BROADCASTS: [number[], number[]][] = [[[2, 3], [2, 3]], [[2, 1, 4], [3, 1]], [[2, 3], []]];

/** One case per op and per interesting variant (broadcasting, axes, constant operands). */
const CASES: Case[] = [
  ...Object.entries(BINARY).flatMap(([name, fn]) => {
    const bDomain: Domain = name === "div" ? "awayFromZero" : "real";
    const op: Op = ([a, b]) => fn(a, b);
    return [
      ...BROADCASTS.map(([sa, sb]) => ({
        name: `${name}([${sa}], [${sb}])`,
        op,
        specs: [{ shape: sa }, { shape: sb, domain: bDomain }],
      })),
      {
        name: `${name}(var, const)`,
        op,
        specs: [{ shape: [2, 3] }, { shape: [3], domain: bDomain, constant: true }],
      },
      {
        name: `${name}(const, var)`,
        op,
        specs: [{ shape: [2, 1], constant: true }, { shape: [2, 3], domain: bDomain }],
      },
    ];
  }),
  { name: "mul(x, x)", op: ([x]) => tp.mul(x, x), specs: [{ shape: [2, 3] }] },
  { name: "scale(x, -2.5)", op: ([x]) => tp.scale(x, -2.5), specs: [{ shape: [3, 4] }] },
  ...UNARY.map(([name, fn, domain]) => ({
    name,
    op: (([x]) => fn(x)) as Op,
    specs: [{ shape: [3, 4], domain }],
  })),
  {
    name: "matmul",
    op: ([a, b]) => tp.matmul(a, b),
    specs: [{ shape: [3, 4] }, { shape: [4, 2] }],
  },
  {
    name: "matmul(const, var)",
    op: ([a, b]) => tp.matmul(a, b),
    specs: [{ shape: [3, 4], constant: true }, { shape: [4, 2] }],
  },
  { name: "transpose", op: ([x]) => tp.transpose(x), specs: [{ shape: [3, 5] }] },
  {
    name: "linear",
    op: ([x, w]) => tp.linear(x, w),
    specs: [{ shape: [4, 3] }, { shape: [2, 3] }],
  },
  ...[0, 1, 2, -1].flatMap((axis) =>
    [false, true].map((keepDims) => ({
      name: `sum(axis ${axis}${keepDims ? ", keepDims" : ""})`,
      op: (([x]) => tp.sum(x, axis, { keepDims })) as Op,
      specs: [{ shape: [2, 3, 4] }],
    }))
  ),
  { name: "reshape", op: ([x]) => tp.exp(tp.reshape(x, [3, 2])), specs: [{ shape: [2, 3] }] },
  {
    name: "slice(axis 0)",
    op: ([x]) => tp.slice(x, 0, { start: 1, end: 3 }),
    specs: [{ shape: [4, 3] }],
  },
  {
    name: "slice(axis 1)",
    op: ([x]) => tp.slice(x, 1, { start: 0, end: 2 }),
    specs: [{ shape: [2, 3, 2] }],
  },
  {
    name: "concat(var, const, var)",
    op: ([a, c, b]) => tp.concat([a, c, b], 1),
    specs: [{ shape: [2, 1, 3] }, { shape: [2, 2, 3], constant: true }, { shape: [2, 3, 3] }],
  },
  ...[0, 1, 2].map((axis) => ({
    name: `unstack(axis ${axis})`,
    op: (([x]) => tp.unstack(x, axis)) as Op,
    specs: [{ shape: [2, 3, 4] }],
  })),
  {
    name: "unstack(one piece used)",
    op: ([x]) => tp.exp(tp.unstack(x, 0)[1]),
    specs: [{ shape: [3, 2] }],
  },
  ...[0, 1, 2].map((axis) => ({
    name: `stack(axis ${axis})`,
    op: (([a, b, c]) => tp.stack([a, b, c], axis)) as Op,
    specs: [{ shape: [2, 3] }, { shape: [2, 3], constant: true }, { shape: [2, 3] }],
  })),
  {
    name: "causalConv(u, w)",
    op: ([u, w]) => tp.causalConv(u, w),
    specs: [{ shape: [2, 5, 3] }, { shape: [3, 4] }],
  },
  {
    name: "causalConv(u, const w)",
    op: ([u, w]) => tp.causalConv(u, w),
    specs: [{ shape: [1, 4, 2] }, { shape: [2, 3], constant: true }],
  },
  { name: "l2norm", op: ([x]) => tp.l2norm(x), specs: [{ shape: [3, 4] }] },
  { name: "l2norm(eps 0)", op: ([x]) => tp.l2norm(x, { eps: 0 }), specs: [{ shape: [3, 4] }] },
  { name: "rmsnorm", op: ([x]) => tp.rmsnorm(x), specs: [{ shape: [3, 4] }] },
  {
    name: "rmsnorm(eps 0.5)",
    op: ([x]) => tp.rmsnorm(x, { eps: 0.5 }),
    specs: [{ shape: [2, 5] }],
  },
  {
    name: "customNode with a jvp",
    op: ([x]) => squareNode(x, 1.5, false, true),
    specs: [{ shape: [2, 3] }],
  },
  {
    name: "customNode with a jvp and an async vjp, in a graph",
    op: ([x, w]) => tp.add(squareNode(tp.linear(x, w), -0.5, true, true), x),
    specs: [{ shape: [3, 3] }, { shape: [3, 3] }],
  },
  { name: "composite graph (mlp)", op: mlp, specs: MLP_SPECS },
];

/** Draws a case's inputs and a direction u over the inputs that are not constants. */
function draw(c: Case, seed: number) {
  const rng = mulberry32(seed);
  const values = c.specs.map((s) => randomData(rng, tp.sizeOf(s.shape), s.domain ?? "real"));
  const free = c.specs.flatMap((s, i) => (s.constant ? [] : [i]));
  const u = free.map((i) => randomData(rng, values[i].length, "real"));
  // fn takes the free inputs only; constants are closed over as plain tensors.
  const fn = (...xs: tp.Tensor[]) => {
    const all = c.specs.map((s, i) => (s.constant ? new tp.Tensor(values[i], s.shape) : undefined));
    free.forEach((i, j) => (all[i] = xs[j]));
    return c.op(all as tp.Tensor[]);
  };
  const primals = free.map((i) => new tp.Tensor(values[i], c.specs[i].shape));
  return { rng, values, free, u, fn, primals };
}

const dot = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
};

let worstFd = { ratio: 0, where: "none" }, worstTranspose = { ratio: 0, where: "none" };

for (const [n, c] of CASES.entries()) {
  Deno.test(`${c.name}: JVP matches central differences along a random direction`, async () => {
    const { values, free, u, fn, primals } = draw(c, 1000 + n);
    const { outputs, tangents } = await tp.jvp(fn, primals, u);
    // The outputs are the plain forward's, bit for bit.
    const plain = asArray(fn(...primals));
    outputs.forEach((y, j) => assert.deepEqual(y.data, plain[j].data));
    // Central differences of every output along u, with one step for the whole direction.
    const h = 1e-5;
    const shifted = (sign: number) => {
      const xs = free.map((i, j) => {
        const v = values[i].map((x, k) => x + sign * h * u[j][k]);
        return new tp.Tensor(v, c.specs[i].shape);
      });
      return asArray(fn(...xs));
    };
    const up = shifted(1), down = shifted(-1);
    tangents.forEach((t, j) => {
      const fd = up[j].data.map((y, k) => (y - down[j].data[k]) / (2 * h));
      const { rel: ratio, absDiff: maxDiff, refMax: maxRef } = agreement(t, fd);
      if (!(ratio <= 1e-8)) {
        throw new Error(`${c.name} output ${j}: ratio ${ratio} (${maxDiff} of ${maxRef})`);
      }
      if (ratio > worstFd.ratio) worstFd = { ratio, where: `${c.name} output ${j}` };
    });
  });

  Deno.test(`${c.name}: ⟨J u, v⟩ of the JVP equals ⟨u, Jᵀ v⟩ of the VJP`, async () => {
    const { rng, u, fn, primals } = draw(c, 2000 + n);
    const { outputs, tangents } = await tp.jvp(fn, primals, u);
    const v = outputs.map((y) => randomData(rng, y.size, "real"));
    const tape = new tp.Tape("f64");
    const xs = primals.map((p) => tape.variable(p.data, p.shape));
    const ys = asArray(fn(...xs));
    const grads = await tape.backwardFrom(
      ys.flatMap((y, j) => (y.requiresGrad ? [{ output: y, cotangent: v[j] }] : [])),
    );
    const forward = tangents.reduce((s, t, j) => s + dot(t, v[j]), 0);
    const reverse = xs.reduce(
      (s, x, i) => s + dot(u[i], grads.get(x) ?? new Float64Array(x.size)),
      0,
    );
    const ratio = Math.abs(forward - reverse) / Math.max(Math.abs(forward), Math.abs(reverse));
    if (!(ratio <= 1e-12)) throw new Error(`${c.name}: ⟨Ju,v⟩ ${forward} ⟨u,Jᵀv⟩ ${reverse}`);
    if (ratio > worstTranspose.ratio) worstTranspose = { ratio, where: c.name };
  });
}

Deno.test("worst JVP agreements stay within tolerance", () => {
  console.log(
    `  JVP vs central differences: worst ${worstFd.ratio.toExponential(2)} at ${worstFd.where}`,
  );
  console.log(
    `  ⟨Ju,v⟩ vs ⟨u,Jᵀv⟩: worst ${
      worstTranspose.ratio.toExponential(2)
    } at ${worstTranspose.where}`,
  );
  assert.ok(worstFd.ratio <= 1e-8 && worstTranspose.ratio <= 1e-12);
});

Deno.test("jvp() through a custom node without a jvp throws an error naming the node", async () => {
  const x = new tp.Tensor(Float64Array.of(1, 2), [2]);
  await assert.rejects(
    () => tp.jvp((t) => tp.exp(squareNode(t, 2, false)), [x], [Float64Array.of(1, 0)]),
    { name: "Error", message: /JVP rule for node "square"/ },
  );
  // A node that no tangent reaches needs no rule.
  const c = tp.constant("f64", [1, 2], [2]);
  const { tangents } = await tp.jvp((t) => tp.add(t, squareNode(c, 2, false)), [x], [
    Float64Array.of(1, 0),
  ]);
  assert.deepEqual([...tangents[0]], [1, 0]);
});

Deno.test("jvp() rejects bad arguments with errors naming them", async () => {
  const x = new tp.Tensor(Float64Array.of(1, 2), [2]);
  const t = Float64Array.of(1, 1);
  await assert.rejects(() => tp.jvp((y) => y, [x], []), {
    name: "RangeError",
    message: /tangents/,
  });
  await assert.rejects(() => tp.jvp((y) => y, [x], [Float64Array.of(1)]), {
    name: "RangeError",
    message: /tangents\[0\] must have 2 elements: got 1/,
  });
  await assert.rejects(() => tp.jvp((y) => y, [x], [Float32Array.of(1, 1)]), {
    name: "TypeError",
    message: /tangents\[0\] must have dtype f64: got f32/,
  });
  await assert.rejects(() => tp.jvp((y) => y, [t as unknown as tp.Tensor], [t]), {
    name: "TypeError",
    message: /primals\[0\] must be a Tensor/,
  });
});

Deno.test("jvp() on f32 gives Float32Array tangents, and a zero tangent for an output that ignores the primals", async () => {
  const x = new tp.Tensor(Float32Array.of(0.5, -1), [2]);
  const { outputs, tangents } = await tp.jvp(
    (y) => [tp.sigmoid(y), tp.constant("f32", [3])],
    [x],
    [Float32Array.of(1, 2)],
  );
  assert.ok(outputs[0].data instanceof Float32Array && tangents[0] instanceof Float32Array);
  const s = (z: number) => 1 / (1 + Math.exp(-z));
  assert.ok(Math.abs(tangents[0][1] - 2 * s(-1) * (1 - s(-1))) < 1e-6);
  assert.deepEqual([...tangents[1]], [0]);
});

// ---------------------------------------------------------------------------------------------
// The ops arm: the KDA recurrence built from tape ops has exact JVPs.

Deno.test("the ops arm's recurrence has exact JVPs: ⟨J u, v⟩ = ⟨u, Jᵀ v⟩ to 1e-13, and J u = ⟨u, cpu-arm gradient⟩", async () => {
  for (const [seed, T, gateMin] of [[1, 21, -5], [2, 40, -1], [3, 7, -20]] as const) {
    const x = randomKda({ B: 2, T, H: 2, K: 4, V: 3 }, seed, { gateMin, withH0: true });
    const { B, H, K, V } = x;
    const shapes = {
      q: [B, T, H, K],
      k: [B, T, H, K],
      v: [B, T, H, V],
      g: [B, T, H, K],
      beta: [B, T, H],
      h0: [B, H, K, V],
    };
    const names = Object.keys(shapes) as (keyof typeof shapes)[];
    const primals = names.map((name) => new tp.Tensor(x[name]!, shapes[name]));
    const rng = mulberry32(100 + seed);
    const u = primals.map((p) => randomData(rng, p.size, "real"));
    const run = (
      q: tp.Tensor,
      k: tp.Tensor,
      v: tp.Tensor,
      g: tp.Tensor,
      beta: tp.Tensor,
      h0: tp.Tensor,
    ) => {
      const { o, ht } = recurrentKda({ q, k, v, g, beta, h0 }, x, x.scale);
      return [o, ht];
    };
    const { tangents } = await tp.jvp(
      (...t) => run(t[0], t[1], t[2], t[3], t[4], t[5]),
      primals,
      u,
    );
    const dout = randomData(rng, B * T * H * V, "real"),
      dht = randomData(rng, B * H * K * V, "real");
    const forward = dot(tangents[0], dout) + dot(tangents[1], dht);
    // ⟨u, Jᵀ v⟩ by the tape's reverse mode on the same recurrence.
    const tape = new tp.Tape("f64");
    const vars = primals.map((p) => tape.variable(p.data, p.shape));
    const [o, ht] = run(vars[0], vars[1], vars[2], vars[3], vars[4], vars[5]);
    const grads = await tape.backwardFrom([
      { output: o, cotangent: dout },
      { output: ht, cotangent: dht },
    ]);
    const reverse = vars.reduce((s, t, i) => s + dot(u[i], grads.get(t)!), 0);
    const ratio = Math.abs(forward - reverse) / Math.abs(reverse);
    assert.ok(ratio <= 1e-13, `T${T}: ⟨Ju,v⟩ = ${forward}, ⟨u,Jᵀv⟩ = ${reverse}, ratio ${ratio}`);
    // ⟨u, ∇⟩ from the cpu arm's hand-written chunked backward, chunk 16.
    const { states } = chunkForward(x, { chunkSize: 16, saveStates: true });
    const cpu = chunkBackward(x, states!, { dout, dht }, { chunkSize: 16 });
    const cpuGrads = [cpu.dq, cpu.dk, cpu.dv, cpu.dg, cpu.dbeta, cpu.dh0];
    const viaCpu = cpuGrads.reduce((s, g, i) => s + dot(u[i], g), 0);
    const cpuRatio = Math.abs(viaCpu - forward) / Math.abs(forward);
    assert.ok(cpuRatio <= 1e-12, `T${T}: cpu ⟨u,∇⟩ = ${viaCpu}, JVP ${forward}, ratio ${cpuRatio}`);
    console.log(
      `  T=${T} g≥${gateMin}: ⟨Ju,v⟩ = ${forward.toPrecision(17)}, ` +
        `vs VJP ${ratio.toExponential(2)}, vs cpu arm ${cpuRatio.toExponential(2)}`,
    );
  }
});

Deno.test("customNode() without a jvp still works in reverse mode", async () => {
  const tape = new tp.Tape("f64");
  const x = tape.variable(Float64Array.of(1, 2), [2]);
  const grads = await tape.backward(
    tp.customNode("id", {
      inputs: [x],
      outputs: [{ data: x.data.slice(), shape: [2] }],
      vjp: ([g]) => [g],
    })[0],
  );
  assert.deepEqual([...grads.get(x)!], [1, 1]);
});
