// Per-group gradient checks that know nothing of KDA: central differences with a derived step and a
// resolvable floor, an exact directional check by forward mode, and a bit-identical rerun. The
// layer proof (prove.ts) uses the row builders; `proveGradients` runs them on anyone's layer.

import { type Data, jvp, Tape, Tensor } from "../tape/mod.ts";
import { mulberry32 } from "../kda/layer/_random.ts";
import {
  type CoordinateProbe,
  derivedStep,
  epsilonOf,
  probeCoordinate,
  probeIndices,
  sameBits,
} from "./compare.ts";

/** Tolerance of a resolved central difference in f64 (docs/kda.md 4). */
export const FD_TOL = 1e-6;
/**
 * Tolerance of a resolved central difference in the f32 arm's own precision. At the step derived
 * for f32 the truncation and rounding errors are of a few percent (5.3% measured on decay.a_log at
 * the trainer shape), so this column shows what f32 can resolve and catches only gross errors (a
 * wrong sign, a factor of two); the f64 differences and the exact directional check carry the
 * precision of the proof.
 */
export const FD32_TOL = 0.5;

/** One group's central-difference row. */
export interface FdRow {
  /** Group name. */
  name: string;
  /** Whether any gradient entry is non-zero. */
  nonZero: boolean;
  /** Whether every gradient entry is finite. */
  finite: boolean;
  /** `max|grad|`. */
  gradMax: number;
  /** The derived step h*. */
  step: number;
  /** Epsilon of the precision the differences were taken in. */
  eps: number;
  /** The probed coordinates. */
  probes: CoordinateProbe[];
  /** The worst probe's `min(rel(h), rel(h/10))` (NaN when nothing was probed). */
  rel: number;
  /** Whether every probe cleared its floor. */
  resolved: boolean;
  /** Whether the row holds: non-zero, finite, resolved and within the tolerance. */
  ok: boolean;
}

/**
 * Central differences of one group at up to three coordinates (docs/kda.md 4).
 *
 * @param name The group's name.
 * @param data The group's live values (moved and restored by `lossAt`).
 * @param grad The gradient under test.
 * @param lossAt The loss with coordinate `index` moved by `delta`; it must restore the value.
 * @param options Precision, loss magnitude, tolerance, and the number of coordinates.
 * @returns The row.
 */
export async function fdRow(
  name: string,
  data: ArrayLike<number>,
  grad: ArrayLike<number>,
  lossAt: (index: number, delta: number) => Promise<number | { loss: number; step: number }>,
  options: { dtype: "f64" | "f32"; lossScale: number; tol: number; probes?: number },
): Promise<FdRow> {
  let gradMax = 0, finite = true, sumSq = 0;
  for (let i = 0; i < grad.length; i++) {
    if (!Number.isFinite(grad[i])) finite = false;
    gradMax = Math.max(gradMax, Math.abs(grad[i]));
  }
  for (let i = 0; i < data.length; i++) sumSq += data[i] * data[i];
  const rms = Math.sqrt(sumSq / Math.max(1, data.length));
  const nonZero = gradMax > 0;
  const eps = epsilonOf(options.dtype);
  const step = nonZero && finite ? derivedStep(eps, options.lossScale, gradMax, rms) : NaN;
  const probes: CoordinateProbe[] = [];
  if (nonZero && finite) {
    for (const index of probeIndices(grad).slice(0, options.probes ?? 3)) {
      probes.push(
        await probeCoordinate(
          (delta) => lossAt(index, delta),
          grad[index],
          index,
          step,
          eps,
          options.lossScale,
        ),
      );
    }
  }
  const resolved = probes.length > 0 && probes.every((p) => p.resolved);
  const rel = probes.reduce((m, p) => Math.max(m, p.resolved ? p.rel : 0), probes.length ? 0 : NaN);
  return {
    name,
    nonZero,
    finite,
    gradMax,
    step,
    eps,
    probes,
    rel,
    resolved,
    ok: nonZero && finite && resolved && rel <= options.tol,
  };
}

/** An exact directional check of one group: ⟨∇L, u⟩ against the forward-mode J·u. */
export interface DirectionalRow {
  /** Group name. */
  name: string;
  /** J·u of the loss, by forward mode on the reference. */
  jvp: number;
  /** ⟨∇L, u⟩ from the gradient under test. */
  vjp: number;
  /** `|jvp − vjp| / Σ|∇L ⊙ u|` (the scale of the inner product, immune to cancellation). */
  rel: number;
  /** Whether `rel` is within the tolerance. */
  ok: boolean;
  /** Why the check could not run, when it could not. */
  skipped?: string;
}

/** A seeded direction of `n` entries, uniform in [−1, 1). */
export function direction(n: number, seed: number): Float64Array {
  const uniform = mulberry32(seed);
  return Float64Array.from({ length: n }, () => 2 * uniform() - 1);
}

/**
 * Compares a forward-mode directional derivative with the inner product of a gradient and the
 * direction.
 *
 * @param name The group's name.
 * @param jvpValue J·u from forward mode.
 * @param grad The gradient under test.
 * @param u The direction.
 * @param tol The tolerance on the scaled difference.
 * @returns The row.
 */
export function directionalRow(
  name: string,
  jvpValue: number,
  grad: ArrayLike<number>,
  u: ArrayLike<number>,
  tol: number,
): DirectionalRow {
  let vjp = 0, scale = 0;
  for (let i = 0; i < u.length; i++) {
    vjp += grad[i] * u[i];
    scale += Math.abs(grad[i] * u[i]);
  }
  const diff = Math.abs(jvpValue - vjp);
  const rel = scale === 0 ? (diff === 0 ? 0 : Infinity) : diff / scale;
  return { name, jvp: jvpValue, vjp, rel, ok: rel <= tol };
}

/** A layer to prove: its named parameters and its scalar loss as a function of them. */
export interface GradientSubject {
  /** The parameter groups, f64. */
  parameters: Map<string, { data: Float64Array; shape: number[] }>;
  /** The loss (one element) built from tape ops on the given parameter tensors. */
  loss: (params: Map<string, Tensor>) => Tensor | Promise<Tensor>;
}

/** Options of {@linkcode proveGradients}. */
export interface ProveGradientsOptions {
  /** Seed of the directions (default 0). */
  seed?: number;
  /** Tolerance of the directional check (default 1e-10). */
  directionalTol?: number;
  /** Tolerance of resolved central differences (default 1e-6). */
  fdTol?: number;
}

/** One group's verdict from {@linkcode proveGradients}. */
export interface ProveGradientsRow {
  /** Group name. */
  name: string;
  /** Whether every check of the group holds. */
  ok: boolean;
  /** A one-line status: RESOLVED ok, UNRESOLVED, FAIL and why. */
  status: string;
  /** The central differences. */
  fd: FdRow;
  /** The directional check. */
  directional: DirectionalRow;
}

/** What {@linkcode proveGradients} measured. */
export interface ProveGradientsReport {
  /** Whether every group holds and the rerun is bit-identical. */
  ok: boolean;
  /** One row per group. */
  rows: ProveGradientsRow[];
  /** The loss. */
  loss: number;
  /** Whether a second backward gave the same bits. */
  reproducible: boolean;
}

async function lossAndGrads(
  subject: GradientSubject,
): Promise<{ loss: number; grads: Map<string, Data> }> {
  const tape = new Tape("f64");
  try {
    const vars = new Map<string, Tensor>();
    for (const [name, p] of subject.parameters) vars.set(name, tape.variable(p.data, p.shape));
    const y = await subject.loss(vars);
    if (!(y instanceof Tensor) || y.size !== 1) {
      throw new TypeError(
        `subject.loss must return a one-element Tensor: got ${
          y instanceof Tensor ? `${y.size} elements` : typeof y
        }`,
      );
    }
    const byTensor = await tape.backward(y);
    const grads = new Map<string, Data>();
    for (const [name, t] of vars) grads.set(name, byTensor.get(t) ?? new Float64Array(t.size));
    return { loss: y.data[0], grads };
  } finally {
    tape.dispose();
  }
}

/**
 * Proves the gradients of any f64 layer, group by group: central differences at a derived step
 * with a resolvable floor, an exact directional check by forward mode (where every op on the path
 * has a JVP rule; a custom node without one skips that column and says so), and a bit-identical
 * rerun of the backward.
 *
 * @param subject The named parameters and the loss built from tape ops on them.
 * @param options Seed and tolerances.
 * @returns Whether it holds, and a row per group.
 *
 * @example Proving a small layer
 * ```ts
 * import { proveGradients } from "@deltanet/kda/checks";
 * import { linear, mul, sum, Tensor } from "@deltanet/kda/tape";
 * const x = new Tensor(Float64Array.from({ length: 6 }, (_, i) => i / 6), [2, 3]);
 * const report = await proveGradients({
 *   parameters: new Map([["w", { data: Float64Array.of(0.1, -0.2, 0.3, 0.4, 0.5, -0.6), shape: [2, 3] }]]),
 *   loss: (p) => {
 *     const y = linear(x, p.get("w")!);
 *     return sum(sum(mul(y, y), 1), 0);
 *   },
 * });
 * console.log(report.ok, report.rows[0].status);
 * ```
 */
export async function proveGradients(
  subject: GradientSubject,
  options: ProveGradientsOptions = {},
): Promise<ProveGradientsReport> {
  if (!(subject?.parameters instanceof Map) || typeof subject.loss !== "function") {
    throw new TypeError(
      "subject must have parameters (a Map) and loss (a function): got something else",
    );
  }
  const seed = options.seed ?? 0;
  const dirTol = options.directionalTol ?? 1e-10;
  const fdTol = options.fdTol ?? FD_TOL;
  const { loss, grads } = await lossAndGrads(subject);
  const again = await lossAndGrads(subject);
  const reproducible = [...grads].every(([name, g]) => sameBits(g, again.grads.get(name)!));
  const lossScale = Math.max(Math.abs(loss), Number.MIN_VALUE);
  const constants = () => {
    const m = new Map<string, Tensor>();
    for (const [name, p] of subject.parameters) m.set(name, new Tensor(p.data, p.shape));
    return m;
  };
  const rows: ProveGradientsRow[] = [];
  const names = [...subject.parameters.keys()];
  for (const [gi, name] of names.entries()) {
    const p = subject.parameters.get(name)!;
    const grad = grads.get(name)!;
    const fd = await fdRow(name, p.data, grad, async (index, delta) => {
      const original = p.data[index];
      p.data[index] = original + delta;
      try {
        return (await subject.loss(constants())).data[0];
      } finally {
        p.data[index] = original;
      }
    }, { dtype: "f64", lossScale, tol: fdTol });
    const u = direction(p.data.length, seed * 1000 + gi);
    let directional: DirectionalRow;
    try {
      const primals = names.map((n) =>
        new Tensor(subject.parameters.get(n)!.data, subject.parameters.get(n)!.shape)
      );
      const tangents = names.map((n) =>
        n === name ? u : new Float64Array(subject.parameters.get(n)!.data.length)
      );
      const { tangents: [dl] } = await jvp(
        (...ps: Tensor[]) => subject.loss(new Map(names.map((n, i) => [n, ps[i]]))),
        primals,
        tangents,
      );
      directional = directionalRow(name, dl[0], grad, u, dirTol);
    } catch (error) {
      directional = {
        name,
        jvp: NaN,
        vjp: NaN,
        rel: NaN,
        ok: true,
        skipped: error instanceof Error ? error.message : String(error),
      };
    }
    // Unresolved by central differences is no pass by itself: the exact directional check must
    // then have run and held.
    const ok = fd.nonZero && fd.finite && directional.ok &&
      (fd.resolved ? fd.ok : directional.skipped === undefined);
    const status = !fd.nonZero
      ? "FAIL (zero gradient)"
      : !fd.finite
      ? "FAIL (non-finite gradient)"
      : !directional.ok
      ? `FAIL (directional ${directional.rel.toExponential(2)})`
      : !fd.resolved
      ? (directional.skipped
        ? "UNRESOLVED (no directional check)"
        : "UNRESOLVED by FD, exact by JVP ok")
      : fd.ok
      ? "RESOLVED ok"
      : `FAIL (central differences ${fd.rel.toExponential(2)})`;
    rows.push({ name, ok, status, fd, directional });
  }
  return { ok: reproducible && rows.every((r) => r.ok), rows, loss, reproducible };
}
