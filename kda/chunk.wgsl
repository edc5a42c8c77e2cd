// Chunked KDA on the GPU: the WGSL twin of kda/chunk.ts (docs/kda.md 2.2 and 2.3), f32 only.
//
// Four entry points, dispatched in one submit per direction; the stage names are those of
// kda/chunk.ts, so the two read side by side:
//   forward:   intraChunk         gateCumsum, gateFactors, pairwiseDecay and intraChunk (L, P,
//                                 T by forward substitution, W, U), chunk-parallel
//              stateScan          newValues, chunkOutput and stateScan, sequential over chunks
//   backward:  stateScanBackward  newValues (recomputed), the dS' chain of stateScanBackward,
//                                 chunkOutputBackward and newValuesBackward, sequential
//              intraChunkBackward the sums over V of those three stages, then wyBackward,
//                                 inverseBackward, elementwiseGrads, pairwiseGrads and
//                                 gateCumsumBackward, chunk-parallel
//
// Only L, P, T, W depend on k, g, beta, so the per-chunk work is chunk-parallel (one workgroup per
// (b, h, chunk)). The K x V state's V columns evolve independently, so the sequential scans run one
// workgroup per (b, h, V tile) and keep their K x VT tile in workgroup memory.
//
// Every exponent is a difference G_r - G_s with r >= s (or G_C - G_r), which is <= 0 for g <= 0,
// so nothing overflows however negative the gates are; e^{+G} is never formed.
// Every sum runs in one fixed loop order and nothing uses atomics: the same inputs give the same bits.
// Shapes arrive as uniforms, so each pipeline compiles once per device whatever the shape.
// Rows of a short last chunk (r >= cv) are never read or written.
// Lines "// ABLATE name {" and "// ABLATE name }" mark statements that bench/ablate.ts removes to
// time the rest (a profile by subtraction); they change nothing else.

// This file belongs to the "fused" kernel set (kda/gpu/kernels/fused/mod.ts), with
// kda/gpu/kernels/fused/scans.wgsl (stateScan, stateScanBackward) and
// kda/gpu/kernels/fused/intra_backward.wgsl (intraChunkBackward); it holds the set's chunk helpers
// and intraChunk. The set includes the shared WGSL by name (kda/gpu/kernels/shared.wgsl: the
// exact exp decay4, the gate sums, the tile helpers). The constants, the Params and ChunkRange
// structs, the bindings and every offset function (wG..wGam, bDVn, bDS, gKd..gBv, xQ..xH0, cDout,
// cDht, oO, oHt, dQ..dH0, sS and the *Size() functions) come from the header that
// kda/gpu/layout.ts generates from the set's declaration, and the vec4 accessors from
// kda/gpu/accessors.ts.
//
// The chunks [n0, n1) one scan dispatch covers: the host splits the scans into several dispatches
// (one submit) because llvmpipe ends an invocation silently once it has run 65535 loop iterations
// in all its loops together. The tile carries over between dispatches through the ht (forward) or
// dh0 (backward) region of outp, which the last dispatch overwrites with the final value.

var<workgroup> wgm: array<f32, SHARED>;

// G_rd - G_sd of the chunk at `base`, from the hi and lo parts (hi_r - hi_s is exact or nearly so)
fn gateDiff(base: u32, r: u32, s: u32, d: u32) -> f32 {
  let K = p.K;
  return (work[base + wG() + r * K + d] - work[base + wG() + s * K + d]) +
    (work[base + wGlo() + r * K + d] - work[base + wGlo() + s * K + d]);
}

// Gamma_rd = e^{G_rd}; the rounding of hi + lo costs |G| eps relative, below eps/e absolute
fn gammaOf(base: u32, r: u32, d: u32) -> f32 {
  let i = base + r * p.K + d;
  return decay(work[wG() + i] + work[wGlo() + i]);
}

// row index of token t of head h in batch b, in [B, T, H]
fn tok(b: u32, t: u32, h: u32) -> u32 {
  return (b * p.T + t) * p.H + h;
}


// Where a chunk-parallel workgroup works, from its id in the exact grid the host dispatches (x over
// chunks, y over heads, z over the batch; the scans' grid has V tiles in x): its (b, h, chunk) index wid, batch entry, head, first
// token and valid rows (intraChunk and intraChunkBackward run one workgroup per (b, h, chunk)).
struct ChunkAt {
  wid: u32,
  b: u32,
  h: u32,
  t0: u32,
  cv: u32,
}

fn chunkAt(wg: vec3u) -> ChunkAt {
  let n = wg.x;
  let h = wg.y;
  let b = wg.z;
  let t0 = n * p.C;
  return ChunkAt((b * p.H + h) * p.NC + n, b, h, t0, min(p.C, p.T - t0));
}

// The token row of row r of the chunk, and of four rows
fn tokAt(at: ChunkAt, r: u32) -> u32 {
  return tok(at.b, at.t0 + r, at.h);
}

fn tok4(at: ChunkAt, rows: vec4u) -> vec4u {
  return (vec4u(at.b * p.T + at.t0) + rows) * p.H + vec4u(at.h);
}

// ---- forward, chunk-parallel: intraChunk ----

@compute @workgroup_size(256)
fn intraChunk(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let at = chunkAt(wg);
  let cv = at.cv;
  let base = at.wid * workSize();

  // gateCumsum: G_r = sum_{s <= r} g_s, per channel, in token order, in fixed point (gateSumAdd)
  // ABLATE cumsum {
  for (var d = lid; d < p.K; d += WG) {
    var acc = GateSum(0i, 0u);
    for (var r = 0u; r < cv; r++) {
      acc = gateSumAdd(acc, x[xG() + tokAt(at, r) * p.K + d]);
      work[base + wG() + r * p.K + d] = gateSumHi(acc);
      work[base + wGlo() + r * p.K + d] = gateSumLo(acc);
    }
    work[base + wGam() + d] = gammaOf(base, cv - 1u, d);
  }
  // ABLATE cumsum }
  stageBarrier();

  // pairwiseDecay fused into intraChunk: E_rsd = e^{G_rd - G_sd} is formed inside the dot products
  // L (strictly lower, scaled by beta_r) and P (lower incl., scaled). Each invocation owns a 4 x 4
  // block of pairs (r, s) in named vec4 accumulators (rows r, lanes s); k, q and G are staged
  // LP_BLOCK channels at a time so that the reads of rows r and s come from workgroup memory.
  // Every pair still sums over d in ascending order.
  // A block strictly below the diagonal (s < rb <= r) factors E through its first row rb, which lies
  // between s and r: E_rsd = e^{G_rd - G_rbd} e^{G_rbd - G_sd}, both exponents <= 0, so 8 exps per
  // channel serve its 16 pairs. A diagonal block forms each pair's exponent directly. The
  // off-diagonal blocks take invocations 0..119, the diagonal ones 128..143, so that no warp mixes
  // the two paths. Blocks above the diagonal are zeros, written apart.
  let nRG = (cv + 3u) / 4u;
  let nOff = nRG * (nRG - 1u) / 2u;
  let diagonal = lid >= 128u;
  var rg = 0u;
  var sg = 0u;
  if (diagonal) {
    rg = lid - 128u;
    sg = rg;
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
  var lt = mat4x4f();
  var pt = mat4x4f();
  let stageK = 0u;
  let stageQ = p.C * LP_BLOCK;
  let stageGh = 2u * p.C * LP_BLOCK;
  let stageGl = 3u * p.C * LP_BLOCK;
  let last = cv - 1u;
  let ir = rows4(rb, last) * LP_BLOCK;
  let is = rows4(sb, last) * LP_BLOCK;
  // ABLATE lp {
  for (var d0 = 0u; d0 < p.K; d0 += LP_BLOCK) {
    for (var e = lid; e < cv * LP_BLOCK; e += WG) {
      let r = e / LP_BLOCK;
      let d = d0 + e % LP_BLOCK;
      var kv = 0.0;
      var qv = 0.0;
      var gateHi = 0.0;
      var gateLo = 0.0;
      if (d < p.K) {
        let row = tokAt(at, r) * p.K + d;
        kv = x[xK() + row];
        qv = x[xQ() + row];
        gateHi = work[base + wG() + r * p.K + d];
        gateLo = work[base + wGlo() + r * p.K + d];
      }
      wgm[stageK + e] = kv;
      wgm[stageQ + e] = qv;
      wgm[stageGh + e] = gateHi;
      wgm[stageGl + e] = gateLo;
    }
    workgroupBarrier();
    if (inTriangle) {
      let dn = min(LP_BLOCK, p.K - d0);
      for (var dd = 0u; dd < dn; dd++) {
        let ks = wgmAt4(stageK + dd, is);
        let ghs = wgmAt4(stageGh + dd, is);
        let gls = wgmAt4(stageGl + dd, is);
        let ghr = wgmAt4(stageGh + dd, ir);
        let glr = wgmAt4(stageGl + dd, ir);
        var e: mat4x4f;
        if (diagonal) {
          e = mat4x4f(
            ks * decay4((vec4f(ghr.x) - ghs) + (vec4f(glr.x) - gls)),
            ks * decay4((vec4f(ghr.y) - ghs) + (vec4f(glr.y) - gls)),
            ks * decay4((vec4f(ghr.z) - ghs) + (vec4f(glr.z) - gls)),
            ks * decay4((vec4f(ghr.w) - ghs) + (vec4f(glr.w) - gls)),
          );
        } else {
          // rows to the anchor rb, and the anchor to the columns
          let rowF = decay4((ghr - vec4f(ghr.x)) + (glr - vec4f(glr.x)));
          let colE = ks * decay4((vec4f(ghr.x) - ghs) + (vec4f(glr.x) - gls));
          e = mat4x4f(rowF.x * colE, rowF.y * colE, rowF.z * colE, rowF.w * colE);
        }
        lt = tileFmaRows(lt, wgmAt4(stageK + dd, ir), e);
        pt = tileFmaRows(pt, wgmAt4(stageQ + dd, ir), e);
      }
    }
    workgroupBarrier();
  }
  // ABLATE lp }
  if (inTriangle) {
    let beta = xAt4(xBeta(), tok4(at, rows4(rb, last)));
    workStoreTri(base + wL(), rb, sb, tileScaleRows(lt, beta), cv, 1u);
    workStoreTri(base + wP(), rb, sb, p.scale * pt, cv, 0u);
  }
  // the blocks above the diagonal
  for (var e = lid; e < cv * cv; e += WG) {
    let r = e / cv;
    let s = e % cv;
    if (s / 4u > r / 4u) {
      work[base + wL() + r * p.C + s] = 0.0;
      work[base + wP() + r * p.C + s] = 0.0;
    }
  }
  // gateFactors: Qg = scale Q (.) Gamma, Kg = K (.) Gamma (Kd = K (.) e^{G_C - G} after W)
  // ABLATE factors1 {
  for (var e = lid; e < cv * p.K; e += WG) {
    let r = e / p.K;
    let d = e % p.K;
    let row = tokAt(at, r) * p.K + d;
    let gam = gammaOf(base, r, d);
    work[base + wQg() + r * p.K + d] = p.scale * x[xQ() + row] * gam;
    // Kg = K (.) Gamma, held in the Kd region until W is built (Kd replaces it below)
    work[base + wKd() + r * p.K + d] = x[xK() + row] * gam;
  }
  // ABLATE factors1 }
  stageBarrier();

  // T = (I + L)^(-1) by forward substitution, T = I - L T with L strictly lower, one row of T
  // final per step: once row m is, every later row i takes its term, t_ij -= L_im t_mj for all
  // j <= m at once (up to 32 x 32 entries spread over the workgroup, a barrier per step), instead
  // of one invocation per column running its whole chain alone. Each entry still sums its terms
  // in ascending m. T lives in workgroup memory (C * C <= SHARED) while it is built.
  // ABLATE subst {
  for (var e = lid; e < cv * cv; e += WG) {
    let i = e / cv;
    let j = e % cv;
    wgm[i * p.C + j] = select(0.0, 1.0, i == j);
  }
  workgroupBarrier();
  for (var m = 0u; m + 1u < cv; m++) {
    let cols = m + 1u;
    for (var e = lid; e < (cv - cols) * cols; e += WG) {
      let i = cols + e / cols;
      let j = e % cols;
      wgm[i * p.C + j] -= work[base + wL() + i * p.C + m] * wgm[m * p.C + j];
    }
    workgroupBarrier();
  }
  // ABLATE subst }
  workgroupBarrier();
  for (var e = lid; e < cv * cv; e += WG) {
    let i = e / cv;
    let j = e % cv;
    work[base + wT() + i * p.C + j] = wgm[i * p.C + j];
  }
  stageBarrier();

  // W = T diag(beta) (K (.) Gamma), U = T diag(beta) V: 4 rows r x 4 columns a block, T from
  // workgroup memory (T_rs = 0 for s > r, so the sum over s ends at the block's last row)
  let nDG = (p.K + 3u) / 4u;
  let nJG = (p.V + 3u) / 4u;
  // ABLATE wu {
  for (var blk = lid; blk < nRG * nDG; blk += WG) {
    let blk4 = blockOf(blk, nDG, last);
    var w = mat4x4f();
    for (var s = 0u; s <= blk4.rows.w; s++) {
      let betaS = x[xBeta() + tokAt(at, s)];
      w = tileFma(w, wgmAt4(s, blk4.rows * p.C) * betaS, workK4(base + wKd() + s * p.K, blk4.c));
    }
    workStoreRows(base + wW(), blk4.r, blk4.c, w, cv, p.K);
  }
  // ABLATE wu }
  // ABLATE u {
  for (var blk = lid; blk < nRG * nJG; blk += WG) {
    let blk4 = blockOf(blk, nJG, last);
    var u = mat4x4f();
    for (var s = 0u; s <= blk4.rows.w; s++) {
      let rowS = tokAt(at, s);
      u = tileFma(u, wgmAt4(s, blk4.rows * p.C) * x[xBeta() + rowS], xCols(xV() + rowS * p.V, blk4.c));
    }
    workStoreRows(base + wU(), blk4.r, blk4.c, u, cv, p.V);
  }
  // ABLATE u }
  stageBarrier();
  // gateFactors, second half: Kd = K (.) e^{G_C - G} replaces Kg
  // ABLATE factors2 {
  for (var e = lid; e < cv * p.K; e += WG) {
    let r = e / p.K;
    let d = e % p.K;
    let row = tokAt(at, r) * p.K + d;
    work[base + wKd() + r * p.K + d] = x[xK() + row] * decay(gateDiff(base, cv - 1u, r, d));
  }
  // ABLATE factors2 }
}
