// The tape's public op functions: each checks its arguments, in the caller's words, and runs its
// entry of the op table (_table.ts), where the forward, VJP and JVP live side by side.

import { alloc, type ComputeDType } from "../base/dtype.ts";
import { typeName } from "../base/check.ts";
import { type Data, type MaybePromise, sizeOf, type Tape, tapeOf, Tensor } from "./tape.ts";
import { apply, OPS, rowNorm, unstackDef } from "./_table.ts";
import type { Shape } from "./_broadcast.ts";

function checkAxis(name: string, shape: Shape, axis: number): number {
  const a = axis < 0 ? axis + shape.length : axis;
  if (!Number.isInteger(a) || a < 0 || a >= shape.length) {
    throw new RangeError(
      `${name}() axis must be an integer in [${-shape.length}, ${shape.length - 1}]: got ${axis}`,
    );
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// The public functions

function checkTensor(name: string, arg: string, x: unknown): asserts x is Tensor {
  if (!(x instanceof Tensor)) {
    throw new TypeError(
      `${name}() argument ${arg} must be a Tensor: got ${x === null ? "null" : typeof x}`,
    );
  }
}

// The elementwise ops differ only in their name and table entry, so one function makes each
// kind; the name is set so that stack traces and logs show the op, not the factory's closure.

/** The public function of an elementwise binary op: checks both operands, runs its entry. */
function binaryOp(name: "add" | "sub" | "mul" | "div"): (a: Tensor, b: Tensor) => Tensor {
  const op = (a: Tensor, b: Tensor): Tensor => {
    checkTensor(name, "a", a), checkTensor(name, "b", b);
    return apply(name, OPS[name], [a, b], undefined);
  };
  return Object.defineProperty(op, "name", { value: name });
}

/** The public function of an elementwise unary op: checks the operand, runs its entry. */
function unaryOp(
  name: "exp" | "log" | "sqrt" | "rsqrt" | "sigmoid" | "silu" | "softplus",
): (x: Tensor) => Tensor {
  const op = (x: Tensor): Tensor => {
    checkTensor(name, "x", x);
    return apply(name, OPS[name], [x], undefined);
  };
  return Object.defineProperty(op, "name", { value: name });
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
export const add: (a: Tensor, b: Tensor) => Tensor = binaryOp("add");

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
export const sub: (a: Tensor, b: Tensor) => Tensor = binaryOp("sub");

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
export const mul: (a: Tensor, b: Tensor) => Tensor = binaryOp("mul");

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
export const div: (a: Tensor, b: Tensor) => Tensor = binaryOp("div");

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
export const exp: (x: Tensor) => Tensor = unaryOp("exp");

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
export const log: (x: Tensor) => Tensor = unaryOp("log");

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
export const sqrt: (x: Tensor) => Tensor = unaryOp("sqrt");

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
export const rsqrt: (x: Tensor) => Tensor = unaryOp("rsqrt");

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
export const sigmoid: (x: Tensor) => Tensor = unaryOp("sigmoid");

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
export const silu: (x: Tensor) => Tensor = unaryOp("silu");

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
export const softplus: (x: Tensor) => Tensor = unaryOp("softplus");

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
  checkTensor("linear", "x", x), checkTensor("linear", "w", w);
  if (x.shape.length !== 2 || w.shape.length !== 2 || x.shape[1] !== w.shape[1]) {
    throw new RangeError(
      `linear() shapes must be x [n, in] and w [out, in]: got [${x.shape.join(", ")}] and [${
        w.shape.join(", ")
      }]`,
    );
  }
  tapeOf([x, w], "linear");
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
  if (!Array.isArray(shape)) {
    throw new TypeError(`reshape() shape must be an array of dimensions: got ${typeName(shape)}`);
  }
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
  if (typeof range !== "object" || range === null) {
    throw new TypeError(`slice() range must be an object { start, end }: got ${typeName(range)}`);
  }
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

/** Throws unless `x` has an axis to normalise over. */
function checkRows(name: string, x: Tensor): void {
  if (x.shape.length === 0) {
    throw new RangeError(`${name}() x must have at least one axis (its rows): got a scalar`);
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
  checkRows("l2norm", x);
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
  checkRows("rmsnorm", x);
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
  return customNode("unstack", unstackDef(x, a));
}

/**
 * Joins equally shaped tensors along a new axis.
 *
 * @param xs The tensors, at least one.
 * @param axis Where the new axis goes, among the result's axes: 0 to rank, or negative from the
 * end as every axis of the tape (-1 puts it last).
 * @returns The stacked tensor.
 *
 * @example Usage
 * ```ts
 * import assert from "node:assert/strict";
 * import { stack, Tensor } from "@deltanet/kda/tape";
 * const a = new Tensor(new Float64Array([1, 2]), [2]), b = new Tensor(new Float64Array([3, 4]), [2]);
 * assert.deepEqual(stack([a, b], 0).shape, [2, 2]);
 * assert.deepEqual([...stack([a, b], -1).data], [1, 3, 2, 4]);
 * ```
 */
export function stack(xs: readonly Tensor[], axis: number): Tensor {
  if (!Array.isArray(xs as unknown) || xs.length === 0) {
    throw new RangeError(`stack() xs must be a non-empty array: got ${xs?.length ?? typeof xs}`);
  }
  xs.forEach((x, i) => checkTensor("stack", `xs[${i}]`, x));
  tapeOf(xs, "stack");
  const rank = xs[0].shape.length;
  // an axis of the result, which has one more than the inputs
  axis = checkAxis("stack", [...xs[0].shape, 1], axis);
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
 * `vjp` maps their cotangents back and the optional `jvp` maps the inputs' tangents forward. When
 * no input requires a gradient nothing is recorded and the outputs are constants. A node without
 * a `jvp` works in reverse mode; forward mode (`jvp`) through it throws an error naming it.
 *
 * @param name The node's name.
 * @param def `inputs` (undefined entries allowed), `outputs` as values with shapes, `vjp`, an
 * optional `jvp` (tangents of the inputs, null for none, to tangents of the outputs), and an
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
 *   jvp: ([t]) => [t === null ? null : t.map((v) => 2 * v)],
 * });
 * ```
 */
export function customNode(
  name: string,
  def: {
    inputs: readonly (Tensor | undefined)[];
    outputs: readonly { data: Data; shape: readonly number[] }[];
    vjp: (cotangents: readonly (Data | null)[]) => MaybePromise<readonly (Data | null)[]>;
    jvp?: (tangents: readonly (Data | null)[]) => MaybePromise<readonly (Data | null)[]>;
    dispose?: () => void;
  },
): Tensor[] {
  const tape: Tape | undefined = tapeOf(def.inputs, name);
  if (tape === undefined) return def.outputs.map((o) => new Tensor(o.data, o.shape));
  const outputs = def.outputs.map((o) => tape.output(o.data, o.shape));
  const { inputs, vjp, jvp, dispose } = def;
  tape.record({ name, inputs, outputs, vjp, jvp, dispose });
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
  dtype: ComputeDType,
  values: ArrayLike<number>,
  shape?: readonly number[],
): Tensor {
  if (dtype !== "f64" && dtype !== "f32") {
    throw new TypeError(`constant() dtype must be "f64" or "f32": got ${String(dtype)}`);
  }
  const data = alloc(dtype, values.length);
  data.set(values);
  return new Tensor(data, shape ?? [values.length]);
}
