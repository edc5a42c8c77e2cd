// The split set's backward, the pairwise and gate gradients (docs/kda.md 2.3), in stages named
// after the stages of kda/chunk.ts they run, one workgroup per (chunk, head), but Stage E's per
// (chunk, head, group of PW_QUADS channel quads) and groupSums':
//   pairwiseGrads       pairwiseGrads and elementwiseGrads (Stage E): dq, dk and the dG pieces
//   gateCumsumBackward  Stage F: dbeta and the reverse cumsum to dg
//   groupSums           dq and dk of each query/key head, the sum over its group of value heads
// They read what chunkGradsV (grads_v.wgsl) and chunkGradsK (grads_k.wgsl) left in the gradient
// scratch gs (Stage E through its vec4 view gs4, which it only reads); each heavy stage of the
// backward is a dispatch of its own, so that its registers do not set the residency of the others
// (docs/kda.md 3.2). Rows past cv are clamped for reads and never stored; each sum keeps one fixed
// order. Decays are the built-in exp (coarseDecay4, shared.wgsl): the gradients' bar allows it.

// elementwiseGrads for one row r (token row `row` of the value head) and channels d..: dq and dk
// (per value head when they are grouped); the dG pieces into dg (Stage F sums them in place), the
// K half of dbeta and x_r = dKd (.) K (.) e^{G_C - G} into bw (eKb, eKd). x_r enters dG_r with a
// minus and dG_C with a plus; dg_t sums dG_r for r >= t and dG_C, so the x_r of rows r >= t cancel
// exactly: they are left out of both, and Stage F adds the x_r of rows r < t alone (no
// cancellation in f32).
fn elementwiseGrads(
  at: ChunkAt,
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
  let dPrr = gs4F(at.gs + gP() + r * p.C + r);
  let gam = coarseDecay4(gh + gl);
  let ed = coarseDecay4((ghL - gh) + (glL - gl));
  let dQg = gs4K4(at.gs + gQg() + r * K, d);
  let dKb = gs4K4(at.gs + gKb() + r * K, d);
  let dKd = gs4K4(at.gs + gKd() + r * K, d);
  let pairL = betaR * rowL;
  let pairP = p.scale * rowP;
  let colSum = colL + p.scale * colP;
  storeDq(row, d, dQg * gam + pairP + p.scale * dPrr * kr);
  storeDk(
    row,
    d,
    betaR * dKb * gam + dKd * ed + pairL + colSum + p.scale * dPrr * qr,
  );
  dg4wStoreK(
    aDg() + row * K,
    d,
    (dQg * qr + betaR * dKb * kr) * gam + kr * pairL + qr * pairP - kr * colSum,
  );
  // the dKb term of dbeta summed over the quad's four channels (zeros past K): Stage F adds the
  // row's quads in order
  let kb = dKb * kr * gam + kr * rowL;
  let kbAt = at.bw + eKb() + r * ((K + 3u) / 4u) + d / 4u;
  bw4w[kbAt >> 2u][kbAt & 3u] = ((kb.x + kb.y) + kb.z) + kb.w;
  bw4wStoreK(at.bw + eKd() + r * K, d, dKd * kr * ed);
}

// dq or dk of one row's four channels: into the per-value-head scratch when value heads are grouped
// (groupSums adds them up), else where the caller reads them (the row is then also q's and k's)
fn storeDq(row: u32, d: u32, value: vec4f) {
  if ((p.flags & GROUPED) != 0u) {
    dqh4wStoreK(eDq() + row * p.K, d, value);
  } else {
    dq4wStoreK(aDq() + row * p.K, d, value);
  }
}

fn storeDk(row: u32, d: u32, value: vec4f) {
  if ((p.flags & GROUPED) != 0u) {
    dkh4wStoreK(eDk() + row * p.K, d, value);
  } else {
    dk4wStoreK(aDk() + row * p.K, d, value);
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

// Where Stage E leaves its per-row pieces of dbeta (the dKb term) and of dg (x_r) for Stage F: the
// backward scratch bw, whose dVn and dS chunkGradsV has spent (its table keeps room for both).
fn eKb() -> u32 {
  return 0u;
}

fn eKd() -> u32 {
  return p.C * p.K;
}

// Stage E's blocks (4 rows x 4 channels) of a workgroup's PW_QUADS channel quads, in warps of cw
// channel quads x 32 / cw neighbouring row quads (docs/kda.md 3.2). pairwiseWarpCols is cw:
// PW_COLS, or fewer where there are fewer channel quads; pairwiseWarps pads the grid of nRG x nDG
// blocks to whole warp tiles (x rows, y columns); pairwiseBlock is slot's block (row quad, channel
// quad), past the grid where the tile overhangs it.
fn pairwiseWarpCols(nDG: u32) -> u32 {
  return min(PW_COLS, max(1u, 1u << (32u - countLeadingZeros(max(nDG, 1u) - 1u))));
}

fn pairwiseWarps(nRG: u32, nDG: u32, cw: u32) -> vec2u {
  let rw = 32u / cw;
  return vec2u(rw * ((nRG + rw - 1u) / rw), cw * ((nDG + cw - 1u) / cw));
}

fn pairwiseBlock(slot: u32, pw: vec2u, cw: u32) -> vec2u {
  let rw = 32u / cw;
  let tile = slot / 32u;
  let lane = slot % 32u;
  let across = pw.y / cw;
  return vec2u(rw * (tile / across) + lane / cw, cw * (tile % across) + lane % cw);
}

// ---- pairwiseGrads: Stage E in a dispatch of its own, so that its registers do not set the
// residency of the other stages ----

@compute @workgroup_size(256)
fn pairwiseGrads(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let pos = range.n0 + chunkIndex(wg);
  if (pos >= range.n1) {
    return;
  }
  // PW_QUADS channel quads a workgroup (half a head's at K = 128: twice the workgroups, each
  // with half the rows of k, q, W, A and the gates to read), a head's channel groups in z
  let nCG = (p.K + 4u * PW_QUADS - 1u) / (4u * PW_QUADS);
  let at = slicedChunkOf(pos, wg.z / nCG);
  let dq0 = PW_QUADS * (wg.z % nCG);
  let cv = at.cv;
  let nRG = (cv + 3u) / 4u;
  let nDG = min(PW_QUADS, (p.K + 3u) / 4u - dq0);
  let last = cv - 1u;

  // Stage E, elementwiseGrads + pairwiseGrads: the pieces of dq, dk, dG and dbeta, a block of 4
  // rows r.. x 4 channels d.. at a time. The pairwise sums factor each decay through anchor rows,
  // so that no exp is left in the long loops:
  //   rows s < r in an earlier E_BLOCK block J (last row e):  E_{r_i s} = e^{G_ri - G_r} e^{G_r - G_e} F_s
  //   rows s < r in r's own block:                            E_{r_i s} = e^{G_ri - G_r} e^{G_r - G_s}
  //   rows r' > r_last in r's own block:                      E_{r' r_i} = e^{G_r' - G_rlast} e^{G_rlast - G_ri}
  //   rows r' in a later block I (first row f):               E_{r' r_i} = A_r' e^{G_f - G_rlast} e^{G_rlast - G_ri}
  // with F and A from Stage E's factors, one exp per block J or I and the block's own rows formed
  // directly (E_BLOCK is 64, mod.ts: a block is the whole chunk at every chunk size, so only the
  // lines of r's own block apply, one exp a row). Every exponent is <= 0. Pairs inside the 4-row
  // block are formed directly. The diagonal s = r has E = 1 and is added apart: its two
  // contributions to dG (at both ends of the pair) cancel exactly and are left out.
  // ABLATE bE {
  let cw = pairwiseWarpCols(nDG);
  let pw = pairwiseWarps(nRG, nDG, cw);
  for (var slot = lid; slot < pw.x * pw.y; slot += WG) {
    let at4 = pairwiseBlock(slot, pw, cw);
    if (at4.x >= nRG || at4.y >= nDG) {
      continue;
    }
    let blk4 = Block(4u * at4.x, 4u * (dq0 + at4.y), rows4(4u * at4.x, last), vec4u(0u));
    let r = blk4.r;
    let d = blk4.c;
    let rc1 = blk4.rows.y;
    let rc2 = blk4.rows.z;
    let rc3 = blk4.rows.w;
    // the E_BLOCK block of the 4 rows: its first row and the row past its end
    let f = E_BLOCK * (r / E_BLOCK);
    let fEnd = min(f + E_BLOCK, cv);
    let gh0 = gates4K4(at.gates + xG() + r * p.K, d);
    let gl0 = gates4K4(at.gates + xGlo() + r * p.K, d);
    let gh3 = gates4K4(at.gates + xG() + rc3 * p.K, d);
    let gl3 = gates4K4(at.gates + xGlo() + rc3 * p.K, d);
    let lReg = at.gs + gL();
    let pReg = at.gs + gP();

    // row terms: sum_{s < r_i} dL_{r_i s} k_s E_{r_i s} (and the same with dP), through the
    // anchor r; first the earlier blocks, then r's own block
    var rl = mat4x4f();
    var rp = mat4x4f();
    for (var j0 = 0u; j0 < f; j0 += E_BLOCK) {
      let jl = j0 + E_BLOCK - 1u;
      let mid = coarseDecay4((gh0 - gates4K4(at.gates + xG() + jl * p.K, d)) + (gl0 - gates4K4(at.gates + xGlo() + jl * p.K, d)));
      for (var s = j0; s <= jl; s++) {
        let ks = kK4(aK() + qrow(at, s) * p.K, d) * (gs4K4(at.gs + gW() + s * p.K, d) * mid);
        rl = tileFma(rl, gs4At4(lReg + s, blk4.rows * p.C), ks);
        rp = tileFma(rp, gs4At4(pReg + s, blk4.rows * p.C), ks);
      }
    }
    for (var s = f; s < r; s++) {
      let gS4 = gates4K4(at.gates + xG() + s * p.K, d);
      let gls4 = gates4K4(at.gates + xGlo() + s * p.K, d);
      let ks = kK4(aK() + qrow(at, s) * p.K, d) * coarseDecay4((gh0 - gS4) + (gl0 - gls4));
      rl = tileFma(rl, gs4At4(lReg + s, blk4.rows * p.C), ks);
      rp = tileFma(rp, gs4At4(pReg + s, blk4.rows * p.C), ks);
    }

    // column terms: sum_{r' > r_i} beta_r' dL_{r' r_i} k_r' E_{r' r_i} (and dP with q_r'), through
    // the anchor r_last; first r's own block, then the later blocks
    var cl = mat4x4f();
    var cp = mat4x4f();
    for (var rr = rc3 + 1u; rr < fEnd; rr++) {
      let e = coarseDecay4(
        (gates4K4(at.gates + xG() + rr * p.K, d) - gh3) + (gates4K4(at.gates + xGlo() + rr * p.K, d) - gl3),
      );
      let ke = beta[aBeta() + vrow(at, rr)] * kK4(aK() + qrow(at, rr) * p.K, d) * e;
      let qe = qK4(aQ() + qrow(at, rr) * p.K, d) * e;
      cl = tileFma(cl, gs4At4(lReg + rr * p.C, blk4.rows), ke);
      cp = tileFma(cp, gs4At4(pReg + rr * p.C, blk4.rows), qe);
    }
    for (var i0 = fEnd; i0 < cv; i0 += E_BLOCK) {
      let mid = coarseDecay4((gates4K4(at.gates + xG() + i0 * p.K, d) - gh3) + (gates4K4(at.gates + xGlo() + i0 * p.K, d) - gl3));
      let i1 = min(i0 + E_BLOCK, cv);
      for (var rr = i0; rr < i1; rr++) {
        let e = gs4K4(at.gs + gA() + rr * p.K, d) * mid;
        let ke = beta[aBeta() + vrow(at, rr)] * kK4(aK() + qrow(at, rr) * p.K, d) * e;
        let qe = qK4(aQ() + qrow(at, rr) * p.K, d) * e;
        cl = tileFma(cl, gs4At4(lReg + rr * p.C, blk4.rows), ke);
        cp = tileFma(cp, gs4At4(pReg + rr * p.C, blk4.rows), qe);
      }
    }

    // the block's own rows, loaded after the long loops (fewer registers held through them)
    let gh1 = gates4K4(at.gates + xG() + rc1 * p.K, d);
    let gh2 = gates4K4(at.gates + xG() + rc2 * p.K, d);
    let gl1 = gates4K4(at.gates + xGlo() + rc1 * p.K, d);
    let gl2 = gates4K4(at.gates + xGlo() + rc2 * p.K, d);
    // the six pairs inside the block, e_ij = e^{G_i - G_j}, i > j
    let e10 = coarseDecay4((gh1 - gh0) + (gl1 - gl0));
    let e20 = coarseDecay4((gh2 - gh0) + (gl2 - gl0));
    let e30 = coarseDecay4((gh3 - gh0) + (gl3 - gl0));
    let e21 = coarseDecay4((gh2 - gh1) + (gl2 - gl1));
    let e31 = coarseDecay4((gh3 - gh1) + (gl3 - gl1));
    let e32 = coarseDecay4((gh3 - gh2) + (gl3 - gl2));
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
    rl[1] = e10 * rl[1] + gs4F(lReg + rc1 * p.C + r) * (k0 * e10);
    rp[1] = e10 * rp[1] + gs4F(pReg + rc1 * p.C + r) * (k0 * e10);
    rl[2] = e20 * rl[2] + gs4F(lReg + rc2 * p.C + r) * (k0 * e20) + gs4F(lReg + rc2 * p.C + rc1) * (k1 * e21);
    rp[2] = e20 * rp[2] + gs4F(pReg + rc2 * p.C + r) * (k0 * e20) + gs4F(pReg + rc2 * p.C + rc1) * (k1 * e21);
    rl[3] = e30 * rl[3] + gs4F(lReg + rc3 * p.C + r) * (k0 * e30) + gs4F(lReg + rc3 * p.C + rc1) * (k1 * e31) +
      gs4F(lReg + rc3 * p.C + rc2) * (k2 * e32);
    rp[3] = e30 * rp[3] + gs4F(pReg + rc3 * p.C + r) * (k0 * e30) + gs4F(pReg + rc3 * p.C + rc1) * (k1 * e31) +
      gs4F(pReg + rc3 * p.C + rc2) * (k2 * e32);

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
      cl[0] += b1 * gs4F(lReg + rc1 * p.C + r) * k1 * e10;
      cp[0] += gs4F(pReg + rc1 * p.C + r) * q1 * e10;
    }
    if (v2) {
      cl[0] += b2 * gs4F(lReg + rc2 * p.C + r) * k2 * e20;
      cp[0] += gs4F(pReg + rc2 * p.C + r) * q2 * e20;
      cl[1] += b2 * gs4F(lReg + rc2 * p.C + rc1) * k2 * e21;
      cp[1] += gs4F(pReg + rc2 * p.C + rc1) * q2 * e21;
    }
    if (v3) {
      cl[0] += b3 * gs4F(lReg + rc3 * p.C + r) * k3 * e30;
      cp[0] += gs4F(pReg + rc3 * p.C + r) * q3 * e30;
      cl[1] += b3 * gs4F(lReg + rc3 * p.C + rc1) * k3 * e31;
      cp[1] += gs4F(pReg + rc3 * p.C + rc1) * q3 * e31;
      cl[2] += b3 * gs4F(lReg + rc3 * p.C + rc2) * k3 * e32;
      cp[2] += gs4F(pReg + rc3 * p.C + rc2) * q3 * e32;
    }
    let ghL = gates4K4(at.gates + xG() + last * p.K, d);
    let glL = gates4K4(at.gates + xGlo() + last * p.K, d);
    elementwiseGrads(at, row0, r, d, cv, k0, q0, gh0, gl0, ghL, glL, rl[0], rp[0], cl[0], cp[0]);
    if (v1) {
      elementwiseGrads(at, row1, rc1, d, cv, k1, q1, gh1, gl1, ghL, glL, rl[1], rp[1], cl[1], cp[1]);
    }
    if (v2) {
      elementwiseGrads(at, row2, rc2, d, cv, k2, q2, gh2, gl2, ghL, glL, rl[2], rp[2], cl[2], cp[2]);
    }
    if (v3) {
      elementwiseGrads(at, row3, rc3, d, cv, k3, q3, gh3, gl3, ghL, glL, rl[3], rp[3], cl[3], cp[3]);
    }
  }
  // ABLATE bE }
}

// ---- gateCumsumBackward: Stage F, a dispatch of its own as Stage E ----

// The dg indices of rows r0..r0 + 3 at channel d (rows past the chunk's valid ones clamped to its
// last: loaded, never stored), and the bw indices of their x_r (eKd)
fn dgQuad(at: ChunkAt, r0: u32, d: u32) -> vec4u {
  return vec4u(aDg()) + vrow4(at, rows4(r0, at.cv - 1u)) * p.K + vec4u(d);
}

fn xQuad(at: ChunkAt, r0: u32, d: u32) -> vec4u {
  return vec4u(at.bw + eKd() + d) + rows4(r0, at.cv - 1u) * p.K;
}

@compute @workgroup_size(256)
fn gateCumsumBackward(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let pos = range.n0 + chunkIndex(wg);
  if (pos >= range.n1) {
    return;
  }
  let at = slicedChunkOf(pos, wg.z);

  // Stage F: dbeta row sums; gateCumsumBackward: dG_C, then the reverse cumsum to dg, per channel.
  // Each loop takes its rows eight at a time, their loads issued before the batch's sums and
  // stores (a store to dg would otherwise hold back the next row's load), each sum in row order.
  // ABLATE bF {
  for (var e = lid; e < at.cv + p.K; e += WG) {
    if (e < at.cv) {
      let r = e;
      var acc = gs[at.gs + gBv() + r];
      // the row's quad sums of the dKb term (elementwiseGrads)
      let nQ = (p.K + 3u) / 4u;
      let row = at.bw + eKb() + r * nQ;
      var d = 0u;
      for (; d + 8u <= nQ; d += 8u) {
        let x = vec4f(bw[row + d], bw[row + d + 1u], bw[row + d + 2u], bw[row + d + 3u]);
        let y = vec4f(bw[row + d + 4u], bw[row + d + 5u], bw[row + d + 6u], bw[row + d + 7u]);
        acc += x.x;
        acc += x.y;
        acc += x.z;
        acc += x.w;
        acc += y.x;
        acc += y.y;
        acc += y.z;
        acc += y.w;
      }
      for (; d < nQ; d++) {
        acc += bw[row + d];
      }
      dbeta[aDbeta() + vrow(at, r)] = acc;
    } else {
      let d = e - at.cv;
      // dg_t = (dgamma_C gamma_C + sum_{r >= t} dG_r) + sum_{r < t} x_r (see elementwiseGrads),
      // the dG_r being where Stage E left them, in dg itself
      var acc = gs[at.gs + gGam() + d] * work4F(at.work + wGam() + d);
      for (var top = at.cv; top > 0u; top -= min(8u, top)) {
        let n = min(8u, top);
        let lo = dgQuad(at, top - n, d);
        let hi = dgQuad(at, top - n + 4u, d);
        let x = vec4f(dg[lo.x], dg[lo.y], dg[lo.z], dg[lo.w]);
        let y = vec4f(dg[hi.x], dg[hi.y], dg[hi.z], dg[hi.w]);
        // rows top - 1 down to top - n: y.w .. x.x of the batch's eight (the first 8 - n unused)
        if (n > 7u) { acc += y.w; dg[hi.w] = acc; }
        if (n > 6u) { acc += y.z; dg[hi.z] = acc; }
        if (n > 5u) { acc += y.y; dg[hi.y] = acc; }
        if (n > 4u) { acc += y.x; dg[hi.x] = acc; }
        if (n > 3u) { acc += x.w; dg[lo.w] = acc; }
        if (n > 2u) { acc += x.z; dg[lo.z] = acc; }
        if (n > 1u) { acc += x.y; dg[lo.y] = acc; }
        acc += x.x;
        dg[lo.x] = acc;
      }
      var before = 0.0;
      for (var r0 = 0u; r0 < at.cv; r0 += 8u) {
        let n = min(8u, at.cv - r0);
        let lo = dgQuad(at, r0, d);
        let hi = dgQuad(at, r0 + 4u, d);
        let x = vec4f(dg[lo.x], dg[lo.y], dg[lo.z], dg[lo.w]);
        let y = vec4f(dg[hi.x], dg[hi.y], dg[hi.z], dg[hi.w]);
        let bx = xQuad(at, r0, d);
        let by = xQuad(at, r0 + 4u, d);
        let u = vec4f(bw[bx.x], bw[bx.y], bw[bx.z], bw[bx.w]);
        let v = vec4f(bw[by.x], bw[by.y], bw[by.z], bw[by.w]);
        dg[lo.x] = x.x + before;
        before += u.x;
        if (n > 1u) { dg[lo.y] = x.y + before; before += u.y; }
        if (n > 2u) { dg[lo.z] = x.z + before; before += u.z; }
        if (n > 3u) { dg[lo.w] = x.w + before; before += u.w; }
        if (n > 4u) { dg[hi.x] = y.x + before; before += v.x; }
        if (n > 5u) { dg[hi.y] = y.y + before; before += v.y; }
        if (n > 6u) { dg[hi.z] = y.z + before; before += v.z; }
        if (n > 7u) { dg[hi.w] = y.w + before; before += v.w; }
      }
    }
  }
  // ABLATE bF }
}
