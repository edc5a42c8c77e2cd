// The op table: every op is one entry with its forward and its VJP side by side. `apply` runs the
// forward and, when an input requires a gradient, records a node whose VJP is the entry's.

import { type Tape, tapeOf } from "./tape.ts";
import { alloc, type Data, type DType, sizeOf, Tensor } from "./tensor.ts";

type Shape = readonly number[];

/** What an op's forward returns: its values and shape. */
interface Value {
  data: Data;
  shape: Shape;
}

/** One op: forward from input values, VJP from the output cotangent. */
interface OpDef<A> {
  forward(xs: readonly Tensor[], attrs: A): Value;
  vjp(gy: Data, xs: readonly Tensor[], y: Value, attrs: A): (Data | null)[];
}

function apply<A>(name: string, def: OpDef<A>, xs: readonly Tensor[], attrs: A): Tensor {
  const tape = tapeOf(xs);
  const y = def.forward(xs, attrs);
  if (tape === undefined) return new Tensor(y.data, y.shape);
  const out = tape.output(y.data, y.shape);
  tape.record({
    name,
    inputs: xs,
    outputs: [out],
    vjp: ([gy]) => def.vjp(gy!, xs, y, attrs),
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// Broadcasting (numpy rules, right-aligned)

function broadcastShape(a: Shape, b: Shape, op: string): number[] {
  const n = Math.max(a.length, b.length);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const da = a[a.length - n + i] ?? 1;
    const db = b[b.length - n + i] ?? 1;
    if (da !== db && da !== 1 && db !== 1) {
      throw new RangeError(
        `${op}() shapes must broadcast: got [${a.join(", ")}] and [${b.join(", ")}]`,
      );
    }
    out.push(da === 1 ? db : da);
  }
  return out;
}

/** Strides of `shape` laid over `outShape`, 0 where `shape` broadcasts. */
function broadcastStrides(shape: Shape, outShape: Shape): number[] {
  const strides = new Array<number>(outShape.length).fill(0);
  let stride = 1;
  for (let i = shape.length - 1; i >= 0; i--) {
    const o = outShape.length - shape.length + i;
    strides[o] = shape[i] === 1 ? 0 : stride;
    stride *= shape[i];
  }
  return strides;
}

/** Visits every index of `outShape` in row-major order with the matching offsets into a and b. */
function forEachBroadcast(
  outShape: Shape,
  sa: number[],
  sb: number[],
  fn: (i: number, ia: number, ib: number) => void,
): void {
  const n = sizeOf(outShape);
  if (n === 0) return;
  const rank = outShape.length;
  if (rank === 0) return fn(0, 0, 0);
  const last = outShape[rank - 1], la = sa[rank - 1], lb = sb[rank - 1];
  const counter = new Array<number>(rank).fill(0);
  let ia = 0, ib = 0;
  for (let i = 0; i < n; i += last) {
    for (let j = 0; j < last; j++) fn(i + j, ia + j * la, ib + j * lb);
    for (let d = rank - 2; d >= 0; d--) {
      counter[d]++;
      ia += sa[d];
      ib += sb[d];
      if (counter[d] < outShape[d]) break;
      ia -= sa[d] * outShape[d];
      ib -= sb[d] * outShape[d];
      counter[d] = 0;
    }
  }
}

/** Sums a cotangent of shape `from` down to the broadcast operand's `to` shape. */
function sumToShape(g: Data, from: Shape, to: Shape): Data {
  if (sizeOf(from) === sizeOf(to)) return g;
  const out = alloc(g instanceof Float64Array ? "f64" : "f32", sizeOf(to));
  const st = broadcastStrides(to, from);
  forEachBroadcast(from, st, st, (i, it) => {
    out[it] += g[i];
  });
  return out;
}

function binary(
  name: string,
  f: (a: number, b: number) => number,
  grad: (a: number, b: number, y: number, g: number) => [number, number],
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
  };
}

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

/** [outer, n, inner] view of a shape around `axis`. */
function around(shape: Shape, axis: number): [number, number, number] {
  return [sizeOf(shape.slice(0, axis)), shape[axis], sizeOf(shape.slice(axis + 1))];
}

function checkAxis(name: string, shape: Shape, axis: number): number {
  const a = axis < 0 ? axis + shape.length : axis;
  if (!Number.isInteger(a) || a < 0 || a >= shape.length) {
    throw new RangeError(
      `${name}() axis must be an integer in [${-shape.length}, ${shape.length - 1}]: got ${axis}`,
    );
  }
  return a;
}

/** Normalisations over the last axis share one shape: rows of length n. */
function rowNorm(mean: boolean, eps: number): OpDef<void> {
  // y = x / sqrt(Σx²/div + eps): div = 1 is L2 normalisation, div = n (the mean) is RMSNorm.
  return {
    forward([x]) {
      const n = x.shape[x.shape.length - 1];
      const data = alloc(x.dtype, x.size);
      const xd = x.data;
      const div = mean ? n : 1;
      for (let r = 0; r < x.size; r += n) {
        let ss = 0;
        for (let j = 0; j < n; j++) ss += xd[r + j] * xd[r + j];
        const inv = 1 / Math.sqrt(ss / div + eps);
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
        let ss = 0, gdoty = 0;
        for (let j = 0; j < n; j++) {
          ss += xd[r + j] * xd[r + j];
          gdoty += gy[r + j] * yd[r + j];
        }
        const inv = 1 / Math.sqrt(ss / div + eps);
        for (let j = 0; j < n; j++) gx[r + j] = inv * (gy[r + j] - yd[r + j] * gdoty / div);
      }
      return [gx];
    },
  };
}

// ---------------------------------------------------------------------------------------------
// The table

const OPS = {
  add: binary("add", (a, b) => a + b, (_a, _b, _y, g) => [g, g]),
  sub: binary("sub", (a, b) => a - b, (_a, _b, _y, g) => [g, -g]),
  mul: binary("mul", (a, b) => a * b, (a, b, _y, g) => [g * b, g * a]),
  div: binary("div", (a, b) => a / b, (_a, b, y, g) => [g / b, -g * y / b]),

  exp: unary(Math.exp, (_x, y, g) => g * y),
  log: unary(Math.log, (x, _y, g) => g / x),
  sqrt: unary(Math.sqrt, (_x, y, g) => g / (2 * y)),
  rsqrt: unary((x) => 1 / Math.sqrt(x), (_x, y, g) => -0.5 * g * y * y * y),
  sigmoid: unary(sigmoidOf, (_x, y, g) => g * y * (1 - y)),
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
  } satisfies OpDef<{ axis: number; keepDims: boolean }>,

  reshape: {
    forward([x], shape: Shape) {
      return { data: x.data, shape };
    },
    vjp(gy) {
      return [gy];
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
  } satisfies OpDef<void>,
};

// ---------------------------------------------------------------------------------------------
// The public functions

function checkTensor(name: string, arg: string, x: unknown): asserts x is Tensor {
  if (!(x instanceof Tensor)) {
    throw new TypeError(
      `${name}() argument ${arg} must be a Tensor: got ${x === null ? "null" : typeof x}`,
    );
  }
}

/**
 * Elementwise `a + b` with broadcasting.
 *
 * @param a Left operand.
 * @param b Right operand; shapes broadcast by numpy rules.
 * @returns The sum.
 *
 * @example Usage
 * ```ts
 * import { add, Tensor } from "@deltanet/kda/tape";
 * add(new Tensor(new Float64Array([1, 2]), [2]), new Tensor(new Float64Array([3]), [1]));
 * ```
 */
export function add(a: Tensor, b: Tensor): Tensor {
  checkTensor("add", "a", a), checkTensor("add", "b", b);
  return apply("add", OPS.add, [a, b], undefined);
}

/**
 * Elementwise `a − b` with broadcasting.
 *
 * @param a Left operand.
 * @param b Right operand.
 * @returns The difference.
 *
 * @example Usage
 * ```ts
 * import { sub, Tensor } from "@deltanet/kda/tape";
 * sub(new Tensor(new Float64Array([3, 4]), [2]), new Tensor(new Float64Array([1]), [1]));
 * ```
 */
export function sub(a: Tensor, b: Tensor): Tensor {
  checkTensor("sub", "a", a), checkTensor("sub", "b", b);
  return apply("sub", OPS.sub, [a, b], undefined);
}

/**
 * Elementwise `a · b` with broadcasting.
 *
 * @param a Left operand.
 * @param b Right operand.
 * @returns The product.
 *
 * @example Usage
 * ```ts
 * import { mul, Tensor } from "@deltanet/kda/tape";
 * mul(new Tensor(new Float64Array([1, 2]), [2]), new Tensor(new Float64Array([3]), [1]));
 * ```
 */
export function mul(a: Tensor, b: Tensor): Tensor {
  checkTensor("mul", "a", a), checkTensor("mul", "b", b);
  return apply("mul", OPS.mul, [a, b], undefined);
}

/**
 * Elementwise `a / b` with broadcasting.
 *
 * @param a Numerator.
 * @param b Denominator.
 * @returns The quotient.
 *
 * @example Usage
 * ```ts
 * import { div, Tensor } from "@deltanet/kda/tape";
 * div(new Tensor(new Float64Array([1, 2]), [2]), new Tensor(new Float64Array([4]), [1]));
 * ```
 */
export function div(a: Tensor, b: Tensor): Tensor {
  checkTensor("div", "a", a), checkTensor("div", "b", b);
  return apply("div", OPS.div, [a, b], undefined);
}

/**
 * Multiplies by a constant.
 *
 * @param x The tensor.
 * @param c The constant.
 * @returns `c · x`.
 *
 * @example Usage
 * ```ts
 * import { scale, Tensor } from "@deltanet/kda/tape";
 * scale(new Tensor(new Float64Array([1, 2]), [2]), 3);
 * ```
 */
export function scale(x: Tensor, c: number): Tensor {
  checkTensor("scale", "x", x);
  if (typeof c !== "number" || !Number.isFinite(c)) {
    throw new TypeError(`scale() argument c must be a finite number: got ${c}`);
  }
  return apply("scale", OPS.scale, [x], c);
}

/**
 * Elementwise exponential.
 *
 * @param x The tensor.
 * @returns `e^x`.
 *
 * @example Usage
 * ```ts
 * import { exp, Tensor } from "@deltanet/kda/tape";
 * exp(new Tensor(new Float64Array([0, 1]), [2]));
 * ```
 */
export function exp(x: Tensor): Tensor {
  checkTensor("exp", "x", x);
  return apply("exp", OPS.exp, [x], undefined);
}

/**
 * Elementwise natural logarithm.
 *
 * @param x The tensor (positive).
 * @returns `ln x`.
 *
 * @example Usage
 * ```ts
 * import { log, Tensor } from "@deltanet/kda/tape";
 * log(new Tensor(new Float64Array([1, Math.E]), [2]));
 * ```
 */
export function log(x: Tensor): Tensor {
  checkTensor("log", "x", x);
  return apply("log", OPS.log, [x], undefined);
}

/**
 * Elementwise square root.
 *
 * @param x The tensor (non-negative).
 * @returns `√x`.
 *
 * @example Usage
 * ```ts
 * import { sqrt, Tensor } from "@deltanet/kda/tape";
 * sqrt(new Tensor(new Float64Array([4, 9]), [2]));
 * ```
 */
export function sqrt(x: Tensor): Tensor {
  checkTensor("sqrt", "x", x);
  return apply("sqrt", OPS.sqrt, [x], undefined);
}

/**
 * Elementwise reciprocal square root.
 *
 * @param x The tensor (positive).
 * @returns `1/√x`.
 *
 * @example Usage
 * ```ts
 * import { rsqrt, Tensor } from "@deltanet/kda/tape";
 * rsqrt(new Tensor(new Float64Array([4]), [1]));
 * ```
 */
export function rsqrt(x: Tensor): Tensor {
  checkTensor("rsqrt", "x", x);
  return apply("rsqrt", OPS.rsqrt, [x], undefined);
}

/**
 * Elementwise logistic sigmoid, computed without overflow for large |x|.
 *
 * @param x The tensor.
 * @returns `1 / (1 + e^−x)`.
 *
 * @example Usage
 * ```ts
 * import { sigmoid, Tensor } from "@deltanet/kda/tape";
 * sigmoid(new Tensor(new Float64Array([0]), [1]));
 * ```
 */
export function sigmoid(x: Tensor): Tensor {
  checkTensor("sigmoid", "x", x);
  return apply("sigmoid", OPS.sigmoid, [x], undefined);
}

/**
 * Elementwise SiLU (swish).
 *
 * @param x The tensor.
 * @returns `x · sigmoid(x)`.
 *
 * @example Usage
 * ```ts
 * import { silu, Tensor } from "@deltanet/kda/tape";
 * silu(new Tensor(new Float64Array([1]), [1]));
 * ```
 */
export function silu(x: Tensor): Tensor {
  checkTensor("silu", "x", x);
  return apply("silu", OPS.silu, [x], undefined);
}

/**
 * Elementwise softplus, computed without overflow.
 *
 * @param x The tensor.
 * @returns `ln(1 + e^x)`.
 *
 * @example Usage
 * ```ts
 * import { softplus, Tensor } from "@deltanet/kda/tape";
 * softplus(new Tensor(new Float64Array([0]), [1]));
 * ```
 */
export function softplus(x: Tensor): Tensor {
  checkTensor("softplus", "x", x);
  return apply("softplus", OPS.softplus, [x], undefined);
}

/**
 * Matrix product of two 2-D tensors.
 *
 * @param a Left matrix [m, k].
 * @param b Right matrix [k, n].
 * @returns `a · b`, [m, n].
 *
 * @example Usage
 * ```ts
 * import { matmul, Tensor } from "@deltanet/kda/tape";
 * matmul(new Tensor(new Float64Array([1, 2]), [1, 2]), new Tensor(new Float64Array([3, 4]), [2, 1]));
 * ```
 */
export function matmul(a: Tensor, b: Tensor): Tensor {
  checkTensor("matmul", "a", a), checkTensor("matmul", "b", b);
  if (a.shape.length !== 2 || b.shape.length !== 2 || a.shape[1] !== b.shape[0]) {
    throw new RangeError(
      `matmul() shapes must be [m, k] and [k, n]: got [${a.shape.join(", ")}] and [${
        b.shape.join(", ")
      }]`,
    );
  }
  return apply("matmul", OPS.matmul, [a, b], undefined);
}

/**
 * Transpose of a 2-D tensor.
 *
 * @param x A matrix [m, n].
 * @returns Its transpose [n, m].
 *
 * @example Usage
 * ```ts
 * import { transpose, Tensor } from "@deltanet/kda/tape";
 * transpose(new Tensor(new Float64Array([1, 2, 3, 4, 5, 6]), [2, 3]));
 * ```
 */
export function transpose(x: Tensor): Tensor {
  checkTensor("transpose", "x", x);
  if (x.shape.length !== 2) {
    throw new RangeError(`transpose() x must be 2-D: got shape [${x.shape.join(", ")}]`);
  }
  return apply("transpose", OPS.transpose, [x], undefined);
}

/**
 * `x · wᵀ`, the linear layer of a weight stored as [out, in].
 *
 * @param x Input rows [n, in].
 * @param w Weight [out, in].
 * @returns [n, out].
 *
 * @example Usage
 * ```ts
 * import { linear, Tensor } from "@deltanet/kda/tape";
 * linear(new Tensor(new Float64Array([1, 2]), [1, 2]), new Tensor(new Float64Array([3, 4]), [1, 2]));
 * ```
 */
export function linear(x: Tensor, w: Tensor): Tensor {
  return matmul(x, transpose(w));
}

/**
 * Sum over one axis.
 *
 * @param x The tensor.
 * @param axis The axis to reduce (negative counts from the end).
 * @param options `keepDims` keeps the reduced axis with length 1.
 * @returns The sums.
 *
 * @example Usage
 * ```ts
 * import { sum, Tensor } from "@deltanet/kda/tape";
 * sum(new Tensor(new Float64Array([1, 2, 3, 4]), [2, 2]), 1); // [3, 7]
 * ```
 */
export function sum(x: Tensor, axis: number, options: { keepDims?: boolean } = {}): Tensor {
  checkTensor("sum", "x", x);
  const a = checkAxis("sum", x.shape, axis);
  return apply("sum", OPS.sum, [x], { axis: a, keepDims: options.keepDims ?? false });
}

/**
 * The same values under another shape of equal size (no copy).
 *
 * @param x The tensor.
 * @param shape The new dimensions.
 * @returns The reshaped tensor.
 *
 * @example Usage
 * ```ts
 * import { reshape, Tensor } from "@deltanet/kda/tape";
 * reshape(new Tensor(new Float64Array(6), [2, 3]), [3, 2]);
 * ```
 */
export function reshape(x: Tensor, shape: readonly number[]): Tensor {
  checkTensor("reshape", "x", x);
  if (!shape.every((d) => Number.isInteger(d) && d >= 0) || sizeOf(shape) !== x.size) {
    throw new RangeError(
      `reshape() shape must have ${x.size} elements: got [${shape.join(", ")}]`,
    );
  }
  return apply("reshape", OPS.reshape, [x], Object.freeze([...shape]));
}

/**
 * The range `[start, end)` of one axis.
 *
 * @param x The tensor.
 * @param axis The axis to cut.
 * @param range `start` (inclusive) and `end` (exclusive) along the axis.
 * @returns The slice.
 *
 * @example Usage
 * ```ts
 * import { slice, Tensor } from "@deltanet/kda/tape";
 * slice(new Tensor(new Float64Array([1, 2, 3, 4]), [4]), 0, { start: 1, end: 3 });
 * ```
 */
export function slice(x: Tensor, axis: number, range: { start: number; end: number }): Tensor {
  checkTensor("slice", "x", x);
  const a = checkAxis("slice", x.shape, axis);
  const { start, end } = range;
  if (
    !Number.isInteger(start) || !Number.isInteger(end) || start < 0 || end > x.shape[a] ||
    start > end
  ) {
    throw new RangeError(
      `slice() range must satisfy 0 <= start <= end <= ${x.shape[a]}: got [${start}, ${end})`,
    );
  }
  return apply("slice", OPS.slice, [x], { axis: a, start, end });
}

/**
 * Joins tensors along one axis; the other dimensions must agree.
 *
 * @param xs The tensors, at least one.
 * @param axis The axis to join along.
 * @returns The concatenation.
 *
 * @example Usage
 * ```ts
 * import { concat, Tensor } from "@deltanet/kda/tape";
 * concat([new Tensor(new Float64Array([1]), [1]), new Tensor(new Float64Array([2]), [1])], 0);
 * ```
 */
export function concat(xs: readonly Tensor[], axis: number): Tensor {
  if (!Array.isArray(xs as unknown) || xs.length === 0) {
    throw new RangeError(`concat() xs must be a non-empty array: got ${xs?.length ?? typeof xs}`);
  }
  xs.forEach((x, i) => checkTensor("concat", `xs[${i}]`, x));
  const a = checkAxis("concat", xs[0].shape, axis);
  for (const x of xs) {
    if (
      x.shape.length !== xs[0].shape.length ||
      x.shape.some((d, i) => i !== a && d !== xs[0].shape[i])
    ) {
      throw new RangeError(
        `concat() shapes must agree off axis ${a}: got [${xs[0].shape.join(", ")}] and [${
          x.shape.join(", ")
        }]`,
      );
    }
  }
  return apply("concat", OPS.concat, xs, a);
}

/**
 * Depthwise causal convolution over time: `y[b,t,c] = Σ_j w[c,j] · u[b, t−W+1+j, c]`, with zeros
 * before `t = 0`.
 *
 * @param u Input [B, T, C].
 * @param w Per-channel taps [C, W]; the last tap multiplies the current token.
 * @returns [B, T, C].
 *
 * @example Usage
 * ```ts
 * import { causalConv, Tensor } from "@deltanet/kda/tape";
 * const u = new Tensor(new Float64Array([1, 2, 3]), [1, 3, 1]);
 * causalConv(u, new Tensor(new Float64Array([0.5, 1]), [1, 2])); // [1, 2.5, 4]
 * ```
 */
export function causalConv(u: Tensor, w: Tensor): Tensor {
  checkTensor("causalConv", "u", u), checkTensor("causalConv", "w", w);
  if (u.shape.length !== 3 || w.shape.length !== 2 || w.shape[0] !== u.shape[2]) {
    throw new RangeError(
      `causalConv() shapes must be u [B, T, C] and w [C, W]: got [${u.shape.join(", ")}] and [${
        w.shape.join(", ")
      }]`,
    );
  }
  return apply("causalConv", OPS.causalConv, [u, w], undefined);
}

function checkEps(name: string, eps: number): void {
  if (typeof eps !== "number" || !(eps >= 0) || !Number.isFinite(eps)) {
    throw new RangeError(`${name}() eps must be a finite number >= 0: got ${eps}`);
  }
}

/**
 * L2 normalisation over the last axis: `x / sqrt(Σ x² + eps)`.
 *
 * @param x The tensor.
 * @param options `eps` (default 1e-6).
 * @returns The normalised rows.
 *
 * @example Usage
 * ```ts
 * import { l2norm, Tensor } from "@deltanet/kda/tape";
 * l2norm(new Tensor(new Float64Array([3, 4]), [1, 2]));
 * ```
 */
export function l2norm(x: Tensor, options: { eps?: number } = {}): Tensor {
  checkTensor("l2norm", "x", x);
  const eps = options.eps ?? 1e-6;
  checkEps("l2norm", eps);
  return apply("l2norm", rowNorm(false, eps), [x], undefined);
}

/**
 * RMS normalisation over the last axis (no weight): `x / sqrt(mean(x²) + eps)`.
 *
 * @param x The tensor.
 * @param options `eps` (default 1e-5).
 * @returns The normalised rows.
 *
 * @example Usage
 * ```ts
 * import { rmsnorm, Tensor } from "@deltanet/kda/tape";
 * rmsnorm(new Tensor(new Float64Array([3, 4]), [1, 2]));
 * ```
 */
export function rmsnorm(x: Tensor, options: { eps?: number } = {}): Tensor {
  checkTensor("rmsnorm", "x", x);
  const eps = options.eps ?? 1e-5;
  checkEps("rmsnorm", eps);
  return apply("rmsnorm", rowNorm(true, eps), [x], undefined);
}

/**
 * Splits a tensor along one axis into its slices, that axis removed; one node with many outputs,
 * so differentiating a loop over the pieces costs one pass over `x`, not one per piece.
 *
 * @param x The tensor.
 * @param axis The axis to split.
 * @returns `x.shape[axis]` tensors.
 *
 * @example Usage
 * ```ts
 * import { Tensor, unstack } from "@deltanet/kda/tape";
 * unstack(new Tensor(new Float64Array([1, 2, 3, 4]), [2, 2]), 0); // [1, 2] and [3, 4]
 * ```
 */
export function unstack(x: Tensor, axis: number): Tensor[] {
  checkTensor("unstack", "x", x);
  const a = checkAxis("unstack", x.shape, axis);
  const [outer, n, inner] = around(x.shape, a);
  const shape = x.shape.filter((_, i) => i !== a);
  const outputs = [];
  for (let j = 0; j < n; j++) {
    const data = alloc(x.dtype, outer * inner);
    for (let o = 0; o < outer; o++) {
      data.set(x.data.subarray((o * n + j) * inner, (o * n + j + 1) * inner), o * inner);
    }
    outputs.push({ data, shape });
  }
  return customNode("unstack", {
    inputs: [x],
    outputs,
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
  });
}

/**
 * Joins equally shaped tensors along a new axis.
 *
 * @param xs The tensors, at least one.
 * @param axis Where the new axis goes.
 * @returns The stacked tensor.
 *
 * @example Usage
 * ```ts
 * import { stack, Tensor } from "@deltanet/kda/tape";
 * stack([new Tensor(new Float64Array([1]), [1]), new Tensor(new Float64Array([2]), [1])], 0);
 * ```
 */
export function stack(xs: readonly Tensor[], axis: number): Tensor {
  if (!Array.isArray(xs as unknown) || xs.length === 0) {
    throw new RangeError(`stack() xs must be a non-empty array: got ${xs?.length ?? typeof xs}`);
  }
  xs.forEach((x, i) => checkTensor("stack", `xs[${i}]`, x));
  const rank = xs[0].shape.length;
  if (!Number.isInteger(axis) || axis < 0 || axis > rank) {
    throw new RangeError(`stack() axis must be an integer in [0, ${rank}]: got ${axis}`);
  }
  for (const x of xs) {
    if (x.shape.length !== rank || x.shape.some((d, i) => d !== xs[0].shape[i])) {
      throw new RangeError(
        `stack() shapes must be equal: got [${xs[0].shape.join(", ")}] and [${x.shape.join(", ")}]`,
      );
    }
  }
  const withUnitAxis = [...xs[0].shape.slice(0, axis), 1, ...xs[0].shape.slice(axis)];
  return concat(xs.map((x) => reshape(x, withUnitAxis)), axis);
}

/**
 * Records a custom node with any number of inputs and outputs: the outputs' values are given,
 * and `vjp` maps their cotangents back. When no input requires a gradient nothing is recorded and
 * the outputs are constants.
 *
 * @param name The node's name.
 * @param def `inputs` (undefined entries allowed), `outputs` as values with shapes, `vjp`, and an
 * optional `dispose` for held resources.
 * @returns The output tensors, in order.
 *
 * @example Usage
 * ```ts
 * import { customNode, Tape } from "@deltanet/kda/tape";
 * const tape = new Tape("f64");
 * const x = tape.variable(new Float64Array([2]), [1]);
 * const [y] = customNode("double", {
 *   inputs: [x],
 *   outputs: [{ data: new Float64Array([4]), shape: [1] }],
 *   vjp: ([g]) => [g === null ? null : g.map((v) => 2 * v)],
 * });
 * ```
 */
export function customNode(
  name: string,
  def: {
    inputs: readonly (Tensor | undefined)[];
    outputs: readonly { data: Data; shape: readonly number[] }[];
    vjp: (
      cotangents: readonly (Data | null)[],
    ) => readonly (Data | null)[] | Promise<readonly (Data | null)[]>;
    dispose?: () => void;
  },
): Tensor[] {
  const tape: Tape | undefined = tapeOf(def.inputs);
  if (tape === undefined) return def.outputs.map((o) => new Tensor(o.data, o.shape));
  const outputs = def.outputs.map((o) => tape.output(o.data, o.shape));
  tape.record({ name, inputs: def.inputs, outputs, vjp: def.vjp, dispose: def.dispose });
  return outputs;
}

/**
 * A constant tensor (no gradient) of the given dtype, filled from `values`.
 *
 * @param dtype The element type.
 * @param values The values.
 * @param shape The dimensions; defaults to `[values.length]`.
 * @returns The tensor.
 *
 * @example Usage
 * ```ts
 * import { constant } from "@deltanet/kda/tape";
 * constant("f64", [1, 2, 3, 4], [2, 2]);
 * ```
 */
export function constant(
  dtype: DType,
  values: ArrayLike<number>,
  shape?: readonly number[],
): Tensor {
  const data = alloc(dtype, values.length);
  data.set(values);
  return new Tensor(data, shape ?? [values.length]);
}
