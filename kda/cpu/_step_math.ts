// The cpu arm's decode: the recurrence of docs/kda.md 2.1 over T ≥ 1 tokens per sequence from a
// given state, on the host in f64 (no chunk scratch: a chunk of one row is this recurrence,
// docs/kda.md 2.2 step 4). Inference only.

import type { Float, KdaProblem } from "../_types.ts";

/**
 * The recurrence (docs/kda.md 2.1) token by token for every sequence and head, in f64:
 * S̃ = diag(e^g) S;  u = β (v − S̃ᵀk);  S' = S̃ + k uᵀ;  o = S'ᵀ (scale q).
 *
 * @param x A regular (unpacked) problem, one query/key head per value head; h0 the state before
 *   the first token (zeros when absent).
 * @returns `o` [B, T, H, V] and the state after the last token `ht` [B, H, K, V], of the type of
 *   `x.q`.
 *
 * @example
 * ```ts
 * import { recurrentForward } from "./_step_math.ts";
 * const one = (n: number, v: number) => new Float64Array(n).fill(v);
 * const { o } = recurrentForward({
 *   B: 1, T: 1, H: 1, K: 2, V: 2, scale: 1,
 *   q: one(2, 1), k: one(2, 0.5), v: one(2, 1), g: one(2, 0), beta: one(1, 1),
 * });
 * console.log(o); // Float64Array [0.5, 0.5]
 * ```
 */
export function recurrentForward(x: KdaProblem): { o: Float; ht: Float } {
  const { B, T, H, K, V, scale } = x;
  if (x.cuSeqlens !== undefined || (x.HV !== undefined && x.HV !== H)) {
    throw new Error(
      "internal: recurrentForward expects regular sequences, one head per value head",
    );
  }
  const like = x.q instanceof Float32Array ? Float32Array : Float64Array;
  const o = new like(B * T * H * V), ht = new like(B * H * K * V);
  const S = new Float64Array(K * V), u = new Float64Array(V);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < H; h++) {
      const kv = (b * H + h) * K * V;
      for (let e = 0; e < K * V; e++) S[e] = x.h0 === undefined ? 0 : x.h0[kv + e];
      for (let t = 0; t < T; t++) {
        const row = (b * T + t) * H + h, kOff = row * K, vOff = row * V;
        // Decay, then the decayed memory's answer for k.
        for (let d = 0; d < K; d++) {
          const a = Math.exp(x.g[kOff + d]);
          for (let j = 0; j < V; j++) S[d * V + j] *= a;
        }
        const beta = x.beta[row];
        for (let j = 0; j < V; j++) {
          let pred = 0;
          for (let d = 0; d < K; d++) pred += S[d * V + j] * x.k[kOff + d];
          u[j] = beta * (x.v[vOff + j] - pred);
        }
        // Write the correction along k, then read with the scaled query.
        for (let d = 0; d < K; d++) {
          const kd = x.k[kOff + d];
          for (let j = 0; j < V; j++) S[d * V + j] += kd * u[j];
        }
        for (let j = 0; j < V; j++) {
          let acc = 0;
          for (let d = 0; d < K; d++) acc += S[d * V + j] * (scale * x.q[kOff + d]);
          o[vOff + j] = acc;
        }
      }
      for (let e = 0; e < K * V; e++) ht[kv + e] = S[e];
    }
  }
  return { o, ht };
}
