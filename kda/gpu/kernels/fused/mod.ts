// The "fused" kernel set: four entry points, two per direction, each fusing several stages of
// kda/chunk.ts (docs/kda.md 2.2, 2.3). The forward's intraChunk builds every chunk's L, P, T, W, U
// in one chunk-parallel kernel and stateScan runs newValues, chunkOutput and stateScan
// sequentially over chunks, one workgroup per (b, h, V tile); the backward mirrors it. Its files
// are kda/chunk.wgsl (the design card keeps that path), scans.wgsl and intra_backward.wgsl beside
// this module. It takes packed batches and grouped value heads through the gpu arm's glue passes
// (kda/gpu/glue.ts), since its kernels know neither.

import type { ChunkSize, KdaDims } from "../../../_types.ts";
import type { AccessorDecl } from "../../accessors.ts";
import { ofSize, type RegionTable, type Size } from "../../layout.ts";
import type { KernelSet, Plan } from "../../kernel_set.ts";
import { CC, chunkRanges, CK, CV, LOOP_BUDGET, scanTile, WORKGROUP_SIZE } from "../_plan.ts";

export { LOOP_BUDGET };

/** Floats of one workgroup tile: the chunk kernels declare two (C × C at C = 64). */
const TILE_FLOATS = 2048;
/** Channels per staged block in the pairwise sums of intraChunk. */
const LP_BLOCK = 8;
// The scans are sequential over chunks and parallel over (b, h, V tile) only. A narrower tile than
// the widest that fits would not shorten the scan (each invocation runs the same loops, its
// entries past the tile's rows are discarded), so the tile is the widest that fits.
/** Widest scan tile (V columns); each is a power of two times 4 (vec4 column groups). */
const MAX_SCAN_TILE = 32;
/** vec4 entries of the scans' state tile (K × VT / 4). */
const SCAN_STATE_VEC4 = 1024;
/** vec4 entries of the scans' row tile (C × VT / 4). */
const SCAN_ROWS_VEC4 = 512;

const TOKQK: Size = [[1, "B", "T", "H", "K"]];
const TOKV: Size = [[1, "B", "T", "H", "V"]];
const TOKB: Size = [[1, "B", "T", "H"]];
const STATE: Size = [[1, "B", "H", "K", "V"]];

/**
 * The forward's per-chunk work (one block per (b, h, chunk)). G is kept as hi + lo (see
 * gateSumAdd in the shared WGSL), Gam is the row e^{G_C} of the last valid token. (Kd holds
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

/** One region per input array of a problem, in its order (h0 last). */
const PER_INPUT = [
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

/** The vec4 accessors the set's three WGSL files use. */
const ACCESSORS: readonly AccessorDecl[] = [
  ["load", "x", "K"],
  ["load", "x", "V"],
  ["load", "work", "K"],
  ["load", "work", "V"],
  ["load", "states", "K"],
  ["load", "bw", "K"],
  ["load", "bw", "V"],
  ["load", "gs", "K"],
  ["load", "cot", "V"],
  ["load", "outp", "V"],
  ["store", "states", "V"],
  ["store", "outp", "V"],
  ["store", "outp", "K"],
  ["store", "bw", "V"],
  ["storeTransposed", "states", "V"],
  ["storeTransposed", "bw", "V"],
  ["gather", "x", "K"],
  ["gather", "work", "K"],
  ["gather", "states", "K"],
  ["gather", "cot", "K"],
  ["gather", "bw", "K"],
  ["gather", "gs", "K"],
  ["gather", "wgm", "K"],
  ["storeRows", "work", "K"],
  ["storeRows", "gs", "K"],
  ["storeTriangle", "work", "K"],
  ["storeTriangle", "gs", "K"],
];

/** The chunk-parallel grid: x over chunks, y over heads, z over the batch. */
const chunkGrid = (plan: Plan): [number, number, number] => [plan.NC, plan.H, plan.B];
/** The scans' grid: x over V tiles. */
const scanGrid = (plan: Plan): [number, number, number] => [plan.extra.nVT, plan.H, plan.B];

/**
 * Loop iterations one scan invocation runs per chunk (the larger of the two scans): forward, d < K
 * then s < C then r < C; backward, d < K, s < C, r < C.
 *
 * @param plan The call's plan.
 * @returns Iterations.
 * @example
 * ```ts
 * import { makePlan } from "../../layout.ts";
 * scanLoopsPerChunk(makePlan(FUSED, { B: 1, T: 64, H: 1, K: 128, V: 128 }, 64)); // 260
 * ```
 */
export function scanLoopsPerChunk(plan: Plan): number {
  return plan.K + 2 * plan.C + 4;
}

/**
 * The fused kernel set: the gpu arm's first set (see the module comment).
 *
 * @example
 * ```ts
 * console.log(FUSED.forward.stages.map((s) => s.entry)); // ["intraChunk", "stateScan"]
 * ```
 */
export const FUSED: KernelSet = {
  name: "fused",
  description: "four kernels that each fuse several stages; exact, the first set; takes packed " +
    "batches and grouped value heads through the glue passes",
  files: [
    new URL("../../../chunk.wgsl", import.meta.url),
    new URL("./scans.wgsl", import.meta.url),
    new URL("./intra_backward.wgsl", import.meta.url),
  ],
  include: ["shared"],
  features: [],
  native: { groupedHeads: false, packed: false },
  workgroupSize: WORKGROUP_SIZE,
  workgroupBytes: Math.max(2 * TILE_FLOATS * 4, (SCAN_STATE_VEC4 + SCAN_ROWS_VEC4) * 16),
  constants: {
    TILE: TILE_FLOATS,
    SHARED: 2 * TILE_FLOATS,
    LP_BLOCK,
    SCAN_STATE_VEC4,
    SCAN_ROWS_VEC4,
  },
  flags: { HAS_H0: 1, HAS_DHT: 2, SAVE_STATES: 4 },
  params: ["B", "T", "H", "K", "V", "C", "NC", "VT", "nVT", "flags", "scale"],
  buffers: [
    {
      name: "inputs",
      table: INPUTS,
      perChunk: false,
      dtype: "f32",
      lifetime: "saved",
      arrays: { Q: "q", K: "k", V: "v", G: "g", Beta: "beta", H0: "h0" },
    },
    { name: "work", table: WORK, perChunk: true, dtype: "f32", lifetime: "saved" },
    {
      name: "states",
      table: STATES,
      perChunk: true,
      dtype: "f32",
      lifetime: "saved",
      onlyWhenSaving: true,
    },
    {
      name: "outputs",
      table: OUTPUTS,
      perChunk: false,
      dtype: "f32",
      lifetime: "forward",
      arrays: { O: "o", Ht: "ht" },
    },
    {
      name: "cotangents",
      table: COTANGENTS,
      perChunk: false,
      dtype: "f32",
      lifetime: "backward",
      arrays: { Dout: "dout", Dht: "dht" },
    },
    { name: "backward scratch", table: BW, perChunk: true, dtype: "f32", lifetime: "backward" },
    { name: "gradient scratch", table: GS, perChunk: true, dtype: "f32", lifetime: "backward" },
    {
      name: "gradients",
      table: GRADS,
      perChunk: false,
      dtype: "f32",
      lifetime: "backward",
      arrays: { Q: "dq", K: "dk", V: "dv", G: "dg", Beta: "dbeta", H0: "dh0" },
    },
  ],
  bindings: [
    { name: "x", type: "read-only-storage", wgsl: "array<f32>", doc: "INPUTS" },
    { name: "work", type: "storage", wgsl: "array<f32>", doc: "WORK per chunk" },
    { name: "states", type: "storage", wgsl: "array<f32>", doc: "STATES per chunk" },
    { name: "outp", type: "storage", wgsl: "array<f32>", doc: "OUTPUTS or GRADS" },
    { name: "bw", type: "storage", wgsl: "array<f32>", doc: "BW per chunk" },
    { name: "gs", type: "storage", wgsl: "array<f32>", doc: "GS per chunk" },
    { name: "cot", type: "read-only-storage", wgsl: "array<f32>", doc: "COTANGENTS" },
  ],
  accessors: ACCESSORS,
  forward: {
    stages: [
      {
        entry: "intraChunk",
        grid: chunkGrid,
        sections: ["cumsum", "lp", "factors1", "subst", "wu", "u", "factors2"],
      },
      { entry: "stateScan", grid: scanGrid, scan: true },
    ],
    bind: { x: "inputs", work: "work", states: "states", outp: "outputs" },
  },
  backward: {
    stages: [
      { entry: "stateScanBackward", grid: scanGrid, scan: true },
      {
        entry: "intraChunkBackward",
        grid: chunkGrid,
        sections: ["bA", "bKg", "bPM", "bdV", "bdT", "bKb", "bC", "bD", "bE", "bF"],
      },
    ],
    bind: {
      x: "inputs",
      work: "work",
      states: "states",
      outp: "gradients",
      bw: "backward scratch",
      gs: "gradient scratch",
      cot: "cotangents",
    },
  },
  extra(shape: KdaDims, C: ChunkSize) {
    return scanTile(shape, C, {
      maxTile: MAX_SCAN_TILE,
      stateVec4: SCAN_STATE_VEC4,
      rowsVec4: SCAN_ROWS_VEC4,
    });
  },
  scanRanges: (plan: Plan) => chunkRanges(plan.NC, scanLoopsPerChunk(plan)),
  whyNot: () => null,
};
