// The one table of element types: f64, f32, f16 and bf16, with their sizes, their typed arrays,
// their WGSL types, their machine epsilons and the agreement bars a computation in each must meet
// against the exact f64 reference. Every "which dtype is this array" question in the package is
// answered by dtypeOf here, and every "how close must it be" question by BARS.
//
// bf16 has no typed array of its own in JavaScript: its values are stored as their 16-bit patterns
// in a BFloat16Array, a Uint16Array subclass, so that an array of bf16 data cannot be mistaken for
// an array of integers (a plain Uint16Array is refused by dtypeOf).

import { typeName } from "./check.ts";

/** The element types the package knows. */
export type DType = "f64" | "f32" | "f16" | "bf16";

/** The element types the arithmetic runs in: the tape's, the arms', the layer's. */
export type ComputeDType = "f64" | "f32";

/** A typed array of a compute dtype. */
export type ComputeArray = Float64Array | Float32Array;

// ---- bf16 storage ----

/**
 * bfloat16 values stored as their 16-bit patterns (sign, 8 exponent bits, 7 mantissa bits): a
 * Uint16Array whose class says what its elements mean. Build one from numbers with
 * {@linkcode BFloat16Array.round} (round to nearest, ties to even), read it with
 * {@linkcode BFloat16Array.toFloat32} (exact: every bf16 value is an f32 value).
 *
 * @example Usage
 * ```ts
 * import { BFloat16Array } from "@deltanet/kda";
 * const x = BFloat16Array.round([1, 1 / 3, -2.5]);
 * x[0]; // 0x3f80, the bits of 1
 * x.toFloat32()[1]; // 0.333984375, the bf16 value nearest 1/3
 * ```
 */
export class BFloat16Array extends Uint16Array {
  /**
   * Rounds each value to the nearest bf16 value, ties to even (once, from its exact double value).
   *
   * @param values The values.
   * @returns A new BFloat16Array.
   */
  static round(values: ArrayLike<number>): BFloat16Array {
    const out = new BFloat16Array(values.length);
    if (values instanceof Float32Array) {
      // An f32 value's bits round to bf16 by adding just under half the dropped units (and the
      // kept lowest bit, for ties to even), then dropping the low 16 bits: exact and fast.
      const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
      for (let i = 0; i < bits.length; i++) {
        const b = bits[i];
        out[i] = (b & 0x7fffffff) > 0x7f800000
          ? (b >>> 16) | 0x40
          : (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
      }
      return out;
    }
    for (let i = 0; i < values.length; i++) out[i] = bf16Bits(values[i]);
    return out;
  }

  /**
   * The values as f32 (exact).
   *
   * @returns A new Float32Array.
   */
  toFloat32(): Float32Array {
    const out = new Float32Array(this.length);
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < this.length; i++) bits[i] = this[i] << 16;
    return out;
  }
}

// ---- the table ----

/** A typed-array constructor of the table. */
export type ArrayConstructorOf =
  | Float64ArrayConstructor
  | Float32ArrayConstructor
  | Float16ArrayConstructor
  | typeof BFloat16Array;

/**
 * How closely a computation in one dtype must agree with the exact f64 reference, as
 * `max|a − b| / max|b|`: the op's outputs and gradients, and the layer's loss and group gradients.
 * `null` where the bar is measured on the spot instead (f16, bf16: see {@linkcode MEASURED_BAR_FACTOR}).
 */
export interface AgreementBars {
  /** The op's outputs `o`, `ht`. */
  outputs: number;
  /** The op's gradients. */
  gradients: number;
  /** The layer's loss, as |ΔL| / Σ|y·r| (the proof's forward agreement). */
  layerForward: number;
  /** The layer's parameter-group gradients. */
  layerGradients: number;
}

/** One row of the dtype table. */
export interface DTypeInfo {
  /** The dtype's name. */
  readonly name: DType;
  /** Bytes per element. */
  readonly bytes: number;
  /** The typed array that stores it (absent where the runtime has none: Float16Array). */
  readonly array: ArrayConstructorOf | undefined;
  /** Its WGSL scalar type, where WGSL has one. */
  readonly wgsl: "f32" | "f16" | null;
  /** Machine epsilon: the gap between 1 and the next value. */
  readonly eps: number;
  /** The precision the package computes in for data of this dtype. */
  readonly compute: ComputeDType;
  /** Agreement bars against the f64 reference, or null where they are measured on the spot. */
  readonly bars: Readonly<AgreementBars> | null;
}

/**
 * The dtype table. The f32 bars are the gpu arm's proven ones; f16 and bf16 compute in f32, and
 * their bars are measured for each case, as {@linkcode MEASURED_BAR_FACTOR} times the error of the
 * f64 reference run on inputs rounded to that dtype with its outputs rounded too.
 *
 * @example Usage
 * ```ts
 * import { DTYPES } from "@deltanet/kda";
 * DTYPES.bf16.bytes; // 2
 * DTYPES.f32.bars?.gradients; // 2e-5
 * ```
 */
export const DTYPES: Readonly<Record<DType, DTypeInfo>> = Object.freeze(
  {
    f64: Object.freeze({
      name: "f64",
      bytes: 8,
      array: Float64Array,
      wgsl: null,
      eps: 2 ** -52,
      compute: "f64",
      bars: Object.freeze({
        outputs: 1e-12,
        gradients: 1e-10,
        layerForward: 1e-12,
        layerGradients: 1e-10,
      }),
    }),
    f32: Object.freeze({
      name: "f32",
      bytes: 4,
      array: Float32Array,
      wgsl: "f32",
      eps: 2 ** -23,
      compute: "f32",
      bars: Object.freeze({
        outputs: 2e-6,
        gradients: 2e-5,
        layerForward: 1e-5,
        layerGradients: 1e-4,
      }),
    }),
    f16: Object.freeze({
      name: "f16",
      bytes: 2,
      array: typeof Float16Array === "undefined" ? undefined : Float16Array,
      wgsl: "f16",
      eps: 2 ** -10,
      compute: "f32",
      bars: null,
    }),
    bf16: Object.freeze({
      name: "bf16",
      bytes: 2,
      array: BFloat16Array,
      wgsl: null,
      eps: 2 ** -7,
      compute: "f32",
      bars: null,
    }),
  } as const,
);

/**
 * A measured bar (f16, bf16) is this many times the error of the f64 reference run on inputs
 * rounded to the dtype with its outputs rounded too: the dtype's own rounding, with room for an
 * f32 computation's error on top.
 */
export const MEASURED_BAR_FACTOR = 4;

/** The dtypes in the order messages list them. */
const ORDER: readonly DType[] = ["f64", "f32", "f16", "bf16"];

/**
 * The dtype of an array, from the table; anything else is a TypeError naming the argument (a
 * plain Uint16Array too: bf16 data is a {@linkcode BFloat16Array}).
 *
 * @param x The array.
 * @param name The argument's name, for the message.
 * @returns Its dtype.
 *
 * @example Usage
 * ```ts
 * import { dtypeOf } from "@deltanet/kda";
 * dtypeOf(new Float32Array(2)); // "f32"
 * ```
 */
export function dtypeOf(x: unknown, name = "data"): DType {
  for (const d of ORDER) {
    const array = DTYPES[d].array;
    if (array !== undefined && x instanceof array) return d;
  }
  const names = ORDER.flatMap((d) => DTYPES[d].array?.name ?? []).join(", ");
  const hint = x instanceof Uint16Array ? " (bf16 data must be a BFloat16Array)" : "";
  throw new TypeError(`${name} must be one of ${names}: got ${typeName(x)}${hint}`);
}

/**
 * Allocates a zero-filled array of a compute dtype.
 *
 * @param dtype "f64" or "f32".
 * @param n The number of elements.
 * @returns A new zero-filled typed array.
 *
 * @example Usage
 * ```ts
 * import { alloc } from "@deltanet/kda/tape";
 * alloc("f32", 3); // Float32Array [0, 0, 0]
 * ```
 */
export function alloc(dtype: ComputeDType, n: number): ComputeArray {
  return dtype === "f64" ? new Float64Array(n) : new Float32Array(n);
}

/**
 * The compute dtype of an array the arithmetic runs on (f64 or f32); anything else is a TypeError.
 *
 * @param x The array.
 * @param name The argument's name, for the message.
 * @returns "f64" or "f32".
 *
 * @example Usage
 * ```ts
 * import { computeDtypeOf } from "./dtype.ts";
 * computeDtypeOf(new Float64Array(1)); // "f64"
 * ```
 */
export function computeDtypeOf(x: unknown, name = "data"): ComputeDType {
  const d = dtypeOf(x, name);
  if (d === "f64" || d === "f32") return d;
  throw new TypeError(`${name} must be a Float64Array or Float32Array: got ${typeName(x)}`);
}

// ---- 16-bit storage: the dtypes stored in 16 bits and computed in f32 ----

/** The dtypes that are stored in 16 bits and computed in f32 (table rows with bytes 2). */
export type StorageDType = "f16" | "bf16";

/** A typed array of a 16-bit storage dtype. */
export type StorageArray = Float16Array | BFloat16Array;

/** How each storage dtype widens to f32 (exactly) and rounds back (to nearest, ties to even). */
const STORAGE_CODECS: Readonly<
  Record<StorageDType, {
    widen(x: StorageArray): Float32Array;
    round(x: Float32Array): StorageArray;
  }>
> = Object.freeze({
  f16: {
    widen: (x: StorageArray) => Float32Array.from(x as Float16Array),
    round: (x: Float32Array) => new Float16Array(x),
  },
  bf16: {
    widen: (x: StorageArray) => (x as BFloat16Array).toFloat32(),
    round: (x: Float32Array) => BFloat16Array.round(x),
  },
});

/**
 * The storage dtype of an array (f16 or bf16, from the table), or null for any other value.
 *
 * @param x Any value.
 * @returns "f16", "bf16" or null.
 *
 * @example Usage
 * ```ts
 * import { BFloat16Array, storageDtypeOf } from "./dtype.ts";
 * storageDtypeOf(new BFloat16Array(2)); // "bf16"
 * storageDtypeOf(new Float32Array(2)); // null
 * ```
 */
export function storageDtypeOf(x: unknown): StorageDType | null {
  for (const d of ["f16", "bf16"] as const) {
    const array = DTYPES[d].array;
    if (array !== undefined && x instanceof array) return d;
  }
  return null;
}

/**
 * Widens an array of a storage dtype to f32, exactly (every f16 and bf16 value is an f32 value).
 *
 * @param x The array.
 * @returns A new Float32Array.
 *
 * @example Usage
 * ```ts
 * import { BFloat16Array, widenToF32 } from "./dtype.ts";
 * widenToF32(BFloat16Array.round([1.5])); // Float32Array [1.5]
 * ```
 */
export function widenToF32(x: StorageArray): Float32Array {
  const d = storageDtypeOf(x);
  if (d === null) {
    throw new TypeError(`x must be a Float16Array or BFloat16Array: got ${typeName(x)}`);
  }
  return STORAGE_CODECS[d].widen(x);
}

/**
 * Rounds f32 values to a storage dtype, to nearest with ties to even, once.
 *
 * @param x The f32 values.
 * @param dtype "f16" or "bf16".
 * @returns A new array of that dtype.
 *
 * @example Usage
 * ```ts
 * import { roundFromF32 } from "./dtype.ts";
 * roundFromF32(new Float32Array([1 / 3]), "bf16")[0]; // 0x3eab, the bits of 0.333984375
 * ```
 */
export function roundFromF32(x: Float32Array, dtype: StorageDType): StorageArray {
  return STORAGE_CODECS[dtype].round(x);
}

// ---- half precision: exact decoding, and round-to-nearest-even encoding of a double ----

interface MiniFloat {
  mBits: number;
  bias: number;
  maxExpField: number;
}

const F16: MiniFloat = { mBits: 10, bias: 15, maxExpField: 31 };
const BF16: MiniFloat = { mBits: 7, bias: 127, maxExpField: 255 };

function decodeMini(bits: number, f: MiniFloat): number {
  const sign = bits >> (f.mBits + Math.log2(f.maxExpField + 1)) ? -1 : 1;
  const e = (bits >> f.mBits) & f.maxExpField;
  const m = bits & ((1 << f.mBits) - 1);
  if (e === 0) return sign * m * 2 ** (1 - f.bias - f.mBits);
  if (e === f.maxExpField) return m === 0 ? sign * Infinity : NaN;
  return sign * (1 + m / 2 ** f.mBits) * 2 ** (e - f.bias);
}

function roundHalfEven(y: number): number {
  const lo = Math.floor(y), d = y - lo;
  if (d > 0.5) return lo + 1;
  if (d < 0.5) return lo;
  return lo % 2 === 0 ? lo : lo + 1;
}

function encodeMini(x: number, f: MiniFloat): number {
  const signShift = f.mBits + Math.log2(f.maxExpField + 1);
  if (Number.isNaN(x)) return (f.maxExpField << f.mBits) | (1 << (f.mBits - 1));
  const sign = x < 0 || Object.is(x, -0) ? 1 << signShift : 0;
  const a = Math.abs(x);
  const minNormal = 2 ** (1 - f.bias);
  if (a < minNormal) {
    // subnormal (a rounded-up result of 2^mBits units is the smallest normal, encoded alike)
    return sign | roundHalfEven(a / 2 ** (1 - f.bias - f.mBits));
  }
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  else if (2 ** (e + 1) <= a) e++;
  let mant = roundHalfEven((a / 2 ** e - 1) * 2 ** f.mBits);
  if (mant === 2 ** f.mBits) mant = 0, e++;
  if (e + f.bias >= f.maxExpField) return sign | (f.maxExpField << f.mBits); // overflow: infinity
  return sign | ((e + f.bias) << f.mBits) | mant;
}

/**
 * Rounds a number to the nearest IEEE binary16 value, ties to even, and returns its bits.
 *
 * @param x The value (its exact double value is rounded, once).
 * @returns The 16-bit pattern.
 *
 * @example Usage
 * ```ts
 * import { f16Bits } from "@deltanet/kda/io";
 * f16Bits(1); // 0x3c00
 * ```
 */
export function f16Bits(x: number): number {
  return encodeMini(x, F16);
}

/**
 * Rounds a number to the nearest bfloat16 value, ties to even, and returns its bits.
 *
 * @param x The value (its exact double value is rounded, once).
 * @returns The 16-bit pattern.
 *
 * @example Usage
 * ```ts
 * import { bf16Bits } from "@deltanet/kda/io";
 * bf16Bits(1); // 0x3f80
 * ```
 */
export function bf16Bits(x: number): number {
  return encodeMini(x, BF16);
}

/**
 * The value of an IEEE binary16 bit pattern (exact: every f16 value is an f32 value).
 *
 * @param bits The 16-bit pattern.
 * @returns Its value.
 *
 * @example Usage
 * ```ts
 * import { f16Value } from "@deltanet/kda/io";
 * f16Value(0x3c00); // 1
 * ```
 */
export function f16Value(bits: number): number {
  return decodeMini(bits & 0xffff, F16);
}

/**
 * The value of a bfloat16 bit pattern (exact: every bf16 value is an f32 value).
 *
 * @param bits The 16-bit pattern.
 * @returns Its value.
 *
 * @example Usage
 * ```ts
 * import { bf16Value } from "@deltanet/kda/io";
 * bf16Value(0x3f80); // 1
 * ```
 */
export function bf16Value(bits: number): number {
  return decodeMini(bits & 0xffff, BF16);
}

/**
 * Throws unless a call's typed arrays are all of one type, naming the odd one: the type most of
 * them share is the call's (the first's on a tie), so that a wrong first array (q) is not blamed
 * on the next. Values that are not arrays of the dtype table's types are left to the checks of
 * each argument.
 *
 * @param what The arguments object's name, for messages.
 * @param x The arguments object.
 * @param keys Its array fields, in the order an odd one is looked for.
 * @param extra Another argument of the call that must share the type (kdaStep's state).
 *
 * @example Usage
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkArrayTypesAgree } from "./dtype.ts";
 * const f = (n: number) => new Float64Array(n);
 * assert.throws(
 *   () => checkArrayTypesAgree("inputs", { q: new Float32Array(2), k: f(2), v: f(2) }, ["q", "k", "v"]),
 *   /^TypeError: inputs\.q must be a Float64Array like the other arrays: got Float32Array$/,
 * );
 * ```
 */
export function checkArrayTypesAgree(
  what: string,
  x: Record<string, unknown>,
  keys: readonly string[],
  extra?: { name: string; value: unknown },
): void {
  // arrays of the dtype table's types only: any other is refused by its own check, with the types
  const floatArray = (v: unknown): v is ArrayBufferView =>
    Object.values(DTYPES).some((t) => t.array !== undefined && v instanceof t.array);
  const arrays: [string, ArrayBufferView][] = [];
  for (const k of keys) {
    const v = x[k];
    if (floatArray(v)) arrays.push([`${what}.${k}`, v]);
  }
  if (extra !== undefined && floatArray(extra.value)) arrays.push([extra.name, extra.value]);
  const counts = new Map<string, number>();
  for (const [, v] of arrays) counts.set(typeName(v), (counts.get(typeName(v)) ?? 0) + 1);
  if (counts.size <= 1) return;
  let want = typeName(arrays[0][1]);
  for (const [type, n] of counts) if (n > counts.get(want)!) want = type;
  const [name, odd] = arrays.find(([, v]) => typeName(v) !== want)!;
  throw new TypeError(`${name} must be a ${want} like the other arrays: got ${typeName(odd)}`);
}
