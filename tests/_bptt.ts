// An independent f64 reference for the tests: the plain KDA recurrence of docs/kda.md 2.1 written
// loop by loop (no tape, no chunking), its backpropagation through time derived by hand, and a
// seeded generator of random inputs. Shared by several test files; keep the exported names.

import type { KdaCotangents, KdaGrads, KdaProblem } from "../kda/_types.ts";

/**
 * The plain KDA recurrence (docs/kda.md 2.1), one token at a time, in f64:
 * S~ = diag(e^{g_t}) S_{t−1};  S_t = S~ + β_t k_t (v_t − S~ᵀ k_t)ᵀ;  o_t = S_tᵀ (scale q_t).
 *
 * @param x Raw inputs.
 * @returns `o` [B,T,H,V], `ht` [B,H,K,V], and `states` [B,H,T,K,V] where `states[b,h,t]` is the
 *   state BEFORE token t (the initial state at t = 0).
 *
 * @example
 * ```ts ignore
 * const { o, ht } = recurrentForward(randomKda({ B: 1, T: 4, H: 1, K: 2, V: 2 }, 0));
 * ```
 */
export function recurrentForward(x: KdaProblem): {
  o: Float64Array;
  ht: Float64Array;
  states: Float64Array;
} {
  const { B, T, H, K, V, scale } = x;
  const KV = K * V;
  const o = new Float64Array(B * T * H * V);
  const ht = new Float64Array(B * H * KV);
  const states = new Float64Array(B * H * T * KV);
  const S = new Float64Array(KV);
  const u = new Float64Array(V);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const bh = b * H + h;
      for (let i = 0; i < KV; i++) S[i] = x.h0 !== undefined ? x.h0[bh * KV + i] : 0;
      for (let t = 0; t < T; t++) {
        states.set(S, (bh * T + t) * KV);
        const row = (b * T + t) * H + h;
        const kOff = row * K, vOff = row * V, beta = x.beta[row];
        // S~ = diag(a) S
        for (let d = 0; d < K; d++) {
          const a = Math.exp(x.g[kOff + d]);
          for (let j = 0; j < V; j++) S[d * V + j] *= a;
        }
        // u = v − S~ᵀ k
        for (let j = 0; j < V; j++) {
          let pred = 0;
          for (let d = 0; d < K; d++) pred += S[d * V + j] * x.k[kOff + d];
          u[j] = x.v[vOff + j] - pred;
        }
        // S = S~ + β k uᵀ
        for (let d = 0; d < K; d++) {
          const bk = beta * x.k[kOff + d];
          for (let j = 0; j < V; j++) S[d * V + j] += bk * u[j];
        }
        // o = Sᵀ (scale q)
        for (let j = 0; j < V; j++) {
          let acc = 0;
          for (let d = 0; d < K; d++) acc += S[d * V + j] * scale * x.q[kOff + d];
          o[vOff + j] = acc;
        }
      }
      ht.set(S, bh * KV);
    }
  }
  return { o, ht, states };
}

/**
 * Backpropagation through time of {@linkcode recurrentForward}, derived by hand from the
 * recurrence. Per token, in reverse, with dS the cotangent of S_t:
 *   dS += (scale q) doᵀ,  dq = scale S_t do;
 *   du = β dSᵀ k,  dβ = kᵀ dS u,  dk = β dS u;   dv = du,  dS~ = dS − k duᵀ,  dk −= S~ du;
 *   dg = a ⊙ rowsum(S_{t−1} ⊙ dS~),  dS_{t−1} = diag(a) dS~.
 *
 * @param x Raw inputs.
 * @param cotangents `dout` [B,T,H,V] and optional `dht` [B,H,K,V].
 * @returns Gradients as Float64Array, `dh0` always present.
 *
 * @example
 * ```ts ignore
 * const x = randomKda({ B: 1, T: 4, H: 1, K: 2, V: 2 }, 0);
 * const grads = recurrentBackward(x, { dout: new Float64Array(8).fill(1) });
 * ```
 */
export function recurrentBackward(x: KdaProblem, cotangents: KdaCotangents): KdaGrads {
  const { B, T, H, K, V, scale } = x;
  const KV = K * V;
  const { states } = recurrentForward(x);
  const dq = new Float64Array(B * T * H * K);
  const dk = new Float64Array(B * T * H * K);
  const dv = new Float64Array(B * T * H * V);
  const dg = new Float64Array(B * T * H * K);
  const dbeta = new Float64Array(B * T * H);
  const dh0 = new Float64Array(B * H * KV);
  const dS = new Float64Array(KV);
  const St = new Float64Array(KV); // S~ = diag(a) S_{t−1}
  const Snew = new Float64Array(KV); // S_t
  const a = new Float64Array(K);
  const u = new Float64Array(V);
  const du = new Float64Array(V);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const bh = b * H + h;
      for (let i = 0; i < KV; i++) {
        dS[i] = cotangents.dht !== undefined ? cotangents.dht[bh * KV + i] : 0;
      }
      for (let t = T - 1; t >= 0; t--) {
        const sOff = (bh * T + t) * KV; // S_{t−1}
        const row = (b * T + t) * H + h;
        const kOff = row * K, vOff = row * V, beta = x.beta[row];
        // Recompute S~, u, S_t.
        for (let d = 0; d < K; d++) {
          a[d] = Math.exp(x.g[kOff + d]);
          for (let j = 0; j < V; j++) St[d * V + j] = a[d] * states[sOff + d * V + j];
        }
        for (let j = 0; j < V; j++) {
          let pred = 0;
          for (let d = 0; d < K; d++) pred += St[d * V + j] * x.k[kOff + d];
          u[j] = x.v[vOff + j] - pred;
        }
        for (let d = 0; d < K; d++) {
          for (let j = 0; j < V; j++) {
            Snew[d * V + j] = St[d * V + j] + beta * x.k[kOff + d] * u[j];
          }
        }
        // o_t = S_tᵀ (scale q_t)
        for (let d = 0; d < K; d++) {
          let acc = 0;
          for (let j = 0; j < V; j++) {
            acc += Snew[d * V + j] * cotangents.dout[vOff + j];
            dS[d * V + j] += scale * x.q[kOff + d] * cotangents.dout[vOff + j];
          }
          dq[kOff + d] = scale * acc;
        }
        // S_t = S~ + β k uᵀ
        let db = 0;
        for (let j = 0; j < V; j++) {
          let acc = 0;
          for (let d = 0; d < K; d++) acc += x.k[kOff + d] * dS[d * V + j];
          du[j] = beta * acc;
          db += acc * u[j];
        }
        dbeta[row] = db;
        for (let d = 0; d < K; d++) {
          let acc = 0;
          for (let j = 0; j < V; j++) acc += dS[d * V + j] * u[j];
          dk[kOff + d] = beta * acc;
        }
        // u = v − S~ᵀ k  (dS now becomes dS~)
        for (let j = 0; j < V; j++) dv[vOff + j] = du[j];
        for (let d = 0; d < K; d++) {
          let acc = 0;
          for (let j = 0; j < V; j++) {
            acc += St[d * V + j] * du[j];
            dS[d * V + j] -= x.k[kOff + d] * du[j];
          }
          dk[kOff + d] -= acc;
        }
        // S~ = diag(a) S_{t−1}  (dS now becomes dS_{t−1})
        for (let d = 0; d < K; d++) {
          let acc = 0;
          for (let j = 0; j < V; j++) {
            acc += states[sOff + d * V + j] * dS[d * V + j];
            dS[d * V + j] *= a[d];
          }
          dg[kOff + d] = a[d] * acc;
        }
      }
      dh0.set(dS, bh * KV);
    }
  }
  return { dq, dk, dv, dg, dbeta, dh0 };
}
