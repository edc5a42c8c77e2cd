// The argument checks every layer of the package shares, in one message style:
//   "<argument> must <expectation>: got <actual>"
// (RangeError for a wrong value, TypeError for a wrong type). They know nothing of KDA; the op's
// own checks (kda/op/_check.ts) and the file readers build on them.

/**
 * A short description of a value's type, for messages.
 *
 * @param x Any value.
 * @returns "null", "Array", the `typeof` of a primitive, or an object's constructor name.
 *
 * @example Usage
 * ```ts
 * import { typeName } from "./check.ts";
 * typeName(new Float32Array(1)); // "Float32Array"
 * ```
 */
export function typeName(x: unknown): string {
  if (x === null) return "null";
  if (Array.isArray(x)) return "Array";
  if (typeof x !== "object") return typeof x;
  return (x as object).constructor?.name ?? "object";
}

/**
 * A value as a message shows it after "got" where a number belongs: a string in quotes, so that
 * "16" is not read as 16; anything else as `String` gives it.
 *
 * @param value What the caller passed.
 * @returns Its text for the message.
 *
 * @example Usage
 * ```ts
 * import assert from "node:assert/strict";
 * import { shown } from "./check.ts";
 * assert.equal(shown("16"), '"16"');
 * assert.equal(shown(16), "16");
 * ```
 */
export function shown(value: unknown): string {
  return typeof value === "string" ? JSON.stringify(value) : String(value);
}

/**
 * Throws unless `value` is a positive integer.
 *
 * @param name The argument's name, for the message.
 * @param value What the caller passed.
 * @returns The value, typed.
 *
 * @example Usage
 * ```ts
 * import { checkPositiveInt } from "./check.ts";
 * checkPositiveInt("inputs.B", 2); // 2; 0 or 1.5 throws a RangeError
 * ```
 */
export function checkPositiveInt(name: string, value: unknown): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value <= 0) {
    throw new RangeError(`${name} must be a positive integer: got ${shown(value)}`);
  }
  return value;
}

/**
 * Throws unless `value` is a boolean or undefined.
 *
 * @param name The argument's name, for the message.
 * @param value What the caller passed.
 * @returns The value, typed.
 *
 * @example Usage
 * ```ts
 * import { checkOptionalBoolean } from "./check.ts";
 * checkOptionalBoolean("options.quiet", undefined); // undefined; "yes" throws a TypeError
 * ```
 */
export function checkOptionalBoolean(name: string, value: unknown): boolean | undefined {
  if (value !== undefined && typeof value !== "boolean") {
    throw new TypeError(`${name} must be a boolean: got ${typeName(value)}`);
  }
  return value;
}

/**
 * Throws unless `value` is a plain object (not null, not an array).
 *
 * @param name The argument's name, for the message.
 * @param value What the caller passed.
 * @returns The value, typed.
 *
 * @example Usage
 * ```ts
 * import { checkObject } from "./check.ts";
 * checkObject("options", {}); // {}; null or [] throws a TypeError
 * ```
 */
export function checkObject(name: string, value: unknown): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError(`${name} must be an object: got ${typeName(value)}`);
  }
  return value as Record<string, unknown>;
}

function editDistance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let diagonal = row[0];
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const above = row[j];
      const same = a[i - 1].toLowerCase() === b[j - 1].toLowerCase();
      row[j] = Math.min(row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1));
      diagonal = above;
    }
  }
  return row[b.length];
}

/**
 * The known key nearest to `key` by edit distance, or where a field of another argument goes when
 * that field is nearer still and close to `key` (at most two edits, fewer than half its length):
 * a one-letter field such as `T` is near every short key, and must not draw it to another argument.
 */
function nearest(
  key: string,
  known: readonly string[],
  elsewhere: Readonly<Record<string, string>>,
): string {
  const close = Object.entries(elsewhere).filter(([field]) => {
    const d = editDistance(key, field);
    return d <= 2 && d < field.length / 2;
  });
  // known keys first, so that a tie names one of this argument's own
  const candidates = [...known.map((k) => [k, k]), ...close];
  return candidates.sort((a, b) => editDistance(key, a[0]) - editDistance(key, b[0]))[0]?.[1] ??
    "no field";
}

/**
 * Throws a TypeError for the first own key of `value` not in `known`: a typo such as `chunksize`
 * must not silently run with a default. The message names the field the caller most likely
 * meant: the entry of `aliases` for a name another library uses for the same thing (for example
 * `initial_state` for `h0`); else, for a field of another argument (the key, or what `aliases`
 * maps it to), where `elsewhere` says it goes; else the nearest known key by edit distance (or
 * where a nearer field of another argument goes).
 *
 * @param name The argument's name, for the message.
 * @param value The object to check.
 * @param known The fields it may have.
 * @param aliases Foreign names mapped to the known field that means the same thing.
 * @param elsewhere Fields of other arguments mapped to where they go (for example `inputs.scale`).
 *
 * @example Usage
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkKnownKeys } from "./check.ts";
 * checkKnownKeys("options", { arm: "cpu" }, ["arm", "chunkSize"]); // passes
 * assert.throws(
 *   () => checkKnownKeys("options", { scale: 1 }, ["arm"], {}, { scale: "inputs.scale" }),
 *   /^TypeError: options\.scale is not a known field: expected one of arm \(it belongs in inputs\.scale\)$/,
 * );
 * ```
 */
export function checkKnownKeys(
  name: string,
  value: object,
  known: readonly string[],
  aliases: Readonly<Record<string, string>> = {},
  elsewhere: Readonly<Record<string, string>> = {},
): void {
  for (const key of Object.keys(value)) {
    if (known.includes(key)) continue;
    const alias = Object.hasOwn(aliases, key) ? aliases[key] : undefined;
    const field = alias ?? key;
    const hint = alias !== undefined && known.includes(alias)
      ? `${name}.${alias} is this package's name for it`
      : Object.hasOwn(elsewhere, field)
      ? alias !== undefined
        ? `${elsewhere[field]} is this package's name for it`
        : `it belongs in ${elsewhere[field]}`
      : `did you mean ${nearest(key, known, elsewhere)}?`;
    throw new TypeError(
      `${name}.${key} is not a known field: expected one of ${known.join(", ")} (${hint})`,
    );
  }
}
