// The raw KDA op and its vector-Jacobian product on plain typed arrays, dispatched through the
// seam to whichever arm runs.

import { alloc, Tape, Tensor } from "../tape/mod.ts";
import { dispatchKda, type SeamOptions } from "../seam/seam.ts";
import type { Arm, ChunkSize, Float } from "./_types.ts";
import { checkChunkSize, checkPositiveInt } from "./config.ts";
import type { KdaTensors } from "./recurrent.ts";

/** The inputs of the raw KDA op (DESIGN.md 2.1); every array has one element type. */
export interface KdaInputs {
  /** Batch size. */
  B: number;
  /** Tokens per sequence. */
  T: number;
  /** Heads. */
  H: number;
  /** Key dimension. */
  K: number;
  /** Value dimension. */
  V: number;
  /** Queries [B, T, H, K]. */
  q: Float64Array | Float32Array;
  /** Keys [B, T, H, K]. */
  k: Float64Array | Float32Array;
  /** Values [B, T, H, V]. */
  v: Float64Array | Float32Array;
  /** Per-channel log decays [B, T, H, K], each ≤ 0. */
  g: Float64Array | Float32Array;
  /** Write strengths [B, T, H]. */
  beta: Float64Array | Float32Array;
  /** Initial state [B, H, K, V]; zeros when absent. */
  h0?: Float64Array | Float32Array;
  /** Query scale; default K^(-1/2). */
  scale?: number;
}

/** Options of {@linkcode kda} and {@linkcode kdaVjp}. */
export interface KdaOptions {
  /** The arm to run (see the seam for the default and for declines). */
  arm?: Arm;
  /** Chunk size of the chunked arms. */
  chunkSize?: ChunkSize;
  /** Throw instead of declining to another arm. */
  strict?: boolean;
}

/** The op's outputs. */
export interface KdaOutputs {
  /** Outputs [B, T, H, V]. */
  o: Float64Array | Float32Array;
  /** Final state [B, H, K, V]. */
  ht: Float64Array | Float32Array;
}

/** Cotangents of the op's outputs. */
export interface KdaCotangents {
  /** Cotangent of `o`, [B, T, H, V]. */
  dout: Float64Array | Float32Array;
  /** Cotangent of `ht`, [B, H, K, V]; zero when absent. */
  dht?: Float64Array | Float32Array;
}

/** Gradients of the op's inputs. */
export interface KdaGrads {
  /** d/dq [B, T, H, K]. */
  dq: Float64Array | Float32Array;
  /** d/dk [B, T, H, K]. */
  dk: Float64Array | Float32Array;
  /** d/dv [B, T, H, V]. */
  dv: Float64Array | Float32Array;
  /** d/dg [B, T, H, K]. */
  dg: Float64Array | Float32Array;
  /** d/dbeta [B, T, H]. */
  dbeta: Float64Array | Float32Array;
  /** d/dh0 [B, H, K, V] (also when h0 was absent: the gradient at a zero initial state). */
  dh0: Float64Array | Float32Array;
}

function typeName(x: unknown): string {
  if (x === null) return "null";
  if (typeof x !== "object") return typeof x;
  return (x as object).constructor?.name ?? "object";
}

/**
 * Checks one array argument: its type, the shared dtype, its length and that it holds no NaN or
 * infinity (which would poison every later token through the state).
 */
export function checkArray(
  name: string,
  x: unknown,
  length: number,
  dtype: "f64" | "f32",
  shapeText: string,
): asserts x is Float {
  const want = dtype === "f64" ? Float64Array : Float32Array;
  if (!(x instanceof want)) {
    throw new TypeError(
      `${name} must be a ${want.name} like q: got ${typeName(x)}`,
    );
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

/** Validates the raw inputs and returns their dtype and resolved scale. */
export function checkKdaInputs(inputs: KdaInputs): { dtype: "f64" | "f32"; scale: number } {
  if (typeof inputs !== "object" || inputs === null) {
    throw new TypeError(`inputs must be an object: got ${typeName(inputs)}`);
  }
  const { B, T, H, K, V } = inputs;
  checkPositiveInt("inputs.B", B);
  checkPositiveInt("inputs.T", T);
  checkPositiveInt("inputs.H", H);
  checkPositiveInt("inputs.K", K);
  checkPositiveInt("inputs.V", V);
  let dtype: "f64" | "f32";
  if (inputs.q instanceof Float64Array) dtype = "f64";
  else if (inputs.q instanceof Float32Array) dtype = "f32";
  else {
    throw new TypeError(
      `inputs.q must be a Float64Array or Float32Array: got ${typeName(inputs.q)}`,
    );
  }
  checkArray("inputs.q", inputs.q, B * T * H * K, dtype, "[B, T, H, K]");
  checkArray("inputs.k", inputs.k, B * T * H * K, dtype, "[B, T, H, K]");
  checkArray("inputs.v", inputs.v, B * T * H * V, dtype, "[B, T, H, V]");
  checkArray("inputs.g", inputs.g, B * T * H * K, dtype, "[B, T, H, K]");
  for (let i = 0; i < inputs.g.length; i++) {
    if (inputs.g[i] > 0) {
      throw new RangeError(
        `inputs.g must be <= 0 (a log decay): got ${inputs.g[i]} at index ${i}`,
      );
    }
  }
  checkArray("inputs.beta", inputs.beta, B * T * H, dtype, "[B, T, H]");
  if (inputs.h0 !== undefined) {
    checkArray("inputs.h0", inputs.h0, B * H * K * V, dtype, "[B, H, K, V]");
  }
  const scale = inputs.scale === undefined ? K ** -0.5 : inputs.scale;
  if (typeof scale !== "number" || !Number.isFinite(scale)) {
    throw new RangeError(`inputs.scale must be a finite number: got ${String(scale)}`);
  }
  return { dtype, scale };
}

function checkOptions(options: KdaOptions): SeamOptions {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(`options must be an object: got ${typeName(options)}`);
  }
  return {
    arm: options.arm,
    strict: options.strict,
    chunkSize: options.chunkSize === undefined
      ? undefined
      : checkChunkSize("options.chunkSize", options.chunkSize),
  };
}

function tensorsOf(inputs: KdaInputs, wrap: (data: Float, shape: number[]) => Tensor): KdaTensors {
  const { B, T, H, K, V } = inputs;
  return {
    q: wrap(inputs.q, [B, T, H, K]),
    k: wrap(inputs.k, [B, T, H, K]),
    v: wrap(inputs.v, [B, T, H, V]),
    g: wrap(inputs.g, [B, T, H, K]),
    beta: wrap(inputs.beta, [B, T, H]),
    h0: inputs.h0 === undefined ? undefined : wrap(inputs.h0, [B, H, K, V]),
  };
}

/**
 * The KDA op forward (inference: no gradient is recorded).
 *
 * @param inputs q, k, v, g, beta (and optionally h0, scale) with their dimensions.
 * @param options `arm`, `chunkSize`, `strict`.
 * @returns The outputs `o` [B, T, H, V] and the final state `ht` [B, H, K, V].
 *
 * @example Usage
 * ```ts
 * import { kda } from "@deltanet/kda";
 * const [B, T, H, K, V] = [1, 4, 1, 2, 2];
 * const { o, ht } = await kda({
 *   B, T, H, K, V,
 *   q: new Float64Array(B * T * H * K).fill(0.5),
 *   k: new Float64Array(B * T * H * K).fill(0.5),
 *   v: new Float64Array(B * T * H * V).fill(1),
 *   g: new Float64Array(B * T * H * K).fill(-0.1),
 *   beta: new Float64Array(B * T * H).fill(0.5),
 * }, { arm: "cpu" });
 * ```
 */
export async function kda(inputs: KdaInputs, options: KdaOptions = {}): Promise<KdaOutputs> {
  const { scale } = checkKdaInputs(inputs);
  const seamOptions = checkOptions(options);
  const { B, T, H, K, V } = inputs;
  const { o, ht } = await dispatchKda(
    tensorsOf(inputs, (data, shape) => new Tensor(data, shape)),
    { B, T, H, K, V, scale },
    seamOptions,
  );
  return { o: o.data, ht: ht.data };
}

/**
 * The KDA op's vector-Jacobian product: runs the forward on a tape and pulls the cotangents of
 * `o` and `ht` back to every input.
 *
 * @param inputs q, k, v, g, beta (and optionally h0, scale) with their dimensions.
 * @param cotangents `dout` [B, T, H, V] and optional `dht` [B, H, K, V].
 * @param options `arm`, `chunkSize`, `strict`.
 * @returns dq, dk, dv, dg, dbeta and dh0, of the inputs' dtype.
 *
 * @example Usage
 * ```ts
 * import { kdaVjp } from "@deltanet/kda";
 * const [B, T, H, K, V] = [1, 4, 1, 2, 2];
 * const { dq, dg } = await kdaVjp({
 *   B, T, H, K, V,
 *   q: new Float64Array(B * T * H * K).fill(0.5),
 *   k: new Float64Array(B * T * H * K).fill(0.5),
 *   v: new Float64Array(B * T * H * V).fill(1),
 *   g: new Float64Array(B * T * H * K).fill(-0.1),
 *   beta: new Float64Array(B * T * H).fill(0.5),
 * }, { dout: new Float64Array(B * T * H * V).fill(1) }, { arm: "cpu" });
 * ```
 */
export async function kdaVjp(
  inputs: KdaInputs,
  cotangents: KdaCotangents,
  options: KdaOptions = {},
): Promise<KdaGrads> {
  const { dtype, scale } = checkKdaInputs(inputs);
  const { B, T, H, K, V } = inputs;
  if (typeof cotangents !== "object" || cotangents === null) {
    throw new TypeError(`cotangents must be an object: got ${typeName(cotangents)}`);
  }
  checkArray("cotangents.dout", cotangents.dout, B * T * H * V, dtype, "[B, T, H, V]");
  if (cotangents.dht !== undefined) {
    checkArray("cotangents.dht", cotangents.dht, B * H * K * V, dtype, "[B, H, K, V]");
  }
  const seamOptions = checkOptions(options);
  const tape = new Tape(dtype);
  try {
    // h0 is always a variable so that dh0 exists; absent, it is a zero state.
    const x = tensorsOf(
      { ...inputs, h0: inputs.h0 ?? alloc(dtype, B * H * K * V) },
      (data, shape) => tape.variable(data, shape),
    );
    const { o, ht } = await dispatchKda(x, { B, T, H, K, V, scale }, seamOptions);
    const seeds = [{ output: o, cotangent: cotangents.dout }];
    if (cotangents.dht !== undefined) seeds.push({ output: ht, cotangent: cotangents.dht });
    const grads = await tape.backwardFrom(seeds);
    const grad = (t: Tensor | undefined) => grads.get(t!) ?? alloc(dtype, t!.size);
    return {
      dq: grad(x.q),
      dk: grad(x.k),
      dv: grad(x.v),
      dg: grad(x.g),
      dbeta: grad(x.beta),
      dh0: grad(x.h0),
    };
  } finally {
    tape.dispose();
  }
}
