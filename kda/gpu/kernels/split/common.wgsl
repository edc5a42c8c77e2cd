// The split set's helpers (kda/gpu/kernels/split/mod.ts): where a workgroup works, through the
// chunk table (every chunk knows its sequence, its first token and its rows, so a packed batch
// costs what its sequences' chunks cost), token rows (q and k at their own head when value heads
// are grouped), and the gate sums of a chunk's work block. The shared WGSL (exact decays, gate
// sums, tile helpers) is included by name; the header and accessors are generated.

// chunkPrep's workgroup memory (prep.wgsl), one array of 24 KB carved by phase: vec4s
// [0, PREP_HALF) hold the C x C matrix of the substitution and then T diag(beta) as the left
// operand of W and U; vec4s [PREP_HALF, PREP_VEC4) the slices of the right operands of W and U.
// The gate sums' part totals (the first 4 WG vec4s) and the staged operands of the pairwise
// products span the whole array.
// Scalars are addressed as floats (prepF, prepSet).
var<workgroup> prep: array<vec4f, PREP_VEC4>;

fn prepF(i: u32) -> f32 {
  return prep[i >> 2u][i & 3u];
}

fn prepSet(i: u32, value: f32) {
  prep[i >> 2u][i & 3u] = value;
}

// Four floats of prep at row + i.x .. row + i.w
fn prepAt4(row: u32, i: vec4u) -> vec4f {
  return vec4f(prepF(row + i.x), prepF(row + i.y), prepF(row + i.z), prepF(row + i.w));
}

// ---- tiled products ----
//
// The C x (V or K) products of a chunk run as register tiles of 4 rows x 8 columns per invocation
// over slices of the contraction staged in workgroup memory as vec4s: for each contraction index,
// four rows of the left operand in one vec4, and four columns of the right operand a vec4, so that
// one step of a tile is three vec4 loads and 32 fused multiply-adds (chunkPrep's W and U in prep,
// chunkOutput in its own arrays, forward.wgsl; chunkGradsV in its own, grads_v.wgsl).

// Two register tiles side by side: 4 rows x 8 columns.
struct Tile8 {
  t0: mat4x4f,
  t1: mat4x4f,
}

// acc + the product of a slice staged in prep: n contraction steps, the left operand's vec4 of
// four rows at a0 + step * aStride, the right operand's two vec4s at b0 + step * bStride and
// half vec4s after it
fn prepSlice(acc: Tile8, a0: u32, aStride: u32, b0: u32, bStride: u32, half: u32, n: u32) -> Tile8 {
  var t0 = acc.t0;
  var t1 = acc.t1;
  for (var dd = 0u; dd < n; dd++) {
    let a = prep[a0 + dd * aStride];
    let b = b0 + dd * bStride;
    t0 = tileFma(t0, a, prep[b]);
    t1 = tileFma(t1, a, prep[b + half]);
  }
  return Tile8(t0, t1);
}

// Where a chunk-parallel workgroup works: its chunk c (global), its (chunk, head) block wid, the
// sequence, the value head h and its query/key head hq, the chunk's first token (a row of the
// [B·T] tokens), its valid rows, and where its block starts in each per-chunk buffer.
struct ChunkAt {
  c: u32,
  wid: u32,
  seq: u32,
  h: u32,
  hq: u32,
  t0: u32,
  cv: u32,
  // where the (chunk, head) block starts in each per-chunk buffer (in gates, bw and gs: its block
  // of the slice, in a sliced stage only)
  work: u32,
  kd: u32,
  qg: u32,
  glo: u32,
  gates: u32,
  u: u32,
  tri: u32,
  states: u32,
  bw: u32,
  gs: u32,
}

fn chunkOf(c: u32, h: u32) -> ChunkAt {
  let i = tChunk() + 4u * c;
  let wid = c * p.H + h;
  return ChunkAt(
    c,
    wid,
    chunks[i],
    h,
    h / p.G,
    chunks[i + 1u],
    chunks[i + 2u],
    wid * workSize(),
    wid * kdSize(),
    wid * qgSize(),
    wid * gloSize(),
    wid * gatesSize(),
    wid * uSize(),
    wid * triSize(),
    wid * stateSize(),
    wid * bwSize(),
    wid * gsSize(),
  );
}

// The block of the (chunk, head) at position pos of slice order in the per-slice buffers of a
// sliced stage (mod.ts): its slice is the positions [range.n0, range.n1), and the gate sums and
// the backward and gradient scratch hold the blocks of that slice alone, from its first position
fn sliceBlock(pos: u32, h: u32) -> u32 {
  return (pos - range.n0) * p.H + h;
}

// As chunkOf, for the chunk at position pos of slice order in a sliced stage
fn slicedChunkOf(pos: u32, h: u32) -> ChunkAt {
  var at = chunkOf(chunks[tOrder() + pos], h);
  let block = sliceBlock(pos, h);
  at.gates = block * gatesSize();
  at.bw = block * bwSize();
  at.gs = block * gsSize();
  return at;
}

// The chunk of a chunk-parallel workgroup (x and y over the chunks, z over the heads); workgroups
// past the last chunk have none (the grid wraps x at GRID_X).
fn chunkIndex(wg: vec3u) -> u32 {
  return wg.x + wg.y * GRID_X;
}

// The token row of row r of the chunk for value-head arrays (v, g, beta, o and their gradients)
fn vrow(at: ChunkAt, r: u32) -> u32 {
  return (at.t0 + r) * p.H + at.h;
}

fn vrow4(at: ChunkAt, rows: vec4u) -> vec4u {
  return (vec4u(at.t0) + rows) * p.H + vec4u(at.h);
}

// The token row of row r of the chunk for q and k (their own head)
fn qrow(at: ChunkAt, r: u32) -> u32 {
  return (at.t0 + r) * p.HQ + at.hq;
}

fn qrow4(at: ChunkAt, rows: vec4u) -> vec4u {
  return (vec4u(at.t0) + rows) * p.HQ + vec4u(at.hq);
}

// A sequence as the scans see it: its first chunk, its chunk count, its first token, its length.
struct SeqAt {
  first: u32,
  count: u32,
  t0: u32,
  len: u32,
}

fn seqOf(s: u32) -> SeqAt {
  let i = tSeq() + 4u * s;
  return SeqAt(chunks[i], chunks[i + 1u], chunks[i + 2u], chunks[i + 3u]);
}

// a + b of two running sums (64-bit integer addition: exact and associative, so a sum split into
// parts and joined gives the bits of the sum in one pass)
fn gateSumJoin(a: GateSum, b: GateSum) -> GateSum {
  let lo = a.lo + b.lo;
  return GateSum(a.hi + b.hi + select(0i, 1i, lo < b.lo), lo);
}

// a - b of two running sums (64-bit integer subtraction: exact), for a partial sum of gates formed
// without the difference of two large floats (which a compiler may also regroup, docs/kda.md 2.2)
fn gateSumSub(a: GateSum, b: GateSum) -> GateSum {
  return GateSum(a.hi - b.hi - select(0i, 1i, a.lo < b.lo), a.lo - b.lo);
}

// A running sum as four f32s, each a 16-bit half of hi or lo (exact), for workgroup memory.
fn gateSumPack(a: GateSum) -> vec4f {
  let hi = bitcast<u32>(a.hi);
  return vec4f(f32(hi >> 16u), f32(hi & 0xffffu), f32(a.lo >> 16u), f32(a.lo & 0xffffu));
}

fn gateSumUnpack(v: vec4f) -> GateSum {
  let hi = (u32(v.x) << 16u) | u32(v.y);
  return GateSum(bitcast<i32>(hi), (u32(v.z) << 16u) | u32(v.w));
}
