// The in-kernel options (docs/kda.md 2.8) as tape ops, for the ops arm: the raw q, k, g, beta
// (and aLog, dtBias) become the op's own arrays through l2norm, softplus, sigmoid, exp, add, mul
// and scale, so the tape differentiates them like the recurrence, with no derived gradient.

import {
  add,
  exp,
  l2norm,
  mul,
  reshape,
  scale,
  sigmoid,
  softplus,
  type Tensor,
} from "../../tape/mod.ts";
import type { InKernel } from "../_types.ts";
import { L2NORM_EPS } from "../_types.ts";

/** The raw arrays of a call with in-kernel options, as tape tensors. */
export interface RawTensors {
  /** [B, T, H, K]. */
  q: Tensor;
  /** [B, T, H, K]. */
  k: Tensor;
  /** [B, T, HV, K]. */
  g: Tensor;
  /** [B, T, HV]. */
  beta: Tensor;
  /** [HV]. */
  aLog?: Tensor;
  /** [HV·K]. */
  dtBias?: Tensor;
}

/**
 * The op's own q, k, g, beta from the raw ones, recorded on the tape of the inputs.
 *
 * @param x The raw tensors.
 * @param inKernel The call's options.
 * @returns q, k, g, beta in the op's layouts.
 * @example
 * ```ts
 * import { inKernelOnTape } from "./_in_kernel_tape.ts";
 * import { Tensor } from "../../tape/mod.ts";
 * const t = (v: number[], shape: number[]) => new Tensor(Float64Array.from(v), shape);
 * const { beta } = inKernelOnTape(
 *   { q: t([1], [1, 1, 1, 1]), k: t([1], [1, 1, 1, 1]), g: t([0], [1, 1, 1, 1]), beta: t([0], [1, 1, 1]) },
 *   { l2norm: false, gate: null, betaSigmoid: 2, finalState: true },
 * );
 * console.log(beta.data[0]); // 1
 * ```
 */
export function inKernelOnTape(
  x: RawTensors,
  inKernel: InKernel,
): { q: Tensor; k: Tensor; g: Tensor; beta: Tensor } {
  let { q, k, g, beta } = x;
  if (inKernel.l2norm) {
    q = l2norm(q, { eps: L2NORM_EPS });
    k = l2norm(k, { eps: L2NORM_EPS });
  }
  const gate = inKernel.gate;
  if (gate !== null) {
    const [, , HV, K] = g.shape;
    let z = x.dtBias === undefined ? g : add(g, reshape(x.dtBias, [HV, K]));
    const sharp = x.aLog === undefined ? undefined : reshape(exp(x.aLog), [HV, 1]);
    if (gate.lowerBound === null) {
      g = mul(softplus(z), scale(sharp!, -1));
    } else {
      if (sharp !== undefined) z = mul(z, sharp);
      g = scale(sigmoid(z), gate.lowerBound);
    }
  }
  if (inKernel.betaSigmoid !== 0) beta = scale(sigmoid(beta), inKernel.betaSigmoid);
  return { q, k, g, beta };
}
