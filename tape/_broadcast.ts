// Shape helpers shared by the op table: numpy broadcasting (right-aligned) and the [outer, n,
// inner] view of a shape around one axis.

import { alloc, computeDtypeOf } from "../base/dtype.ts";
import { type Data, sizeOf } from "./tape.ts";

/** A tensor's dimensions, row-major. */
export type Shape = readonly number[];

/**
 * The shape two operands broadcast to, by numpy rules (right-aligned; a 1 stretches).
 *
 * @param a The left operand's shape.
 * @param b The right operand's shape.
 * @param op The op's name, for the error message.
 * @returns The broadcast shape.
 * @throws {RangeError} When the shapes do not broadcast.
 *
 * @example
 * ```ts
 * import { broadcastShape } from "./_broadcast.ts";
 * broadcastShape([2, 1, 3], [4, 1], "add"); // [2, 4, 3]
 * ```
 */
export function broadcastShape(a: Shape, b: Shape, op: string): number[] {
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

/**
 * Strides of `shape` laid over `outShape`, 0 where `shape` broadcasts.
 *
 * @param shape An operand's shape.
 * @param outShape The broadcast shape.
 * @returns One stride per axis of `outShape`.
 *
 * @example
 * ```ts
 * import { broadcastStrides } from "./_broadcast.ts";
 * broadcastStrides([3], [2, 3]); // [0, 1]
 * ```
 */
export function broadcastStrides(shape: Shape, outShape: Shape): number[] {
  const strides = new Array<number>(outShape.length).fill(0);
  let stride = 1;
  for (let i = shape.length - 1; i >= 0; i--) {
    const o = outShape.length - shape.length + i;
    strides[o] = shape[i] === 1 ? 0 : stride;
    stride *= shape[i];
  }
  return strides;
}

/**
 * Visits every index of `outShape` in row-major order with the matching offsets into a and b.
 *
 * @param outShape The broadcast shape.
 * @param sa Strides of operand a over `outShape`.
 * @param sb Strides of operand b over `outShape`.
 * @param fn Called with the flat output index and the two operand offsets.
 * @returns Nothing.
 *
 * @example
 * ```ts
 * import { forEachBroadcast } from "./_broadcast.ts";
 * forEachBroadcast([2, 2], [2, 1], [0, 1], (i, ia, ib) => console.log(i, ia, ib));
 * ```
 */
export function forEachBroadcast(
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

/**
 * Sums a cotangent of shape `from` down to the broadcast operand's `to` shape (returned as is when
 * the sizes agree).
 *
 * @param g The cotangent, of shape `from`.
 * @param from The broadcast shape.
 * @param to The operand's shape.
 * @returns The reduced cotangent.
 *
 * @example
 * ```ts
 * import { sumToShape } from "./_broadcast.ts";
 * sumToShape(Float64Array.of(1, 2, 3, 4), [2, 2], [2]); // Float64Array [4, 6]
 * ```
 */
export function sumToShape(g: Data, from: Shape, to: Shape): Data {
  if (sizeOf(from) === sizeOf(to)) return g;
  const out = alloc(computeDtypeOf(g), sizeOf(to));
  const st = broadcastStrides(to, from);
  forEachBroadcast(from, st, st, (i, it) => {
    out[it] += g[i];
  });
  return out;
}

/**
 * The [outer, n, inner] view of a shape around one axis.
 *
 * @param shape The shape.
 * @param axis The axis (non-negative).
 * @returns The product of the dimensions before it, its length, and the product after it.
 *
 * @example
 * ```ts
 * import { around } from "./_broadcast.ts";
 * around([2, 3, 4], 1); // [2, 3, 4]
 * ```
 */
export function around(shape: Shape, axis: number): [number, number, number] {
  return [sizeOf(shape.slice(0, axis)), shape[axis], sizeOf(shape.slice(axis + 1))];
}
