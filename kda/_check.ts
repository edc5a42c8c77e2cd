// Every argument check of the package's public boundary, in one message style:
//   "<argument> must <expectation>: got <actual>"
// The arms behind the seam assert their invariants but do not validate again.

import {
  type ChunkSize,
  type DType,
  type Float,
  type KdaCotangents,
  type KdaProblem,
  MAX_HEAD_DIM,
} from "./_types.ts";

/** A short description of a value's type, for messages. */
export function typeName(x: unknown): string {
  if (x === null) return "null";
  if (Array.isArray(x)) return "Array";
  if (typeof x !== "object") return typeof x;
  return (x as object).constructor?.name ?? "object";
}

/** Throws unless `value` is a positive integer; returns it typed. */
export function checkPositiveInt(name: string, value: unknown): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value <= 0) {
    throw new RangeError(`${name} must be a positive integer: got ${String(value)}`);
  }
  return value;
}

/** Throws unless `value` is 16, 32 or 64; returns it typed. */
export function checkChunkSize(name: string, value: unknown): ChunkSize {
  if (value !== 16 && value !== 32 && value !== 64) {
    throw new RangeError(`${name} must be 16, 32 or 64: got ${String(value)}`);
  }
  return value;
}

/** Throws unless `value` is a boolean or undefined. */
export function checkOptionalBoolean(name: string, value: unknown): boolean | undefined {
  if (value !== undefined && typeof value !== "boolean") {
    throw new TypeError(`${name} must be a boolean: got ${typeName(value)}`);
  }
  return value;
}

/** Throws unless `value` is a plain object (not null, not an array); returns it typed. */
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
 * Throws a TypeError for the first own key of `value` not in `known`, naming the nearest known key:
 * a typo such as `chunksize` must not silently run with a default.
 */
export function checkKnownKeys(name: string, value: object, known: readonly string[]): void {
  for (const key of Object.keys(value)) {
    if (known.includes(key)) continue;
    const nearest = [...known].sort((a, b) => editDistance(key, a) - editDistance(key, b))[0];
    throw new TypeError(
      `${name}.${key} is not a known field: expected one of ${known.join(", ")} ` +
        `(did you mean ${nearest}?)`,
    );
  }
}

/**
 * Checks one array argument: its type, the call's dtype, its length, and that it holds no NaN or
 * infinity (which would poison every later token through the state).
 */
export function checkFloatArray(
  name: string,
  x: unknown,
  length: number,
  dtype: DType,
  shapeText: string,
): asserts x is Float {
  const want = dtype === "f64" ? Float64Array : Float32Array;
  if (!(x instanceof want)) {
    throw new TypeError(`${name} must be a ${want.name} like the other arrays: got ${typeName(x)}`);
  }
  if (x.length !== length) {
    throw new RangeError(`${name} must have ${length} elements ${shapeText}: got ${x.length}`);
  }
  for (let i = 0; i < x.length; i++) {
    if (!Number.isFinite(x[i])) {
      throw new RangeError(`${name} must be finite: got ${x[i]} at index ${i}`);
    }
  }
}

/** The dtype of a typed array, or a TypeError naming the argument. */
export function dtypeOfArray(name: string, x: unknown): DType {
  if (x instanceof Float64Array) return "f64";
  if (x instanceof Float32Array) return "f32";
  throw new TypeError(`${name} must be a Float64Array or Float32Array: got ${typeName(x)}`);
}

const INPUT_KEYS = ["B", "T", "H", "K", "V", "q", "k", "v", "g", "beta", "h0", "scale"] as const;

/**
 * Validates the raw inputs of the op once, at the public boundary.
 *
 * @param inputs What the caller passed.
 * @returns The problem the arms see (scale resolved) and its dtype.
 */
export function checkKdaInputs(inputs: unknown): { problem: KdaProblem; dtype: DType } {
  const x = checkObject("inputs", inputs);
  checkKnownKeys("inputs", x, INPUT_KEYS);
  const B = checkPositiveInt("inputs.B", x.B);
  const T = checkPositiveInt("inputs.T", x.T);
  const H = checkPositiveInt("inputs.H", x.H);
  const K = checkPositiveInt("inputs.K", x.K);
  const V = checkPositiveInt("inputs.V", x.V);
  const dtype = dtypeOfArray("inputs.q", x.q);
  checkFloatArray("inputs.q", x.q, B * T * H * K, dtype, "[B, T, H, K]");
  checkFloatArray("inputs.k", x.k, B * T * H * K, dtype, "[B, T, H, K]");
  checkFloatArray("inputs.v", x.v, B * T * H * V, dtype, "[B, T, H, V]");
  checkFloatArray("inputs.g", x.g, B * T * H * K, dtype, "[B, T, H, K]");
  const g = x.g;
  for (let i = 0; i < g.length; i++) {
    if (g[i] > 0) {
      throw new RangeError(`inputs.g must be <= 0 (a log decay): got ${g[i]} at index ${i}`);
    }
  }
  checkFloatArray("inputs.beta", x.beta, B * T * H, dtype, "[B, T, H]");
  if (x.h0 !== undefined) checkFloatArray("inputs.h0", x.h0, B * H * K * V, dtype, "[B, H, K, V]");
  const scale = x.scale === undefined ? K ** -0.5 : x.scale;
  if (typeof scale !== "number" || !Number.isFinite(scale)) {
    throw new RangeError(`inputs.scale must be a finite number: got ${String(scale)}`);
  }
  const problem: KdaProblem = {
    B,
    T,
    H,
    K,
    V,
    q: x.q,
    k: x.k,
    v: x.v,
    g,
    beta: x.beta,
    scale,
    ...(x.h0 !== undefined ? { h0: x.h0 as Float } : {}),
  };
  return { problem, dtype };
}

/**
 * Validates the cotangents of the op's outputs for a checked problem.
 *
 * @param cotangents What the caller passed.
 * @param problem The checked problem.
 * @param dtype Its dtype.
 * @returns The cotangents, typed.
 */
export function checkKdaCotangents(
  cotangents: unknown,
  problem: KdaProblem,
  dtype: DType,
): KdaCotangents {
  const c = checkObject("cotangents", cotangents);
  checkKnownKeys("cotangents", c, ["dout", "dht"]);
  const { B, T, H, K, V } = problem;
  checkFloatArray("cotangents.dout", c.dout, B * T * H * V, dtype, "[B, T, H, V]");
  if (c.dht !== undefined) {
    checkFloatArray("cotangents.dht", c.dht, B * H * K * V, dtype, "[B, H, K, V]");
  }
  return { dout: c.dout, ...(c.dht !== undefined ? { dht: c.dht as Float } : {}) };
}

/** The validated options of one op call. */
export interface CheckedOptions {
  arm?: string;
  chunkSize: ChunkSize;
  strict?: boolean;
  quiet?: boolean;
}

/**
 * Validates the options of `kda`/`kdaVjp` (the arm name is checked by the seam, against its arms).
 *
 * @param options What the caller passed.
 * @param defaultChunkSize The chunk size when none is given.
 * @returns The options with the chunk size resolved.
 */
export function checkKdaOptions(options: unknown, defaultChunkSize: ChunkSize): CheckedOptions {
  const o = checkObject("options", options);
  checkKnownKeys("options", o, ["arm", "chunkSize", "strict", "quiet"]);
  return {
    arm: o.arm === undefined ? undefined : o.arm as string,
    chunkSize: o.chunkSize === undefined
      ? defaultChunkSize
      : checkChunkSize("options.chunkSize", o.chunkSize),
    strict: checkOptionalBoolean("options.strict", o.strict),
    quiet: checkOptionalBoolean("options.quiet", o.quiet),
  };
}

/** Why the chunked arms cannot take these head dimensions, or null. */
export function headDimProblem(K: number, V: number, arm: string): string | null {
  if (K <= MAX_HEAD_DIM && V <= MAX_HEAD_DIM) return null;
  return `K = ${K} and V = ${V} must be at most ${MAX_HEAD_DIM} on the ${arm} arm`;
}
