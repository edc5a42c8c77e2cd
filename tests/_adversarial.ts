// The seeded cross-arm sweep shared by tests/adversarial_test.ts (a small slice, in every test run)
// and tests/fuzz.ts (`deno task fuzz`, ten times more): shapes drawn from the edges, gates and
// write strengths from their extremes, every arm against its reference on the same bytes.

import { kda, kdaVjp } from "../mod.ts";
import type { Arm, ChunkSize, Float, KdaCotangents, KdaProblem } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { agreement, mulberry32, normal } from "./_fixtures.ts";
import type { ComputeDType } from "../base/dtype.ts";

/** Gates mixed per element, from zero to far below what any exponent can resolve. */
export const EDGE_GATES: readonly number[] = [0, -1e-30, -5, -1e4, -1e20];
/** Write strengths from none to an over-relaxed update. */
export const EDGE_BETAS: readonly number[] = [0, 1e-6, 1, 2];
/** Head dimensions at the edges. */
export const EDGE_DIMS: readonly number[] = [1, 3, 64, 256];

/** Tolerances: f64 arms agree to rounding; the f32 gpu arm keeps the gpu arm's bars. */
export const TOL = { f64: 1e-10, f32Outputs: 2e-6, f32Grads: 2e-5 } as const;

/** One drawn case. */
export interface EdgeCase {
  label: string;
  problem: KdaProblem<Float64Array>;
  cotangents: KdaCotangents<Float64Array>;
  chunkSize: ChunkSize;
}

/** Work bound on T·K·V·B·H, so the ops arm's tape stays small; larger draws shorten T. */
const WORK_BOUND = 3_000_000;

/**
 * Draws case number `index` of the sweep with seed `seed`: T ∈ {1, C−1, C, C+1, 4C+3}, K and V
 * from the edge dimensions, gates and betas mixed per element, h0 and dht with or without.
 */
export function edgeCase(seed: number, index: number): EdgeCase {
  const rand = mulberry32((seed * 7919 + index * 104729) >>> 0);
  const gauss = normal(rand);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
  const chunkSize = pick([16, 32, 64] as const);
  const B = pick([1, 2]), H = pick([1, 2]);
  const K = pick(EDGE_DIMS), V = pick(EDGE_DIMS);
  const lengths = [1, chunkSize - 1, chunkSize, chunkSize + 1, 4 * chunkSize + 3];
  let T = pick(lengths);
  while (T * K * V * B * H > WORK_BOUND && T > 1) T = lengths[lengths.indexOf(T) - 1] ?? 1;
  const make = (n: number, draw: () => number) => Float64Array.from({ length: n }, draw);
  const q = make(B * T * H * K, gauss);
  const k = make(B * T * H * K, gauss);
  for (let row = 0; row < B * T * H; row++) {
    let ss = 0;
    for (let d = 0; d < K; d++) ss += k[row * K + d] ** 2;
    for (let d = 0; d < K; d++) k[row * K + d] /= Math.sqrt(ss);
  }
  const withH0 = rand() < 0.5, withDht = rand() < 0.5;
  const problem: KdaProblem<Float64Array> = {
    B,
    T,
    H,
    K,
    V,
    scale: K ** -0.5,
    q,
    k,
    v: make(B * T * H * V, gauss),
    g: make(B * T * H * K, () => pick(EDGE_GATES)),
    beta: make(B * T * H, () => pick(EDGE_BETAS)),
    ...(withH0 ? { h0: make(B * H * K * V, () => 0.5 * gauss()) } : {}),
  };
  const cotangents: KdaCotangents<Float64Array> = {
    dout: make(B * T * H * V, gauss),
    ...(withDht ? { dht: make(B * H * K * V, gauss) } : {}),
  };
  const label = `#${index} B=${B} T=${T} H=${H} K=${K} V=${V} C=${chunkSize}` +
    `${withH0 ? " h0" : ""}${withDht ? " dht" : ""}`;
  return { label, problem, cotangents, chunkSize };
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
  const compare = (pair: string, a: Map<string, Float>, b: Map<string, Float>, tol: number) => {
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
      const residue = refMax < bar * caseScale;
      const rel = residue ? absDiff / caseScale : measured.rel;
      if (rel > worst[pair] || Number.isNaN(rel)) worst[pair] = rel;
      if (!(rel <= bar)) {
        disagreements.push({
          label: c.label,
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
  };
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
