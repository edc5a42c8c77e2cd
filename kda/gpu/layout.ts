// The GPU arm's layout, pure (no GPU here): the plan of one call, every buffer and its regions,
// the device limits it needs, the scan ranges, the parameter packing, and the WGSL header that
// gives kda/chunk.wgsl the same layout. Region sizes are written once, symbolically (sums of
// products of the dims B, T, H, K, V, C), and both the TypeScript offsets and the WGSL offset
// functions are derived from that one table, so nothing has to "match" by hand.

import type { ChunkSize, KdaDims } from "../_types.ts";
import { MAX_HEAD_DIM } from "../_types.ts";

/** Invocations per workgroup of every kernel. */
export const WORKGROUP_SIZE = 256;
/** Floats of one workgroup tile: the chunk kernels declare two (C × C at C = 64). */
export const TILE_FLOATS = 2048;
/** Flag bits of the `flags` parameter. */
export const FLAGS = { HAS_H0: 1, HAS_DHT: 2, SAVE_STATES: 4 } as const;
/** Channels per staged block in the pairwise sums of intraChunk. */
export const LP_BLOCK = 8;
/** Bytes of one chunk-range uniform (n0, n1 and padding). */
export const RANGE_BYTES = 16;
// The scans are sequential over chunks and parallel over (b, h, V tile) only. A narrower tile than
// the widest that fits would not shorten the scan (each invocation runs the same loops, its
// entries past the tile's rows are discarded), so the tile is the widest that fits.
/** Widest scan tile (V columns); each is a power of two times 4 (vec4 column groups). */
export const MAX_SCAN_TILE = 32;
/** vec4 entries of the scans' state tile (K × VT / 4) and row tile (C × VT / 4). */
export const SCAN_STATE_VEC4 = 1024;
/** vec4 entries of the scans' row tile. */
export const SCAN_ROWS_VEC4 = 512;
/**
 * Bytes of workgroup memory the hungriest kernel declares: the chunk kernels two tiles, the scans
 * their state and row tiles.
 */
export const WORKGROUP_BYTES: number = Math.max(
  2 * TILE_FLOATS * 4,
  (SCAN_STATE_VEC4 + SCAN_ROWS_VEC4) * 16,
);
/**
 * llvmpipe ends an invocation, silently, after 65535 loop iterations counted over all its loops;
 * each scan dispatch covers only as many chunks as keep the busiest invocation under this. The
 * chunk-parallel kernels stay under it by construction (about 36,000 at K = V = 256, C = 64).
 */
export const LOOP_BUDGET = 60000;

/** The kernels' entry points, one compute pipeline each, in the order a call runs them. */
export const STAGES = [
  "intraChunk",
  "stateScan",
  "stateScanBackward",
  "intraChunkBackward",
] as const;
/** One kernel entry point. */
export type Stage = typeof STAGES[number];
/** The stages of the forward, in order. */
export const FORWARD_STAGES: readonly Stage[] = ["intraChunk", "stateScan"];
/** The stages of the backward, in order. */
export const BACKWARD_STAGES: readonly Stage[] = ["stateScanBackward", "intraChunkBackward"];
/** Whether a stage is a sequential scan (dispatched once per chunk range) or chunk-parallel. */
export const SCAN_STAGES: ReadonlySet<Stage> = new Set(["stateScan", "stateScanBackward"]);

// ---- symbolic sizes ----

/** A dimension a size may depend on; each is a field of the WGSL `Params`. */
export type Sym = "B" | "T" | "H" | "K" | "V" | "C";
/** coefficient · product of dims */
export type Term = readonly [number, ...Sym[]];
/** A sum of terms. */
export type Size = readonly Term[];
/** Dimension values to evaluate a size at. */
export type DimValues = Record<Sym, number>;

/** One named region of a buffer (or of its per-chunk block). */
export interface Region {
  /** The region's name; the WGSL function is `prefix + name`. */
  name: string;
  /** Its length in floats. */
  size: Size;
}

/** A buffer layout: regions in order, packed without gaps. */
export interface RegionTable {
  /** Prefix of the generated WGSL offset functions. */
  prefix: string;
  /** Name of the generated WGSL function returning the total size, if any. */
  sizeFn?: string;
  /** The regions, in order. */
  regions: readonly Region[];
}

const CK: Size = [[1, "C", "K"]];
const CV: Size = [[1, "C", "V"]];
const CC: Size = [[1, "C", "C"]];
const TOKQK: Size = [[1, "B", "T", "H", "K"]];
const TOKV: Size = [[1, "B", "T", "H", "V"]];
const TOKB: Size = [[1, "B", "T", "H"]];
const STATE: Size = [[1, "B", "H", "K", "V"]];

/** Consecutive regions that share one size. */
const ofSize = (size: Size, ...names: string[]): Region[] => names.map((name) => ({ name, size }));

/**
 * The forward's per-chunk work (one block per (b, h, chunk)). G is kept as hi + lo (see
 * gateCumsum in chunk.wgsl), Gam is the row e^{G_C} of the last valid token. (Kd holds
 * K ⊙ Γ while intraChunk builds W; the backward recomputes that into its dG scratch.)
 */
export const WORK: RegionTable = {
  prefix: "w",
  sizeFn: "workSize",
  regions: [
    ...ofSize(CK, "G", "Glo", "W", "Kd", "Qg"),
    { name: "U", size: CV },
    ...ofSize(CC, "P", "T", "L"),
    { name: "Gam", size: [[1, "K"]] },
  ],
};

/** The backward's per-chunk scan results: dVn and dS' (transposed, [V, K]). */
export const BW: RegionTable = {
  prefix: "b",
  sizeFn: "bwSize",
  regions: [
    { name: "DVn", size: CV },
    { name: "DS", size: [[1, "K", "V"]] },
  ],
};

/** The backward's per-chunk gradient scratch. */
export const GS: RegionTable = {
  prefix: "g",
  sizeFn: "gsSize",
  regions: [
    ...ofSize(CK, "Kd", "Qg", "W", "Kb", "G"),
    ...ofSize(CC, "P", "T", "X", "L", "M"),
    { name: "Gam", size: [[1, "K"]] },
    { name: "Bv", size: [[1, "C"]] },
  ],
};

/**
 * What the forward scan saves per chunk for the backward: the chunk-start state S, [V, K]
 * (transposed: the backward reads it with lanes along K), and the new values Vn, [C, V].
 */
export const STATES: RegionTable = {
  prefix: "s",
  sizeFn: "stateSize",
  regions: [{ name: "S", size: [[1, "K", "V"]] }, { name: "Vn", size: CV }],
};

/** One region per input array of a problem, in its order (h0 last, so its absence moves nothing). */
const PER_INPUT: readonly Region[] = [
  ...ofSize(TOKQK, "Q", "K"),
  { name: "V", size: TOKV },
  { name: "G", size: TOKQK },
  { name: "Beta", size: TOKB },
  { name: "H0", size: STATE },
];

/** The packed inputs of a forward. */
export const INPUTS: RegionTable = { prefix: "x", regions: PER_INPUT };

/** The cotangents of one backward call (its own buffer: concurrent calls share nothing). */
export const COTANGENTS: RegionTable = {
  prefix: "c",
  regions: [{ name: "Dout", size: TOKV }, { name: "Dht", size: STATE }],
};

/** The forward's outputs. */
export const OUTPUTS: RegionTable = {
  prefix: "o",
  regions: [{ name: "O", size: TOKV }, { name: "Ht", size: STATE }],
};

/** The backward's gradients, one per input and laid out as the inputs are. */
export const GRADS: RegionTable = { prefix: "d", regions: PER_INPUT };

/** Every table that the header describes. */
export const TABLES: readonly RegionTable[] = [
  WORK,
  BW,
  GS,
  STATES,
  INPUTS,
  COTANGENTS,
  OUTPUTS,
  GRADS,
];

/**
 * Evaluates a symbolic size.
 *
 * @param size The size, a sum of products of dims.
 * @param dims The values of the dims.
 * @returns The number of floats.
 * @example
 * ```ts
 * sizeOf([[5, "C", "K"], [1, "K"]], { B: 1, T: 1, H: 1, K: 4, V: 4, C: 16 }); // 324
 * ```
 */
export function sizeOf(size: Size, dims: DimValues): number {
  let total = 0;
  for (const [coef, ...syms] of size) {
    let term = coef;
    for (const s of syms) term *= dims[s];
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
 * The offsets (in floats) of every region of a table and its total size.
 *
 * @param table The region table.
 * @param dims The dims to evaluate at.
 * @returns `offsets` by region name and `total` floats.
 * @example
 * ```ts
 * const { offsets } = tableOffsets(BW, { B: 1, T: 1, H: 1, K: 4, V: 8, C: 16 });
 * offsets.DVn; // 128
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

function wgslSize(size: Size): string {
  const terms = size.filter(([coef]) => coef !== 0).map(([coef, ...syms]) => {
    const factors = syms.map((s) => `p.${s}`);
    return coef === 1 && factors.length > 0
      ? factors.join(" * ")
      : [`${coef}u`, ...factors].join(" * ");
  });
  return terms.length === 0 ? "0u" : terms.join(" + ");
}

// ---- the uniform parameters ----

/** The fields of the WGSL `Params` uniform, in order (one 32-bit word each). */
export const PARAM_FIELDS = [
  ["B", "u32"],
  ["T", "u32"],
  ["H", "u32"],
  ["K", "u32"],
  ["V", "u32"],
  ["C", "u32"],
  ["NC", "u32"],
  ["VT", "u32"],
  ["nVT", "u32"],
  ["flags", "u32"],
  ["scale", "f32"],
] as const;
/** Words of the packed parameters, padded to 16 bytes. */
export const PARAM_WORDS = Math.ceil(PARAM_FIELDS.length / 4) * 4;

/** The storage and uniform bindings of group 0, shared by every kernel. */
export const BINDINGS = [
  { name: "p", type: "uniform", wgsl: "Params", doc: "shapes, flags and scale" },
  { name: "x", type: "read-only-storage", wgsl: "array<f32>", doc: "INPUTS" },
  { name: "work", type: "storage", wgsl: "array<f32>", doc: "WORK per chunk" },
  { name: "states", type: "storage", wgsl: "array<f32>", doc: "STATES per chunk" },
  { name: "outp", type: "storage", wgsl: "array<f32>", doc: "OUTPUTS or GRADS" },
  { name: "bw", type: "storage", wgsl: "array<f32>", doc: "BW per chunk" },
  { name: "gs", type: "storage", wgsl: "array<f32>", doc: "GS per chunk" },
  { name: "cot", type: "read-only-storage", wgsl: "array<f32>", doc: "COTANGENTS" },
] as const;
/** The name of one binding. */
export type BindingName = typeof BINDINGS[number]["name"];
/** How many storage buffers one stage binds. */
export const STORAGE_BINDINGS = BINDINGS.filter((b) => b.type !== "uniform").length;

// ---- the plan of one call ----

/** Everything about one call's shape that the host and the kernels need. */
export interface Plan extends KdaDims {
  /** Chunk size. */
  C: ChunkSize;
  /** Chunks per sequence. */
  NC: number;
  /** V columns per scan workgroup. */
  VT: number;
  /** V tiles per (b, h). */
  nVT: number;
  /** Dims as a value map, for {@linkcode sizeOf}. */
  dims: DimValues;
  /** (b, h, chunk) blocks. */
  chunks: number;
  /** Floats of each buffer. */
  floats: {
    inputs: number;
    inputsWithH0: number;
    work: number;
    states: number;
    outputs: number;
    cotangents: number;
    bw: number;
    gs: number;
    grads: number;
  };
}

/**
 * Plans one call: tiles, chunk counts and the size of every buffer.
 *
 * @param shape B, T, H, K, V (positive integers, K and V at most MAX_HEAD_DIM).
 * @param C The chunk size.
 * @returns The plan.
 * @example
 * ```ts
 * makePlan({ B: 2, T: 256, H: 2, K: 32, V: 32 }, 16).NC; // 16
 * ```
 */
export function makePlan(shape: KdaDims, C: ChunkSize): Plan {
  const { B, T, H, K, V } = shape;
  const NC = Math.ceil(T / C);
  // VT: a power of two times 4 with K·VT ≤ 4·SCAN_STATE_VEC4 and C·VT ≤ 4·SCAN_ROWS_VEC4 (each
  // scan invocation owns 4 state and 2 row entries), no wider than V needs.
  let VT = MAX_SCAN_TILE;
  while (
    VT > 4 &&
    (K * VT > 4 * SCAN_STATE_VEC4 || C * VT > 4 * SCAN_ROWS_VEC4 || VT / 2 >= V)
  ) VT /= 2;

  const dims: DimValues = { B, T, H, K, V, C };
  const chunks = B * H * NC;
  const per = (t: RegionTable) => tableOffsets(t, dims).total;
  const inputs = tableOffsets(INPUTS, dims);
  return {
    B,
    T,
    H,
    K,
    V,
    C,
    NC,
    VT,
    nVT: Math.ceil(V / VT),
    dims,
    chunks,
    floats: {
      inputs: inputs.offsets.H0,
      inputsWithH0: inputs.total,
      work: chunks * per(WORK),
      states: chunks * per(STATES),
      outputs: per(OUTPUTS),
      cotangents: per(COTANGENTS),
      bw: chunks * per(BW),
      gs: chunks * per(GS),
      grads: per(GRADS),
    },
  };
}

/**
 * The uniform parameters of a call, packed as the WGSL `Params` struct.
 *
 * @param plan The call's plan.
 * @param flags FLAGS bits.
 * @param scale The query scale (finite in f32).
 * @returns PARAM_WORDS words.
 * @example
 * ```ts
 * packParams(makePlan({ B: 1, T: 8, H: 1, K: 4, V: 4 }, 16), 0, 0.5).byteLength; // 64
 * ```
 */
export function packParams(plan: Plan, flags: number, scale: number): ArrayBuffer {
  const bytes = new ArrayBuffer(PARAM_WORDS * 4);
  const u = new Uint32Array(bytes);
  const f = new Float32Array(bytes);
  const { B, T, H, K, V, C, NC, VT, nVT } = plan;
  const values: Record<string, number> = { B, T, H, K, V, C, NC, VT, nVT, flags, scale };
  PARAM_FIELDS.forEach(([name, type], i) => {
    if (type === "f32") f[i] = values[name];
    else u[i] = values[name];
  });
  return bytes;
}

/**
 * Splits the NC chunks into the ranges of successive scan dispatches (see LOOP_BUDGET).
 *
 * @param plan The call's plan.
 * @returns Half-open chunk ranges [n0, n1) in ascending order, covering 0..NC exactly.
 * @example
 * ```ts
 * scanRanges(makePlan({ B: 1, T: 64, H: 1, K: 4, V: 4 }, 16)); // [[0, 4]]
 * ```
 */
export function scanRanges(plan: Plan): [number, number][] {
  // loop iterations of a scan invocation per chunk (chunk.wgsl): forward, d < K then s < C then
  // r < C; backward, d < K, s < C, r < C
  const perChunk = scanLoopsPerChunk(plan);
  const chunksPer = Math.max(1, Math.floor((LOOP_BUDGET - 64) / perChunk));
  const ranges: [number, number][] = [];
  for (let n0 = 0; n0 < plan.NC; n0 += chunksPer) {
    ranges.push([n0, Math.min(plan.NC, n0 + chunksPer)]);
  }
  return ranges;
}

/**
 * Loop iterations one scan invocation runs per chunk (the larger of the two scans).
 *
 * @param plan The call's plan.
 * @returns Iterations.
 * @example
 * ```ts
 * scanLoopsPerChunk(makePlan({ B: 1, T: 64, H: 1, K: 128, V: 128 }, 64)); // 260
 * ```
 */
export function scanLoopsPerChunk(plan: Plan): number {
  return plan.K + 2 * plan.C + 4;
}

/**
 * The workgroup grid of a stage: x over the chunks (chunk-parallel stages) or the V tiles (scans),
 * y over the heads, z over the batch. The grid is exact, so the kernels read their coordinates
 * from the workgroup id and no workgroup is idle.
 *
 * @param plan The call's plan.
 * @param stage The stage.
 * @returns [x, y, z] workgroups.
 * @example
 * ```ts
 * stageGrid(makePlan({ B: 2, T: 64, H: 3, K: 8, V: 8 }, 16), "intraChunk"); // [4, 3, 2]
 * ```
 */
export function stageGrid(plan: Plan, stage: Stage): [number, number, number] {
  return [SCAN_STAGES.has(stage) ? plan.nVT : plan.NC, plan.H, plan.B];
}

// ---- limits ----

/** The device limits the layout depends on. */
export interface LayoutLimits {
  /** Bytes of one storage binding. */
  maxStorageBufferBindingSize: number;
  /** Bytes of one buffer. */
  maxBufferSize: number;
  /** Workgroups per dispatch dimension. */
  maxComputeWorkgroupsPerDimension: number;
}

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
 * Why a scale cannot be used in f32, or null.
 *
 * @param scale The resolved query scale.
 * @returns A reason, or null.
 * @example
 * ```ts
 * scaleProblem(1e39); // "scale must be finite in f32: got 1e+39, which rounds to Infinity"
 * ```
 */
export function scaleProblem(scale: number): string | null {
  const f = Math.fround(scale);
  if (!Number.isFinite(f)) {
    return `scale must be finite in f32: got ${scale}, which rounds to ${f}`;
  }
  if (f === 0 && scale !== 0) {
    return `scale must be representable in f32: got ${scale}, which rounds to 0`;
  }
  return null;
}

/** The buffers whose size a limit applies to, by label. */
function bufferFloats(plan: Plan): [string, number][] {
  const f = plan.floats;
  return [
    ["packed inputs", f.inputsWithH0],
    ["per-chunk work", f.work],
    ["chunk-start states", f.states],
    ["outputs", f.outputs],
    ["cotangents", f.cotangents],
    ["backward scratch", f.bw],
    ["gradient scratch", f.gs],
    ["gradients", f.grads],
  ];
}

function overLimit(plan: Plan, limits: LayoutLimits): string | null {
  const maxBinding = Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
  for (const [name, floats] of bufferFloats(plan)) {
    const bytes = floats * 4;
    if (bytes > maxBinding) {
      return `the ${name} buffer needs ${bytes} bytes, over the device's storage binding limit ` +
        `of ${maxBinding} bytes`;
    }
  }
  const perDim = limits.maxComputeWorkgroupsPerDimension;
  const [axis, need] = STAGES.flatMap((s) => stageGrid(plan, s).map((n, i) => [i, n]))
    .reduce((most, next) => (next[1] > most[1] ? next : most));
  if (need > perDim) {
    const what = ["chunks (or V tiles) per sequence", "heads", "batch entries"][axis];
    return `the shape needs ${need} ${what} in one dispatch dimension, over the device's limit ` +
      `of ${perDim} workgroups per dimension`;
  }
  return null;
}

function fits(shape: KdaDims, C: ChunkSize, limits: LayoutLimits): boolean {
  return overLimit(makePlan(shape, C), limits) === null;
}

/** The largest n in [1, hi] with ok(n), or 0 (ok is monotone: true up to some n). */
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
 * Why a planned shape exceeds the device's limits, or null; the reason says what does fit (a
 * smaller chunk size, the largest batch at this T, or the longest T at B = 1).
 *
 * @param plan The call's plan.
 * @param limits The device limits.
 * @returns A reason, or null.
 * @example
 * ```ts
 * const limits = {
 *   maxStorageBufferBindingSize: 1 << 27,
 *   maxBufferSize: 1 << 28,
 *   maxComputeWorkgroupsPerDimension: 65535,
 * };
 * limitProblem(makePlan({ B: 64, T: 4096, H: 16, K: 128, V: 128 }, 64), limits);
 * ```
 */
export function limitProblem(plan: Plan, limits: LayoutLimits): string | null {
  const problem = overLimit(plan, limits);
  if (problem === null) return null;
  const { B, T, H, K, V, C } = plan;
  const shape = { B, T, H, K, V };
  const advice: string[] = [];
  const smaller = ([16, 32] as ChunkSize[]).filter((c) => c < C && fits(shape, c, limits));
  if (smaller.length > 0) advice.push(`chunkSize ${smaller[smaller.length - 1]} fits`);
  const maxB = largest(B, (b) => fits({ ...shape, B: b }, C, limits));
  if (maxB > 0) {
    advice.push(`at T=${T} and chunkSize ${C} the largest batch that fits is B=${maxB}`);
  } else {
    const maxT = largest(T, (t) => fits({ ...shape, B: 1, T: t }, C, limits));
    advice.push(
      maxT > 0
        ? `no batch fits at T=${T}; at B=1 the longest sequence that fits is T=${maxT}`
        : `not even B=1, T=1 fits at H=${H}, K=${K}, V=${V}`,
    );
  }
  return `${problem[0].toUpperCase()}${problem.slice(1)} (B=${B}, T=${T}, H=${H}, K=${K}, ` +
    `V=${V}, chunkSize=${C}): ${advice.join("; ")}`;
}

// ---- the WGSL header ----

/**
 * The WGSL text prepended to kda/chunk.wgsl: constants, the `Params` and `ChunkRange` structs,
 * the bindings, and one offset function per region of every table (plus its size function),
 * all generated from the tables above.
 *
 * @returns WGSL source.
 * @example
 * ```ts
 * wgslHeader().includes("fn workSize() -> u32"); // true
 * ```
 */
export function wgslHeader(): string {
  const lines: string[] = [
    "// ---- generated by kda/gpu/layout.ts: do not edit ----",
    `const WG: u32 = ${WORKGROUP_SIZE}u;`,
    `const TILE: u32 = ${TILE_FLOATS}u;`,
    `const SHARED: u32 = ${2 * TILE_FLOATS}u;`,
    `const LP_BLOCK: u32 = ${LP_BLOCK}u;`,
    `const SCAN_STATE_VEC4: u32 = ${SCAN_STATE_VEC4}u;`,
    `const SCAN_ROWS_VEC4: u32 = ${SCAN_ROWS_VEC4}u;`,
    ...Object.entries(FLAGS).map(([name, bit]) => `const ${name}: u32 = ${bit}u;`),
    "struct Params {",
    ...PARAM_FIELDS.map(([name, type]) => `  ${name}: ${type},`),
    ...Array.from(
      { length: PARAM_WORDS - PARAM_FIELDS.length },
      (_, i) => `  pad${i}: u32,`,
    ),
    "}",
    "struct ChunkRange {",
    "  n0: u32,",
    "  n1: u32,",
    "  pad0: u32,",
    "  pad1: u32,",
    "}",
    ...BINDINGS.map((b, i) => {
      const space = b.type === "uniform"
        ? "uniform"
        : b.type === "storage"
        ? "storage, read_write"
        : "storage, read";
      return `@group(0) @binding(${i}) var<${space}> ${b.name}: ${b.wgsl}; // ${b.doc}`;
    }),
    "@group(1) @binding(0) var<uniform> range: ChunkRange;",
  ];
  for (const table of TABLES) {
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
