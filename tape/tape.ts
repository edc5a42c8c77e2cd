// The tape: a Wengert list of nodes in creation order. Walking it backwards is a valid order for
// reverse mode (VJPs), walking it forwards one for forward mode (JVPs), without any graph search.

import { alloc, type ComputeArray, type ComputeDType, computeDtypeOf } from "../base/dtype.ts";
import { typeName } from "../base/check.ts";

/** The typed array behind a tensor. */
export type Data = ComputeArray;

/** A value or a promise of it: custom nodes (the GPU) may compute their VJP asynchronously. */
export type MaybePromise<T> = T | Promise<T>;

/**
 * A recorded op: its inputs, its outputs, the vector-Jacobian product that maps the outputs'
 * cotangents (null where none arrived) to the inputs' (null where the input gets none), and the
 * Jacobian-vector product that maps the inputs' tangents (null where none) to the outputs'.
 */
export interface TapeNode {
  /** The op's name, for error messages and counters. */
  readonly name: string;
  /** The op's inputs, in order. */
  readonly inputs: readonly (Tensor | undefined)[];
  /** The op's outputs, in order. */
  readonly outputs: readonly Tensor[];
  /** Maps output cotangents to input cotangents. */
  vjp(cotangents: readonly (Data | null)[]): MaybePromise<readonly (Data | null)[]>;
  /** Maps input tangents to output tangents; absent on a custom node given no JVP. */
  jvp?(tangents: readonly (Data | null)[]): MaybePromise<readonly (Data | null)[]>;
  /** Frees what the node holds (device buffers) when the tape is disposed. */
  dispose?(): void;
}

/** Leaf gradients, keyed by the variable tensor. */
export type Gradients = Map<Tensor, Data>;

/**
 * A reverse-mode autodiff tape. Make variables on it, apply ops (they record themselves when any
 * input requires a gradient), then call `backward` once with the output's cotangent.
 *
 * @example Usage
 * ```ts
 * import { mul, sum, Tape } from "@deltanet/kda/tape";
 * const tape = new Tape("f64");
 * const x = tape.variable(new Float64Array([1, 2, 3]), [3]);
 * const y = sum(mul(x, x), 0);
 * const grads = await tape.backward(y);
 * grads.get(x); // Float64Array [2, 4, 6]
 * ```
 */
export class Tape {
  /** The one element type every tensor on this tape has. */
  readonly dtype: ComputeDType;
  readonly #nodes: TapeNode[] = [];
  readonly #variables = new Set<Tensor>();
  #disposed = false;

  /**
   * Makes an empty tape.
   *
   * @param dtype The element type of every tensor recorded on it.
   */
  constructor(dtype: ComputeDType) {
    if (dtype !== "f64" && dtype !== "f32") {
      throw new TypeError(`Tape dtype must be "f64" or "f32": got ${String(dtype)}`);
    }
    this.dtype = dtype;
  }

  /** The number of recorded nodes. */
  get size(): number {
    return this.#nodes.length;
  }

  /**
   * Makes a leaf that requires a gradient.
   *
   * @param data The values (not copied), or a tensor whose values to share.
   * @param shape The dimensions; defaults to the tensor's shape, or `[data.length]`.
   * @returns A variable tensor on this tape.
   */
  variable(data: Data | Tensor, shape?: readonly number[]): Tensor {
    const values = data instanceof Tensor ? data.data : data;
    this.#checkDtype(values, "data");
    const t = new Tensor(
      values,
      shape ?? (data instanceof Tensor ? data.shape : [values.length]),
      this,
    );
    this.#variables.add(t);
    return t;
  }

  /**
   * Records a node; used by ops and custom nodes. Its outputs must have been made on this tape.
   *
   * @param node The node to record.
   */
  record(node: TapeNode): void {
    if (this.#disposed) throw new Error("Cannot record on a disposed tape");
    this.#nodes.push(node);
  }

  /**
   * Makes the outputs of a node on this tape (tensors that require a gradient).
   *
   * @param data The values.
   * @param shape The dimensions.
   * @returns A tensor that gradients flow through.
   */
  output(data: Data, shape: readonly number[]): Tensor {
    this.#checkDtype(data, "data");
    return new Tensor(data, shape, this);
  }

  /**
   * Runs the reverse pass from `y` and returns the gradient of every variable that `y` depends
   * on. Intermediate cotangents are dropped as soon as they are consumed.
   *
   * @param y The output to differentiate; must be on this tape.
   * @param dy Its cotangent, `y.size` values; defaults to ones.
   * @returns The gradients of the variables, keyed by the variable tensor.
   */
  backward(y: Tensor, dy?: Data): Promise<Gradients> {
    return this.backwardFrom([{ output: y, cotangent: dy ?? alloc(this.dtype, y.size).fill(1) }]);
  }

  /**
   * Runs the reverse pass from several outputs at once, each with its cotangent.
   *
   * @param seeds The outputs (on this tape) and their cotangents (`output.size` values each).
   * @returns The gradients of the variables, keyed by the variable tensor.
   */
  async backwardFrom(
    seeds: readonly { output: Tensor; cotangent: Data }[],
  ): Promise<Gradients> {
    if (this.#disposed) throw new Error("Cannot run backward on a disposed tape");
    for (const [i, { output, cotangent }] of seeds.entries()) {
      this.#checkSeed(output, cotangent, `Backward output ${i}`, `Cotangent ${i}`);
    }
    const grads = new Map<Tensor, Data>();
    const owned = new Set<Data>();
    const accumulate = (t: Tensor, g: Data) => {
      if (g.length !== t.size) {
        throw new RangeError(
          `VJP returned a cotangent of ${g.length} elements for a tensor of ${t.size}`,
        );
      }
      const prev = grads.get(t);
      if (prev === undefined) {
        // A VJP may hand one array to several inputs (a custom node returning [g, g]): once
        // shared it is no longer ours to add into in place.
        owned.delete(g);
        grads.set(t, g);
        return;
      }
      // The first cotangent may be shared with another tensor (reshape passes its own through):
      // copy once, then add in place.
      let sum = prev;
      if (!owned.has(prev)) {
        sum = prev.slice();
        owned.add(sum);
        grads.set(t, sum);
      }
      for (let i = 0; i < g.length; i++) sum[i] += g[i];
    };
    for (const { output, cotangent } of seeds) accumulate(output, cotangent);
    for (let n = this.#nodes.length - 1; n >= 0; n--) {
      const node = this.#nodes[n];
      const gys = node.outputs.map((o) => grads.get(o) ?? null);
      if (gys.every((g) => g === null)) continue;
      for (const o of node.outputs) {
        if (!this.#variables.has(o)) grads.delete(o);
      }
      const gxs = await node.vjp(gys);
      node.inputs.forEach((x, i) => {
        const g = gxs[i];
        if (x !== undefined && x.tape === this && g !== null && g !== undefined) {
          // a custom node's VJP is the caller's code: its arrays must be the tape's
          this.#checkDtype(g, `${node.name}'s VJP result for input ${i}`);
          accumulate(x, g);
        }
      });
    }
    // A gradient may still be a caller's cotangent (reshape passes its own through) or one array
    // handed to two variables: each returned gradient is an array of its own, so that changing it
    // in place (clipping) changes nothing else.
    const theirs = new Set<Data>(seeds.map((s) => s.cotangent));
    const returned = new Set<Data>();
    const out: Gradients = new Map();
    for (const v of this.#variables) {
      let g = grads.get(v);
      if (g === undefined) continue;
      if (theirs.has(g) || returned.has(g)) g = g.slice();
      returned.add(g);
      out.set(v, g);
    }
    return out;
  }

  /**
   * Runs forward mode: pushes tangents of some tensors (typically the variables) through every
   * recorded node in creation order and returns the tangent of every tensor that one reached. A
   * tensor that no seed reaches has a zero tangent and no entry. Every node on the way must have a
   * JVP rule; a custom node recorded without one makes this throw an error that names it.
   *
   * @param seeds Tensors on this tape and their tangents (`tensor.size` values each).
   * @returns The tangents, keyed by tensor.
   */
  async jvpFrom(seeds: readonly { input: Tensor; tangent: Data }[]): Promise<Map<Tensor, Data>> {
    if (this.#disposed) throw new Error("Cannot run forward mode on a disposed tape");
    const tangents = new Map<Tensor, Data>();
    for (const [i, { input, tangent }] of seeds.entries()) {
      this.#checkSeed(input, tangent, `Tangent seed ${i}`, `Tangent ${i}`);
      tangents.set(input, tangent);
    }
    for (const node of this.#nodes) {
      const txs = node.inputs.map((x) => (x === undefined ? null : tangents.get(x) ?? null));
      if (txs.every((t) => t === null)) continue;
      if (node.jvp === undefined) {
        throw new Error(
          `Forward mode needs a JVP rule for node "${node.name}": give it a jvp (customNode's def.jvp)`,
        );
      }
      const tys = await node.jvp(txs);
      node.outputs.forEach((y, i) => {
        const t = tys[i];
        if (t === null || t === undefined) return;
        if (t.length !== y.size) {
          throw new RangeError(
            `JVP of node "${node.name}" returned a tangent of ${t.length} elements for output ${i} of ${y.size}`,
          );
        }
        tangents.set(y, t);
      });
    }
    return tangents;
  }

  /** Releases what the recorded nodes hold (GPU buffers of custom nodes) and forgets them. */
  dispose(): void {
    for (const node of this.#nodes) node.dispose?.();
    this.#nodes.length = 0;
    this.#disposed = true;
  }

  /** Checks that `t` is on this tape and `data` (named `dataName`) fits it as a seed. */
  #checkSeed(t: Tensor, data: Data, tensorName: string, dataName: string): void {
    if (!(t instanceof Tensor) || t.tape !== this) {
      throw new TypeError(
        `${tensorName} must be a tensor recorded on this tape: got one that is not`,
      );
    }
    this.#checkDtype(data, dataName);
    if (data.length !== t.size) {
      throw new RangeError(`${dataName} must have ${t.size} elements: got ${data.length}`);
    }
  }

  #checkDtype(data: Data, name: string): void {
    const dtype = computeDtypeOf(data, name);
    if (dtype !== this.dtype) {
      throw new TypeError(`${name} must match the tape's dtype ${this.dtype}: got ${dtype}`);
    }
  }
}

/**
 * The tape that records an op on these inputs: the one every gradient-carrying input shares, or
 * undefined when none requires a gradient (inference: nothing is recorded).
 *
 * @param inputs The op's inputs.
 * @param op The op's name, for the messages (an op's errors name it).
 * @returns The shared tape, or undefined.
 */
export function tapeOf(
  inputs: readonly (Tensor | undefined)[],
  op?: string,
): Tape | undefined {
  let tape: Tape | undefined;
  let first: number | undefined;
  const what = op === undefined ? "Op" : `${op}()`;
  for (const [i, x] of inputs.entries()) {
    if (x === undefined) continue;
    if (first === undefined) first = i;
    else if (x.dtype !== inputs[first]!.dtype) {
      throw new TypeError(
        `${what} inputs must share one dtype: input ${first} is ${
          inputs[first]!.dtype
        }, input ${i} is ${x.dtype}`,
      );
    }
    if (x.tape === undefined) continue;
    if (tape === undefined) tape = x.tape;
    else if (x.tape !== tape) {
      throw new TypeError("Op inputs must be recorded on one tape: got tensors of two tapes");
    }
  }
  return tape;
}

/**
 * The number of elements of a shape.
 *
 * @param shape Dimensions, row-major.
 * @returns Their product (1 for a scalar shape `[]`).
 *
 * @example Usage
 * ```ts
 * import { sizeOf } from "@deltanet/kda/tape";
 * sizeOf([2, 3]); // 6
 * ```
 */
export function sizeOf(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/**
 * An n-dimensional array of f64 or f32 values, row-major. A tensor made by an op on a tape
 * (or marked as a variable) requires a gradient; a plain tensor is a constant.
 *
 * @example Usage
 * ```ts
 * import { Tensor } from "@deltanet/kda/tape";
 * const t = new Tensor(new Float64Array([1, 2, 3, 4]), [2, 2]);
 * t.shape; // [2, 2]
 * ```
 */
export class Tensor {
  /** Dimensions, row-major. */
  readonly shape: readonly number[];
  /** The values, `size` of them. */
  readonly data: Data;
  /** The tape that records ops on this tensor, when it requires a gradient. */
  readonly tape: Tape | undefined;

  /**
   * Makes a tensor over `data` (not copied).
   *
   * @param data The values, row-major.
   * @param shape The dimensions; their product must equal `data.length`.
   * @param tape The recording tape, for tensors that require a gradient (set by the tape).
   */
  constructor(data: Data, shape: readonly number[], tape?: Tape) {
    computeDtypeOf(data, "Tensor data");
    if (!Array.isArray(shape)) {
      throw new TypeError(`Tensor shape must be an array of dimensions: got ${typeName(shape)}`);
    }
    for (const d of shape) {
      if (!Number.isInteger(d) || d < 0) {
        throw new RangeError(
          `Tensor shape must hold non-negative integers: got [${shape.join(", ")}]`,
        );
      }
    }
    if (sizeOf(shape) !== data.length) {
      throw new RangeError(
        `Tensor data length must equal the shape's size ${sizeOf(shape)} for shape [${
          shape.join(", ")
        }]: got ${data.length}`,
      );
    }
    this.data = data;
    this.shape = Object.freeze([...shape]);
    this.tape = tape;
  }

  /** The element type. */
  get dtype(): ComputeDType {
    return computeDtypeOf(this.data);
  }

  /** The number of elements. */
  get size(): number {
    return this.data.length;
  }

  /** Whether gradients flow to this tensor (it was made on a tape). */
  get requiresGrad(): boolean {
    return this.tape !== undefined;
  }
}
