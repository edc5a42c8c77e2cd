// The split set's chunk-parallel forward preparation (docs/kda.md 2.2), one workgroup per (chunk,
// head), named as in kda/chunk.ts:
//   chunkPrep    gateCumsum, gateFactors, pairwiseDecay and intraChunk (L, P, T, W, U)
// (its gate sums by gate_sums.wgsl's channel quads, which the backward's gateFactors shares).
// Every exponent is <= 0 (a difference G_r - G_s with r >= s), every sum runs in one fixed order,
// nothing uses atomics. Lines "// ABLATE name {" / "}" mark sections bench/ablate.ts can remove.

// ---- chunkPrep ----

// The pairwise products factor each decay through anchor rows. Rows form 4-row blocks; for r in
// block I and s in an earlier block J, with a_I the first row of I and e_J the last of J,
//   e^{G_r - G_s} = e^{G_r - G_aI} e^{G_aI - G_eJ} e^{G_eJ - G_s},
// three factors <= 1. The first and last are staged once per (row, channel): A = k e^{G_r - G_a},
// Qa = q e^{G_r - G_a}, Bk = k e^{G_e - G_r}; the middle one is one exp per channel for the pair
// of blocks. Pairs inside one block are formed directly (six exps per channel), and those blocks'
// channels are split over four invocations whose partial sums are added in a fixed order.

// chunkPrep's parts' totals in prep, packed exactly (gateSumPack): four vec4s an invocation
const_assert 4u * WG <= PREP_VEC4;

fn prepTotalsSet(i: u32, a: GateSums4) {
  prep[4u * i] = gateSumPack(a.s[0]);
  prep[4u * i + 1u] = gateSumPack(a.s[1]);
  prep[4u * i + 2u] = gateSumPack(a.s[2]);
  prep[4u * i + 3u] = gateSumPack(a.s[3]);
}

fn prepTotalsAt(i: u32) -> GateSums4 {
  return GateSums4(array<GateSum, 4>(
    gateSumUnpack(prep[4u * i]),
    gateSumUnpack(prep[4u * i + 1u]),
    gateSumUnpack(prep[4u * i + 2u]),
    gateSumUnpack(prep[4u * i + 3u]),
  ));
}

// The substitution matrix in prep (floats): T_ij at i SUB + j below the diagonal, L_ij (and then
// the blocks Z of the blocked inverse) at j SUB + i above it. The stride is padded by one float so
// that a warp reading down a column of either triangle touches 32 different banks.
fn subStride() -> u32 {
  return p.C + 1u;
}

// the substitution matrix (C <= 64) and the diagonal blocks' partial sums fit prep
const_assert 64u * 65u <= 4u * PREP_VEC4;
const_assert PREP_HALF + 16u * 3u * 8u <= PREP_VEC4;

// L_ij (i > j) as the substitution reads it: zero in rows past the valid ones, which the pairwise
// products leave unwritten (so T's rows there are finite, and are never read for valid rows).
fn substL(i: u32, j: u32, cv: u32) -> f32 {
  return select(0.0, prepF(j * subStride() + i), i < cv);
}

// Row r of a strictly lower tile of L (columns sb..), stored transposed into the upper triangle
// of the substitution matrix: its strict lower triangle will hold T.
fn storeLtRow(r: u32, sb: u32, v: vec4f, cv: u32) {
  if (r >= cv) {
    return;
  }
  let sub = subStride();
  if (sb < r) { prepSet(sb * sub + r, v.x); }
  if (sb + 1u < r) { prepSet((sb + 1u) * sub + r, v.y); }
  if (sb + 2u < r) { prepSet((sb + 2u) * sub + r, v.z); }
  if (sb + 3u < r) { prepSet((sb + 3u) * sub + r, v.w); }
}

// The off-diagonal 16 x 16 block pair q of the blocked inverse (row block bi > column block bk,
// in the order (1, 0), (2, 0), (2, 1), (3, 0), ...)
fn blockPair(q: u32) -> vec2u {
  var bi = 1u;
  while ((bi + 1u) * bi / 2u <= q) {
    bi += 1u;
  }
  return vec2u(bi, q - bi * (bi - 1u) / 2u);
}

// Entry e of Z = T_ii L_ik over the off-diagonal blocks (256 entries a block, rows fastest): the
// diagonal block inverse T_ii (unit lower) applied to the block of L below it, summed in
// ascending column of T_ii. Zero past the blocks.
fn substZ(e: u32, nZ: u32, cv: u32) -> f32 {
  if (e >= nZ) {
    return 0.0;
  }
  let pair = blockPair(e / 256u);
  let i0 = 16u * pair.x;
  let r = i0 + e % 16u;
  let col = 16u * pair.y + (e / 16u) % 16u;
  let sub = subStride();
  var z = substL(r, col, cv);
  for (var m = i0; m < r; m++) {
    z = fma(prepF(r * sub + m), substL(m, col, cv), z);
  }
  return z;
}

// Where entry e of Z replaces L_ik (its float in prep)
fn substZAt(e: u32) -> u32 {
  let pair = blockPair(e / 256u);
  return (16u * pair.y + (e / 16u) % 16u) * subStride() + 16u * pair.x + e % 16u;
}

// T diag(beta) for rows 4 rq.. of column s (s = e % C, rq = e / C: neighbouring invocations read
// neighbouring floats and store neighbouring T entries), zero past the valid rows, read from the
// substitution matrix (T_rs below the diagonal, 1 on it, 0 above); T itself is stored to tri on
// the way, for the backward alone: a forward that saves nothing for one leaves it out.
fn tQuad(at: ChunkAt, tbase: u32, e: u32) -> vec4f {
  let s = e % p.C;
  let rq = e / p.C;
  var t = vec4f(0.0);
  if (s >= at.cv) {
    return t;
  }
  let rows = 4u * rq + vec4u(0u, 1u, 2u, 3u);
  let m = prepAt4(s, min(rows, vec4u(p.C - 1u)) * subStride());
  t = select(select(vec4f(0.0), vec4f(1.0), rows == vec4u(s)), m, rows > vec4u(s));
  let ok = rows < vec4u(at.cv);
  t = select(vec4f(0.0), t, ok);
  let col = tbase + rT() + s;
  let kept = ok & vec4<bool>((p.flags & SAVE_STATES) != 0u);
  if (kept.x) { tri[col + rows.x * p.C] = t.x; }
  if (kept.y) { tri[col + rows.y * p.C] = t.y; }
  if (kept.z) { tri[col + rows.z * p.C] = t.z; }
  if (kept.w) { tri[col + rows.w * p.C] = t.w; }
  return t * beta[aBeta() + vrow(at, s)];
}

// Where tQuad's entry e lives as the left operand of W and U: s C/4 + rq
fn tSlot(e: u32) -> u32 {
  return (e % p.C) * (p.C / 4u) + e / p.C;
}

// Entry e of a staged slice of W's or U's right operand (sd rows from s0, nq vec4 columns from
// vec4 column q0): K (.) Gamma, left in W by gateFactors, or V; zero past the valid rows.
fn wuValue(at: ChunkAt, base: u32, which: u32, s0: u32, sd: u32, q0: u32, nq: u32, e: u32) -> vec4f {
  let s = s0 + e / nq;
  let j = 4u * (q0 + e % nq);
  if (e >= sd * nq || s >= at.cv) {
    return vec4f(0.0);
  }
  if (which == 0u) {
    return workK4(base + wW() + s * p.K, j);
  }
  return vCols(aV() + vrow(at, s) * p.V, j);
}

// One turn of W's or U's product (8-column groups j80.. of w8): its first vec4 column q0, its
// width in vec4s nq (even: a tile's halves are nq / 2 apart; the vec4 past an odd width is staged
// as zeros), and the rows sd of its slices
fn wuShape(which: u32, j80: u32, w8: u32) -> vec3u {
  let width = select(p.K, p.V, which == 1u);
  let nqAll = (width + 3u) / 4u;
  let q0 = 2u * j80;
  let nq = min(2u * w8, 2u * ((nqAll - q0 + 1u) / 2u));
  let sd = min(p.C, PREP_WU / nq);
  return vec3u(q0, nq, sd);
}

// An invocation's two entries lid + i WG of a staged slice of W's or U's right operand (the
// turn's shape from wuShape), held in registers a slice ahead of the product
const_assert PREP_WU <= 2u * WG;
struct WuAhead {
  v0: vec4f,
  v1: vec4f,
}

fn wuSlice(at: ChunkAt, which: u32, s0: u32, shape: vec3u, lid: u32) -> WuAhead {
  let q0 = shape.x;
  let nq = shape.y;
  let sd = shape.z;
  return WuAhead(
    wuValue(at, at.work, which, s0, sd, q0, nq, lid),
    wuValue(at, at.work, which, s0, sd, q0, nq, lid + WG),
  );
}

// Stages a slice in the second part of prep: its n4 vec4s
fn wuStage(lid: u32, s: WuAhead, n4: u32) {
  if (lid < n4) { prep[PREP_HALF + lid] = s.v0; }
  if (lid + WG < n4) { prep[PREP_HALF + lid + WG] = s.v1; }
}

// The operands of one (row quad, channel) entry e of a slice of the pairwise products from
// channel d0: k, q and G's high and low parts at the quad's four rows (clamped to the last valid
// one), zero past K or for an invocation that stages nothing
struct LpIn {
  k4: vec4f,
  q4: vec4f,
  gh: vec4f,
  gl: vec4f,
}

// every entry of a slice is one invocation's (C <= 64: at most 16 row quads)
const_assert 16u * LP_BLOCK <= WG;

fn lpLoad(at: ChunkAt, d0: u32, e: u32, last: u32, staging: bool) -> LpIn {
  let d = d0 + e % LP_BLOCK;
  if (!staging || d >= p.K) {
    return LpIn(vec4f(0.0), vec4f(0.0), vec4f(0.0), vec4f(0.0));
  }
  let rows = rows4(4u * (e / LP_BLOCK), last);
  let tok = qrow4(at, rows) * p.K;
  return LpIn(
    kAt4(aK() + d, tok),
    qAt4(aQ() + d, tok),
    uAt4(at.u + uU() + d, rows * p.K),
    gloAt4(at.glo + lGlo() + d, rows * p.K),
  );
}

@compute @workgroup_size(256)
fn chunkPrep(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let c = chunkIndex(wg);
  if (c >= p.NCT) {
    return;
  }
  let at = chunkOf(c, wg.z);
  let cv = at.cv;
  let last = cv - 1u;

  // gateCumsum: G_r = sum_{s <= r} g_s per channel in token order, in fixed point (gateSumAdd),
  // by channel quads (gateQuad); the parts' totals meet in prep. G_C (the sum of all parts) is
  // known to every part: gateFactors runs in the same pass, with no second read of G from memory.
  // G's high part goes to U's block, which holds nothing else until the end of the stage (U
  // replaces it there once the pairwise products have read it), and its low part to a buffer of
  // the forward's own: the gate sums are not kept (the backward forms them again, gateFactors).
  // ABLATE cumsum {
  for (var d0 = 0u; d0 < p.K; d0 += 4u * GQ_QUADS) {
    let w = gateQuad(at, d0, lid);
    prepTotalsSet(lid, gateQuadPart(at, w));
    workgroupBarrier();
    var total = gateSums4Zero();
    var before = total;
    for (var j = 0u; j < GQ_PARTS; j++) {
      if (j == w.part) {
        before = total;
      }
      total = gateSums4Join(total, prepTotalsAt(j * GQ_QUADS + lid % GQ_QUADS));
    }
    // the next turn overwrites the totals
    workgroupBarrier();
    if (w.d < p.K) {
      var acc = before;
      for (var r = w.r0; r < w.r1; r++) {
        // each row as the loop reaches it (GateIn)
        let x = gateIn(at, r, w.d);
        acc = gateSums4Add(acc, x.g);
        let i = r * p.K;
        let f = gateQuadRow(total, acc, x);
        uStoreK(at.u + uU() + i, w.d, f.hi);
        gloStoreK(at.glo + lGlo() + i, w.d, f.lo);
        // gateFactors: Qg, Kd, and K (.) Gamma left in W (the right operand W's product stages,
        // before W replaces it)
        // ABLATE factors {
        qgStoreK(at.qg + qQg() + i, w.d, f.qg);
        kdStoreK(at.kd + dKd() + i, w.d, f.kd);
        workStoreK(at.work + wW() + i, w.d, f.kg);
        // ABLATE factors }
      }
      if (w.part == 0u) {
        var gam = vec4f(0.0);
        for (var l = 0u; l < 4u; l++) {
          gam[l] = decay(gateSumHi(total.s[l]) + gateSumLo(total.s[l]));
        }
        workStoreK(at.work + wGam(), w.d, gam);
      }
    }
  }
  // ABLATE cumsum }
  stageBarrier();

  // pairwiseDecay and the pairwise products of L and P (see above). Invocations 0..119 take the
  // pairs of different blocks, 128..191 a block's own pairs and a quarter of its channels, so no
  // warp mixes the two paths.
  let nRG = (cv + 3u) / 4u;
  let nOff = nRG * (nRG - 1u) / 2u;
  let diagonal = lid >= 128u;
  var rg = 0u;
  var sg = 0u;
  var cg = 0u;
  if (diagonal) {
    rg = (lid - 128u) / 4u;
    sg = rg;
    cg = (lid - 128u) % 4u;
  } else {
    rg = u32((1.0 + sqrt(1.0 + 8.0 * f32(lid))) * 0.5);
    while (rg > 0u && rg * (rg - 1u) / 2u > lid) {
      rg -= 1u;
    }
    while ((rg + 1u) * rg / 2u <= lid) {
      rg += 1u;
    }
    sg = lid - rg * (rg - 1u) / 2u;
  }
  let rb = 4u * rg;
  let sb = 4u * sg;
  let inTriangle = select(lid < nOff, rg < nRG, diagonal);
  // the staged operands of a slice of LP_BLOCK channels, each a vec4 over a row quad at
  // rq LP_STRIDE + channel (the stride padded by one vec4, so that quads read together by one
  // warp fall on different banks): K, Q, G at the quad's anchor rows (first and last: hi, lo of
  // the first, hi, lo of the last, all the pairs of different blocks read of G), G at its two
  // inner rows (likewise, the rest of G for a block's own pairs), and the anchored A, Qa, Bk
  let oK = 0u;
  let oQ = LP_OPERAND;
  let oGa = 2u * LP_OPERAND;
  let oGi = 3u * LP_OPERAND;
  let oA = 4u * LP_OPERAND;
  let oQa = 5u * LP_OPERAND;
  let oB = 6u * LP_OPERAND;
  let quadR = rg * LP_STRIDE;
  let quadS = sg * LP_STRIDE;
  var lt = mat4x4f();
  var pt = mat4x4f();
  // ABLATE lp {
  // one (row quad, channel) an invocation (nRG LP_BLOCK <= WG): its four rows (clamped to the last
  // valid one) of k, q and G loaded a slice ahead, into registers before the products of the slice
  // before (so their latency hides behind those), and the decays from the quad's first row and to
  // its last formed in registers when staged, so the slice is staged between two barriers
  let staging = lid < nRG * LP_BLOCK;
  var lpNext = lpLoad(at, 0u, lid, last, staging);
  for (var d0 = 0u; d0 < p.K; d0 += LP_BLOCK) {
    if (staging) {
      let x = lpNext;
      let fa = decay4((x.gh - vec4f(x.gh.x)) + (x.gl - vec4f(x.gl.x)));
      let fe = decay4((vec4f(x.gh.w) - x.gh) + (vec4f(x.gl.w) - x.gl));
      let slot = (lid / LP_BLOCK) * LP_STRIDE + lid % LP_BLOCK;
      prep[oK + slot] = x.k4;
      prep[oQ + slot] = x.q4;
      prep[oGa + slot] = vec4f(x.gh.x, x.gl.x, x.gh.w, x.gl.w);
      prep[oGi + slot] = vec4f(x.gh.y, x.gl.y, x.gh.z, x.gl.z);
      prep[oA + slot] = x.k4 * fa;
      prep[oQa + slot] = x.q4 * fa;
      prep[oB + slot] = x.k4 * fe;
    }
    workgroupBarrier();
    if (d0 + LP_BLOCK < p.K) {
      lpNext = lpLoad(at, d0 + LP_BLOCK, lid, last, staging);
    }
    if (inTriangle) {
      let dn = min(LP_BLOCK, p.K - d0);
      if (!diagonal) {
        // block sg is full (it lies before block rg), so its last row is lane w of its quad: G at
        // block rg's first row and block sg's last. Each channel's operands are loaded a channel
        // ahead, before the products of the one before (the last of these loads reaches at most
        // the stride's pad vec4, read and never used).
        var gr = prep[oGa + quadR].xy;
        var gs = prep[oGa + quadS].zw;
        var a4 = prep[oA + quadR];
        var qa4 = prep[oQa + quadR];
        var b4 = prep[oB + quadS];
        for (var dd = 0u; dd < dn; dd++) {
          let nx = dd + 1u;
          let grNext = prep[oGa + quadR + nx].xy;
          let gsNext = prep[oGa + quadS + nx].zw;
          let a4Next = prep[oA + quadR + nx];
          let qa4Next = prep[oQa + quadR + nx];
          let b4Next = prep[oB + quadS + nx];
          let mid = decay((gr.x - gs.x) + (gr.y - gs.y));
          lt = tileFma(lt, a4 * mid, b4);
          pt = tileFma(pt, qa4 * mid, b4);
          gr = grNext;
          gs = gsNext;
          a4 = a4Next;
          qa4 = qa4Next;
          b4 = b4Next;
        }
      } else {
        for (var dd = cg; dd < dn; dd += 4u) {
          let ga = prep[oGa + quadR + dd];
          let gi = prep[oGi + quadR + dd];
          let gh = vec4f(ga.x, gi.x, gi.z, ga.z);
          let gl = vec4f(ga.y, gi.y, gi.w, ga.w);
          let k4 = prep[oK + quadR + dd];
          let q4 = prep[oQ + quadR + dd];
          // the six pairs i > j of the block: e10 e20 e21 e30 in e1, e31 e32 in e2
          let e1 = decay4(
            vec4f(gh.y - gh.x, gh.z - gh.x, gh.z - gh.y, gh.w - gh.x) +
              vec4f(gl.y - gl.x, gl.z - gl.x, gl.z - gl.y, gl.w - gl.x),
          );
          let e2 = decay4(vec4f(gh.w - gh.y, gh.w - gh.z, 0.0, 0.0) + vec4f(gl.w - gl.y, gl.w - gl.z, 0.0, 0.0));
          lt[1] += vec4f(k4.y * (k4.x * e1.x), 0.0, 0.0, 0.0);
          lt[2] += vec4f(k4.z * (k4.x * e1.y), k4.z * (k4.y * e1.z), 0.0, 0.0);
          lt[3] += vec4f(k4.w * (k4.x * e1.w), k4.w * (k4.y * e2.x), k4.w * (k4.z * e2.y), 0.0);
          pt[0] += vec4f(q4.x * k4.x, 0.0, 0.0, 0.0);
          pt[1] += vec4f(q4.y * (k4.x * e1.x), q4.y * k4.y, 0.0, 0.0);
          pt[2] += vec4f(q4.z * (k4.x * e1.y), q4.z * (k4.y * e1.z), q4.z * k4.z, 0.0);
          pt[3] += vec4f(q4.w * (k4.x * e1.w), q4.w * (k4.y * e2.x), q4.w * (k4.z * e2.y), q4.w * k4.w);
        }
      }
    }
    workgroupBarrier();
  }
  // ABLATE lp }
  // a diagonal block's four partial sums, added in channel-group order by its first invocation
  // (three parts of eight vec4s for each of the C / 4 <= 16 diagonal blocks, past PREP_HALF)
  let parts = PREP_HALF + (rg * 3u + cg - 1u) * 8u;
  if (diagonal && inTriangle && cg > 0u) {
    prep[parts] = lt[0];
    prep[parts + 1u] = lt[1];
    prep[parts + 2u] = lt[2];
    prep[parts + 3u] = lt[3];
    prep[parts + 4u] = pt[0];
    prep[parts + 5u] = pt[1];
    prep[parts + 6u] = pt[2];
    prep[parts + 7u] = pt[3];
  }
  workgroupBarrier();
  if (inTriangle && (!diagonal || cg == 0u)) {
    if (diagonal) {
      for (var part = 0u; part < 3u; part++) {
        let at4 = PREP_HALF + (rg * 3u + part) * 8u;
        lt += mat4x4f(prep[at4], prep[at4 + 1u], prep[at4 + 2u], prep[at4 + 3u]);
        pt += mat4x4f(prep[at4 + 4u], prep[at4 + 5u], prep[at4 + 6u], prep[at4 + 7u]);
      }
    }
    let beta4 = betaAt4(aBeta(), vrow4(at, rows4(rb, last)));
    let ls = tileScaleRows(lt, beta4);
    triStoreTri(at.tri + rP(), rb, sb, p.scale * pt, cv, 0u);
    // L^T into the substitution matrix, which needs no other initial value
    storeLtRow(rb, sb, ls[0], cv);
    storeLtRow(rb + 1u, sb, ls[1], cv);
    storeLtRow(rb + 2u, sb, ls[2], cv);
    storeLtRow(rb + 3u, sb, ls[3], cv);
  }
  // the blocks above the diagonal
  for (var e = lid; e < cv * cv; e += WG) {
    let r = e / cv;
    let s = e % cv;
    if (s / 4u > r / 4u) {
      tri[at.tri + rP() + r * p.C + s] = 0.0;
    }
  }
  workgroupBarrier();

  // T = (I + L)^(-1) as a blocked inverse in workgroup memory (subStride's layout: T below the
  // diagonal, L above it, stored by the pairwise products), in C / 16 row blocks of 16:
  // 1. each diagonal block's inverse T_ii by forward substitution, all blocks at once: at step m
  //    every later row i of the block takes its term in each column j <= m (T_im = -L_im, first
  //    written then), so each entry sums in ascending m; 15 barrier-separated steps in all;
  // 2. Z_ik = T_ii L_ik for each block of L below the diagonal, replacing L_ik;
  // 3. the blocks below the diagonal by their distance d from it, those of one distance at once:
  //    T_ij = -sum_{j <= k < i} Z_ik T_kj (from (I + L) T = I), which reads only nearer blocks.
  // Some 20 barriers instead of one per row of the chunk.
  // ABLATE subst {
  let sub = subStride();
  let nb = p.C / 16u;
  for (var m = 0u; m < 15u; m++) {
    let cnt = (15u - m) * (m + 1u);
    if (lid < nb * cnt) {
      let b0 = 16u * (lid / cnt);
      let e = lid % cnt;
      let i = b0 + m + 1u + e / (m + 1u);
      let j = b0 + e % (m + 1u);
      let lim = substL(i, b0 + m, cv);
      var t = -lim;
      if (j < b0 + m) {
        t = prepF(i * sub + j) - lim * prepF((b0 + m) * sub + j);
      }
      prepSet(i * sub + j, t);
    }
    workgroupBarrier();
  }
  // nb (nb - 1) / 2 blocks of 256 entries: at most six an invocation, all read before any is
  // written over the L it reads
  let nZ = nb * (nb - 1u) / 2u * 256u;
  if (nZ > 0u) {
    let z0 = substZ(lid, nZ, cv);
    let z1 = substZ(lid + WG, nZ, cv);
    let z2 = substZ(lid + 2u * WG, nZ, cv);
    let z3 = substZ(lid + 3u * WG, nZ, cv);
    let z4 = substZ(lid + 4u * WG, nZ, cv);
    let z5 = substZ(lid + 5u * WG, nZ, cv);
    workgroupBarrier();
    if (lid < nZ) { prepSet(substZAt(lid), z0); }
    if (lid + WG < nZ) { prepSet(substZAt(lid + WG), z1); }
    if (lid + 2u * WG < nZ) { prepSet(substZAt(lid + 2u * WG), z2); }
    if (lid + 3u * WG < nZ) { prepSet(substZAt(lid + 3u * WG), z3); }
    if (lid + 4u * WG < nZ) { prepSet(substZAt(lid + 4u * WG), z4); }
    if (lid + 5u * WG < nZ) { prepSet(substZAt(lid + 5u * WG), z5); }
    workgroupBarrier();
  }
  for (var dist = 1u; dist < nb; dist++) {
    // (nb - dist) blocks (j + dist, j), 256 entries each, rows fastest
    for (var e = lid; e < (nb - dist) * 256u; e += WG) {
      let j0 = 16u * (e / 256u);
      let i0 = j0 + 16u * dist;
      let r = i0 + e % 16u;
      let col = j0 + (e / 16u) % 16u;
      // k = j: T_jj is unit lower, so its column col starts at row col with 1
      var acc = prepF(col * sub + r);
      for (var m = col + 1u; m < j0 + 16u; m++) {
        acc = fma(prepF(m * sub + r), prepF(m * sub + col), acc);
      }
      for (var m = j0 + 16u; m < i0; m++) {
        acc = fma(prepF(m * sub + r), prepF(m * sub + col), acc);
      }
      prepSet(r * sub + col, -acc);
    }
    workgroupBarrier();
  }
  // T (stored to tri) becomes T diag(beta) as vec4s of four rows per column (tQuad); each
  // invocation reads its four entries before any is overwritten
  let nTq = p.C * p.C / 4u;
  let tq0 = select(vec4f(0.0), tQuad(at, at.tri, lid), lid < nTq);
  let tq1 = select(vec4f(0.0), tQuad(at, at.tri, lid + WG), lid + WG < nTq);
  let tq2 = select(vec4f(0.0), tQuad(at, at.tri, lid + 2u * WG), lid + 2u * WG < nTq);
  let tq3 = select(vec4f(0.0), tQuad(at, at.tri, lid + 3u * WG), lid + 3u * WG < nTq);
  workgroupBarrier();
  if (lid < nTq) { prep[tSlot(lid)] = tq0; }
  if (lid + WG < nTq) { prep[tSlot(lid + WG)] = tq1; }
  if (lid + 2u * WG < nTq) { prep[tSlot(lid + 2u * WG)] = tq2; }
  if (lid + 3u * WG < nTq) { prep[tSlot(lid + 3u * WG)] = tq3; }
  // ABLATE subst }
  workgroupBarrier();

  // W = T diag(beta) (K (.) Gamma), U = T diag(beta) V as tiled products (common.wgsl's shape):
  // 4 rows x 8 columns an invocation over slices of the right operand staged as vec4s in the
  // last PREP_WU vec4s of prep (16 rows of 128 columns), all its loads issued at once;
  // T is lower triangular, so a tile stops at its last row. A turn takes all row quads of the
  // WG / (C / 4) 8-column groups it stages (at C = 64, 128 columns): W's turn reads K (.) Gamma
  // only in its own columns, so it may write W there when done. A run of w8 neighbouring
  // invocations shares a row quad (so a warp's tiles stop together, instead of every warp waiting
  // on its longest row) and takes neighbouring vec4 columns grp and grp + nq / 2 of the turn (so
  // their reads of the staged slice fall on different banks).
  let c4 = p.C / 4u;
  let w8 = WG / c4;
  let rq = lid / w8;
  let grp = lid % w8;
  // ABLATE wu {
  // Each slice is loaded a slice ahead (sd nq <= PREP_WU = 2 WG: two vec4s an invocation), the
  // first here: into registers before the product of the one before, staged behind its barrier.
  // The slice after a turn's last is the next turn's first. That is safe although W's turn
  // writes W over the K (.) Gamma it reads: its stores (after its product) reach only its own
  // columns (below 8 (j80 + w8)), the next W turn reads only its own (from 8 (j80 + w8)), and U's
  // turns read V.
  var wuNext = wuSlice(at, 0u, 0u, wuShape(0u, 0u, w8), lid);
  for (var which = 0u; which < 2u; which++) {
    let width = select(p.K, p.V, which == 1u);
    let nJ8 = (width + 7u) / 8u;
    for (var j80 = 0u; j80 < nJ8; j80 += w8) {
      let shape = wuShape(which, j80, w8);
      let q0 = shape.x;
      let nq = shape.y;
      let sd = shape.z;
      let half = nq / 2u;
      let mine = rq < nRG && grp < half;
      var acc = Tile8(mat4x4f(), mat4x4f());
      for (var s0 = 0u; s0 < cv; s0 += sd) {
        wuStage(lid, wuNext, sd * nq);
        workgroupBarrier();
        // the next slice: this turn's, else the next turn's first (none after U's last turn)
        var nWhich = which;
        var nJ80 = j80;
        var nS0 = s0 + sd;
        if (nS0 >= cv) {
          nS0 = 0u;
          nJ80 = j80 + w8;
          if (nJ80 >= nJ8) {
            nJ80 = 0u;
            nWhich = which + 1u;
          }
        }
        if (nWhich < 2u) {
          wuNext = wuSlice(at, nWhich, nS0, wuShape(nWhich, nJ80, w8), lid);
        }
        if (mine && 4u * rq + 4u > s0) {
          let n = min(min(sd, cv - s0), 4u * rq + 4u - s0);
          acc = prepSlice(acc, s0 * c4 + rq, c4, PREP_HALF + grp, nq, half, n);
        }
        workgroupBarrier();
      }
      let c0 = 4u * (q0 + grp);
      let c1 = 4u * (q0 + grp + half);
      if (mine && which == 0u) {
        workStoreRows(at.work + wW(), 4u * rq, c0, acc.t0, cv, width);
        workStoreRows(at.work + wW(), 4u * rq, c1, acc.t1, cv, width);
      }
      if (mine && which == 1u) {
        uStoreRows(at.u + uU(), 4u * rq, c0, acc.t0, cv, width);
        uStoreRows(at.u + uU(), 4u * rq, c1, acc.t1, cv, width);
      }
    }
  }
  // ABLATE wu }
}
