// The first element outside [lo, hi] of each of several arrays in shared memory, found by worker
// threads, each scanning one contiguous part of every array.
//
// Why: a call from typed arrays checks every element of its copies (finite, and the ranges the op
// asks of g, beta and aLog). On the H100's host a JavaScript loop does that at about 0.6-0.75 s a
// GiB, most of a typed-array kdaVjp at (8, 4096, 16, 128) (bench/results/ANALYSIS.md, fourteenth
// pass). The copies live in SharedArrayBuffers (_copies.ts), so workers can read them while the
// calling thread uploads them. Every worker is terminated once it has answered.

import type { Float } from "../_types.ts";
import { askWorker } from "../../base/_workers.ts";

/** Workers that share one scan. */
export const SCAN_WORKERS = 4;

/** One array to scan, and the interval its elements must lie in (NaN lies in none). */
export interface RangeScan {
  /** The array, a view of a SharedArrayBuffer. */
  array: Float;
  /** Least value allowed. */
  lo: number;
  /** Greatest value allowed. */
  hi: number;
}

// The worker: for each part [start, end) of an array, the first index whose element is not in
// [lo, hi], or -1. Plain JavaScript, so that it needs no module graph (a blob URL of its own).
const WORKER_SOURCE = `self.onmessage = (event) => {
  self.postMessage(event.data.map(({ buffer, offset, length, f64, start, end, lo, hi }) => {
    const a = f64 ? new Float64Array(buffer, offset, length) : new Float32Array(buffer, offset, length);
    for (let i = start; i < end; i++) {
      const v = a[i];
      if (!(v >= lo && v <= hi)) return i;
    }
    return -1;
  }));
};`;

/**
 * The first index of each array whose element lies outside its interval (-1 where none does),
 * found by SCAN_WORKERS workers, each taking one contiguous part of every array.
 *
 * @param scans The arrays (views of SharedArrayBuffers) and their intervals.
 * @returns The first index outside, per scan, in order.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { scanRanges } from "./_range_scan.ts";
 * const a = new Float32Array(new SharedArrayBuffer(4 * 5));
 * a.set([0, 1, 2, Number.NaN, 9]);
 * assert.deepEqual(await scanRanges([{ array: a, lo: 0, hi: 8 }, { array: a, lo: -1, hi: 1 }]), [3, 2]);
 * ```
 */
export async function scanRanges(scans: readonly RangeScan[]): Promise<number[]> {
  for (const [i, { array }] of scans.entries()) {
    if (!(array.buffer instanceof SharedArrayBuffer)) {
      throw new TypeError(
        `scans[${i}].array must be a view of a SharedArrayBuffer: got an ArrayBuffer`,
      );
    }
  }
  if (scans.length === 0) return [];
  const jobs = (w: number) =>
    scans.map(({ array, lo, hi }) => {
      const per = Math.ceil(array.length / SCAN_WORKERS);
      return {
        buffer: array.buffer,
        offset: array.byteOffset,
        length: array.length,
        f64: array instanceof Float64Array,
        start: Math.min(array.length, w * per),
        end: Math.min(array.length, (w + 1) * per),
        lo,
        hi,
      };
    });
  const asked = Array.from(
    { length: SCAN_WORKERS },
    (_, w) => askWorker<number[]>(WORKER_SOURCE, jobs(w), "scanRanges"),
  );
  try {
    const parts = await Promise.all(asked.map((a) => a.answer));
    // the parts lie in index order: the first part that found one has the first index
    return scans.map((_, s) => parts.map((p) => p[s]).find((i) => i >= 0) ?? -1);
  } finally {
    for (const { stop } of asked) stop();
  }
}
