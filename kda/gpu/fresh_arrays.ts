// Float32Arrays for a readback, made ready by worker threads while the calling thread uploads and
// waits for the GPU.
//
// Why: the arrays a typed-array call returns are new, and the first write to each of their pages
// faults it in (the kernel hands out a zeroed page). On the H100's host that costs about 0.38 s per
// GiB, on the calling thread, in the middle of the readback: copying 1 GiB of results into new
// arrays took 0.67 s, into arrays already touched 0.29 s (bench/results/ANALYSIS.md, fourteenth
// pass). A worker that allocates an ArrayBuffer and touches one word of each page pays the faults on
// its own thread; the buffer then moves to the calling thread by transfer, which hands over the
// memory itself, not a copy. Two workers fault 1 GiB in about 0.25-0.3 s, less than a typed-array
// kdaVjp spends on its uploads at that size.
//
// Below FRESH_WORKER_BYTES in all, no worker starts (starting one costs about 10-15 ms of the
// calling thread): the arrays are made when they are taken, and fault in as the readback writes
// them, as before. Every worker is terminated once it has answered, or when the arrays are given
// up (`cancel`), so none outlives the call: a live worker would keep the process from exiting.

import { askWorker } from "../../base/_workers.ts";

/** Bytes of arrays from which workers make them (below: the calling thread, when taken). */
export const FRESH_WORKER_BYTES = 64 * 2 ** 20;

/** Workers that share one request's arrays (each makes whole arrays). */
export const FRESH_WORKERS = 2;

/** Bytes of a page, the step at which a worker touches an array. */
const PAGE_BYTES = 4096;

// The worker: allocates each buffer asked, writes one zero in each page, and sends the buffers
// back, transferred. Plain JavaScript, so that it needs no module graph (a blob URL of its own).
const WORKER_SOURCE = `self.onmessage = (event) => {
  const buffers = event.data.map((bytes) => {
    const buffer = new ArrayBuffer(bytes);
    const words = new Int32Array(buffer);
    for (let i = 0; i < words.length; i += ${PAGE_BYTES / 4}) words[i] = 0;
    return buffer;
  });
  self.postMessage(buffers, buffers);
};`;

function refusal(state: "taken" | "cancelled"): Error {
  return new Error(
    `freshArrays: the arrays were ${state === "taken" ? "already taken" : "given up"}`,
  );
}

/** Arrays being made ready for a readback. */
export interface FreshArrays {
  /** Lengths asked, in order. */
  readonly lengths: readonly number[];
  /** Whether workers make them (false: they are made on the calling thread when taken). */
  readonly inWorkers: boolean;
  /**
   * The arrays, once ready: zeros, of the lengths asked, in order, each owning its buffer. Take
   * them once.
   */
  take(): Promise<Float32Array[]>;
  /**
   * Gives them up unless they were taken: stops the workers still at work (take() then rejects).
   * Safe to repeat, and after take() (then it does nothing).
   */
  cancel(): void;
}

/**
 * Starts making Float32Arrays of the given lengths ready for a readback: in worker threads when
 * they come to FRESH_WORKER_BYTES or more in all (their pages faulted in there), else on the
 * calling thread when taken. Take them, or cancel, exactly once.
 *
 * @param lengths The arrays' lengths, in elements.
 * @returns The arrays being made.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { freshArrays } from "./fresh_arrays.ts";
 * const fresh = freshArrays([3, 5]);
 * const [a, b] = await fresh.take();
 * assert.deepEqual([a.length, b.length], [3, 5]);
 * ```
 */
export function freshArrays(lengths: readonly number[]): FreshArrays {
  for (const [i, n] of lengths.entries()) {
    if (!Number.isSafeInteger(n) || n < 0) {
      throw new RangeError(`lengths[${i}] must be a non-negative integer: got ${n}`);
    }
  }
  const own = [...lengths];
  const total = own.reduce((a, n) => a + n * Float32Array.BYTES_PER_ELEMENT, 0);
  if (total < FRESH_WORKER_BYTES) {
    return request(
      own,
      false,
      () => Promise.resolve(own.map((n) => new Float32Array(n))),
      () => {},
    );
  }
  // the largest arrays first, each to the worker with the fewest bytes so far
  const order = own.map((_, i) => i).sort((a, b) => own[b] - own[a]);
  const shares: number[][] = Array.from({ length: Math.min(FRESH_WORKERS, own.length) }, () => []);
  const load = shares.map(() => 0);
  for (const i of order) {
    const w = load.indexOf(Math.min(...load));
    shares[w].push(i);
    load[w] += own[i];
  }
  const asked = shares.map((share) =>
    askWorker<ArrayBuffer[]>(
      WORKER_SOURCE,
      share.map((i) => own[i] * Float32Array.BYTES_PER_ELEMENT),
      "freshArrays",
    )
  );
  const stop = () => {
    for (const { stop } of asked) stop();
  };
  const parts = asked.map((a) => a.answer);
  const ready = Promise.all(parts).then((made) => {
    const out: Float32Array[] = new Array(own.length);
    shares.forEach((share, w) => share.forEach((i, j) => (out[i] = new Float32Array(made[w][j]))));
    return out;
  }).finally(stop);
  // a request given up (cancel) or failed before anyone takes it must not end as an unhandled
  // rejection; take() reports it
  ready.catch(() => {});
  return request(own, true, () => ready, stop);
}

/** A request's one take or cancel: `made` gives the arrays once taken, `stop` gives them up. */
function request(
  lengths: readonly number[],
  inWorkers: boolean,
  made: () => Promise<Float32Array[]>,
  stop: () => void,
): FreshArrays {
  let state: "waiting" | "taken" | "cancelled" = "waiting";
  return {
    lengths,
    inWorkers,
    take() {
      if (state !== "waiting") return Promise.reject(refusal(state));
      state = "taken";
      return made();
    },
    cancel() {
      if (state !== "waiting") return;
      state = "cancelled";
      stop();
    },
  };
}
