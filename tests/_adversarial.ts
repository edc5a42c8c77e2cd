// The seeded cross-arm sweep of the op shared by tests/adversarial_test.ts (a small slice, in every
// test run) and tests/fuzz.ts (`deno task fuzz`, a hundred times more): shapes drawn from the edges
// in every layout (regular, packed with zero-length sequences, grouped value heads, both), gates
// and write strengths from their extremes or every gate near one strong level, every arm against
// its reference on the same bytes.

import { kda, kdaVjp } from "../mod.ts";
import type { Arm, ChunkSize, Float, KdaCotangents, KdaProblem } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { agreement, mulberry32, normal } from "./_fixtures.ts";
import type { ComputeDType } from "../base/dtype.ts";

/** Gates mixed per element, from zero to far below what any exponent can resolve. */
export const EDGE_GATES: readonly number[] = [0, -1e-30, -5, -1e4, -1e20];
/**
 * Gate levels of the strong regime: every gate of the case near one level, from where the f64
 * gradient through dht used to lose its sign (−40) to where e^g underflows to 0 (−745).
 */
export const STRONG_GATES: readonly number[] = [-20, -50, -300, -700, -720, -745];
/** Write strengths from none to an over-relaxed update. */
export const EDGE_BETAS: readonly number[] = [0, 1e-6, 1, 2];
/** Head dimensions at the edges. */
export const EDGE_DIMS: readonly number[] = [1, 3, 64, 256];

/** Tolerances: f64 arms agree to rounding; the f32 gpu arm keeps the gpu arm's bars. */
export const TOL = { f64: 1e-10, f32Outputs: 2e-6, f32Grads: 2e-5 } as const;

/**
 * The smallest positive subnormals of f64 and f32: below the normals a result resolves only their
 * multiples, so a difference of at most 16 of them is within the dtype's resolution whatever the
 * reference's size.
 */
const TINY = { f64: 2 ** -1074, f32: 2 ** -149 } as const;

/**
 * The layouts a case runs in, taken in turn by case index so that every window of four cases has
 * each: a regular batch, a packed batch (cuSeqlens, zero-length sequences included), grouped
 * value heads (HV a multiple of H), and both.
 */
export const LAYOUTS = ["regular", "packed", "grouped", "packed+grouped"] as const;

/** One drawn case. */
export interface EdgeCase {
  label: string;
  problem: KdaProblem<Float64Array>;
  cotangents: KdaCotangents<Float64Array>;
  chunkSize: ChunkSize;
  /**
   * Every gate near one strong level (docs/kda.md 2.2): each pair of arms is then held to its bar
   * per tensor (above a floor at the dtype's subnormals), where a tiny gradient is the true value,
   * not the residue of a cancellation.
   */
  strong: boolean;
}

/** Work bound on T·K·V·B·HV, so the ops arm's tape stays small; larger draws shorten T. */
const WORK_BOUND = 3_000_000;

/** The offsets of a packed batch of these lengths. */
function offsets(lengths: number[]): Int32Array {
  const cu = new Int32Array(lengths.length + 1);
  lengths.forEach((n, i) => (cu[i + 1] = cu[i] + n));
  return cu;
}

/**
 * Draws case number `index` of the sweep with seed `seed`: its layout from {@linkcode LAYOUTS}
 * by index; T ∈ {1, C−1, C, C+1, 4C+3} (a packed batch: 1 to 4 sequences of 0, 1, C−1, C, C+1 or
 * 2C+3 tokens, at least one token in all); K and V from the edge dimensions; every third window of
 * four cases in the strong-gate regime (gates near one level of STRONG_GATES, betas in
 * (0.02, 0.98), dht always), the others with gates and betas mixed per element from their edges;
 * h0 and dht with or without.
 */
export function edgeCase(seed: number, index: number): EdgeCase {
  const rand = mulberry32((seed * 7919 + index * 104729) >>> 0);
  const gauss = normal(rand);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
  const layout = LAYOUTS[index % LAYOUTS.length];
  const strong = Math.floor(index / LAYOUTS.length) % 3 === 2;
  const packed = layout === "packed" || layout === "packed+grouped";
  const chunkSize = pick([16, 32, 64] as const);
  const H = pick([1, 2]);
  const HV = layout === "grouped" || layout === "packed+grouped" ? H * pick([2, 3]) : H;
  let B = packed ? 1 : pick([1, 2]);
  const K = pick(EDGE_DIMS), V = pick(EDGE_DIMS);
  const lengths = [1, chunkSize - 1, chunkSize, chunkSize + 1, 4 * chunkSize + 3];
  let T = pick(lengths);
  let cuSeqlens: Int32Array | undefined;
  if (packed) {
    const sizes = [0, 1, chunkSize - 1, chunkSize, chunkSize + 1, 2 * chunkSize + 3];
    const seqs = Array.from({ length: 1 + Math.floor(rand() * 4) }, () => pick(sizes));
    if (!seqs.some((n) => n > 0)) seqs[Math.floor(rand() * seqs.length)] = 1;
    // Shorten the longest sequences until the work bound holds (the ops arm's tape).
    while (seqs.reduce((a, n) => a + n, 0) * K * V * HV > WORK_BOUND) {
      const i = seqs.indexOf(Math.max(...seqs));
      seqs[i] = Math.max(1, Math.floor(seqs[i] / 2));
    }
    cuSeqlens = offsets(seqs);
    T = cuSeqlens[seqs.length];
    B = 1;
  }
  while (T * K * V * B * HV > WORK_BOUND && T > 1 && !packed) {
    T = lengths[lengths.indexOf(T) - 1] ?? 1;
  }
  const N = cuSeqlens === undefined ? B : cuSeqlens.length - 1;
  const make = (n: number, draw: () => number) => Float64Array.from({ length: n }, draw);
  const q = make(B * T * H * K, gauss);
  const k = make(B * T * H * K, gauss);
  for (let row = 0; row < B * T * H; row++) {
    let ss = 0;
    for (let d = 0; d < K; d++) ss += k[row * K + d] ** 2;
    for (let d = 0; d < K; d++) k[row * K + d] /= Math.sqrt(ss);
  }
  const level = pick(STRONG_GATES);
  const withH0 = rand() < 0.5, withDht = strong || rand() < 0.5;
  const problem: KdaProblem<Float64Array> = {
    B,
    T,
    H,
    K,
    V,
    scale: K ** -0.5,
    q,
    k,
    v: make(B * T * HV * V, gauss),
    g: make(B * T * HV * K, () => strong ? level * (1 + 0.05 * rand()) : pick(EDGE_GATES)),
    beta: make(B * T * HV, () => strong ? 0.02 + 0.96 * rand() : pick(EDGE_BETAS)),
    ...(withH0 ? { h0: make(N * HV * K * V, () => 0.5 * gauss()) } : {}),
    ...(HV !== H ? { HV } : {}),
    ...(cuSeqlens !== undefined ? { cuSeqlens } : {}),
  };
  const cotangents: KdaCotangents<Float64Array> = {
    dout: make(B * T * HV * V, gauss),
    ...(withDht ? { dht: make(N * HV * K * V, gauss) } : {}),
  };
  const label = `#${index} ${layout} B=${B} T=${T} H=${H}${HV !== H ? ` HV=${HV}` : ""} ` +
    `K=${K} V=${V} C=${chunkSize}${cuSeqlens ? ` cuSeqlens=[${cuSeqlens.join(",")}]` : ""}` +
    `${strong ? ` g≈${level}` : ""}${withH0 ? " h0" : ""}${withDht ? " dht" : ""}`;
  return { label, problem, cotangents, chunkSize, strong };
}

function cast<P extends object>(x: P, dtype: ComputeDType): P {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(x)) {
    out[key] = value instanceof Float64Array && dtype === "f32" ? Float32Array.from(value) : value;
  }
  return out as P;
}

/** Outputs and gradients of one arm on one case. */
export async function runArm(
  c: EdgeCase,
  arm: Arm,
  dtype: ComputeDType,
): Promise<Map<string, Float>> {
  const problem = cast(c.problem, dtype) as KdaProblem;
  const cotangents = cast(c.cotangents, dtype) as KdaCotangents;
  // the edge betas reach 2, the top of the range flash-linear-attention's allow_neg_eigval allows
  const options = { arm, chunkSize: c.chunkSize, strict: true, allowNegEigval: true };
  const { o, ht } = await kda(problem, options);
  const grads = await kdaVjp(problem, cotangents, options);
  const all = new Map<string, Float>([["o", o], ["ht", ht]]);
  for (const name of GRAD_NAMES) all.set(name, grads[name]);
  return all;
}

/** One disagreement: which pair of arms, which tensor, by how much. */
export interface Disagreement {
  label: string;
  pair: string;
  tensor: string;
  detail: string;
}

/** What comparing arms collects: the disagreements and the worst ratio per pair of arms. */
export interface Findings {
  disagreements: Disagreement[];
  worst: Record<string, number>;
}

/**
 * Compares every tensor of arm `a` with the reference arm `b` at `tol` (f32 gradients at the f32
 * gradient bar), adding what fails to `into`.
 *
 * @param label The case.
 * @param pair The pair of arms, for the report.
 * @param a The tensors under test, by name.
 * @param b The reference's tensors.
 * @param tol TOL.f64 or TOL.f32Outputs.
 * @param strong Whether the case is in the strong-gate regime (see {@linkcode EdgeCase}).
 * @param into Where the disagreements and the worst ratios go.
 */
export function compareArms(
  label: string,
  pair: string,
  a: Map<string, Float>,
  b: Map<string, Float>,
  tol: number,
  strong: boolean,
  into: Findings,
): void {
  const { worst, disagreements } = into;
  worst[pair] ??= 0;
  // A reference tensor below tol × the case's largest reference magnitude holds nothing but the
  // rounding residue of an exact cancellation (β k·k = 1 wiping the state, say, where the true
  // value is 0): a relative test cannot judge it, so its difference is judged against that
  // largest magnitude instead, and the detail says so.
  let caseScale = 0;
  for (const ref of b.values()) caseScale = Math.max(caseScale, agreement(ref, ref).refMax);
  for (const [tensor, ref] of b) {
    const measured = agreement(a.get(tensor)!, ref);
    const { absDiff, refMax } = measured;
    const bar = tol === TOL.f32Outputs && !["o", "ht"].includes(tensor) ? TOL.f32Grads : tol;
    // In the strong-gate regime a tiny reference is the true value (a gradient of e^{−50}), so it
    // is judged against itself; either way a difference within 16 subnormal steps of the dtype
    // passes, where a dtype keeps only absolute resolution.
    const own = strong;
    const floor = 16 * (tol === TOL.f64 ? TINY.f64 : TINY.f32);
    const residue = !own && refMax < bar * caseScale;
    const rel = absDiff <= floor ? 0 : residue ? absDiff / caseScale : measured.rel;
    if (rel > worst[pair] || Number.isNaN(rel)) worst[pair] = rel;
    if (!(rel <= bar)) {
      disagreements.push({
        label,
        pair,
        tensor,
        detail: `max|a−b|/max|b| = ${rel.toExponential(2)} (max|a−b| ${
          absDiff.toExponential(2)
        }, max|b| ${refMax.toExponential(2)}${
          residue
            ? `, residue-sized reference: divided by the case's ${caseScale.toExponential(2)}`
            : ""
        }, tol ${bar})`,
      });
    }
  }
}

/**
 * Runs one case on every arm and compares: ops against cpu in f64, and, with `gpu`, the gpu arm
 * against the cpu arm on the same f32 bytes.
 *
 * @returns The disagreements (empty when every tensor agrees) and the worst ratio per pair.
 */
export async function checkCase(
  c: EdgeCase,
  gpu: boolean,
): Promise<
  { disagreements: Disagreement[]; worst: Record<string, number>; conditioned: string[] }
> {
  const disagreements: Disagreement[] = [];
  const conditioned: string[] = [];
  const worst: Record<string, number> = {};
  const compare = (pair: string, a: Map<string, Float>, b: Map<string, Float>, tol: number) =>
    compareArms(c.label, pair, a, b, tol, c.strong, { disagreements, worst });
  const ops64 = await runArm(c, "ops", "f64");
  const cpu64 = await runArm(c, "cpu", "f64");
  compare("cpu vs ops (f64)", cpu64, ops64, TOL.f64);
  if (gpu) {
    const cpu32 = await runArm(c, "cpu", "f32");
    const gpu32 = await runArm(c, "gpu", "f32");
    const before = disagreements.length;
    compare("gpu vs cpu (f32)", gpu32, cpu32, TOL.f32Outputs);
    if (disagreements.length > before) {
      // The f32 bars assume a well-conditioned case. Where an edge case cancels (β k·k = 1 wiping
      // the state, β = 2 reflections), f32 cannot do better than what f32 attains on it: the
      // larger of the effect of rounding the inputs (the cpu arm on the inputs moved by one f32
      // rounding) and the error of the plain recurrence computed in f32 (the ops arm on an f32
      // tape). A tensor off by more than the bar but within 16 times that is counted as
      // ill-conditioned, not as a disagreement, and listed.
      const moved = await runArm(perturbed(c), "cpu", "f32");
      const plain32 = await runArm(c, "ops", "f32");
      const failed = disagreements.splice(before);
      for (const d of failed) {
        const ref = cpu32.get(d.tensor)!;
        const attainable = Math.max(
          agreement(moved.get(d.tensor)!, ref).rel,
          agreement(plain32.get(d.tensor)!, ref).rel,
        );
        const error = agreement(gpu32.get(d.tensor)!, ref).rel;
        const note = `; f32 attains ${attainable.toExponential(2)} here`;
        if (error <= 16 * attainable) {
          conditioned.push(`${d.label} ${d.tensor}: ${d.detail}${note}`);
        } else disagreements.push({ ...d, detail: d.detail + note });
      }
    }
  }
  return { disagreements, worst, conditioned };
}

/** The case with every input moved by up to one f32 rounding (relative 2^-24), seeded. */
function perturbed(c: EdgeCase): EdgeCase {
  const rand = normal(mulberry32(0x5eed));
  const move = (a: Float64Array) =>
    a.map((v) => v * (1 + 2 ** -24 * Math.max(-1, Math.min(1, rand()))));
  const p = c.problem;
  return {
    ...c,
    problem: {
      ...p,
      q: move(p.q),
      k: move(p.k),
      v: move(p.v),
      g: move(p.g),
      beta: move(p.beta),
      ...(p.h0 ? { h0: move(p.h0) } : {}),
    },
  };
}
