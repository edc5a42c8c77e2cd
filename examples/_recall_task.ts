// The synthetic associative-recall task of examples/recall.ts: P key–value pairs, then the P keys
// again as queries in a shuffled order; at each query the target is the value paired with its key.
// Tokens enter the layer through a fixed seeded random embedding; a trained linear readout maps the
// layer's output to value logits, with its cross-entropy gradient written out by hand.

import { mulberry32 } from "../kda/layer/_random.ts";

/** Seeded uniform numbers in [0, 1) (the package's mulberry32). */
export const uniform: (seed: number) => () => number = mulberry32;

/** The task's sizes. */
export interface RecallShape {
  /** Distinct key tokens. */
  keys: number;
  /** Distinct value tokens (the readout's classes). */
  values: number;
  /** Key–value pairs per sequence (then as many queries). */
  pairs: number;
  /** Model width D. */
  dModel: number;
}

/** A batch: token ids [B, T], query positions and their target values. */
export interface RecallBatch {
  /** Sequences in the batch. */
  B: number;
  /** Tokens per sequence: 3 · pairs. */
  T: number;
  /** Token ids, [B, T]: keys are 0 … keys − 1, values keys … keys + values − 1. */
  tokens: Int32Array;
  /** Flat positions b·T + t of the queries. */
  queries: Int32Array;
  /** The value (0 … values − 1) each query must recall. */
  targets: Int32Array;
}

/**
 * A batch of sequences `k1 v1 k2 v2 … kP vP q1 … qP`: distinct keys, values drawn with repeats,
 * and the queries a permutation of the keys.
 */
export function makeBatch(s: RecallShape, B: number, rand: () => number): RecallBatch {
  const P = s.pairs, T = 3 * P;
  const tokens = new Int32Array(B * T), queries = new Int32Array(B * P);
  const targets = new Int32Array(B * P);
  const pick = (n: number) => Math.floor(rand() * n);
  for (let b = 0; b < B; b++) {
    const keys = Array.from({ length: s.keys }, (_, i) => i);
    for (let i = keys.length - 1; i > 0; i--) {
      const j = pick(i + 1);
      [keys[i], keys[j]] = [keys[j], keys[i]];
    }
    const value = new Map<number, number>();
    for (let p = 0; p < P; p++) {
      const v = pick(s.values);
      value.set(keys[p], v);
      tokens[b * T + 2 * p] = keys[p];
      tokens[b * T + 2 * p + 1] = s.keys + v;
    }
    const order = keys.slice(0, P);
    for (let i = order.length - 1; i > 0; i--) {
      const j = pick(i + 1);
      [order[i], order[j]] = [order[j], order[i]];
    }
    for (let p = 0; p < P; p++) {
      const pos = b * T + 2 * P + p;
      tokens[pos] = order[p];
      queries[b * P + p] = pos;
      targets[b * P + p] = value.get(order[p])!;
    }
  }
  return { B, T, tokens, queries, targets };
}

/** The fixed embedding table, [keys + values, D], entries N(0, 1). */
export function makeEmbedding(s: RecallShape, seed: number): Float64Array {
  const rand = uniform(seed);
  const e = new Float64Array((s.keys + s.values) * s.dModel);
  for (let i = 0; i < e.length; i++) {
    e[i] = Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
  }
  return e;
}

/** x = embedding[token], [B, T, D], in the layer's element type. */
export function embed<F extends Float64Array | Float32Array>(
  batch: RecallBatch,
  embedding: Float64Array,
  D: number,
  make: (n: number) => F,
): F {
  const x = make(batch.tokens.length * D);
  for (let i = 0; i < batch.tokens.length; i++) {
    x.set(embedding.subarray(batch.tokens[i] * D, (batch.tokens[i] + 1) * D), i * D);
  }
  return x;
}

/** The loss, accuracy and gradients of the readout's cross-entropy on the query positions. */
export interface ReadoutResult {
  /** Mean cross-entropy over the queries (nats). */
  loss: number;
  /** Fraction of queries whose arg-max logit is the target. */
  accuracy: number;
  /** dL/dy for the layer, [B, T, D] (zero off the query positions). */
  dy: Float64Array;
  /** dL/dW of the readout weight [values, D]. */
  dW: Float64Array;
  /** dL/db of the readout bias [values]. */
  db: Float64Array;
}

/**
 * logits = y_q Wᵀ + b at each query q; L = mean over queries of −log softmax(logits)[target].
 * By hand: dL/dlogits = (softmax − onehot) / N, dW = Σ_q dlogits_qᵀ y_q, db = Σ_q dlogits_q and
 * dL/dy_q = dlogits_q W.
 */
export function readout(
  y: Float64Array | Float32Array,
  batch: RecallBatch,
  W: Float64Array | Float32Array,
  bias: Float64Array | Float32Array,
  D: number,
): ReadoutResult {
  const C = bias.length, N = batch.queries.length;
  const dy = new Float64Array(y.length), dW = new Float64Array(W.length);
  const db = new Float64Array(C), logits = new Float64Array(C);
  let loss = 0, correct = 0;
  for (let n = 0; n < N; n++) {
    const row = batch.queries[n] * D, target = batch.targets[n];
    let max = -Infinity, best = 0;
    for (let c = 0; c < C; c++) {
      let s = bias[c];
      for (let d = 0; d < D; d++) s += W[c * D + d] * y[row + d];
      logits[c] = s;
      if (s > max) max = s, best = c;
    }
    if (best === target) correct++;
    let z = 0;
    for (let c = 0; c < C; c++) z += Math.exp(logits[c] - max);
    loss += Math.log(z) + max - logits[target];
    for (let c = 0; c < C; c++) {
      const g = (Math.exp(logits[c] - max) / z - (c === target ? 1 : 0)) / N;
      db[c] += g;
      for (let d = 0; d < D; d++) {
        dW[c * D + d] += g * y[row + d];
        dy[row + d] += g * W[c * D + d];
      }
    }
  }
  return { loss: loss / N, accuracy: correct / N, dy, dW, db };
}
