// The gpu arm's layout algebra, pure (no GPU here): region sizes written once, symbolically (sums
// of products of the dims), from which both the TypeScript offsets and the WGSL offset functions
// are derived, so nothing has to "match" by hand; the plan of one call for a kernel set; the
// generic limit checks (every buffer under the binding limit, every grid under the dispatch limit,
// with advice on what fits); the uniform parameters; and the WGSL header of a set. Sizes count
// elements; bytes are applied once, from the dtype table (bytesOf).

import type { ChunkSize, KdaDims } from "../_types.ts";
import { MAX_HEAD_DIM } from "../_types.ts";
import { DTYPES } from "../../base/dtype.ts";
import type {
  BufferDecl,
  DimValues,
  KernelSet,
  Plan,
  Region,
  RegionTable,
  SetLimits,
  Size,
  Sym,
  Term,
} from "./kernel_set.ts";

// ---- symbolic sizes (the types are the declaration's: kernel_set.ts) ----

export type { DimValues, Region, RegionTable, Size, Sym, Term };

/**
 * Consecutive regions that share one size.
 *
 * @param size Their size.
 * @param names Their names, in order.
 * @returns The regions.
 * @example
 * ```ts
 * ofSize([[1, "C", "K"]], "G", "Glo").length; // 2
 * ```
 */
export const ofSize = (size: Size, ...names: string[]): Region[] =>
  names.map((name) => ({ name, size }));

/**
 * Evaluates a symbolic size.
 *
 * @param size The size, a sum of products of dims.
 * @param dims The values of the dims.
 * @returns The number of elements.
 * @example
 * ```ts
 * sizeOf([[5, "C", "K"], [1, "K"]], { B: 1, T: 1, H: 1, K: 4, V: 4, C: 16 }); // 324
 * ```
 */
export function sizeOf(size: Size, dims: DimValues): number {
  let total = 0;
  for (const [coef, ...syms] of size) {
    let term = coef;
    for (const s of syms) {
      const value = dims[s];
      if (value === undefined) throw new Error(`internal: no value for the size symbol ${s}`);
      term *= value;
    }
    total += term;
  }
  return total;
}

function addSizes(a: Size, b: Size): Size {
  const map = new Map<string, [number, Sym[]]>();
  for (const [coef, ...syms] of [...a, ...b]) {
    const key = syms.join("*");
    const prev = map.get(key);
    map.set(key, [(prev?.[0] ?? 0) + coef, syms]);
  }
  return [...map.values()].map(([coef, syms]) => [coef, ...syms] as Term);
}

/**
 * The offsets (in elements) of every region of a table and its total size.
 *
 * @param table The region table.
 * @param dims The dims to evaluate at.
 * @returns `offsets` by region name and `total` elements.
 * @example
 * ```ts
 * const t: RegionTable = {
 *   prefix: "b",
 *   regions: [{ name: "A", size: [[1, "C", "V"]] }, { name: "B", size: [[1, "K"]] }],
 * };
 * tableOffsets(t, { B: 1, T: 1, H: 1, K: 4, V: 8, C: 16 }).offsets.B; // 128
 * ```
 */
export function tableOffsets(
  table: RegionTable,
  dims: DimValues,
): { offsets: Record<string, number>; total: number } {
  const offsets: Record<string, number> = {};
  let at = 0;
  for (const r of table.regions) {
    offsets[r.name] = at;
    at += sizeOf(r.size, dims);
  }
  return { offsets, total: at };
}

/**
 * The elements of one of a set's buffers for a call.
 *
 * @param buffer The buffer.
 * @param plan The call's plan.
 * @returns Its elements (its table times the chunk blocks when per chunk).
 * @example
 * ```ts
 * // bufferElements(set.buffers[0], makePlan(set, dims, 64))
 * ```
 */
export function bufferElements(buffer: BufferDecl, plan: Plan): number {
  const per = tableOffsets(buffer.table, plan.dims).total;
  if (!buffer.perChunk) return per;
  return (buffer.perSlice === true ? plan.sliceChunks * plan.H : plan.chunks) * per;
}

/**
 * Bytes of `elements` elements of a dtype: the one place sizes become bytes.
 *
 * @param elements The count.
 * @param dtype The element type.
 * @returns The bytes.
 * @example
 * ```ts
 * bytesOf(10, "f32"); // 40
 * ```
 */
export function bytesOf(elements: number, dtype: "f32" | "u32"): number {
  return elements * (dtype === "u32" ? Uint32Array.BYTES_PER_ELEMENT : DTYPES[dtype].bytes);
}

function wgslSize(size: Size): string {
  const terms = size.filter(([coef]) => coef !== 0).map(([coef, ...syms]) => {
    const factors = syms.map((s) => `p.${s}`);
    return coef === 1 && factors.length > 0
      ? factors.join(" * ")
      : [`${coef}u`, ...factors].join(" * ");
  });
  return terms.length === 0 ? "0u" : terms.join(" + ");
}

// ---- the plan of one call ----

/**
 * Plans one call of a kernel set: chunk counts, the set's own values and the symbol values every
 * region size is evaluated at.
 *
 * @param set The kernel set.
 * @param shape B, T, H, K, V (positive integers, K and V at most MAX_HEAD_DIM).
 * @param C The chunk size.
 * @param maxBinding The device's bytes of one binding, when known: a slice then holds no more
 *   chunks than its largest per-slice buffer can bind (the set's own budget may allow more).
 * @returns The plan.
 * @example
 * ```ts
 * import { kernelSet } from "./kernel_set.ts";
 * import "./kernels/mod.ts";
 * makePlan(kernelSet("fused"), { B: 2, T: 256, H: 2, K: 32, V: 32 }, 16).NC; // 16
 * ```
 */
export function makePlan(
  set: KernelSet,
  shape: KdaDims & { HV?: number; cuSeqlens?: Int32Array },
  C: ChunkSize,
  maxBinding = Infinity,
): Plan {
  const { B, T, K, V } = shape;
  // the kernels run value heads; query/key heads differ only for a set that groups them itself
  const H = shape.HV ?? shape.H, HQ = shape.H;
  const cu = shape.cuSeqlens;
  let NC = Math.ceil(T / C), N = B, NCT = B * NC;
  if (cu !== undefined) {
    N = cu.length - 1;
    NC = 0;
    NCT = 0;
    for (let i = 0; i < N; i++) {
      const n = Math.ceil((cu[i + 1] - cu[i]) / C);
      NC = Math.max(NC, n);
      NCT += n;
    }
  }
  const extra = set.extra({ B, T, H, K, V }, C);
  const plan = {
    B,
    T,
    H,
    HQ,
    K,
    V,
    C,
    N,
    NC,
    NCT,
    chunks: NCT * H,
    ...(cu !== undefined ? { cuSeqlens: cu } : {}),
    dims: { B, T, H, HQ, G: H / HQ, K, V, C, N, NC, NCT, ...extra },
    extra,
  };
  // a slice's chunks: the set's budget, and no more than its largest per-slice buffer can bind
  // (a software adapter binds 128 MiB: one slice of 64 chunks at T = 4096, H = 16, K = 64 needed
  // 135 MB of gradient scratch, and the call was refused where two slices fit)
  const perSliceChunk = Math.max(
    0,
    ...set.buffers.filter((b) => b.perSlice === true).map((b) =>
      bytesOf(bufferElements(b, { ...plan, sliceChunks: 1, slices: [] }), b.dtype)
    ),
  );
  const bindable = perSliceChunk > 0 ? Math.floor(maxBinding / perSliceChunk) : Infinity;
  const budget = Math.max(1, Math.min(Math.floor(set.sliceChunks?.(plan) ?? NCT), bindable));
  // a sliced scan takes a slice in one dispatch: a slice spans no more of a sequence's chunks than
  // the set's longest scan range
  const slicedScan = set.backward?.stages.some((s) => s.scan === true && s.sliced === true);
  const span = slicedScan
    ? Math.max(
      1,
      ...set.scanRanges({ ...plan, sliceChunks: NCT, slices: [] }).map(([a, b]) => b - a),
    )
    : Infinity;
  const slices = evenSlicesOf(sequenceChunks(plan), budget, span);
  return {
    ...plan,
    sliceChunks: slices.reduce((n, [p0, p1]) => Math.max(n, p1 - p0), 0),
    slices,
  };
}

/**
 * The chunks of each sequence of a plan, ⌈len / C⌉, in order (the chunks of sequence s are the
 * call's chunks from the sum of those before it).
 *
 * @param plan The plan (or its shape).
 * @returns The counts.
 * @example
 * ```ts
 * sequenceChunks({ C: 16, N: 2, NC: 2, cuSeqlens: Int32Array.from([0, 20, 21]) }); // [2, 1]
 * ```
 */
export function sequenceChunks(
  plan: Pick<Plan, "C" | "N" | "NC" | "cuSeqlens">,
): number[] {
  const { cuSeqlens: cu, C } = plan;
  return Array.from(
    { length: plan.N },
    (_, s) => cu === undefined ? plan.NC : Math.ceil((cu[s + 1] - cu[s]) / C),
  );
}

/**
 * The call's chunks in slice order: by their index within their sequence, then by sequence, so
 * that the chunks at indices [i0, i1) of every sequence are one run of positions. Chunks are
 * numbered sequence by sequence (the chunk table's order).
 *
 * @param counts The chunks of each sequence ({@linkcode sequenceChunks}).
 * @returns The chunk at each position, and the position of each chunk.
 * @example
 * ```ts
 * Array.from(sliceOrder([2, 1]).order); // [0, 2, 1]
 * ```
 */
export function sliceOrder(counts: readonly number[]): { order: Uint32Array; pos: Uint32Array } {
  const total = counts.reduce((a, b) => a + b, 0);
  const first = new Array<number>(counts.length);
  for (let s = 0, at = 0; s < counts.length; at += counts[s], s++) first[s] = at;
  const order = new Uint32Array(total);
  const pos = new Uint32Array(total);
  // the sequences that still have a chunk at index i, in order: each index costs its own chunks
  let alive = counts.map((_, s) => s).filter((s) => counts[s] > 0);
  for (let i = 0, p = 0; alive.length > 0; i++) {
    for (const s of alive) {
      order[p] = first[s] + i;
      pos[first[s] + i] = p++;
    }
    alive = alive.filter((s) => counts[s] > i + 1);
  }
  return { order, pos };
}

/**
 * As {@linkcode slicesOf}, with the smallest budget that gives as few slices as `budget` does: the
 * slices come out as even as whole indices allow (64 indices under a budget of 9 make eight slices
 * of 8, not seven of 9 and one of 1), and the per-slice buffers, sized for the largest, no larger
 * than they must be.
 */
function evenSlicesOf(counts: readonly number[], budget: number, span: number): [number, number][] {
  const at = indexStarts(counts);
  const fewest = slicesOf(at, budget, span).length;
  // the count of slices does not grow with the budget: the smallest budget that keeps it, by halves
  // (no budget past all the chunks slices differently)
  let lo = 1;
  let hi = Math.max(1, Math.min(budget, at[at.length - 1]));
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    if (slicesOf(at, mid, span).length <= fewest) hi = mid;
    else lo = mid + 1;
  }
  return slicesOf(at, lo, span);
}

/**
 * The position in slice order of the first chunk at each index i of the sequences (the chunks at
 * indices below i), and of the end: from the sequences with more than i chunks (a histogram of the
 * counts, summed from the longest).
 */
function indexStarts(counts: readonly number[]): number[] {
  const NC = counts.reduce((a, b) => Math.max(a, b), 0);
  const longer = new Array<number>(NC + 1).fill(0);
  for (const n of counts) longer[n]++;
  for (let i = NC - 1; i >= 0; i--) longer[i] += longer[i + 1];
  const at = [0];
  for (let i = 0; i < NC; i++) at.push(at[i] + longer[i + 1]);
  return at;
}

/**
 * The slices of a call as runs of positions in slice order (`at` from {@linkcode indexStarts}):
 * whole indices i0..i1 of every sequence, as many as hold at most `budget` chunks and span at most
 * `span` indices, or, where one index has more than `budget` chunks, runs of `budget` of them.
 */
function slicesOf(at: readonly number[], budget: number, span: number): [number, number][] {
  const NC = at.length - 1;
  const out: [number, number][] = [];
  for (let i0 = 0; i0 < NC;) {
    if (at[i0 + 1] - at[i0] > budget) {
      for (let p = at[i0]; p < at[i0 + 1]; p += budget) {
        out.push([p, Math.min(at[i0 + 1], p + budget)]);
      }
      i0++;
      continue;
    }
    let i1 = i0 + 1;
    while (i1 < NC && i1 - i0 < span && at[i1 + 1] - at[i0] <= budget) i1++;
    out.push([at[i0], at[i1]]);
    i0 = i1;
  }
  return out;
}

// ---- the uniform parameters ----

/**
 * Words of a set's packed parameters, padded to 16 bytes.
 *
 * @param set The kernel set.
 * @returns The words.
 * @example
 * ```ts
 * paramWords({ params: ["B", "T", "flags", "scale"] } as never); // 4
 * ```
 */
export function paramWords(set: Pick<KernelSet, "params">): number {
  return Math.ceil(set.params.length / 4) * 4;
}

/**
 * The uniform parameters of a call, packed as the set's WGSL `Params` struct: every field a u32
 * symbol of the plan but `scale` (f32).
 *
 * @param set The kernel set.
 * @param plan The call's plan.
 * @param flags The set's flag bits.
 * @param scale The query scale (finite in f32).
 * @returns The packed words.
 * @example
 * ```ts
 * import { kernelSet } from "./kernel_set.ts";
 * import "./kernels/mod.ts";
 * const set = kernelSet("fused");
 * packParams(set, makePlan(set, { B: 1, T: 8, H: 1, K: 4, V: 4 }, 16), 0, 0.5).byteLength; // 64
 * ```
 */
export function packParams(
  set: Pick<KernelSet, "params">,
  plan: Plan,
  flags: number,
  scale: number,
): ArrayBuffer {
  const bytes = new ArrayBuffer(paramWords(set) * 4);
  const u = new Uint32Array(bytes);
  const f = new Float32Array(bytes);
  set.params.forEach((name, i) => {
    if (name === "scale") f[i] = scale;
    else if (name === "flags") u[i] = flags;
    else {
      const value = plan.dims[name];
      if (value === undefined) throw new Error(`internal: no value for the parameter ${name}`);
      u[i] = value;
    }
  });
  return bytes;
}

// ---- limits ----

/**
 * Why a shape is not a valid GPU problem (dims, chunk size, head dims), or null.
 *
 * @param shape The dims.
 * @param chunkSize The chunk size.
 * @returns A reason, or null.
 * @example
 * ```ts
 * shapeProblem({ B: 1, T: 2, H: 1, K: 257, V: 4 }, 16); // "K must be at most 256: got 257"
 * ```
 */
export function shapeProblem(shape: KdaDims, chunkSize: number): string | null {
  for (const name of ["B", "T", "H", "K", "V"] as const) {
    const value = shape[name];
    if (!Number.isSafeInteger(value) || value < 1) {
      return `${name} must be a positive integer: got ${value}`;
    }
  }
  if (chunkSize !== 16 && chunkSize !== 32 && chunkSize !== 64) {
    return `chunkSize must be 16, 32 or 64: got ${chunkSize}`;
  }
  if (shape.K > MAX_HEAD_DIM) return `K must be at most ${MAX_HEAD_DIM}: got ${shape.K}`;
  if (shape.V > MAX_HEAD_DIM) return `V must be at most ${MAX_HEAD_DIM}: got ${shape.V}`;
  return null;
}

/**
 * Why a number the kernels take as an f32 (the query scale, the gate's lowerBound) cannot be one:
 * it rounds to an infinity, or to 0 from a value that is not 0. Null when it can.
 *
 * @param name What the number is, for the reason.
 * @param value The number.
 * @returns A reason, or null.
 * @example
 * ```ts
 * f32Problem("scale", 1e39); // "scale must be finite in f32: got 1e+39, which rounds to Infinity"
 * ```
 */
export function f32Problem(name: string, value: number): string | null {
  const f = Math.fround(value);
  if (!Number.isFinite(f)) {
    return `${name} must be finite in f32: got ${value}, which rounds to ${f}`;
  }
  if (f === 0 && value !== 0) {
    return `${name} must be representable in f32: got ${value}, which rounds to 0`;
  }
  return null;
}

/** The stages of both directions of a set. */
function allStages(set: KernelSet) {
  return [...set.forward.stages, ...(set.backward?.stages ?? [])];
}

/** What a stage's grid dimensions count where its declaration does not say (StageDecl.axes). */
const DEFAULT_AXES = ["chunks (or V tiles) per sequence", "heads", "batch entries"] as const;

function overLimit(set: KernelSet, plan: Plan, limits: SetLimits): string | null {
  const maxBinding = maxBindingOf(limits);
  for (const buffer of set.buffers) {
    const bytes = bytesOf(bufferElements(buffer, plan), buffer.dtype);
    if (bytes > maxBinding) {
      return `the ${buffer.name} buffer needs ${bytes} bytes, over the device's storage binding ` +
        `limit of ${maxBinding} bytes`;
    }
  }
  const perDim = limits.maxComputeWorkgroupsPerDimension;
  const [what, need] = allStages(set).flatMap((s) =>
    s.grid(plan).map((n, i) => [(s.axes ?? DEFAULT_AXES)[i], n] as const)
  ).reduce((most, next) => (next[1] > most[1] ? next : most), ["", 0]);
  if (need > perDim) {
    return `the shape needs ${need} ${what} in one dispatch dimension, over the device's limit ` +
      `of ${perDim} workgroups per dimension`;
  }
  return null;
}

function fits(
  set: KernelSet,
  shape: KdaDims & { HV?: number; cuSeqlens?: Int32Array },
  C: ChunkSize,
  limits: SetLimits,
): boolean {
  return overLimit(set, makePlan(set, shape, C, maxBindingOf(limits)), limits) === null;
}

/**
 * The bytes one storage binding of a device holds: its binding limit, or its buffer limit where
 * that is smaller.
 *
 * @param limits The device limits.
 * @returns The bytes.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * const limits = { maxStorageBufferBindingSize: 1 << 27, maxBufferSize: 1 << 26 };
 * assert.equal(maxBindingOf(limits), 1 << 26);
 * ```
 */
export function maxBindingOf(
  limits: Pick<SetLimits, "maxStorageBufferBindingSize" | "maxBufferSize">,
): number {
  return Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
}

/**
 * An n in [1, hi] with ok(n), found by bisection, or 0 when ok(1) fails. Where ok is monotone (true
 * up to some n) it is the largest; where it is not (whether a split-set call fits can flip as T
 * grows, since its slices change with T), it is one n that fits, not the largest, and the advice
 * says no more than that.
 */
function largest(hi: number, ok: (n: number) => boolean): number {
  if (!ok(1)) return 0;
  let lo = 1;
  while (lo < hi) {
    const mid = Math.floor((lo + hi + 1) / 2);
    if (ok(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/**
 * Why a set's planned call exceeds the device's limits, or null; the reason says what does fit (a
 * smaller chunk size, the largest batch at this T, or the longest T at B = 1).
 *
 * @param set The kernel set.
 * @param plan The call's plan.
 * @param limits The device limits.
 * @returns A reason, or null.
 * @example
 * ```ts
 * import { kernelSet } from "./kernel_set.ts";
 * import "./kernels/mod.ts";
 * const limits = {
 *   maxStorageBufferBindingSize: 1 << 27,
 *   maxBufferSize: 1 << 28,
 *   maxComputeWorkgroupsPerDimension: 65535,
 * };
 * const set = kernelSet("fused");
 * limitProblem(set, makePlan(set, { B: 64, T: 4096, H: 16, K: 128, V: 128 }, 64), limits);
 * ```
 */
export function limitProblem(set: KernelSet, plan: Plan, limits: SetLimits): string | null {
  const problem = overLimit(set, plan, limits);
  if (problem === null) return null;
  // the plan runs value heads (H) with query/key heads HQ: the advice keeps both, and the packed
  // offsets of a set that walks them itself
  const { B, T, H: HV, HQ: H, K, V, C, cuSeqlens } = plan;
  const heads = HV === H ? {} : { HV };
  const shape = { B, T, H, K, V, ...heads };
  const advice: string[] = [];
  const smaller = ([16, 32] as ChunkSize[]).filter((c) =>
    c < C && fits(set, { ...shape, ...(cuSeqlens ? { cuSeqlens } : {}) }, c, limits)
  );
  if (smaller.length > 0) advice.push(`chunkSize ${smaller[smaller.length - 1]} fits`);
  const maxB = cuSeqlens ? 0 : largest(B, (b) => fits(set, { ...shape, B: b }, C, limits));
  const headsText = `H=${H}${HV === H ? "" : `, HV=${HV}`}`;
  if (maxB > 0) {
    advice.push(`at T=${T} and chunkSize ${C} the largest batch that fits is B=${maxB}`);
  } else {
    const maxT = largest(T, (t) => fits(set, { ...shape, B: 1, T: t }, C, limits));
    const none = cuSeqlens ? "the packed batch does not fit" : `no batch fits at T=${T}`;
    advice.push(
      maxT > 0
        ? `${none}; at B=1 a sequence of T=${maxT} fits`
        : `not even B=1, T=1 fits at ${headsText}, K=${K}, V=${V}`,
    );
  }
  const batch = cuSeqlens
    ? `a packed batch of ${cuSeqlens.length - 1} sequences, T=${T} in all`
    : `B=${B}, T=${T}`;
  return `${problem[0].toUpperCase()}${problem.slice(1)} (${batch}, ${headsText}, K=${K}, ` +
    `V=${V}, chunkSize=${C}, kernels ${set.name}): ${advice.join("; ")}`;
}

// ---- the WGSL header ----

/** Bytes of one chunk-range uniform (n0, n1 and padding). */
export const RANGE_BYTES = 16;

/**
 * The distinct region tables of a set's buffers, in the order the buffers list them.
 *
 * @param set The kernel set.
 * @returns The tables.
 * @example
 * ```ts
 * import { kernelSet } from "./kernel_set.ts";
 * import "./kernels/mod.ts";
 * setTables(kernelSet("fused")).map((t) => t.prefix).includes("w"); // true
 * ```
 */
export function setTables(set: Pick<KernelSet, "buffers">): RegionTable[] {
  return [...new Set(set.buffers.map((b) => b.table))];
}

/**
 * The WGSL text prepended to a set's files: its constants and flags, the `Params` and
 * `ChunkRange` structs, its bindings, and one offset function per region of every table (plus its
 * size function), all generated from the set's declaration.
 *
 * @param set The kernel set.
 * @returns WGSL source.
 * @example
 * ```ts
 * import { kernelSet } from "./kernel_set.ts";
 * import "./kernels/mod.ts";
 * wgslHeader(kernelSet("fused")).includes("fn workSize() -> u32"); // true
 * ```
 */
export function wgslHeader(set: KernelSet): string {
  const lines: string[] = [
    `// ---- generated by kda/gpu/layout.ts from the kernel set "${set.name}": do not edit ----`,
    `const WG: u32 = ${set.workgroupSize}u;`,
    ...Object.entries(set.constants).map(([name, value]) => `const ${name}: u32 = ${value}u;`),
    ...Object.entries(set.flags).map(([name, bit]) => `const ${name}: u32 = ${bit}u;`),
    "struct Params {",
    ...set.params.map((name) => `  ${name}: ${name === "scale" ? "f32" : "u32"},`),
    ...Array.from(
      { length: paramWords(set) - set.params.length },
      (_, i) => `  pad${i}: u32,`,
    ),
    "}",
    "struct ChunkRange {",
    "  n0: u32,",
    "  n1: u32,",
    "  pad0: u32,",
    "  pad1: u32,",
    "}",
    "@group(0) @binding(0) var<uniform> p: Params; // shapes, flags and scale",
    ...set.bindings.map((b, i) => {
      const space = b.type === "uniform"
        ? "uniform"
        : b.type === "storage"
        ? "storage, read_write"
        : "storage, read";
      return `@group(0) @binding(${i + 1}) var<${space}> ${b.name}: ${b.wgsl}; // ${b.doc}`;
    }),
    "@group(1) @binding(0) var<uniform> range: ChunkRange;",
  ];
  for (const table of setTables(set)) {
    let at: Size = [];
    for (const r of table.regions) {
      lines.push(`fn ${table.prefix}${r.name}() -> u32 { return ${wgslSize(at)}; }`);
      at = addSizes(at, r.size);
    }
    if (table.sizeFn !== undefined) {
      lines.push(`fn ${table.sizeFn}() -> u32 { return ${wgslSize(at)}; }`);
    }
  }
  lines.push("// ---- end of generated header ----", "");
  return lines.join("\n");
}
