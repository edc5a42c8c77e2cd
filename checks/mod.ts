/**
 * The gradient proof as a library: per-group checks for any f64 layer built on this package's tape
 * (`proveGradients`), and the pieces the KDA proof is made of (the agreement metric, the derived
 * central-difference step and its resolvable floor). See docs/kda.md 4.
 *
 * @example Proving a small layer
 * ```ts
 * import { proveGradients } from "@deltanet/kda/checks";
 * import { linear, sigmoid, sum, Tensor } from "@deltanet/kda/tape";
 * const x = new Tensor(Float64Array.from({ length: 8 }, (_, i) => Math.sin(i)), [4, 2]);
 * const report = await proveGradients({
 *   parameters: new Map([["w", { data: Float64Array.of(0.3, -0.7), shape: [1, 2] }]]),
 *   loss: (p) => sum(sum(sigmoid(linear(x, p.get("w")!)), 1), 0),
 * });
 * if (!report.ok) throw new Error(report.rows.map((r) => `${r.name}: ${r.status}`).join("\n"));
 * ```
 *
 * @module
 */

export {
  type Agreement,
  agreement,
  type CoordinateProbe,
  derivedStep,
  epsilonOf,
  formatAgreement,
  probeCoordinate,
  probeIndices,
  resolvableFloor,
  sameBits,
} from "./compare.ts";
export {
  direction,
  type DirectionalRow,
  directionalRow,
  FD32_TOL,
  FD_TOL,
  type FdRow,
  fdRow,
  type FdRowOptions,
  type GradientSubject,
  proveGradients,
  type ProveGradientsOptions,
  type ProveGradientsReport,
  type ProveGradientsRow,
} from "./gradients.ts";
// the tape's tensor and the types it names, which a GradientSubject's loss returns
export type {
  ComputeDType,
  Data,
  Gradients,
  MaybePromise,
  Tape,
  TapeNode,
  Tensor,
} from "../tape/mod.ts";
