// Grouped value heads on the host (docs/kda.md 2.5), for the cpu arm, whose chunked kernels see
// one query/key head per value head: q and k are repeated once per value head of their group
// before the forward, and dq, dk summed over each group after the backward, in one fixed order.

import type { Float } from "../_types.ts";
import { alloc, computeDtypeOf } from "../../base/dtype.ts";

/**
 * Repeats each head of a [rows, H, X] array G times: head j of the result is head j / G.
 *
 * @param x The array.
 * @param rows Rows (B·T).
 * @param H Heads.
 * @param G Value heads per head.
 * @param X Elements per head.
 * @returns A new [rows, H·G, X] array of x's type.
 * @example
 * ```ts
 * expandHeads(new Float64Array([1, 2]), 1, 2, 2, 1); // [1, 1, 2, 2]
 * ```
 */
export function expandHeads(x: Float, rows: number, H: number, G: number, X: number): Float {
  const out = alloc(computeDtypeOf(x), rows * H * G * X);
  for (let r = 0; r < rows; r++) {
    for (let h = 0; h < H; h++) {
      const src = x.subarray((r * H + h) * X, (r * H + h + 1) * X);
      for (let g = 0; g < G; g++) out.set(src, ((r * H + h) * G + g) * X);
    }
  }
  return out;
}

/**
 * Sums each group of G heads of a [rows, H·G, X] array, in ascending order within the group.
 *
 * @param x The array.
 * @param rows Rows (B·T).
 * @param H Heads of the result.
 * @param G Heads per group.
 * @param X Elements per head.
 * @returns A new [rows, H, X] array of x's type.
 * @example
 * ```ts
 * sumHeads(new Float64Array([1, 1, 2, 2]), 1, 2, 2, 1); // [2, 4]
 * ```
 */
export function sumHeads(x: Float, rows: number, H: number, G: number, X: number): Float {
  const out = alloc(computeDtypeOf(x), rows * H * X);
  for (let r = 0; r < rows; r++) {
    for (let h = 0; h < H; h++) {
      for (let c = 0; c < X; c++) {
        // summed in the array itself, so each partial sum is rounded to its precision
        const at = (r * H + h) * X + c;
        out[at] = x[((r * H + h) * G) * X + c];
        for (let g = 1; g < G; g++) out[at] += x[((r * H + h) * G + g) * X + c];
      }
    }
  }
  return out;
}
