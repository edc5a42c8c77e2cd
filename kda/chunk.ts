// Chunked KDA on the CPU: the forward of docs/kda.md 2.2 and the hand-written backward of 2.3.
//
// This file is the readable blueprint of kda/chunk.wgsl. Every stage below is one small function
// whose name the WGSL kernels reuse, working on one chunk of one (batch, head) pair:
//
//   forward, per chunk in order:     gatherChunk → gateFactors → pairwiseDecay → intraChunk →
//                                    newValues → chunkOutput → stateScan
//   backward, per chunk in reverse:  the same forward stages up to newValues (recomputed from the
//                                    saved chunk-start state), then stateScanBackward →
//                                    chunkOutputBackward → newValuesBackward → wyBackward →
//                                    inverseBackward → elementwiseGrads → pairwiseGrads →
//                                    gateCumsumBackward
//
// Notation follows docs/kda.md 2.2: a chunk has n ≤ C valid rows (only the last chunk may be short,
// and then γ_C is its last VALID row), G is the chunk-local cumulative log decay, Γ = e^G,
// E_rsd = e^{G_rd − G_sd} (r ≥ s), Kβ = diag(β)(K ⊙ Γ), Vβ = diag(β)V, Kd = K ⊙ e^{G_C − G}.
//
// Gate factors: G itself is never formed, nor any difference of two gate sums. A difference
// G_r − G_s of cumulative sums would lose every small gate after a huge one (−1e20 swallows −0.5),
// and give −Inf − (−Inf) = NaN once a sum overflows (two gates of −1e308). Instead every factor
// is a running product of the per-token decays a_t = e^{g_t} ∈ [0, 1] over exactly the tokens it
// spans, as the recurrence itself multiplies them: Γ_r = a_0 ⋯ a_r, e^{G_C − G_r} = a_{r+1} ⋯ a_C,
// E_rs = a_{s+1} ⋯ a_r. No factor exceeds 1, none overflows, and a huge gate just gives 0.
// The backward still differentiates through G (dG, then dg as its reverse cumulative sum,
// docs/kda.md 2.3) but only multiplies by these same factor tables, so it never forms G either.
//
// All arithmetic is in JS numbers (f64); only the outputs are rounded to the input element type.
// Every reduction is a plain loop in a fixed order, so the same inputs give the same bits.

import type { ChunkSize, Float, KdaCotangents, KdaGrads, KdaProblem } from "./_types.ts";
import { matmulAdd } from "./cpu/_matmul.ts";
import { ChunkAdjoints, ChunkWork } from "./cpu/_chunk_work.ts";
import { type Sequences, sequencesOf } from "./cpu/varlen.ts";

// ---------------------------------------------------------------------------------------------
// Internal assertions: the public boundary (kda/_check.ts) has validated everything already
// ---------------------------------------------------------------------------------------------

/** Throws an internal error when `ok` is false: a broken caller, never a user's mistake. */
function assert(ok: boolean, what: string): void {
  if (!ok) throw new Error(`internal: chunk.ts expected ${what}`);
}

/** Asserts the chunk size and every array length against the problem's dimensions. */
function assertProblem(x: KdaProblem, C: number): void {
  const { B, T, H, K, V } = x;
  assert(C === 16 || C === 32 || C === 64, `a chunk size of 16, 32 or 64, got ${C}`);
  const ntk = B * T * H * K;
  const N = x.cuSeqlens === undefined ? B : x.cuSeqlens.length - 1;
  assert(
    x.q.length === ntk && x.k.length === ntk && x.g.length === ntk &&
      x.v.length === B * T * H * V && x.beta.length === B * T * H &&
      (x.h0 === undefined || x.h0.length === N * H * K * V),
    "arrays of the lengths given by B, T, H, K, V and the sequences",
  );
  assert(x.HV === undefined || x.HV === H, "value heads expanded before the arm (HV = H)");
  const cu = x.cuSeqlens;
  assert(
    cu === undefined || (B === 1 && cu.length >= 2 && cu[0] === 0 && cu[cu.length - 1] === T),
    "cuSeqlens from 0 to T with B = 1",
  );
}

/**
 * Points the scratch at chunk c of head h of sequence i: its valid rows and where its tokens lie.
 * Chunks restart at every sequence start, so none crosses a sequence boundary (docs/kda.md 2.6).
 */
function enterChunk(
  x: KdaProblem,
  seqs: Sequences,
  i: number,
  h: number,
  c: number,
  w: ChunkWork,
): void {
  const t0 = c * w.C;
  w.n = Math.min(w.C, seqs.length[i] - t0);
  w.token0 = (seqs.start[i] + t0) * x.H + h;
  w.tokenStride = x.H;
}

/**
 * Offset of the chunk-start state of chunk c of head h of sequence i in the saved states: each
 * sequence's block is [H, NCᵢ, K, V], so a regular batch keeps its [B, H, NC, K, V] layout.
 */
function stateIndex(seqs: Sequences, i: number, h: number, c: number, w: ChunkWork, H: number) {
  const NC = Math.ceil(seqs.length[i] / w.C);
  return (seqs.chunk0[i] * H + h * NC + c) * w.K * w.V;
}

/** A zeroed array of `length` elements with the element type of `like`. */
function allocLike(like: Float, length: number): Float {
  return like instanceof Float32Array ? new Float32Array(length) : new Float64Array(length);
}

// ---------------------------------------------------------------------------------------------
// Forward stages (docs/kda.md 2.2)
// ---------------------------------------------------------------------------------------------

/** Copies rows t0 .. t0+n−1 of head (b, h) out of the strided [B,T,H,·] inputs. */
function gatherChunk(x: KdaProblem, w: ChunkWork): void {
  const { K, V } = x;
  const { n, q, k, v, g, beta, token0, tokenStride } = w;
  for (let r = 0; r < n; r++) {
    const token = token0 + r * tokenStride;
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

/**
 * The per-token decays a_t = e^{g_t}, then Γ_r = a_0 ⋯ a_r (decay from the chunk start) and
 * e^{G_C − G_r} = a_{r+1} ⋯ a_C (decay from row r to the chunk end) as running products, then the
 * gated operands Q ⊙ Γ, Kβ = diag(β)(K ⊙ Γ), Vβ = diag(β)V and Kd = K ⊙ e^{G_C − G}.
 */
function gateFactors(w: ChunkWork): void {
  const { n, K, V, q, k, v, g, beta, decay: a, gamma, decayToEnd } = w;
  const { qGamma, kBeta, vBeta, kDecayed } = w;
  for (let i = 0; i < n * K; i++) a[i] = Math.exp(g[i]);
  for (let d = 0; d < K; d++) gamma[d] = a[d];
  for (let i = K; i < n * K; i++) gamma[i] = gamma[i - K] * a[i];
  const last = (n - 1) * K;
  for (let d = 0; d < K; d++) decayToEnd[last + d] = 1;
  for (let i = last - 1; i >= 0; i--) decayToEnd[i] = decayToEnd[i + K] * a[i + K];
  for (let r = 0; r < n; r++) {
    const br = beta[r];
    for (let d = 0; d < K; d++) {
      const i = r * K + d;
      qGamma[i] = q[i] * gamma[i];
      kBeta[i] = br * k[i] * gamma[i];
      kDecayed[i] = k[i] * decayToEnd[i];
    }
    for (let j = 0; j < V; j++) vBeta[r * V + j] = br * v[r * V + j];
  }
}

/** Offset of E_rs (s ≤ r) in the packed lower-inclusive triangle of K-vectors. */
function pairOffset(r: number, s: number, K: number): number {
  return ((r * (r + 1)) / 2 + s) * K;
}

/**
 * E_rsd = a_{s+1},d ⋯ a_rd = e^{g_{s+1},d + … + g_rd} for r ≥ s: the decay from token s to token r,
 * built from the diagonal (E_rr = 1) towards s = 0 as E_rs = E_r,s+1 ⊙ a_{s+1}.
 */
function pairwiseDecay(w: ChunkWork): void {
  const { n, K, E, decay: a } = w;
  for (let r = 0; r < n; r++) {
    const diag = pairOffset(r, r, K);
    E.fill(1, diag, diag + K); // no decay from a token to itself
    for (let s = r - 1; s >= 0; s--) {
      const e = pairOffset(r, s, K), as = (s + 1) * K;
      for (let d = 0; d < K; d++) E[e + d] = E[e + K + d] * a[as + d];
    }
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
  matmulAdd("AB", W, K, T, C, kBeta, K, { m: n, n: K, p: n, lowerA: true });
  matmulAdd("AB", U, V, T, C, vBeta, V, { m: n, n: V, p: n, lowerA: true });
}

/** Vn = U − W S: the chunk's values minus what the chunk-start state already predicts. */
function newValues(w: ChunkWork): void {
  const { n, K, V, W, U, Vn, state: S } = w;
  for (let i = 0; i < n * V; i++) Vn[i] = U[i];
  matmulAdd("AB", Vn, V, W, K, S, V, { m: n, n: V, p: K, alpha: -1 });
}

/** O = scale (Q ⊙ Γ) S + P Vn: the inter-chunk read of S plus the causal intra-chunk part. */
function chunkOutput(w: ChunkWork): void {
  const { n, C, K, V, scale, qGamma, P, Vn, O, state: S } = w;
  O.fill(0, 0, n * V);
  matmulAdd("AB", O, V, qGamma, K, S, V, { m: n, n: V, p: K, alpha: scale });
  matmulAdd("AB", O, V, P, C, Vn, V, { m: n, n: V, p: n, lowerA: true });
}

/** One step of the inter-chunk scan, in place: S ← diag(γ_C) S + Kdᵀ Vn. */
function stateScan(w: ChunkWork): void {
  const { n, K, V, gamma, kDecayed, Vn, state: S } = w;
  const last = (n - 1) * K;
  for (let d = 0; d < K; d++) {
    const gl = gamma[last + d], dV = d * V;
    for (let j = 0; j < V; j++) S[dV + j] *= gl;
  }
  matmulAdd("AtB", S, V, kDecayed, K, Vn, V, { m: K, n: V, p: n });
}

/** Everything of one chunk that depends only on its inputs (not on S): shared by both passes. */
function prepareChunk(x: KdaProblem, w: ChunkWork): void {
  gatherChunk(x, w);
  gateFactors(w);
  pairwiseDecay(w);
  intraChunk(w);
}

// ---------------------------------------------------------------------------------------------
// Backward stages (docs/kda.md 2.3, in the order listed there)
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
  matmulAdd("ABt", dKd, K, Vn, V, dSe, V, { m: n, n: K, p: V });
  dVn.fill(0, 0, n * V);
  matmulAdd("AB", dVn, V, kDecayed, K, dSe, V, { m: n, n: V, p: K });
}

/**
 * From O = scale (Q ⊙ Γ) S + P Vn:
 *   dQΓ = scale dO Sᵀ,  dS += scale (Q ⊙ Γ)ᵀ dO,  dP = lower_incl(dO Vnᵀ),  dVn += Pᵀ dO.
 */
function chunkOutputBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, C, K, V, scale, qGamma, P, Vn, state: S } = w;
  const { dO, dStateStart: dS, dQGamma, dP, dVn } = a;
  dQGamma.fill(0, 0, n * K);
  matmulAdd("ABt", dQGamma, K, dO, V, S, V, { m: n, n: K, p: V, alpha: scale });
  matmulAdd("AtB", dS, V, qGamma, K, dO, V, { m: K, n: V, p: n, alpha: scale });
  dP.fill(0, 0, n * C);
  matmulAdd("ABt", dP, C, dO, V, Vn, V, { m: n, n: n, p: V, out: "lower" });
  matmulAdd("AtB", dVn, V, P, C, dO, V, { m: n, n: V, p: n, lowerA: true });
}

/** From Vn = U − W S:  dU = dVn (kept in dVn),  dW = −dVn Sᵀ,  dS −= Wᵀ dVn. */
function newValuesBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, K, V, W, state: S } = w;
  const { dVn, dW, dStateStart: dS } = a;
  dW.fill(0, 0, n * K);
  matmulAdd("ABt", dW, K, dVn, V, S, V, { m: n, n: K, p: V, alpha: -1 });
  matmulAdd("AtB", dS, V, W, K, dVn, V, { m: K, n: V, p: n, alpha: -1 });
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
  matmulAdd("ABt", dT, C, dW, K, kBeta, K, { m: n, n: n, p: K, out: "strictLower" });
  matmulAdd("ABt", dT, C, dU, V, vBeta, V, { m: n, n: n, p: V, out: "strictLower" });
  dKBeta.fill(0, 0, n * K);
  matmulAdd("AtB", dKBeta, K, T, C, dW, K, { m: n, n: K, p: n, lowerA: true });
  dVBeta.fill(0, 0, n * V);
  matmulAdd("AtB", dVBeta, V, T, C, dU, V, { m: n, n: V, p: n, lowerA: true });
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
 *   dG = (dQΓ ⊙ Q + β ⊙ dKβ ⊙ K) ⊙ Γ,  dG_C += dγ_C ⊙ γ_C   (G_C is the last valid row),
 *   x_r = dKd_r ⊙ K_r ⊙ e^{G_C − G_r}   (kept apart in dGateToEnd).
 * Through Kd, x_r enters dG_r with a minus and dG_C with a plus (docs/kda.md 2.3). Both would
 * reach every dg_t with t ≤ r, where they cancel: for the last row, whose factor is e^0 = 1, an
 * O(1) term cancelling to a rounding error that swamps a true gradient of e^{−50}. So x_r is not
 * added to dG; gateCumsumBackward adds it to exactly the gates it depends on, those after row r.
 */
function elementwiseGrads(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, K, V, q, k, v, beta, gamma, decayToEnd } = w;
  const { dQGamma, dKBeta, dVBeta, dKd, dGammaLast, dq, dk, dv, dG, dGateToEnd, dbeta } = a;
  for (let r = 0; r < n; r++) {
    const rK = r * K, rV = r * V, br = beta[r];
    let db = 0;
    for (let d = 0; d < K; d++) {
      const i = rK + d;
      dq[i] = dQGamma[i] * gamma[i];
      dk[i] = br * dKBeta[i] * gamma[i] + dKd[i] * decayToEnd[i];
      db += dKBeta[i] * k[i] * gamma[i];
      dG[i] = (dQGamma[i] * q[i] + br * dKBeta[i] * k[i]) * gamma[i];
      dGateToEnd[i] = dKd[i] * k[i] * decayToEnd[i];
    }
    for (let j = 0; j < V; j++) {
      dv[rV + j] = br * dVBeta[rV + j];
      db += dVBeta[rV + j] * v[rV + j];
    }
    dbeta[r] = db;
  }
  // γ_C = e^{G_C} decays the whole chunk: its gradient reaches every gate of the chunk.
  const last = (n - 1) * K;
  for (let d = 0; d < K; d++) dG[last + d] += dGammaLast[d] * gamma[last + d];
}

/**
 * The pairwise pieces through E_rsd = e^{G_rd − G_sd}, over both ends of every pair
 * (r > s for L, r ≥ s for P), per channel d:
 *   XL = dL_rs β_r K_rd K_sd E_rsd,  XP = scale dP_rs Q_rd K_sd E_rsd,
 *   dβ_r += Σ dL_rs K_rd K_sd E_rsd,  dK_r += β_r dL_rs K_s ⊙ E_rs,  dK_s += β_r dL_rs K_r ⊙ E_rs,
 *   dQ_r += scale dP_rs K_s ⊙ E_rs,   dK_s += scale dP_rs Q_r ⊙ E_rs,
 *   X_rs = XL + XP  (kept in dGatePair: E_rs depends on the gates s+1 … r alone).
 * On the diagonal (r = s) E is 1 and has no gate dependence, so only dQ and dK receive P terms.
 * X_rs would enter dG_r with a plus and dG_s with a minus, cancelling in every dg_t with t ≤ s;
 * gateCumsumBackward instead adds it to exactly the gates s < t ≤ r it depends on.
 */
function pairwiseGrads(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, C, K, scale, q, k, beta, E } = w;
  const { dL, dP, dq, dk, dGatePair, dbeta } = a;
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
        dGatePair[e + d] = x;
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

/**
 * G is the cumulative sum of g, so a gradient dG_r reaches every gate t ≤ r of the chunk; a factor
 * spanning the gates t0 … t1 (x_r of Kd: r+1 … C; X_rs of E: s+1 … r) reaches exactly those:
 *   dg_t = Σ_{r ≥ t} dG_r + Σ_{r < t} x_r + Σ_{s < t ≤ r} X_rs.
 * Every term is one the gate truly feeds, so nothing is added at one row and taken away at another
 * (docs/kda.md 2.3), and each sum runs in one fixed order. G itself is never formed.
 */
function gateCumsumBackward(w: ChunkWork, a: ChunkAdjoints): void {
  const { n, K } = w;
  const { dG, dGateToEnd: x, dGatePair: X, dg } = a;
  const last = (n - 1) * K;
  for (let d = 0; d < K; d++) dg[last + d] = dG[last + d];
  for (let r = n - 2; r >= 0; r--) {
    for (let d = 0; d < K; d++) dg[r * K + d] = dg[(r + 1) * K + d] + dG[r * K + d];
  }
  for (let d = 0; d < K; d++) {
    let before = 0;
    for (let t = 1; t < n; t++) {
      before += x[(t - 1) * K + d];
      dg[t * K + d] += before;
    }
  }
  // Row r of the pair table: X_r0 … X_r,r−1; gate t (1 ≤ t ≤ r) gets X_rs for s < t.
  for (let r = 1; r < n; r++) {
    const row = pairOffset(r, 0, K);
    for (let d = 0; d < K; d++) {
      let before = 0;
      for (let t = 1; t <= r; t++) {
        before += X[row + (t - 1) * K + d];
        dg[t * K + d] += before;
      }
    }
  }
}

/** Copies the chunk's output cotangent rows out of the strided [B,T,H,V] dout. */
function gatherOutputGrad(dout: Float, x: KdaProblem, w: ChunkWork, a: ChunkAdjoints): void {
  const { V } = x;
  const { dO } = a;
  for (let r = 0; r < w.n; r++) {
    const src = (w.token0 + r * w.tokenStride) * V, dst = r * V;
    for (let j = 0; j < V; j++) dO[dst + j] = dout[src + j];
  }
}

/** Writes the chunk's input gradients back to the strided [B,T,H,·] layouts. */
function scatterGrads(x: KdaProblem, w: ChunkWork, a: ChunkAdjoints, out: KdaGrads): void {
  const { K, V } = x;
  for (let r = 0; r < w.n; r++) {
    const token = w.token0 + r * w.tokenStride;
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
 * Chunked KDA forward (docs/kda.md 2.2) on the CPU.
 *
 * Splits each sequence into chunks of `chunkSize` tokens (the last may be short), computes every
 * chunk's intra-chunk part in closed form and carries one K×V state from chunk to chunk. Equals
 * the plain recurrence of docs/kda.md 2.1 up to rounding. Work and memory are linear in T.
 *
 * @param x The problem, validated by the caller: q, k, g `[B,T,H,K]`, v `[B,T,H,V]`, beta
 *   `[B,T,H]`, optional h0 `[B,H,K,V]`, all of one element type, and the resolved scale. With
 *   `cuSeqlens` (B = 1) each packed sequence runs from its own start state (h0 `[N,H,K,V]`) and
 *   its chunks restart at the sequence start (docs/kda.md 2.6), exactly as if run alone.
 * @param options `chunkSize` (16, 32 or 64); `saveStates` to also return the chunk-start states
 *   that {@linkcode chunkBackward} needs.
 * @returns `o` `[B,T,H,V]`, the final state `ht` `[B,H,K,V]` (`[N,H,K,V]` when packed) and, when
 *   `saveStates` is set, `states` `[B,H,NC,K,V]` with NC = ceil(T / chunkSize): the state at the
 *   start of every chunk (packed: one `[H,NCᵢ,K,V]` block per sequence, in order).
 *   Arrays have the element type of `x.q`.
 * @throws {Error} An internal error when the chunk size or an array length is wrong: callers
 *   validate at the public boundary, so this is a bug, not a user's mistake.
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
  x: KdaProblem,
  options: { chunkSize: ChunkSize; saveStates?: boolean },
): { o: Float; ht: Float; states?: Float } {
  const C = options.chunkSize;
  assertProblem(x, C);
  const { B, T, H, K, V } = x;
  const KV = K * V;
  const seqs = sequencesOf(x, C);
  const o = allocLike(x.q, B * T * H * V);
  const ht = allocLike(x.q, seqs.N * H * KV);
  const states = options.saveStates ? allocLike(x.q, seqs.chunks * H * KV) : undefined;
  const w = new ChunkWork(C, K, V, x.scale);
  const S = w.state;

  for (let i = 0; i < seqs.N; i++) {
    const NC = Math.ceil(seqs.length[i] / C);
    for (let h = 0; h < H; h++) {
      const ih = i * H + h;
      if (x.h0 !== undefined) { for (let e = 0; e < KV; e++) S[e] = x.h0[ih * KV + e]; }
      else S.fill(0);
      for (let c = 0; c < NC; c++) {
        enterChunk(x, seqs, i, h, c, w);
        if (states !== undefined) states.set(S, stateIndex(seqs, i, h, c, w, H));
        prepareChunk(x, w);
        newValues(w);
        chunkOutput(w);
        for (let r = 0; r < w.n; r++) {
          const dst = (w.token0 + r * H) * V;
          for (let j = 0; j < V; j++) o[dst + j] = w.O[r * V + j];
        }
        stateScan(w);
      }
      ht.set(S, ih * KV);
    }
  }
  return states !== undefined ? { o, ht, states } : { o, ht };
}

/**
 * Hand-written chunked KDA backward (docs/kda.md 2.3) on the CPU.
 *
 * Walks the chunks of each sequence in reverse order; for each one it recomputes the intra-chunk
 * quantities from the inputs and the saved chunk-start state, then pulls the output cotangent and
 * the state cotangent arriving at the chunk end back to the chunk's inputs and its start state.
 * Nothing of size T×T or C×C is saved between the passes: only `states`.
 *
 * @param x The same problem that was given to {@linkcode chunkForward}.
 * @param states The chunk-start states (`[B,H,NC,K,V]` for a regular batch) returned by `chunkForward` with
 *   `saveStates: true` and the same `chunkSize`.
 * @param cotangents `dout` `[B,T,H,V]` and optional `dht` `[B,H,K,V]` or `[N,H,K,V]` (absent
 *   means zero).
 * @param options `chunkSize`: 16, 32 or 64, as in the forward.
 * @returns `dq, dk, dv, dg, dbeta, dh0` in the layouts of the inputs (`dh0` `[B,H,K,V]` always,
 *   whether or not `x.h0` was given), with the element type of `x.q`.
 * @throws {Error} An internal error when the chunk size or an array length is wrong: callers
 *   validate at the public boundary, so this is a bug, not a user's mistake.
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
  x: KdaProblem,
  states: Float,
  cotangents: KdaCotangents,
  options: { chunkSize: ChunkSize },
): KdaGrads {
  const C = options.chunkSize;
  assertProblem(x, C);
  const { B, T, H, K, V } = x;
  const KV = K * V;
  const seqs = sequencesOf(x, C);
  const { dout, dht } = cotangents;
  assert(
    states.length === seqs.chunks * H * KV && dout.length === B * T * H * V &&
      (dht === undefined || dht.length === seqs.N * H * KV),
    "states, dout and dht of the lengths given by B, T, H, K, V, the sequences and the chunk size",
  );

  const grads: KdaGrads = {
    dq: allocLike(x.q, B * T * H * K),
    dk: allocLike(x.q, B * T * H * K),
    dv: allocLike(x.q, B * T * H * V),
    dg: allocLike(x.q, B * T * H * K),
    dbeta: allocLike(x.q, B * T * H),
    dh0: allocLike(x.q, seqs.N * H * KV),
  };
  const w = new ChunkWork(C, K, V, x.scale);
  const a = new ChunkAdjoints(C, K, V);

  for (let i = 0; i < seqs.N; i++) {
    const NC = Math.ceil(seqs.length[i] / C);
    for (let h = 0; h < H; h++) {
      const ih = i * H + h;
      if (dht !== undefined) { for (let e = 0; e < KV; e++) a.dStateEnd[e] = dht[ih * KV + e]; }
      else a.dStateEnd.fill(0);
      for (let c = NC - 1; c >= 0; c--) {
        enterChunk(x, seqs, i, h, c, w);
        const stateOffset = stateIndex(seqs, i, h, c, w, H);
        for (let e = 0; e < KV; e++) w.state[e] = states[stateOffset + e];
        // Recompute the forward of this chunk from its start state.
        prepareChunk(x, w);
        newValues(w);
        gatherOutputGrad(dout, x, w, a);
        // Pull the cotangents back through the chunk.
        stateScanBackward(w, a);
        chunkOutputBackward(w, a);
        newValuesBackward(w, a);
        wyBackward(w, a);
        inverseBackward(w, a);
        elementwiseGrads(w, a);
        pairwiseGrads(w, a);
        gateCumsumBackward(w, a);
        scatterGrads(x, w, a, grads);
        // The start state's cotangent arrives at the end of the previous chunk.
        const dStart = a.dStateStart;
        a.dStateStart = a.dStateEnd;
        a.dStateEnd = dStart;
      }
      grads.dh0.set(a.dStateEnd, ih * KV);
    }
  }
  return grads;
}
