// The "split" kernel set, designed for speed on large problems: the stages of kda/chunk.ts split
// as a fast chunked KDA splits them (gate sums and the chunk's pairwise products, the sequential
// state scan alone, the output as its own chunk-parallel product; in the backward the scan, the
// three C x V x K products, the WY and inverse adjoints, the pairwise sums, the gate cumsum, each
// heavy stage a dispatch of its own), with the pairwise decays of L, P and their gradients
// factored through anchor rows whose decays are computed once per chunk (docs/kda.md 2.2, 2.3).
// It reads the caller's arrays and writes the results in place (no packed copies), walks the
// chunks of each sequence of a packed batch through a chunk table, and reads q and k at their own
// head for grouped value heads (the gradients of each group summed by a stage of its own). A stage
// that only reads one of the set's per-chunk buffers reads it through a vec4 view (docs/kda.md
// 3.2), and the backward runs slice by slice over the chunks from the last (gateFactors forming
// the slice's gate sums, Kd and Qg again, which a saved forward does not keep, then its scan on the
// slice, then its chunk-parallel stages), so that those and its backward and gradient scratch stay
// under a budget (SLICE_BUDGET, docs/kda.md 3.3).

import type { ChunkSize, KdaDims } from "../../../_types.ts";
import {
  bytesOf,
  ofSize,
  type RegionTable,
  sequenceChunks,
  type Size,
  sliceOrder,
  tableOffsets,
} from "../../layout.ts";
import { gpuDebug } from "../../_debug.ts";
import type { BufferDecl, KernelSet, Plan } from "../../kernel_set.ts";
import { CC, chunkRanges, CK, CV, evenRanges, scanTile, WORKGROUP_SIZE } from "../_plan.ts";
import { SPLIT_ACCESSORS } from "./_accessors.ts";

/**
 * Channels per staged slice of the pairwise products: a multiple of four, so that a diagonal
 * block's four channel groups (the channels of each residue mod 4) and every sum's order are the
 * same whatever the slice. 12 takes chunkPrep 3.96 ms at (8, 4096, 16, 128) on an H100, against
 * 4.09 at 8, with the same bits (ANALYSIS.md, fifteenth pass); 7 operands of 16 row quads at
 * LP_BLOCK + 1 vec4s must fit prep (below), and a slice's 16 row quads one entry an invocation.
 */
const LP_BLOCK = 12;
if (LP_BLOCK % 4 || 16 * LP_BLOCK > WORKGROUP_SIZE) throw new Error(`Invalid LP_BLOCK ${LP_BLOCK}`);
/** vec4s per row quad of a staged operand of the pairwise products (padded by one, see prep.wgsl). */
const LP_STRIDE = LP_BLOCK + 1;
/** vec4s of one staged operand of the pairwise products: C / 4 row quads at C = 64. */
const LP_OPERAND = 16 * LP_STRIDE;
/**
 * chunkPrep's workgroup array `prep` (common.wgsl), 24 KB, so that two of its workgroups share an
 * SM of the H200 (ANALYSIS.md, seventh pass): its first PREP_HALF vec4s hold the C x (C + 1)
 * substitution matrix (its padded stride reaches a little past them while nothing else is there)
 * and then T diag(beta) (C^2 / 4 vec4s at C = 64), the PREP_WU after them the slices of W's and
 * U's right operands (16 rows of 128 columns). The gate sums' part totals (four packed vec4s
 * an invocation: the sums themselves are read from memory, gate_sums.wgsl) and the seven staged
 * operands of the pairwise products (7 LP_OPERAND vec4s) span the whole array, which holds
 * nothing else while they are in use.
 */
const PREP_HALF = 1024;
const PREP_WU = 512;
const PREP_VEC4 = PREP_HALF + PREP_WU;
if (7 * LP_OPERAND > PREP_VEC4) throw new Error("the pairwise products' stage exceeds prep");
/** Widest scan tile (V columns). */
const MAX_SCAN_TILE = 32;
/** vec4 entries of the scans' state tile (K × VT / 4) and row tile (C × VT / 4). */
const SCAN_STATE_VEC4 = 1024;
const SCAN_ROWS_VEC4 = 512;
/**
 * vec4 entries of one of the scans' two slab buffers (one vec4 per invocation): the operand rows
 * the scans stream through workgroup memory (forward.wgsl).
 */
const SCAN_SLAB_VEC4 = 256;
/**
 * vec4 entries of the scans' workgroup memory: the state tile's region (which also holds the row
 * tiles, see forward.wgsl) and two slabs, 24 KB. The NVIDIA Vulkan driver on the H200 keeps two
 * workgroups of up to about 24 KB on an SM and one of 27 KB or more (ANALYSIS.md, sixth pass): at
 * 32 KB the scans' workgroups ran one an SM.
 */
const SCAN_VEC4 = SCAN_STATE_VEC4 + 2 * SCAN_SLAB_VEC4;
/**
 * vec4s of chunkOutput's staged slices (forward.wgsl): MM_SLICE steps of 16 row quads of the left
 * operand and of up to 32 column quads of the right (V <= 128; half as many steps up to V = 256),
 * 12 KB in all.
 */
const OUT_A_VEC4 = 256;
const OUT_B_VEC4 = 512;
/** Invocations of chunkOutput's workgroups (see forward.wgsl). */
const OUT_WG = 512;
/**
 * vec4s of chunkGradsK's two tile stages (grads_k.wgsl): tileA and tileK hold the C x C square of
 * dT, then X (half in each at C = 64): 16 KB in all (T is read from TRI).
 */
const TILE_A_VEC4 = 512;
const TILE_K_VEC4 = 512;
/** Channels (or value columns) per staged slice of the output and gradient products. */
const MM_SLICE = 16;
/**
 * vec4s of chunkGradsV's own workgroup array (grads_v.wgsl): four left-operand slots of
 * MM_SLICE x C / 4 vec4s and an MM_SLICE x 256 / 4 right-operand slice (32 KB).
 */
const GV_VEC4 = 4 * MM_SLICE * 16 + MM_SLICE * 64;
/**
 * Rows per anchor block of Stage E's pairwise sums (chunk_backward.wgsl). At 64, a chunk's rows at
 * every chunk size: every pair's decay is formed in the loops themselves, one exp a row, and the
 * loops over earlier and later blocks are not entered, and chunkGradsK skips the factors F and A
 * that only they read. On the H200 that was fastest (pairwiseGrads 4.92 ms against 5.09 at 32 rows,
 * 5.33 at 16, 5.66 at 8; chunkGradsK 3.04 → 2.49 ms without the factors); removing the unentered
 * loops as well (branch noF) made pairwiseGrads 0.77 ms slower: bench/results/ANALYSIS.md, twelfth
 * and thirteenth passes.
 */
const E_BLOCK = 64;
/**
 * Channel quads a warp of Stage E's blocks spans, its other lanes taking the next row quad (on the
 * H200, 8 channel quads x 4 row quads was slower: bench/results/ANALYSIS.md, eleventh pass).
 */
const PW_COLS = 16;
/** Channel quads a workgroup of Stage E takes (a head's channel groups side by side in z). */
const PW_QUADS = 16;
/**
 * Bytes of per-slice buffers (GATES, BW and GS) the backward holds at once, as a share of the
 * call: twice one of its per-chunk C x K tensors (so that a cold kdaVjp's footprint scales with
 * the problem: 1.46 GB at (4, 4096, 16, 128)), at least SLICE_FLOOR (small problems run in one
 * slice, mid-sized ones in few: a slice's dispatches hold its chunks alone) and at most
 * SLICE_BUDGET. The backward runs slice by slice over the chunks when the whole
 * scratch would be larger (3.9 GB at (8, 4096, 16, 128)).
 */
const SLICE_BUDGET = 512 * 2 ** 20;
const SLICE_FLOOR = 256 * 2 ** 20;
const SLICE_SHARE = 2;
/** Workgroups per dispatch dimension of the chunk-parallel stages' grid in x. */
const GRID_X = 32768;

/** A buffer holding one array of the call, bound directly where it is the caller's. */
function arrayBuffer(
  name: string,
  array: NonNullable<BufferDecl["arrays"]>[string] & string,
  size: Size,
  lifetime: BufferDecl["lifetime"],
): BufferDecl {
  const region = name[0].toUpperCase() + name.slice(1);
  return {
    name,
    table: { prefix: "a", regions: [{ name: region, size }] },
    perChunk: false,
    dtype: "f32",
    lifetime,
    arrays: { [region]: array },
  };
}

/** A per-chunk buffer of one C × K tensor, its size function named after it (kdSize for Kd). */
function chunkTensor(prefix: string, name: string): RegionTable {
  return {
    prefix,
    sizeFn: `${name[0].toLowerCase()}${name.slice(1)}Size`,
    regions: [{ name, size: CK }],
  };
}

/**
 * The forward's per-chunk work that a saved forward keeps, one block per (chunk, head): W, and Gam
 * = e^{G_C}. The gate sums and the gated q and k (Kd, Qg) are not kept: the forward's Kd and Qg
 * live in buffers of their own (KD, QG) that the forward alone reads, and the backward forms the
 * gate sums, Kd and Qg again slice by slice (GATES), with the bits chunkPrep gave them.
 */
export const WORK: RegionTable = {
  prefix: "w",
  sizeFn: "workSize",
  regions: [{ name: "W", size: CK }, { name: "Gam", size: [[1, "K"]] }],
};

/** Kd = K ⊙ e^{G_C − G} per chunk, which only the forward scan reads in the forward. */
export const KD: RegionTable = chunkTensor("d", "Kd");

/** Qg = scale Q ⊙ e^G per chunk, which only chunkOutput reads in the forward. */
export const QG: RegionTable = chunkTensor("q", "Qg");

/**
 * The backward's gate sums (G as hi + lo), Kd and Qg, for one slice of the chunks at a time:
 * gateFactors forms them from g, k and q at the start of each slice, as chunkPrep formed them, so
 * that the backward reads the forward's bits without a saved forward keeping them.
 */
export const GATES: RegionTable = {
  prefix: "x",
  sizeFn: "gatesSize",
  regions: ofSize(CK, "G", "Glo", "Kd", "Qg"),
};

/**
 * U = T diag(beta) V per chunk, which only the forward scan reads: a buffer of the forward alone.
 * Until chunkPrep's last products replace it with U, a block holds the chunk's gate sums' high
 * parts ([C, K]; U_SPARE floats more where K > V), which only chunkPrep reads.
 */
export const UWORK: RegionTable = {
  prefix: "u",
  sizeFn: "uSize",
  regions: [{ name: "U", size: [...CV, [1, "U_SPARE"]] }],
};

/** The low parts of the gate sums per chunk, which only chunkPrep reads. */
export const GLO: RegionTable = chunkTensor("l", "Glo");

/**
 * The forward's per-chunk C × C matrices: P (lower, scaled) and T = (I + L)^-1 (L itself lives
 * only in chunkPrep's workgroup memory: nothing after it reads L).
 */
export const TRI: RegionTable = {
  prefix: "r",
  sizeFn: "triSize",
  regions: ofSize(CC, "P", "T"),
};

/** What the forward scan leaves per chunk: the chunk-start state S ([V, K]) and Vn ([C, V]). */
export const STATES: RegionTable = {
  prefix: "s",
  sizeFn: "stateSize",
  regions: [{ name: "S", size: [[1, "K", "V"]] }, { name: "Vn", size: CV }],
};

/**
 * The backward's per-chunk scan results: dVn and dS' ([V, K]), for one slice of the chunks at a
 * time (the backward runs slice by slice, its scan too). Once chunkGradsV has spent them,
 * Stage E leaves two [C, K] blocks of per-row pieces here for Stage F (chunk_backward.wgsl), so
 * that it only reads the gradient scratch (and binds it as a vec4 view); DS ends in BW_SPARE more
 * floats, the room those blocks need beyond dVn and dS' (none when K <= V and C <= V).
 */
export const BW: RegionTable = {
  prefix: "b",
  sizeFn: "bwSize",
  regions: [{ name: "DVn", size: CV }, { name: "DS", size: [[1, "K", "V"], [1, "BW_SPARE"]] }],
};

/**
 * The backward's per-chunk gradient scratch. W takes a second tenant once the first is spent
 * (grads_k.wgsl): it holds dW, then Stage E's factors F; A holds the other factors. L holds dL
 * (dT and X stay in workgroup memory).
 */
export const GS: RegionTable = {
  prefix: "g",
  sizeFn: "gsSize",
  regions: [
    ...ofSize(CK, "Kd", "Qg", "W", "Kb", "A"),
    ...ofSize(CC, "P", "L", "M"),
    { name: "Gam", size: [[1, "K"]] },
    { name: "Bv", size: [[1, "C"]] },
  ],
};

/**
 * The chunk table: a record per chunk (sequence, first token, rows, index) and per sequence (first
 * chunk, chunks, first token, length), then the chunks in slice order (the chunk at each
 * position) and each chunk's position (layout.ts's sliceOrder).
 */
const CHUNKS: RegionTable = {
  prefix: "t",
  regions: [
    { name: "Chunk", size: [[4, "NCT"]] },
    { name: "Seq", size: [[4, "N"]] },
    { name: "Order", size: [[1, "NCT"]] },
    { name: "Pos", size: [[1, "NCT"]] },
  ],
};

/** The chunk table of a plan: what each chunk-parallel workgroup and each scan reads. */
function chunkTable(plan: Plan): Uint32Array {
  const { C, N, NCT, T, cuSeqlens } = plan;
  const out = new Uint32Array(6 * NCT + 4 * N);
  const counts = sequenceChunks(plan);
  const { order, pos } = sliceOrder(counts);
  out.set(order, 4 * NCT + 4 * N);
  out.set(pos, 5 * NCT + 4 * N);
  let c = 0;
  for (let seq = 0; seq < N; seq++) {
    const start = cuSeqlens === undefined ? seq * T : cuSeqlens[seq];
    const len = cuSeqlens === undefined ? T : cuSeqlens[seq + 1] - cuSeqlens[seq];
    const n = counts[seq];
    out.set([c, n, start, len], 4 * NCT + 4 * seq);
    for (let i = 0; i < n; i++, c++) {
      out.set([seq, start + i * C, Math.min(C, len - i * C), i], 4 * c);
    }
  }
  return out;
}

const TOKQ: Size = [[1, "B", "T", "HQ", "K"]];
const TOKK: Size = [[1, "B", "T", "H", "K"]];
const TOKV: Size = [[1, "B", "T", "H", "V"]];
const TOKB: Size = [[1, "B", "T", "H"]];
const STATE: Size = [[1, "N", "H", "K", "V"]];

/** A chunk-parallel grid over n chunks: the chunks in x (wrapped past GRID_X), heads in z. */
const gridOver = (n: number, plan: Plan): [number, number, number] => [
  Math.min(n, GRID_X),
  Math.ceil(n / GRID_X),
  plan.H,
];
/** The chunk-parallel grid: every chunk of every sequence. */
const chunkGrid = (plan: Plan) => gridOver(plan.NCT, plan);
/** The sliced stages' grid: the chunks of one slice. */
const sliceGrid = (plan: Plan) => gridOver(plan.sliceChunks, plan);
/** Stage E's grid: the slice's chunks, and each head's channel groups of PW_QUADS quads in z. */
const pairwiseGrid = (plan: Plan): [number, number, number] => {
  const [x, y, z] = sliceGrid(plan);
  return [x, y, z * Math.ceil(plan.K / (4 * PW_QUADS))];
};
/** The scans' grid: V tiles, heads, sequences. */
const scanGrid = (plan: Plan): [number, number, number] => [plan.extra.nVT, plan.H, plan.N];
/** What the grids' dimensions count, for the reason a shape over the device's limit gets. */
const CHUNK_AXES = ["chunks", `runs of ${GRID_X} chunks`, "heads"] as const;
const PAIRWISE_AXES = [
  CHUNK_AXES[0],
  CHUNK_AXES[1],
  `heads × channel groups of ${4 * PW_QUADS}`,
] as const;
const SCAN_AXES = ["V tiles", "heads", "sequences"] as const;
const SUM_AXES = ["workgroups of token rows", `runs of ${GRID_X} workgroups`, "—"] as const;
/** The group sums' grid: four channels of every token row of the query/key heads an invocation. */
function sumGrid(plan: Plan): [number, number, number] {
  const groups = Math.ceil((plan.B * plan.T * plan.HQ * Math.ceil(plan.K / 4)) / WORKGROUP_SIZE);
  return [Math.min(groups, GRID_X), Math.ceil(groups / GRID_X), 1];
}

/**
 * The split kernel set (see the module comment).
 *
 * @example
 * ```ts
 * console.log(SPLIT.forward.stages.map((s) => s.entry)); // ["chunkPrep", "stateScan", "chunkOutput"]
 * ```
 */
export const SPLIT: KernelSet = {
  name: "split",
  description: "stages split for speed, anchored pairwise products, the caller's arrays bound " +
    "directly, packed batches and grouped value heads natively",
  files: [
    new URL("./common.wgsl", import.meta.url),
    new URL("./gate_sums.wgsl", import.meta.url),
    new URL("./prep.wgsl", import.meta.url),
    new URL("./forward.wgsl", import.meta.url),
    new URL("./scan_backward.wgsl", import.meta.url),
    new URL("./grads_v.wgsl", import.meta.url),
    new URL("./grads_k.wgsl", import.meta.url),
    new URL("./chunk_backward.wgsl", import.meta.url),
  ],
  include: ["shared"],
  features: [],
  native: { groupedHeads: true, packed: true },
  workgroupSize: WORKGROUP_SIZE,
  largestWorkgroup: OUT_WG,
  workgroupBytes: Math.max(
    PREP_VEC4 * 16,
    SCAN_VEC4 * 16,
    (OUT_A_VEC4 + OUT_B_VEC4) * 16,
    (TILE_A_VEC4 + TILE_K_VEC4) * 16,
    GV_VEC4 * 16,
  ),
  constants: {
    PREP_HALF,
    PREP_WU,
    PREP_VEC4,
    LP_BLOCK,
    LP_STRIDE,
    LP_OPERAND,
    MM_SLICE,
    GV_VEC4,
    E_BLOCK,
    PW_COLS,
    PW_QUADS,
    SCAN_STATE_VEC4,
    SCAN_ROWS_VEC4,
    SCAN_SLAB_VEC4,
    SCAN_VEC4,
    OUT_A_VEC4,
    OUT_B_VEC4,
    OUT_WG,
    TILE_A_VEC4,
    TILE_K_VEC4,
    GRID_X,
  },
  flags: { HAS_H0: 1, HAS_DHT: 2, SAVE_STATES: 4, GROUPED: 8 },
  planFlags: (plan) => grouped(plan) ? 8 : 0,
  params: [
    "B",
    "T",
    "H",
    "HQ",
    "G",
    "K",
    "V",
    "C",
    "N",
    "NCT",
    "NC",
    "VT",
    "nVT",
    "BW_SPARE",
    "U_SPARE",
    "flags",
    "scale",
  ],
  buffers: [
    arrayBuffer("q", "q", TOKQ, "saved"),
    arrayBuffer("k", "k", TOKQ, "saved"),
    arrayBuffer("v", "v", TOKV, "saved"),
    arrayBuffer("g", "g", TOKK, "saved"),
    arrayBuffer("beta", "beta", TOKB, "saved"),
    arrayBuffer("h0", "h0", STATE, "forward"),
    {
      name: "chunk table",
      table: CHUNKS,
      perChunk: false,
      dtype: "u32",
      lifetime: "saved",
      init: chunkTable,
    },
    { name: "work", table: WORK, perChunk: true, dtype: "f32", lifetime: "saved" },
    { name: "kd", table: KD, perChunk: true, dtype: "f32", lifetime: "forward" },
    { name: "qg", table: QG, perChunk: true, dtype: "f32", lifetime: "forward" },
    { name: "u", table: UWORK, perChunk: true, dtype: "f32", lifetime: "forward" },
    { name: "glo", table: GLO, perChunk: true, dtype: "f32", lifetime: "forward" },
    { name: "tri", table: TRI, perChunk: true, dtype: "f32", lifetime: "saved" },
    { name: "states", table: STATES, perChunk: true, dtype: "f32", lifetime: "saved" },
    { ...arrayBuffer("o", "o", TOKV, "forward"), onlyForOutputs: true },
    arrayBuffer("ht", "ht", STATE, "forward"),
    arrayBuffer("dout", "dout", TOKV, "backward"),
    arrayBuffer("dht", "dht", STATE, "backward"),
    {
      name: "gate sums",
      table: GATES,
      perChunk: true,
      perSlice: true,
      dtype: "f32",
      lifetime: "backward",
    },
    {
      name: "backward scratch",
      table: BW,
      perChunk: true,
      perSlice: true,
      dtype: "f32",
      lifetime: "backward",
    },
    {
      name: "gradient scratch",
      table: GS,
      perChunk: true,
      perSlice: true,
      dtype: "f32",
      lifetime: "backward",
    },
    arrayBuffer("dq", "dq", TOKQ, "backward"),
    arrayBuffer("dk", "dk", TOKQ, "backward"),
    arrayBuffer("dv", "dv", TOKV, "backward"),
    arrayBuffer("dg", "dg", TOKK, "backward"),
    arrayBuffer("dbeta", "dbeta", TOKB, "backward"),
    arrayBuffer("dh0", "dh0", STATE, "backward"),
    {
      name: "dq per value head",
      table: { prefix: "e", regions: [{ name: "Dq", size: TOKK }] },
      perChunk: false,
      dtype: "f32",
      lifetime: "backward",
      when: (plan) => plan.H !== plan.HQ,
    },
    {
      name: "dk per value head",
      table: { prefix: "e", regions: [{ name: "Dk", size: TOKK }] },
      perChunk: false,
      dtype: "f32",
      lifetime: "backward",
      when: (plan) => plan.H !== plan.HQ,
    },
  ],
  bindings: [
    ...["q", "k", "v", "g", "beta", "h0"].map((name) => ({
      name,
      type: "read-only-storage" as const,
      wgsl: "array<f32>",
      doc: name,
    })),
    { name: "chunks", type: "read-only-storage", wgsl: "array<u32>", doc: "the chunk table" },
    { name: "work", type: "storage", wgsl: "array<f32>", doc: "WORK per chunk" },
    { name: "kd", type: "storage", wgsl: "array<f32>", doc: "Kd per chunk" },
    { name: "qg", type: "storage", wgsl: "array<f32>", doc: "Qg per chunk" },
    { name: "gates", type: "storage", wgsl: "array<f32>", doc: "GATES per chunk of a slice" },
    { name: "u", type: "storage", wgsl: "array<f32>", doc: "U per chunk" },
    { name: "glo", type: "storage", wgsl: "array<f32>", doc: "G's low parts per chunk" },
    { name: "tri", type: "storage", wgsl: "array<f32>", doc: "TRI per chunk" },
    { name: "states", type: "storage", wgsl: "array<f32>", doc: "STATES per chunk" },
    { name: "o", type: "storage", wgsl: "array<f32>", doc: "o" },
    { name: "ht", type: "storage", wgsl: "array<f32>", doc: "ht (and the scans' carry)" },
    { name: "dout", type: "read-only-storage", wgsl: "array<f32>", doc: "dout" },
    { name: "dht", type: "read-only-storage", wgsl: "array<f32>", doc: "dht" },
    { name: "bw", type: "storage", wgsl: "array<f32>", doc: "BW per chunk" },
    { name: "gs", type: "storage", wgsl: "array<f32>", doc: "GS per chunk" },
    // the per-chunk buffers as vec4s, for the stages that only read them (a buffer the package
    // makes is whole vec4s: buffers.ts)
    ...["work", "kd", "qg", "gates", "u", "tri", "states", "bw", "gs"].map((name) => ({
      name: `${name}4`,
      type: "read-only-storage" as const,
      wgsl: "array<vec4f>",
      doc: `${name} as vec4s`,
    })),
    // the buffers Stage E writes four floats at a time, as writable vec4s (a buffer the package
    // makes is whole vec4s; Stage E binds them through these alone)
    ...["bw", "dq", "dk", "dg", "dqh", "dkh"].map((name) => ({
      name: `${name}4w`,
      type: "storage" as const,
      wgsl: "array<vec4f>",
      doc: `${name} as vec4s, written`,
    })),
    ...["dq", "dk", "dv", "dg", "dbeta", "dh0", "dqh", "dkh"].map((name) => ({
      name,
      type: "storage" as const,
      wgsl: "array<f32>",
      doc: name,
    })),
  ],
  accessors: SPLIT_ACCESSORS,
  forward: {
    stages: [
      {
        entry: "chunkPrep",
        grid: chunkGrid,
        axes: CHUNK_AXES,
        uses: ["q", "k", "v", "g", "beta", "chunks", "work", "kd", "qg", "u", "glo", "tri"],
        sections: ["cumsum", "lp", "subst", "wu", "factors"],
      },
      {
        entry: "stateScan",
        grid: scanGrid,
        axes: SCAN_AXES,
        scan: true,
        uses: ["h0", "chunks", "work4", "kd4", "u4", "states", "ht"],
        sections: ["sload", "sprod", "sstore"],
      },
      {
        entry: "chunkOutput",
        grid: chunkGrid,
        axes: CHUNK_AXES,
        onlyOutputs: true,
        uses: ["chunks", "qg4", "tri4", "states4", "o"],
      },
    ],
    bind: {
      ...sameNames("q", "k", "v", "g", "beta", "h0", "work", "kd", "qg", "u", "glo", "tri"),
      ...sameNames("states", "o", "ht"),
      chunks: "chunk table",
      work4: "work",
      kd4: "kd",
      qg4: "qg",
      u4: "u",
      tri4: "tri",
      states4: "states",
    },
  },
  backward: {
    stages: [
      {
        entry: "gateFactors",
        grid: sliceGrid,
        axes: CHUNK_AXES,
        sliced: true,
        uses: ["q", "k", "g", "chunks", "gates"],
      },
      {
        entry: "stateScanBackward",
        grid: scanGrid,
        axes: SCAN_AXES,
        scan: true,
        sliced: true,
        uses: ["chunks", "work4", "gates4", "tri4", "dout", "dht", "bw", "dh0"],
      },
      {
        entry: "chunkGradsV",
        grid: sliceGrid,
        axes: CHUNK_AXES,
        sliced: true,
        uses: [
          ...["v", "beta", "chunks", "tri4", "states4", "dout", "bw4"],
          ...["gs", "dv"],
        ],
        sections: ["bA", "bPM", "bdV"],
      },
      {
        entry: "chunkGradsK",
        grid: sliceGrid,
        axes: CHUNK_AXES,
        sliced: true,
        uses: ["k", "beta", "chunks", "gates4", "tri4", "gs"],
        sections: ["bdT", "bKb", "bEf", "bC", "bD"],
      },
      {
        entry: "pairwiseGrads",
        grid: pairwiseGrid,
        axes: PAIRWISE_AXES,
        sliced: true,
        uses: [
          ...["q", "k", "beta", "chunks", "gates4", "gs4", "bw4w"],
          ...["dq4w", "dk4w", "dg4w", "dqh4w", "dkh4w"],
        ],
        sections: ["bE"],
      },
      {
        entry: "gateCumsumBackward",
        grid: sliceGrid,
        axes: CHUNK_AXES,
        sliced: true,
        uses: ["chunks", "work4", "bw", "gs", "dg", "dbeta"],
        sections: ["bF"],
      },
      {
        entry: "groupSums",
        grid: sumGrid,
        axes: SUM_AXES,
        uses: ["dq", "dk", "dqh", "dkh"],
        when: grouped,
      },
    ],
    bind: {
      ...sameNames("q", "k", "v", "g", "beta", "work", "tri", "states", "dout", "dht"),
      ...sameNames("dq", "dk", "dv", "dg", "dbeta", "dh0"),
      chunks: "chunk table",
      work4: "work",
      tri4: "tri",
      states4: "states",
      gates: "gate sums",
      gates4: "gate sums",
      bw: "backward scratch",
      bw4: "backward scratch",
      gs: "gradient scratch",
      gs4: "gradient scratch",
      dqh: "dq per value head",
      dkh: "dk per value head",
      bw4w: "backward scratch",
      dq4w: "dq",
      dk4w: "dk",
      dg4w: "dg",
      dqh4w: "dq per value head",
      dkh4w: "dk per value head",
    },
  },
  extra(shape: KdaDims, C: ChunkSize) {
    const { K, V } = shape;
    return {
      ...scanTile(shape, C, {
        maxTile: MAX_SCAN_TILE,
        stateVec4: SCAN_STATE_VEC4,
        rowsVec4: SCAN_ROWS_VEC4,
      }),
      // Stage E's two [C, K] blocks in bw, beyond dVn and dS'
      BW_SPARE: Math.max(0, 2 * C * K - C * V - K * V),
      // the gate sums' high parts in U's block, beyond U
      U_SPARE: Math.max(0, C * (K - V)),
    };
  },
  scanRanges(plan: Plan) {
    // the busiest scan invocation loops once a slab and once per vec4 of K, row of P^T (by four),
    // and row of the two r-slab operands per chunk (scan_backward.wgsl), under K + 3 C + 16
    const ranges = gpuDebug.scanChunks === null
      ? chunkRanges(plan.NC, plan.K + 3 * plan.C + 16)
      : evenRanges(plan.NC, gpuDebug.scanChunks);
    // a packed batch of empty sequences still runs one range, which copies h0 to ht
    return ranges.length > 0 ? ranges : [[0, 0]];
  },
  sliceChunks(plan) {
    // as many chunks as SLICE_BUDGET bytes of the gate sums and the backward and gradient scratch
    // (GATES, BW and GS) hold
    const perChunk = plan.H * bytesOf(
      [GATES, GS, BW].reduce((sum, table) => sum + tableOffsets(table, plan.dims).total, 0),
      "f32",
    );
    const share = SLICE_SHARE * bytesOf(plan.NCT * plan.H * plan.C * plan.K, "f32");
    const budget = Math.min(SLICE_BUDGET, Math.max(SLICE_FLOOR, share));
    return Math.floor((gpuDebug.sliceBytes ?? budget) / perChunk);
  },
  whyNot: () => null,
};

/** Bindings bound to the buffers of their own names. */
function sameNames(...names: string[]): Record<string, string> {
  return Object.fromEntries(names.map((name) => [name, name]));
}

/** Whether a call has grouped value heads (the group sums then run). */
function grouped(plan: Plan): boolean {
  return plan.H !== plan.HQ;
}
