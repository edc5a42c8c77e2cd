// The value checks of one call's checked copies (every element in an interval: finite, g <= 0,
// beta in its range, aLog below its bound), in the order the call states them, run on the calling
// thread or, for large copies, by worker threads (_range_scan.ts) while the call uploads.
//
// Whatever runs where, the error is the one of the first failing check in the call's order, with
// the same message: a check that runs at once and fails throws at once, and the call settles that
// error against the verdict of the checks still running before it (as any later error of its own,
// a wrong cotangent, say), so that an earlier check's error wins, as it did when every check ran at
// once.

import type { Float } from "../_types.ts";
import { scanRanges } from "./_range_scan.ts";

/** Bytes of a copy from which a call may check it in workers (below: on the calling thread). */
export const DEFER_CHECK_BYTES = 16 * 2 ** 20;

/** The error of an element outside its interval, built from the element and its index. */
export type ValueError = (value: number, index: number) => RangeError;

interface Pending {
  array: Float;
  lo: number;
  hi: number;
  error: ValueError;
}

/**
 * The first index of `a` whose element is not in [lo, hi] (NaN is in none), or -1.
 *
 * @param a The array.
 * @param lo Least value allowed.
 * @param hi Greatest value allowed.
 * @returns The index, or -1.
 * @example
 * ```ts
 * import { firstOutside } from "./_value_checks.ts";
 * firstOutside(new Float32Array([0, -1, Number.NaN]), -0.5, 1); // 1
 * ```
 */
export function firstOutside(a: Float, lo: number, hi: number): number {
  for (let i = 0; i < a.length; i++) {
    const v = a[i];
    if (!(v >= lo && v <= hi)) return i;
  }
  return -1;
}

/**
 * One call's value checks, in order.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { ValueChecks } from "./_value_checks.ts";
 * const checks = new ValueChecks({ deferBytes: 0 });
 * const a = new Float32Array(new SharedArrayBuffer(8));
 * a.set([1, Number.NaN]);
 * checks.check(a, -1, 1, (v, i) => new RangeError(`a must be finite: got ${v} at index ${i}`));
 * await assert.rejects(() => checks.verdict(), /got NaN at index 1/);
 * ```
 */
export class ValueChecks {
  readonly #deferBytes: number;
  readonly #pending: Pending[] = [];
  #verdict: Promise<void> | null = null;

  /**
   * Makes the checks of one call.
   *
   * @param options `deferBytes`: copies of at least this many bytes in shared memory are checked
   *   by workers (default Infinity: every check runs at once).
   */
  constructor(options: { deferBytes?: number } = {}) {
    this.#deferBytes = options.deferBytes ?? Infinity;
  }

  /**
   * Checks that every element of `array` lies in [lo, hi]: at once, or (a large copy in shared
   * memory) by workers when the verdict is asked for.
   *
   * @param array The checked copy.
   * @param lo Least value allowed.
   * @param hi Greatest value allowed.
   * @param error The error of an element outside.
   * @throws {RangeError} At once, when the check ran at once and failed (settle it: an earlier
   *   check still running may have failed first).
   */
  check(array: Float, lo: number, hi: number, error: ValueError): void {
    if (array.byteLength >= this.#deferBytes && array.buffer instanceof SharedArrayBuffer) {
      if (this.#verdict !== null) throw new Error("internal: a value check after the verdict");
      this.#pending.push({ array, lo, hi, error });
      return;
    }
    const i = firstOutside(array, lo, hi);
    if (i >= 0) throw error(array[i], i);
  }

  /**
   * The verdict of the checks still running: resolves when every one passed, else rejects with the
   * first failure in order. The first call starts the workers; later calls return the same promise.
   *
   * @returns The verdict.
   */
  verdict(): Promise<void> {
    this.#verdict ??= this.#decide();
    return this.#verdict;
  }

  async #decide(): Promise<void> {
    if (this.#pending.length === 0) return;
    const found = await scanRanges(this.#pending);
    for (const [p, i] of found.entries()) {
      const { array, error } = this.#pending[p];
      if (i >= 0) throw error(array[i], i);
    }
  }

  /**
   * Reports an error a call met after some of its checks: the first failing check's error if there
   * is one (it came first), else this error.
   *
   * @param error The later error.
   * @returns Never: it throws.
   */
  async settle(error: unknown): Promise<never> {
    await this.verdict();
    throw error;
  }
}
