// The op table: every op is one entry with its forward, its VJP (reverse mode) and its JVP
// (forward mode) side by side. `apply` runs the forward and, when an input requires a gradient,
// records a node that carries the entry's VJP and JVP. The public functions (ops.ts) check their
// arguments and call `apply`; the tape (tape.ts) walks the recorded nodes backward for VJPs and
// forward for JVPs.

import {
  around,
  broadcastShape,
  broadcastStrides,
  forEachBroadcast,
  sumToShape,
} from "./_broadcast.ts";
import type { Shape } from "./_broadcast.ts";
import { alloc } from "../base/dtype.ts";
import { type Data, sizeOf, tapeOf, Tensor } from "./tape.ts";

/** What an op's forward returns: its values and shape. */
export interface Value {
  /** The values, row-major. */
  data: Data;
  /** The dimensions. */
  shape: Shape;
}

/**
 * One op: the forward from the input values; the VJP from the output's cotangent `gy` to the
 * inputs' (null for an input that needs none); the JVP from the inputs' tangents (null for an
 * input that carries none, read as zero) to the output's tangent (null when it is zero).
 */
export interface OpDef<A> {
  /** Computes the output from the inputs. */
  forward(xs: readonly Tensor[], attrs: A): Value;
  /** Pulls the output cotangent back to the inputs: J_iᵀ gy for each input i. */
  vjp(gy: Data, xs: readonly Tensor[], y: Value, attrs: A): (Data | null)[];
  /** Pushes the input tangents forward to the output: Σ_i J_i tx_i. */
  jvp(tx: readonly (Data | null)[], xs: readonly Tensor[], y: Value, attrs: A): Data | null;
}

/**
 * Runs one op of the table and records it when an input requires a gradient.
 *
 * @param name The op's name, for error messages.
 * @param def The table entry.
 * @param xs The inputs.
 * @param attrs The op's attributes (axis, constant, ...).
 * @returns The output: on the inputs' tape, or a constant when no input is on a tape.
 *
 * @example
 * ```ts
 * import { apply, OPS } from "./_table.ts";
 * import { Tensor } from "./tape.ts";
 * const x = new Tensor(Float64Array.of(0, 1), [2]);
 * apply("exp", OPS.exp, [x], undefined).data; // Float64Array [1, e]
 * ```
 */
export function apply<A>(name: string, def: OpDef<A>, xs: readonly Tensor[], attrs: A): Tensor {
  const tape = tapeOf(xs, name);
  const y = def.forward(xs, attrs);
  if (tape === undefined) return new Tensor(y.data, y.shape);
  const out = tape.output(y.data, y.shape);
  tape.record({
    name,
    inputs: xs,
    outputs: [out],
    vjp: ([gy]) => def.vjp(gy!, xs, y, attrs),
    jvp: (tx) => [def.jvp(tx, xs, y, attrs)],
  });
  return out;
}

/**
 * The JVP of an op that is linear in its one input: the forward itself, run on the tangent.
 * (reshape, transpose, sum, slice and scale are such ops.)
 */
function linearJvp<A>(
  forward: (xs: readonly Tensor[], attrs: A) => Value,
): OpDef<A>["jvp"] {
  return ([tx], [x], _y, attrs) =>
    tx === null ? null : forward([new Tensor(tx, x.shape)], attrs).data;
}

/** A tangent, or zeros of the tensor's size when there is none. */
function orZeros(t: Data | null, x: Tensor): Data {
  return t ?? alloc(x.dtype, x.size);
}

/**
 * An elementwise binary op with broadcasting, from its value `f`, its VJP `grad` (the cotangent g
 * times each partial) and its JVP `tangent` (the partials applied to the tangents ta, tb).
 */
function binary(
  name: string,
  f: (a: number, b: number) => number,
  grad: (a: number, b: number, y: number, g: number) => [number, number],
  tangent: (a: number, b: number, y: number, ta: number, tb: number) => number,
): OpDef<void> {
  return {
    forward([a, b]) {
      const shape = broadcastShape(a.shape, b.shape, name);
      const data = alloc(a.dtype, sizeOf(shape));
      const ad = a.data, bd = b.data;
      forEachBroadcast(
        shape,
        broadcastStrides(a.shape, shape),
        broadcastStrides(b.shape, shape),
        (i, ia, ib) => {
          data[i] = f(ad[ia], bd[ib]);
        },
      );
      return { data, shape };
    },
    vjp(gy, [a, b], y) {
      const ga = alloc(a.dtype, sizeOf(y.shape)), gb = alloc(b.dtype, sizeOf(y.shape));
      const ad = a.data, bd = b.data, yd = y.data;
      forEachBroadcast(
        y.shape,
        broadcastStrides(a.shape, y.shape),
        broadcastStrides(b.shape, y.shape),
        (i, ia, ib) => {
          const [da, db] = grad(ad[ia], bd[ib], yd[i], gy[i]);
          ga[i] = da;
          gb[i] = db;
        },
      );
      return [
        a.tape ? sumToShape(ga, y.shape, a.shape) : null,
        b.tape ? sumToShape(gb, y.shape, b.shape) : null,
      ];
    },
    jvp([ta, tb], [a, b], y) {
      if (ta === null && tb === null) return null;
      const t = alloc(a.dtype, sizeOf(y.shape));
      const ad = a.data, bd = b.data, yd = y.data, tad = orZeros(ta, a), tbd = orZeros(tb, b);
      forEachBroadcast(
        y.shape,
        broadcastStrides(a.shape, y.shape),
        broadcastStrides(b.shape, y.shape),
        (i, ia, ib) => {
          t[i] = tangent(ad[ia], bd[ib], yd[i], tad[ia], tbd[ib]);
        },
      );
      return t;
    },
  };
}

/**
 * An elementwise unary op from its value `f` and `grad`, which maps a cotangent g to g·f'(x). Its
 * Jacobian is diagonal, so the same `grad` applied to a tangent is the JVP.
 */
function unary(
  f: (x: number) => number,
  grad: (x: number, y: number, g: number) => number,
): OpDef<void> {
  return {
    forward([x]) {
      const data = alloc(x.dtype, x.size);
      const xd = x.data;
      for (let i = 0; i < data.length; i++) data[i] = f(xd[i]);
      return { data, shape: x.shape };
    },
    vjp(gy, [x], y) {
      const gx = alloc(x.dtype, x.size);
      const xd = x.data, yd = y.data;
      for (let i = 0; i < gx.length; i++) gx[i] = grad(xd[i], yd[i], gy[i]);
      return [gx];
    },
    jvp([tx], [x], y) {
      if (tx === null) return null;
      const t = alloc(x.dtype, x.size);
      const xd = x.data, yd = y.data;
      for (let i = 0; i < t.length; i++) t[i] = grad(xd[i], yd[i], tx[i]);
      return t;
    },
  };
}

const sigmoidOf = (x: number) => x >= 0 ? 1 / (1 + Math.exp(-x)) : Math.exp(x) / (1 + Math.exp(x));

// Raw matmul kernels over row-major arrays; loops in i-k-j order for contiguous inner access.
function mm(a: Data, b: Data, out: Data, m: number, k: number, n: number): void {
  for (let i = 0; i < m; i++) {
    for (let p = 0; p < k; p++) {
      const av = a[i * k + p];
      for (let j = 0; j < n; j++) out[i * n + j] += av * b[p * n + j];
    }
  }
}
/** out[m,k] += g[m,n] · b[k,n]ᵀ */
function mmNT(g: Data, b: Data, out: Data, m: number, n: number, k: number): void {
  for (let i = 0; i < m; i++) {
    for (let p = 0; p < k; p++) {
      let s = 0;
      for (let j = 0; j < n; j++) s += g[i * n + j] * b[p * n + j];
      out[i * k + p] += s;
    }
  }
}
/** out[k,n] += a[m,k]ᵀ · g[m,n] */
function mmTN(a: Data, g: Data, out: Data, m: number, k: number, n: number): void {
  for (let i = 0; i < m; i++) {
    for (let p = 0; p < k; p++) {
      const av = a[i * k + p];
      for (let j = 0; j < n; j++) out[p * n + j] += av * g[i * n + j];
    }
  }
}

/**
 * 1 / sqrt(Σx²/div + eps) of the row of n entries at r. Σx² of finite entries can overflow (|x|
 * past about 1e154) or, with eps = 0, underflow to 0 where the row is not zero; such a row is summed
 * again scaled by its largest |x|, so that the result stays the finite value it is. Every other row
 * takes the plain sum.
 */
function rowInverse(xd: Data, r: number, n: number, div: number, eps: number): number {
  let ss = 0;
  for (let j = 0; j < n; j++) ss += xd[r + j] * xd[r + j];
  if (ss < Infinity && !(ss === 0 && eps === 0)) return 1 / Math.sqrt(ss / div + eps);
  let m = 0;
  for (let j = 0; j < n; j++) m = Math.max(m, Math.abs(xd[r + j]));
  if (!(m > 0 && m < Infinity)) return 1 / Math.sqrt(ss / div + eps); // zero, NaN or infinite
  let s = 0;
  for (let j = 0; j < n; j++) s += (xd[r + j] / m) * (xd[r + j] / m);
  return 1 / (m * Math.sqrt(s / div + (eps === 0 ? 0 : eps / (m * m))));
}

/**
 * The table entry of a normalisation over the last axis, `y = x / sqrt(Σx²/div + eps)`: L2 when
 * `mean` is false (div = 1), RMSNorm when it is true (div = the row length).
 *
 * @param mean Divide the sum of squares by the row length.
 * @param eps Added under the square root.
 * @returns The entry.
 *
 * @example
 * ```ts
 * import { apply, rowNorm } from "./_table.ts";
 * import { Tensor } from "./tape.ts";
 * apply("l2norm", rowNorm(false, 0), [new Tensor(Float64Array.of(3, 4), [1, 2])], undefined);
 * ```
 */
export function rowNorm(mean: boolean, eps: number): OpDef<void> {
  // y = x / sqrt(Σx²/div + eps): div = 1 is L2 normalisation, div = n (the mean) is RMSNorm.
  const def: OpDef<void> = {
    forward([x]) {
      const n = x.shape[x.shape.length - 1];
      const data = alloc(x.dtype, x.size);
      const xd = x.data;
      const div = mean ? n : 1;
      for (let r = 0; r < x.size; r += n) {
        const inv = rowInverse(xd, r, n, div, eps);
        for (let j = 0; j < n; j++) data[r + j] = xd[r + j] * inv;
      }
      return { data, shape: x.shape };
    },
    vjp(gy, [x], y) {
      // dx = r·(g − y·(g·y)/div), with r = 1/sqrt(Σx²/div + eps)
      const n = x.shape[x.shape.length - 1];
      const gx = alloc(x.dtype, x.size);
      const xd = x.data, yd = y.data;
      const div = mean ? n : 1;
      for (let r = 0; r < x.size; r += n) {
        let gdoty = 0;
        for (let j = 0; j < n; j++) gdoty += gy[r + j] * yd[r + j];
        const inv = rowInverse(xd, r, n, div, eps);
        for (let j = 0; j < n; j++) gx[r + j] = inv * (gy[r + j] - yd[r + j] * gdoty / div);
      }
      return [gx];
    },
    jvp([tx], [x], y) {
      // The Jacobian r·(I − y yᵀ/div) is symmetric: the tangent takes the cotangent's formula.
      return tx === null ? null : def.vjp(tx, [x], y)[0];
    },
  };
  return def;
}

// ---------------------------------------------------------------------------------------------
// The table

/**
 * The table of the tape's ops, each with its forward, VJP and JVP (l2norm and rmsnorm are made per
 * call by {@linkcode rowNorm}, unstack by {@linkcode unstackDef}).
 *
 * @example
 * ```ts
 * import { OPS } from "./_table.ts";
 * Object.keys(OPS).includes("matmul"); // true
 * ```
 */
export const OPS = {
  add: binary("add", (a, b) => a + b, (_a, _b, _y, g) => [g, g], (_a, _b, _y, ta, tb) => ta + tb),
  sub: binary("sub", (a, b) => a - b, (_a, _b, _y, g) => [g, -g], (_a, _b, _y, ta, tb) => ta - tb),
  mul: binary(
    "mul",
    (a, b) => a * b,
    (a, b, _y, g) => [g * b, g * a],
    (a, b, _y, ta, tb) => ta * b + a * tb,
  ),
  div: binary(
    "div",
    (a, b) => a / b,
    (_a, b, y, g) => [g / b, -g * y / b],
    (_a, b, y, ta, tb) => (ta - y * tb) / b,
  ),

  exp: unary(Math.exp, (_x, y, g) => g * y),
  log: unary(Math.log, (x, _y, g) => g / x),
  sqrt: unary(Math.sqrt, (_x, y, g) => g / (2 * y)),
  rsqrt: unary((x) => 1 / Math.sqrt(x), (_x, y, g) => -0.5 * g * y * y * y),
  // σ'(x) = σ(x) σ(−x): 1 − y would cancel once y is near 1 (x past about 20)
  sigmoid: unary(sigmoidOf, (x, y, g) => g * y * sigmoidOf(-x)),
  silu: unary((x) => x * sigmoidOf(x), (x, _y, g) => {
    const s = sigmoidOf(x);
    return g * (s + x * s * (1 - s));
  }),
  softplus: unary(
    (x) => x > 0 ? x + Math.log1p(Math.exp(-x)) : Math.log1p(Math.exp(x)),
    (x, _y, g) => g * sigmoidOf(x),
  ),

  scale: {
    forward([x], c: number) {
      const data = alloc(x.dtype, x.size);
      for (let i = 0; i < data.length; i++) data[i] = x.data[i] * c;
      return { data, shape: x.shape };
    },
    vjp(gy, [x], _y, c: number) {
      const gx = alloc(x.dtype, x.size);
      for (let i = 0; i < gx.length; i++) gx[i] = gy[i] * c;
      return [gx];
    },
    jvp: linearJvp((xs, c: number): Value => OPS.scale.forward(xs, c)),
  } satisfies OpDef<number>,

  matmul: {
    // [m,k] · [k,n] → [m,n]
    forward([a, b]) {
      const [m, k] = a.shape, n = b.shape[1];
      const data = alloc(a.dtype, m * n);
      mm(a.data, b.data, data, m, k, n);
      return { data, shape: [m, n] };
    },
    vjp(gy, [a, b]) {
      const [m, k] = a.shape, n = b.shape[1];
      let ga: Data | null = null, gb: Data | null = null;
      if (a.tape) mmNT(gy, b.data, ga = alloc(a.dtype, m * k), m, n, k);
      if (b.tape) mmTN(a.data, gy, gb = alloc(b.dtype, k * n), m, k, n);
      return [ga, gb];
    },
    jvp([ta, tb], [a, b]) {
      // d(a·b) = ta·b + a·tb
      if (ta === null && tb === null) return null;
      const [m, k] = a.shape, n = b.shape[1];
      const t = alloc(a.dtype, m * n);
      if (ta !== null) mm(ta, b.data, t, m, k, n);
      if (tb !== null) mm(a.data, tb, t, m, k, n);
      return t;
    },
  } satisfies OpDef<void>,

  transpose: {
    forward([x]) {
      const [m, n] = x.shape;
      const data = alloc(x.dtype, x.size);
      for (let i = 0; i < m; i++) for (let j = 0; j < n; j++) data[j * m + i] = x.data[i * n + j];
      return { data, shape: [n, m] };
    },
    vjp(gy, [x]) {
      const [m, n] = x.shape;
      const gx = alloc(x.dtype, x.size);
      for (let i = 0; i < m; i++) for (let j = 0; j < n; j++) gx[i * n + j] = gy[j * m + i];
      return [gx];
    },
    jvp: linearJvp((xs): Value => OPS.transpose.forward(xs)),
  } satisfies OpDef<void>,

  sum: {
    forward([x], { axis, keepDims }: { axis: number; keepDims: boolean }) {
      const [outer, n, inner] = around(x.shape, axis);
      const data = alloc(x.dtype, outer * inner);
      for (let o = 0; o < outer; o++) {
        for (let j = 0; j < n; j++) {
          const src = (o * n + j) * inner;
          for (let i = 0; i < inner; i++) data[o * inner + i] += x.data[src + i];
        }
      }
      const shape = keepDims
        ? x.shape.map((d, i) => i === axis ? 1 : d)
        : x.shape.filter((_, i) => i !== axis);
      return { data, shape };
    },
    vjp(gy, [x], _y, { axis }) {
      const [outer, n, inner] = around(x.shape, axis);
      const gx = alloc(x.dtype, x.size);
      for (let o = 0; o < outer; o++) {
        for (let j = 0; j < n; j++) {
          const dst = (o * n + j) * inner;
          for (let i = 0; i < inner; i++) gx[dst + i] = gy[o * inner + i];
        }
      }
      return [gx];
    },
    jvp: linearJvp((xs, attrs: { axis: number; keepDims: boolean }): Value =>
      OPS.sum.forward(xs, attrs)
    ),
  } satisfies OpDef<{ axis: number; keepDims: boolean }>,

  reshape: {
    forward([x], shape: Shape) {
      return { data: x.data, shape };
    },
    vjp(gy) {
      return [gy];
    },
    jvp([tx]) {
      return tx;
    },
  } satisfies OpDef<Shape>,

  slice: {
    forward([x], { axis, start, end }: { axis: number; start: number; end: number }) {
      const [outer, n, inner] = around(x.shape, axis);
      const len = end - start;
      const data = alloc(x.dtype, outer * len * inner);
      for (let o = 0; o < outer; o++) {
        data.set(
          x.data.subarray((o * n + start) * inner, (o * n + end) * inner),
          o * len * inner,
        );
      }
      return { data, shape: x.shape.map((d, i) => i === axis ? len : d) };
    },
    vjp(gy, [x], _y, { axis, start, end }) {
      const [outer, n, inner] = around(x.shape, axis);
      const len = end - start;
      const gx = alloc(x.dtype, x.size);
      for (let o = 0; o < outer; o++) {
        gx.set(gy.subarray(o * len * inner, (o + 1) * len * inner), (o * n + start) * inner);
      }
      return [gx];
    },
    jvp: linearJvp((xs, attrs: { axis: number; start: number; end: number }): Value =>
      OPS.slice.forward(xs, attrs)
    ),
  } satisfies OpDef<{ axis: number; start: number; end: number }>,

  concat: {
    forward(xs, axis: number) {
      const shape = xs[0].shape.map((d, i) =>
        i === axis ? xs.reduce((s, x) => s + x.shape[axis], 0) : d
      );
      const [outer, n, inner] = around(shape, axis);
      const data = alloc(xs[0].dtype, sizeOf(shape));
      let offset = 0;
      for (const x of xs) {
        const len = x.shape[axis];
        for (let o = 0; o < outer; o++) {
          data.set(
            x.data.subarray(o * len * inner, (o + 1) * len * inner),
            (o * n + offset) * inner,
          );
        }
        offset += len;
      }
      return { data, shape };
    },
    vjp(gy, xs, y, axis) {
      const [outer, n, inner] = around(y.shape, axis);
      let offset = 0;
      return xs.map((x) => {
        const len = x.shape[axis];
        const start = offset;
        offset += len;
        if (!x.tape) return null;
        const gx = alloc(x.dtype, x.size);
        for (let o = 0; o < outer; o++) {
          gx.set(
            gy.subarray((o * n + start) * inner, (o * n + start + len) * inner),
            o * len * inner,
          );
        }
        return gx;
      });
    },
    jvp(txs, xs, _y, axis): Data | null {
      // The concatenation of the tangents, zeros for the pieces that carry none.
      if (txs.every((t) => t === null)) return null;
      const ts = xs.map((x, i) => new Tensor(orZeros(txs[i], x), x.shape));
      return OPS.concat.forward(ts, axis).data;
    },
  } satisfies OpDef<number>,

  causalConv: {
    // y[b,t,c] = Σ_j w[c,j] · u[b, t−W+1+j, c], zeros before t = 0
    forward([u, w]) {
      const [B, T, C] = u.shape, W = w.shape[1];
      const data = alloc(u.dtype, u.size);
      for (let b = 0; b < B; b++) {
        for (let t = 0; t < T; t++) {
          for (let c = 0; c < C; c++) {
            let s = 0;
            for (let j = 0; j < W; j++) {
              const src = t - W + 1 + j;
              if (src >= 0) s += w.data[c * W + j] * u.data[(b * T + src) * C + c];
            }
            data[(b * T + t) * C + c] = s;
          }
        }
      }
      return { data, shape: u.shape };
    },
    vjp(gy, [u, w]) {
      const [B, T, C] = u.shape, W = w.shape[1];
      const gu = alloc(u.dtype, u.size), gw = alloc(w.dtype, w.size);
      for (let b = 0; b < B; b++) {
        for (let t = 0; t < T; t++) {
          for (let c = 0; c < C; c++) {
            const g = gy[(b * T + t) * C + c];
            for (let j = 0; j < W; j++) {
              const src = t - W + 1 + j;
              if (src < 0) continue;
              gu[(b * T + src) * C + c] += w.data[c * W + j] * g;
              gw[c * W + j] += u.data[(b * T + src) * C + c] * g;
            }
          }
        }
      }
      return [u.tape ? gu : null, w.tape ? gw : null];
    },
    jvp([tu, tw], [u, w]): Data | null {
      // Bilinear in (u, w): d y = conv(tu, w) + conv(u, tw).
      if (tu === null && tw === null) return null;
      const t = alloc(u.dtype, u.size);
      const add = (a: Data, b: Data) => {
        const y = OPS.causalConv.forward([new Tensor(a, u.shape), new Tensor(b, w.shape)]).data;
        for (let i = 0; i < t.length; i++) t[i] += y[i];
      };
      if (tu !== null) add(tu, w.data);
      if (tw !== null) add(u.data, tw);
      return t;
    },
  } satisfies OpDef<void>,
};

/** What a custom node is made of: its inputs, its output values, and its VJP and JVP. */
export interface NodeDef {
  /** The inputs (undefined entries allowed). */
  inputs: readonly (Tensor | undefined)[];
  /** The outputs' values and shapes. */
  outputs: readonly Value[];
  /** Maps the outputs' cotangents (null where none arrived) to the inputs'. */
  vjp(cotangents: readonly (Data | null)[]): (Data | null)[];
  /** Maps the inputs' tangents (null where none) to the outputs'. */
  jvp(tangents: readonly (Data | null)[]): (Data | null)[];
}

/**
 * The table entry of unstack, a node of many outputs: the slices of `x` along `axis`, that axis
 * removed. Its VJP writes each piece's cotangent back into place; its JVP slices the tangent.
 *
 * @param x The tensor to split.
 * @param axis The axis (non-negative, validated).
 * @returns The node's definition, for `customNode`.
 *
 * @example
 * ```ts
 * import { unstackDef } from "./_table.ts";
 * import { Tensor } from "./tape.ts";
 * unstackDef(new Tensor(Float64Array.of(1, 2, 3, 4), [2, 2]), 0).outputs.length; // 2
 * ```
 */
export function unstackDef(x: Tensor, axis: number): NodeDef {
  const [outer, n, inner] = around(x.shape, axis);
  const shape = x.shape.filter((_, i) => i !== axis);
  const pieces = (data: Data): Data[] => {
    const out = [];
    for (let j = 0; j < n; j++) {
      const piece = alloc(x.dtype, outer * inner);
      for (let o = 0; o < outer; o++) {
        piece.set(data.subarray((o * n + j) * inner, (o * n + j + 1) * inner), o * inner);
      }
      out.push(piece);
    }
    return out;
  };
  return {
    inputs: [x],
    outputs: pieces(x.data).map((data) => ({ data, shape })),
    vjp(gys) {
      const gx = alloc(x.dtype, x.size);
      gys.forEach((g, j) => {
        if (g === null) return;
        for (let o = 0; o < outer; o++) {
          gx.set(g.subarray(o * inner, (o + 1) * inner), (o * n + j) * inner);
        }
      });
      return [gx];
    },
    jvp([tx]) {
      return tx === null ? new Array<null>(n).fill(null) : pieces(tx);
    },
  };
}
