// The host arrays of a call's checked copies (_check.ts), kept from one call to the next.
//
// A call copies its typed arrays before anything else, so that the caller may change them while
// the call is pending (docs/kda.md 3.3). A new array of that size is fresh memory, and every page
// of it faults in as the copy writes it: on the H100's host about 0.43 s a GiB on the calling
// thread, against 0.1 s for a copy into memory already touched (bench/results/ANALYSIS.md,
// fourteenth pass). A call that is done with its copies, and knows that nothing else holds them
// (the gpu arm has uploaded them), gives them back here, and the next call of the same sizes copies
// into them: a training step after the first copies its inputs at memory speed. The copies are
// plain ArrayBuffers (a set() into shared memory ran at half the rate on the H100's host, and no
// worker reads them: the gpu arm checks their values on what it uploads, _value_checks.ts); no
// copy is ever handed to the caller.
//
// What is kept is bounded (COPY_POOL_BYTES in all) and let go COPY_POOL_IDLE_MS after the last
// call that took or gave back, by a timer that does not keep the process alive.

import type { Float } from "../_types.ts";

/** Bytes of arrays the pool keeps at most. */
export const COPY_POOL_BYTES = 2 * 2 ** 30;

/** Milliseconds after the last take or give-back at which the pool lets its arrays go. */
export const COPY_POOL_IDLE_MS = 2000;

/** The kept arrays by type and length. */
const kept = new Map<string, Float[]>();
let keptBytes = 0;
/** The arrays copyArray made: only these are taken back. */
const made = new WeakSet<Float>();
let idle: ReturnType<typeof setTimeout> | undefined;

function keyOf(type: typeof Float32Array | typeof Float64Array, length: number): string {
  return `${type.name}:${length}`;
}

/** Lets every kept array go at COPY_POOL_IDLE_MS from now. */
function touch(): void {
  if (idle !== undefined) clearTimeout(idle);
  if (kept.size === 0) {
    idle = undefined;
    return;
  }
  const timer = setTimeout(() => {
    idle = undefined;
    kept.clear();
    keptBytes = 0;
  }, COPY_POOL_IDLE_MS);
  Deno.unrefTimer(timer);
  idle = timer;
}

/**
 * An array for a checked copy: one given back earlier, of this type and length, else a new one.
 * Its contents are whatever they were: the copy writes every element.
 *
 * @param type Float32Array or Float64Array.
 * @param length Its elements.
 * @returns The array.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { copyArray, giveBackCopies } from "./_copies.ts";
 * const a = copyArray(Float32Array, 1024);
 * giveBackCopies([a]);
 * assert.equal(copyArray(Float32Array, 1024), a); // the same memory, for the next call
 * ```
 */
export function copyArray(type: typeof Float32Array | typeof Float64Array, length: number): Float {
  const list = kept.get(keyOf(type, length));
  const reused = list?.pop();
  if (reused === undefined) {
    const array = type === Float64Array ? new Float64Array(length) : new Float32Array(length);
    made.add(array);
    return array;
  }
  if (list!.length === 0) kept.delete(keyOf(type, length));
  keptBytes -= reused.byteLength;
  touch();
  return reused;
}

/**
 * Gives back a call's checked copies that nothing holds any longer, for the next call's copies.
 * Only copyArray's arrays are kept, within the pool's bound.
 *
 * @param arrays The copies (undefined entries are skipped).
 * @example
 * ```ts
 * import { giveBackCopies } from "./_copies.ts";
 * giveBackCopies([new Float32Array(8), undefined]);
 * ```
 */
export function giveBackCopies(arrays: readonly (Float | undefined)[]): void {
  for (const a of arrays) {
    if (a === undefined || !made.has(a)) continue;
    if (keptBytes + a.byteLength > COPY_POOL_BYTES) continue;
    const type = a instanceof Float64Array ? Float64Array : Float32Array;
    const key = keyOf(type, a.length);
    const list = kept.get(key) ?? [];
    if (list.includes(a)) continue;
    list.push(a);
    kept.set(key, list);
    keptBytes += a.byteLength;
  }
  touch();
}
