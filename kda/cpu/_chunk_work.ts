// The cpu arm's per-chunk scratch (kda/chunk.ts): every quantity of one chunk of one (batch, head)
// pair, forward (ChunkWork) and backward (ChunkAdjoints), in the notation of docs/kda.md 2.2 and 2.3.
// Allocated once per call and reused for every chunk, so the inner loops never allocate.

/**
 * Everything one chunk of one (b, h) pair needs, as contiguous row-major f64 scratch. Allocated
 * once per call and reused for every chunk, so the inner loops never allocate. Row strides are
 * K or V for the C×K and C×V tiles and C for the C×C tiles; only the first n rows are valid.
 *
 * @example Scratch for chunks of 16 tokens with K = V = 4
 * ```ts
 * import { ChunkWork } from "./_chunk_work.ts";
 *
 * const w = new ChunkWork(16, 4, 4, 0.5);
 * console.log(w.E.length); // 544: the packed lower-inclusive triangle of K-vectors
 * ```
 */
export class ChunkWork {
  /** Valid rows of the current chunk (C, or fewer for a short last chunk). */
  n = 0;
  /** Index of the current chunk's first row among the [B, T, H] tokens of the inputs. */
  token0 = 0;
  /** Distance between the tokens of two consecutive rows (H: the heads are interleaved). */
  tokenStride = 1;
  // Gathered inputs of the chunk.
  readonly q: Float64Array;
  readonly k: Float64Array;
  readonly v: Float64Array;
  readonly g: Float64Array;
  readonly beta: Float64Array;
  // Gate factors: the decays a = e^g, Γ = e^G, e^{G_C − G}, and E packed lower-inclusive.
  readonly decay: Float64Array;
  readonly gamma: Float64Array;
  readonly decayToEnd: Float64Array;
  readonly E: Float64Array;
  // Gated operands: Q ⊙ Γ, Kβ, Vβ, Kd.
  readonly qGamma: Float64Array;
  readonly kBeta: Float64Array;
  readonly vBeta: Float64Array;
  readonly kDecayed: Float64Array;
  // Intra-chunk matrices (C×C) and the WY factors.
  readonly L: Float64Array;
  readonly P: Float64Array;
  readonly T: Float64Array;
  readonly W: Float64Array;
  readonly U: Float64Array;
  // New values, output rows, and the running K×V state (the chunk-start state S).
  readonly Vn: Float64Array;
  readonly O: Float64Array;
  readonly state: Float64Array;

  /**
   * @param C Chunk size.
   * @param K Key dimension.
   * @param V Value dimension.
   * @param scale Query scale.
   */
  constructor(readonly C: number, readonly K: number, readonly V: number, readonly scale: number) {
    const CK = C * K, CV = C * V, CC = C * C;
    this.q = new Float64Array(CK);
    this.k = new Float64Array(CK);
    this.v = new Float64Array(CV);
    this.g = new Float64Array(CK);
    this.beta = new Float64Array(C);
    this.decay = new Float64Array(CK);
    this.gamma = new Float64Array(CK);
    this.decayToEnd = new Float64Array(CK);
    this.E = new Float64Array(((C * (C + 1)) / 2) * K);
    this.qGamma = new Float64Array(CK);
    this.kBeta = new Float64Array(CK);
    this.vBeta = new Float64Array(CV);
    this.kDecayed = new Float64Array(CK);
    this.L = new Float64Array(CC);
    this.P = new Float64Array(CC);
    this.T = new Float64Array(CC);
    this.W = new Float64Array(CK);
    this.U = new Float64Array(CV);
    this.Vn = new Float64Array(CV);
    this.O = new Float64Array(CV);
    this.state = new Float64Array(K * V);
  }
}

/**
 * The backward's extra scratch: cotangents of every chunk quantity, same layouts as ChunkWork.
 *
 * @example Scratch for the backward of chunks of 16 tokens with K = V = 4
 * ```ts
 * import { ChunkAdjoints } from "./_chunk_work.ts";
 *
 * const a = new ChunkAdjoints(16, 4, 4);
 * console.log(a.dL.length); // 256
 * ```
 */
export class ChunkAdjoints {
  readonly dO: Float64Array;
  /** dS' arriving at the chunk end (input of the chunk's backward). */
  dStateEnd: Float64Array;
  /** dS of the chunk-start state (output; becomes dS' of the previous chunk). */
  dStateStart: Float64Array;
  readonly dKd: Float64Array;
  readonly dVn: Float64Array;
  readonly dGammaLast: Float64Array;
  readonly dQGamma: Float64Array;
  readonly dP: Float64Array;
  readonly dW: Float64Array;
  readonly dT: Float64Array;
  readonly dKBeta: Float64Array;
  readonly dVBeta: Float64Array;
  readonly M: Float64Array;
  readonly dL: Float64Array;
  readonly dq: Float64Array;
  readonly dk: Float64Array;
  readonly dv: Float64Array;
  /** dG from Γ and γ_C only: the terms through Kd and E are kept apart (gateCumsumBackward). */
  readonly dG: Float64Array;
  /** x_r = dKd ⊙ K ⊙ e^{G_C − G}: the gradient reaching the gates after row r through Kd. */
  readonly dGateToEnd: Float64Array;
  /** X_rs = XL_rs + XP_rs, packed as E: the gradient reaching the gates s+1 … r through E_rs. */
  readonly dGatePair: Float64Array;
  readonly dg: Float64Array;
  readonly dbeta: Float64Array;

  /**
   * @param C Chunk size.
   * @param K Key dimension.
   * @param V Value dimension.
   */
  constructor(C: number, K: number, V: number) {
    const CK = C * K, CV = C * V, CC = C * C;
    this.dO = new Float64Array(CV);
    this.dStateEnd = new Float64Array(K * V);
    this.dStateStart = new Float64Array(K * V);
    this.dKd = new Float64Array(CK);
    this.dVn = new Float64Array(CV);
    this.dGammaLast = new Float64Array(K);
    this.dQGamma = new Float64Array(CK);
    this.dP = new Float64Array(CC);
    this.dW = new Float64Array(CK);
    this.dT = new Float64Array(CC);
    this.dKBeta = new Float64Array(CK);
    this.dVBeta = new Float64Array(CV);
    this.M = new Float64Array(CC);
    this.dL = new Float64Array(CC);
    this.dq = new Float64Array(CK);
    this.dk = new Float64Array(CK);
    this.dv = new Float64Array(CV);
    this.dG = new Float64Array(CK);
    this.dGateToEnd = new Float64Array(CK);
    this.dGatePair = new Float64Array(((C * (C + 1)) / 2) * K);
    this.dg = new Float64Array(CK);
    this.dbeta = new Float64Array(C);
  }
}
