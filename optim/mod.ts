/**
 * Optimizers over named parameters: {@linkcode Sgd} (with momentum and L2 weight decay) and
 * {@linkcode AdamW} (decoupled weight decay, bias-corrected moments), following PyTorch's update
 * equations. Parameters are the tape's {@linkcode Tensor}s, such as `KdaModule.parameters()`,
 * updated in place; gradients are a map from the same names to arrays of the same lengths, such as
 * the `grads` of `KdaModule.vjp`.
 *
 * @example Usage
 * ```ts
 * import { KdaModule } from "@deltanet/kda";
 * import { AdamW } from "@deltanet/kda/optim";
 * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
 * const opt = new AdamW(layer.parameters(), { lr: 1e-3 });
 * const x = new Float64Array(1 * 5 * 8).fill(0.1);
 * const { grads } = await layer.vjp(x, [1, 5], x, { arm: "cpu" });
 * opt.step(grads);
 * ```
 *
 * @module
 */
import { checkKnownKeys, checkObject, shown, typeName } from "../base/check.ts";

import type { Tensor } from "../tape/mod.ts";

// the tape's tensor and the types it names, which an optimizer's parameters are
export type {
  ComputeDType,
  Data,
  Gradients,
  MaybePromise,
  Tape,
  TapeNode,
  Tensor,
} from "../tape/mod.ts";

/** A gradient array: one per parameter, of the parameter's length. */
export type GradArray = Float64Array | Float32Array;

/** What every optimizer here offers. */
export interface Optimizer {
  /** The learning rate; may be changed between steps (a schedule). */
  lr: number;
  /** The number of steps taken. */
  readonly steps: number;
  /** Updates every parameter in place from its gradient. */
  step(grads: Map<string, GradArray>): void;
}

/** Options of {@linkcode Sgd}. */
export interface SgdOptions {
  /** Learning rate, finite and >= 0. */
  lr: number;
  /** Momentum in [0, 1) (default 0: plain gradient descent). Dampening is 0, not Nesterov. */
  momentum?: number;
  /** L2 penalty added to the gradient, `g + weightDecay · p` (default 0). */
  weightDecay?: number;
}

/** Options of {@linkcode AdamW}. */
export interface AdamWOptions {
  /** Learning rate, finite and >= 0 (default 1e-3). */
  lr?: number;
  /** Decay rates of the first and second moments, each in [0, 1) (default [0.9, 0.999]). */
  betas?: readonly [number, number];
  /** Added to the denominator, finite and > 0 (default 1e-8). */
  eps?: number;
  /** Decoupled weight decay: `p ← p · (1 − lr · weightDecay)` before the step (default 1e-2). */
  weightDecay?: number;
}

function checkRange(
  name: string,
  value: unknown,
  lo: number,
  hi: number,
  hiOpen: boolean,
  loOpen = false,
): number {
  const ok = typeof value === "number" && Number.isFinite(value) &&
    (loOpen ? value > lo : value >= lo) && (hiOpen ? value < hi : value <= hi);
  if (!ok) {
    const range = `${loOpen ? "(" : "["}${lo}, ${hi === Infinity ? "∞" : hi}${hiOpen ? ")" : "]"}`;
    throw new RangeError(`${name} must be a finite number in ${range}: got ${shown(value)}`);
  }
  return value as number;
}

function checkParams(params: unknown): Map<string, Tensor> {
  if (!(params instanceof Map)) {
    throw new TypeError(`params must be a Map of name to Tensor: got ${typeName(params)}`);
  }
  if (params.size === 0) throw new RangeError(`params must hold at least one tensor: got 0`);
  // each step writes every parameter from its own old values, so memory under two names would
  // keep only the last name's update: a tied weight is one parameter, given once
  const seen: { name: string; data: Float64Array | Float32Array }[] = [];
  for (const [name, p] of params) {
    const data = (p as Tensor | undefined)?.data;
    if (!(data instanceof Float64Array || data instanceof Float32Array)) {
      throw new TypeError(
        `params "${String(name)}" must be a Tensor over a Float64Array or Float32Array: got ${
          typeName(p)
        }`,
      );
    }
    const start = data.byteOffset, end = start + data.byteLength;
    const twin = seen.find((o) =>
      o.data.buffer === data.buffer && o.data.byteOffset < end &&
      start < o.data.byteOffset + o.data.byteLength
    );
    if (twin !== undefined) {
      throw new RangeError(
        `params "${String(name)}" must not share memory with another parameter: got the memory ` +
          `of "${twin.name}" (a tied weight is one parameter, under one name)`,
      );
    }
    seen.push({ name: String(name), data });
  }
  return new Map(params);
}

/** Checks the gradients against the parameters: same names, same lengths, finite values. */
function checkGrads(params: Map<string, Tensor>, grads: unknown): Map<string, GradArray> {
  if (!(grads instanceof Map)) {
    throw new TypeError(`grads must be a Map of name to gradient array: got ${typeName(grads)}`);
  }
  for (const name of grads.keys()) {
    if (!params.has(name)) {
      throw new RangeError(
        `grads has a gradient for an unknown parameter: expected one of ${
          [...params.keys()].join(", ")
        }; got "${String(name)}"`,
      );
    }
  }
  for (const [name, p] of params) {
    const g = grads.get(name);
    if (g === undefined) {
      throw new RangeError(
        `grads must hold a gradient for every parameter: got none for "${name}"`,
      );
    }
    if (!(g instanceof Float64Array || g instanceof Float32Array)) {
      throw new TypeError(
        `grads "${name}" must be a Float64Array or Float32Array: got ${typeName(g)}`,
      );
    }
    if (g.length !== p.data.length) {
      throw new RangeError(
        `grads "${name}" must have ${p.data.length} elements like its parameter: got ${g.length}`,
      );
    }
    for (let i = 0; i < g.length; i++) {
      if (!Number.isFinite(g[i])) {
        throw new RangeError(`grads "${name}" must be finite: got ${g[i]} at index ${i}`);
      }
    }
  }
  return grads as Map<string, GradArray>;
}

/**
 * What every optimizer here shares: the named parameters it updates in place, a learning rate
 * that may change between steps, the step count, and the gradient checks before any update.
 *
 * @example Usage
 * ```ts
 * import { Tensor } from "@deltanet/kda/tape";
 * import { Sgd } from "@deltanet/kda/optim";
 * const opt = new Sgd(new Map([["w", new Tensor(new Float64Array([1]), [1])]]), { lr: 0.1 });
 * opt.lr = 0.05; // a schedule
 * ```
 */
export abstract class ParameterOptimizer implements Optimizer {
  #lr: number;
  #steps = 0;
  /** The parameters by name, updated in place. */
  protected readonly params: Map<string, Tensor>;

  /**
   * Keeps the parameters and the learning rate.
   *
   * @param params The parameters by name, each over memory of its own (a tied weight is given once).
   * @param lr The learning rate, finite and >= 0.
   * @param what The name of the learning rate's argument, for messages.
   */
  protected constructor(params: Map<string, Tensor>, lr: unknown, what: string) {
    this.params = checkParams(params);
    this.#lr = checkRange(what, lr, 0, Infinity, true);
  }

  /** The learning rate, finite and >= 0. */
  get lr(): number {
    return this.#lr;
  }
  set lr(value: number) {
    this.#lr = checkRange("lr", value, 0, Infinity, true);
  }

  /** The number of steps taken. */
  get steps(): number {
    return this.#steps;
  }

  /**
   * One update of every parameter, all or nothing: a rejected gradient changes nothing, and so
   * does a step that would write a non-finite value into a parameter (in the parameter's dtype) or
   * into the optimizer's state; it throws a RangeError naming the group, the index and the value.
   *
   * @param grads A gradient for every parameter, by name, of the parameter's length.
   */
  step(grads: Map<string, GradArray>): void {
    checkGrads(this.params, grads);
    this.update(grads, this.#lr, this.#steps + 1);
    this.#steps++;
  }

  /**
   * The update rule, on checked gradients. It computes every new value into scratch first,
   * checking each with {@linkcode ParameterOptimizer.checkParameter} and
   * {@linkcode ParameterOptimizer.checkState}, and writes only when all are finite.
   *
   * @param grads One finite gradient per parameter.
   * @param lr The learning rate.
   * @param t The number of this step, from 1.
   */
  protected abstract update(grads: Map<string, GradArray>, lr: number, t: number): void;

  /**
   * Throws unless a parameter's new value is finite in the parameter's dtype (an f32 parameter
   * also refuses a finite value that rounds to ±Infinity in f32).
   *
   * @param name The group.
   * @param data The group's values (for its dtype).
   * @param i The index.
   * @param value The new value, in f64.
   * @param t The number of this step.
   * @returns The value.
   */
  protected checkParameter(
    name: string,
    data: GradArray,
    i: number,
    value: number,
    t: number,
  ): number {
    const f32 = data instanceof Float32Array;
    const stored = f32 ? Math.fround(value) : value;
    if (Number.isFinite(stored)) return value;
    const rounds = Number.isFinite(value) ? `, which rounds to ${stored}` : "";
    throw new RangeError(
      `params "${name}" must stay finite${f32 ? " in f32" : ""} after step ${t}: got ${value} ` +
        `at index ${i}${rounds} (nothing was updated)`,
    );
  }

  /**
   * Throws unless a new value of the optimizer's state (kept in f64) is finite.
   *
   * @param what The state's name, e.g. "the second moment".
   * @param name The group.
   * @param i The index.
   * @param value The new value.
   * @param t The number of this step.
   * @returns The value.
   */
  protected checkState(what: string, name: string, i: number, value: number, t: number): number {
    if (Number.isFinite(value)) return value;
    throw new RangeError(
      `${what} of params "${name}" must stay finite after step ${t}: got ${value} at index ${i} ` +
        "(nothing was updated)",
    );
  }
}

/** Scratch arrays by group name, allocated once per group and reused every step. */
class Scratch {
  readonly #arrays = new Map<string, Float64Array>();

  /** The scratch of a group, of `length` elements (contents undefined). */
  get(name: string, length: number): Float64Array {
    let a = this.#arrays.get(name);
    if (a === undefined) this.#arrays.set(name, a = new Float64Array(length));
    return a;
  }

  /** Hands `a` back as the scratch of a group (after its old contents were committed). */
  set(name: string, a: Float64Array): void {
    this.#arrays.set(name, a);
  }
}

/** A decay or penalty factor, finite and >= 0, from options (with its default). */
function nonNegative(name: string, value: unknown): number {
  return checkRange(name, value, 0, Infinity, true);
}

/**
 * Stochastic gradient descent with momentum, as PyTorch's `torch.optim.SGD` with dampening 0 and
 * nesterov false: `g ← grad + weightDecay · p`; with momentum, `buf ← g` at the first step and
 * `buf ← momentum · buf + g` after, and `g ← buf`; then `p ← p − lr · g`. The momentum buffers are
 * kept in f64.
 *
 * @example Usage
 * ```ts
 * import { Tensor } from "@deltanet/kda/tape";
 * import { Sgd } from "@deltanet/kda/optim";
 * const w = new Tensor(new Float64Array([1, 2]), [2]);
 * const opt = new Sgd(new Map([["w", w]]), { lr: 0.1, momentum: 0.9 });
 * opt.step(new Map([["w", new Float64Array([1, -1])]]));
 * w.data; // Float64Array [0.9, 2.1]
 * ```
 */
export class Sgd extends ParameterOptimizer {
  /** The momentum factor. */
  readonly momentum: number;
  /** The L2 penalty. */
  readonly weightDecay: number;
  readonly #buf = new Map<string, Float64Array>();
  readonly #next = new Scratch();
  readonly #nextBuf = new Scratch();

  /**
   * Makes the optimizer over a fixed set of named parameters.
   *
   * @param params The parameters by name (updated in place).
   * @param options `lr`, `momentum`, `weightDecay`.
   */
  constructor(params: Map<string, Tensor>, options: SgdOptions) {
    checkKnownKeys("options", checkObject("options", options), ["lr", "momentum", "weightDecay"]);
    super(params, options.lr, "options.lr");
    this.momentum = checkRange("options.momentum", options.momentum ?? 0, 0, 1, true);
    this.weightDecay = nonNegative("options.weightDecay", options.weightDecay ?? 0);
  }

  /**
   * The SGD update: every new value into scratch and checked, then all written.
   *
   * @param grads One finite gradient per parameter.
   * @param lr The learning rate.
   * @param t The number of this step, from 1.
   */
  protected update(grads: Map<string, GradArray>, lr: number, t: number): void {
    const { momentum: mu, weightDecay: wd } = this;
    for (const [name, p] of this.params) {
      const g = grads.get(name)!, d = p.data;
      const buf = this.#buf.get(name); // absent before the first step with momentum
      const next = this.#next.get(name, d.length);
      const nextBuf = mu === 0 ? undefined : this.#nextBuf.get(name, d.length);
      for (let i = 0; i < d.length; i++) {
        let gi = g[i] + wd * d[i];
        if (nextBuf !== undefined) {
          gi = buf === undefined ? gi : mu * buf[i] + gi;
          nextBuf[i] = this.checkState("the momentum buffer", name, i, gi, t);
        }
        next[i] = this.checkParameter(name, d, i, d[i] - lr * gi, t);
      }
    }
    for (const [name, p] of this.params) {
      p.data.set(this.#next.get(name, p.data.length));
      if (mu === 0) continue;
      const fresh = this.#nextBuf.get(name, p.data.length), old = this.#buf.get(name);
      this.#buf.set(name, fresh);
      this.#nextBuf.set(name, old ?? new Float64Array(p.data.length));
    }
  }
}

/**
 * Adam with decoupled weight decay, as PyTorch's `torch.optim.AdamW` (amsgrad false): at step t,
 * `p ← p · (1 − lr · weightDecay)`, `m ← β1 m + (1 − β1) g`, `v ← β2 v + (1 − β2) g²`, then
 * `p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + eps)`. The moments are kept in f64.
 *
 * @example Usage
 * ```ts
 * import { Tensor } from "@deltanet/kda/tape";
 * import { AdamW } from "@deltanet/kda/optim";
 * const w = new Tensor(new Float64Array([1, 2]), [2]);
 * const opt = new AdamW(new Map([["w", w]]), { lr: 0.1, weightDecay: 0 });
 * opt.step(new Map([["w", new Float64Array([1, -1])]]));
 * w.data; // about [0.9, 2.1]: the first Adam step moves each entry by lr
 * ```
 */
export class AdamW extends ParameterOptimizer {
  /** The moment decay rates. */
  readonly betas: readonly [number, number];
  /** The denominator's guard. */
  readonly eps: number;
  /** The decoupled weight decay. */
  readonly weightDecay: number;
  readonly #m = new Map<string, Float64Array>();
  readonly #v = new Map<string, Float64Array>();
  readonly #nextM = new Scratch();
  readonly #nextV = new Scratch();
  readonly #next = new Scratch();

  /**
   * Makes the optimizer over a fixed set of named parameters.
   *
   * @param params The parameters by name (updated in place).
   * @param options `lr`, `betas`, `eps`, `weightDecay`.
   */
  constructor(params: Map<string, Tensor>, options: AdamWOptions = {}) {
    checkKnownKeys("options", checkObject("options", options), [
      "lr",
      "betas",
      "eps",
      "weightDecay",
    ]);
    super(params, options.lr ?? 1e-3, "options.lr");
    const betas = options.betas ?? [0.9, 0.999];
    if (!Array.isArray(betas) || betas.length !== 2) {
      throw new TypeError(
        `options.betas must be a pair [beta1, beta2]: got ${
          Array.isArray(betas) ? `${betas.length} numbers` : typeName(betas)
        }`,
      );
    }
    this.betas = Object.freeze([
      checkRange("options.betas[0]", betas[0], 0, 1, true),
      checkRange("options.betas[1]", betas[1], 0, 1, true),
    ]) as readonly [number, number];
    this.eps = checkRange("options.eps", options.eps ?? 1e-8, 0, Infinity, true, true);
    this.weightDecay = nonNegative("options.weightDecay", options.weightDecay ?? 1e-2);
  }

  /**
   * The AdamW update: every new moment and value into scratch and checked, then all written.
   *
   * @param grads One finite gradient per parameter.
   * @param lr The learning rate.
   * @param t The number of this step, from 1.
   */
  protected update(grads: Map<string, GradArray>, lr: number, t: number): void {
    const [b1, b2] = this.betas;
    const eps = this.eps;
    const decay = 1 - lr * this.weightDecay;
    const stepSize = lr / (1 - b1 ** t);
    const bc2Sqrt = Math.sqrt(1 - b2 ** t);
    for (const [name, p] of this.params) {
      const g = grads.get(name)!, d = p.data;
      const m = this.#m.get(name), v = this.#v.get(name); // absent before the first step
      const m1 = this.#nextM.get(name, d.length), v1 = this.#nextV.get(name, d.length);
      const next = this.#next.get(name, d.length);
      for (let i = 0; i < d.length; i++) {
        const gi = g[i];
        const mi = b1 * (m?.[i] ?? 0) + (1 - b1) * gi;
        const vi = b2 * (v?.[i] ?? 0) + (1 - b2) * gi * gi;
        m1[i] = this.checkState("the first moment", name, i, mi, t);
        v1[i] = this.checkState("the second moment", name, i, vi, t);
        const denom = Math.sqrt(vi) / bc2Sqrt + eps;
        next[i] = this.checkParameter(name, d, i, d[i] * decay - stepSize * (mi / denom), t);
      }
    }
    for (const [name, p] of this.params) {
      const n = p.data.length;
      p.data.set(this.#next.get(name, n));
      const m1 = this.#nextM.get(name, n), v1 = this.#nextV.get(name, n);
      const m = this.#m.get(name), v = this.#v.get(name);
      this.#m.set(name, m1);
      this.#v.set(name, v1);
      this.#nextM.set(name, m ?? new Float64Array(n));
      this.#nextV.set(name, v ?? new Float64Array(n));
    }
  }
}
