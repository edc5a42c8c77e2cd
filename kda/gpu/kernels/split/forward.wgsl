// The split set's forward scan and output (docs/kda.md 2.2), stages named as in kda/chunk.ts (the
// chunk-parallel preparation before them, chunkPrep, is prep.wgsl's):
//   stateScan    newValues and stateScan, sequential over each sequence's chunks, one workgroup
//                per (V tile, head, sequence); it saves each chunk-start state S and Vn
//   chunkOutput  chunkOutput, O = Qg S + P Vn, one workgroup per (chunk, head)
// Every sum runs in one fixed order, nothing uses atomics. Lines "// ABLATE name {" / "}" mark
// sections bench/ablate.ts can remove.

// ---- stateScan: sequential over a sequence's chunks, one workgroup per (V tile, head, sequence) ----
//
// The VT columns of a tile form ng = VT / 4 vec4 column groups. Invocation lid owns column group
// cg = lid % ng and the four consecutive state rows 4 dq.. (dq = lid / ng): one 4 x 4 block of the
// K x VT state, held in registers across the whole scan, and two rows ra, rb of the C x VT row tile
// (Vn). The dispatches of one scan cover chunk ranges [n0, n1) of every sequence (llvmpipe's loop
// budget), the state carried between them in ht, which the last one leaves final.
//
// A chunk's operands (rows of W, Kd, ...) reach the products through workgroup memory in slabs of
// SCAN_SLAB_VEC4 vec4s, one vec4 per invocation, loaded as neighbouring 16-byte words. The slabs of
// all chunks form one stream, double-buffered: while the workgroup computes on slab g, each
// invocation's loads of slabs g + 1 and g + 2 are in flight in registers, so the memory latency is
// paid under the arithmetic and not once per loop iteration, and one barrier a slab both publishes
// a slab and frees the buffer of the one before.
//
// scanMem: [0, SCAN_STATE_VEC4) the state tile (K x ng, row d at d ng), then the two slab buffers.
// The row tiles (C x ng, at most SCAN_ROWS_VEC4) live in the state tile's region while the state
// tile is not read: the forward's Vn once the W slabs are done, the backward's dO and dVn once the
// Kd slabs are. That keeps a scan workgroup at 24 KB, two an SM on the H200 (mod.ts), at the price
// of two barriers a chunk besides the slabs' own: one before each rewrite of the region, so that
// every read of what it held before is done.

var<workgroup> scanMem: array<vec4f, SCAN_VEC4>;

const SCAN_SLAB_AT: u32 = SCAN_STATE_VEC4;

// Where a scan invocation works: its (sequence, head) pair, the tile's first column and its own,
// its column group of ng, its state rows 4 dq.. (and dq clamped to the last vec4 of K for reads),
// its two row-tile rows, and its sequence.
struct ScanAt {
  bh: u32,
  h: u32,
  j0: u32,
  j: u32,
  cg: u32,
  ng: u32,
  dq: u32,
  dqC: u32,
  d: vec4u,
  ra: u32,
  rb: u32,
  seq: SeqAt,
}

fn scanAt(wg: vec3u, lid: u32) -> ScanAt {
  let ng = p.VT / 4u;
  let cg = lid % ng;
  let r0 = lid / ng;
  let h = wg.y;
  let s = wg.z;
  let j0 = wg.x * p.VT;
  let k4 = (p.K + 3u) / 4u;
  return ScanAt(
    s * p.H + h,
    h,
    j0,
    j0 + 4u * cg,
    cg,
    ng,
    r0,
    min(r0, k4 - 1u),
    vec4u(4u * r0) + vec4u(0u, 1u, 2u, 3u),
    r0,
    r0 + WG / ng,
    seqOf(s),
  );
}

// Chunk n of the scan's sequence: its work and states blocks, its valid rows, and the invocation's
// two row-tile rows clamped to the last valid row for reads.
struct ScanChunk {
  wid: u32,
  t0: u32,
  cv: u32,
  raC: u32,
  rbC: u32,
}

fn scanChunk(at: ScanAt, n: u32) -> ScanChunk {
  let ch = chunkOf(at.seq.first + n, at.h);
  return ScanChunk(ch.wid, ch.t0, ch.cv, min(at.ra, ch.cv - 1u), min(at.rb, ch.cv - 1u));
}

// The slabs of a chunk. A d-slab holds channels 4 q0.. (dw4 vec4s) of all C rows of a C x K
// operand, row r at r dw4; an r-slab holds rk whole rows (k4 vec4s each) from row i rk; a P slab
// (backward) holds qp groups of four rows of P transposed: group q, column r at (q - q0) C + r is
// P[4q.., r].
struct ScanSlabs {
  k4: u32,
  dw4: u32,
  nD: u32,
  rk: u32,
  nR: u32,
  qp: u32,
  nP: u32,
}

fn scanSlabs() -> ScanSlabs {
  let k4 = (p.K + 3u) / 4u;
  let dw4 = SCAN_SLAB_VEC4 / p.C;
  let rk = max(1u, min(SCAN_SLAB_VEC4 / k4, p.C));
  let qp = SCAN_SLAB_VEC4 / p.C;
  let c4 = p.C / 4u;
  return ScanSlabs(k4, dw4, (k4 + dw4 - 1u) / dw4, rk, (p.C + rk - 1u) / rk, qp, (c4 + qp - 1u) / qp);
}

// Where this invocation's vec4 of a slab lies in its C x K operand: the row's offset and the
// channel, and whether it is read at all (the slab holds zeros past cv and past K: the K4If
// accessors load nothing there).
struct SlabAt {
  row: u32,
  d: u32,
  live: bool,
}

// This invocation's vec4 of d-slab i of the C x K operand whose row 0 is at `rows`.
fn dSlabAt(sl: ScanSlabs, rows: u32, cv: u32, i: u32, lid: u32) -> SlabAt {
  let r = lid / sl.dw4;
  return SlabAt(rows + r * p.K, 4u * (i * sl.dw4 + lid % sl.dw4), r < cv);
}

// This invocation's vec4 of r-slab i.
fn rSlabAt(sl: ScanSlabs, rows: u32, cv: u32, i: u32, lid: u32) -> SlabAt {
  let r = i * sl.rk + lid / sl.k4;
  return SlabAt(rows + r * p.K, 4u * (lid % sl.k4), lid < sl.rk * sl.k4 && r < cv);
}

// Rows ra and rb of a row tile: two vec4s.
struct ScanRows {
  a: vec4f,
  b: vec4f,
}

// acc + the d-slab's part of (operand x state tile) for rows ra and rb: each row sums its channels
// in ascending order across the slabs.
fn dSlabProduct(at: ScanAt, sl: ScanSlabs, slab: u32, i: u32, ch: ScanChunk, acc: ScanRows) -> ScanRows {
  let q0 = i * sl.dw4;
  let n = min(sl.dw4, sl.k4 - q0);
  let rowA = slab + ch.raC * sl.dw4;
  let rowB = slab + ch.rbC * sl.dw4;
  var rows = acc;
  for (var q = 0u; q < n; q++) {
    rows = rowsFma(rows, scanMem[rowA + q], scanMem[rowB + q], 4u * (q0 + q) * at.ng + at.cg, at.ng);
  }
  return rows;
}

// acc + the two rows' four entries wa, wb times the four vec4 rows of scanMem at z, z + ng, z + 2 ng
// and z + 3 ng, in that order (the one step of the scans' products over d or over the rows)
fn rowsFma(acc: ScanRows, wa: vec4f, wb: vec4f, z: u32, ng: u32) -> ScanRows {
  let s0 = scanMem[z];
  let s1 = scanMem[z + ng];
  let s2 = scanMem[z + 2u * ng];
  let s3 = scanMem[z + 3u * ng];
  var a = fma(vec4f(wa.x), s0, acc.a);
  var b = fma(vec4f(wb.x), s0, acc.b);
  a = fma(vec4f(wa.y), s1, a);
  b = fma(vec4f(wb.y), s1, b);
  a = fma(vec4f(wa.z), s2, a);
  b = fma(vec4f(wb.z), s2, b);
  a = fma(vec4f(wa.w), s3, a);
  b = fma(vec4f(wb.w), s3, b);
  return ScanRows(a, b);
}

// st + the r-slab's part of (operand^T x the row tile at `tile`): each state entry sums the rows in
// ascending order across the slabs; rows past cv are not read.
fn rSlabProduct(at: ScanAt, sl: ScanSlabs, slab: u32, tile: u32, i: u32, cv: u32, st: mat4x4f) -> mat4x4f {
  let r0 = i * sl.rk;
  var n = 0u;
  if (r0 < cv) {
    n = min(sl.rk, cv - r0);
  }
  var s = st;
  for (var r = 0u; r < n; r++) {
    s = tileFma(s, scanMem[slab + r * sl.k4 + at.dqC], scanMem[tile + (r0 + r) * at.ng + at.cg]);
  }
  return s;
}

// Publishes the state block to the state tile (rows past K as zeros).
fn publishState(at: ScanAt, sl: ScanSlabs, s: mat4x4f) {
  if (at.dq < sl.k4) {
    let z = at.d.x * at.ng + at.cg;
    let keep = at.d < vec4u(p.K);
    scanMem[z] = select(vec4f(0.0), s[0], keep.x);
    scanMem[z + at.ng] = select(vec4f(0.0), s[1], keep.y);
    scanMem[z + 2u * at.ng] = select(vec4f(0.0), s[2], keep.z);
    scanMem[z + 3u * at.ng] = select(vec4f(0.0), s[3], keep.w);
  }
}

// One state row at the start of a forward scan dispatch: the carry in ht, else h0 or zero.
fn forwardStartRow(at: ScanAt, d: u32, fromFirst: bool, hasH0: bool) -> vec4f {
  if (d >= p.K) {
    return vec4f(0.0);
  }
  let row = (at.bh * p.K + d) * p.V;
  if (!fromFirst) {
    return htCols(aHt() + row, at.j);
  }
  if (!hasH0) {
    return vec4f(0.0);
  }
  return h0Cols(aH0() + row, at.j);
}

// Slab i of a forward chunk: the d-slabs of W, then the r-slabs of Kd.
fn forwardSlabLoad(sl: ScanSlabs, ch: ScanChunk, i: u32, lid: u32) -> vec4f {
  if (i < sl.nD) {
    let a = dSlabAt(sl, ch.wid * workSize() + wW(), ch.cv, i, lid);
    return work4K4If(a.row, a.d, a.live);
  }
  let a = rSlabAt(sl, ch.wid * kdSize() + dKd(), ch.cv, i - sl.nD, lid);
  return kd4K4If(a.row, a.d, a.live);
}

// newValues and stateScan per chunk: Vn = U - W S over the W slabs (S in the state tile), then
// S' = diag(gamma_C) S + Kd^T Vn over the Kd slabs (Vn in the row tile, in the state tile's
// region). The chunk-start state is published with the first W slab, behind a barrier after the
// previous chunk's last Kd slab (which read Vn there), and Vn with the first Kd slab, behind one
// after this chunk's last W slab (which read the state).
@compute @workgroup_size(256)
fn stateScan(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let at = scanAt(wg, lid);
  let sl = scanSlabs();
  let hasH0 = (p.flags & HAS_H0) != 0u;
  let first = range.n0 == 0u;
  var st = mat4x4f(
    forwardStartRow(at, at.d.x, first, hasH0),
    forwardStartRow(at, at.d.y, first, hasH0),
    forwardStartRow(at, at.d.z, first, hasH0),
    forwardStartRow(at, at.d.w, first, hasH0),
  );
  let n0 = range.n0;
  let n1 = min(range.n1, at.seq.count);
  var steps = 0u;
  if (n1 > n0) {
    steps = n1 - n0;
  }
  // m >= 2 slabs a chunk (one of W and one of Kd at least)
  let m = sl.nD + sl.nR;
  var next = vec4f(0.0);
  var after = vec4f(0.0);
  if (steps > 0u) {
    let ch = scanChunk(at, n0);
    next = forwardSlabLoad(sl, ch, 0u, lid);
    after = forwardSlabLoad(sl, ch, 1u, lid);
  }
  var g = 0u;
  for (var t = 0u; t < steps; t++) {
    let ch = scanChunk(at, n0 + t);
    var later = ch;
    if (t + 1u < steps) {
      later = scanChunk(at, n0 + t + 1u);
    }
    let base = ch.wid * workSize();
    let sBlock = ch.wid * stateSize();
    let gam = work4K4(base + wGam(), at.d.x);
    let uBase = ch.wid * uSize() + uU();
    let ua = u4Cols(uBase + ch.raC * p.V, at.j);
    let ub = u4Cols(uBase + ch.rbC * p.V, at.j);
    var w = ScanRows(vec4f(0.0), vec4f(0.0));
    for (var i = 0u; i < m; i++) {
      let slab = SCAN_SLAB_AT + (g % 2u) * SCAN_SLAB_VEC4;
      scanMem[slab + lid] = next;
      // the region's last reads (the previous chunk's Vn, this chunk's state) are done
      if ((i == 0u && t > 0u) || i == sl.nD) {
        workgroupBarrier();
      }
      if (i == 0u) {
        // the chunk-start state, also saved transposed ([V, K]: the output and the backward read
        // it with lanes along K), four channels a store
        publishState(at, sl, st);
        // ABLATE sstore {
        statesStoreTileT(sBlock + sS(), at.d.x, at.j, st);
        // ABLATE sstore }
      }
      if (i == sl.nD) {
        let va = ua - w.a;
        let vb = ub - w.b;
        if (at.ra < ch.cv) {
          scanMem[at.ra * at.ng + at.cg] = va;
          // ABLATE sstore {
          statesStoreCols(sBlock + sVn() + at.ra * p.V, at.j, va);
          // ABLATE sstore }
        }
        if (at.rb < ch.cv) {
          scanMem[at.rb * at.ng + at.cg] = vb;
          // ABLATE sstore {
          statesStoreCols(sBlock + sVn() + at.rb * p.V, at.j, vb);
          // ABLATE sstore }
        }
      }
      // the slab two ahead in the stream, in flight through two barriers and slabs' products
      next = after;
      // ABLATE sload {
      if (i + 2u < m) {
        after = forwardSlabLoad(sl, ch, i + 2u, lid);
      } else if (t + 1u < steps) {
        after = forwardSlabLoad(sl, later, i + 2u - m, lid);
      }
      // ABLATE sload }
      workgroupBarrier();
      // ABLATE sprod {
      if (i < sl.nD) {
        w = dSlabProduct(at, sl, slab, i, ch, w);
      } else {
        if (i == sl.nD) {
          st = tileScaleRows(st, gam);
        }
        st = rSlabProduct(at, sl, slab, 0u, i - sl.nD, ch.cv, st);
      }
      // ABLATE sprod }
      g++;
    }
  }
  let rows = (vec4u(at.bh * p.K) + at.d) * p.V + vec4u(aHt());
  if (at.d.x < p.K) { htStoreCols(rows.x, at.j, st[0]); }
  if (at.d.y < p.K) { htStoreCols(rows.y, at.j, st[1]); }
  if (at.d.z < p.K) { htStoreCols(rows.z, at.j, st[2]); }
  if (at.d.w < p.K) { htStoreCols(rows.w, at.j, st[3]); }
}

// ---- chunkOutput: O = Qg S + P Vn, one workgroup per (chunk, head) ----
//
// Tiled products, 4 x 4 register tiles, one a (row quad, column quad) on OUT_WG = 512 invocations
// (mod.ts): at C = 64 and V = 128 all 512 tiles of a chunk in one turn. 4 x 8 tiles on 256
// invocations took more registers, which held the stage to two workgroups of 256 an SM at 12 KB
// (bench/stage_occupancy.ts); these run 10 % faster on an H100 (bench/results/ANALYSIS.md,
// twentieth pass). Each output sums the channels in ascending order, then the rows. The
// contraction runs in slices of sd steps (MM_SLICE up to V = 128, half that past it) staged in
// arrays of the stage's own, 12 KB, which leave more of an SM's workgroup memory to others than the
// shared tiles' 24 KB did (the two measured the same on an H200: bench/results/ANALYSIS.md,
// sixteenth pass). The staging loops give neighbouring invocations neighbouring contraction steps
// (so that their loads from memory are coalesced), whose vec4s lie a row of the staged slice
// apart: their stores would fall in one bank group. So a step's vec4 of column quad q (of the left
// operand's 16 row quads, and of S^T's VQ column quads where VQ is a multiple of 8) lies at
// q ^ (step & 7): a permutation of each aligned run of eight.

// [sd][16] row quads of the left operand (Qg, then P); [sd][VQ] column quads of the right (S^T,
// then Vn), VQ <= 32 at sd = MM_SLICE and <= 64 at half that (V <= 256)
var<workgroup> outA: array<vec4f, OUT_A_VEC4>;
var<workgroup> outB: array<vec4f, OUT_B_VEC4>;
const_assert MM_SLICE * 16u <= OUT_A_VEC4 && MM_SLICE * 32u <= OUT_B_VEC4;

// acc + the staged slice's product for rows 4 rq.. (n contraction steps, the right operand's
// rows width4 vec4s wide, swizzled by bMask) at vec4 column jq: neighbouring invocations take
// neighbouring jq, so that their reads of outB fall on different banks
fn outSlice(acc: mat4x4f, rq: u32, jq: u32, width4: u32, n: u32, bMask: u32) -> mat4x4f {
  var t = acc;
  for (var dd = 0u; dd < n; dd++) {
    let a = outA[dd * 16u + (rq ^ (dd & 7u))];
    t = tileFma(t, a, outB[dd * width4 + (jq ^ (dd & bMask))]);
  }
  return t;
}

@compute @workgroup_size(OUT_WG)
fn chunkOutput(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let c = chunkIndex(wg);
  if (c >= p.NCT) {
    return;
  }
  let at = chunkOf(c, wg.z);
  let cv = at.cv;
  let nRQ = (cv + 3u) / 4u;
  let VQ = (p.V + 3u) / 4u;
  let sd = select(MM_SLICE, MM_SLICE / 2u, VQ > 32u);
  let bMask = select(0u, 7u, VQ % 8u == 0u);
  let lanes = vec4u(0u, 1u, 2u, 3u);
  // tiles of 4 rows x 4 columns, one per invocation a turn (one turn up to V = 128 at C = 64)
  for (var turn = 0u; turn * OUT_WG < nRQ * VQ; turn++) {
    let blk = lid + turn * OUT_WG;
    let mine = blk < nRQ * VQ;
    let rq = blk / VQ;
    let jq = blk % VQ;
    var acc = mat4x4f();
    for (var s0 = 0u; s0 < p.K; s0 += sd) {
      // Qg slice, four rows a vec4; S^T slice (S is [V, K] in memory), four columns a vec4
      // neighbouring invocations read neighbouring channels (coalesced), and store transposed
      for (var e = lid; e < sd * 16u; e += OUT_WG) {
        let dd = e % sd;
        let d = s0 + dd;
        let rows = 4u * (e / sd) + lanes;
        var value = vec4f(0.0);
        if (d < p.K) {
          value = select(vec4f(0.0), qg4At4(at.qg + qQg() + d, min(rows, vec4u(cv - 1u)) * p.K), rows < vec4u(cv));
        }
        outA[dd * 16u + ((e / sd) ^ (dd & 7u))] = value;
      }
      for (var e = lid; e < sd * VQ; e += OUT_WG) {
        let dd = e % sd;
        let d = s0 + dd;
        let cols = 4u * (e / sd) + lanes;
        var value = vec4f(0.0);
        if (d < p.K) {
          value = select(vec4f(0.0), states4At4(at.states + sS() + d, min(cols, vec4u(p.V - 1u)) * p.K), cols < vec4u(p.V));
        }
        outB[dd * VQ + ((e / sd) ^ (dd & bMask))] = value;
      }
      workgroupBarrier();
      if (mine) {
        acc = outSlice(acc, rq, jq, VQ, min(sd, p.K - s0), bMask);
      }
      workgroupBarrier();
    }
    for (var s0 = 0u; s0 < cv; s0 += sd) {
      // P slice (zero above the diagonal), four rows a vec4; Vn slice, four columns a vec4 (rows
      // of Vn are contiguous: not swizzled)
      for (var e = lid; e < sd * 16u; e += OUT_WG) {
        let ss = e % sd;
        let s = s0 + ss;
        let rows = 4u * (e / sd) + lanes;
        var value = vec4f(0.0);
        if (s < cv) {
          value = select(vec4f(0.0), tri4At4(at.tri + rP() + s, min(rows, vec4u(cv - 1u)) * p.C), rows < vec4u(cv));
        }
        outA[ss * 16u + ((e / sd) ^ (ss & 7u))] = value;
      }
      for (var e = lid; e < sd * VQ; e += OUT_WG) {
        let s = s0 + e / VQ;
        var value = vec4f(0.0);
        if (s < cv) {
          value = states4Cols(at.states + sVn() + s * p.V, 4u * (e % VQ));
        }
        outB[e] = value;
      }
      workgroupBarrier();
      // P is lower triangular: a tile's sum stops at its last row (the terms past it are exact
      // zeros)
      if (mine && 4u * rq + 4u > s0) {
        acc = outSlice(acc, rq, jq, VQ, min(min(sd, cv - s0), 4u * rq + 4u - s0), 0u);
      }
      workgroupBarrier();
    }
    if (mine) {
      let r = 4u * rq;
      let j0 = 4u * jq;
      for (var i = 0u; i < 4u; i++) {
        if (r + i < cv) {
          oStoreCols(aO() + vrow(at, r + i) * p.V, j0, acc[i]);
        }
      }
    }
  }
}
