// The per-group gradient proof: central differences of the exact f64 layer, a comparison with an
// independent reference on the same bytes, a falsification that must go red, and a bit-identical
// rerun. `runProof` returns everything it measured; cli.ts prints it and sets the exit status.

import { KdaModule, type KdaModuleProofOptions, PARAMETER_TABLE } from "../kda/module.ts";
import type { Arm } from "../kda/_types.ts";
import type { KdaConfig } from "../kda/config.ts";
import { mulberry32, normal, subSeed } from "../kda/_random.ts";
import type { SeamCounts } from "../seam/seam.ts";
import { resetSeamCounts, seamCounts, seamDecisions } from "../kda/op.ts";
import {
  type Agreement,
  agreement,
  type CoordinateProbe,
  derivedStep,
  epsilonOf,
  probeCoordinate,
  probeIndices,
  sameBits,
} from "./compare.ts";

/** The groups the layer must have, spelled out here rather than read from the layer. */
export const EXPECTED_GROUPS: readonly string[] = [
  "q_proj.weight",
  "k_proj.weight",
  "v_proj.weight",
  "decay.w_down.weight",
  "decay.w_up.weight",
  "decay.b_alpha",
  "decay.a_log",
  "beta_proj.weight",
  "o_norm_w",
  "o_gate.weight",
  "o_proj.weight",
];

/** The three more groups of the short-conv layer. */
export const CONV_GROUPS: readonly string[] = ["q_conv_w", "k_conv_w", "v_conv_w"];

/** Groups after the KDA op: the falsification must leave these green. */
const DOWNSTREAM_GROUPS: readonly string[] = PARAMETER_TABLE.filter((p) => p.afterOp).map((p) =>
  p.name
);

/** What `runProof` is told. */
export interface ProofOptions {
  /** The arm whose gradients are proven. */
  arm: Arm;
  /** Overrides of the default config (shortConv for the 14-group layer). */
  config?: Partial<KdaConfig>;
  /** Input batch and length; default [2, 256]. */
  dims?: [number, number];
  /** Progress messages (stderr in the CLI). */
  progress?: (message: string) => void;
}

/** One parameter group's central-difference row. */
export interface GroupRow {
  name: string;
  shape: readonly number[];
  nonZero: boolean;
  finite: boolean;
  gradMax: number;
  step: number;
  probes: CoordinateProbe[];
  /** The worst probe's `min(rel(h), rel(h/10))`. */
  rel: number;
  resolved: boolean;
  ok: boolean;
}

/** One group's agreement between the arm under test and the reference arm. */
export interface ReferenceRow {
  name: string;
  agreement: Agreement;
  ok: boolean;
}

/** Everything a proof measured. */
export interface ProofReport {
  arm: Arm;
  referenceArm: Arm;
  dtype: "f64" | "f32";
  groups: { missing: string[]; extra: string[] };
  loss: number;
  lossScale: number;
  fdArm: Arm;
  rows: GroupRow[];
  forward: { rel: number; tol: number; ok: boolean };
  gradTol: number;
  reference: ReferenceRow[];
  falsification: { red: string[]; expectedRed: string[]; ok: boolean; note: string };
  reproducible: { ok: boolean; mismatched: string[] };
  seam: SeamCounts;
  declines: string[];
  ok: boolean;
}

/** Tolerances: f64 arms must agree with the reference to rounding; the f32 GPU arm to f32 accuracy. */
const FD_TOL = 1e-6;
const F64_GRAD_TOL = 1e-10;
const F64_FORWARD_TOL = 1e-12;
const F32_GRAD_TOL = 1e-4;
const F32_FORWARD_TOL = 1e-5;

function draw(seed: number, stream: string, n: number): Float64Array {
  const gauss = normal(mulberry32(subSeed(seed, stream)));
  return Float64Array.from({ length: n }, gauss);
}

/** Σ y·r and Σ|y·r|, accumulated in f64. */
function lossOf(y: ArrayLike<number>, r: ArrayLike<number>): { loss: number; scale: number } {
  let loss = 0, scale = 0;
  for (let i = 0; i < y.length; i++) {
    loss += y[i] * r[i];
    scale += Math.abs(y[i] * r[i]);
  }
  return { loss, scale };
}

/**
 * Runs the gradient proof for one arm.
 *
 * @param options The arm, the config and the input dims.
 * @returns The report; `ok` is true only when every check holds.
 */
export async function runProof(options: ProofOptions): Promise<ProofReport> {
  const progress = options.progress ?? (() => {});
  const arm = options.arm;
  const [B, T] = options.dims ?? [2, 256];
  const dtype = arm === "gpu" ? "f32" : "f64";
  // The f64 layer is the exact reference; an f32 arm gets the same values rounded once, and the
  // f64 side is then set to those rounded values, so both sides see the same bytes.
  const tested = new KdaModule(options.config ?? {}, { dtype });
  const exact = new KdaModule(options.config ?? {}, { dtype: "f64" });
  for (const [name, p] of tested.parameters()) exact.parameters().get(name)!.data.set(p.data);
  const { dModel: D, seed, shortConv } = exact.config;
  const xTested = dtype === "f32"
    ? Float32Array.from(draw(seed, "prove.x", B * T * D))
    : draw(seed, "prove.x", B * T * D);
  const x = Float64Array.from(xTested);
  const rTested = dtype === "f32"
    ? Float32Array.from(draw(seed, "prove.r", B * T * D))
    : draw(seed, "prove.r", B * T * D);
  const r = Float64Array.from(rTested);

  const expected = [...EXPECTED_GROUPS, ...(shortConv ? CONV_GROUPS : [])];
  const names = [...exact.parameters().keys()];
  const groups = {
    missing: expected.filter((n) => !names.includes(n)),
    extra: names.filter((n) => !expected.includes(n)),
  };

  const referenceArm: Arm = arm === "ops" ? "cpu" : "ops";
  const fdArm: Arm = arm === "gpu" ? "cpu" : arm;
  const run = (
    m: KdaModule,
    input: Float64Array | Float32Array,
    cot: Float64Array | Float32Array,
    o: KdaModuleProofOptions,
  ) => m.vjp(input, [B, T], cot, o);

  resetSeamCounts();
  progress(`backward on the ${arm} arm (${dtype})`);
  const first = await run(tested, xTested, rTested, { arm, strict: true });
  const seam = seamCounts();
  const declines = seamDecisions().map((d) => `${d.wanted} -> ${d.ran}: ${d.reason}`);

  progress(`reference backward on the ${referenceArm} arm (f64)`);
  const ref = await run(exact, x, r, { arm: referenceArm, strict: true });
  const lossTested = lossOf(first.y, r), lossRef = lossOf(ref.y, r);
  const forwardRel = Math.abs(lossTested.loss - lossRef.loss) / lossRef.scale;
  const forwardTol = dtype === "f64" ? F64_FORWARD_TOL : F32_FORWARD_TOL;
  const gradTol = dtype === "f64" ? F64_GRAD_TOL : F32_GRAD_TOL;
  const reference: ReferenceRow[] = names.map((name) => {
    const a = agreement(first.grads.get(name)!, ref.grads.get(name)!);
    return { name, agreement: a, ok: a.rel <= gradTol };
  });

  // Central differences of the exact f64 layer on the arm being proven (for the f32 GPU arm, on
  // the f64 chunked arm whose gradients the reference comparison above ties the GPU to).
  const fdGrads = arm === "gpu"
    ? (await run(exact, x, r, { arm: fdArm, strict: true })).grads
    : first.grads;
  const eps = epsilonOf("f64");
  const lossScale = lossRef.scale;
  const rows: GroupRow[] = [];
  for (const [name, param] of exact.parameters()) {
    const grad = fdGrads.get(name)!;
    let gradMax = 0, finite = true, sumSq = 0;
    for (const gv of grad) {
      if (!Number.isFinite(gv)) finite = false;
      gradMax = Math.max(gradMax, Math.abs(gv));
    }
    for (const pv of param.data) sumSq += pv * pv;
    const rms = Math.sqrt(sumSq / param.size);
    const nonZero = gradMax > 0;
    const step = nonZero && finite ? derivedStep(eps, lossScale, gradMax, rms) : NaN;
    const probes: CoordinateProbe[] = [];
    if (nonZero && finite) {
      progress(`central differences: ${name}`);
      for (const index of probeIndices(grad)) {
        const original = param.data[index];
        const lossAt = async (delta: number) => {
          param.data[index] = original + delta;
          try {
            return lossOf(await exact.forward(x, [B, T], { arm: fdArm, strict: true }), r).loss;
          } finally {
            param.data[index] = original;
          }
        };
        probes.push(await probeCoordinate(lossAt, grad[index], index, step, eps, lossScale));
      }
    }
    const resolved = probes.length > 0 && probes.every((p) => p.resolved);
    const rel = probes.reduce((m, p) => Math.max(m, p.rel), probes.length ? 0 : NaN);
    rows.push({
      name,
      shape: param.shape,
      nonZero,
      finite,
      gradMax,
      step,
      probes,
      rel,
      resolved,
      ok: nonZero && finite && resolved && rel <= FD_TOL,
    });
  }

  // Falsification: detach the op's outputs. Every group upstream of the op must then fail its
  // reference comparison (its gradient vanishes); if the checks stayed green they could not fail.
  const falsifyArm: Arm = arm === "ops" ? "cpu" : arm;
  progress(`falsification: ${falsifyArm} arm with the KDA outputs detached`);
  const falsifyModule = falsifyArm === arm ? tested : exact;
  const falsified = await run(
    falsifyModule,
    falsifyArm === arm ? xTested : x,
    falsifyArm === arm ? rTested : r,
    {
      arm: falsifyArm,
      strict: true,
      detachKdaOutputs: true,
    },
  );
  const red = names.filter((name) => {
    const a = agreement(falsified.grads.get(name)!, ref.grads.get(name)!);
    return !(a.rel <= gradTol);
  });
  const expectedRed = names.filter((n) => !DOWNSTREAM_GROUPS.includes(n));
  const falsification = {
    red,
    expectedRed,
    ok: red.length === expectedRed.length && expectedRed.every((n) => red.includes(n)),
    note: falsifyArm === arm
      ? "the arm under test"
      : `the ${falsifyArm} arm (the ops arm has no custom node to detach)`,
  };

  progress(`rerun on the ${arm} arm for bit-identity`);
  const second = await run(tested, xTested, rTested, { arm, strict: true });
  const mismatched = sameBits(first.y, second.y) ? [] : ["y"];
  for (const name of names) {
    if (!sameBits(first.grads.get(name)!, second.grads.get(name)!)) mismatched.push(name);
  }

  const ok = groups.missing.length === 0 && groups.extra.length === 0 &&
    rows.every((row) => row.ok) && forwardRel <= forwardTol &&
    reference.every((row) => row.ok) && falsification.ok && mismatched.length === 0 &&
    seam.declined === 0;
  return {
    arm,
    referenceArm,
    dtype,
    groups,
    loss: lossRef.loss,
    lossScale,
    fdArm,
    rows,
    forward: { rel: forwardRel, tol: forwardTol, ok: forwardRel <= forwardTol },
    gradTol,
    reference,
    falsification,
    reproducible: { ok: mismatched.length === 0, mismatched },
    seam,
    declines,
    ok,
  };
}
