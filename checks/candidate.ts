// `prove --candidate`: someone else's KDA kernel, checked against this package's exact f64
// reference on the same input values. A candidate file (safetensors) holds the inputs (q, k, v, g,
// beta; optionally h0, dout, dht, cu_seqlens, in flash-linear-attention's layouts) and any of the
// candidate's results (o, ht, dq, dk, dv, dg, dbeta, dh0). Each result gets the agreement metric of
// docs/kda.md 4, its RMS ratio, where its worst entry sits, and a verdict against the bar of the
// precision the candidate claims.

import { kda, kdaVjp } from "../kda/op/op.ts";
import type { Arm } from "../kda/_types.ts";
import { bf16Bits, bf16Value, f16Bits, f16Value, type SafetensorsFile } from "../io/mod.ts";
import { type Agreement, agreement } from "./compare.ts";
import { DTYPES, MEASURED_BAR_FACTOR } from "../base/dtype.ts";

/** The precisions a candidate may claim. */
export type Precision = "bf16" | "f16" | "f32";

/** Where an entry of a result sits. */
export interface Location {
  /** Batch entry, or sequence of a packed batch. */
  b: number;
  /** Token within its sequence (absent for states). */
  t?: number;
  /** Head. */
  h: number;
  /** Chunk of `t` at the candidate's chunk size (absent for states). */
  chunk?: number;
  /** Key or value channel. */
  channel: number;
}

/** One result tensor compared with the reference. */
export interface CandidateRow {
  /** The tensor's name. */
  name: string;
  /** max|a−b|/max|b|, with both magnitudes. */
  agreement: Agreement;
  /** rms(a−b)/rms(b). */
  rmsRatio: number;
  /** Where max|a−b| sits. */
  worst: Location;
  /** The bar of the claimed precision for this tensor. */
  bar: number;
  /** Whether the tensor is within its bar. */
  ok: boolean;
  /** max|a−b| per (row, column) cell of the heat map: rows (b, h), columns chunks (states: rows b, columns h). */
  cells: { rows: number; cols: number; values: Float64Array; rowLabel: string; colLabel: string };
}

/** What a candidate check measured. */
export interface CandidateReport {
  /** Every compared tensor within its bar. */
  ok: boolean;
  /** The claimed precision. */
  precision: Precision;
  /** The arm that computed the f64 reference. */
  referenceArm: Arm;
  /** Dimensions read from the inputs: N sequences, their lengths, H, K, V. */
  dims: { N: number; lengths: number[]; H: number; K: number; V: number; chunkSize: number };
  /** One row per result tensor the file holds. */
  rows: CandidateRow[];
  /** How the bars were set. */
  barNote: string;
}

const RESULTS = ["o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"] as const;
const GRADS = ["dq", "dk", "dv", "dg", "dbeta", "dh0"] as const;

/** The gpu arm's proven f32 bars, from the dtype table. */
const F32_BARS = DTYPES.f32.bars!;

function f64(file: SafetensorsFile, name: string, shape?: number[]): Float64Array {
  const t = file.tensors.get(name);
  if (t === undefined) throw new RangeError(`candidate must hold a tensor named ${name}: got none`);
  if (
    shape !== undefined &&
    (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i]))
  ) {
    throw new RangeError(
      `candidate tensor ${name} must have shape [${shape.join(", ")}]: got [${t.shape.join(", ")}]`,
    );
  }
  return Float64Array.from(t.data);
}

function rounder(p: Precision): (x: number) => number {
  if (p === "bf16") return (x) => bf16Value(bf16Bits(x));
  if (p === "f16") return (x) => f16Value(f16Bits(x));
  return Math.fround;
}

interface Problem {
  N: number;
  lengths: number[];
  starts: number[];
  H: number;
  K: number;
  V: number;
  T: number;
  inputs: Record<"q" | "k" | "v" | "g" | "beta", Float64Array> & { h0?: Float64Array };
  dout?: Float64Array;
  dht?: Float64Array;
}

function readProblem(file: SafetensorsFile): Problem {
  const q = file.tensors.get("q");
  if (q === undefined || q.shape.length !== 4) {
    throw new RangeError(
      `candidate must hold q of shape [B, T, H, K]: got ${q ? `[${q.shape.join(", ")}]` : "none"}`,
    );
  }
  const [B, T, H, K] = q.shape;
  const vt = file.tensors.get("v");
  const V = vt?.shape[3] ?? 0;
  const cu = file.tensors.get("cu_seqlens");
  let starts: number[], lengths: number[];
  if (cu !== undefined) {
    if (B !== 1) throw new RangeError(`candidate with cu_seqlens must have B = 1: got ${B}`);
    const c = Array.from(cu.data);
    if (c[0] !== 0 || c[c.length - 1] !== T || c.some((x, i) => i > 0 && x <= c[i - 1])) {
      throw new RangeError(
        `candidate cu_seqlens must rise strictly from 0 to T = ${T}: got [${c.join(", ")}]`,
      );
    }
    starts = c.slice(0, -1);
    lengths = starts.map((s, i) => c[i + 1] - s);
  } else {
    starts = Array.from({ length: B }, (_, b) => b * T);
    lengths = new Array(B).fill(T);
  }
  const N = lengths.length;
  const p: Problem = {
    N,
    lengths,
    starts,
    H,
    K,
    V,
    T: B * T,
    inputs: {
      q: f64(file, "q", [B, T, H, K]),
      k: f64(file, "k", [B, T, H, K]),
      v: f64(file, "v", [B, T, H, V]),
      g: f64(file, "g", [B, T, H, K]),
      beta: f64(file, "beta", [B, T, H]),
      ...(file.tensors.has("h0") ? { h0: f64(file, "h0", [N, H, K, V]) } : {}),
    },
    ...(file.tensors.has("dout") ? { dout: f64(file, "dout", [B, T, H, V]) } : {}),
    ...(file.tensors.has("dht") ? { dht: f64(file, "dht", [N, H, K, V]) } : {}),
  };
  return p;
}

/** The reference's outputs and gradients on the given inputs, one sequence at a time. */
async function reference(
  p: Problem,
  arm: Arm,
  chunkSize: 16 | 32 | 64,
  round?: (x: number) => number,
): Promise<Map<string, Float64Array>> {
  const { H, K, V } = p;
  const out = new Map<string, Float64Array>();
  const total = (per: number) => new Float64Array(p.T * per);
  const o = total(H * V),
    dq = total(H * K),
    dk = total(H * K),
    dv = total(H * V),
    dg = total(H * K);
  const dbeta = total(H);
  const ht = new Float64Array(p.N * H * K * V), dh0 = new Float64Array(p.N * H * K * V);
  const r = (a: Float64Array) => round ? a.map(round) : a;
  const grads = p.dout !== undefined;
  for (let n = 0; n < p.N; n++) {
    const [s, len] = [p.starts[n], p.lengths[n]];
    const part = (a: Float64Array, w: number) => r(a.slice(s * H * w, (s + len) * H * w));
    const state = (a: Float64Array) => r(a.slice(n * H * K * V, (n + 1) * H * K * V));
    const inputs = {
      B: 1,
      T: len,
      H,
      K,
      V,
      q: part(p.inputs.q, K),
      k: part(p.inputs.k, K),
      v: part(p.inputs.v, V),
      g: part(p.inputs.g, K),
      beta: part(p.inputs.beta, 1),
      ...(p.inputs.h0 ? { h0: state(p.inputs.h0) } : {}),
      scale: K ** -0.5,
    };
    const options = { arm, chunkSize, strict: true, quiet: true };
    const f = await kda(inputs, options);
    o.set(f.o, s * H * V);
    ht.set(f.ht, n * H * K * V);
    if (grads) {
      const g = await kdaVjp(inputs, {
        dout: part(p.dout!, V),
        ...(p.dht ? { dht: state(p.dht) } : {}),
      }, options);
      dq.set(g.dq, s * H * K);
      dk.set(g.dk, s * H * K);
      dv.set(g.dv, s * H * V);
      dg.set(g.dg, s * H * K);
      dbeta.set(g.dbeta, s * H);
      dh0.set(g.dh0, n * H * K * V);
    }
  }
  out.set("o", o).set("ht", ht);
  if (grads) {
    out.set("dq", dq).set("dk", dk).set("dv", dv).set("dg", dg).set("dbeta", dbeta).set("dh0", dh0);
  }
  if (round) { for (const [name, a] of out) out.set(name, a.map(round)); }
  return out;
}

function widthOf(name: string, p: Problem): number {
  return name === "o" || name === "dv" ? p.V : name === "dbeta" ? 1 : p.K;
}

function locate(name: string, index: number, p: Problem, C: number): Location {
  const { H, K, V } = p;
  if (name === "ht" || name === "dh0") {
    const per = H * K * V;
    const b = Math.floor(index / per), rest = index % per;
    return { b, h: Math.floor(rest / (K * V)), channel: Math.floor((rest % (K * V)) / V) };
  }
  const w = widthOf(name, p);
  const token = Math.floor(index / (H * w));
  const h = Math.floor((index % (H * w)) / w), channel = index % w;
  let n = 0;
  while (n + 1 < p.N && p.starts[n + 1] <= token) n++;
  const t = token - p.starts[n];
  return { b: n, t, h, chunk: Math.floor(t / C), channel };
}

function cellsOf(name: string, a: Float64Array, b: Float64Array, p: Problem, C: number) {
  const state = name === "ht" || name === "dh0";
  const chunks = Math.max(...p.lengths.map((l) => Math.ceil(l / C)));
  const rows = state ? p.N : p.N * p.H, cols = state ? p.H : chunks;
  const values = new Float64Array(rows * cols);
  for (let i = 0; i < a.length; i++) {
    const l = locate(name, i, p, C);
    const cell = state ? l.b * cols + l.h : (l.b * p.H + l.h) * cols + l.chunk!;
    values[cell] = Math.max(values[cell], Math.abs(a[i] - b[i]));
  }
  return {
    rows,
    cols,
    values,
    rowLabel: state ? "sequence" : "sequence × head",
    colLabel: state ? "head" : `chunk (${C} tokens)`,
  };
}

/**
 * Checks a candidate's results against the exact f64 reference on the same inputs.
 *
 * @param file The candidate file, read with `readSafetensors`.
 * @param options The claimed precision and the candidate's chunk size (for locating errors).
 * @returns Every figure per result tensor and the verdict.
 */
export async function checkCandidate(
  file: SafetensorsFile,
  options: { precision: Precision; chunkSize?: 16 | 32 | 64 },
): Promise<CandidateReport> {
  const p = readProblem(file);
  const C = options.chunkSize ?? 64;
  const present = RESULTS.filter((n) => file.tensors.has(n));
  if (present.length === 0) {
    throw new RangeError(
      `candidate must hold at least one result (${RESULTS.join(", ")}): got none`,
    );
  }
  if (present.some((n) => (GRADS as readonly string[]).includes(n)) && p.dout === undefined) {
    throw new RangeError("candidate holds gradients but no dout: got no dout to pull back");
  }
  // The ops arm is the plain recurrence; for large inputs the f64 chunked arm (proven against it
  // to 1e-10, docs/kda.md 4) computes the same reference faster.
  const work = p.T * p.H * p.K * p.V;
  const referenceArm: Arm = work <= 4_000_000 ? "ops" : "cpu";
  const exact = await reference(p, referenceArm, C);
  // The bar of a precision: what a perfect kernel with that precision attains. For bf16 and f16,
  // measured now, as MEASURED_BAR_FACTOR times the error of the f64 reference run on inputs rounded to that precision
  // with outputs rounded too; never tighter than the f32 bars. For f32, the gpu arm's proven bars.
  let attainable: Map<string, Float64Array> | undefined;
  if (options.precision !== "f32") {
    attainable = await reference(p, referenceArm, C, rounder(options.precision));
  }
  const rows: CandidateRow[] = [];
  for (const name of present) {
    const ref = exact.get(name)!;
    const t = file.tensors.get(name)!;
    if (t.data.length !== ref.length) {
      throw new RangeError(
        `candidate tensor ${name} must have ${ref.length} elements: got ${t.data.length}`,
      );
    }
    const got = Float64Array.from(t.data);
    const ag = agreement(got, ref);
    let ss = 0, sr = 0, worstIndex = 0, worst = -1;
    for (let i = 0; i < ref.length; i++) {
      const d = Math.abs(got[i] - ref[i]);
      ss += d * d;
      sr += ref[i] * ref[i];
      if (d > worst || Number.isNaN(d)) [worst, worstIndex] = [d, i];
    }
    const f32Bar = name === "o" || name === "ht" ? F32_BARS.outputs : F32_BARS.gradients;
    const bar = attainable
      ? Math.max(f32Bar, MEASURED_BAR_FACTOR * agreement(attainable.get(name)!, ref).rel)
      : f32Bar;
    rows.push({
      name,
      agreement: ag,
      rmsRatio: Math.sqrt(ss / sr),
      worst: locate(name, worstIndex, p, C),
      bar,
      ok: ag.rel <= bar,
      cells: cellsOf(name, got, ref, p, C),
    });
  }
  return {
    ok: rows.every((r) => r.ok),
    precision: options.precision,
    referenceArm,
    dims: { N: p.N, lengths: p.lengths, H: p.H, K: p.K, V: p.V, chunkSize: C },
    rows,
    barNote: options.precision === "f32"
      ? `f32 bars: the gpu arm's proven ${F32_BARS.outputs} (o, ht) and ${F32_BARS.gradients} (gradients)`
      : `${options.precision} bars: ${MEASURED_BAR_FACTOR}× the error of the f64 reference on ${options.precision}-rounded inputs with ${options.precision}-rounded outputs, at least the f32 bars`,
  };
}

/** Where two candidate files made from the same inputs differ. */
export interface CandidateDiff {
  name: string;
  /** Entries whose bits differ. */
  differing: number;
  /** max|a−b|. */
  maxDiff: number;
  /** Where the first differing entry sits (flat index). */
  firstIndex: number;
}

/**
 * Compares two candidate files bit for bit: a deterministic kernel gives identical results from
 * identical inputs.
 *
 * @param a One file.
 * @param b The other.
 * @returns The tensors that differ (empty when the runs are bit-identical).
 */
export function compareCandidates(a: SafetensorsFile, b: SafetensorsFile): CandidateDiff[] {
  const diffs: CandidateDiff[] = [];
  for (const name of RESULTS) {
    const x = a.tensors.get(name)?.data, y = b.tensors.get(name)?.data;
    if (x === undefined || y === undefined) continue;
    if (x.length !== y.length) {
      throw new RangeError(
        `candidate tensor ${name} must have the same length in both files: got ${x.length} and ${y.length}`,
      );
    }
    let differing = 0, maxDiff = 0, firstIndex = -1;
    for (let i = 0; i < x.length; i++) {
      if (!Object.is(x[i], y[i])) {
        differing++;
        if (firstIndex < 0) firstIndex = i;
        maxDiff = Math.max(maxDiff, Math.abs(x[i] - y[i]));
      }
    }
    if (differing > 0) diffs.push({ name, differing, maxDiff, firstIndex });
  }
  return diffs;
}
