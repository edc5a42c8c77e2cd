// The `ops` arm: the plain KDA recurrence (docs/kda.md 2.1) written with primitive tape ops, so the
// tape differentiates it with no hand-derived gradient at all. It is the slow, independent
// reference the chunked arms are checked against.

import {
  add,
  constant,
  exp,
  mul,
  reshape,
  scale,
  stack,
  sub,
  sum,
  type Tensor,
  unstack,
} from "../../tape/mod.ts";
import type { KdaDims } from "../_types.ts";

/** The op's inputs as tape tensors, in the layouts of docs/kda.md 2.1. */
export interface KdaTensors {
  /** Queries [B, T, H, K]. */
  q: Tensor;
  /** Keys [B, T, H, K]. */
  k: Tensor;
  /** Values [B, T, H, V]. */
  v: Tensor;
  /** Log decays [B, T, H, K]. */
  g: Tensor;
  /** Write strengths [B, T, H]. */
  beta: Tensor;
  /** Initial state [B, H, K, V]; zeros when absent. */
  h0?: Tensor;
}

/**
 * Runs the recurrence token by token on the tape.
 *
 * @param x q, k, g [B,T,H,K], v [B,T,H,V], beta [B,T,H], optional h0 [B,H,K,V].
 * @param dims The dimensions.
 * @param queryScale The factor on q (K^(-1/2) by default upstream).
 * @returns `o` [B,T,H,V] and the final state `ht` [B,H,K,V].
 */
export function recurrentKda(
  x: KdaTensors,
  dims: KdaDims,
  queryScale: number,
): { o: Tensor; ht: Tensor } {
  const { B, T, H, K, V } = dims;
  // Per-token pieces, shaped so that broadcasting forms the outer products over [B, H, K, V].
  const qs = unstack(x.q, 1).map((t) => reshape(scale(t, queryScale), [B, H, K, 1]));
  const ks = unstack(x.k, 1).map((t) => reshape(t, [B, H, K, 1]));
  const vs = unstack(x.v, 1).map((t) => reshape(t, [B, H, 1, V]));
  const decays = unstack(x.g, 1).map((t) => reshape(exp(t), [B, H, K, 1]));
  const betas = unstack(x.beta, 1).map((t) => reshape(t, [B, H, 1, 1]));
  let state = x.h0 ?? constant(x.q.dtype, new Float64Array(B * H * K * V), [B, H, K, V]);
  const outputs: Tensor[] = [];
  for (let t = 0; t < T; t++) {
    const decayed = mul(state, decays[t]);
    const predicted = sum(mul(decayed, ks[t]), 2, { keepDims: true });
    const delta = sub(vs[t], predicted);
    state = add(decayed, mul(mul(ks[t], betas[t]), delta));
    outputs.push(sum(mul(state, qs[t]), 2));
  }
  return { o: stack(outputs, 1), ht: state };
}
