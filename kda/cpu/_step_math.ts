// The cpu arm's decode step: the recurrence of docs/kda.md 2.1 for one token per sequence, on the
// host in f64 (no chunk scratch: a chunk of one row is this recurrence, docs/kda.md 2.2 step 4).

import type { Float, KdaProblem } from "../_types.ts";

/**
 * One token of the recurrence (docs/kda.md 2.1) for every sequence and head, in f64:
 * S̃ = diag(e^g) S;  u = β (v − S̃ᵀk);  S' = S̃ + k uᵀ;  o = S'ᵀ (scale q).
 *
 * @param x A problem with T = 1 (h0 the state before the token; zeros when absent).
 * @returns `o` [B, 1, H, V] and the state after the token `ht` [B, H, K, V], of the type of `x.q`.
 *
 * @example
 * ```ts
 * import { stepForward } from "./_step_math.ts";
 * const one = (n: number, v: number) => new Float64Array(n).fill(v);
 * const { o } = stepForward({
 *   B: 1, T: 1, H: 1, K: 2, V: 2, scale: 1,
 *   q: one(2, 1), k: one(2, 0.5), v: one(2, 1), g: one(2, 0), beta: one(1, 1),
 * });
 * console.log(o); // Float64Array [0.5, 0.5]
 * ```
 */
export function stepForward(x: KdaProblem): { o: Float; ht: Float } {
  const { B, T, H, K, V, scale } = x;
  if (T !== 1 || x.cuSeqlens !== undefined) {
    throw new Error(`internal: stepForward expected one token per regular sequence, got T = ${T}`);
  }
  const like = x.q instanceof Float32Array ? Float32Array : Float64Array;
  const o = new like(B * H * V), ht = new like(B * H * K * V);
  const S = new Float64Array(K * V), u = new Float64Array(V);
  for (let bh = 0; bh < B * H; bh++) {
    const kv = bh * K * V, kOff = bh * K, vOff = bh * V;
    // Decay, then the decayed memory's answer for k.
    for (let d = 0; d < K; d++) {
      const a = Math.exp(x.g[kOff + d]);
      for (let j = 0; j < V; j++) S[d * V + j] = x.h0 === undefined ? 0 : a * x.h0[kv + d * V + j];
    }
    const beta = x.beta[bh];
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
    for (let e = 0; e < K * V; e++) ht[kv + e] = S[e];
  }
  return { o, ht };
}
