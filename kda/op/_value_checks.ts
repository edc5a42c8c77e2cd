// The value checks of one call's checked copies (every element in an interval: finite, g <= 0,
// beta in its range, aLog below its bound), in the order the call states them. A small copy is
// checked at once on the calling thread; a large one is left pending, for the arm that uploads it
// to check on what it uploaded (the gpu arm: kda/gpu/range_checks.ts, one pass a check and one
// flag read back with the results), and whatever no arm reported is checked on the calling thread
// when the call asks for the verdict, after its run.
//
// Whatever runs where, the error is the one of the first failing check in the call's order, with
// the same message: a check that runs at once and fails throws at once, and the call settles that
// error against the verdict of the pending checks before it (as any later error of its own, a
// wrong cotangent, say), so that an earlier check's error wins, as it did when every check ran at
// once. A check the device failed has its element found on the host copy, which holds the bytes
// the device read; a call that uploaded its arrays as it checked them, with no host copy
// (kda/gpu/snapshot.ts), finds it by reading the upload back.

import type { Float } from "../_types.ts";
import type { RangeCheck, RangeChecks } from "../gpu/mod.ts";
import { DeviceSnapshot } from "../gpu/snapshot.ts";

/** Bytes of a copy from which a call leaves its checks pending (below: it checks it at once). */
export const DEFER_CHECK_BYTES = 2 ** 20;

/** The error of an element outside its interval, built from the element and its index. */
export type ValueError = (value: number, index: number) => RangeError;

/** What a check reads: a checked copy, or a snapshot on the device. */
export type CheckedArray = Float | DeviceSnapshot;

interface Pending extends RangeCheck {
  readonly array: CheckedArray;
  readonly error: ValueError;
  /** What an arm reported: whether every element passed on its device. */
  outcome?: boolean;
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

/** A pending check's error on these elements (its copy, or its snapshot read back), or null. */
function failureOf(index: number, p: Pending, array: Float): Error | null {
  const i = firstOutside(array, p.lo, p.hi);
  if (i >= 0) return p.error(array[i], i);
  if (p.outcome === false) {
    return new Error(
      `internal: pending value check ${index} failed on the device, but its copy holds no ` +
        `element outside [${p.lo}, ${p.hi}]`,
    );
  }
  return null;
}

/**
 * One call's value checks, in order; the pending ones are the call's {@linkcode RangeChecks}, for
 * an arm to run on its device and report.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { ValueChecks } from "./_value_checks.ts";
 * const checks = new ValueChecks({ deferBytes: 0 });
 * const a = new Float32Array([1, Number.NaN]);
 * checks.check(a, -1, 1, (v, i) => new RangeError(`a must be finite: got ${v} at index ${i}`));
 * assert.equal(checks.list.length, 1); // pending: no arm reported it
 * await assert.rejects(() => checks.verdict(), /got NaN at index 1/);
 * ```
 */
export class ValueChecks implements RangeChecks {
  readonly #deferBytes: number;
  readonly #pending: Pending[] = [];
  #verdict: Promise<void> | null = null;

  /**
   * Makes the checks of one call.
   *
   * @param options `deferBytes`: checks of arrays of at least this many bytes are left pending
   *   (default Infinity: every check runs at once).
   */
  constructor(options: { deferBytes?: number } = {}) {
    this.#deferBytes = options.deferBytes ?? Infinity;
  }

  /** The pending checks, in order (none once the verdict was asked for). */
  get list(): readonly RangeCheck[] {
    return this.#verdict === null ? this.#pending : [];
  }

  /**
   * Records what an arm found for pending check `index`, run on the bytes it computes on. A report
   * after the verdict was asked for changes nothing.
   *
   * @param index The check's index in {@linkcode ValueChecks.list}.
   * @param passed Whether every element lay in its interval.
   */
  report(index: number, passed: boolean): void {
    if (this.#verdict !== null) return;
    const pending = this.#pending[index];
    if (pending === undefined) {
      throw new RangeError(
        `index must name a pending check (0 to ${this.#pending.length - 1}): got ${index}`,
      );
    }
    pending.outcome = passed;
  }

  /**
   * Checks that every element of `array` lies in [lo, hi]: at once, or (a large copy) left
   * pending until an arm reports it or the verdict is asked for.
   *
   * @param array The checked copy, or a snapshot (checked at once on the caller's array, which it
   *   holds while the call checks, else on the device).
   * @param lo Least value allowed.
   * @param hi Greatest value allowed.
   * @param error The error of an element outside.
   * @throws {RangeError} At once, when the check ran at once and failed (settle it: an earlier
   *   pending check may have failed first).
   */
  check(array: CheckedArray, lo: number, hi: number, error: ValueError): void {
    if (array.byteLength >= this.#deferBytes) {
      if (this.#verdict !== null) throw new Error("internal: a value check after the verdict");
      this.#pending.push({ array, lo, hi, error });
      return;
    }
    const host = array instanceof DeviceSnapshot ? array.host : array;
    const i = firstOutside(host, lo, hi);
    if (i >= 0) throw error(host[i], i);
  }

  /**
   * The verdict of the pending checks: resolves when every one passed, else rejects with the first
   * failure in order. Those an arm reported passed are done; the others are checked now, on the
   * calling thread (a snapshot's after reading it back: keep the snapshots until the verdict is
   * in). Ask for it once the call has run (a report after it changes nothing); later calls return
   * the same promise.
   *
   * @returns The verdict.
   */
  verdict(): Promise<void> {
    this.#decide();
    return this.#verdict!;
  }

  /**
   * Decides the pending checks now, as {@linkcode ValueChecks.verdict} does, for an arm about to
   * compute on the host copies themselves (the cpu arm): nothing is computed on a bad value.
   *
   * @throws {RangeError} The first failing check's error.
   */
  decideNow(): void {
    if (this.#verdict === null && this.#pending.some((p) => p.array instanceof DeviceSnapshot)) {
      throw new Error("internal: a host arm was handed a call whose arrays are device snapshots");
    }
    const failure = this.#decide();
    if (failure !== null) throw failure;
  }

  /**
   * Decides once, kept as the verdict: the first failure (null if none, if decided before, or if a
   * snapshot must be read back first: then the verdict alone tells).
   */
  #decide(): Error | null {
    if (this.#verdict !== null) return null;
    const reads = this.#pending.some((p) =>
      p.outcome !== true && p.array instanceof DeviceSnapshot
    );
    if (reads) {
      this.#verdict = this.#firstFailureRead().then((failure) => {
        if (failure !== null) throw failure;
      });
      this.#verdict.catch(() => {});
      return null;
    }
    const failure = this.#firstFailure();
    this.#verdict = failure === null ? Promise.resolve() : Promise.reject(failure);
    this.#verdict.catch(() => {});
    return failure;
  }

  /** #firstFailure for checks of snapshots: each undecided one read back as its turn comes. */
  async #firstFailureRead(): Promise<Error | null> {
    for (const [index, p] of this.#pending.entries()) {
      if (p.outcome === true) continue;
      const array = p.array instanceof DeviceSnapshot ? await p.array.read() : p.array;
      const failure = failureOf(index, p, array);
      if (failure !== null) return failure;
    }
    return null;
  }

  /** The first failing pending check's error, or null (no snapshot among those undecided). */
  #firstFailure(): Error | null {
    for (const [index, p] of this.#pending.entries()) {
      if (p.outcome === true) continue;
      const failure = failureOf(index, p, p.array as Float);
      if (failure !== null) return failure;
    }
    return null;
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
