// The split set's backward, the K side's adjoints of the WY form and the inverse (docs/kda.md
// 2.3), one workgroup per (chunk, head):
//   chunkGradsK  wyBackward and inverseBackward (dT, dKb, X, dL), and Stage E's factors
// It reads what chunkGradsV (grads_v.wgsl) left in gs and leaves dL, dKb, the V half of dbeta and
// the factors there for pairwiseGrads (chunk_backward.wgsl). Each sum keeps one fixed order; its
// decays are the built-in exp (coarseDecay4, shared.wgsl), as in every gradient stage.

// ---- the K side: wyBackward, inverseBackward, pairwiseGrads, elementwiseGrads, gateCumsumBackward ----
//
// chunkGradsK's workgroup memory up to Stage D, 16 KB: the C x C square of dT, then X, split by
// vec4 columns, q < 8 in tileA and q >= 8 in tileK (sqSlot). Before the square is written, tileA
// and tileK stage the channel slices of dW and Kg (colSlot). T, read by dKb, the V half of dbeta,
// X and dL, comes from TRI where it is used (tBlock). Stages E and F run as dispatches of their
// own (pairwiseGrads, gateCumsumBackward).

// chunkGradsK's two tile stages (8 KB each)
var<workgroup> tileA: array<vec4f, TILE_A_VEC4>;
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

// An invocation's four entries of a staged slice of dW (dKb) or of dW and Kg (Stage B), loaded
// into registers a slice ahead: the global loads of the next slice are issued before the compute
// on the current one, and stored into tileA and tileK after its barrier
struct SliceAhead {
  v0: vec4f,
  v1: vec4f,
  v2: vec4f,
  v3: vec4f,
}

// dKb's slice of 64 channels from d0: entries lid + k WG of its 1024 (WG = 256), channel lid % 64
// at row quads lid / 64 + 4 k; the first 32 channels go to tileA, the rest to tileK
const_assert WG == 256u;
fn kbSlice(at: ChunkAt, d0: u32, lid: u32, cv: u32) -> SliceAhead {
  let j = d0 + lid % 64u;
  let q = lid / 64u;
  let w = at.gs + gW();
  return SliceAhead(gsColumn(w, j, q, cv), gsColumn(w, j, q + 4u, cv), gsColumn(w, j, q + 8u, cv), gsColumn(w, j, q + 12u, cv));
}

fn kbStage(lid: u32, s: SliceAhead) {
  let jj = lid % 64u;
  let q = lid / 64u;
  if (jj < 32u) {
    tileA[colSlot(jj, q)] = s.v0;
    tileA[colSlot(jj, q + 4u)] = s.v1;
    tileA[colSlot(jj, q + 8u)] = s.v2;
    tileA[colSlot(jj, q + 12u)] = s.v3;
  } else {
    tileK[colSlot(jj - 32u, q)] = s.v0;
    tileK[colSlot(jj - 32u, q + 4u)] = s.v1;
    tileK[colSlot(jj - 32u, q + 8u)] = s.v2;
    tileK[colSlot(jj - 32u, q + 12u)] = s.v3;
  }
}

// Rows 4 rq.. of channel d of Kg = K (.) Gamma as one vec4, formed from K and the slice's gate
// sums where Stage B stages it (no pass of its own, nothing stored): Gamma_r = e^{G_r} from the
// high and low parts of G, as gateQuadRow forms it; zero past cv and K
fn kgColumn(at: ChunkAt, d: u32, rq: u32, cv: u32) -> vec4f {
  let rows = 4u * rq + vec4u(0u, 1u, 2u, 3u);
  if (d >= p.K || rows.x >= cv) {
    return vec4f(0.0);
  }
  let live = rows4(4u * rq, cv - 1u);
  let gi = live * p.K;
  let gamma = coarseDecay4(gates4At4(at.gates + xG() + d, gi) + gates4At4(at.gates + xGlo() + d, gi));
  let k = kAt4(aK() + d, qrow4(at, live) * p.K);
  return select(vec4f(0.0), k * gamma, rows < vec4u(cv));
}

// Stage B's slice of 32 channels from d0: entries lid + k WG of the 512 of dW (v0, v1, to tileA)
// and of Kg (v2, v3, to tileK), channel lid % 32 at row quads lid / 32 + 8 k
fn bdSlice(at: ChunkAt, d0: u32, lid: u32, cv: u32) -> SliceAhead {
  let j = d0 + lid % 32u;
  let q = lid / 32u;
  let w = at.gs + gW();
  return SliceAhead(gsColumn(w, j, q, cv), gsColumn(w, j, q + 8u, cv), kgColumn(at, j, q, cv), kgColumn(at, j, q + 8u, cv));
}

fn bdStage(lid: u32, s: SliceAhead) {
  let jj = lid % 32u;
  let q = lid / 32u;
  tileA[colSlot(jj, q)] = s.v0;
  tileA[colSlot(jj, q + 8u)] = s.v1;
  tileK[colSlot(jj, q)] = s.v2;
  tileK[colSlot(jj, q + 8u)] = s.v3;
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

// Row r of T at vec4 column q, read from TRI through its view (a row's runs of four lie on the vec4
// grid: C and TRI's blocks are multiples of four floats), zero above the diagonal and past cv, so
// that every sum over a triangle may run over whole blocks
fn tRow(at: ChunkAt, r: u32, q: u32) -> vec4f {
  let t = tri4[(at.tri + rT() + r * p.C) / 4u + q];
  let keep = (4u * q + vec4u(0u, 1u, 2u, 3u) <= vec4u(r)) & vec4<bool>(r < at.cv);
  return select(vec4f(0.0), t, keep);
}

// Rows 4 rb.. of T at vec4 column q
fn tBlock(at: ChunkAt, rb: u32, q: u32) -> mat4x4f {
  let a = 4u * rb;
  return mat4x4f(tRow(at, a, q), tRow(at, a + 1u, q), tRow(at, a + 2u, q), tRow(at, a + 3u, q));
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
  let pos = range.n0 + chunkIndex(wg);
  if (pos >= range.n1) {
    return;
  }
  let at = slicedChunkOf(pos, wg.z);
  let cv = at.cv;
  let nRG = (cv + 3u) / 4u;
  let nDG = (p.K + 3u) / 4u;
  let last = cv - 1u;

  // the lower 4 x 4 blocks of a C x C matrix: the tiles of dT, X and dL
  let nB = nRG * (nRG + 1u) / 2u;

  // dKb's first slice of dW, staged before its products. T is read from TRI where it is used
  // (tBlock), so that chunkGradsK keeps 16 KB of workgroup memory and three of its workgroups
  // share an SM of the H200.
  // ABLATE bKb {
  kbStage(lid, kbSlice(at, 0u, lid, cv));
  // ABLATE bKb }
  workgroupBarrier();
  var ahead: SliceAhead;

  // ABLATE bdT {
  // whether dKb's last turn has staged Stage B's first slice (it has, unless bKb is ablated)
  var bdStaged = false;
  // ABLATE bdT }

  // dKb = T^T dW (T_rs = 0 for r < s, so the sum over r starts at the tile's first row s), over
  // slices of 64 channels of dW staged transposed (channel j's rows 4 rq.. at colSlot: the first
  // 32 channels in tileA, the rest in tileK). 4 rows s x 4 channels a tile, every invocation on
  // one at C = 64. A warp takes four neighbouring s and eight channel quads of one half (its
  // tiles' sums, which start at their s, end within three steps of each other, and an eighth of
  // a warp reads eight different banks); the warps of short sums leave the SM to others.
  // The next slice (after the last, Stage B's first) is loaded while this one is computed on.
  // ABLATE bKb {
  const_assert WG % 32u == 0u;
  let sWarps = p.C / 16u;
  let kbS = lid % 4u + 4u * ((lid / 32u) % sWarps);
  let kbQ = (lid % 32u) / 4u + 8u * (lid / 32u / sWarps);
  for (var d0 = 0u; d0 < p.K; d0 += 64u) {
    let more = d0 + 64u < p.K;
    if (more) {
      ahead = kbSlice(at, d0 + 64u, lid, cv);
    }
    // ABLATE bdT {
    if (!more) {
      ahead = bdSlice(at, 0u, lid, cv);
    }
    // ABLATE bdT }
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
          kb = blockFma(kb, tBlock(at, rq, kbS), transpose(w));
        }
      } else {
        for (var rq = kbS; rq < nRG; rq++) {
          let w = mat4x4f(
            tileK[colSlot(j0, rq)],
            tileK[colSlot(j0 + 1u, rq)],
            tileK[colSlot(j0 + 2u, rq)],
            tileK[colSlot(j0 + 3u, rq)],
          );
          kb = blockFma(kb, tBlock(at, rq, kbS), transpose(w));
        }
      }
      gsStoreRows(at.gs + gKb(), 4u * kbS, d0 + 4u * kbQ, kb, cv, p.K);
    }
    workgroupBarrier();
    if (more) {
      kbStage(lid, ahead);
      workgroupBarrier();
    }
    // ABLATE bdT {
    if (!more) {
      bdStage(lid, ahead);
      bdStaged = true;
      workgroupBarrier();
    }
    // ABLATE bdT }
  }
  // ABLATE bKb }

  // Stage B, wyBackward: dT = dW Kb^T + dU Vb^T (strictly lower part only: dL needs no more),
  // with dW Kb^T = (dW Kg^T) diag(beta), Kg formed as it is staged (kgColumn), and
  // dU Vb^T = M diag(beta); over slices of 32 channels of dW (tileA) and Kg (tileK) staged
  // transposed as for dKb, the next one loaded while this one is computed on. 4 rows r x 4
  // columns s a tile, the lower blocks only; the result into the square for Stage C
  // ABLATE bdT {
  var dt = mat4x4f();
  let bBlk = lowerBlock(lid);
  if (!bdStaged) {
    bdStage(lid, bdSlice(at, 0u, lid, cv));
    workgroupBarrier();
  }
  var bdNext: SliceAhead;
  for (var d0 = 0u; d0 < p.K; d0 += 32u) {
    let more = d0 + 32u < p.K;
    if (more) {
      bdNext = bdSlice(at, d0 + 32u, lid, cv);
    }
    if (lid < nB) {
      let n = min(32u, p.K - d0);
      for (var dd = 0u; dd < n; dd++) {
        dt = tileFma(dt, tileA[colSlot(dd, bBlk.x)], tileK[colSlot(dd, bBlk.y)]);
      }
    }
    workgroupBarrier();
    if (more) {
      bdStage(lid, bdNext);
      workgroupBarrier();
    }
  }
  if (lid < nB) {
    let rows = rows4(4u * bBlk.x, last);
    let cols = rows4(4u * bBlk.y, last);
    let mRows = vec4u(at.gs + gM()) + rows * p.C;
    let m = mat4x4f(gsAt4(mRows.x, cols), gsAt4(mRows.y, cols), gsAt4(mRows.z, cols), gsAt4(mRows.w, cols));
    let betaC = betaAt4(aBeta(), vrow4(at, cols));
    sqStore(bBlk.x, bBlk.y, strictLower(tileScaleCols(dt + m, betaC), 4u * bBlk.x, 4u * bBlk.y, cv));
  }
  // ABLATE bdT }
  stageBarrier();

  // Stage E's factors, once per (row, channel), from the gates alone: with rows in blocks of
  // E_BLOCK, F_r = e^{G_e - G_r} to the last row e of r's block (into W: dW is spent) and
  // A_r = e^{G_r - G_f} from its first row f. Both exponents are <= 0. Only a chunk of more than
  // one block reads them (E_BLOCK is 64, mod.ts: none at any chunk size today).
  // ABLATE bEf {
  // (four channels an invocation)
  for (var e = lid; E_BLOCK < p.C && e < cv * nDG; e += WG) {
    let r = e / nDG;
    let d = 4u * (e % nDG);
    let f = E_BLOCK * (r / E_BLOCK);
    let eb = min(f + E_BLOCK - 1u, last);
    let gh = gates4K4(at.gates + xG() + r * p.K, d);
    let gl = gates4K4(at.gates + xGlo() + r * p.K, d);
    let fw = coarseDecay4((gates4K4(at.gates + xG() + eb * p.K, d) - gh) + (gates4K4(at.gates + xGlo() + eb * p.K, d) - gl));
    let aw = coarseDecay4((gh - gates4K4(at.gates + xG() + f * p.K, d)) + (gl - gates4K4(at.gates + xGlo() + f * p.K, d)));
    gsStoreRow(at.gs + gW(), r, d, fw, cv, p.K);
    gsStoreRow(at.gs + gA(), r, d, aw, cv, p.K);
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
        let below = r >= s;
        let m = select(0.0, gs[at.gs + gM() + r * p.C + s], below);
        acc += select(0.0, tri4F(at.tri + rT() + r * p.C + s), below) * m;
      }
      gs[at.gs + gBv() + s] = acc;
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
      xt = blockFma(xt, transpose(sqBlockA(ca, bq)), transpose(tBlock(at, cs, bq)));
    }
    for (var bq = 8u; bq <= cs; bq++) {
      xt = blockFma(xt, transpose(sqBlockK(ca, bq)), transpose(tBlock(at, cs, bq)));
    }
  }
  workgroupBarrier();
  if (lid < nB) {
    sqStore(ca, cs, xt);
  }
  // ABLATE bC }
  stageBarrier();

  // Stage D, inverseBackward: dL = strict_lower(-T^T X), into L; 4 rows r x 4 columns s a tile,
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
        dl = blockFma(dl, tBlock(at, aq, dr), sqBlockA(aq, ds));
      }
    } else {
      for (var aq = dr; aq < nRG; aq++) {
        dl = blockFma(dl, tBlock(at, aq, dr), sqBlockK(aq, ds));
      }
    }
    gsStoreTri(at.gs + gL(), 4u * dr, 4u * ds, dl * -1.0, cv, 1u);
  } else if (lid < nRG * nRG) {
    let up = lowerBlock(lid - nB);
    gsStoreTri(at.gs + gL(), 4u * up.y, 4u * (up.x + 1u), mat4x4f(), cv, 1u);
  }
  // ABLATE bD }
}
