// Chunked KDA on the CPU: the forward of DESIGN.md 2.2 and the hand-written backward of 2.3.
//
// This file is the readable blueprint of kda/chunk.wgsl. Every stage below is one small function
// whose name the WGSL kernels reuse, working on one chunk of one (batch, head) pair:
//
//   forward, per chunk in order:     gatherChunk → gateCumsum → gateFactors → pairwiseDecay →
//                                    intraChunk → newValues → chunkOutput → stateScan
//   backward, per chunk in reverse:  the same forward stages up to newValues (recomputed from the
//                                    saved chunk-start state), then stateScanBackward →
//                                    chunkOutputBackward → newValuesBackward → wyBackward →
//                                    inverseBackward → elementwiseGrads → pairwiseGrads →
//                                    gateCumsumBackward
//
// Notation follows DESIGN.md: a chunk has n ≤ C valid rows (only the last chunk may be short, and
// then γ_C is its last VALID row), G is the chunk-local cumulative log decay, Γ = e^G,
// E_rsd = e^{G_rd − G_sd} (r ≥ s), Kβ = diag(β)(K ⊙ Γ), Vβ = diag(β)V, Kd = K ⊙ e^{G_C − G}.
//
// Overflow: G ≤ 0, so Γ = e^G and e^{G_C − G} have non-positive exponents and are safe to form.
// e^{−G} alone is never formed: every pairwise factor exponentiates the difference G_r − G_s
// (≤ 0 for r ≥ s), which stays exact for gates down to −5 per token at chunk size 64 (G ≈ −320).
//
// All arithmetic is in JS numbers (f64); only the outputs are rounded to the input element type.
// Every reduction is a plain loop in a fixed order, so the same inputs give the same bits.

import type { ChunkSize, Float, RawCotangents, RawGrads, RawKda } from "./_types.ts";
import { MAX_HEAD_DIM } from "./_types.ts";
import { checkChunkSize } from "./config.ts";

// ---------------------------------------------------------------------------------------------
// Argument checks (cheap; the caller validates everything else)
// ---------------------------------------------------------------------------------------------

function checkLength(name: string, array: Float, formula: string, expected: number): void {
  if (array.length !== expected) {
    throw new RangeError(
      `Invalid length of ${name}: expected ${formula} = ${expected}, got ${array.length}`,
    );
  }
}

function checkInputs(x: RawKda): void {
  for (const dim of ["B", "T", "H", "K", "V"] as const) {
    const value = x[dim];
    if (!Number.isInteger(value) || value < 1) {
      throw new RangeError(`Invalid ${dim}: expected a positive integer, got ${value}`);
    }
  }
  const { B, T, H, K, V } = x;
  if (K > MAX_HEAD_DIM) {
    throw new RangeError(`Invalid K: expected at most ${MAX_HEAD_DIM}, got ${K}`);
  }
  if (V > MAX_HEAD_DIM) {
    throw new RangeError(`Invalid V: expected at most ${MAX_HEAD_DIM}, got ${V}`);
  }
  checkLength("q", x.q, "B·T·H·K", B * T * H * K);
  checkLength("k", x.k, "B·T·H·K", B * T * H * K);
  checkLength("v", x.v, "B·T·H·V", B * T * H * V);
  checkLength("g", x.g, "B·T·H·K", B * T * H * K);
  checkLength("beta", x.beta, "B·T·H", B * T * H);
  if (x.h0 !== undefined) checkLength("h0", x.h0, "B·H·K·V", B * H * K * V);
}

/** A zeroed array of `length` elements with the element type of `like`. */
function allocLike(like: Float, length: number): Float {
  return like instanceof Float32Array ? new Float32Array(length) : new Float64Array(length);
}

// ---------------------------------------------------------------------------------------------
// Per-chunk working set
// ---------------------------------------------------------------------------------------------

/**
 * Everything one chunk of one (b, h) pair needs, as contiguous row-major f64 scratch. Allocated
 * once per call and reused for every chunk, so the inner loops never allocate. Row strides are
 * K or V for the C×K and C×V tiles and C for the C×C tiles; only the first n rows are valid.
 */
class ChunkWork {
  /** Valid rows of the current chunk (C, or fewer for a short last chunk). */
  n = 0;
  // Gathered inputs of the chunk.
  readonly q: Float64Array;
  readonly k: Float64Array;
  readonly v: Float64Array;
  readonly g: Float64Array;
  readonly beta: Float64Array;
  // Gate factors: G (cumulative log decay), Γ = e^G, e^{G_C − G}; E packed lower-inclusive.
  readonly G: Float64Array;
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

  constructor(readonly C: number, readonly K: number, readonly V: number, readonly scale: number) {
    const CK = C * K, CV = C * V, CC = C * C;
    this.q = new Float64Array(CK);
    this.k = new Float64Array(CK);
    this.v = new Float64Array(CV);
    this.g = new Float64Array(CK);
    this.beta = new Float64Array(C);
    this.G = new Float64Array(CK);
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

/** The backward's extra scratch: cotangents of every chunk quantity, same layouts as ChunkWork. */
class ChunkAdjoints {
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
  readonly dG: Float64Array;
  readonly dg: Float64Array;
  readonly dbeta: Float64Array;

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
    this.dg = new Float64Array(CK);
    this.dbeta = new Float64Array(C);
  }
}

// ---------------------------------------------------------------------------------------------
// Small matmul kernels
// ---------------------------------------------------------------------------------------------
//
// Every stage is a handful of products of row-major tiles, in one of three shapes: A·B, Aᵀ·B and
// A·Bᵀ. Each kernel ACCUMULATES α·product into its output (callers zero or seed the output
// first), optionally over a triangle only. Four output columns are summed at once in registers:
// that is several times faster in V8 than one column at a time, and each output element still
// sums its inner index in ascending order, so results are reproducible bit for bit.

/** Which part of a square operand is (or of an output is kept) nonzero. */
type Triangle = "full" | "lower" | "strictLower";

/**
 * C += α·A·B with A m×p (row stride lda), B p×n (ldb), C m×n (ldc). With `triA` "lower", A is
 * lower triangular (A_rd = 0 for d > r), so row r sums d ≤ r only. Rows go in pairs (2×4 block of
 * accumulators sharing each load of B); row r+1 of a pair finishes its longer sum alone.
 */
function addAB(
  C: Float64Array,
  ldc: number,
  A: Float64Array,
  lda: number,
  B: Float64Array,
  ldb: number,
  m: number,
  p: number,
  n: number,
  alpha: number,
  triA: Triangle = "full",
): void {
  let r = 0;
  for (; r + 2 <= m; r += 2) {
    const end0 = triA === "full" ? p : Math.min(r + 1, p);
    const end1 = triA === "full" ? p : Math.min(r + 2, p);
    const a0 = r * lda, a1 = a0 + lda, c0 = r * ldc, c1 = c0 + ldc;
    let j = 0;
    for (; j + 4 <= n; j += 4) {
      let x0 = 0, x1 = 0, x2 = 0, x3 = 0, y0 = 0, y1 = 0, y2 = 0, y3 = 0;
      for (let d = 0; d < end0; d++) {
        const u = A[a0 + d], w = A[a1 + d], o = d * ldb + j;
        const b0 = B[o], b1 = B[o + 1], b2 = B[o + 2], b3 = B[o + 3];
        x0 += u * b0;
        x1 += u * b1;
        x2 += u * b2;
        x3 += u * b3;
        y0 += w * b0;
        y1 += w * b1;
        y2 += w * b2;
        y3 += w * b3;
      }
      for (let d = end0; d < end1; d++) {
        const w = A[a1 + d], o = d * ldb + j;
        y0 += w * B[o];
        y1 += w * B[o + 1];
        y2 += w * B[o + 2];
        y3 += w * B[o + 3];
      }
      C[c0 + j] += alpha * x0;
      C[c0 + j + 1] += alpha * x1;
      C[c0 + j + 2] += alpha * x2;
      C[c0 + j + 3] += alpha * x3;
      C[c1 + j] += alpha * y0;
      C[c1 + j + 1] += alpha * y1;
      C[c1 + j + 2] += alpha * y2;
      C[c1 + j + 3] += alpha * y3;
    }
    for (; j < n; j++) {
      let x = 0, y = 0;
      for (let d = 0; d < end0; d++) {
        const b = B[d * ldb + j];
        x += A[a0 + d] * b;
        y += A[a1 + d] * b;
      }
      for (let d = end0; d < end1; d++) y += A[a1 + d] * B[d * ldb + j];
      C[c0 + j] += alpha * x;
      C[c1 + j] += alpha * y;
    }
  }
  if (r < m) {
    const end = triA === "full" ? p : Math.min(r + 1, p);
    const a0 = r * lda, c0 = r * ldc;
    for (let j = 0; j < n; j++) {
      let x = 0;
      for (let d = 0; d < end; d++) x += A[a0 + d] * B[d * ldb + j];
      C[c0 + j] += alpha * x;
    }
  }
}

/**
 * C += α·Aᵀ·B with A m×p (lda), B m×n (ldb), C p×n (ldc). With `triA` "lower", A is lower
 * triangular (A_ri = 0 for r < i), so row i of C sums r ≥ i only. Output rows go in pairs as in
 * addAB; row i of a pair takes its extra leading term first, so every sum runs in ascending r.
 */
function addAtB(
  C: Float64Array,
  ldc: number,
  A: Float64Array,
  lda: number,
  B: Float64Array,
  ldb: number,
  m: number,
  p: number,
  n: number,
  alpha: number,
  triA: Triangle = "full",
): void {
  let i = 0;
  for (; i + 2 <= p; i += 2) {
    const start0 = triA === "full" ? 0 : Math.min(i, m);
    const start1 = triA === "full" ? 0 : Math.min(i + 1, m);
    const c0 = i * ldc, c1 = c0 + ldc;
    let j = 0;
    for (; j + 4 <= n; j += 4) {
      let x0 = 0, x1 = 0, x2 = 0, x3 = 0, y0 = 0, y1 = 0, y2 = 0, y3 = 0;
      for (let r = start0; r < start1; r++) {
        const u = A[r * lda + i], o = r * ldb + j;
        x0 += u * B[o];
        x1 += u * B[o + 1];
        x2 += u * B[o + 2];
        x3 += u * B[o + 3];
      }
      for (let r = start1; r < m; r++) {
        const u = A[r * lda + i], w = A[r * lda + i + 1], o = r * ldb + j;
        const b0 = B[o], b1 = B[o + 1], b2 = B[o + 2], b3 = B[o + 3];
        x0 += u * b0;
        x1 += u * b1;
        x2 += u * b2;
        x3 += u * b3;
        y0 += w * b0;
        y1 += w * b1;
        y2 += w * b2;
        y3 += w * b3;
      }
      C[c0 + j] += alpha * x0;
      C[c0 + j + 1] += alpha * x1;
      C[c0 + j + 2] += alpha * x2;
      C[c0 + j + 3] += alpha * x3;
      C[c1 + j] += alpha * y0;
      C[c1 + j + 1] += alpha * y1;
      C[c1 + j + 2] += alpha * y2;
      C[c1 + j + 3] += alpha * y3;
    }
    for (; j < n; j++) {
      let x = 0, y = 0;
      for (let r = start0; r < start1; r++) x += A[r * lda + i] * B[r * ldb + j];
      for (let r = start1; r < m; r++) {
        const b = B[r * ldb + j];
        x += A[r * lda + i] * b;
        y += A[r * lda + i + 1] * b;
      }
      C[c0 + j] += alpha * x;
      C[c1 + j] += alpha * y;
    }
  }
  if (i < p) {
    const start = triA === "full" ? 0 : Math.min(i, m);
    const c0 = i * ldc;
    for (let j = 0; j < n; j++) {
      let x = 0;
      for (let r = start; r < m; r++) x += A[r * lda + i] * B[r * ldb + j];
      C[c0 + j] += alpha * x;
    }
  }
}

/**
 * C += α·A·Bᵀ with A m×p (lda), B n×p (ldb), C m×n (ldc): dot products of rows. With `triC`
 * "lower" only entries s ≤ r of C are formed, with "strictLower" only s < r; the rest of C is left
 * untouched. Rows of C go in pairs, sharing each load of a row of B over four columns of C.
 */
function addABt(
  C: Float64Array,
  ldc: number,
  A: Float64Array,
  lda: number,
  B: Float64Array,
  ldb: number,
  m: number,
  p: number,
  n: number,
  alpha: number,
  triC: Triangle = "full",
): void {
  const columnsOf = (r: number) => triC === "full" ? n : Math.min(triC === "lower" ? r + 1 : r, n);
  let r = 0;
  for (; r + 2 <= m; r += 2) {
    const end0 = columnsOf(r), end1 = columnsOf(r + 1);
    const a0 = r * lda, a1 = a0 + lda, c0 = r * ldc, c1 = c0 + ldc;
    let s = 0;
    for (; s + 4 <= end0; s += 4) {
      const bs0 = s * ldb, bs1 = bs0 + ldb, bs2 = bs1 + ldb, bs3 = bs2 + ldb;
      let x0 = 0, x1 = 0, x2 = 0, x3 = 0, y0 = 0, y1 = 0, y2 = 0, y3 = 0;
      for (let j = 0; j < p; j++) {
        const u = A[a0 + j], w = A[a1 + j];
        const b0 = B[bs0 + j], b1 = B[bs1 + j], b2 = B[bs2 + j], b3 = B[bs3 + j];
        x0 += u * b0;
        x1 += u * b1;
        x2 += u * b2;
        x3 += u * b3;
        y0 += w * b0;
        y1 += w * b1;
        y2 += w * b2;
        y3 += w * b3;
      }
      C[c0 + s] += alpha * x0;
      C[c0 + s + 1] += alpha * x1;
      C[c0 + s + 2] += alpha * x2;
      C[c0 + s + 3] += alpha * x3;
      C[c1 + s] += alpha * y0;
      C[c1 + s + 1] += alpha * y1;
      C[c1 + s + 2] += alpha * y2;
      C[c1 + s + 3] += alpha * y3;
    }
    for (; s < end0; s++) {
      const bs = s * ldb;
      let x = 0, y = 0;
      for (let j = 0; j < p; j++) {
        const b = B[bs + j];
        x += A[a0 + j] * b;
        y += A[a1 + j] * b;
      }
      C[c0 + s] += alpha * x;
      C[c1 + s] += alpha * y;
    }
    for (; s < end1; s++) {
      const bs = s * ldb;
      let y = 0;
      for (let j = 0; j < p; j++) y += A[a1 + j] * B[bs + j];
      C[c1 + s] += alpha * y;
    }
  }
  if (r < m) {
    const end = columnsOf(r), a0 = r * lda, c0 = r * ldc;
    for (let s = 0; s < end; s++) {
      const bs = s * ldb;
      let x = 0;
      for (let j = 0; j < p; j++) x += A[a0 + j] * B[bs + j];
      C[c0 + s] += alpha * x;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward stages (DESIGN.md 2.2)
// ---------------------------------------------------------------------------------------------

/** Copies rows t0 .. t0+n−1 of head (b, h) out of the strided [B,T,H,·] inputs. */
function gatherChunk(x: RawKda, b: number, h: number, t0: number, w: ChunkWork): void {
  const { T, H, K, V } = x;
  const { n, q, k, v, g, beta } = w;
  for (let r = 0; r < n; r++) {
    const token = (b * T + t0 + r) * H + h;
    const src = token * K, dst = r * K;
    for (let d = 0; d < K; d++) {
      q[dst + d] = x.q[src + d];
      k[dst + d] = x.k[src + d];
      g[dst + d] = x.g[src + d];
    }
    const srcV = token * V, dstV = r * V;
    for (let j = 0; j < V; j++) v[dstV + j] = x.v[srcV + j];
    beta[r] = x.beta[token];
  }
}

/** G_r = Σ_{s ≤ r} g_s per channel, restarting at every chunk so that G stays within C gates. */
function gateCumsum(w: ChunkWork): void {
  const { n, K, g, G } = w;
  for (let d = 0; d < K; d++) G[d] = g[d];
  for (let r = 1; r < n; r++) {
    for (let d = 0; d < K; d++) G[r * K + d] = G[(r - 1) * K + d] + g[r * K + d];
  }
}

/**
 * Γ = e^G and e^{G_C − G} (decay from row r to the chunk end), both with exponents ≤ 0, then the
 * gated operands Q ⊙ Γ, Kβ = diag(β)(K ⊙ Γ), Vβ = diag(β)V and Kd = K ⊙ e^{G_C − G}.
 */
function gateFactors(w: ChunkWork): void {
  const { n, K, V, q, k, v, beta, G, gamma, decayToEnd, qGamma, kBeta, vBeta, kDecayed } = w;
  const last = (n - 1) * K;
  for (let r = 0; r < n; r++) {
    const br = beta[r];
    for (let d = 0; d < K; d++) {
      const i = r * K + d;
      const gam = Math.exp(G[i]);
      const toEnd = Math.exp(G[last + d] - G[i]);
      gamma[i] = gam;
      decayToEnd[i] = toEnd;
      qGamma[i] = q[i] * gam;
      kBeta[i] = br * k[i] * gam;
      kDecayed[i] = k[i] * toEnd;
    }
    for (let j = 0; j < V; j++) vBeta[r * V + j] = br * v[r * V + j];
  }
}

/** Offset of E_rs (s ≤ r) in the packed lower-inclusive triangle of K-vectors. */
function pairOffset(r: number, s: number, K: number): number {
  return ((r * (r + 1)) / 2 + s) * K;
}

/**
 * E_rsd = e^{G_rd − G_sd} for r ≥ s: the decay from token s to token r. The difference is taken
 * BEFORE exponentiating; e^{G_r} · e^{−G_s} would overflow e^{−G_s} once G_s < −709.
 */
function pairwiseDecay(w: ChunkWork): void {
  const { n, K, G, E } = w;
  for (let r = 0; r < n; r++) {
    for (let s = 0; s < r; s++) {
      const e = pairOffset(r, s, K);
      for (let d = 0; d < K; d++) E[e + d] = Math.exp(G[r * K + d] - G[s * K + d]);
    }
    E.fill(1, pairOffset(r, r, K), pairOffset(r, r, K) + K); // no decay from a token to itself
  }
}

/**
 * The intra-chunk matrices and the WY factors:
 *   L = strict_lower(β_r Σ_d K_rd K_sd E_rsd),  P = lower_incl(scale Σ_d Q_rd K_sd E_rsd),
 *   T = (I + L)^(-1) by forward substitution,   W = T Kβ,  U = T Vβ.
 * W and U fold the chunk's delta-rule corrections into one triangular solve, so that the new values
 * of the whole chunk become one matmul against the chunk-start state (newValues).
 */
function intraChunk(w: ChunkWork): void {
  const { n, C, K, V, scale, q, k, beta, E, L, P, T, kBeta, vBeta, W, U } = w;
  for (let r = 0; r < n; r++) {
    const rK = r * K;
    for (let s = 0; s <= r; s++) {
      const sK = s * K, e = pairOffset(r, s, K);
      let kk = 0, qk = 0;
      for (let d = 0; d < K; d++) {
        const ks = k[sK + d] * E[e + d];
        kk += k[rK + d] * ks;
        qk += q[rK + d] * ks;
      }
      L[r * C + s] = s < r ? beta[r] * kk : 0;
      P[r * C + s] = scale * qk;
    }
  }
  // Forward substitution: row r of (I + L) T = I gives T_rs = −Σ_{s ≤ j < r} L_rj T_js.
  for (let r = 0; r < n; r++) {
    const rC = r * C;
    for (let s = 0; s < r; s++) T[rC + s] = 0;
    T[rC + r] = 1;
    for (let j = 0; j < r; j++) {
      const l = L[rC + j];
      for (let s = 0; s <= j; s++) T[rC + s] -= l * T[j * C + s];
    }
  }
  W.fill(0, 0, n * K);
  U.fill(0, 0, n * V);
  addAB(W, K, T, C, kBeta, K, n, n, K, 1, "lower");
  addAB(U, V, T, C, vBeta, V, n, n, V, 1, "lower");
}

/** Vn = U − W S: the chunk's values minus what the chunk-start state already predicts. */
function newValues(w: ChunkWork): void {
  const { n, K, V, W, U, Vn, state: S } = w;
  for (let i = 0; i < n * V; i++) Vn[i] = U[i];
  addAB(Vn, V, W, K, S, V, n, K, V, -1);
}

/** O = scale (Q ⊙ Γ) S + P Vn: the inter-chunk read of S plus the causal intra-chunk part. */
function chunkOutput(w: ChunkWork): void {
  const { n, C, K, V, scale, qGamma, P, Vn, O, state: S } = w;
  O.fill(0, 0, n * V);
  addAB(O, V, qGamma, K, S, V, n, K, V, scale);
  addAB(O, V, P, C, Vn, V, n, n, V, 1, "lower");
}

/** One step of the inter-chunk scan, in place: S ← diag(γ_C) S + Kdᵀ Vn. */
function stateScan(w: ChunkWork): void {
  const { n, K, V, gamma, kDecayed, Vn, state: S } = w;
  const last = (n - 1) * K;
  for (let d = 0; d < K; d++) {
    const gl = gamma[last + d], dV = d * V;
    for (let j = 0; j < V; j++) S[dV + j] *= gl;
  }
  addAtB(S, V, kDecayed, K, Vn, V, n, K, V, 1);
}

/** Everything of one chunk that depends only on its inputs (not on S): shared by both passes. */
function prepareChunk(x: RawKda, b: number, h: number, t0: number, w: ChunkWork): void {
  gatherChunk(x, b, h, t0, w);
  gateCumsum(w);
  gateFactors(w);
  pairwiseDecay(w);
  intraChunk(w);
}

// ---------------------------------------------------------------------------------------------
// Backward stages (DESIGN.md 2.3, in the order listed there)
// ---------------------------------------------------------------------------------------------

/**
 * From S' = diag(γ_C) S + Kdᵀ Vn:
 *   dS = diag(γ_C) dS',  dKd = Vn dS'ᵀ,  dVn = Kd dS',  dγ_C = rowsum(S ⊙ dS').
 */
function stateScanBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, K, V, gamma, kDecayed, Vn, state: S } = w;
  const { dStateEnd: dSe, dStateStart: dS, dKd, dVn, dGammaLast } = a;
  const last = (n - 1) * K;
  for (let d = 0; d < K; d++) {
    const gl = gamma[last + d], dV = d * V;
    let acc = 0;
    for (let j = 0; j < V; j++) {
      acc += S[dV + j] * dSe[dV + j];
      dS[dV + j] = gl * dSe[dV + j];
    }
    dGammaLast[d] = acc;
  }
  dKd.fill(0, 0, n * K);
  addABt(dKd, K, Vn, V, dSe, V, n, V, K, 1);
  dVn.fill(0, 0, n * V);
  addAB(dVn, V, kDecayed, K, dSe, V, n, K, V, 1);
}

/**
 * From O = scale (Q ⊙ Γ) S + P Vn:
 *   dQΓ = scale dO Sᵀ,  dS += scale (Q ⊙ Γ)ᵀ dO,  dP = lower_incl(dO Vnᵀ),  dVn += Pᵀ dO.
 */
function chunkOutputBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, C, K, V, scale, qGamma, P, Vn, state: S } = w;
  const { dO, dStateStart: dS, dQGamma, dP, dVn } = a;
  dQGamma.fill(0, 0, n * K);
  addABt(dQGamma, K, dO, V, S, V, n, V, K, scale);
  addAtB(dS, V, qGamma, K, dO, V, n, K, V, scale);
  dP.fill(0, 0, n * C);
  addABt(dP, C, dO, V, Vn, V, n, V, n, 1, "lower");
  addAtB(dVn, V, P, C, dO, V, n, n, V, 1, "lower");
}

/** From Vn = U − W S:  dU = dVn (kept in dVn),  dW = −dVn Sᵀ,  dS −= Wᵀ dVn. */
function newValuesBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, K, V, W, state: S } = w;
  const { dVn, dW, dStateStart: dS } = a;
  dW.fill(0, 0, n * K);
  addABt(dW, K, dVn, V, S, V, n, V, K, -1);
  addAtB(dS, V, W, K, dVn, V, n, K, V, -1);
}

/**
 * From W = T Kβ and U = T Vβ:  dT = dW Kβᵀ + dU Vβᵀ,  dKβ = Tᵀ dW,  dVβ = Tᵀ dU.
 * Only the strictly lower part of dT is formed: it is all that inverseBackward reads, because
 * T's diagonal is the constant 1 and its upper part the constant 0.
 */
function wyBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, C, K, V, T, kBeta, vBeta } = w;
  const { dW, dVn: dU, dT, dKBeta, dVBeta } = a;
  dT.fill(0, 0, n * C);
  addABt(dT, C, dW, K, kBeta, K, n, K, n, 1, "strictLower");
  addABt(dT, C, dU, V, vBeta, V, n, V, n, 1, "strictLower");
  dKBeta.fill(0, 0, n * K);
  addAtB(dKBeta, K, T, C, dW, K, n, n, K, 1, "lower");
  dVBeta.fill(0, 0, n * V);
  addAtB(dVBeta, V, T, C, dU, V, n, n, V, 1, "lower");
}

/**
 * From T = (I + L)^(-1):  dL = strict_lower(−Tᵀ dT Tᵀ), as M = dT Tᵀ then dL = −Tᵀ M.
 * For i > j only a ≥ i > j ≥ b contributes (T lower, dT strictly lower), so M is needed for a > j
 * and its sum runs over b ≤ j.
 */
function inverseBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, C, T } = w;
  const { dT, M, dL } = a;
  for (let r = 1; r < n; r++) {
    for (let j = 0; j < r; j++) {
      let acc = 0;
      for (let b = 0; b <= j; b++) acc += dT[r * C + b] * T[j * C + b];
      M[r * C + j] = acc;
    }
  }
  for (let i = 1; i < n; i++) {
    for (let j = 0; j < i; j++) {
      let acc = 0;
      for (let r = i; r < n; r++) acc += T[r * C + i] * M[r * C + j];
      dL[i * C + j] = -acc;
    }
  }
}

/**
 * The per-element pieces of every gated operand:
 *   dQ = dQΓ ⊙ Γ,  dK = β ⊙ dKβ ⊙ Γ + dKd ⊙ e^{G_C − G},  dV = β ⊙ dVβ,
 *   dβ = rowsum(dKβ ⊙ K ⊙ Γ) + rowsum(dVβ ⊙ V),
 *   dG = (dQΓ ⊙ Q + β ⊙ dKβ ⊙ K) ⊙ Γ − dKd ⊙ K ⊙ e^{G_C − G},
 *   dG_C += colsum(dKd ⊙ K ⊙ e^{G_C − G}) + dγ_C ⊙ γ_C   (G_C is the last valid row).
 */
function elementwiseGrads(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, K, V, q, k, v, beta, gamma, decayToEnd } = w;
  const { dQGamma, dKBeta, dVBeta, dKd, dGammaLast, dq, dk, dv, dG, dbeta } = a;
  for (let r = 0; r < n; r++) {
    const rK = r * K, rV = r * V, br = beta[r];
    let db = 0;
    for (let d = 0; d < K; d++) {
      const i = rK + d;
      dq[i] = dQGamma[i] * gamma[i];
      dk[i] = br * dKBeta[i] * gamma[i] + dKd[i] * decayToEnd[i];
      db += dKBeta[i] * k[i] * gamma[i];
      dG[i] = (dQGamma[i] * q[i] + br * dKBeta[i] * k[i]) * gamma[i] -
        dKd[i] * k[i] * decayToEnd[i];
    }
    for (let j = 0; j < V; j++) {
      dv[rV + j] = br * dVBeta[rV + j];
      db += dVBeta[rV + j] * v[rV + j];
    }
    dbeta[r] = db;
  }
  // G_C sits in every e^{G_C − G_r} and in γ_C, so the last valid row collects them all.
  const last = (n - 1) * K;
  for (let d = 0; d < K; d++) {
    let acc = dGammaLast[d] * gamma[last + d];
    for (let r = 0; r < n; r++) {
      const i = r * K + d;
      acc += dKd[i] * k[i] * decayToEnd[i];
    }
    dG[last + d] += acc;
  }
}

/**
 * The pairwise pieces through E_rsd = e^{G_rd − G_sd}, over both ends of every pair
 * (r > s for L, r ≥ s for P), per channel d:
 *   XL = dL_rs β_r K_rd K_sd E_rsd,  XP = scale dP_rs Q_rd K_sd E_rsd,
 *   dβ_r += Σ dL_rs K_rd K_sd E_rsd,  dK_r += β_r dL_rs K_s ⊙ E_rs,  dK_s += β_r dL_rs K_r ⊙ E_rs,
 *   dQ_r += scale dP_rs K_s ⊙ E_rs,   dK_s += scale dP_rs Q_r ⊙ E_rs,
 *   dG_r += XL + XP,  dG_s −= XL + XP.
 * On the diagonal (r = s) E is 1 and has no gate dependence, so only dQ and dK receive P terms.
 */
function pairwiseGrads(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, C, K, scale, q, k, beta, E } = w;
  const { dL, dP, dq, dk, dG, dbeta } = a;
  for (let r = 0; r < n; r++) {
    const rK = r * K, br = beta[r];
    let db = 0;
    for (let s = 0; s < r; s++) {
      const sK = s * K, e = pairOffset(r, s, K);
      const l = dL[r * C + s], p = scale * dP[r * C + s];
      for (let d = 0; d < K; d++) {
        const ers = E[e + d];
        const krd = k[rK + d], ksd = k[sK + d], qrd = q[rK + d];
        const lE = l * ers, pE = p * ers;
        const x = (br * lE * krd + pE * qrd) * ksd; // XL + XP
        db += lE * krd * ksd;
        dk[rK + d] += br * lE * ksd;
        dk[sK + d] += br * lE * krd + pE * qrd;
        dq[rK + d] += pE * ksd;
        dG[rK + d] += x;
        dG[sK + d] -= x;
      }
    }
    dbeta[r] += db;
    const p = scale * dP[r * C + r];
    for (let d = 0; d < K; d++) {
      dq[rK + d] += p * k[rK + d];
      dk[rK + d] += p * q[rK + d];
    }
  }
}

/** G is the cumulative sum of g, so dg_t = Σ_{r ≥ t, same chunk} dG_r. */
function gateCumsumBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, K } = w;
  const { dG, dg } = a;
  const last = (n - 1) * K;
  for (let d = 0; d < K; d++) dg[last + d] = dG[last + d];
  for (let r = n - 2; r >= 0; r--) {
    for (let d = 0; d < K; d++) dg[r * K + d] = dg[(r + 1) * K + d] + dG[r * K + d];
  }
}

/** Copies the chunk's output cotangent rows out of the strided [B,T,H,V] dout. */
function gatherOutputGrad(
  dout: Float,
  x: RawKda,
  b: number,
  h: number,
  t0: number,
  w: ChunkWork,
  a: ChunkAdjoints,
): void {
  const { T, H, V } = x;
  const { dO } = a;
  for (let r = 0; r < w.n; r++) {
    const src = ((b * T + t0 + r) * H + h) * V, dst = r * V;
    for (let j = 0; j < V; j++) dO[dst + j] = dout[src + j];
  }
}

/** Writes the chunk's input gradients back to the strided [B,T,H,·] layouts. */
function scatterGrads(
  x: RawKda,
  b: number,
  h: number,
  t0: number,
  w: ChunkWork,
  a: ChunkAdjoints,
  out: RawGrads,
): void {
  const { T, H, K, V } = x;
  for (let r = 0; r < w.n; r++) {
    const token = (b * T + t0 + r) * H + h;
    const dstK = token * K, srcK = r * K;
    for (let d = 0; d < K; d++) {
      out.dq[dstK + d] = a.dq[srcK + d];
      out.dk[dstK + d] = a.dk[srcK + d];
      out.dg[dstK + d] = a.dg[srcK + d];
    }
    const dstV = token * V, srcV = r * V;
    for (let j = 0; j < V; j++) out.dv[dstV + j] = a.dv[srcV + j];
    out.dbeta[token] = a.dbeta[r];
  }
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

/**
 * Chunked KDA forward (DESIGN.md 2.2) on the CPU.
 *
 * Splits each sequence into chunks of `chunkSize` tokens (the last may be short), computes every
 * chunk's intra-chunk part in closed form and carries one K×V state from chunk to chunk. Equals
 * the plain recurrence of DESIGN.md 2.1 up to rounding. Work and memory are linear in T.
 *
 * @param x The raw inputs; q, k, g `[B,T,H,K]`, v `[B,T,H,V]`, beta `[B,T,H]`, optional h0
 *   `[B,H,K,V]`, all of one element type.
 * @param options `chunkSize` (16, 32 or 64); `saveStates` to also return the chunk-start states
 *   that {@linkcode chunkBackward} needs.
 * @returns `o` `[B,T,H,V]`, the final state `ht` `[B,H,K,V]` and, when `saveStates` is set,
 *   `states` `[B,H,NC,K,V]` with NC = ceil(T / chunkSize): the state at the start of every chunk.
 *   Arrays have the element type of `x.q`.
 * @throws {RangeError} When `chunkSize` is not 16, 32 or 64, or an array has the wrong length.
 *
 * @example Forward of a tiny problem, keeping the states for the backward
 * ```ts
 * import { chunkBackward, chunkForward } from "./chunk.ts";
 *
 * const B = 1, T = 20, H = 1, K = 4, V = 4;
 * const x = {
 *   B, T, H, K, V, scale: 1 / Math.sqrt(K),
 *   q: new Float64Array(B * T * H * K).fill(0.1),
 *   k: new Float64Array(B * T * H * K).fill(0.5),
 *   v: new Float64Array(B * T * H * V).fill(1),
 *   g: new Float64Array(B * T * H * K).fill(-0.1),
 *   beta: new Float64Array(B * T * H).fill(0.5),
 * };
 * const { o, ht, states } = chunkForward(x, { chunkSize: 16, saveStates: true });
 * console.log(o.length, ht.length, states?.length); // 80 16 32
 *
 * // Later, the backward needs nothing but the inputs and these chunk-start states.
 * const dout = new Float64Array(o.length).fill(1);
 * const { dh0 } = chunkBackward(x, states!, { dout }, { chunkSize: 16 });
 * console.log(dh0.length); // 16
 * ```
 */
export function chunkForward(
  x: RawKda,
  options: { chunkSize: ChunkSize; saveStates?: boolean },
): { o: Float; ht: Float; states?: Float } {
  const C = options.chunkSize;
  checkChunkSize("options.chunkSize", C);
  checkInputs(x);
  const { B, T, H, K, V } = x;
  const NC = Math.ceil(T / C), KV = K * V;
  const o = allocLike(x.q, B * T * H * V);
  const ht = allocLike(x.q, B * H * KV);
  const states = options.saveStates ? allocLike(x.q, B * H * NC * KV) : undefined;
  const w = new ChunkWork(C, K, V, x.scale);
  const S = w.state;

  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const bh = b * H + h;
      if (x.h0 !== undefined) { for (let i = 0; i < KV; i++) S[i] = x.h0[bh * KV + i]; }
      else S.fill(0);
      for (let c = 0; c < NC; c++) {
        const t0 = c * C;
        w.n = Math.min(C, T - t0);
        if (states !== undefined) states.set(S, (bh * NC + c) * KV);
        prepareChunk(x, b, h, t0, w);
        newValues(w);
        chunkOutput(w);
        for (let r = 0; r < w.n; r++) {
          const dst = ((b * T + t0 + r) * H + h) * V;
          for (let j = 0; j < V; j++) o[dst + j] = w.O[r * V + j];
        }
        stateScan(w);
      }
      ht.set(S, bh * KV);
    }
  }
  return states !== undefined ? { o, ht, states } : { o, ht };
}

/**
 * Hand-written chunked KDA backward (DESIGN.md 2.3) on the CPU.
 *
 * Walks the chunks of each sequence in reverse order; for each one it recomputes the intra-chunk
 * quantities from the inputs and the saved chunk-start state, then pulls the output cotangent and
 * the state cotangent arriving at the chunk end back to the chunk's inputs and its start state.
 * Nothing of size T×T or C×C is saved between the passes: only `states`.
 *
 * @param x The same raw inputs that were given to {@linkcode chunkForward}.
 * @param states The chunk-start states `[B,H,NC,K,V]` returned by `chunkForward` with
 *   `saveStates: true` and the same `chunkSize`.
 * @param cotangents `dout` `[B,T,H,V]` and optional `dht` `[B,H,K,V]` (absent means zero).
 * @param options `chunkSize`: 16, 32 or 64, as in the forward.
 * @returns `dq, dk, dv, dg, dbeta, dh0` in the layouts of the inputs (`dh0` `[B,H,K,V]` always,
 *   whether or not `x.h0` was given), with the element type of `x.q`.
 * @throws {RangeError} When `chunkSize` is not 16, 32 or 64, or an array has the wrong length.
 *
 * @example Gradients of a tiny random problem
 * ```ts
 * import { chunkBackward, chunkForward } from "./chunk.ts";
 *
 * const B = 1, T = 20, H = 1, K = 4, V = 4;
 * const x = {
 *   B, T, H, K, V, scale: 1 / Math.sqrt(K),
 *   q: new Float64Array(B * T * H * K).fill(0.1),
 *   k: new Float64Array(B * T * H * K).fill(0.5),
 *   v: new Float64Array(B * T * H * V).fill(1),
 *   g: new Float64Array(B * T * H * K).fill(-0.1),
 *   beta: new Float64Array(B * T * H).fill(0.5),
 * };
 * const { states } = chunkForward(x, { chunkSize: 16, saveStates: true });
 * const dout = new Float64Array(B * T * H * V).fill(1);
 * const grads = chunkBackward(x, states!, { dout }, { chunkSize: 16 });
 * console.log(grads.dq.length, grads.dh0.length); // 80 16
 * ```
 */
export function chunkBackward(
  x: RawKda,
  states: Float,
  cotangents: RawCotangents,
  options: { chunkSize: ChunkSize },
): RawGrads {
  const C = options.chunkSize;
  checkChunkSize("options.chunkSize", C);
  checkInputs(x);
  const { B, T, H, K, V } = x;
  const NC = Math.ceil(T / C), KV = K * V;
  checkLength("states", states, "B·H·NC·K·V", B * H * NC * KV);
  const { dout, dht } = cotangents;
  checkLength("dout", dout, "B·T·H·V", B * T * H * V);
  if (dht !== undefined) checkLength("dht", dht, "B·H·K·V", B * H * KV);

  const grads: RawGrads = {
    dq: allocLike(x.q, B * T * H * K),
    dk: allocLike(x.q, B * T * H * K),
    dv: allocLike(x.q, B * T * H * V),
    dg: allocLike(x.q, B * T * H * K),
    dbeta: allocLike(x.q, B * T * H),
    dh0: allocLike(x.q, B * H * KV),
  };
  const w = new ChunkWork(C, K, V, x.scale);
  const a = new ChunkAdjoints(C, K, V);

  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const bh = b * H + h;
      if (dht !== undefined) { for (let i = 0; i < KV; i++) a.dStateEnd[i] = dht[bh * KV + i]; }
      else a.dStateEnd.fill(0);
      for (let c = NC - 1; c >= 0; c--) {
        const t0 = c * C;
        w.n = Math.min(C, T - t0);
        const stateOffset = (bh * NC + c) * KV;
        for (let i = 0; i < KV; i++) w.state[i] = states[stateOffset + i];
        // Recompute the forward of this chunk from its start state.
        prepareChunk(x, b, h, t0, w);
        newValues(w);
        gatherOutputGrad(dout, x, b, h, t0, w, a);
        // Pull the cotangents back through the chunk.
        stateScanBackward(w, a);
        chunkOutputBackward(w, a);
        newValuesBackward(w, a);
        wyBackward(w, a);
        inverseBackward(w, a);
        elementwiseGrads(w, a);
        pairwiseGrads(w, a);
        gateCumsumBackward(w, a);
        scatterGrads(x, b, h, t0, w, a, grads);
        // The start state's cotangent arrives at the end of the previous chunk.
        const dStart = a.dStateStart;
        a.dStateStart = a.dStateEnd;
        a.dStateEnd = dStart;
      }
      grads.dh0.set(a.dStateEnd, bh * KV);
    }
  }
  return grads;
}
