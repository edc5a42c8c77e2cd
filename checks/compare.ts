// How numbers are compared (docs/kda.md 4): one agreement metric for tensors, and central
// differences whose step and resolution floor are derived from the loss, not guessed.

import { shown, typeName } from "../base/check.ts";

/** The agreement of `a` with a reference `b`. */
export interface Agreement {
  /** `max|a − b| / max|b|`; NaN when either holds NaN, Infinity when `b` is all zeros but `a` is not. */
  rel: number;
  /** `max|a − b|`. */
  absDiff: number;
  /** `max|b|`. */
  refMax: number;
}

/**
 * `max|a − b| / max|b|`, with both parts kept so a ratio of 0 cannot hide a comparison that never
 * ran. Any NaN in either array makes `rel` NaN, so a check written `!(rel <= tol)` fails.
 *
 * @param a The values under test.
 * @param b The reference.
 * @returns The ratio, the absolute difference and the reference's magnitude.
 */
export function agreement(a: ArrayLike<number>, b: ArrayLike<number>): Agreement {
  if (a.length !== b.length) {
    throw new RangeError(
      `Compared arrays must have equal lengths: got ${a.length} and ${b.length}`,
    );
  }
  let absDiff = 0, refMax = 0, nan = false;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (Number.isNaN(d)) nan = true;
    else if (d > absDiff) absDiff = d;
    const m = Math.abs(b[i]);
    if (m > refMax) refMax = m;
  }
  if (nan) return { rel: NaN, absDiff: NaN, refMax };
  const rel = refMax === 0 ? (absDiff === 0 ? 0 : Infinity) : absDiff / refMax;
  return { rel, absDiff, refMax };
}

/**
 * Whether two arrays hold the same bits (same element type, same length, same bytes): the test of
 * reproducibility, where agreement to a tolerance is not enough.
 *
 * @param a One array.
 * @param b The other.
 * @returns True when every byte matches.
 */
export function sameBits(a: Float64Array | Float32Array, b: Float64Array | Float32Array): boolean {
  // anything else has no bytes of its own to compare, and would compare as equal
  for (const [name, x] of [["a", a], ["b", b]] as const) {
    if (!(x instanceof Float64Array || x instanceof Float32Array)) {
      throw new TypeError(`${name} must be a Float64Array or Float32Array: got ${typeName(x)}`);
    }
  }
  if (a.length !== b.length || a.constructor !== b.constructor) return false;
  const ua = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const ub = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  for (let i = 0; i < ua.length; i++) if (ua[i] !== ub[i]) return false;
  return true;
}

/**
 * Formats an agreement as `rel (abs …, ref …)`.
 *
 * @param x The agreement.
 * @returns One short line.
 */
export function formatAgreement(x: Agreement): string {
  return `${x.rel.toExponential(2)} (abs ${x.absDiff.toExponential(2)}, ref ${
    x.refMax.toExponential(2)
  })`;
}

/**
 * Machine epsilon of a dtype.
 *
 * @param dtype "f64" or "f32".
 * @returns 2^-52 or 2^-23.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { epsilonOf } from "./compare.ts";
 * assert.equal(epsilonOf("f32"), 2 ** -23);
 * ```
 */
export function epsilonOf(dtype: "f64" | "f32"): number {
  if (dtype === "f64") return Number.EPSILON;
  if (dtype === "f32") return 2 ** -23;
  throw new TypeError(`dtype must be "f64" or "f32": got ${shown(dtype)}`);
}

/**
 * The central-difference step `h* = (3·eps·|L| / |g|max)^(1/3)`, which balances the truncation
 * error of the difference against the rounding error of the loss, clamped to `maxFraction` of the
 * parameter's RMS so the probe stays local.
 *
 * @param eps Machine epsilon of the loss.
 * @param lossScale The loss's magnitude |L|.
 * @param gradMax The group's `max|grad|`.
 * @param paramRms The group's RMS value.
 * @param maxFraction The clamp, as a fraction of `paramRms`.
 * @returns The step.
 */
export function derivedStep(
  eps: number,
  lossScale: number,
  gradMax: number,
  paramRms: number,
  maxFraction = 0.1,
): number {
  const need = (name: string, x: number, ok: boolean, what: string) => {
    if (!ok) throw new RangeError(`${name} must be ${what}: got ${shown(x)}`);
  };
  need("eps", eps, eps > 0 && Number.isFinite(eps), "a positive finite number");
  need(
    "lossScale",
    lossScale,
    lossScale > 0 && Number.isFinite(lossScale),
    "a positive finite number",
  );
  need("gradMax", gradMax, gradMax > 0 && Number.isFinite(gradMax), "a positive finite number");
  need("paramRms", paramRms, paramRms >= 0 && Number.isFinite(paramRms), "a finite number ≥ 0");
  need(
    "maxFraction",
    maxFraction,
    maxFraction > 0 && Number.isFinite(maxFraction),
    "a positive finite number",
  );
  const h = Math.cbrt(3 * eps * lossScale / gradMax);
  return paramRms > 0 ? Math.min(h, maxFraction * paramRms) : h;
}

/**
 * The smallest derivative a central difference with step `h` can resolve: the loss's rounding
 * error, with a safety factor of 32, divided by the step.
 *
 * @param eps Machine epsilon of the loss.
 * @param lossScale The loss's magnitude |L|.
 * @param h The step.
 * @returns The floor.
 */
export function resolvableFloor(eps: number, lossScale: number, h: number): number {
  return 32 * eps * lossScale / h;
}

/** The result of probing one coordinate at steps h and h/10. */
export interface CoordinateProbe {
  /** Flat index into the group. */
  index: number;
  /** The gradient under test at that index. */
  grad: number;
  /** Central differences at h and h/10. */
  fd: [number, number];
  /** Floors at h and h/10. */
  floor: [number, number];
  /**
   * `min(rel(h), rel(h/10))` over the steps whose floor the derivative clears; NaN if none, or if
   * the difference at either step is NaN.
   */
  rel: number;
  /** Whether `|grad|` clears the floor at one step at least. */
  resolved: boolean;
}

/**
 * Probes one coordinate by central differences at `h` and `h/10`, judging only steps whose floor
 * the derivative clears. `rel(h) = |fd(h) − g| / |g|`.
 *
 * @param lossAt Evaluates the loss with the coordinate moved by `delta` (and restores it). In a
 *   precision that cannot take the step exactly it returns `{ loss, step }` with the displacement
 *   the coordinate really took, and the difference divides by that.
 * @param grad The gradient under test at the coordinate.
 * @param index The coordinate's flat index (recorded in the probe).
 * @param h The step.
 * @param eps Machine epsilon of the loss.
 * @param lossScale The loss's magnitude.
 * @returns The probe.
 */
export async function probeCoordinate(
  lossAt: (delta: number) => Promise<number | { loss: number; step: number }>,
  grad: number,
  index: number,
  h: number,
  eps: number,
  lossScale: number,
): Promise<CoordinateProbe> {
  const fd: [number, number] = [0, 0];
  const floor: [number, number] = [0, 0];
  // a NaN difference at either step makes the probe NaN (it fails): taking the smaller of the two
  // errors would let the other step's agreement hide it
  let rel = NaN, resolved = false, nan = false;
  for (const [i, step] of [h, h / 10].entries()) {
    const plus = await lossAt(step);
    const minus = await lossAt(-step);
    const [lp, sp] = typeof plus === "number" ? [plus, step] : [plus.loss, plus.step];
    const [lm, sm] = typeof minus === "number" ? [minus, -step] : [minus.loss, minus.step];
    fd[i] = (lp - lm) / (sp - sm);
    // a NaN difference fails the probe at either step, judged or not: a loss that is NaN a step
    // away is no loss to differentiate
    if (Number.isNaN(fd[i])) nan = true;
    floor[i] = resolvableFloor(eps, lossScale, step);
    if (Math.abs(grad) >= floor[i]) {
      resolved = true;
      const r = Math.abs(fd[i] - grad) / Math.abs(grad);
      if (!Number.isNaN(r)) rel = Number.isNaN(rel) ? r : Math.min(rel, r);
    }
  }
  return { index, grad, fd, floor, rel: nan ? NaN : rel, resolved };
}

/**
 * The coordinates to probe in a group: the argmax of `|grad|`, and the first and the last other
 * coordinate in flat order whose `|grad|` is at least a quarter of the maximum. The two are spread
 * over the tensor, and each is large enough that the loss's rounding noise (which is the same for
 * every coordinate) stays small against it, so a relative error of 1e-6 is measurable there.
 *
 * @param grad The group's gradient.
 * @returns One to three distinct flat indices.
 */
export function probeIndices(grad: ArrayLike<number>): number[] {
  if (!(grad?.length >= 1)) {
    throw new RangeError(`grad must hold at least one entry: got length ${shown(grad?.length)}`);
  }
  let top = 0;
  for (let i = 1; i < grad.length; i++) if (Math.abs(grad[i]) > Math.abs(grad[top])) top = i;
  const large = (i: number) => i !== top && Math.abs(grad[i]) >= Math.abs(grad[top]) / 4;
  const picks = [top];
  const first = Array.prototype.findIndex.call(grad, (_: number, i: number) => large(i));
  if (first >= 0) picks.push(first);
  for (let i = grad.length - 1; i > first; i--) {
    if (large(i)) {
      picks.push(i);
      break;
    }
  }
  return picks;
}
