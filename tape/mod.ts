/**
 * A small autodiff tape over f64 or f32 tensors, reverse and forward mode. Every op sits in one
 * table with its forward, its vector-Jacobian product and its Jacobian-vector product side by
 * side; `Tape.backward` walks the recorded nodes in reverse, `jvp` (and `Tape.jvpFrom`) forwards.
 * The tape knows nothing about KDA: the KDA op enters it as a custom node.
 *
 * @example Usage
 * ```ts
 * import { linear, sigmoid, sum, Tape } from "@deltanet/kda/tape";
 * const tape = new Tape("f64");
 * const x = tape.variable(new Float64Array([1, 2]), [1, 2]);
 * const w = tape.variable(new Float64Array([0.5, -0.5]), [1, 2]);
 * const y = sum(sigmoid(linear(x, w)), 1);
 * const grads = await tape.backward(y);
 * grads.get(w); // d y / d w
 * ```
 *
 * @module
 */

export { alloc, type ComputeArray, type ComputeDType, type DType, dtypeOf } from "../base/dtype.ts";
export {
  type Data,
  type Gradients,
  type MaybePromise,
  sizeOf,
  Tape,
  type TapeNode,
  tapeOf,
  Tensor,
} from "./tape.ts";
export { jvp } from "./jvp.ts";
export {
  add,
  causalConv,
  concat,
  constant,
  customNode,
  div,
  exp,
  l2norm,
  linear,
  log,
  matmul,
  mul,
  reshape,
  rmsnorm,
  rsqrt,
  scale,
  sigmoid,
  silu,
  slice,
  softplus,
  sqrt,
  stack,
  sub,
  sum,
  transpose,
  unstack,
} from "./ops.ts";
