// The per-group gradient proof of the KDA layer (docs/kda.md 4): central differences of the exact
// f64 layer (and of the arm's own f32 forward), an exact directional check by forward mode, a
// comparison with an independent reference on the same bytes, the op alone with its state
// gradients, a falsification that must go red, bit-identical reruns, and the seam's counters.
// `runProof` returns everything it measured; report.ts prints it; cli.ts is the main job.

import { KdaModule, type KdaModuleRunOptions } from "../kda/module.ts";
import type { Arm, Float } from "../kda/_types.ts";
import type { KdaConfig, KimiConfigInput } from "../kda/layer/config.ts";
import { mulberry32, normal, subSeed } from "../kda/layer/_random.ts";
import type { SeamCounts } from "../seam/seam.ts";
import { armPrecision, kdaSeam, withKdaSeam } from "../kda/op/arms.ts";
import { type AgreementBars, type ComputeDType, DTYPES } from "../base/dtype.ts";
import { agreement, sameBits } from "./compare.ts";
import * as groupChecks from "./gradients.ts";
import type { DirectionalRow } from "./gradients.ts";
import { checkOp } from "./op_check.ts";
import { diagnose } from "./diagnose.ts";
import { detachedSeam } from "./mutants.ts";
import {
  downstreamGroups,
  expectedGroups,
  type GroupRow,
  INPUT_ROW,
  type PlantedDefect,
  type ProofReport,
} from "./_proof_report.ts";

/** What `runProof` is told. */
export interface ProofOptions {
  /** The arm whose gradients are proven. */
  arm: Arm;
  /** The gpu arm's kernel set under proof (default: the arm's rule, docs/kda.md 3.2). */
  kernels?: string;
  /**
   * Overrides of the default config (shortConv for the 14-group layer), or a Kimi Linear config
   * (`form: "kimi"`).
   */
  config?: Partial<KdaConfig> | KimiConfigInput;
  /** Input batch and length; default [2, 256]. */
  dims?: [number, number];
  /** Progress messages (stderr in the CLI). */
  progress?: (message: string) => void;
  /** How many reruns in this process must give the same bits (default 1). */
  repeat?: number;
  /** The output and gradients of the same proof run in another process, to compare bit for bit. */
  otherProcess?: () => Promise<Map<string, Float>>;
  /** Which checks run (all by default); the mutants skip the costly ones they do not need. */
  checks?: { fd?: boolean; fd32?: boolean; directional?: boolean };
  /** Coordinates probed per group by central differences (default 3). */
  fdProbes?: number;
  /** A planted defect (the mutants of `--mutants`): the seam the arm under test runs on. */
  defect?: PlantedDefect;
}

/** The agreement bars of a compute dtype, from the one dtype table. */
function barsOf(dtype: ComputeDType): AgreementBars {
  return DTYPES[dtype].bars!;
}

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

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/** The seam counters one vjp of the layer must leave, per arm, with the rule in words. */
function expectedSeam(
  arm: Arm,
  c: SeamCounts,
  kernels: string | undefined,
): { ok: boolean; rule: string } {
  if (arm === "ops") {
    const ok = c.asked === 1 && c.opsPath === 1 && c.fusedFwd === 0 && c.customNodeBwd === 0 &&
      c.declined === 0;
    return { ok, rule: "asked 1, opsPath 1, fusedFwd 0, customNodeBwd 0, declined 0" };
  }
  const ok = c.asked === 1 && c.fusedFwd === 1 && c.customNodeBwd === 1 && c.fusedBwd === 1 &&
    c.opsPath === 0 && c.declined === 0;
  const rule = "asked 1, fusedFwd 1, customNodeBwd 1, fusedBwd 1, opsPath 0, declined 0";
  if (kernels === undefined) return { ok, rule };
  // the set asked for is the one that ran, and nothing else did
  const variant = `gpu:${kernels}`;
  const only = Object.entries(c.variants).every(([k, n]) => k === variant ? n === 1 : n === 0);
  return { ok: ok && only && c.variants[variant] === 1, rule: `${rule}, variants ${variant} 1` };
}

/** The gpu kernel sets the counters say ran, by name (none for the other arms). */
function kernelsThatRan(c: SeamCounts): string[] {
  return Object.entries(c.variants)
    .filter(([k, n]) => k.startsWith("gpu:") && n > 0)
    .map(([k]) => k.slice(4));
}

/**
 * Runs the gradient proof for one arm.
 *
 * @param options The arm, the config, the input dims, what to run, and any planted defect.
 * @returns The report; `ok` is true only when every check holds.
 */
export async function runProof(options: ProofOptions): Promise<ProofReport> {
  const progress = options.progress ?? (() => {});
  const timings: Record<string, number> = {};
  const timed = async <T>(name: string, f: () => Promise<T>): Promise<T> => {
    progress(name);
    const t0 = performance.now();
    try {
      return await f();
    } finally {
      timings[name] = performance.now() - t0;
    }
  };
  const checks = { fd: true, fd32: true, directional: true, ...options.checks };
  const arm = options.arm;
  const [B, T] = options.dims ?? [2, 256];
  const dtype = armPrecision(arm);
  const bars = barsOf(dtype);
  // The f64 layer is the exact reference; an f32 arm gets the same values rounded once, and the
  // f64 side is then set to those rounded values, so both sides see the same bytes.
  const tested = new KdaModule(options.config ?? {}, { dtype });
  const exact = new KdaModule(options.config ?? {}, { dtype: "f64" });
  for (const [name, p] of tested.parameters()) exact.parameters().get(name)!.data.set(p.data);
  const { dModel: D, seed, chunkSize, keyDim, valueDim } = exact.config;
  const round = (a: Float64Array): Float => dtype === "f32" ? Float32Array.from(a) : a;
  const xTested = round(draw(seed, "prove.x", B * T * D));
  const x = Float64Array.from(xTested);
  const rTested = round(draw(seed, "prove.r", B * T * D));
  const r = Float64Array.from(rTested);

  const expected = expectedGroups(exact.config);
  const downstream = downstreamGroups(exact.config);
  const names = [...exact.parameters().keys()];
  const groups = {
    missing: expected.filter((n) => !names.includes(n)),
    extra: names.filter((n) => !expected.includes(n)),
  };
  const referenceArm: Arm = arm === "ops" ? "cpu" : "ops";
  // Differences need the exact f64 layer: an arm that cannot compute in f64 is differenced on the
  // f64 chunked arm, which the reference comparison ties it to.
  const fdArm: Arm = dtype === "f64" ? arm : "cpu";
  // A planted defect is a seam of its own (checks/mutants.ts): every run of the arm under test
  // dispatches on it, and its counters are the ones judged.
  const seamUnderTest = options.defect?.seam ?? kdaSeam;
  const onTested = <T>(f: () => Promise<T>): Promise<T> =>
    seamUnderTest === kdaSeam ? f() : withKdaSeam(seamUnderTest, f);
  const kernels = arm === "gpu" ? options.kernels : undefined;
  const testedOptions: KdaModuleRunOptions = {
    arm,
    strict: true,
    quiet: true,
    ...(kernels !== undefined ? { kernels } : {}),
  };
  const runTested = () => onTested(() => tested.vjp(xTested, [B, T], rTested, testedOptions));

  seamUnderTest.reset();
  const first = await timed(`backward on the ${arm} arm (${dtype})`, runTested);
  const seam = seamUnderTest.counts();
  const seamRule = expectedSeam(arm, seam, kernels);
  const declines = seamUnderTest.decisions().map((d) => `${d.wanted} -> ${d.ran}: ${d.reason}`);

  const ref = await timed(
    `reference backward on the ${referenceArm} arm (f64)`,
    () => exact.vjp(x, [B, T], r, { arm: referenceArm, strict: true }),
  );
  const lossTested = lossOf(first.y, r), lossRef = lossOf(ref.y, r);
  const forwardRel = Math.abs(lossTested.loss - lossRef.loss) / lossRef.scale;
  const forwardTol = bars.layerForward;
  const gradTol = bars.layerGradients;
  const lossScale = lossRef.scale;

  // Central differences of the exact f64 layer on the fd arm (for the f32 gpu arm, the f64
  // chunked arm, which the reference comparison ties the gpu arm to).
  const fdRun = fdArm !== arm
    ? await exact.vjp(x, [B, T], r, { arm: fdArm, strict: true })
    : undefined;
  const fdGrads = fdRun?.grads ?? first.grads;
  const fdDx = fdRun?.dx;
  // One row per group, then the input's row: the same four checks, on the group's values or on
  // x (whose f64 and tested copies hold the same bytes, as the groups' do).
  const rowOf = async (
    name: string,
    exactData: Float,
    ownData: Float,
    grad: Float,
    refGrad: Float,
    fdGrad: Float,
    shape: readonly number[],
    stream: string,
  ): Promise<GroupRow> => {
    const reference = agreement(grad, refGrad);
    const referenceOk = reference.rel <= gradTol;
    const fd = checks.fd
      ? await timed(
        `central differences (f64): ${name}`,
        () =>
          groupChecks.fdRow(name, exactData, fdGrad, async (index, delta) => {
            const original = exactData[index];
            exactData[index] = original + delta;
            try {
              return lossOf(await exact.forward(x, [B, T], { arm: fdArm, strict: true }), r).loss;
            } finally {
              exactData[index] = original;
            }
          }, { dtype: "f64", lossScale, tol: groupChecks.FD_TOL, probes: options.fdProbes }),
      )
      : null;
    const fd32 = checks.fd32 && dtype === "f32"
      ? await timed(
        `central differences (${dtype}, ${arm} arm): ${name}`,
        () =>
          groupChecks.fdRow(name, ownData, grad, async (index, delta) => {
            const original = ownData[index];
            ownData[index] = original + delta;
            const step = ownData[index] - original; // the step f32 could actually take
            try {
              return {
                loss: lossOf(
                  await onTested(() => tested.forward(xTested, [B, T], testedOptions)),
                  r,
                ).loss,
                step,
              };
            } finally {
              ownData[index] = original;
            }
          }, { dtype, lossScale, tol: groupChecks.FD32_TOL, probes: options.fdProbes }),
      )
      : null;
    let directional: DirectionalRow | null = null;
    if (checks.directional) {
      const u = groupChecks.direction(grad.length, subSeed(seed, stream));
      const { dy } = await timed(
        `directional (forward mode, f64 ops): ${name}`,
        () => exact.jvp(x, [B, T], new Map([[name, u]])),
      );
      let jv = 0;
      for (let i = 0; i < dy.length; i++) jv += dy[i] * r[i];
      directional = groupChecks.directionalRow(name, jv, grad, u, gradTol);
    }
    const fdOk = fd === null || (fd.nonZero && fd.finite &&
      (fd.resolved ? fd.ok : directional !== null && directional.ok));
    const fd32Ok = fd32 === null || !fd32.resolved || fd32.ok;
    let gradMax = 0;
    for (const v of grad) gradMax = Math.max(gradMax, Math.abs(v));
    return {
      name,
      shape,
      gradMax,
      fd,
      fd32,
      directional,
      reference,
      referenceOk,
      ok: fdOk && fd32Ok && (directional?.ok ?? true) && referenceOk,
    };
  };
  const rows: GroupRow[] = [];
  for (const [gi, [name, param]] of [...exact.parameters()].entries()) {
    rows.push(
      await rowOf(
        name,
        param.data,
        tested.parameters().get(name)!.data,
        first.grads.get(name)!,
        ref.grads.get(name)!,
        fdGrads.get(name)!,
        param.shape,
        `prove.u.${gi}`,
      ),
    );
  }
  const input = await rowOf(
    INPUT_ROW,
    x,
    xTested,
    first.dx,
    ref.dx,
    fdArm !== arm ? fdDx! : first.dx,
    [B, T, D],
    "prove.u.x",
  );

  const op = await timed(`the op alone on the ${arm} arm, with h0 and dht`, () =>
    checkOp({
      arm,
      dtype,
      K: keyDim,
      V: valueDim,
      chunkSize,
      forwardTol: bars.outputs,
      gradTol: bars.gradients,
      seed,
      seam: options.defect?.seam,
      ...(kernels !== undefined ? { kernels } : {}),
    }));

  // Falsification: detach the op's outputs. Every group upstream of the op must then fail its
  // reference comparison (its gradient vanishes), and so must x, which keeps only its paths
  // around the op; if the checks stayed green they could not fail.
  const falsifyArm: Arm = arm === "ops" ? "cpu" : arm;
  const falsifyOnTested = falsifyArm === arm;
  const falsified = await timed(
    `falsification: ${falsifyArm} arm with the KDA outputs detached`,
    () =>
      withKdaSeam(detachedSeam(), () => {
        const o: KdaModuleRunOptions = {
          arm: falsifyArm,
          strict: true,
          ...(falsifyOnTested && kernels !== undefined ? { kernels } : {}),
        };
        return falsifyOnTested
          ? tested.vjp(xTested, [B, T], rTested, o)
          : exact.vjp(x, [B, T], r, o);
      }),
  );
  const red = names.filter((name) => {
    const a = agreement(falsified.grads.get(name)!, ref.grads.get(name)!);
    return !(a.rel <= gradTol);
  });
  if (!(agreement(falsified.dx, ref.dx).rel <= gradTol)) red.push(INPUT_ROW);
  const expectedRed = [...names.filter((n) => !downstream.includes(n)), INPUT_ROW];
  const falsification = {
    red,
    expectedRed,
    ok: red.length === expectedRed.length && expectedRed.every((n) => red.includes(n)),
    note: falsifyOnTested
      ? "the arm under test"
      : `the ${falsifyArm} arm (the ops arm has no custom node to detach)`,
  };

  const repeat = Math.max(1, options.repeat ?? 1);
  const mismatched = new Map<string, number>();
  const compareRun = (run: { y: Float; grads: Map<string, Float>; dx?: Float }) => {
    const pairs: [string, Float, Float][] = [["y", first.y, run.y]];
    for (const name of names) pairs.push([name, first.grads.get(name)!, run.grads.get(name)!]);
    if (run.dx !== undefined) pairs.push([INPUT_ROW, first.dx, run.dx]);
    for (const [name, a, b] of pairs) {
      if (!sameBits(a, b)) mismatched.set(name, Math.max(mismatched.get(name) ?? 0, maxDiff(a, b)));
    }
  };
  for (let i = 0; i < repeat; i++) {
    compareRun(
      await timed(`rerun ${i + 1}/${repeat} on the ${arm} arm for bit-identity`, runTested),
    );
  }
  let otherProcess: "identical" | "differs" | "not run" = "not run";
  if (options.otherProcess) {
    const other = await timed("rerun in a second process", options.otherProcess);
    const before = mismatched.size;
    compareRun({ y: other.get("y")!, grads: other, dx: other.get(`d${INPUT_ROW}`) });
    otherProcess = mismatched.size === before && names.every((n) => other.has(n)) &&
        other.has(`d${INPUT_ROW}`)
      ? "identical"
      : "differs";
  }
  const reproducible = {
    ok: mismatched.size === 0 && otherProcess !== "differs",
    runs: repeat,
    mismatched: [...mismatched].map(([name, d]) => ({ name, maxDiff: d })),
    otherProcess,
  };

  const forward = { rel: forwardRel, tol: forwardTol, ok: forwardRel <= forwardTol };
  const ok = groups.missing.length === 0 && groups.extra.length === 0 &&
    rows.every((row) => row.ok) && input.ok && forward.ok && op.ok && falsification.ok &&
    reproducible.ok && seamRule.ok;
  const report: ProofReport = {
    arm,
    kernels: kernelsThatRan(seam),
    referenceArm,
    fdArm,
    dtype,
    config: exact.config,
    dims: [B, T],
    groups,
    loss: lossRef.loss,
    lossScale,
    rows,
    input,
    forward,
    gradTol,
    directionalTol: gradTol,
    op,
    falsification,
    reproducible,
    seam,
    seamExpected: seamRule.rule,
    seamOk: seamRule.ok,
    declines,
    timings,
    diagnosis: null,
    ok,
  };
  report.diagnosis = ok ? null : diagnose(report);
  return report;
}

/**
 * The y and gradients of the arm under test at a proof's setting, for a rerun in another process.
 *
 * @param options The arm, config and dims of the proof.
 * @returns `y`, every group's gradient keyed by name, and the input's gradient as `dx`.
 */
export async function provenRun(
  options: Pick<ProofOptions, "arm" | "kernels" | "config" | "dims">,
): Promise<Map<string, Float>> {
  const [B, T] = options.dims ?? [2, 256];
  const dtype = armPrecision(options.arm);
  const tested = new KdaModule(options.config ?? {}, { dtype });
  const { dModel: D, seed } = tested.config;
  const round = (a: Float64Array): Float => dtype === "f32" ? Float32Array.from(a) : a;
  const x = round(draw(seed, "prove.x", B * T * D)), r = round(draw(seed, "prove.r", B * T * D));
  const { y, grads, dx } = await tested.vjp(x, [B, T], r, {
    arm: options.arm,
    strict: true,
    quiet: true,
    ...(options.arm === "gpu" && options.kernels !== undefined ? { kernels: options.kernels } : {}),
  });
  return new Map([["y", y], ...grads, [`d${INPUT_ROW}`, dx]]);
}
