// Shared by the tape's test files: seeded inputs, the agreement check, the VJP gradient check
// against central differences, and a composite graph that exercises every op.

import assert from "node:assert/strict";
import * as tp from "../tape/mod.ts";
import { mulberry32 } from "../kda/layer/_random.ts";
import { agreement } from "./_fixtures.ts";

export { mulberry32 } from "../kda/layer/_random.ts";

/** Where an input's random values lie. */
export type Domain = "real" | "wide" | "positive" | "awayFromZero";

/** The elementwise binary ops, by name (their operands broadcast). */
export const BINARY = { add: tp.add, sub: tp.sub, mul: tp.mul, div: tp.div } as const;

/** The elementwise unary ops, each with the domain its input is drawn from. */
export const UNARY: [name: string, op: (x: tp.Tensor) => tp.Tensor, domain: Domain][] = [
  ["exp", tp.exp, "real"],
  ["log", tp.log, "positive"],
  ["sqrt", tp.sqrt, "positive"],
  ["rsqrt", tp.rsqrt, "positive"],
  ["sigmoid", tp.sigmoid, "wide"],
  ["silu", tp.silu, "wide"],
  ["softplus", tp.softplus, "wide"],
];

export function randomData(rng: () => number, n: number, domain: Domain): Float64Array {
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const u = rng();
    switch (domain) {
      case "real":
        out[i] = 2 * u - 1;
        break;
      case "wide":
        out[i] = 12 * u - 6;
        break;
      case "positive":
        out[i] = 0.5 + 1.5 * u;
        break;
      case "awayFromZero":
        out[i] = (rng() < 0.5 ? -1 : 1) * (0.5 + 1.5 * u);
        break;
    }
  }
  return out;
}

export interface Spec {
  shape: number[];
  domain?: Domain;
  /** A plain tensor that requires no gradient. */
  constant?: boolean;
}

export type Op = (xs: tp.Tensor[]) => tp.Tensor | tp.Tensor[];

export const asArray = (y: tp.Tensor | tp.Tensor[]): tp.Tensor[] => Array.isArray(y) ? y : [y];

let worst = { ratio: 0, where: "none" };

/** The worst agreement a tight (≤ 1e-8) expectClose has seen so far in this process. */
export function worstSeen(): { ratio: number; where: string } {
  return worst;
}

export function expectClose(
  where: string,
  a: ArrayLike<number>,
  b: ArrayLike<number>,
  tol: number,
) {
  const { rel: ratio, absDiff: maxDiff, refMax: maxRef } = agreement(a, b);
  if (!(ratio <= tol)) {
    throw new Error(
      `${where}: max|a-b|/max|b| = ${ratio} > ${tol} (max|a-b| = ${maxDiff}, max|b| = ${maxRef})`,
    );
  }
  if (tol <= 1e-8 && ratio > worst.ratio) worst = { ratio, where };
}

/** Σ y ⊙ r, recorded on the tape (for ops with several outputs). */
export function dotOnTape(ys: tp.Tensor[], rs: Float64Array[]): tp.Tensor {
  const terms = ys.map((y, j) =>
    tp.sum(tp.reshape(tp.mul(y, new tp.Tensor(rs[j], y.shape)), [y.size]), 0)
  );
  return terms.reduce((s, t) => tp.add(s, t));
}

export const FD_TOL = 1e-8;

/**
 * Checks the tape gradient of L = Σ op(inputs) ⊙ r, r fixed and random, against central
 * differences of L for every input that requires a gradient.
 */
export async function gradCheck(where: string, op: Op, specs: Spec[], seed = 1): Promise<void> {
  const rng = mulberry32(seed);
  const values = specs.map((s) => randomData(rng, tp.sizeOf(s.shape), s.domain ?? "real"));
  const plain = () => values.map((v, i) => new tp.Tensor(v, specs[i].shape));
  const probe = asArray(op(plain()));
  const rs = probe.map((y) => randomData(rng, y.size, "real"));
  const loss = () => {
    let s = 0;
    asArray(op(plain())).forEach((y, j) => {
      assert.equal(y.requiresGrad, false);
      for (let i = 0; i < y.size; i++) s += y.data[i] * rs[j][i];
    });
    return s;
  };

  const tape = new tp.Tape("f64");
  const xs = values.map((v, i) =>
    specs[i].constant
      ? new tp.Tensor(v.slice(), specs[i].shape)
      : tape.variable(v.slice(), specs[i].shape)
  );
  const out = op(xs);
  const grads = Array.isArray(out)
    ? await tape.backward(dotOnTape(out, rs))
    : await tape.backward(out, rs[0].slice());

  // The tape's forward agrees with the plain one.
  asArray(out).forEach((y, j) => assert.deepEqual(y.data, probe[j].data));

  xs.forEach((x, i) => {
    if (specs[i].constant) {
      assert.equal(grads.has(x), false, `${where}: constant input ${i} got a gradient`);
      return;
    }
    const g = grads.get(x);
    assert.ok(g instanceof Float64Array, `${where}: input ${i} got no f64 gradient`);
    assert.equal(g.length, x.size);
    const fd = new Float64Array(x.size);
    const v = values[i];
    for (let k = 0; k < v.length; k++) {
      const x0 = v[k];
      const h = 1e-5 * Math.max(1, Math.abs(x0));
      const xp = x0 + h, xm = x0 - h;
      v[k] = xp;
      const lp = loss();
      v[k] = xm;
      const lm = loss();
      v[k] = x0;
      fd[k] = (lp - lm) / (xp - xm);
    }
    expectClose(`${where}, input ${i} [${specs[i].shape.join(", ")}]`, g, fd, FD_TOL);
  });
}

/** A small MLP-ish graph: h feeds several branches, and a reshape of h (sharing data) is used twice. */
export function mlp([x, w1, b1, w2, g]: tp.Tensor[]): tp.Tensor {
  const h = tp.silu(tp.add(tp.linear(x, w1), b1)); // [4, 5]
  const flat = tp.reshape(h, [20]); // shares h's data
  assert.equal(flat.data, h.data);
  const twice = tp.add(tp.mul(flat, flat), tp.scale(flat, 0.3)); // flat used three times
  const branchA = tp.sum(tp.reshape(twice, [4, 5]), 1, { keepDims: true }); // [4, 1]
  const branchB = tp.linear(tp.rmsnorm(h), w2); // h used again, [4, 2]
  const z = tp.mul(tp.sigmoid(branchB), tp.add(branchA, g)); // [4, 2]
  const [z0, z1] = tp.unstack(z, 1); // [4] each
  const mixed = tp.stack([z1, tp.mul(z0, z1), z0], 1); // [4, 3]
  const denom = tp.sqrt(tp.add(tp.mul(g, g), tp.constant(g.dtype, [1]))); // [4, 1]
  return tp.concat([tp.l2norm(tp.concat([z, h], 1)), tp.div(mixed, denom)], 1); // [4, 10]
}

export const MLP_SPECS: Spec[] = [
  { shape: [4, 3] },
  { shape: [5, 3] },
  { shape: [5] },
  { shape: [2, 5] },
  { shape: [4, 1] },
];

/** y = x² ⊙ c elementwise through a custom node, with an optionally async VJP and an optional JVP. */
export function squareNode(x: tp.Tensor, c: number, async: boolean, withJvp = false): tp.Tensor {
  const data = x.data.map((v) => c * v * v);
  const vjp = (gys: readonly (tp.Data | null)[]) => {
    const g = gys[0]!;
    return [g.map((v, i) => 2 * c * x.data[i] * v)];
  };
  // Its JVP, given only when asked: t ↦ 2c·x ⊙ t (the same diagonal as the VJP).
  const jvp = withJvp
    ? (([t]: readonly (tp.Data | null)[]) => [t === null ? null : vjp([t])[0]])
    : undefined;
  return tp.customNode("square", {
    inputs: [x],
    outputs: [{ data, shape: x.shape }],
    jvp,
    vjp: async
      ? async (gys) => {
        await new Promise((resolve) => setTimeout(resolve, 0));
        return vjp(gys);
      }
      : vjp,
  })[0];
}
