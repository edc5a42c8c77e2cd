// The tape's value type: a shape over one typed array. Tensors are immutable once made: ops
// allocate their results, so sharing a `data` array between tensors (as `reshape` does) is safe.

import type { Tape } from "./tape.ts";

/** Element type of a tensor: one per tape, never mixed. */
export type DType = "f64" | "f32";

/** The typed array behind a tensor. */
export type Data = Float64Array | Float32Array;

/**
 * Allocates a zero-filled array of `n` elements of the given dtype.
 *
 * @param dtype The element type.
 * @param n The number of elements.
 * @returns A new zero-filled typed array.
 *
 * @example Usage
 * ```ts
 * import { alloc } from "@deltanet/kda/tape";
 * const a = alloc("f32", 3); // Float32Array [0, 0, 0]
 * ```
 */
export function alloc(dtype: DType, n: number): Data {
  return dtype === "f64" ? new Float64Array(n) : new Float32Array(n);
}

/**
 * The dtype of a typed array.
 *
 * @param data A Float64Array or Float32Array.
 * @returns `"f64"` or `"f32"`.
 *
 * @example Usage
 * ```ts
 * import { dtypeOf } from "@deltanet/kda/tape";
 * dtypeOf(new Float32Array(2)); // "f32"
 * ```
 */
export function dtypeOf(data: Data): DType {
  if (data instanceof Float64Array) return "f64";
  if (data instanceof Float32Array) return "f32";
  throw new TypeError(
    `Tensor data must be a Float64Array or Float32Array: got ${describe(data)}`,
  );
}

/**
 * The number of elements of a shape.
 *
 * @param shape Dimensions, row-major.
 * @returns Their product (1 for a scalar shape `[]`).
 *
 * @example Usage
 * ```ts
 * import { sizeOf } from "@deltanet/kda/tape";
 * sizeOf([2, 3]); // 6
 * ```
 */
export function sizeOf(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** A human-readable description of a value's type, for error messages. */
export function describe(x: unknown): string {
  if (x === null) return "null";
  if (typeof x !== "object") return typeof x;
  return (x as object).constructor?.name ?? "object";
}

/**
 * An n-dimensional array of f64 or f32 values, row-major. A tensor made by an op on a tape
 * (or marked as a variable) requires a gradient; a plain tensor is a constant.
 *
 * @example Usage
 * ```ts
 * import { Tensor } from "@deltanet/kda/tape";
 * const t = new Tensor(new Float64Array([1, 2, 3, 4]), [2, 2]);
 * t.shape; // [2, 2]
 * ```
 */
export class Tensor {
  /** Dimensions, row-major. */
  readonly shape: readonly number[];
  /** The values, `size` of them. */
  readonly data: Data;
  /** The tape that records ops on this tensor, when it requires a gradient. */
  readonly tape: Tape | undefined;

  /**
   * Makes a tensor over `data` (not copied).
   *
   * @param data The values, row-major.
   * @param shape The dimensions; their product must equal `data.length`.
   * @param tape The recording tape, for tensors that require a gradient (set by the tape).
   */
  constructor(data: Data, shape: readonly number[], tape?: Tape) {
    dtypeOf(data);
    for (const d of shape) {
      if (!Number.isInteger(d) || d < 0) {
        throw new RangeError(
          `Tensor shape must hold non-negative integers: got [${shape.join(", ")}]`,
        );
      }
    }
    if (sizeOf(shape) !== data.length) {
      throw new RangeError(
        `Tensor data length must equal the shape's size ${sizeOf(shape)} for shape [${
          shape.join(", ")
        }]: got ${data.length}`,
      );
    }
    this.data = data;
    this.shape = Object.freeze([...shape]);
    this.tape = tape;
  }

  /** The element type. */
  get dtype(): DType {
    return this.data instanceof Float64Array ? "f64" : "f32";
  }

  /** The number of elements. */
  get size(): number {
    return this.data.length;
  }

  /** Whether gradients flow to this tensor (it was made on a tape). */
  get requiresGrad(): boolean {
    return this.tape !== undefined;
  }
}
