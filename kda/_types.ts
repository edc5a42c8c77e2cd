// Raw (tape-free) shapes and arrays shared by the three arms of the KDA op.
// Layouts are row-major as in DESIGN.md 2.1:
//   q, k, g: [B, T, H, K]   v, o: [B, T, H, V]   beta: [B, T, H]   h0, ht: [B, H, K, V]

/** A typed array of either supported precision. */
export type Float = Float64Array | Float32Array;

/** Supported chunk sizes of the chunked arms. */
export type ChunkSize = 16 | 32 | 64;

/** The raw inputs of one KDA call; every array has the same element type. */
export interface RawKda {
  B: number;
  T: number;
  H: number;
  K: number;
  V: number;
  q: Float;
  k: Float;
  v: Float;
  g: Float;
  beta: Float;
  /** Initial state [B, H, K, V]; zeros when absent. */
  h0?: Float;
  /** Query scale, already resolved (K^(-1/2) by default). */
  scale: number;
}

/** Cotangents of the op's two outputs. `dht` absent means zero. */
export interface RawCotangents {
  dout: Float;
  dht?: Float;
}

/** Gradients of the raw op with respect to each input; `dh0` is always present. */
export interface RawGrads {
  dq: Float;
  dk: Float;
  dv: Float;
  dg: Float;
  dbeta: Float;
  dh0: Float;
}

/** Largest key or value dimension the chunked arms support. */
export const MAX_HEAD_DIM = 256;

/** Which implementation of the KDA op runs: the tape's recurrence, the CPU chunked node, or WebGPU. */
export type Arm = "ops" | "cpu" | "gpu";
