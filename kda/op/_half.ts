// The 16-bit storage dtypes at the public boundary (docs/kda.md 3): a call whose arrays are all
// Float16Array or all BFloat16Array is widened to Float32Array once (exactly), computes as an f32
// call on any arm, and has its results rounded back to the call's dtype once (to nearest, ties to
// even). One path for both: which dtype an array is, and how it widens and rounds, come from the
// dtype table (base/dtype.ts).

import { typeName } from "../../base/check.ts";
import {
  DTYPES,
  roundFromF32,
  type StorageArray,
  type StorageDType,
  storageDtypeOf,
  widenToF32,
} from "../../base/dtype.ts";

/** Whether this runtime has Float16Array (Deno 2.9 does). */
export const HALF_AVAILABLE: boolean = typeof Float16Array !== "undefined";

/**
 * A copy of `obj` whose listed array fields, each of the storage dtype `dtype`, are widened to
 * Float32Array (exactly). Absent fields stay absent; a present field of another type is a
 * TypeError naming it, since all arrays of one call share one type.
 *
 * @param name The argument's name, for messages (`inputs`, `cotangents`, `token`).
 * @param obj The argument, already known to be an object.
 * @param fields The array fields to widen.
 * @param dtype The call's storage dtype.
 * @returns The widened copy.
 *
 * @example
 * ```ts
 * import { widenHalf } from "./_half.ts";
 * const x = widenHalf("inputs", { q: new Float16Array([0.5]), B: 1 }, ["q", "k"], "f16");
 * console.log(x.q instanceof Float32Array); // true
 * ```
 */
export function widenHalf<T extends object>(
  name: string,
  obj: T,
  fields: readonly string[],
  dtype: StorageDType,
): T {
  const out = { ...obj } as Record<string, unknown>;
  for (const field of fields) {
    const value = out[field];
    if (value === undefined) continue;
    out[field] = widenOne(`${name}.${field}`, value, dtype);
  }
  return out as T;
}

/**
 * One array of the storage dtype `dtype` widened to Float32Array, or a TypeError naming it.
 *
 * @param name The argument's name, for the message.
 * @param value What the caller passed.
 * @param dtype The call's storage dtype.
 * @returns The widened copy.
 *
 * @example
 * ```ts
 * import { widenOne } from "./_half.ts";
 * widenOne("state", new Float16Array([2]), "f16"); // Float32Array [2]
 * ```
 */
export function widenOne(name: string, value: unknown, dtype: StorageDType): Float32Array {
  if (storageDtypeOf(value) !== dtype) {
    throw new TypeError(
      `${name} must be a ${DTYPES[dtype].array?.name} like the other arrays: got ${
        typeName(value)
      }`,
    );
  }
  return widenToF32(value as StorageArray);
}

/**
 * Rounds each Float32Array value of `obj` to a new array of the storage dtype (once).
 *
 * @param obj Results of an f32 computation.
 * @param dtype The call's storage dtype.
 * @returns The same keys with arrays of that dtype.
 *
 * @example
 * ```ts
 * import { narrowHalf } from "./_half.ts";
 * narrowHalf({ o: new Float32Array([1 / 3]) }, "f16").o; // Float16Array [0.333251953125]
 * ```
 */
export function narrowHalf<T extends object>(obj: T, dtype: StorageDType): T {
  const out = { ...obj } as Record<string, unknown>;
  for (const [key, value] of Object.entries(out)) {
    if (value instanceof Float32Array) out[key] = roundFromF32(value, dtype);
  }
  return out as T;
}
