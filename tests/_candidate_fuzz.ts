// Random candidate files for the candidate checker (checks/candidate.ts): valid ones, made by this
// package's f64 chunked arm on values rounded to the file's dtype (random shapes, dtypes, grouped
// value heads, packed batches, optional h0/dht/gradients), and mutated ones (wrong shapes, missing
// tensors, NaN, positive gates, truncated bytes, duplicated keys, huge claimed sizes, bad offsets,
// head-first layouts, swapped or perturbed results); and layer candidates (checks/candidate_layer.ts)
// with theirs (a missing gradient or parameter, NaN, wrong sizes, mixed dtypes, a bare checkpoint).
// Each case states what the checker must do:
// agree (a valid file), disagree or refuse (a wrong file), or refuse (a malformed file); a refusal
// must be a RangeError or TypeError whose message says what "must" hold. The standing slice runs in
// tests/candidate_test.ts; `deno task fuzz` runs the full sweep (tests/fuzz.ts).

import { kda, kdaVjp } from "../kda/op/op.ts";
import {
  bf16Bits,
  bf16Value,
  DTYPES,
  f16Bits,
  f16Value,
  MEASURED_BAR_FACTOR,
} from "../base/dtype.ts";
import { agreement } from "../checks/compare.ts";
import { mulberry32, normal, subSeed } from "../kda/layer/_random.ts";
import {
  readSafetensors,
  type SafetensorsInput,
  type SafetensorsWriteDType,
  writeSafetensors,
} from "../io/mod.ts";
import { checkCandidate } from "../checks/candidate.ts";
import { checkLayerCandidate, isLayerCandidate } from "../checks/candidate_layer.ts";
import { KdaModule } from "../kda/module.ts";

/** The float dtypes a candidate file may store. */
export type FileDType = "F64" | "F32" | "F16" | "BF16";

/** The results a candidate may hold. */
export const RESULT_NAMES = ["o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"] as const;
const GRAD_RESULTS = ["dq", "dk", "dv", "dg", "dbeta", "dh0"];

/** What a valid candidate file is made of. */
export interface CandidateSpec {
  B: number;
  T: number;
  H: number;
  /** Value heads, a multiple of H. */
  HV: number;
  K: number;
  V: number;
  /** Offsets of a packed batch (then B = 1). */
  cuSeqlens?: number[];
  /** The dtype of q, k, v, g, beta, dout and of every result. */
  dtype: FileDType;
  /** The dtype of h0 and dht (default `dtype`; fla keeps states in F32). */
  stateDtype?: FileDType;
  h0: boolean;
  dht: boolean;
  /** The results the file holds (gradients bring dout along). */
  results: readonly string[];
  seed: number;
}

const ROUND: Record<FileDType, (x: number) => number> = {
  F64: (x) => x,
  F32: Math.fround,
  F16: (x) => f16Value(f16Bits(x)),
  BF16: (x) => bf16Value(bf16Bits(x)),
};

/**
 * A valid candidate: inputs drawn at random and rounded to their dtype, results computed from
 * those very values by the f64 chunked arm (the checker's reference is the f64 recurrence, so
 * the two are independent computations) and stored in the file's dtype.
 */
export async function makeCandidate(spec: CandidateSpec): Promise<Map<string, SafetensorsInput>> {
  const { B, T, H, HV, K, V } = spec;
  const N = spec.cuSeqlens === undefined ? B : spec.cuSeqlens.length - 1;
  const stateDtype = spec.stateDtype ?? spec.dtype;
  const rand = mulberry32(subSeed(spec.seed, "candidate"));
  const gauss = normal(rand);
  const draw = (n: number, f: () => number, dtype: FileDType) =>
    Float64Array.from({ length: n }, () => ROUND[dtype](f()));
  const q = draw(B * T * H * K, gauss, spec.dtype);
  const k = new Float64Array(B * T * H * K);
  for (let row = 0; row < B * T * H; row++) {
    const u = Array.from({ length: K }, gauss);
    const norm = Math.hypot(...u) || 1;
    for (let d = 0; d < K; d++) k[row * K + d] = ROUND[spec.dtype](u[d] / norm);
  }
  const v = draw(B * T * HV * V, gauss, spec.dtype);
  const g = draw(B * T * HV * K, () => -1.5 * rand(), spec.dtype);
  const beta = draw(B * T * HV, () => 0.05 + 0.9 * rand(), spec.dtype);
  // Every tensor is drawn whatever the spec keeps, so a spec that differs only in h0 or dht gives
  // the same values otherwise (the mutations' truth, below).
  const drawnH0 = draw(N * HV * K * V, gauss, stateDtype);
  const dout = draw(B * T * HV * V, gauss, spec.dtype);
  const drawnDht = draw(N * HV * K * V, gauss, stateDtype);
  const h0 = spec.h0 ? drawnH0 : undefined, dht = spec.dht ? drawnDht : undefined;
  const grads = spec.results.some((r) => GRAD_RESULTS.includes(r));
  const inputs = {
    B,
    T,
    H,
    K,
    V,
    q,
    k,
    v,
    g,
    beta,
    ...(HV !== H ? { HV } : {}),
    ...(h0 ? { h0 } : {}),
    ...(spec.cuSeqlens ? { cuSeqlens: Int32Array.from(spec.cuSeqlens) } : {}),
  };
  const options = { arm: "cpu" as const, chunkSize: 16 as const, strict: true, quiet: true };
  const out: Record<string, Float64Array> = { ...(await kda(inputs, options)) };
  if (grads) Object.assign(out, await kdaVjp(inputs, { dout, ...(dht ? { dht } : {}) }, options));
  const file = new Map<string, SafetensorsInput>();
  const put = (name: string, data: Float64Array, shape: number[], dtype: FileDType) =>
    file.set(name, { data, shape, dtype: dtype as SafetensorsWriteDType });
  const tok = [B, T];
  put("q", q, [...tok, H, K], spec.dtype);
  put("k", k, [...tok, H, K], spec.dtype);
  put("v", v, [...tok, HV, V], spec.dtype);
  put("g", g, [...tok, HV, K], spec.dtype);
  put("beta", beta, [...tok, HV], spec.dtype);
  if (h0) put("h0", h0, [N, HV, K, V], stateDtype);
  if (grads) put("dout", dout, [...tok, HV, V], spec.dtype);
  if (grads && dht) put("dht", dht, [N, HV, K, V], stateDtype);
  if (spec.cuSeqlens) {
    file.set("cu_seqlens", {
      data: Int32Array.from(spec.cuSeqlens),
      shape: [spec.cuSeqlens.length],
    });
  }
  const shapes: Record<string, number[]> = {
    o: [...tok, HV, V],
    ht: [N, HV, K, V],
    dq: [...tok, H, K],
    dk: [...tok, H, K],
    dv: [...tok, HV, V],
    dg: [...tok, HV, K],
    dbeta: [...tok, HV],
    dh0: [N, HV, K, V],
  };
  for (const name of spec.results) {
    const data = out[name];
    put(name, Float64Array.from(data), shapes[name], name === "ht" ? stateDtype : spec.dtype);
  }
  return file;
}

/** A random valid spec: small shapes, any dtype, HV, packing, optional h0/dht, some results. */
export function randomSpec(seed: number): CandidateSpec {
  const rand = mulberry32(subSeed(seed, "spec"));
  const int = (lo: number, hi: number) => lo + Math.floor(rand() * (hi - lo + 1));
  const pick = <X>(xs: readonly X[]): X => xs[Math.floor(rand() * xs.length)];
  const H = int(1, 2), HV = H * int(1, 2), K = int(1, 6), V = int(1, 6);
  const packed = rand() < 0.3;
  let B = int(1, 2), T = int(1, 40);
  let cuSeqlens: number[] | undefined;
  if (packed) {
    B = 1;
    const cuts = new Set<number>([0]);
    const n = int(1, 3);
    for (let i = 0; i < n; i++) cuts.add(int(1, 30));
    cuSeqlens = [...cuts].sort((a, b) => a - b);
    T = cuSeqlens[cuSeqlens.length - 1] + int(1, 10);
    cuSeqlens.push(T);
  }
  const dtype = pick(["F64", "F32", "F16", "BF16"] as const);
  const stateDtype = dtype === "F16" || dtype === "BF16" ? pick([dtype, "F32"] as const) : dtype;
  const results = RESULT_NAMES.filter(() => rand() < 0.5);
  if (results.length === 0) results.push(pick(RESULT_NAMES));
  return {
    B,
    T,
    H,
    HV,
    K,
    V,
    cuSeqlens,
    dtype,
    stateDtype,
    h0: rand() < 0.7,
    dht: rand() < 0.7,
    results,
    seed,
  };
}

// ---- mutations ----

/** What the checker must do with a case. */
export type Expect = "agree" | "not agree" | "refuse";

/** One fuzz case: the file's bytes, what must happen, and a label for a failure's line. */
export interface FuzzCase {
  label: string;
  bytes: Uint8Array;
  expect: Expect;
  /** For "agree": a tensor the report must list as unused. */
  unused?: string;
  /** A layer candidate (checks/candidate_layer.ts). */
  layer?: boolean;
}

function header(bytes: Uint8Array): { json: Record<string, unknown>; start: number } {
  const n = Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true));
  return { json: JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n))), start: 8 + n };
}

/** The same data under a new header text (the header's length prefix rewritten). */
function withHeader(bytes: Uint8Array, text: string): Uint8Array {
  const { start } = header(bytes);
  const json = new TextEncoder().encode(text);
  const out = new Uint8Array(8 + json.length + bytes.length - start);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  out.set(bytes.subarray(start), 8 + json.length);
  return out;
}

const TOKEN_TENSORS = ["q", "k", "v", "g", "beta", "dout", "o", "dq", "dk", "dv", "dg", "dbeta"];

/**
 * What the checker must do with a file whose results are off from the truth by `rel` (max over
 * its results of max|a−b|/max|b|): not agree when that is past twice the largest bar the checker
 * can set (2·eps of a half dtype, the f32 bars otherwise: base/dtype.ts), agree when it is under a
 * tenth of the smallest (the f32 bars); in between the case proves nothing and is left out.
 */
function verdictFor(
  rel: Record<string, number>,
  dtype: FileDType,
): Expect | undefined {
  const f32 = DTYPES.f32.bars!;
  const half = dtype === "BF16" ? DTYPES.bf16.eps : dtype === "F16" ? DTYPES.f16.eps : 0;
  const bars = Object.keys(rel).map((n) => {
    const low = n === "o" || n === "ht" ? f32.outputs : f32.gradients;
    return { n, low, high: Math.max(low, MEASURED_BAR_FACTOR * half / 2) };
  });
  if (bars.some((b) => rel[b.n] > 2 * b.high)) return "not agree";
  if (bars.every((b) => rel[b.n] < b.low / 10)) return "agree";
  return undefined;
}

/**
 * The mutations of a valid file, each with what the checker must then do. `file` is the valid
 * file; `spec` what made it.
 */
export async function mutations(
  file: Map<string, SafetensorsInput>,
  spec: CandidateSpec,
  rand: () => number,
): Promise<FuzzCase[]> {
  const pick = <X>(xs: readonly X[]): X => xs[Math.floor(rand() * xs.length)];
  const bytesOf = (m: Map<string, SafetensorsInput>) => writeSafetensors(m);
  const copy = () =>
    new Map([...file].map(([n, t]) => [n, { ...t, data: t.data.slice() } as SafetensorsInput]));
  const results = spec.results;
  const grads = results.some((r) => GRAD_RESULTS.includes(r));
  const cases: FuzzCase[] = [];
  const valid = bytesOf(file);
  cases.push({ label: "valid", bytes: valid, expect: "agree" });

  // Missing tensors.
  const input = pick(["q", "k", "v", "g", "beta"]);
  const noInput = copy();
  noInput.delete(input);
  cases.push({ label: `missing ${input}`, bytes: bytesOf(noInput), expect: "refuse" });
  const dropped = pick(results);
  const noResult = copy();
  noResult.delete(dropped);
  cases.push({
    label: `missing result ${dropped}`,
    bytes: bytesOf(noResult),
    expect: results.length === 1 ? "refuse" : "agree",
  });
  // An absent h0 or dht is taken as zeros. Whether that makes the file wrong depends on the
  // results it holds (dv and dh0 do not depend on h0, dq not on dht, and a decayed copy may be
  // too small to see), so the truth is made: the same draws without it.
  const without = async (name: "h0" | "dht") => {
    const truth = await makeCandidate({ ...spec, [name]: false });
    const rel: Record<string, number> = {};
    for (const r of results) {
      rel[r] = agreement(file.get(r)!.data, truth.get(r)!.data).rel;
    }
    const expect = verdictFor(rel, spec.dtype);
    const m = copy();
    m.delete(name);
    if (expect) cases.push({ label: `missing ${name}`, bytes: bytesOf(m), expect });
  };
  if (spec.h0) await without("h0");
  if (grads) {
    const noDout = copy();
    noDout.delete("dout");
    cases.push({ label: "missing dout", bytes: bytesOf(noDout), expect: "refuse" });
    if (spec.dht) await without("dht");
  }

  // Values: NaN, a large error, a positive gate, swapped results.
  const r = pick(results);
  const nanResult = copy();
  const rd = nanResult.get(r)!.data as Float64Array;
  rd[Math.floor(rand() * rd.length)] = NaN;
  cases.push({ label: `NaN in ${r}`, bytes: bytesOf(nanResult), expect: "not agree" });
  const nanIn = pick([
    "q",
    "k",
    "v",
    "g",
    "beta",
    ...(spec.h0 ? ["h0"] : []),
    ...(grads ? ["dout"] : []),
    ...(grads && spec.dht ? ["dht"] : []),
  ]);
  const nanInput = copy();
  const id = nanInput.get(nanIn)!.data as Float64Array;
  id[Math.floor(rand() * id.length)] = NaN;
  cases.push({ label: `NaN in ${nanIn}`, bytes: bytesOf(nanInput), expect: "refuse" });
  const off = copy();
  const od = off.get(r)!.data as Float64Array;
  let top = 0;
  for (let i = 0; i < od.length; i++) top = Math.max(top, Math.abs(od[i]));
  od[Math.floor(rand() * od.length)] += 0.5 * top + 1e-3;
  cases.push({ label: `${r} off by half its max`, bytes: bytesOf(off), expect: "not agree" });
  const positive = copy();
  const gd = positive.get("g")!.data as Float64Array;
  gd[Math.floor(rand() * gd.length)] = 0.25;
  cases.push({ label: "a positive gate", bytes: bytesOf(positive), expect: "refuse" });
  if (results.includes("o") && results.includes("dv")) {
    const swapped = copy();
    const [o, dv] = [swapped.get("o")!, swapped.get("dv")!];
    swapped.set("o", dv).set("dv", o);
    cases.push({ label: "o and dv swapped", bytes: bytesOf(swapped), expect: "not agree" });
  }

  // Shapes: a result flattened, a head or channel dropped, a head-first layout.
  const flat = copy();
  const ft = flat.get(r)!;
  flat.set(r, { ...ft, shape: [ft.data.length] });
  cases.push({ label: `${r} flattened`, bytes: bytesOf(flat), expect: "refuse" });
  const cut = pick([...file.keys()].filter((n) => n !== "cu_seqlens"));
  const short = copy();
  const ct = short.get(cut)!;
  const last = ct.shape[ct.shape.length - 1];
  if (ct.shape.length > 1 && last > 1) {
    const rows = ct.data.length / last;
    const data = new Float64Array(rows * (last - 1));
    for (let i = 0; i < rows; i++) {
      data.set(ct.data.subarray(i * last, i * last + last - 1) as Float64Array, i * (last - 1));
    }
    short.set(cut, { ...ct, data, shape: [...ct.shape.slice(0, -1), last - 1] });
    cases.push({ label: `${cut} one channel short`, bytes: bytesOf(short), expect: "refuse" });
  }
  if (spec.T > 1 || spec.H > 1 || spec.HV > 1) {
    // fla's layout is [B, T, H, ·]; a kernel written head-first stores [B, H, T, ·].
    const headFirst = copy();
    for (const name of TOKEN_TENSORS) {
      const t = headFirst.get(name);
      if (t === undefined) continue;
      const [b, tt, h] = t.shape;
      const w = t.shape.length === 4 ? t.shape[3] : 1;
      const data = new Float64Array(t.data.length);
      for (let i = 0; i < b; i++) {
        for (let j = 0; j < tt; j++) {
          for (let x = 0; x < h; x++) {
            for (let c = 0; c < w; c++) {
              data[((i * h + x) * tt + j) * w + c] = t.data[((i * tt + j) * h + x) * w + c];
            }
          }
        }
      }
      headFirst.set(name, { ...t, data, shape: [b, h, tt, ...t.shape.slice(3)] });
    }
    cases.push({ label: "head-first layout", bytes: bytesOf(headFirst), expect: "not agree" });
  }

  // Headers: an integer dtype, a duplicated key, a huge claimed shape or header, bad offsets.
  const { json } = header(valid);
  const name = pick([...file.keys()].filter((n) => n !== "cu_seqlens"));
  const entry = json[name] as { dtype: string; shape: number[]; data_offsets: number[] };
  if (entry.dtype === "F32") {
    const asInt = { ...json, [name]: { ...entry, dtype: "I32" } };
    cases.push({
      label: `${name} stored as I32`,
      bytes: withHeader(valid, JSON.stringify(asInt)),
      expect: "refuse",
    });
  }
  const text = JSON.stringify(json);
  const dup = `{${JSON.stringify(name)}:${JSON.stringify(entry)},${text.slice(1)}`;
  cases.push({ label: `${name} twice`, bytes: withHeader(valid, dup), expect: "refuse" });
  const huge = { ...json, [name]: { ...entry, shape: [2 ** 40, 2 ** 30, ...entry.shape] } };
  cases.push({
    label: `${name} claims 2^70 elements`,
    bytes: withHeader(valid, JSON.stringify(huge)),
    expect: "refuse",
  });
  const hugeHeader = valid.slice();
  new DataView(hugeHeader.buffer).setBigUint64(0, 2n ** 62n, true);
  cases.push({ label: "header claims 2^62 bytes", bytes: hugeHeader, expect: "refuse" });
  const [b0, e0] = entry.data_offsets;
  const beyond = { ...json, [name]: { ...entry, data_offsets: [b0 + 2 ** 40, e0 + 2 ** 40] } };
  cases.push({
    label: `${name} offsets beyond the file`,
    bytes: withHeader(valid, JSON.stringify(beyond)),
    expect: "refuse",
  });
  const at = 1 + Math.floor(rand() * (valid.length - 1));
  cases.push({ label: `truncated at ${at}`, bytes: valid.slice(0, at), expect: "refuse" });
  if (spec.cuSeqlens) {
    const bad = copy();
    const cu = Int32Array.from(spec.cuSeqlens);
    const i = 1 + Math.floor(rand() * (cu.length - 1));
    // past T at the end, else below its predecessor (equal neighbours are an empty sequence,
    // which is valid)
    cu[i] = i === cu.length - 1 ? cu[i] + 1 : cu[i - 1] - 1;
    bad.set("cu_seqlens", { data: cu, shape: [cu.length] });
    cases.push({ label: `cu_seqlens [${cu.join(", ")}]`, bytes: bytesOf(bad), expect: "refuse" });
  }
  if (spec.dtype !== "F64") {
    // One input in another dtype: the precision cannot be read from the file.
    const mixed = copy();
    const m = pick(["q", "k", "v", "g", "beta"]);
    mixed.set(m, { ...mixed.get(m)!, dtype: spec.dtype === "F32" ? "F64" : "F32" });
    cases.push({ label: `${m} in another dtype`, bytes: bytesOf(mixed), expect: "refuse" });
  }
  const extra = copy();
  extra.set("final_state", { data: new Float64Array(3), shape: [3] });
  cases.push({
    label: "an unknown tensor",
    bytes: bytesOf(extra),
    expect: "agree",
    unused: "final_state",
  });
  return cases;
}

// ---- layer candidates ----

/**
 * A valid layer candidate: a small random layer, its input and cotangent, its output, every
 * group's gradient and the input's from the f64 layer on the cpu arm (the checker's reference runs the ops arm),
 * all stored in `dtype` (values rounded to it first, so the file holds what was computed on).
 */
export async function makeLayerCandidate(
  seed: number,
): Promise<{ file: Map<string, SafetensorsInput>; dtype: FileDType; groups: string[] }> {
  const rand = mulberry32(subSeed(seed, "layer"));
  const int = (lo: number, hi: number) => lo + Math.floor(rand() * (hi - lo + 1));
  const dtype = (["F32", "BF16", "F64"] as const)[int(0, 2)];
  const heads = int(1, 2);
  const config = {
    dModel: 4 * int(1, 2),
    heads,
    keyDim: int(1, 4),
    valueDim: int(1, 4),
    decayRank: int(1, 2),
    shortConv: rand() < 0.3,
    seed: int(0, 1000),
  };
  const layer = new KdaModule(config);
  for (const p of layer.parameters().values()) p.data.set(p.data.map(ROUND[dtype]));
  const [B, T] = [int(1, 2), int(1, 12)];
  const gauss = normal(rand);
  const x = Float64Array.from({ length: B * T * config.dModel }, () => ROUND[dtype](gauss()));
  const dy = Float64Array.from({ length: B * T * config.dModel }, () => ROUND[dtype](gauss()));
  const run = await layer.vjp(x, [B, T], dy, { arm: "cpu", strict: true, quiet: true });
  const shape = [B, T, config.dModel];
  const d = dtype as SafetensorsWriteDType;
  const file = new Map<string, SafetensorsInput>([
    ["x", { data: x, shape, dtype: d }],
    ["dy", { data: dy, shape, dtype: d }],
    ["y", { data: run.y, shape, dtype: d }],
    ["grad/x", { data: run.dx, shape, dtype: d }],
  ]);
  for (const [name, p] of layer.parameters()) {
    file.set(name, { data: p.data, shape: [...p.shape], dtype: d });
    file.set(`grad/${name}`, { data: run.grads.get(name)!, shape: [...p.shape], dtype: d });
  }
  return { file, dtype, groups: [...layer.parameters().keys()] };
}

/** The mutations of a valid layer candidate, each with what the checker must then do. */
export function layerMutations(
  file: Map<string, SafetensorsInput>,
  dtype: FileDType,
  groups: readonly string[],
  rand: () => number,
): FuzzCase[] {
  const pick = <X>(xs: readonly X[]): X => xs[Math.floor(rand() * xs.length)];
  const copy = () =>
    new Map([...file].map(([n, t]) => [n, { ...t, data: t.data.slice() } as SafetensorsInput]));
  const bytesOf = (m: Map<string, SafetensorsInput>) => writeSafetensors(m);
  const cases: FuzzCase[] = [];
  const add = (label: string, m: Map<string, SafetensorsInput>, expect: Expect) =>
    cases.push({ label: `layer: ${label}`, bytes: bytesOf(m), expect, layer: true });
  add("valid", file, "agree");
  const group = pick(groups);
  const noGrad = copy();
  noGrad.delete(`grad/${group}`);
  add(`missing grad/${group}`, noGrad, "not agree");
  const noParam = copy();
  noParam.delete(group);
  add(`missing ${group}`, noParam, "refuse");
  for (const name of ["dy", "y"]) {
    const m = copy();
    m.delete(name);
    add(`missing ${name}`, m, "refuse");
  }
  const target = pick(["y", `grad/${group}`, "grad/x"]);
  const nan = copy();
  const nd = nan.get(target)!.data as Float64Array;
  nd[Math.floor(rand() * nd.length)] = NaN;
  add(`NaN in ${target}`, nan, "not agree");
  const off = copy();
  const od = off.get(target)!.data as Float64Array;
  let top = 0;
  for (let i = 0; i < od.length; i++) top = Math.max(top, Math.abs(od[i]));
  od[Math.floor(rand() * od.length)] += 0.5 * top + 1e-3;
  add(`${target} off by half its max`, off, "not agree");
  const nanX = copy();
  (nanX.get("x")!.data as Float64Array)[0] = NaN;
  add("NaN in x", nanX, "refuse");
  const short = copy();
  const p = short.get(group)!;
  short.set(group, { ...p, data: p.data.slice(1), shape: [p.data.length - 1] });
  add(`${group} one element short`, short, "refuse");
  const flat = copy();
  flat.set("x", { ...flat.get("x")!, shape: [flat.get("x")!.data.length] });
  add("x flattened", flat, "refuse");
  if (dtype !== "F64") {
    const mixed = copy();
    mixed.set(group, { ...mixed.get(group)!, dtype: dtype === "F32" ? "F64" : "F32" });
    add(`${group} in another dtype`, mixed, "refuse");
  }
  const checkpoint = new Map([...file].filter(([n]) => groups.includes(n)));
  cases.push({
    label: "layer: a checkpoint alone",
    bytes: writeSafetensors(checkpoint, { format: "kda.layer" }),
    expect: "refuse",
    layer: true,
  });
  const extra = copy();
  extra.set("grad/unknown", { data: new Float64Array(2), shape: [2] });
  cases.push({
    label: "layer: an unknown tensor",
    bytes: bytesOf(extra),
    expect: "agree",
    unused: "grad/unknown",
    layer: true,
  });
  const valid = bytesOf(file);
  const at = 1 + Math.floor(rand() * (valid.length - 1));
  cases.push({
    label: `layer: truncated at ${at}`,
    bytes: valid.slice(0, at),
    expect: "refuse",
    layer: true,
  });
  return cases;
}

/** One case's outcome: null when the checker did what the case requires, else why not. */
export async function runCase(c: FuzzCase): Promise<string | null> {
  if (c.layer) return await runLayerCase(c);
  let report;
  try {
    report = await checkCandidate(readSafetensors(c.bytes));
  } catch (error) {
    const why = refusal(error);
    if (why === null) return `crashed: ${error instanceof Error ? error.stack : String(error)}`;
    return c.expect === "agree" ? `refused a valid file: ${why}` : null;
  }
  if (c.expect === "refuse") return `did not refuse (ok = ${report.ok})`;
  if (c.expect === "not agree" && report.ok) return "agreed with a wrong file";
  if (c.expect === "agree") {
    // A valid file whose every result's reference is zero checks nothing and must not agree.
    if (!report.ok && !report.rows.some((r) => r.checked)) return null;
    if (!report.ok) {
      return `disagreed with a valid file: ${
        report.rows.filter((r) => !r.ok).map((r) => `${r.name} ${r.agreement.rel} > ${r.bar}`)
          .join(", ")
      }`;
    }
    if (c.unused && !report.unused.some((u) => u.name === c.unused)) {
      return `did not report ${c.unused} as unused`;
    }
  }
  return null;
}

/** A refusal that names what must hold, or null for any other throw. */
function refusal(error: unknown): string | null {
  const named = (error instanceof RangeError || error instanceof TypeError) &&
    / must /.test(error.message);
  return named ? error.message : null;
}

async function runLayerCase(c: FuzzCase): Promise<string | null> {
  let report;
  try {
    const file = readSafetensors(c.bytes);
    // As the CLI routes it: a file without x is an op candidate, or no candidate at all.
    report = isLayerCandidate(file) ? await checkLayerCandidate(file) : await checkCandidate(file);
  } catch (error) {
    const why = refusal(error);
    if (why === null) return `crashed: ${error instanceof Error ? error.stack : String(error)}`;
    return c.expect === "agree" ? `refused a valid file: ${why}` : null;
  }
  if (c.expect === "refuse") return `did not refuse (ok = ${report.ok})`;
  if (c.expect === "not agree" && report.ok) return "agreed with a wrong file";
  if (c.expect === "agree" && !report.ok) {
    const rows = "output" in report ? [report.output, ...report.rows] : report.rows;
    return `disagreed with a valid file: ${
      rows.filter((r) => !r.ok).map((r) => `${r.name} ${r.agreement.rel} > ${r.bar}`).join(", ")
    }`;
  }
  if (c.expect === "agree" && c.unused && !report.unused.some((u) => u.name === c.unused)) {
    return `did not report ${c.unused} as unused`;
  }
  return null;
}

/**
 * The sweep: `count` valid op candidates from `seed` on and `layers` layer candidates, each with
 * its mutations.
 */
export async function candidateSweep(
  seed: number,
  count: number,
  onFailure: (line: string) => void = () => {},
  layers: number = Math.ceil(count / 10),
): Promise<{ cases: number; failures: string[] }> {
  const failures: string[] = [];
  let cases = 0;
  for (let i = 0; i < layers; i++) {
    const { file, dtype, groups } = await makeLayerCandidate(seed + i);
    const rand = mulberry32(subSeed(seed + i, "mutate layer"));
    for (const c of layerMutations(file, dtype, groups, rand)) {
      cases++;
      const why = await runCase(c);
      if (why !== null) {
        const line = `layer seed ${seed + i} ${c.label}: ${why}`;
        failures.push(line);
        onFailure(line);
      }
    }
  }
  for (let i = 0; i < count; i++) {
    const spec = randomSpec(seed + i);
    const file = await makeCandidate(spec);
    const rand = mulberry32(subSeed(seed + i, "mutate"));
    for (const c of await mutations(file, spec, rand)) {
      cases++;
      const why = await runCase(c);
      if (why !== null) {
        const line = `seed ${seed + i} ${c.label}: ${why} (spec ${
          JSON.stringify({ ...spec, seed: undefined })
        })`;
        failures.push(line);
        onFailure(line);
      }
    }
  }
  return { cases, failures };
}
