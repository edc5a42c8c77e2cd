// The seeded decode sweep (kdaStep, docs/kda.md 2.7) shared by tests/adversarial_test.ts (a small
// slice) and tests/fuzz.ts: tokens decoded one at a time from a drawn state, with grouped value
// heads, head widths past the chunked arms' limit (K = 257: a step uses no chunks), gates and
// betas from their edges. Each arm's chain of steps is held to the op on the whole sequence.

import { kda, kdaStep } from "../mod.ts";
import type { Arm, Float, KdaProblem } from "../kda/_types.ts";
import type { ComputeDType } from "../base/dtype.ts";
import { agreement, mulberry32, normal } from "./_fixtures.ts";
import {
  compareArms,
  EDGE_BETAS,
  EDGE_GATES,
  type Findings,
  STRONG_GATES,
  TOL,
} from "./_adversarial.ts";

/** Key widths of the decode sweep: the edges, and one past the chunked arms' 256. */
const STEP_K: readonly number[] = [1, 3, 64, 256, 257];
/** Value widths of the decode sweep. */
const STEP_V: readonly number[] = [1, 3, 64, 256];

/** One drawn decode case: a short sequence and the state it starts from. */
export interface StepCase {
  label: string;
  /** B sequences of T tokens in the layout of kda(), h0 the state before the first token. */
  x: KdaProblem<Float64Array>;
}

/**
 * Draws decode case `index` with seed `seed`: B ∈ {1, 2, 3}, H ∈ {1, 2}, HV = H·{1, 2, 3},
 * K ∈ STEP_K, V ∈ STEP_V (K·V·B·HV bounded), 1 to 5 tokens, gates per element from EDGE_GATES
 * and STRONG_GATES, betas from EDGE_BETAS, and a drawn or zero state.
 */
export function stepCase(seed: number, index: number): StepCase {
  const rand = mulberry32((seed * 15485863 + index * 32452843) >>> 0);
  const gauss = normal(rand);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
  const H = pick([1, 2]), HV = H * pick([1, 2, 3]);
  let B = pick([1, 2, 3]);
  const K = pick(STEP_K), V = pick(STEP_V);
  while (B > 1 && B * HV * K * V > 400_000) B--;
  const T = pick([1, 2, 5]);
  const make = (n: number, draw: () => number) => Float64Array.from({ length: n }, draw);
  const k = make(B * T * H * K, gauss);
  for (let row = 0; row < B * T * H; row++) {
    let ss = 0;
    for (let d = 0; d < K; d++) ss += k[row * K + d] ** 2;
    for (let d = 0; d < K; d++) k[row * K + d] /= Math.sqrt(ss);
  }
  const zeroState = rand() < 0.25;
  const gates = [...EDGE_GATES, ...STRONG_GATES];
  const x: KdaProblem<Float64Array> = {
    B,
    T,
    H,
    K,
    V,
    scale: K ** -0.5,
    q: make(B * T * H * K, gauss),
    k,
    v: make(B * T * HV * V, gauss),
    g: make(B * T * HV * K, () => pick(gates)),
    beta: make(B * T * HV, () => pick(EDGE_BETAS)),
    h0: make(B * HV * K * V, () => zeroState ? 0 : 0.5 * gauss()),
    ...(HV !== H ? { HV } : {}),
  };
  const label = `step #${index} B=${B} T=${T} H=${H}${HV !== H ? ` HV=${HV}` : ""} K=${K} V=${V}` +
    (zeroState ? " zero state" : "");
  return { label, x };
}

/** Token t of every sequence of a [B, T, width] array, as [B, width]. */
function rowsAt(a: Float, B: number, T: number, t: number, width: number): Float {
  const out = a instanceof Float32Array ? new Float32Array(B * width) : new Float64Array(B * width);
  for (let b = 0; b < B; b++) {
    out.set(a.subarray((b * T + t) * width, (b * T + t + 1) * width), b * width);
  }
  return out;
}

/** The case's arrays in a dtype (f32: the f64 draw rounded once). */
function inDtype(x: KdaProblem<Float64Array>, dtype: ComputeDType): KdaProblem {
  if (dtype === "f64") return x;
  const f = (a: Float64Array) => Float32Array.from(a);
  return { ...x, q: f(x.q), k: f(x.k), v: f(x.v), g: f(x.g), beta: f(x.beta), h0: f(x.h0!) };
}

/** The outputs of every token ("o@t") and the final state of the chain of steps on one arm. */
async function decode(x: KdaProblem, arm: Arm): Promise<Map<string, Float>> {
  const { B, T, H, K, V } = x;
  const HV = x.HV ?? H;
  const out = new Map<string, Float>();
  let state = x.h0!;
  for (let t = 0; t < T; t++) {
    const rows = (a: Float, width: number) => rowsAt(a, B, T, t, width);
    const step = await kdaStep(state, {
      B,
      H,
      K,
      V,
      ...(x.HV !== undefined ? { HV } : {}),
      scale: x.scale,
      q: rows(x.q, H * K),
      k: rows(x.k, H * K),
      v: rows(x.v, HV * V),
      g: rows(x.g, HV * K),
      beta: rows(x.beta, HV),
    }, { arm, strict: true, allowNegEigval: true });
    out.set(`o@${t}`, step.o);
    state = step.state;
  }
  out.set("state", state);
  return out;
}

/** The same tensors from the op on the whole sequence (ops arm). */
async function whole(x: KdaProblem): Promise<Map<string, Float>> {
  const { o, ht } = await kda(x, { arm: "ops", strict: true, allowNegEigval: true });
  const HV = x.HV ?? x.H;
  const out = new Map<string, Float>();
  for (let t = 0; t < x.T; t++) out.set(`o@${t}`, rowsAt(o, x.B, x.T, t, HV * x.V));
  out.set("state", ht);
  return out;
}

/**
 * Decodes one case on every arm and compares: the cpu and ops chains of steps against the op on
 * the whole sequence in f64, and, with `gpu` (and K, V within its 256), the gpu chain against the
 * cpu chain on the same f32 bytes. A gpu tensor off by more than the f32 bar but within 16 times
 * what the plain recurrence attains in f32 on it (the ops chain on an f32 tape) is listed as
 * ill-conditioned, as in the op's sweep.
 *
 * @returns The disagreements, the worst ratio per pair and the ill-conditioned tensors.
 */
export async function checkStepCase(
  c: StepCase,
  gpu: boolean,
): Promise<Findings & { conditioned: string[] }> {
  const found: Findings = { disagreements: [], worst: {} };
  const conditioned: string[] = [];
  const reference = await whole(c.x);
  compareArms(
    c.label,
    "cpu steps vs ops whole (f64)",
    await decode(c.x, "cpu"),
    reference,
    TOL.f64,
    false,
    found,
  );
  compareArms(
    c.label,
    "ops steps vs ops whole (f64)",
    await decode(c.x, "ops"),
    reference,
    TOL.f64,
    false,
    found,
  );
  if (gpu && c.x.K <= 256 && c.x.V <= 256) {
    const x32 = inDtype(c.x, "f32");
    const cpu32 = await decode(x32, "cpu"), gpu32 = await decode(x32, "gpu");
    const before = found.disagreements.length;
    compareArms(
      c.label,
      "gpu steps vs cpu steps (f32)",
      gpu32,
      cpu32,
      TOL.f32Outputs,
      false,
      found,
    );
    if (found.disagreements.length > before) {
      const plain32 = await decode(x32, "ops");
      for (const d of found.disagreements.splice(before)) {
        const ref = cpu32.get(d.tensor)!;
        const attainable = agreement(plain32.get(d.tensor)!, ref).rel;
        const error = agreement(gpu32.get(d.tensor)!, ref).rel;
        const note = `; f32 attains ${attainable.toExponential(2)} here`;
        if (error <= 16 * attainable) {
          conditioned.push(`${d.label} ${d.tensor}: ${d.detail}${note}`);
        } else found.disagreements.push({ ...d, detail: d.detail + note });
      }
    }
  }
  return { ...found, conditioned };
}
