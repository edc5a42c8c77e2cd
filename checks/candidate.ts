// `prove --candidate`: someone else's KDA kernel, checked against this package's exact f64
// reference on the same input values. A candidate file (safetensors) holds the inputs (q, k, v, g,
// beta; optionally h0, dout, dht, cu_seqlens, in flash-linear-attention's layouts, grouped value
// heads included) and any of the candidate's results (o, ht, dq, dk, dv, dg, dbeta, dh0). Each
// result gets the agreement metric of docs/kda.md 4, its RMS ratio, where its worst entry sits, and
// a verdict against the bar of the precision the candidate claims or, without a claim, the one its
// inputs' dtypes say. A file that checks nothing (no result, no token, only references of zeros)
// does not agree; what the check assumed (an absent h0 or dht) and what it did not read are
// reported.

import { kda, kdaVjp } from "../kda/op/op.ts";
import { type Arm, MAX_HEAD_DIM } from "../kda/_types.ts";
import type { SafetensorsFile, SafetensorsTensor } from "../io/mod.ts";
import { type Agreement, agreement } from "./compare.ts";
import { DTYPES, MEASURED_BAR_FACTOR } from "../base/dtype.ts";
import {
  choosePrecision,
  floatTensor,
  notACandidate,
  type Precision,
  rounder,
} from "./_candidate_file.ts";

export type { Precision } from "./_candidate_file.ts";

/** Where an entry of a result sits. */
export interface Location {
  /** Batch entry, or sequence of a packed batch. */
  b: number;
  /** Token within its sequence (absent for states). */
  t?: number;
  /** Head: a query/key head for dq and dk, a value head for every other result. */
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
  /**
   * Whether the row checks anything: false when the reference and the candidate are both all
   * zeros, where a kernel that returns zeros passes too.
   */
  checked: boolean;
  /** Why the row checks nothing, when it does not. */
  note?: string;
  /** max|a−b| per (row, column) cell of the heat map: rows (b, h), columns chunks (states: rows b, columns h). */
  cells: { rows: number; cols: number; values: Float64Array; rowLabel: string; colLabel: string };
}

/** A tensor of the file that the check did not read, and why. */
export interface UnusedTensor {
  /** The tensor's name in the file. */
  name: string;
  /** Why nothing read it. */
  reason: string;
}

/** What a candidate check measured. */
export interface CandidateReport {
  /** Every tensor within its bar, and at least one row that checks something. */
  ok: boolean;
  /** The precision judged at. */
  precision: Precision;
  /** Whether the precision was claimed (`--precision`) or read from the file's dtypes. */
  precisionSource: "option" | "file";
  /** One line: the precision and where it came from. */
  precisionNote: string;
  /** The arm that computed the f64 reference. */
  referenceArm: Arm;
  /** Dimensions read from the inputs: N sequences, their lengths, H query/key heads, HV value heads, K, V. */
  dims: {
    N: number;
    lengths: number[];
    H: number;
    HV: number;
    K: number;
    V: number;
    chunkSize: number;
  };
  /** One row per result tensor the file holds. */
  rows: CandidateRow[];
  /** How the bars were set. */
  barNote: string;
  /** What the check assumed that the file does not say (an absent h0 taken as zeros, the scale). */
  notes: string[];
  /** The file's tensors that the check did not read. */
  unused: UnusedTensor[];
}

/** Options of {@linkcode checkCandidate}. */
export interface CandidateOptions {
  /** The precision the candidate claims; default: read from the dtype of q, k, v, g, beta. */
  precision?: Precision;
  /** The candidate's chunk size, to place errors in chunks (default 64). */
  chunkSize?: 16 | 32 | 64;
}

/** The results a candidate may hold, in report order. */
export const CANDIDATE_RESULTS = ["o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"] as const;
const GRADS: readonly string[] = ["dq", "dk", "dv", "dg", "dbeta", "dh0"];
const TOKEN_INPUTS = ["q", "k", "v", "g", "beta"] as const;
/** Every input a candidate may hold, for comparing two runs. */
export const CANDIDATE_INPUTS: readonly string[] = [
  ...TOKEN_INPUTS,
  "h0",
  "dout",
  "dht",
  "cu_seqlens",
];

/**
 * The most state elements (N·HV·K·V) a candidate may claim: the reference keeps its states, their
 * gradients and the rounded run's in f64 (512 MiB an array at this bound), and K·V is the one size
 * of a file that no stored bytes vouch for.
 */
export const MAX_STATE_ELEMENTS = 2 ** 26;

/** The gpu arm's proven f32 bars, from the dtype table. */
const F32_BARS = DTYPES.f32.bars!;

const shapeText = (s: readonly number[]) => `[${s.join(", ")}]`;

/**
 * An f32 bar, raised where storing the reference in f32 alone costs more than it allows: a tensor
 * whose values lie in f32's subnormal range (a vanishing gradient) cannot be held to 2e-5 of its
 * maximum. Elsewhere (f32 rounding 6e-8) the bar is unchanged.
 *
 * @param bar The table's f32 bar.
 * @param ref The reference.
 * @returns The bar, or MEASURED_BAR_FACTOR × the f32 rounding error of the reference if larger.
 */
export function f32Floor(bar: number, ref: Float64Array): number {
  return Math.max(bar, MEASURED_BAR_FACTOR * agreement(ref.map(Math.fround), ref).rel);
}

/**
 * A row's bar, refused where it cannot tell a result from zeros: zeros are off by 1 relative, so a
 * bar of 1 or more (a reference past f32's range, whose f32 rounding is Infinity, or deep in its
 * subnormals) would pass any result, and the file cannot be checked at that precision.
 *
 * @param name The tensor.
 * @param bar Its bar.
 * @param refMax The reference's `max|b|`.
 * @param precision The precision the bar is of.
 * @returns The bar, below 1.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkableBar } from "./candidate.ts";
 * assert.equal(checkableBar("o", 2e-6, 1, "f32"), 2e-6);
 * assert.throws(() => checkableBar("o", Infinity, 5e89, "f32"), RangeError);
 * ```
 */
export function checkableBar(name: string, bar: number, refMax: number, precision: string): number {
  if (!(bar < 1)) {
    throw new RangeError(
      `candidate ${name} cannot be checked at ${precision}: its reference (max |${name}| ` +
        `${refMax.toExponential(2)}) lies outside ${precision}'s normal range, so its bar would ` +
        `be ${bar} and any result, zeros included, would pass`,
    );
  }
  return bar;
}

interface Problem {
  B: number;
  N: number;
  lengths: number[];
  starts: number[];
  H: number;
  HV: number;
  K: number;
  V: number;
  /** Tokens in all: B·T. */
  tokens: number;
  inputs: Record<"q" | "k" | "v" | "g" | "beta", Float64Array> & { h0?: Float64Array };
  dout?: Float64Array;
  dht?: Float64Array;
}

/** The file's tensor `name`, of exactly `shape`, as f64 (finite unless `allowNonFinite`). */
function readTensor(
  file: SafetensorsFile,
  name: string,
  shape: readonly number[],
  layout: string,
  allowNonFinite = false,
): Float64Array {
  const t = file.tensors.get(name);
  if (t === undefined) {
    throw new RangeError(`candidate must hold a tensor named ${name} ${layout}: got none`);
  }
  checkShape(name, floatTensor(name, t), shape, layout);
  const a = Float64Array.from(t.data);
  if (!allowNonFinite) {
    for (let i = 0; i < a.length; i++) {
      if (!Number.isFinite(a[i])) {
        throw new RangeError(`candidate tensor ${name} must be finite: got ${a[i]} at index ${i}`);
      }
    }
  }
  return a;
}

function checkShape(name: string, t: SafetensorsTensor, shape: readonly number[], layout: string) {
  if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    throw new RangeError(
      `candidate tensor ${name} must have shape ${layout} = ${shapeText(shape)}: got ${
        shapeText(t.shape)
      }`,
    );
  }
}

/** The sequences of a packed batch, from cu_seqlens, checked before anything is sized by it. */
function readOffsets(cu: SafetensorsTensor, B: number, T: number): number[] {
  if (!(cu.data instanceof Int32Array)) {
    throw new TypeError(
      `candidate tensor cu_seqlens must be an integer tensor (I32 or I64): got ${cu.dtype}`,
    );
  }
  const c = Array.from(cu.data);
  const shown = `[${c.slice(0, 12).join(", ")}${c.length > 12 ? ", …" : ""}]`;
  if (cu.shape.length !== 1 || c.length < 2) {
    throw new RangeError(
      `candidate tensor cu_seqlens must hold at least 2 offsets (N + 1 for N ≥ 1 sequences) in one dimension: got shape ${
        shapeText(cu.shape)
      }, ${shown}`,
    );
  }
  if (B !== 1) throw new RangeError(`candidate with cu_seqlens must have B = 1: got ${B}`);
  // equal neighbours are an empty sequence, which the op runs as flash-linear-attention does
  if (c[0] !== 0 || c[c.length - 1] !== T || c.some((x, i) => i > 0 && x < c[i - 1])) {
    throw new RangeError(
      `candidate cu_seqlens must not decrease and must run from 0 to T = ${T}: got ${shown}`,
    );
  }
  return c;
}

function readProblem(file: SafetensorsFile, grads: boolean): Problem {
  const q = file.tensors.get("q");
  if (q === undefined) throw notACandidate(file);
  if (q.shape.length !== 4) {
    throw new RangeError(
      `candidate tensor q must have shape [B, T, H, K]: got ${shapeText(q.shape)}`,
    );
  }
  const [B, T, H, K] = q.shape;
  const cu = file.tensors.get("cu_seqlens");
  const offsets = cu === undefined ? undefined : readOffsets(cu, B, T);
  if (q.shape.some((d) => d === 0)) {
    throw new RangeError(
      `candidate tensor q must have a positive size in every dimension of [B, T, H, K], since a candidate without a sequence, token, head or channel checks nothing: got ${
        shapeText(q.shape)
      }`,
    );
  }
  if (K > MAX_HEAD_DIM) {
    throw new RangeError(
      `candidate K (q's last dimension) must be at most ${MAX_HEAD_DIM}: got ${K}`,
    );
  }
  const v = file.tensors.get("v");
  if (v === undefined) {
    throw new RangeError("candidate must hold a tensor named v [B, T, HV, V]: got none");
  }
  const [vb, vt, HV, V] = v.shape;
  if (
    v.shape.length !== 4 || vb !== B || vt !== T || !(HV >= H && HV % H === 0) || !(V > 0)
  ) {
    throw new RangeError(
      `candidate tensor v must have shape [B, T, HV, V] = [${B}, ${T}, HV, V] with HV a multiple of H = ${H} and V positive: got ${
        shapeText(v.shape)
      }`,
    );
  }
  if (V > MAX_HEAD_DIM) {
    throw new RangeError(
      `candidate V (v's last dimension) must be at most ${MAX_HEAD_DIM}: got ${V}`,
    );
  }
  const starts = offsets ? offsets.slice(0, -1) : Array.from({ length: B }, (_, b) => b * T);
  const lengths = offsets ? starts.map((s, i) => offsets[i + 1] - s) : new Array(B).fill(T);
  const N = lengths.length;
  const stateSize = N * HV * K * V;
  if (stateSize > MAX_STATE_ELEMENTS) {
    throw new RangeError(
      `candidate state [N, HV, K, V] = [${N}, ${HV}, ${K}, ${V}] must hold at most ${MAX_STATE_ELEMENTS} elements for the f64 reference to keep it: got ${stateSize}`,
    );
  }
  const tok = [B, T];
  const p: Problem = {
    B,
    N,
    lengths,
    starts,
    H,
    HV,
    K,
    V,
    tokens: B * T,
    inputs: {
      q: readTensor(file, "q", [...tok, H, K], "[B, T, H, K]"),
      k: readTensor(file, "k", [...tok, H, K], "[B, T, H, K]"),
      v: readTensor(file, "v", [...tok, HV, V], "[B, T, HV, V]"),
      g: readTensor(file, "g", [...tok, HV, K], "[B, T, HV, K]"),
      beta: readTensor(file, "beta", [...tok, HV], "[B, T, HV]"),
      ...(file.tensors.has("h0")
        ? { h0: readTensor(file, "h0", [N, HV, K, V], "[N, HV, K, V]") }
        : {}),
    },
  };
  const g = p.inputs.g;
  for (let i = 0; i < g.length; i++) {
    if (g[i] > 0) {
      throw new RangeError(
        `candidate tensor g must be <= 0 everywhere (log decays, as fla's chunk_kda takes g without use_gate_in_kernel): got ${
          g[i]
        } at index ${i}`,
      );
    }
  }
  // Checked here, not left to the op: the op's refusal names inputs.beta, counts from the start of
  // one sequence and suggests an option of its own, none of which a candidate file has.
  const beta = p.inputs.beta;
  for (let i = 0; i < beta.length; i++) {
    if (!(beta[i] >= 0 && beta[i] <= 2)) {
      throw new RangeError(
        `candidate tensor beta must be in [0, 2] everywhere (write strengths after their activation, as fla's chunk_kda takes beta: 2·sigmoid with allow_neg_eigval reaches 2): got ${
          beta[i]
        } at index ${i}`,
      );
    }
  }
  if (grads) {
    if (!file.tensors.has("dout")) {
      throw new RangeError(
        "candidate holds gradients, so it must hold dout (the cotangent of o) to pull back: got none",
      );
    }
    p.dout = readTensor(file, "dout", [...tok, HV, V], "[B, T, HV, V]");
    if (file.tensors.has("dht")) p.dht = readTensor(file, "dht", [N, HV, K, V], "[N, HV, K, V]");
  }
  return p;
}

/** Heads, width and layout of a result. */
function resultLayout(name: string, p: Problem) {
  const state = name === "ht" || name === "dh0";
  // labelled by the result's name, not by its sizes: where K = V or HV = H they cannot tell apart
  const queryHeads = name === "dq" || name === "dk";
  const valueWide = name === "o" || name === "dv";
  const heads = queryHeads ? p.H : p.HV;
  const width = valueWide ? p.V : name === "dbeta" ? 1 : p.K;
  const shape = state
    ? [p.N, p.HV, p.K, p.V]
    : name === "dbeta"
    ? [p.B, p.tokens / p.B, heads]
    : [p.B, p.tokens / p.B, heads, width];
  const layout = state
    ? "[N, HV, K, V]"
    : name === "dbeta"
    ? "[B, T, HV]"
    : `[B, T, ${queryHeads ? "H" : "HV"}, ${valueWide ? "V" : "K"}]`;
  return { state, heads, width, shape, layout };
}

/** The reference's outputs and gradients on the given inputs, one sequence at a time. */
async function reference(
  p: Problem,
  arm: Arm,
  chunkSize: 16 | 32 | 64,
  round?: { value: (x: number) => number; inputs: boolean },
): Promise<Map<string, Float64Array>> {
  const { H, HV, K, V } = p;
  const total = (per: number) => new Float64Array(p.tokens * per);
  const o = total(HV * V), dq = total(H * K), dk = total(H * K), dv = total(HV * V);
  const dg = total(HV * K), dbeta = total(HV);
  const ht = new Float64Array(p.N * HV * K * V), dh0 = new Float64Array(p.N * HV * K * V);
  const r = (a: Float64Array) => round?.inputs ? a.map(round.value) : a;
  const grads = p.dout !== undefined;
  for (let n = 0; n < p.N; n++) {
    const [s, len] = [p.starts[n], p.lengths[n]];
    const part = (a: Float64Array, w: number) => r(a.slice(s * w, (s + len) * w));
    const state = (a: Float64Array) => r(a.slice(n * HV * K * V, (n + 1) * HV * K * V));
    if (len === 0) {
      // an empty sequence hands its state through (docs/kda.md 2.6): ht = h0, dh0 = dht
      if (p.inputs.h0) ht.set(state(p.inputs.h0), n * HV * K * V);
      if (grads && p.dht) dh0.set(state(p.dht), n * HV * K * V);
      continue;
    }
    const inputs = {
      B: 1,
      T: len,
      H,
      K,
      V,
      ...(HV !== H ? { HV } : {}),
      q: part(p.inputs.q, H * K),
      k: part(p.inputs.k, H * K),
      v: part(p.inputs.v, HV * V),
      g: part(p.inputs.g, HV * K),
      beta: part(p.inputs.beta, HV),
      ...(p.inputs.h0 ? { h0: state(p.inputs.h0) } : {}),
      scale: K ** -0.5,
    };
    // a candidate's beta is after its activation: [0, 2] is the range fla's kernels take
    // (2·sigmoid with allow_neg_eigval), and readProblem has refused a file's beta outside it
    const options = { arm, chunkSize, strict: true, quiet: true, allowNegEigval: true };
    const f = await kda(inputs, options);
    o.set(f.o, s * HV * V);
    ht.set(f.ht, n * HV * K * V);
    if (grads) {
      const g = await kdaVjp(inputs, {
        dout: part(p.dout!, HV * V),
        ...(p.dht ? { dht: state(p.dht) } : {}),
      }, options);
      dq.set(g.dq, s * H * K);
      dk.set(g.dk, s * H * K);
      dv.set(g.dv, s * HV * V);
      dg.set(g.dg, s * HV * K);
      dbeta.set(g.dbeta, s * HV);
      dh0.set(g.dh0, n * HV * K * V);
    }
  }
  const out = new Map<string, Float64Array>([["o", o], ["ht", ht]]);
  if (grads) {
    out.set("dq", dq).set("dk", dk).set("dv", dv).set("dg", dg).set("dbeta", dbeta).set("dh0", dh0);
  }
  if (round) { for (const [name, a] of out) out.set(name, a.map(round.value)); }
  return out;
}

function locate(name: string, index: number, p: Problem, C: number): Location {
  const { HV, K, V } = p;
  const { state, heads, width } = resultLayout(name, p);
  if (state) {
    const per = HV * K * V;
    const b = Math.floor(index / per), rest = index % per;
    return { b, h: Math.floor(rest / (K * V)), channel: Math.floor((rest % (K * V)) / V) };
  }
  const token = Math.floor(index / (heads * width));
  const h = Math.floor((index % (heads * width)) / width), channel = index % width;
  let n = 0;
  while (n + 1 < p.N && p.starts[n + 1] <= token) n++;
  const t = token - p.starts[n];
  return { b: n, t, h, chunk: Math.floor(t / C), channel };
}

function cellsOf(name: string, a: Float64Array, b: Float64Array, p: Problem, C: number) {
  const { state, heads } = resultLayout(name, p);
  const chunks = Math.max(...p.lengths.map((l) => Math.ceil(l / C)));
  const rows = state ? p.N : p.N * heads, cols = state ? p.HV : chunks;
  const values = new Float64Array(rows * cols);
  for (let i = 0; i < a.length; i++) {
    const l = locate(name, i, p, C);
    const cell = state ? l.b * cols + l.h : (l.b * heads + l.h) * cols + l.chunk!;
    const d = Math.abs(a[i] - b[i]);
    values[cell] = Number.isNaN(d) ? NaN : Math.max(values[cell], d);
  }
  return {
    rows,
    cols,
    values,
    rowLabel: state ? "sequence" : "sequence × head",
    colLabel: state ? "head" : `chunk (${C} tokens)`,
  };
}

/** The file's tensors that the check does not read, with the reason. */
function unusedTensors(file: SafetensorsFile, grads: boolean): UnusedTensor[] {
  const read = new Set<string>([...TOKEN_INPUTS, "h0", "cu_seqlens", ...CANDIDATE_RESULTS]);
  if (grads) read.add("dout").add("dht");
  const unused: UnusedTensor[] = [];
  for (const name of file.tensors.keys()) {
    if (read.has(name)) continue;
    unused.push({
      name,
      reason: name === "dout" || name === "dht"
        ? "the file holds no gradient to check against its pull-back"
        : "not a name a candidate's inputs or results have",
    });
  }
  return unused;
}

/**
 * Checks a candidate's results against the exact f64 reference on the same inputs. A file that
 * checks nothing is refused (no result, a zero dimension, no sequence) or does not agree (every
 * result's reference all zeros, met by zeros: such a row is marked unchecked); the report states
 * what the check assumed and what it left unread.
 *
 * @param file The candidate file, read with `readSafetensors`.
 * @param options The claimed precision (default: from the dtype of q, k, v, g, beta: BF16 → bf16,
 *   F16 → f16, F32 and F64 → f32) and the candidate's chunk size (for locating errors).
 * @returns Every figure per result tensor and the verdict.
 *
 * @example Usage
 * ```ts
 * import { checkCandidate } from "./candidate.ts";
 * import { readSafetensors, writeSafetensors } from "../io/mod.ts";
 * const t = (shape: number[], x: number) => ({
 *   data: new Float32Array(shape.reduce((a, d) => a * d, 1)).fill(x),
 *   shape,
 * });
 * // One token, one head, K = V = 1: the state is β·k·v = 0.5, o = q·K^(-1/2)·state = 0.5.
 * const file = readSafetensors(writeSafetensors({
 *   q: t([1, 1, 1, 1], 1), k: t([1, 1, 1, 1], 1), v: t([1, 1, 1, 1], 1),
 *   g: t([1, 1, 1, 1], 0), beta: t([1, 1, 1], 0.5), o: t([1, 1, 1, 1], 0.5),
 * }));
 * const report = await checkCandidate(file);
 * if (!report.ok || report.precision !== "f32") throw new Error(report.precisionNote);
 * ```
 */
export async function checkCandidate(
  file: SafetensorsFile,
  options: CandidateOptions = {},
): Promise<CandidateReport> {
  const C = options.chunkSize ?? 64;
  const present = CANDIDATE_RESULTS.filter((n) => file.tensors.has(n));
  const grads = present.some((n) => GRADS.includes(n));
  const p = readProblem(file, grads);
  if (present.length === 0) {
    throw new RangeError(
      `candidate must hold at least one result (${CANDIDATE_RESULTS.join(", ")}): got none`,
    );
  }
  const results = new Map<string, Float64Array>();
  for (const name of present) {
    const { shape, layout } = resultLayout(name, p);
    results.set(name, readTensor(file, name, shape, layout, true));
  }
  const choice = choosePrecision(file, TOKEN_INPUTS, TOKEN_INPUTS.join(", "), options.precision);
  const notes: string[] = [];
  if (p.inputs.h0 === undefined) {
    notes.push("h0 absent: the initial state is taken as zeros (fla's initial_state=None)");
  }
  if (grads && p.dht === undefined) {
    notes.push("dht absent: the final state's cotangent is taken as zeros (nothing reads ht)");
  }
  notes.push(
    `scale K^-1/2 = ${(p.K ** -0.5).toPrecision(4)}, fla's default (a candidate file carries none)`,
  );
  // The ops arm is the plain recurrence; for large inputs the f64 chunked arm (proven against it
  // to 1e-10, docs/kda.md 4) computes the same reference faster.
  const work = p.tokens * p.HV * p.K * p.V;
  const referenceArm: Arm = work <= 4_000_000 ? "ops" : "cpu";
  const exact = await reference(p, referenceArm, C);
  // The bar of a precision: what a perfect kernel with that precision attains. For bf16 and f16,
  // measured now, as MEASURED_BAR_FACTOR times the error of the f64 reference run on that
  // precision's inputs with its outputs rounded too; never tighter than the f32 bars. A claimed
  // precision rounds the inputs (the kernel would have); a precision read from the file takes
  // them as stored, since the dtypes say what the kernel got (fla's f32 h0 beside bf16 q).
  const { precision } = choice;
  const roundInputs = choice.source === "option";
  let attainable: Map<string, Float64Array> | undefined;
  if (precision !== "f32") {
    attainable = await reference(p, referenceArm, C, {
      value: rounder(precision),
      inputs: roundInputs,
    });
  }
  const rows: CandidateRow[] = [];
  for (const [name, got] of results) {
    const ref = exact.get(name)!;
    const ag = agreement(got, ref);
    let ss = 0, sr = 0, worstIndex = 0, worst = -1;
    for (let i = 0; i < ref.length; i++) {
      const d = Math.abs(got[i] - ref[i]);
      ss += d * d;
      sr += ref[i] * ref[i];
      if (d > worst || (Number.isNaN(d) && !Number.isNaN(worst))) [worst, worstIndex] = [d, i];
    }
    const f32Bar = f32Floor(
      name === "o" || name === "ht" ? F32_BARS.outputs : F32_BARS.gradients,
      ref,
    );
    const bar = checkableBar(
      name,
      attainable
        ? Math.max(f32Bar, MEASURED_BAR_FACTOR * agreement(attainable.get(name)!, ref).rel)
        : f32Bar,
      ag.refMax,
      precision,
    );
    // A reference of zeros met by zeros checks nothing (a kernel that returns zeros passes);
    // met by anything else it is an error found (rel = Infinity).
    const checked = !(ag.refMax === 0 && ag.absDiff === 0);
    rows.push({
      name,
      agreement: ag,
      rmsRatio: Math.sqrt(ss / sr),
      worst: locate(name, worstIndex, p, C),
      bar,
      ok: ag.rel <= bar,
      checked,
      ...(checked ? {} : {
        note:
          "the reference is all zeros here, so a kernel that returns zeros passes: the row checks nothing",
      }),
      cells: cellsOf(name, got, ref, p, C),
    });
  }
  return {
    ok: rows.some((r) => r.checked) && rows.every((r) => r.ok),
    precision,
    precisionSource: choice.source,
    precisionNote: choice.note,
    referenceArm,
    dims: { N: p.N, lengths: p.lengths, H: p.H, HV: p.HV, K: p.K, V: p.V, chunkSize: C },
    rows,
    barNote: precision === "f32"
      ? `f32 bars: the gpu arm's proven ${F32_BARS.outputs.toExponential(0)} (o, ht) and ${
        F32_BARS.gradients.toExponential(0)
      } (gradients), or ${MEASURED_BAR_FACTOR}× the f32 rounding of a reference in f32's subnormal range`
      : `${precision} bars: ${MEASURED_BAR_FACTOR}× the error of the f64 reference on ${
        roundInputs ? `${precision}-rounded inputs` : "the file's inputs"
      } with ${precision}-rounded outputs, at least the f32 bars`,
    notes,
    unused: unusedTensors(file, grads),
  };
}
