// Every argument check of the package's public boundary, in one message style:
//   "<argument> must <expectation>: got <actual>"
// The arms behind the seam assert their invariants but do not validate again.

import {
  type ChunkSize,
  type Float,
  type KdaCotangents,
  type KdaProblem,
  MAX_HEAD_DIM,
} from "../_types.ts";
import { type ComputeDType, computeDtypeOf } from "../../base/dtype.ts";
import {
  checkKnownKeys,
  checkObject,
  checkOptionalBoolean,
  checkPositiveInt,
  typeName,
} from "../../base/check.ts";

/** Throws unless `value` is 16, 32 or 64; returns it typed. */
export function checkChunkSize(name: string, value: unknown): ChunkSize {
  if (value !== 16 && value !== 32 && value !== 64) {
    throw new RangeError(`${name} must be 16, 32 or 64: got ${String(value)}`);
  }
  return value;
}

/**
 * Checks one array argument: its type, the call's dtype, its length, and that it holds no NaN or
 * infinity (which would poison every later token through the state).
 */
export function checkFloatArray(
  name: string,
  x: unknown,
  length: number,
  dtype: ComputeDType,
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

const INPUT_KEYS = [
  "B",
  "T",
  "H",
  "K",
  "V",
  "HV",
  "cuSeqlens",
  "q",
  "k",
  "v",
  "g",
  "beta",
  "h0",
  "scale",
] as const;

/**
 * Checks the offsets of a packed batch (docs/kda.md 2.6): an Int32Array of N + 1 ≥ 2 offsets that
 * starts at 0, strictly increases and ends at T, with B = 1.
 *
 * @param value What the caller passed as `inputs.cuSeqlens`.
 * @param B The batch size (must be 1).
 * @param T The packed tokens.
 * @returns The offsets, typed.
 *
 * @example
 * ```ts
 * import { checkCuSeqlens } from "./_check.ts";
 * checkCuSeqlens(new Int32Array([0, 3, 7]), 1, 7); // ok; [0, 3, 3, 7] throws a RangeError
 * ```
 */
export function checkCuSeqlens(value: unknown, B: number, T: number): Int32Array {
  if (!(value instanceof Int32Array)) {
    throw new TypeError(`inputs.cuSeqlens must be an Int32Array: got ${typeName(value)}`);
  }
  if (value.length < 2) {
    throw new RangeError(
      `inputs.cuSeqlens must hold at least 2 offsets (N + 1 for N sequences): got ${value.length}`,
    );
  }
  if (B !== 1) {
    throw new RangeError(
      `inputs.B must be 1 with inputs.cuSeqlens (the sequences are packed along T): got ${B}`,
    );
  }
  if (value[0] !== 0) throw new RangeError(`inputs.cuSeqlens must start at 0: got ${value[0]}`);
  for (let i = 1; i < value.length; i++) {
    if (!(value[i] > value[i - 1])) {
      throw new RangeError(
        `inputs.cuSeqlens must strictly increase: got ${value[i]} after ${
          value[i - 1]
        } at index ${i}`,
      );
    }
  }
  const last = value[value.length - 1];
  if (last !== T) {
    throw new RangeError(`inputs.cuSeqlens must end at inputs.T = ${T}: got ${last}`);
  }
  return value;
}

/**
 * The head counts and widths of a call: H query/key heads, HV value heads (a multiple of H;
 * grouped value heads, docs/kda.md 2.5), K and V.
 */
function checkHeads(
  what: string,
  x: Record<string, unknown>,
): { H: number; K: number; V: number; HV: number } {
  const H = checkPositiveInt(`${what}.H`, x.H);
  const K = checkPositiveInt(`${what}.K`, x.K);
  const V = checkPositiveInt(`${what}.V`, x.V);
  const HV = x.HV === undefined ? H : checkPositiveInt(`${what}.HV`, x.HV);
  if (HV % H !== 0) {
    throw new RangeError(`${what}.HV must be a multiple of ${what}.H = ${H}: got ${HV}`);
  }
  return { H, K, V, HV };
}

/**
 * Validates the raw inputs of the op once, at the public boundary.
 *
 * @param inputs What the caller passed.
 * @returns The problem the arms see (scale resolved) and its dtype.
 */
export function checkKdaInputs(inputs: unknown): { problem: KdaProblem; dtype: ComputeDType } {
  const x = checkObject("inputs", inputs);
  checkKnownKeys("inputs", x, INPUT_KEYS);
  const B = checkPositiveInt("inputs.B", x.B);
  const T = checkPositiveInt("inputs.T", x.T);
  const { H, K, V, HV } = checkHeads("inputs", x);
  const cuSeqlens = x.cuSeqlens === undefined ? undefined : checkCuSeqlens(x.cuSeqlens, B, T);
  const N = cuSeqlens === undefined ? B : cuSeqlens.length - 1;
  const hv = x.HV === undefined ? "H" : "HV", n = cuSeqlens === undefined ? "B" : "N";
  const dtype = computeDtypeOf(x.q, "inputs.q");
  checkFloatArray("inputs.q", x.q, B * T * H * K, dtype, "[B, T, H, K]");
  checkFloatArray("inputs.k", x.k, B * T * H * K, dtype, "[B, T, H, K]");
  checkFloatArray("inputs.v", x.v, B * T * HV * V, dtype, `[B, T, ${hv}, V]`);
  checkFloatArray("inputs.g", x.g, B * T * HV * K, dtype, `[B, T, ${hv}, K]`);
  const g = x.g;
  for (let i = 0; i < g.length; i++) {
    if (g[i] > 0) {
      throw new RangeError(`inputs.g must be <= 0 (a log decay): got ${g[i]} at index ${i}`);
    }
  }
  checkFloatArray("inputs.beta", x.beta, B * T * HV, dtype, `[B, T, ${hv}]`);
  if (x.h0 !== undefined) {
    checkFloatArray("inputs.h0", x.h0, N * HV * K * V, dtype, `[${n}, ${hv}, K, V]`);
  }
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
    ...(HV !== H ? { HV } : {}),
    ...(cuSeqlens !== undefined ? { cuSeqlens } : {}),
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
  dtype: ComputeDType,
): KdaCotangents {
  const c = checkObject("cotangents", cotangents);
  checkKnownKeys("cotangents", c, ["dout", "dht"]);
  const { B, T, K, V } = problem;
  const HV = problem.HV ?? problem.H;
  const N = problem.cuSeqlens === undefined ? B : problem.cuSeqlens.length - 1;
  const hv = problem.HV === undefined ? "H" : "HV", n = problem.cuSeqlens === undefined ? "B" : "N";
  checkFloatArray("cotangents.dout", c.dout, B * T * HV * V, dtype, `[B, T, ${hv}, V]`);
  if (c.dht !== undefined) {
    checkFloatArray("cotangents.dht", c.dht, N * HV * K * V, dtype, `[${n}, ${hv}, K, V]`);
  }
  return { dout: c.dout, ...(c.dht !== undefined ? { dht: c.dht as Float } : {}) };
}

/** The validated options of one op call. */
export interface CheckedOptions {
  arm?: string;
  /** Absent: each chunked arm takes its measured default (DEFAULT_CHUNK_SIZES). */
  chunkSize?: ChunkSize;
  strict?: boolean;
  quiet?: boolean;
}

/**
 * Validates the options of `kda`/`kdaVjp` (the arm name is checked by the seam, against its arms).
 *
 * @param options What the caller passed.
 * @returns The options, checked.
 */
export function checkKdaOptions(options: unknown): CheckedOptions {
  const o = checkObject("options", options);
  checkKnownKeys("options", o, ["arm", "chunkSize", "strict", "quiet"]);
  return {
    arm: o.arm === undefined ? undefined : o.arm as string,
    chunkSize: o.chunkSize === undefined
      ? undefined
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

const TOKEN_KEYS = ["B", "H", "K", "V", "HV", "q", "k", "v", "g", "beta", "scale"] as const;

/**
 * Validates one decode step (docs/kda.md 2.7) once, at the public boundary: one token per
 * sequence, q, k [B, H, K], v [B, HV, V], g [B, HV, K], beta [B, HV], and the state [B, HV, K, V].
 *
 * @param state What the caller passed as the state.
 * @param token What the caller passed as the token.
 * @returns The problem with T = 1 and h0 = state (its HV set when it differs from H), and its
 *   dtype.
 *
 * @example
 * ```ts
 * import { checkKdaStep } from "./_check.ts";
 * const f = (n: number) => new Float64Array(n);
 * const { problem } = checkKdaStep(f(4), {
 *   B: 1, H: 1, K: 2, V: 2, q: f(2), k: f(2), v: f(2), g: f(2), beta: f(1),
 * });
 * console.log(problem.T); // 1
 * ```
 */
export function checkKdaStep(
  state: unknown,
  token: unknown,
): { problem: KdaProblem; dtype: ComputeDType } {
  const x = checkObject("token", token);
  checkKnownKeys("token", x, TOKEN_KEYS);
  const B = checkPositiveInt("token.B", x.B);
  const { H, K, V, HV } = checkHeads("token", x);
  const hv = x.HV === undefined ? "H" : "HV";
  const dtype = computeDtypeOf(x.q, "token.q");
  checkFloatArray("token.q", x.q, B * H * K, dtype, "[B, H, K]");
  checkFloatArray("token.k", x.k, B * H * K, dtype, "[B, H, K]");
  checkFloatArray("token.v", x.v, B * HV * V, dtype, `[B, ${hv}, V]`);
  checkFloatArray("token.g", x.g, B * HV * K, dtype, `[B, ${hv}, K]`);
  const g = x.g;
  for (let i = 0; i < g.length; i++) {
    if (g[i] > 0) {
      throw new RangeError(`token.g must be <= 0 (a log decay): got ${g[i]} at index ${i}`);
    }
  }
  checkFloatArray("token.beta", x.beta, B * HV, dtype, `[B, ${hv}]`);
  checkFloatArray("state", state, B * HV * K * V, dtype, `[B, ${hv}, K, V]`);
  const scale = x.scale === undefined ? K ** -0.5 : x.scale;
  if (typeof scale !== "number" || !Number.isFinite(scale)) {
    throw new RangeError(`token.scale must be a finite number: got ${String(scale)}`);
  }
  const problem: KdaProblem = {
    B,
    T: 1,
    H,
    K,
    V,
    q: x.q,
    k: x.k,
    v: x.v,
    g,
    beta: x.beta,
    h0: state,
    scale,
    ...(HV !== H ? { HV } : {}),
  };
  return { problem, dtype };
}

/**
 * Validates the options of `kdaStep`: those of `kda` without `chunkSize` (a step has one token).
 *
 * @param options What the caller passed.
 * @returns The options.
 *
 * @example
 * ```ts
 * import { checkStepOptions } from "./_check.ts";
 * checkStepOptions({ arm: "cpu" }); // { arm: "cpu", strict: undefined, quiet: undefined }
 * ```
 */
export function checkStepOptions(options: unknown): Omit<CheckedOptions, "chunkSize"> {
  const o = checkObject("options", options);
  checkKnownKeys("options", o, ["arm", "strict", "quiet"]);
  const { chunkSize: _, ...rest } = checkKdaOptions(o);
  return rest;
}
