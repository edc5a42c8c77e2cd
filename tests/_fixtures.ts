// Shared by the test files: seeded inputs, the one agreement check (on checks/compare.ts's metric)
// and the layer's group lists. Nothing here is a reference implementation: tests/_bptt.ts is.

import type { Float, KdaCotangents, KdaDims, KdaProblem } from "../kda/_types.ts";
import type { KdaInputs } from "../kda/op/op.ts";
import { mulberry32, normal } from "../kda/layer/_random.ts";
import { agreement } from "../checks/compare.ts";
import { PARAMETER_TABLE, parameterNames } from "../kda/module.ts";
import type { ComputeDType } from "../base/dtype.ts";

export { mulberry32, normal } from "../kda/layer/_random.ts";
export { agreement, sameBits as bitsEqual } from "../checks/compare.ts";

/** Groups before the KDA op, and after it (their gradients do not pass through the op). */
export const GROUPS_AFTER_OP: readonly string[] = PARAMETER_TABLE.filter((p) => p.afterOp).map((
  p,
) => p.name);

/** The layer's group names, without and with the short conv. */
export const GROUPS: readonly string[] = parameterNames(false);
/** The 14 groups of the short-conv layer. */
export const CONV_LAYER_GROUPS: readonly string[] = parameterNames(true);

/** Shape of a raw KDA problem. */
export type KdaShape = KdaDims;

/**
 * Random raw KDA inputs: q, v ~ N(0, 1); k ~ N(0, 1) L2-normalised per (token, head) so the
 * delta rule stays a contraction; g uniform in [gateMin, gateMax] (≤ 0); beta uniform in
 * (0.02, 0.98); h0 ~ N(0, 0.25) when `withH0`; scale = K^(-1/2). The f32 variant rounds the same
 * f64 draw once, so an f64 reference can run on the very same values (toF64).
 */
export function randomKda(
  shape: KdaShape,
  seed: number,
  options: { gateMin?: number; gateMax?: number; withH0?: boolean; dtype?: ComputeDType } = {},
): KdaProblem {
  const { B, T, H, K, V } = shape;
  const gateMin = options.gateMin ?? -1, gateMax = options.gateMax ?? 0;
  if (!(gateMin <= gateMax && gateMax <= 0)) {
    throw new RangeError(
      `gate range must satisfy gateMin <= gateMax <= 0: got [${gateMin}, ${gateMax}]`,
    );
  }
  const rand = mulberry32(seed);
  const gauss = normal(rand);
  const make = (n: number, draw: () => number) => {
    const a = new Float64Array(n);
    for (let i = 0; i < n; i++) a[i] = draw();
    return a;
  };
  const q = make(B * T * H * K, gauss);
  const k = make(B * T * H * K, gauss);
  for (let row = 0; row < B * T * H; row++) {
    let ss = 0;
    for (let d = 0; d < K; d++) ss += k[row * K + d] ** 2;
    const inv = 1 / Math.sqrt(ss + 1e-12);
    for (let d = 0; d < K; d++) k[row * K + d] *= inv;
  }
  const v = make(B * T * H * V, gauss);
  const g = make(B * T * H * K, () => gateMin + (gateMax - gateMin) * rand());
  const beta = make(B * T * H, () => 0.02 + 0.96 * rand());
  const h0 = options.withH0 ? make(B * H * K * V, () => 0.5 * gauss()) : undefined;
  const cast = (a: Float64Array): Float => options.dtype === "f32" ? Float32Array.from(a) : a;
  const x: KdaProblem = {
    B,
    T,
    H,
    K,
    V,
    q: cast(q),
    k: cast(k),
    v: cast(v),
    g: cast(g),
    beta: cast(beta),
    scale: 1 / Math.sqrt(K),
  };
  if (h0 !== undefined) x.h0 = cast(h0);
  return x;
}

/** The same inputs with every array widened to Float64Array (values unchanged). */
export function toF64(x: KdaProblem): KdaProblem {
  const y: KdaProblem = {
    ...x,
    q: Float64Array.from(x.q),
    k: Float64Array.from(x.k),
    v: Float64Array.from(x.v),
    g: Float64Array.from(x.g),
    beta: Float64Array.from(x.beta),
  };
  if (x.h0 !== undefined) y.h0 = Float64Array.from(x.h0);
  return y;
}

/** The same inputs with every Float64Array narrowed to a Float32Array (the other fields as they are). */
export function toF32(x: KdaInputs): KdaInputs<Float32Array> {
  const out: Record<string, unknown> = { ...x };
  for (const [k, v] of Object.entries(x)) {
    if (v instanceof Float64Array) out[k] = Float32Array.from(v);
  }
  return out as unknown as KdaInputs<Float32Array>;
}

/** Checks agreements against a tolerance and keeps the worst one for a one-line summary. */
export class Worst {
  ratio = 0;
  label = "none";
  detail = "";
  count = 0;

  /** Throws unless `max|a − b| / max|b| <= tol` (NaN fails). */
  check(label: string, a: ArrayLike<number>, b: ArrayLike<number>, tol: number): void {
    const { rel, absDiff, refMax } = agreement(a, b);
    const detail = `ratio=${rel.toExponential(2)} max|a−b|=${absDiff.toExponential(2)} ` +
      `max|b|=${refMax.toExponential(2)}`;
    this.count++;
    if (!(rel <= tol)) throw new Error(`${label}: ${detail} exceeds tolerance ${tol}`);
    if (rel >= this.ratio) {
      this.ratio = rel;
      this.label = label;
      this.detail = detail;
    }
  }

  /** Prints the worst case. */
  report(what: string): void {
    console.log(`  ${what}: ${this.count} comparisons, worst ${this.label}: ${this.detail}`);
  }
}

/**
 * The first index where two arrays' bits differ (a length past the shorter one's end counts), or
 * -1 where they are the same bits.
 */
export function firstBitDifference(a: Float, b: Float): number {
  const u = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const w = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let j = 0; j < Math.max(u.length, w.length); j++) if (u[j] !== w[j]) return j;
  return -1;
}

/** Uniform values in [−1, 1) from a seed. */
export function randomArray(n: number, seed: number): Float64Array {
  const rand = mulberry32(seed);
  const a = new Float64Array(n);
  for (let i = 0; i < n; i++) a[i] = 2 * rand() - 1;
  return a;
}

/** Random cotangents `dout` (and `dht` when asked) for a problem's shape, in f64. */
export function randomCotangents(x: KdaShape, seed: number, withDht: boolean): KdaCotangents {
  const { B, T, H, K, V } = x;
  const ct: KdaCotangents = { dout: randomArray(B * T * H * V, seed) };
  if (withDht) ct.dht = randomArray(B * H * K * V, seed + 1);
  return ct;
}

/** The same cotangents in f32, and the f64 ones set to those rounded values (same bytes). */
export function sameBytesCotangents(
  ct64: KdaCotangents,
): { ct32: KdaCotangents; ct64: KdaCotangents } {
  const dout = Float32Array.from(ct64.dout);
  const dht = ct64.dht === undefined ? undefined : Float32Array.from(ct64.dht);
  return {
    ct32: { dout, ...(dht ? { dht } : {}) },
    ct64: { dout: Float64Array.from(dout), ...(dht ? { dht: Float64Array.from(dht) } : {}) },
  };
}

/**
 * One random f32 problem (gates in [−5, 0], with h0) and the very same values in f64, with
 * cotangents (dout and dht, drawn from `seed + 1`) of the same bytes in both: an f64 reference
 * then runs on exactly what the f32 path sees.
 */
export function f32AndF64(shape: KdaShape, seed: number): {
  x32: KdaProblem;
  x64: KdaProblem;
  ct32: KdaCotangents;
  ct64: KdaCotangents;
} {
  const x32 = randomKda(shape, seed, { gateMin: -5, withH0: true, dtype: "f32" });
  const x64 = toF64(x32);
  return { x32, x64, ...sameBytesCotangents(randomCotangents(x64, seed + 1, true)) };
}

/** Runs fn with the environment variables set, then restores them. */
export async function withEnv<T>(vars: Record<string, string>, fn: () => Promise<T>): Promise<T> {
  const before = Object.fromEntries(Object.keys(vars).map((k) => [k, Deno.env.get(k)]));
  for (const [k, v] of Object.entries(vars)) Deno.env.set(k, v);
  try {
    return await fn();
  } finally {
    for (const [k, v] of Object.entries(before)) {
      if (v === undefined) Deno.env.delete(k);
      else Deno.env.set(k, v);
    }
  }
}
