// The one home of the KDA op's shapes and arrays, shared by the three arms, the seam adapter and
// the layer. Layouts are row-major (docs/kda.md 2.1):
//   q, k, g: [B, T, H, K]   v, o: [B, T, H, V]   beta: [B, T, H]   h0, ht: [B, H, K, V]
// With grouped value heads (HV value heads, docs/kda.md 2.5) v, g, beta, h0, ht and o carry HV
// heads instead of H; with a packed batch (cuSeqlens, docs/kda.md 2.6) B is 1 and h0, ht are
// [N, HV, K, V], one state per sequence. The in-kernel options (docs/kda.md 2.8) add aLog [HV]
// and dtBias [HV·K] and the gradients daLog, ddtBias.

import type { BFloat16Array } from "../base/dtype.ts";

/** A typed array of either supported precision. */
export type Float = Float64Array | Float32Array;

/**
 * A typed array the public op accepts: either compute precision, or a 16-bit storage type of the
 * dtype table (Float16Array where the runtime has it, BFloat16Array), computed in f32 and returned
 * in the same type.
 */
export type PublicFloat = Float | Float16Array | BFloat16Array;

/** Supported chunk sizes of the chunked arms. */
export type ChunkSize = 16 | 32 | 64;

/** The chunk sizes, in order. */
export const CHUNK_SIZES: readonly ChunkSize[] = [16, 32, 64];

/** Largest key or value dimension the chunked arms support. */
export const MAX_HEAD_DIM = 256;

/** Which implementation of the KDA op runs: the tape's recurrence, the CPU chunked node, or WebGPU. */
export type Arm = "ops" | "cpu" | "gpu";

/** The op's dimensions. */
export interface KdaDims {
  /** Batch size. */
  B: number;
  /** Tokens per sequence. */
  T: number;
  /** Heads. */
  H: number;
  /** Key dimension per head. */
  K: number;
  /** Value dimension per head. */
  V: number;
}

/** The op's input arrays, generic over the array type (typed arrays, or tape tensors). */
export interface KdaArrays<A> {
  /** Queries [B, T, H, K]. */
  q: A;
  /** Keys [B, T, H, K]. */
  k: A;
  /** Values [B, T, H, V]. */
  v: A;
  /** Per-channel log decays [B, T, H, K], each ≤ 0. */
  g: A;
  /** Write strengths [B, T, H]. */
  beta: A;
  /** Initial state [B, H, K, V]; zeros when absent. */
  h0?: A;
}

/** The optional layout fields of a call: grouped value heads and a packed batch. */
export interface KdaLayout {
  /**
   * Value heads (docs/kda.md 2.5), a multiple of H; default H. Value head j reads query/key head
   * floor(j / (HV / H)).
   */
  HV?: number;
  /**
   * Offsets of N packed sequences into the T tokens of one batch row (docs/kda.md 2.6): N + 1
   * non-decreasing entries from 0 to T, with B = 1 (equal neighbours are an empty sequence, whose
   * state passes through). h0 and ht are then [N, HV, K, V].
   */
  cuSeqlens?: Int32Array;
}

/**
 * The gate's parameters when the gate is computed in the kernel (docs/kda.md 2.8), named as
 * flash-linear-attention's `A_log` and `dt_bias`.
 */
export interface KdaGateArrays<A> {
  /** Per value head log of the gate's sharpness, [HV]. */
  aLog?: A;
  /** Per value head and key channel bias of the raw gate, [HV·K]. */
  dtBias?: A;
}

/**
 * The in-kernel pre- and post-processing of one call, as checked (docs/kda.md 2.8). Absent from a
 * request or problem, none applies: the arrays are the op's own and `ht` is an output.
 */
export interface InKernel {
  /** q and k are scaled by 1/sqrt(Σx² + 1e-6) per token and head before the op. */
  l2norm: boolean;
  /**
   * g is the raw gate: g = −e^{aLog}·softplus(g + dtBias) (lowerBound null), or
   * g = lowerBound·sigmoid(e^{aLog}·(g + dtBias)), without e^{aLog} when aLog is absent.
   */
  gate: { lowerBound: number | null; aLog: boolean; dtBias: boolean } | null;
  /** 0: beta as given; 1 or 2: beta = c·sigmoid(beta) with c this value. */
  betaSigmoid: 0 | 1 | 2;
  /** Whether `ht` is an output (and its cotangent an input). */
  finalState: boolean;
}

/** One validated call of the op as the arms see it: dimensions, arrays and the resolved scale. */
export interface KdaProblem<A = Float> extends KdaDims, KdaArrays<A>, KdaGateArrays<A>, KdaLayout {
  /** Query scale, resolved (K^(-1/2) unless the caller gave one). */
  scale: number;
  /** The in-kernel options; absent: none (docs/kda.md 2.8). */
  inKernel?: InKernel;
}

/** Cotangents of the op's two outputs; `dht` absent means zero. */
export interface KdaCotangents<A = Float> {
  /** Cotangent of `o`, [B, T, H, V]. */
  dout: A;
  /** Cotangent of `ht`, [B, H, K, V]; zero when absent. */
  dht?: A;
}

/** The op's outputs. */
export interface KdaOutputs<A = Float> {
  /** Outputs [B, T, H, V]. */
  o: A;
  /** Final state [B, H, K, V]. */
  ht: A;
}

/** Gradients of the op's inputs; `dh0` is always present (the gradient at a zero state if no h0). */
export interface KdaGrads<A = Float> {
  /** d/dq [B, T, H, K]. */
  dq: A;
  /** d/dk [B, T, H, K]. */
  dk: A;
  /** d/dv [B, T, H, V]. */
  dv: A;
  /** d/dg [B, T, H, K]. */
  dg: A;
  /** d/dbeta [B, T, H]. */
  dbeta: A;
  /** d/dh0 [B, H, K, V]. */
  dh0: A;
}

/** Gradients of the gate's parameters, present where those inputs were given (docs/kda.md 2.8). */
export interface KdaGateGrads<A = Float> {
  /** d/daLog [HV]. */
  daLog?: A;
  /** d/ddtBias [HV·K]. */
  ddtBias?: A;
}

/** The names of the gradients, in the order of the inputs. */
export const GRAD_NAMES: readonly (keyof KdaGrads)[] = ["dq", "dk", "dv", "dg", "dbeta", "dh0"];

/** The eps added to the sum of squares by the in-kernel L2 normalisation (as fla's l2norm). */
export const L2NORM_EPS = 1e-6;
