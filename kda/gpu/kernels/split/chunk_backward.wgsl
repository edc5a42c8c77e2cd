// The split set's chunk-parallel backward (docs/kda.md 2.3), in stages named after the stages of
// kda/chunk.ts they run, and the group sums, each one workgroup per (chunk, head) but groupSums:
//   chunkGradsV         the sums over V of stateScanBackward, chunkOutputBackward and
//                       newValuesBackward (dKd, dQg, dW), dP, M and dv
//   chunkGradsK         wyBackward and inverseBackward (dT, dKb, X, dL), and Stage E's factors
//   pairwiseGrads       pairwiseGrads and elementwiseGrads (Stage E): dq, dk and the dG pieces
//   gateCumsumBackward  Stage F: dbeta and the reverse cumsum to dg
//   groupSums           dq and dk of each query/key head, the sum over its group of value heads
// The chunk stages meet in the gradient scratch gs; Stages E and F are dispatches of their own so
// that their registers do not set the residency of the others (docs/kda.md 3.2). Register tiles
// are 4 x 4 blocks (mat4x4f, see the shared WGSL); rows past cv are clamped for reads and never
// stored; each sum keeps one fixed order and terms outside a triangle are exact zeros of T or P.

// ---- the V side ----

// chunkGradsV's workgroup memory (its own array: no other entry point names it), carved by pass.
// The left operands of its tiled products (a C x V operand, or T's rows in dV) are staged MM_SLICE
// contraction steps at a time in slots of MM_SLICE x 16 vec4s, one vec4 holding four rows at one
// step; the right operands (rows of up to 256 / 4 vec4s, see gvWidth) from vec4 GV_B. Stage A's
// first pass holds Vn, dO, dVn, V in slots 0..3 and dS' from GV_B, its second dO and dVn in slots
// 1 and 2 and S from GV_B; dV holds T in slot 0 and dVn from GV_B. 4 slots + 16 x 64 vec4s = 32 KB.
var<workgroup> gradsV: array<vec4f, GV_VEC4>;

const GV_SLOT: u32 = MM_SLICE * 16u;
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

// The vec4 a left-operand slot holds for rows 4 q.. at column j of a chunk's C x V operands Vn,
// dO, dVn and V: zero past cv and past V (rows past cv load nothing; a partial quad is clamped).
fn gvRowsLive(j: u32, q: u32, cv: u32) -> bool {
  return j < p.V && 4u * q < cv;
}

fn gvRows(q: u32, cv: u32) -> vec4u {
  return min(4u * q + vec4u(0u, 1u, 2u, 3u), vec4u(cv - 1u));
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
  let rows = gvRows(q, cv);
  var value: vec4f;
  switch slot {
    case 0u: {
      value = statesAt4(sBlock + sVn() + j, rows * p.V);
    }
    case 1u: {
      value = doutAt4(j, vec4u(aDout()) + vrow4(at, rows) * p.V);
    }
    case 2u: {
      value = bwAt4(bBase + bDVn() + j, rows * p.V);
    }
    default: {
      value = vAt4(j, vec4u(aV()) + vrow4(at, rows) * p.V);
    }
  }
  return select(vec4f(0.0), value, gvRowsOk(q, cv));
}

@compute @workgroup_size(256)
fn chunkGradsV(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let c = chunkIndex(wg);
  if (c >= p.NCT) {
    return;
  }
  let at = chunkOf(c, wg.z);
  let cv = at.cv;
  let base = at.wid * workSize();
  let tbase = at.wid * triSize();
  let sBlock = at.wid * stateSize();
  let sBase = sBlock + sS();
  let bBase = at.wid * bwSize();
  let gBase = at.wid * gsSize();

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
  for (var turn = 0u; turn * WG < nRG * nD8; turn++) {
    let blk = lid + turn * WG;
    let mine = blk < nRG * nD8;
    let rq = blk / nD8;
    let cq = blk % nD8;
    var kd = Tile8(mat4x4f(), mat4x4f());
    var pm = Tile8(mat4x4f(), mat4x4f());
    for (var j0 = 0u; j0 < p.V; j0 += MM_SLICE) {
      let n = min(MM_SLICE, p.V - j0);
      for (var e = lid; e < GV_SLOT; e += WG) {
        let jj = e % MM_SLICE;
        let q = e / MM_SLICE;
        gradsV[gvLeft(0u, jj, q)] = gvColumn(0u, at, sBlock, bBase, j0 + jj, q, cv);
      }
      for (var e = lid; e < MM_SLICE * W4; e += WG) {
        let j = j0 + (e >> kShift);
        var value = vec4f(0.0);
        if (j < p.V) {
          value = bwK4(bBase + bDS() + j * p.K, 4u * (e & (W4 - 1u)));
        }
        gradsV[GV_B + e] = value;
      }
      // dP and M, in the first turn (their own barrier: the tiles' operands are staged here, so
      // that the section comes off whole)
      // ABLATE bPM {
      if (turn == 0u) {
        for (var e = lid; e < GV_SLOT; e += WG) {
          let jj = e % MM_SLICE;
          let q = e / MM_SLICE;
          gradsV[gvLeft(1u, jj, q)] = gvColumn(1u, at, sBlock, bBase, j0 + jj, q, cv);
          gradsV[gvLeft(2u, jj, q)] = gvColumn(2u, at, sBlock, bBase, j0 + jj, q, cv);
          gradsV[gvLeft(3u, jj, q)] = gvColumn(3u, at, sBlock, bBase, j0 + jj, q, cv);
        }
        workgroupBarrier();
        if (pmMine) {
          pm = gvSliceTri(pm, select(1u, 2u, mTile), pmAt.x, select(0u, 3u, mTile), 2u * pmAt.y, n);
        }
      }
      // ABLATE bPM }
      workgroupBarrier();
      if (mine) {
        kd = gvSlice(kd, 0u, rq, W4, cq, 0u, n);
      }
      workgroupBarrier();
    }
    let r = 4u * rq;
    let d0 = 4u * cq;
    let d1 = 4u * (cq + nD8);
    if (mine) {
      gsStoreRows(gBase + gKd(), r, d0, kd.t0, cv, p.K);
      gsStoreRows(gBase + gKd(), r, d1, kd.t1, cv, p.K);
    }
    if (turn == 0u && pmMine) {
      let region = select(gBase + gP(), gBase + gMX(), mTile);
      let pr = 4u * pmAt.x;
      let ps = 8u * pmAt.y;
      gsStoreTri(region, pr, ps, pm.t0, cv, 0u);
      if (ps + 4u < cv) {
        gsStoreTri(region, pr, ps + 4u, pm.t1, cv, 0u);
      }
    }
    var qg = Tile8(mat4x4f(), mat4x4f());
    var dw = Tile8(mat4x4f(), mat4x4f());
    for (var j0 = 0u; j0 < p.V; j0 += MM_SLICE) {
      for (var e = lid; e < GV_SLOT; e += WG) {
        let jj = e % MM_SLICE;
        let q = e / MM_SLICE;
        gradsV[gvLeft(1u, jj, q)] = gvColumn(1u, at, sBlock, bBase, j0 + jj, q, cv);
        gradsV[gvLeft(2u, jj, q)] = gvColumn(2u, at, sBlock, bBase, j0 + jj, q, cv);
      }
      for (var e = lid; e < MM_SLICE * W4; e += WG) {
        let j = j0 + (e >> kShift);
        let d = 4u * (e & (W4 - 1u));
        var s = vec4f(0.0);
        if (j < p.V) {
          s = statesK4(sBase + j * p.K, d);
          if (turn == 0u) {
            gam += s * bwK4(bBase + bDS() + j * p.K, d);
          }
        }
        gradsV[GV_B + e] = s;
      }
      workgroupBarrier();
      if (mine) {
        let n = min(MM_SLICE, p.V - j0);
        qg = gvSlice(qg, 1u, rq, W4, cq, 0u, n);
        dw = gvSlice(dw, 2u, rq, W4, cq, 0u, n);
      }
      workgroupBarrier();
    }
    if (mine) {
      gsStoreRows(gBase + gQg(), r, d0, p.scale * qg.t0, cv, p.K);
      gsStoreRows(gBase + gQg(), r, d1, p.scale * qg.t1, cv, p.K);
      gsStoreRows(gBase + gW(), r, d0, dw.t0 * -1.0, cv, p.K);
      gsStoreRows(gBase + gW(), r, d1, dw.t1 * -1.0, cv, p.K);
    }
  }
  // ABLATE bA }
  // dP and M above their tiles: zeros (the regions keep their whole C x C meaning)
  for (var e = lid; e < nRG * nRG; e += WG) {
    let rb = e / nRG;
    let cb = e % nRG;
    if (cb >= 2u * (rb / 2u) + 2u) {
      gsStoreTri(gBase + gP(), 4u * rb, 4u * cb, mat4x4f(), cv, 0u);
      gsStoreTri(gBase + gMX(), 4u * rb, 4u * cb, mat4x4f(), cv, 0u);
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
    gsStoreRow(gBase + gGam(), 0u, 4u * lid, acc, 1u, p.K);
  }
  workgroupBarrier();
  // Kg = K (.) Gamma for wyBackward, held in the dG region until Stage E writes dG there (four
  // channels an invocation)
  // ABLATE bKg {
  for (var e = lid; e < cv * KQ; e += WG) {
    let r = e / KQ;
    let d = 4u * (e % KQ);
    let row = base + r * p.K;
    let gamma = decay4(workK4(wG() + row, d) + workK4(wGlo() + row, d));
    gsStoreRow(gBase + gG(), r, d, kK4(aK() + qrow(at, r) * p.K, d) * gamma, cv, p.K);
  }
  // ABLATE bKg }
  // dV = beta (.) T^T dVn as a tiled product over slices of MM_SLICE rows r: T's rows in slot 0
  // (four columns s of a row of T are T^T's four rows at step r), dVn's rows from GV_B, both
  // loaded row by row (coalesced); tiles of 4 rows s x 8 columns j, each summing r from its first
  // row s on (T_rs = 0 for r < s), in order
  // ABLATE bdV {
  let VQ = (p.V + 3u) / 4u;
  let WV = gvWidth(VQ);
  let vShift = countTrailingZeros(WV);
  let nJ8 = WV / 2u;
  for (var turn = 0u; turn * WG < nRG * nJ8; turn++) {
    let blk = lid + turn * WG;
    let mine = blk < nRG * nJ8;
    let sq = blk / nJ8;
    let jq = blk % nJ8;
    let s = 4u * sq;
    var dv = Tile8(mat4x4f(), mat4x4f());
    for (var r0 = 0u; r0 < cv; r0 += MM_SLICE) {
      for (var e = lid; e < GV_SLOT; e += WG) {
        let rr = e / 16u;
        let q = e % 16u;
        let r = r0 + rr;
        let cols = 4u * q + lanes;
        var t = vec4f(0.0);
        if (r < cv && cols.x < cv) {
          t = select(vec4f(0.0), triAt4(tbase + rT() + r * p.C, min(cols, vec4u(last))), cols < vec4u(cv));
        }
        gradsV[gvLeft(0u, rr, q)] = t;
      }
      for (var e = lid; e < MM_SLICE * WV; e += WG) {
        let r = r0 + (e >> vShift);
        var value = vec4f(0.0);
        if (r < cv) {
          value = bwCols(bBase + bDVn() + r * p.V, 4u * (e & (WV - 1u)));
        }
        gradsV[GV_B + e] = value;
      }
      workgroupBarrier();
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

// elementwiseGrads for one row r (token row `row` of the value head) and channels d..: dq and dk
// (per value head when they are grouped); the
// dG pieces, the K half of dbeta and x_r = dKd (.) K (.) e^{G_C - G} into gs (the last two reuse
// the dKb and dKd slots, which only this row's invocation reads). x_r enters dG_r with a minus and
// dG_C with a plus; dg_t sums dG_r for r >= t and dG_C, so the x_r of rows r >= t cancel exactly:
// they are left out of both, and Stage F adds the x_r of rows r < t alone (no cancellation in f32).
fn elementwiseGrads(
  gBase: u32,
  row: u32,
  r: u32,
  d: u32,
  cv: u32,
  kr: vec4f,
  qr: vec4f,
  gh: vec4f,
  gl: vec4f,
  ghL: vec4f,
  glL: vec4f,
  rowL: vec4f,
  rowP: vec4f,
  colL: vec4f,
  colP: vec4f,
) {
  let K = p.K;
  let betaR = beta[aBeta() + row];
  let dPrr = gs[gBase + gP() + r * p.C + r];
  let gam = decay4(gh + gl);
  let ed = decay4((ghL - gh) + (glL - gl));
  let dQg = gsK4(gBase + gQg() + r * K, d);
  let dKb = gsK4(gBase + gKb() + r * K, d);
  let dKd = gsK4(gBase + gKd() + r * K, d);
  let pairL = betaR * rowL;
  let pairP = p.scale * rowP;
  let colSum = colL + p.scale * colP;
  storeDq(row, d, dQg * gam + pairP + p.scale * dPrr * kr);
  storeDk(
    row,
    d,
    betaR * dKb * gam + dKd * ed + pairL + colSum + p.scale * dPrr * qr,
  );
  gsStoreRow(
    gBase + gG(),
    r,
    d,
    (dQg * qr + betaR * dKb * kr) * gam + kr * pairL + qr * pairP - kr * colSum,
    cv,
    K,
  );
  gsStoreRow(gBase + gKb(), r, d, dKb * kr * gam + kr * rowL, cv, K);
  gsStoreRow(gBase + gKd(), r, d, dKd * kr * ed, cv, K);
}

// dq or dk of one row's four channels: into the per-value-head scratch when value heads are grouped
// (groupSums adds them up), else where the caller reads them (the row is then also q's and k's)
fn storeDq(row: u32, d: u32, value: vec4f) {
  if ((p.flags & GROUPED) != 0u) {
    dqhStoreK(eDq() + row * p.K, d, value);
  } else {
    dqStoreK(aDq() + row * p.K, d, value);
  }
}

fn storeDk(row: u32, d: u32, value: vec4f) {
  if ((p.flags & GROUPED) != 0u) {
    dkhStoreK(eDk() + row * p.K, d, value);
  } else {
    dkStoreK(aDk() + row * p.K, d, value);
  }
}

// ---- groupSums: dq, dk of query/key head hq = the sum of its value heads', in order ----

@compute @workgroup_size(256)
fn groupSums(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  // four channels an invocation, over every token row of the query/key heads
  let e = (wg.x + wg.y * GRID_X) * WG + lid;
  let nK4 = (p.K + 3u) / 4u;
  if (e >= p.B * p.T * p.HQ * nK4) {
    return;
  }
  let qrowE = e / nK4;
  let d = 4u * (e % nK4);
  let t = qrowE / p.HQ;
  let hq = qrowE % p.HQ;
  var sq = vec4f(0.0);
  var sk = vec4f(0.0);
  for (var gi = 0u; gi < p.G; gi++) {
    let vr = (t * p.H + hq * p.G + gi) * p.K;
    sq += dqhK4(eDq() + vr, d);
    sk += dkhK4(eDk() + vr, d);
  }
  dqStoreK(aDq() + qrowE * p.K, d, sq);
  dkStoreK(aDk() + qrowE * p.K, d, sk);
}

// ---- the K side: wyBackward, inverseBackward, pairwiseGrads, elementwiseGrads, gateCumsumBackward ----
//
// chunkGradsK's workgroup memory up to Stage D: tileB holds T (row r's vec4 q at 16 r + q, zero
// above the diagonal and past cv), read by dKb, the V half of dbeta, X and dL; the C x C square of
// dT, then X, is split by vec4 columns, q < 8 in tileA and q >= 8 in tileK (sqSlot). Before the
// square is written, tileA and tileK stage the channel slices of dW and Kg (colSlot). Stages E and
// F run as dispatches of their own (pairwiseGrads, gateCumsumBackward).

// chunkGradsK's third tile stage, beside tileA and tileB (32 KB in all)
var<workgroup> tileK: array<vec4f, TILE_K_VEC4>;

// Rows 4 rq.. of channel d of a [C, K] region of gs as one vec4, zero past cv and K (neighbouring
// invocations take neighbouring channels: each of the four loads is coalesced)
fn gsColumn(region: u32, d: u32, rq: u32, cv: u32) -> vec4f {
  let rows = 4u * rq + vec4u(0u, 1u, 2u, 3u);
  if (d >= p.K || rows.x >= cv) {
    return vec4f(0.0);
  }
  return select(vec4f(0.0), gsAt4(region + d, min(rows, vec4u(cv - 1u)) * p.K), rows < vec4u(cv));
}

// Where channel j's rows 4 rq.. of a staged slice live: 16 vec4s a channel, the row quad XORed
// with the channel, so that the staging invocations (neighbouring channels) store to different
// banks while the tiles (neighbouring row quads of one channel) still read from different banks
fn colSlot(j: u32, rq: u32) -> u32 {
  return 16u * j + (rq ^ (j & 15u));
}

// Block j of the lower triangle of a grid of blocks, row by row: (u, v) with v <= u
fn lowerBlock(j: u32) -> vec2u {
  var u = 0u;
  while ((u + 1u) * (u + 2u) / 2u <= j) {
    u++;
  }
  return vec2u(u, j - u * (u + 1u) / 2u);
}

// Where row a's vec4 column q of the square lives in its half: 8 vec4s a row, the column XORed
// with the row's block, so that invocations on neighbouring row blocks read different banks
fn sqSlot(a: u32, q: u32) -> u32 {
  return 8u * a + ((q & 7u) ^ ((a >> 2u) & 7u));
}

// Rows 4 rb.. of the square at vec4 column q: sqBlockA for q < 8 (in tileA), sqBlockK for q >= 8
fn sqBlockA(rb: u32, q: u32) -> mat4x4f {
  let a = 4u * rb;
  return mat4x4f(tileA[sqSlot(a, q)], tileA[sqSlot(a + 1u, q)], tileA[sqSlot(a + 2u, q)], tileA[sqSlot(a + 3u, q)]);
}

fn sqBlockK(rb: u32, q: u32) -> mat4x4f {
  let a = 4u * rb;
  return mat4x4f(tileK[sqSlot(a, q)], tileK[sqSlot(a + 1u, q)], tileK[sqSlot(a + 2u, q)], tileK[sqSlot(a + 3u, q)]);
}

// Stores a tile (rows 4 rb.., vec4 column q) into the square
fn sqStore(rb: u32, q: u32, t: mat4x4f) {
  let a = 4u * rb;
  if (q < 8u) {
    tileA[sqSlot(a, q)] = t[0];
    tileA[sqSlot(a + 1u, q)] = t[1];
    tileA[sqSlot(a + 2u, q)] = t[2];
    tileA[sqSlot(a + 3u, q)] = t[3];
  } else {
    tileK[sqSlot(a, q)] = t[0];
    tileK[sqSlot(a + 1u, q)] = t[1];
    tileK[sqSlot(a + 2u, q)] = t[2];
    tileK[sqSlot(a + 3u, q)] = t[3];
  }
}

// Rows 4 rb.. of T at vec4 column q, from tileB
fn tBlock(rb: u32, q: u32) -> mat4x4f {
  let i = 64u * rb + q;
  return mat4x4f(tileB[i], tileB[i + 16u], tileB[i + 32u], tileB[i + 48u]);
}

// acc + lhs_j (x) rhs_j for j = 0..3: four steps of a sum of outer products (tileFma)
fn blockFma(acc: mat4x4f, lhs: mat4x4f, rhs: mat4x4f) -> mat4x4f {
  return tileFma(tileFma(tileFma(tileFma(acc, lhs[0], rhs[0]), lhs[1], rhs[1]), lhs[2], rhs[2]), lhs[3], rhs[3]);
}

// Tile t of rows r.., columns c.. with only its strictly lower entries of rows < cv kept
fn strictLower(t: mat4x4f, r: u32, c: u32, cv: u32) -> mat4x4f {
  let cols = vec4u(c) + vec4u(0u, 1u, 2u, 3u);
  let rows = vec4u(r) + vec4u(0u, 1u, 2u, 3u);
  let lim = select(vec4u(0u), rows, rows < vec4u(cv));
  return mat4x4f(
    select(vec4f(0.0), t[0], cols < vec4u(lim.x)),
    select(vec4f(0.0), t[1], cols < vec4u(lim.y)),
    select(vec4f(0.0), t[2], cols < vec4u(lim.z)),
    select(vec4f(0.0), t[3], cols < vec4u(lim.w)),
  );
}

@compute @workgroup_size(256)
fn chunkGradsK(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let c = chunkIndex(wg);
  if (c >= p.NCT) {
    return;
  }
  let at = chunkOf(c, wg.z);
  let cv = at.cv;
  let base = at.wid * workSize();
  let tbase = at.wid * triSize();
  let gBase = at.wid * gsSize();
  let nRG = (cv + 3u) / 4u;
  let nDG = (p.K + 3u) / 4u;
  let last = cv - 1u;

  let lanes = vec4u(0u, 1u, 2u, 3u);
  // the lower 4 x 4 blocks of a C x C matrix: the tiles of dT, X and dL
  let nB = nRG * (nRG + 1u) / 2u;

  // T into tileB once, for dKb, the V half of dbeta, X and dL: row r's vec4 q at 16 r + q, zero
  // above the diagonal and past cv (so that every sum over a triangle may run over whole blocks)
  for (var e = lid; e < 16u * p.C; e += WG) {
    let r = e / 16u;
    let s4 = 4u * (e % 16u) + lanes;
    var t = vec4f(0.0);
    if (r < cv && s4.x <= r) {
      t = select(vec4f(0.0), triAt4(tbase + rT() + r * p.C, min(s4, vec4u(last))), s4 <= vec4u(r));
    }
    tileB[e] = t;
  }
  workgroupBarrier();

  // dKb = T^T dW (T_rs = 0 for r < s, so the sum over r starts at the tile's first row s), over
  // slices of 64 channels of dW staged transposed (channel j's rows 4 rq.. at colSlot: the first
  // 32 channels in tileA, the rest in tileK). 4 rows s x 4 channels a tile, every invocation on
  // one at C = 64; neighbouring invocations take neighbouring s (different banks of both operands)
  // ABLATE bKb {
  let kbS = lid % nRG;
  let kbQ = lid / nRG;
  for (var d0 = 0u; d0 < p.K; d0 += 64u) {
    for (var e = lid; e < 1024u; e += WG) {
      let jj = e % 64u;
      let v = gsColumn(gBase + gW(), d0 + jj, e / 64u, cv);
      if (jj < 32u) {
        tileA[colSlot(jj, e / 64u)] = v;
      } else {
        tileK[colSlot(jj - 32u, e / 64u)] = v;
      }
    }
    workgroupBarrier();
    if (kbQ < 16u && d0 + 4u * kbQ < p.K) {
      var kb = mat4x4f();
      // the tile's four channels in their half, then row quad by row quad (dW's rows transposed
      // in registers to vec4s over the channels)
      let j0 = 4u * (kbQ % 8u);
      if (kbQ < 8u) {
        for (var rq = kbS; rq < nRG; rq++) {
          let w = mat4x4f(
            tileA[colSlot(j0, rq)],
            tileA[colSlot(j0 + 1u, rq)],
            tileA[colSlot(j0 + 2u, rq)],
            tileA[colSlot(j0 + 3u, rq)],
          );
          kb = blockFma(kb, tBlock(rq, kbS), transpose(w));
        }
      } else {
        for (var rq = kbS; rq < nRG; rq++) {
          let w = mat4x4f(
            tileK[colSlot(j0, rq)],
            tileK[colSlot(j0 + 1u, rq)],
            tileK[colSlot(j0 + 2u, rq)],
            tileK[colSlot(j0 + 3u, rq)],
          );
          kb = blockFma(kb, tBlock(rq, kbS), transpose(w));
        }
      }
      gsStoreRows(gBase + gKb(), 4u * kbS, d0 + 4u * kbQ, kb, cv, p.K);
    }
    workgroupBarrier();
  }
  // ABLATE bKb }

  // Stage B, wyBackward: dT = dW Kb^T + dU Vb^T (strictly lower part only: dL needs no more),
  // with dW Kb^T = (dW Kg^T) diag(beta), Kg from the dG region, and dU Vb^T = M diag(beta); over
  // slices of 32 channels of dW (tileA) and Kg (tileK) staged transposed as for dKb. 4 rows r x 4
  // columns s a tile, the lower blocks only; the result into the square for Stage C
  // ABLATE bdT {
  var dt = mat4x4f();
  let bBlk = lowerBlock(lid);
  for (var d0 = 0u; d0 < p.K; d0 += 32u) {
    for (var e = lid; e < 512u; e += WG) {
      let jj = e % 32u;
      tileA[colSlot(jj, e / 32u)] = gsColumn(gBase + gW(), d0 + jj, e / 32u, cv);
      tileK[colSlot(jj, e / 32u)] = gsColumn(gBase + gG(), d0 + jj, e / 32u, cv);
    }
    workgroupBarrier();
    if (lid < nB) {
      let n = min(32u, p.K - d0);
      for (var dd = 0u; dd < n; dd++) {
        dt = tileFma(dt, tileA[colSlot(dd, bBlk.x)], tileK[colSlot(dd, bBlk.y)]);
      }
    }
    workgroupBarrier();
  }
  if (lid < nB) {
    let rows = rows4(4u * bBlk.x, last);
    let cols = rows4(4u * bBlk.y, last);
    let mRows = vec4u(gBase + gMX()) + rows * p.C;
    let m = mat4x4f(gsAt4(mRows.x, cols), gsAt4(mRows.y, cols), gsAt4(mRows.z, cols), gsAt4(mRows.w, cols));
    let betaC = betaAt4(aBeta(), vrow4(at, cols));
    sqStore(bBlk.x, bBlk.y, strictLower(tileScaleCols(dt + m, betaC), 4u * bBlk.x, 4u * bBlk.y, cv));
  }
  // ABLATE bdT }
  stageBarrier();

  // Stage E's factors, once per (row, channel), from the gates alone: with rows in blocks of
  // E_BLOCK, F_r = e^{G_e - G_r} to the last row e of r's block (into W: dW is spent) and
  // A_r = e^{G_r - G_f} from its first row f. Both exponents are <= 0.
  // ABLATE bEf {
  // (four channels an invocation)
  for (var e = lid; e < cv * nDG; e += WG) {
    let r = e / nDG;
    let d = 4u * (e % nDG);
    let f = E_BLOCK * (r / E_BLOCK);
    let eb = min(f + E_BLOCK - 1u, last);
    let gh = workK4(base + wG() + r * p.K, d);
    let gl = workK4(base + wGlo() + r * p.K, d);
    let fw = decay4((workK4(base + wG() + eb * p.K, d) - gh) + (workK4(base + wGlo() + eb * p.K, d) - gl));
    let aw = decay4((gh - workK4(base + wG() + f * p.K, d)) + (gl - workK4(base + wGlo() + f * p.K, d)));
    gsStoreRow(gBase + gW(), r, d, fw, cv, p.K);
    gsStoreRow(gBase + gA(), r, d, aw, cv, p.K);
  }
  // ABLATE bEf }

  // the V half of dbeta, sum_{r >= s} T_rs M_rs, on the last C invocations (beside Stage C's
  // tiles); a warp's invocations start at one row (its first s), so that each load of M is one
  // coalesced row, and the rows r < s add exact zeros (T_rs = 0, and M's upper part is masked)
  if (lid + p.C >= WG) {
    let s = lid + p.C - WG;
    if (s < cv) {
      var acc = 0.0;
      for (var r = s - s % 32u; r < cv; r++) {
        let m = select(0.0, gs[gBase + gMX() + r * p.C + s], r >= s);
        acc += tileB[16u * r + s / 4u][s % 4u] * m;
      }
      gs[gBase + gBv() + s] = acc;
    }
  }

  // Stage C, inverseBackward: X = dT T^T for a > s (T lower, dT strictly lower: b <= s; the
  // terms past a row's own s are zeros of T), into the square over dT once every tile has read
  // it. 4 rows a x 4 columns s a tile, the lower blocks column by column (neighbouring invocations
  // share T's rows s and read dT's rows from different banks); both operands' rows are read as
  // vec4s over b and transposed in registers
  // ABLATE bC {
  let cBlk = lowerBlock(lid);
  let cs = nRG - 1u - cBlk.x;
  let ca = nRG - 1u - cBlk.y;
  var xt = mat4x4f();
  if (lid < nB) {
    for (var bq = 0u; bq <= min(cs, 7u); bq++) {
      xt = blockFma(xt, transpose(sqBlockA(ca, bq)), transpose(tBlock(cs, bq)));
    }
    for (var bq = 8u; bq <= cs; bq++) {
      xt = blockFma(xt, transpose(sqBlockK(ca, bq)), transpose(tBlock(cs, bq)));
    }
  }
  workgroupBarrier();
  if (lid < nB) {
    sqStore(ca, cs, xt);
  }
  // ABLATE bC }
  stageBarrier();

  // Stage D, inverseBackward: dL = strict_lower(-T^T X), into TL; 4 rows r x 4 columns s a tile,
  // the lower blocks column by column (T_ar = 0 for a < r, so the sum over a starts at the tile's
  // first row); the blocks above the diagonal are stored as zeros by the invocations left over
  // ABLATE bD {
  let dBlk = lowerBlock(lid);
  if (lid < nB) {
    let ds = nRG - 1u - dBlk.x;
    let dr = nRG - 1u - dBlk.y;
    var dl = mat4x4f();
    if (ds < 8u) {
      for (var aq = dr; aq < nRG; aq++) {
        dl = blockFma(dl, tBlock(aq, dr), sqBlockA(aq, ds));
      }
    } else {
      for (var aq = dr; aq < nRG; aq++) {
        dl = blockFma(dl, tBlock(aq, dr), sqBlockK(aq, ds));
      }
    }
    gsStoreTri(gBase + gTL(), 4u * dr, 4u * ds, dl * -1.0, cv, 1u);
  } else if (lid < nRG * nRG) {
    let up = lowerBlock(lid - nB);
    gsStoreTri(gBase + gTL(), 4u * up.y, 4u * (up.x + 1u), mat4x4f(), cv, 1u);
  }
  // ABLATE bD }
}

// ---- pairwiseGrads: Stage E in a dispatch of its own, so that its registers do not set the
// residency of the other stages ----

@compute @workgroup_size(256)
fn pairwiseGrads(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let c = chunkIndex(wg);
  if (c >= p.NCT) {
    return;
  }
  let at = chunkOf(c, wg.z);
  let cv = at.cv;
  let o = blockOffsets(at);
  let nRG = (cv + 3u) / 4u;
  let nDG = (p.K + 3u) / 4u;
  let last = cv - 1u;

  // Stage E, elementwiseGrads + pairwiseGrads: the pieces of dq, dk, dG and dbeta, a block of 4
  // rows r.. x 4 channels d.. at a time. The pairwise sums factor each decay through anchor rows,
  // so that no exp is left in the long loops:
  //   rows s < r in an earlier E_BLOCK block J (last row e):  E_{r_i s} = e^{G_ri - G_r} e^{G_r - G_e} F_s
  //   rows s < r in r's own block:                            E_{r_i s} = e^{G_ri - G_r} e^{G_r - G_s}
  //   rows r' > r_last in r's own block:                      E_{r' r_i} = e^{G_r' - G_rlast} e^{G_rlast - G_ri}
  //   rows r' in a later block I (first row f):               E_{r' r_i} = A_r' e^{G_f - G_rlast} e^{G_rlast - G_ri}
  // with F and A from Stage E's factors, one exp per block J or I and the block's own rows formed
  // directly. Every exponent is <= 0. Pairs inside the 4-row block are formed directly. The
  // diagonal s = r has E = 1 and is added apart: its two contributions to dG (at both ends of the
  // pair) cancel exactly and are left out.
  // ABLATE bE {
  for (var blk = lid; blk < nRG * nDG; blk += WG) {
    let blk4 = blockOf(blk, nDG, last);
    let r = blk4.r;
    let d = blk4.c;
    let rc1 = blk4.rows.y;
    let rc2 = blk4.rows.z;
    let rc3 = blk4.rows.w;
    // the E_BLOCK block of the 4 rows: its first row and the row past its end
    let f = E_BLOCK * (r / E_BLOCK);
    let fEnd = min(f + E_BLOCK, cv);
    let gh0 = workK4(o.work + wG() + r * p.K, d);
    let gl0 = workK4(o.work + wGlo() + r * p.K, d);
    let gh3 = workK4(o.work + wG() + rc3 * p.K, d);
    let gl3 = workK4(o.work + wGlo() + rc3 * p.K, d);
    let lReg = o.gs + gTL();
    let pReg = o.gs + gP();

    // row terms: sum_{s < r_i} dL_{r_i s} k_s E_{r_i s} (and the same with dP), through the
    // anchor r; first the earlier blocks, then r's own block
    var rl = mat4x4f();
    var rp = mat4x4f();
    for (var j0 = 0u; j0 < f; j0 += E_BLOCK) {
      let jl = j0 + E_BLOCK - 1u;
      let mid = decay4((gh0 - workK4(o.work + wG() + jl * p.K, d)) + (gl0 - workK4(o.work + wGlo() + jl * p.K, d)));
      for (var s = j0; s <= jl; s++) {
        let ks = kK4(aK() + qrow(at, s) * p.K, d) * (gsK4(o.gs + gW() + s * p.K, d) * mid);
        rl = tileFma(rl, gsAt4(lReg + s, blk4.rows * p.C), ks);
        rp = tileFma(rp, gsAt4(pReg + s, blk4.rows * p.C), ks);
      }
    }
    for (var s = f; s < r; s++) {
      let gs4 = workK4(o.work + wG() + s * p.K, d);
      let gls4 = workK4(o.work + wGlo() + s * p.K, d);
      let ks = kK4(aK() + qrow(at, s) * p.K, d) * decay4((gh0 - gs4) + (gl0 - gls4));
      rl = tileFma(rl, gsAt4(lReg + s, blk4.rows * p.C), ks);
      rp = tileFma(rp, gsAt4(pReg + s, blk4.rows * p.C), ks);
    }

    // column terms: sum_{r' > r_i} beta_r' dL_{r' r_i} k_r' E_{r' r_i} (and dP with q_r'), through
    // the anchor r_last; first r's own block, then the later blocks
    var cl = mat4x4f();
    var cp = mat4x4f();
    for (var rr = rc3 + 1u; rr < fEnd; rr++) {
      let e = decay4(
        (workK4(o.work + wG() + rr * p.K, d) - gh3) + (workK4(o.work + wGlo() + rr * p.K, d) - gl3),
      );
      let ke = beta[aBeta() + vrow(at, rr)] * kK4(aK() + qrow(at, rr) * p.K, d) * e;
      let qe = qK4(aQ() + qrow(at, rr) * p.K, d) * e;
      cl = tileFma(cl, gsAt4(lReg + rr * p.C, blk4.rows), ke);
      cp = tileFma(cp, gsAt4(pReg + rr * p.C, blk4.rows), qe);
    }
    for (var i0 = fEnd; i0 < cv; i0 += E_BLOCK) {
      let mid = decay4((workK4(o.work + wG() + i0 * p.K, d) - gh3) + (workK4(o.work + wGlo() + i0 * p.K, d) - gl3));
      let i1 = min(i0 + E_BLOCK, cv);
      for (var rr = i0; rr < i1; rr++) {
        let e = gsK4(o.gs + gA() + rr * p.K, d) * mid;
        let ke = beta[aBeta() + vrow(at, rr)] * kK4(aK() + qrow(at, rr) * p.K, d) * e;
        let qe = qK4(aQ() + qrow(at, rr) * p.K, d) * e;
        cl = tileFma(cl, gsAt4(lReg + rr * p.C, blk4.rows), ke);
        cp = tileFma(cp, gsAt4(pReg + rr * p.C, blk4.rows), qe);
      }
    }

    // the block's own rows, loaded after the long loops (fewer registers held through them)
    let gh1 = workK4(o.work + wG() + rc1 * p.K, d);
    let gh2 = workK4(o.work + wG() + rc2 * p.K, d);
    let gl1 = workK4(o.work + wGlo() + rc1 * p.K, d);
    let gl2 = workK4(o.work + wGlo() + rc2 * p.K, d);
    // the six pairs inside the block, e_ij = e^{G_i - G_j}, i > j
    let e10 = decay4((gh1 - gh0) + (gl1 - gl0));
    let e20 = decay4((gh2 - gh0) + (gl2 - gl0));
    let e30 = decay4((gh3 - gh0) + (gl3 - gl0));
    let e21 = decay4((gh2 - gh1) + (gl2 - gl1));
    let e31 = decay4((gh3 - gh1) + (gl3 - gl1));
    let e32 = decay4((gh3 - gh2) + (gl3 - gl2));
    let row0 = vrow(at, r);
    let row1 = vrow(at, rc1);
    let row2 = vrow(at, rc2);
    let row3 = vrow(at, rc3);
    let k0 = kK4(aK() + qrow(at, r) * p.K, d);
    let k1 = kK4(aK() + qrow(at, rc1) * p.K, d);
    let k2 = kK4(aK() + qrow(at, rc2) * p.K, d);
    let k3 = kK4(aK() + qrow(at, rc3) * p.K, d);
    let q0 = qK4(aQ() + qrow(at, r) * p.K, d);
    let q1 = qK4(aQ() + qrow(at, rc1) * p.K, d);
    let q2 = qK4(aQ() + qrow(at, rc2) * p.K, d);
    let q3 = qK4(aQ() + qrow(at, rc3) * p.K, d);

    // row terms through the anchor, then the pairs inside the block (s = r, r + 1, r + 2)
    rl[1] = e10 * rl[1] + gs[lReg + rc1 * p.C + r] * (k0 * e10);
    rp[1] = e10 * rp[1] + gs[pReg + rc1 * p.C + r] * (k0 * e10);
    rl[2] = e20 * rl[2] + gs[lReg + rc2 * p.C + r] * (k0 * e20) + gs[lReg + rc2 * p.C + rc1] * (k1 * e21);
    rp[2] = e20 * rp[2] + gs[pReg + rc2 * p.C + r] * (k0 * e20) + gs[pReg + rc2 * p.C + rc1] * (k1 * e21);
    rl[3] = e30 * rl[3] + gs[lReg + rc3 * p.C + r] * (k0 * e30) + gs[lReg + rc3 * p.C + rc1] * (k1 * e31) +
      gs[lReg + rc3 * p.C + rc2] * (k2 * e32);
    rp[3] = e30 * rp[3] + gs[pReg + rc3 * p.C + r] * (k0 * e30) + gs[pReg + rc3 * p.C + rc1] * (k1 * e31) +
      gs[pReg + rc3 * p.C + rc2] * (k2 * e32);

    // through the anchor e^{G_last - G_ri}, then the pairs inside the block (r' <= the last row)
    let b1 = beta[aBeta() + row1];
    let b2 = beta[aBeta() + row2];
    let b3 = beta[aBeta() + row3];
    let v1 = r + 1u < cv;
    let v2 = r + 2u < cv;
    let v3 = r + 3u < cv;
    cl[0] = e30 * cl[0];
    cp[0] = e30 * cp[0];
    cl[1] = e31 * cl[1];
    cp[1] = e31 * cp[1];
    cl[2] = e32 * cl[2];
    cp[2] = e32 * cp[2];
    if (v1) {
      cl[0] += b1 * gs[lReg + rc1 * p.C + r] * k1 * e10;
      cp[0] += gs[pReg + rc1 * p.C + r] * q1 * e10;
    }
    if (v2) {
      cl[0] += b2 * gs[lReg + rc2 * p.C + r] * k2 * e20;
      cp[0] += gs[pReg + rc2 * p.C + r] * q2 * e20;
      cl[1] += b2 * gs[lReg + rc2 * p.C + rc1] * k2 * e21;
      cp[1] += gs[pReg + rc2 * p.C + rc1] * q2 * e21;
    }
    if (v3) {
      cl[0] += b3 * gs[lReg + rc3 * p.C + r] * k3 * e30;
      cp[0] += gs[pReg + rc3 * p.C + r] * q3 * e30;
      cl[1] += b3 * gs[lReg + rc3 * p.C + rc1] * k3 * e31;
      cp[1] += gs[pReg + rc3 * p.C + rc1] * q3 * e31;
      cl[2] += b3 * gs[lReg + rc3 * p.C + rc2] * k3 * e32;
      cp[2] += gs[pReg + rc3 * p.C + rc2] * q3 * e32;
    }
    let ghL = workK4(o.work + wG() + last * p.K, d);
    let glL = workK4(o.work + wGlo() + last * p.K, d);
    elementwiseGrads(o.gs, row0, r, d, cv, k0, q0, gh0, gl0, ghL, glL, rl[0], rp[0], cl[0], cp[0]);
    if (v1) {
      elementwiseGrads(o.gs, row1, rc1, d, cv, k1, q1, gh1, gl1, ghL, glL, rl[1], rp[1], cl[1], cp[1]);
    }
    if (v2) {
      elementwiseGrads(o.gs, row2, rc2, d, cv, k2, q2, gh2, gl2, ghL, glL, rl[2], rp[2], cl[2], cp[2]);
    }
    if (v3) {
      elementwiseGrads(o.gs, row3, rc3, d, cv, k3, q3, gh3, gl3, ghL, glL, rl[3], rp[3], cl[3], cp[3]);
    }
  }
  // ABLATE bE }
}

// ---- gateCumsumBackward: Stage F, a dispatch of its own as Stage E ----

@compute @workgroup_size(256)
fn gateCumsumBackward(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let c = chunkIndex(wg);
  if (c >= p.NCT) {
    return;
  }
  let at = chunkOf(c, wg.z);
  let o = blockOffsets(at);

  // Stage F: dbeta row sums; gateCumsumBackward: dG_C, then the reverse cumsum to dg, per channel
  // ABLATE bF {
  for (var e = lid; e < at.cv + p.K; e += WG) {
    if (e < at.cv) {
      let r = e;
      var acc = gs[o.gs + gBv() + r];
      for (var d = 0u; d < p.K; d++) {
        acc += gs[o.gs + gKb() + r * p.K + d];
      }
      dbeta[aDbeta() + vrow(at, r)] = acc;
    } else {
      let d = e - at.cv;
      // dg_t = dgamma_C gamma_C + sum_{r >= t} dG_r + sum_{r < t} x_r (see elementwiseGrads)
      var before = 0.0;
      for (var r = 0u; r < at.cv; r++) {
        dg[aDg() + vrow(at, r) * p.K + d] = before;
        before += gs[o.gs + gKd() + r * p.K + d];
      }
      var acc = gs[o.gs + gGam() + d] * work[o.work + wGam() + d];
      for (var i = 0u; i < at.cv; i++) {
        let r = at.cv - 1u - i;
        acc += gs[o.gs + gG() + r * p.K + d];
        let i = aDg() + vrow(at, r) * p.K + d;
        dg[i] = acc + dg[i];
      }
    }
  }
  // ABLATE bF }
}
