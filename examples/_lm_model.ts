// A small KDA language model for examples/lm.ts, on one tape: token embeddings, a stack of
// KdaModule layers with residual sums (each layer reads an RMS-normalised copy of the stream),
// a final RMSNorm and a linear head over the vocabulary, trained by the cross-entropy of the
// positions that carry a target. The input gradients of the layers (KdaModule.forwardOnTape) carry
// the loss through every layer into the embedding.

import {
  type Arm,
  type ComputeDType,
  type KdaConfig,
  KdaModule,
  type KimiConfigInput,
} from "../mod.ts";
import {
  add,
  alloc,
  exp,
  linear,
  log,
  matmul,
  mul,
  reshape,
  rmsnorm,
  scale,
  sub,
  sum,
  Tape,
  Tensor,
} from "../tape/mod.ts";
import { mulberry32, normal } from "../kda/layer/_random.ts";

/** The model's shape. */
export interface LmShape {
  /** Tokens in the vocabulary. */
  vocab: number;
  /** Layers. */
  layers: number;
  /** Each layer's config (its seed is set per layer). */
  layer: Partial<KdaConfig> | KimiConfigInput;
}

/** A batch: token ids [B, T] and the target of each position (-1: none). */
export interface LmBatch {
  /** Sequences. */
  B: number;
  /** Tokens per sequence. */
  T: number;
  /** Token ids, [B, T]. */
  tokens: Int32Array;
  /** The token each position must predict, or -1 where it is not scored, [B, T]. */
  targets: Int32Array;
}

/** What one training step computes. */
export interface LmStep {
  /** Mean cross-entropy over the scored positions (nats). */
  loss: number;
  /** Fraction of scored positions whose arg-max logit is the target. */
  accuracy: number;
  /** The gradient of every parameter, by the names of {@linkcode TinyLm.parameters}. */
  grads: Map<string, Float64Array | Float32Array>;
}

/** Embedding, `layers` KDA layers with residual sums, and a head. */
export class TinyLm {
  /** The element type of every parameter. */
  readonly dtype: ComputeDType;
  /** The KDA layers, bottom first. */
  readonly layers: KdaModule[];
  /** Token embeddings [vocab, D]. */
  readonly embedding: Tensor;
  /** The head [vocab, D] (logits = h Wᵀ). */
  readonly head: Tensor;
  readonly #shape: LmShape;

  constructor(shape: LmShape, seed: number, dtype: ComputeDType) {
    this.#shape = shape;
    this.dtype = dtype;
    this.layers = Array.from(
      { length: shape.layers },
      (_, l) => new KdaModule({ ...shape.layer, seed: seed + l } as Partial<KdaConfig>, { dtype }),
    );
    const D = this.layers[0].config.dModel;
    const gauss = normal(mulberry32(seed + 1000));
    const draw = (n: number, sd: number) => {
      const a = alloc(dtype, n);
      for (let i = 0; i < n; i++) a[i] = sd * gauss();
      return a;
    };
    this.embedding = new Tensor(draw(shape.vocab * D, 1), [shape.vocab, D]);
    this.head = new Tensor(draw(shape.vocab * D, 1 / Math.sqrt(D)), [shape.vocab, D]);
  }

  /** Every parameter by name: `embedding`, `layers.<l>.<group>`, `head`. Live tensors. */
  parameters(): Map<string, Tensor> {
    const out = new Map<string, Tensor>([["embedding", this.embedding]]);
    this.layers.forEach((layer, l) => {
      for (const [n, p] of layer.parameters()) out.set(`layers.${l}.${n}`, p);
    });
    out.set("head", this.head);
    return out;
  }

  /** The logits [B·T, vocab] on a tape, and the tape's variables by parameter name. */
  async #logits(tape: Tape, batch: LmBatch, arm: Arm) {
    const { vocab } = this.#shape, D = this.layers[0].config.dModel, N = batch.B * batch.T;
    const variables = new Map<string, Tensor>();
    const E = tape.variable(this.embedding);
    variables.set("embedding", E);
    // the embedding lookup as a product with one-hot rows, so its gradient is the tape's
    const onehot = alloc(this.dtype, N * vocab);
    batch.tokens.forEach((t, i) => onehot[i * vocab + t] = 1);
    let h = reshape(matmul(new Tensor(onehot, [N, vocab]), E), [batch.B, batch.T, D]);
    for (const [l, layer] of this.layers.entries()) {
      const out = await layer.forwardOnTape(rmsnorm(h), {
        arm,
        quiet: true,
        checkParameters: false,
      });
      for (const [n, p] of out.parameters) variables.set(`layers.${l}.${n}`, p);
      h = add(h, out.y);
    }
    const W = tape.variable(this.head);
    variables.set("head", W);
    return { logits: linear(reshape(rmsnorm(h), [N, D]), W), variables };
  }

  /**
   * One forward and backward: the mean cross-entropy of the scored positions and every gradient.
   *
   * @param batch Tokens and targets.
   * @param arm The arm of the KDA layers.
   * @returns The loss, the accuracy and the gradients.
   */
  async step(batch: LmBatch, arm: Arm): Promise<LmStep> {
    const tape = new Tape(this.dtype);
    try {
      const { logits, variables } = await this.#logits(tape, batch, arm);
      const { vocab } = this.#shape, N = batch.B * batch.T;
      // log-softmax with each row's max subtracted as a constant (the loss does not depend on it)
      const rowMax = alloc(this.dtype, N), pick = alloc(this.dtype, N * vocab);
      const weight = alloc(this.dtype, N);
      let scored = 0, correct = 0;
      for (let i = 0; i < N; i++) {
        let m = -Infinity, best = 0;
        for (let c = 0; c < vocab; c++) {
          const z = logits.data[i * vocab + c];
          if (z > m) m = z, best = c;
        }
        rowMax[i] = m;
        const target = batch.targets[i];
        if (target < 0) continue;
        pick[i * vocab + target] = 1;
        weight[i] = 1;
        scored++;
        if (best === target) correct++;
      }
      const shifted = sub(logits, new Tensor(rowMax, [N, 1]));
      const lse = log(sum(exp(shifted), 1, { keepDims: true }));
      const picked = sum(mul(shifted, new Tensor(pick, [N, vocab])), 1, { keepDims: true });
      const perRow = reshape(sub(lse, picked), [N]);
      const loss = scale(sum(mul(perRow, new Tensor(weight, [N])), 0), 1 / scored);
      const byTensor = await tape.backward(loss);
      const grads = new Map<string, Float64Array | Float32Array>();
      for (const [name, v] of variables) {
        grads.set(name, byTensor.get(v) ?? alloc(this.dtype, v.size));
      }
      return { loss: loss.data[0], accuracy: correct / scored, grads };
    } finally {
      tape.dispose();
    }
  }

  /**
   * The accuracy of the arg-max prediction at the scored positions, without gradients.
   *
   * @param batch Tokens and targets.
   * @param arm The arm of the KDA layers.
   * @returns Correct and scored positions.
   */
  async evaluate(batch: LmBatch, arm: Arm): Promise<{ correct: number; scored: number }> {
    const tape = new Tape(this.dtype);
    try {
      const { logits } = await this.#logits(tape, batch, arm);
      const { vocab } = this.#shape;
      let correct = 0, scored = 0;
      batch.targets.forEach((target, i) => {
        if (target < 0) return;
        let best = 0;
        for (let c = 1; c < vocab; c++) {
          if (logits.data[i * vocab + c] > logits.data[i * vocab + best]) best = c;
        }
        scored++;
        if (best === target) correct++;
      });
      return { correct, scored };
    } finally {
      tape.dispose();
    }
  }
}
