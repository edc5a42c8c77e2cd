// Half-precision inputs at the public boundary (docs/kda.md 3): where the runtime has
// Float16Array, the op accepts it, widens every array to Float32Array once, computes in f32 like
// any f32 call, and rounds its results back to Float16Array once.

import { typeName } from "../../base/check.ts";

/** Whether this runtime has Float16Array (Deno 2.9 does). */
export const HALF_AVAILABLE: boolean = typeof Float16Array !== "undefined";

/**
 * Whether `x` is a Float16Array (false where the runtime has none).
 *
 * @param x Any value.
 * @returns True for a Float16Array.
 *
 * @example
 * ```ts
 * import { isHalf } from "./_half.ts";
 * isHalf(new Float32Array(1)); // false
 * ```
 */
export function isHalf(x: unknown): boolean {
  return HALF_AVAILABLE && x instanceof Float16Array;
}

/**
 * A copy of `obj` whose listed array fields, each a Float16Array, are widened to Float32Array
 * (exactly: every f16 value is an f32 value). Absent fields stay absent; a present field of
 * another type is a TypeError naming it, since all arrays of one call share one type.
 *
 * @param name The argument's name, for messages (`inputs`, `cotangents`, `token`).
 * @param obj The argument, already known to be an object.
 * @param fields The array fields to widen.
 * @returns The widened copy.
 *
 * @example
 * ```ts
 * import { widenHalf } from "./_half.ts";
 * const x = widenHalf("inputs", { q: new Float16Array([0.5]), B: 1 }, ["q", "k"]);
 * console.log(x.q instanceof Float32Array); // true
 * ```
 */
export function widenHalf<T extends object>(
  name: string,
  obj: T,
  fields: readonly string[],
): T {
  const out = { ...obj } as Record<string, unknown>;
  for (const field of fields) {
    const value = out[field];
    if (value === undefined) continue;
    if (!isHalf(value)) {
      throw new TypeError(
        `${name}.${field} must be a Float16Array like the other arrays: got ${typeName(value)}`,
      );
    }
    out[field] = Float32Array.from(value as ArrayLike<number>);
  }
  return out as T;
}

/**
 * Rounds each Float32Array value of `obj` to a new Float16Array (round to nearest even, once).
 *
 * @param obj Results of an f32 computation.
 * @returns The same keys with Float16Array values.
 *
 * @example
 * ```ts
 * import { narrowHalf } from "./_half.ts";
 * narrowHalf({ o: new Float32Array([1 / 3]) }).o; // Float16Array [0.333251953125]
 * ```
 */
export function narrowHalf<T extends object>(obj: T): T {
  const out = { ...obj } as Record<string, unknown>;
  for (const [key, value] of Object.entries(out)) {
    if (value instanceof Float32Array) out[key] = new Float16Array(value);
  }
  return out as T;
}
