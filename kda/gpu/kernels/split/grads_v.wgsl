// The split set's backward, the V side (docs/kda.md 2.3), one workgroup per (chunk, head):
//   chunkGradsV  the sums over V of stateScanBackward, chunkOutputBackward and newValuesBackward
//                (dKd, dQg, dW), dP, M and dv, into the gradient scratch gs and dv
// Register tiles are 4 x 8 (Tile8, common.wgsl); rows past cv are clamped for reads and never
// stored; each sum keeps one fixed order and terms outside a triangle are exact zeros of T or P.
// Its decays are the built-in exp (coarseDecay4, shared.wgsl), as in every gradient stage.

// ---- the V side ----

// chunkGradsV's workgroup memory (its own array: no other entry point names it), carved by pass.
// The left operands of its tiled products (a C x V operand, or T's rows in dV) are staged MM_SLICE
// contraction steps at a time in slots of MM_SLICE x 16 vec4s, one vec4 holding four rows at one
// step; the right operands (rows of up to 256 / 4 vec4s, see gvWidth) from vec4 GV_B. Stage A's
// first pass holds Vn, dO, dVn, V in slots 0..3 and dS' from GV_B, its second dO and dVn in slots
// 1 and 2 and S from GV_B; dV holds T in slot 0 and dVn from GV_B. 4 slots + 16 x 64 vec4s = 32 KB.
var<workgroup> gradsV: array<vec4f, GV_VEC4>;

const GV_SLOT: u32 = MM_SLICE * 16u;
// the staging loops give each invocation one entry of a left-operand slot
const_assert GV_SLOT == WG;
const GV_B: u32 = 4u * GV_SLOT;

// The vec4 of row quad q at step dd of left-operand slot `slot`. The quad is XORed with the step's
// low three bits: the invocations staging one quad at neighbouring steps would otherwise write
// vec4s 16 apart, all in one bank group; the products read one or two quads a step either way.
fn gvLeft(slot: u32, dd: u32, q: u32) -> u32 {
  return slot * GV_SLOT + dd * 16u + (q ^ (dd & 7u));
}

// vec4s per staged right-operand row for n vec4s of columns: the power of two >= n (and >= 2), so
// that a register tile's two halves (column quads jq and jq + width / 2) stay inside the row, and
// an invocation staging entries WG apart keeps its column quad from one to the next.
fn gvWidth(n: u32) -> u32 {
  return max(2u, 1u << (32u - countLeadingZeros(max(n, 1u) - 1u)));
}

// acc + steps d0..n of a staged slice: the left operand in `slot` at row quad rq, the right one
// from GV_B (rows width4 vec4s) at column quads jq and jq + width4 / 2. Neighbouring invocations
// take neighbouring jq, so the right operand's reads are conflict-free.
fn gvSlice(acc: Tile8, slot: u32, rq: u32, width4: u32, jq: u32, d0: u32, n: u32) -> Tile8 {
  var t0 = acc.t0;
  var t1 = acc.t1;
  let half = width4 / 2u;
  for (var dd = d0; dd < n; dd++) {
    let a = gradsV[gvLeft(slot, dd, rq)];
    let b = GV_B + dd * width4 + jq;
    t0 = tileFma(t0, a, gradsV[b]);
    t1 = tileFma(t1, a, gradsV[b + half]);
  }
  return Tile8(t0, t1);
}

// Two tiles at once over one staged slice: the left operands in slots sa and sb at row quad rq,
// one right operand from GV_B (as gvSlice), whose two vec4s a step are loaded once for both. Each
// tile sums in gvSlice's order, so the bits are gvSlice's.
struct Tile8Pair {
  a: Tile8,
  b: Tile8,
}

fn gvSlicePair(acc: Tile8Pair, sa: u32, sb: u32, rq: u32, width4: u32, jq: u32, n: u32) -> Tile8Pair {
  var a0 = acc.a.t0;
  var a1 = acc.a.t1;
  var b0 = acc.b.t0;
  var b1 = acc.b.t1;
  let half = width4 / 2u;
  for (var dd = 0u; dd < n; dd++) {
    let x = gradsV[gvLeft(sa, dd, rq)];
    let y = gradsV[gvLeft(sb, dd, rq)];
    let b = GV_B + dd * width4 + jq;
    let r0 = gradsV[b];
    let r1 = gradsV[b + half];
    a0 = tileFma(a0, x, r0);
    a1 = tileFma(a1, x, r1);
    b0 = tileFma(b0, y, r0);
    b1 = tileFma(b1, y, r1);
  }
  return Tile8Pair(Tile8(a0, a1), Tile8(b0, b1));
}

// acc + a staged slice's part of the C x C product A B^T of two left operands: rows 4 rq.. from
// slot a, the 8 columns 4 sq.. from slot b (B's rows)
fn gvSliceTri(acc: Tile8, a: u32, rq: u32, b: u32, sq: u32, n: u32) -> Tile8 {
  var t0 = acc.t0;
  var t1 = acc.t1;
  for (var dd = 0u; dd < n; dd++) {
    let x = gradsV[gvLeft(a, dd, rq)];
    t0 = tileFma(t0, x, gradsV[gvLeft(b, dd, sq)]);
    t1 = tileFma(t1, x, gradsV[gvLeft(b, dd, sq + 1u)]);
  }
  return Tile8(t0, t1);
}

// The 4 x 8 tiles that meet a C x C lower triangle (rows 4 rq.., columns 8 so..), row quads in
// order: row quads 2m and 2m + 1 reach column 8m + 7 and have m + 1 tiles each. lowerTiles(n)
// counts those of the first n row quads, lowerTile(t) is tile t as (rq, so).
fn lowerTiles(n: u32) -> u32 {
  let m = n / 2u;
  return m * (m + 1u) + (n % 2u) * (m + 1u);
}

fn lowerTile(t: u32) -> vec2u {
  var m = 0u;
  while ((m + 1u) * (m + 2u) <= t) {
    m++;
  }
  let o = t - m * (m + 1u);
  return vec2u(2u * m + o / (m + 1u), o % (m + 1u));
}

// dV's left operand: this invocation's vec4 of a slice of T's rows r0.. (GV_SLOT = WG, one each),
// row r0 + lid / 16 at columns 4 (lid % 16).. (T^T's four rows at that step); zero past cv
fn gvTriQuad(at: ChunkAt, r0: u32, lid: u32) -> vec4f {
  let cv = at.cv;
  let r = r0 + lid / 16u;
  let cols = 4u * (lid % 16u) + vec4u(0u, 1u, 2u, 3u);
  var t = vec4f(0.0);
  if (r < cv && cols.x < cv) {
    t = select(vec4f(0.0), tri4At4(at.tri + rT() + r * p.C, min(cols, vec4u(cv - 1u))), cols < vec4u(cv));
  }
  return t;
}

// The vec4 a left-operand slot holds for rows 4 q.. at column j of a chunk's C x V operands Vn,
// dO, dVn and V: zero past cv and past V (rows past cv load nothing; a partial quad is clamped).
fn gvRowsLive(j: u32, q: u32, cv: u32) -> bool {
  return j < p.V && 4u * q < cv;
}

fn gvRowsOk(q: u32, cv: u32) -> vec4<bool> {
  return 4u * q + vec4u(0u, 1u, 2u, 3u) < vec4u(cv);
}

// Column j of operand `slot` (0 Vn, 1 dO, 2 dVn, 3 V: the left-operand slot it goes to) for rows
// 4 q..: one function for the four, since WGSL takes no buffer argument (slot is a constant at
// every call)
fn gvColumn(slot: u32, at: ChunkAt, sBlock: u32, bBase: u32, j: u32, q: u32, cv: u32) -> vec4f {
  if (!gvRowsLive(j, q, cv)) {
    return vec4f(0.0);
  }
  let rows = rows4(4u * q, cv - 1u);
  var value: vec4f;
  switch slot {
    case 0u: {
      value = states4At4(sBlock + sVn() + j, rows * p.V);
    }
    case 1u: {
      value = doutAt4(j, vec4u(aDout()) + vrow4(at, rows) * p.V);
    }
    case 2u: {
      value = bw4At4(bBase + bDVn() + j, rows * p.V);
    }
    default: {
      value = vAt4(j, vec4u(aV()) + vrow4(at, rows) * p.V);
    }
  }
  return select(vec4f(0.0), value, gvRowsOk(q, cv));
}

// Entry e of a right-operand slice from column j0 of a [V, K] region, four channels a vec4 at GV_B
// + e (rows gvWidth(K / 4) vec4s wide): dS' (which 0, in the backward scratch) or S (which 1);
// zero past V and past the slice. Which 2 is dV's: rows j0.. of dVn (rows gvWidth(V / 4) vec4s
// wide), zero past cv and past the slice.
fn gvRightEntry(which: u32, at: ChunkAt, j0: u32, e: u32) -> vec4f {
  if (which == 2u) {
    let WV = gvWidth((p.V + 3u) / 4u);
    let r = j0 + (e >> countTrailingZeros(WV));
    if (e >= MM_SLICE * WV || r >= at.cv) {
      return vec4f(0.0);
    }
    return bw4Cols(at.bw + bDVn() + r * p.V, 4u * (e & (WV - 1u)));
  }
  let W4 = gvWidth((p.K + 3u) / 4u);
  let j = j0 + e / W4;
  if (e >= MM_SLICE * W4 || j >= p.V) {
    return vec4f(0.0);
  }
  let d = 4u * (e % W4);
  if (which == 0u) {
    return bw4K4(at.bw + bDS() + j * p.K, d);
  }
  return states4K4(at.states + sS() + j * p.K, d);
}

// An invocation's four entries of a right-operand slice (gvRightEntry's entries lid + k WG:
// MM_SLICE x 256 / 4 vec4s at most), loaded into registers a slice ahead
struct GvRight {
  r0: vec4f,
  r1: vec4f,
  r2: vec4f,
  r3: vec4f,
}

fn gvRightSlice(which: u32, at: ChunkAt, j0: u32, lid: u32) -> GvRight {
  return GvRight(
    gvRightEntry(which, at, j0, lid),
    gvRightEntry(which, at, j0, lid + WG),
    gvRightEntry(which, at, j0, lid + 2u * WG),
    gvRightEntry(which, at, j0, lid + 3u * WG),
  );
}

// Stores them at GV_B (those inside the slice, of rows width4 vec4s)
fn gvStageRight(lid: u32, right: GvRight, width4: u32) {
  let nb = MM_SLICE * width4;
  if (lid < nb) { gradsV[GV_B + lid] = right.r0; }
  if (lid + WG < nb) { gradsV[GV_B + lid + WG] = right.r1; }
  if (lid + 2u * WG < nb) { gradsV[GV_B + lid + 2u * WG] = right.r2; }
  if (lid + 3u * WG < nb) { gradsV[GV_B + lid + 3u * WG] = right.r3; }
}

@compute @workgroup_size(256)
fn chunkGradsV(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let pos = range.n0 + chunkIndex(wg);
  if (pos >= range.n1) {
    return;
  }
  let at = slicedChunkOf(pos, wg.z);
  let cv = at.cv;
  let sBase = at.states + sS();

  // Register tiles of 4 rows x 8 columns (two mat4x4f, see the shared WGSL) over slices staged in
  // gradsV; rows past cv are staged as zeros and never stored. At most two tiles are live at once
  // (the kernel's register count, and so its occupancy, is set by its busiest point). Each sum
  // keeps the reference's order; terms outside a triangle are exact zeros of T.
  let nRG = (cv + 3u) / 4u;
  let last = cv - 1u;
  let lanes = vec4u(0u, 1u, 2u, 3u);
  let KQ = (p.K + 3u) / 4u;
  let W4 = gvWidth(KQ);
  let kShift = countTrailingZeros(W4);
  let nD8 = W4 / 2u;
  // dP and M as the 4 x 8 tiles that meet their lower triangles: the first nPL invocations on dP,
  // the next nPL on M (2 nPL = 144 at C = 64)
  let nPL = lowerTiles(nRG);
  let pmMine = lid < 2u * nPL;
  let mTile = lid >= nPL;
  let pmAt = lowerTile(select(lid, lid - nPL, mTile) % max(nPL, 1u));
  // dgamma_C = rowsum(S (.) dS'), summed as S is staged: the invocation staging entries WG apart
  // keeps its channel quad (gvWidth), so it sums its rows of that quad; the row groups are summed
  // in order at the end
  var gam = vec4f(0.0);

  // Stage A, the sums over V of stateScanBackward, chunkOutputBackward, newValuesBackward and
  // wyBackward, in two passes over slices of the V columns: first dKd = Vn dS'^T with
  // dP = lower_incl(dO Vn^T) and M = lower_incl(dVn V^T) (Vn is both kd's left operand and dP's
  // right one), then dQg = scale dO S^T and dW = -dVn S^T, which share S^T. The staging loads
  // are coalesced: neighbouring invocations read neighbouring columns of the C x V operands
  // (16 to a row quad) and neighbouring vec4s of the rows of dS' and S.
  // ABLATE bA {
  let nV = (p.V + MM_SLICE - 1u) / MM_SLICE;
  // an invocation's entry of a left-operand slot: GV_SLOT = WG, one each
  let jjL = lid % MM_SLICE;
  let qL = lid / MM_SLICE;
  for (var turn = 0u; turn * WG < nRG * nD8; turn++) {
    let blk = lid + turn * WG;
    let mine = blk < nRG * nD8;
    let rq = blk / nD8;
    let cq = blk % nD8;
    var kd = Tile8(mat4x4f(), mat4x4f());
    var pm = Tile8(mat4x4f(), mat4x4f());
    // a slice is one vec4 of each left-operand slot it fills and up to four of the right operand
    // (MM_SLICE x 256 / 4) an invocation, loaded into registers a slice ahead
    var vn = gvColumn(0u, at, at.states, at.bw, jjL, qL, cv);
    var right = gvRightSlice(0u, at, 0u, lid);
    var o1 = vec4f(0.0);
    var o2 = vec4f(0.0);
    var o3 = vec4f(0.0);
    if (turn == 0u) {
      o1 = gvColumn(1u, at, at.states, at.bw, jjL, qL, cv);
      o2 = gvColumn(2u, at, at.states, at.bw, jjL, qL, cv);
      o3 = gvColumn(3u, at, at.states, at.bw, jjL, qL, cv);
    }
    for (var i = 0u; i < nV; i++) {
      let j0 = i * MM_SLICE;
      let n = min(MM_SLICE, p.V - j0);
      gradsV[gvLeft(0u, jjL, qL)] = vn;
      gvStageRight(lid, right, W4);
      if (turn == 0u) {
        gradsV[gvLeft(1u, jjL, qL)] = o1;
        gradsV[gvLeft(2u, jjL, qL)] = o2;
        gradsV[gvLeft(3u, jjL, qL)] = o3;
      }
      workgroupBarrier();
      if (i + 1u < nV) {
        let j1 = j0 + MM_SLICE;
        vn = gvColumn(0u, at, at.states, at.bw, j1 + jjL, qL, cv);
        right = gvRightSlice(0u, at, j1, lid);
        if (turn == 0u) {
          o1 = gvColumn(1u, at, at.states, at.bw, j1 + jjL, qL, cv);
          o2 = gvColumn(2u, at, at.states, at.bw, j1 + jjL, qL, cv);
          o3 = gvColumn(3u, at, at.states, at.bw, j1 + jjL, qL, cv);
        }
      }
      // dP and M, in the first turn
      // ABLATE bPM {
      if (turn == 0u && pmMine) {
        pm = gvSliceTri(pm, select(1u, 2u, mTile), pmAt.x, select(0u, 3u, mTile), 2u * pmAt.y, n);
      }
      // ABLATE bPM }
      if (mine) {
        kd = gvSlice(kd, 0u, rq, W4, cq, 0u, n);
      }
      workgroupBarrier();
    }
    let r = 4u * rq;
    let d0 = 4u * cq;
    let d1 = 4u * (cq + nD8);
    if (mine) {
      gsStoreRows(at.gs + gKd(), r, d0, kd.t0, cv, p.K);
      gsStoreRows(at.gs + gKd(), r, d1, kd.t1, cv, p.K);
    }
    if (turn == 0u && pmMine) {
      let region = select(at.gs + gP(), at.gs + gM(), mTile);
      let pr = 4u * pmAt.x;
      let ps = 8u * pmAt.y;
      gsStoreTri(region, pr, ps, pm.t0, cv, 0u);
      if (ps + 4u < cv) {
        gsStoreTri(region, pr, ps + 4u, pm.t1, cv, 0u);
      }
    }
    // dQg's tile and dW's, which share S^T
    var qw = Tile8Pair(Tile8(mat4x4f(), mat4x4f()), Tile8(mat4x4f(), mat4x4f()));
    o1 = gvColumn(1u, at, at.states, at.bw, jjL, qL, cv);
    o2 = gvColumn(2u, at, at.states, at.bw, jjL, qL, cv);
    right = gvRightSlice(1u, at, 0u, lid);
    // in the first turn, dS' at the entries of S this invocation stages (for dgamma_C), loaded a
    // slice ahead with them
    var ds: GvRight;
    if (turn == 0u) {
      ds = gvRightSlice(0u, at, 0u, lid);
    }
    for (var i = 0u; i < nV; i++) {
      let j0 = i * MM_SLICE;
      gradsV[gvLeft(1u, jjL, qL)] = o1;
      gradsV[gvLeft(2u, jjL, qL)] = o2;
      gvStageRight(lid, right, W4);
      if (turn == 0u) {
        // dgamma_C's terms S (.) dS' of the entries this invocation stages (zeros past V and the
        // slice: gvRightEntry gives zeros there)
        gam += right.r0 * ds.r0;
        gam += right.r1 * ds.r1;
        gam += right.r2 * ds.r2;
        gam += right.r3 * ds.r3;
      }
      workgroupBarrier();
      if (i + 1u < nV) {
        let j1 = j0 + MM_SLICE;
        o1 = gvColumn(1u, at, at.states, at.bw, j1 + jjL, qL, cv);
        o2 = gvColumn(2u, at, at.states, at.bw, j1 + jjL, qL, cv);
        right = gvRightSlice(1u, at, j1, lid);
        if (turn == 0u) {
          ds = gvRightSlice(0u, at, j1, lid);
        }
      }
      if (mine) {
        let n = min(MM_SLICE, p.V - j0);
        qw = gvSlicePair(qw, 1u, 2u, rq, W4, cq, n);
      }
      workgroupBarrier();
    }
    if (mine) {
      gsStoreRows(at.gs + gQg(), r, d0, p.scale * qw.a.t0, cv, p.K);
      gsStoreRows(at.gs + gQg(), r, d1, p.scale * qw.a.t1, cv, p.K);
      gsStoreRows(at.gs + gW(), r, d0, qw.b.t0 * -1.0, cv, p.K);
      gsStoreRows(at.gs + gW(), r, d1, qw.b.t1 * -1.0, cv, p.K);
    }
  }
  // ABLATE bA }
  // dP and M above their tiles: zeros (the regions keep their whole C x C meaning)
  for (var e = lid; e < nRG * nRG; e += WG) {
    let rb = e / nRG;
    let cb = e % nRG;
    if (cb >= 2u * (rb / 2u) + 2u) {
      gsStoreTri(at.gs + gP(), 4u * rb, 4u * cb, mat4x4f(), cv, 0u);
      gsStoreTri(at.gs + gM(), 4u * rb, 4u * cb, mat4x4f(), cv, 0u);
    }
  }
  // dgamma_C: the row groups' sums of each channel quad, in order (a group is the lid / W4 of the
  // invocations that staged it; only the first MM_SLICE groups stage anything)
  gradsV[lid] = gam;
  workgroupBarrier();
  if (lid < KQ) {
    var acc = vec4f(0.0);
    for (var gi = 0u; gi < min(WG / W4, MM_SLICE); gi++) {
      acc += gradsV[gi * W4 + lid];
    }
    gsStoreRow(at.gs + gGam(), 0u, 4u * lid, acc, 1u, p.K);
  }
  workgroupBarrier();
  // dV = beta (.) T^T dVn as a tiled product over slices of MM_SLICE rows r: T's rows in slot 0
  // (four columns s of a row of T are T^T's four rows at step r), dVn's rows from GV_B, both
  // loaded row by row (coalesced); tiles of 4 rows s x 8 columns j, each summing r from its first
  // row s on (T_rs = 0 for r < s), in order
  // ABLATE bdV {
  let VQ = (p.V + 3u) / 4u;
  let WV = gvWidth(VQ);
  let nJ8 = WV / 2u;
  for (var turn = 0u; turn * WG < nRG * nJ8; turn++) {
    let blk = lid + turn * WG;
    let mine = blk < nRG * nJ8;
    let sq = blk / nJ8;
    let jq = blk % nJ8;
    let s = 4u * sq;
    var dv = Tile8(mat4x4f(), mat4x4f());
    // a slice is one vec4 of T and up to four of dVn (MM_SLICE x 256 / 4) an invocation, loaded
    // into registers a slice ahead
    var tq = gvTriQuad(at, 0u, lid);
    var right = gvRightSlice(2u, at, 0u, lid);
    for (var r0 = 0u; r0 < cv; r0 += MM_SLICE) {
      gradsV[gvLeft(0u, lid / 16u, lid % 16u)] = tq;
      gvStageRight(lid, right, WV);
      workgroupBarrier();
      if (r0 + MM_SLICE < cv) {
        tq = gvTriQuad(at, r0 + MM_SLICE, lid);
        right = gvRightSlice(2u, at, r0 + MM_SLICE, lid);
      }
      let n = min(MM_SLICE, cv - r0);
      if (mine && s < r0 + n) {
        dv = gvSlice(dv, 0u, sq, WV, jq, max(r0, s) - r0, n);
      }
      workgroupBarrier();
    }
    if (mine && s < cv) {
      let rows = vrow4(at, min(s + lanes, vec4u(last)));
      let b = betaAt4(aBeta(), rows);
      let t0 = tileScaleRows(dv.t0, b);
      let t1 = tileScaleRows(dv.t1, b);
      let j0 = 4u * jq;
      let j1 = 4u * (jq + nJ8);
      dvStoreCols(aDv() + rows.x * p.V, j0, t0[0]);
      dvStoreCols(aDv() + rows.x * p.V, j1, t1[0]);
      if (s + 1u < cv) {
        dvStoreCols(aDv() + rows.y * p.V, j0, t0[1]);
        dvStoreCols(aDv() + rows.y * p.V, j1, t1[1]);
      }
      if (s + 2u < cv) {
        dvStoreCols(aDv() + rows.z * p.V, j0, t0[2]);
        dvStoreCols(aDv() + rows.z * p.V, j1, t1[2]);
      }
      if (s + 3u < cv) {
        dvStoreCols(aDv() + rows.w * p.V, j0, t0[3]);
        dvStoreCols(aDv() + rows.w * p.V, j1, t1[3]);
      }
    }
  }
  // ABLATE bdV }
}
