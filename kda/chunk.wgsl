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

// The module is three files, joined in this order by kda/gpu/device.ts: this one (numerics,
// shared helpers, intraChunk), kda/gpu/scans.wgsl (stateScan, stateScanBackward) and
// kda/gpu/intra_backward.wgsl (intraChunkBackward).
//
// The constants, the Params and ChunkRange structs, the bindings and every offset function
// (wG..wGam, bDVn, bDS, gKd..gBv, xQ..xH0, cDout, cDht, oO, oHt, dQ..dH0, sS and the *Size()
// functions) come from the header that kda/gpu/layout.ts generates and prepends at load.
//
// The chunks [n0, n1) one scan dispatch covers: the host splits the scans into several dispatches
// (one submit) because llvmpipe ends an invocation silently once it has run 65535 loop iterations
// in all its loops together. The tile carries over between dispatches through the ht (forward) or
// dh0 (backward) region of outp, which the last dispatch overwrites with the final value.

var<workgroup> wgm: array<f32, SHARED>;

// ---- numerics ----

// G is kept as an unevaluated sum hi + lo: a plain f32 cumsum of gates near -5 reaches |G| ~ 320,
// where its rounding error (~1e-5) would swamp the small differences G_r - G_s that the pairwise
// decays exponentiate. gateCumsum sums in 64-bit fixed point (integers: exact, and safe from the
// float reassociation that shader compilers may apply, which removes a TwoSum), then splits each
// G into hi, a multiple of 2^-8, and lo in [0, 2^-8). hi_r - hi_s is then exact, lo_r - lo_s is off
// by at most 2^-32, so G_r - G_s is accurate relative to itself (gateDiff, gammaOf below).

// e^x for the exponents here (x <= 0), to about 1 ulp. The built-in exp is allowed to be coarse
// (llvmpipe's is off by up to 6e-7 relative on [-6, 0], ten times f32's epsilon), which alone used
// most of the 2e-6 output budget at chunk size 64. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2,
// then a degree-7 Taylor polynomial (truncation below 1e-8 relative) and an exact scaling by 2^n.
// Below -103 the result is 0 or a denormal either way; clamping keeps n ln2_hi exact.
fn decay(x: f32) -> f32 {
  let xc = clamp(x, -103.0, 88.0);
  let n = round(xc * 1.4426950408889634);
  let r = (xc - n * 0.693145751953125) - n * 1.4286068203094172e-6;
  var poly = 1.0 / 5040.0;
  poly = poly * r + 1.0 / 720.0;
  poly = poly * r + 1.0 / 120.0;
  poly = poly * r + 1.0 / 24.0;
  poly = poly * r + 1.0 / 6.0;
  poly = poly * r + 0.5;
  poly = poly * r + 1.0;
  poly = poly * r + 1.0;
  return ldexp(poly, i32(n));
}

// e^x on four lanes, as decay().
fn decay4(x: vec4f) -> vec4f {
  let xc = clamp(x, vec4f(-103.0), vec4f(88.0));
  let n = round(xc * 1.4426950408889634);
  let r = (xc - n * 0.693145751953125) - n * 1.4286068203094172e-6;
  var poly = vec4f(1.0 / 5040.0);
  poly = poly * r + 1.0 / 720.0;
  poly = poly * r + 1.0 / 120.0;
  poly = poly * r + 1.0 / 24.0;
  poly = poly * r + 1.0 / 6.0;
  poly = poly * r + 0.5;
  poly = poly * r + 1.0;
  poly = poly * r + 1.0;
  return ldexp(poly, vec4<i32>(n));
}

// Four consecutive channels d.. of a work row (stride 1), zero past p.K.
fn workK4(row: u32, d: u32) -> vec4f {
  var v = vec4f(0.0);
  if (d < p.K) { v.x = work[row + d]; }
  if (d + 1u < p.K) { v.y = work[row + d + 1u]; }
  if (d + 2u < p.K) { v.z = work[row + d + 2u]; }
  if (d + 3u < p.K) { v.w = work[row + d + 3u]; }
  return v;
}
// Stores channels d.. of row `row` of a [C, K] work region, skipping a row >= cv.
fn workStoreK(region: u32, row: u32, d: u32, v: vec4f, cv: u32) {
  if (row >= cv) {
    return;
  }
  let at = region + row * p.K + d;
  if (d < p.K) { work[at] = v.x; }
  if (d + 1u < p.K) { work[at + 1u] = v.y; }
  if (d + 2u < p.K) { work[at + 2u] = v.z; }
  if (d + 3u < p.K) { work[at + 3u] = v.w; }
}
// Stores one row of a block of a [C, C] work region for columns s.. < cv, keeping the lower
// triangle (s <= row, or s < row when strict = 1) and writing zeros above it.
fn workStoreTri1(region: u32, row: u32, s: u32, v: vec4f, cv: u32, strict: u32) {
  if (row >= cv) {
    return;
  }
  let at = region + row * p.C + s;
  if (s < cv) { work[at] = select(0.0, v.x, s + strict <= row); }
  if (s + 1u < cv) { work[at + 1u] = select(0.0, v.y, s + 1u + strict <= row); }
  if (s + 2u < cv) { work[at + 2u] = select(0.0, v.z, s + 2u + strict <= row); }
  if (s + 3u < cv) { work[at + 3u] = select(0.0, v.w, s + 3u + strict <= row); }
}

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

fn groupIndex(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
  return wg.x + wg.y * nwg.x;
}

// Storage writes of one stage must be visible to every invocation of the workgroup in the next.
fn stageBarrier() {
  storageBarrier();
  workgroupBarrier();
}

// Where a chunk-parallel workgroup works: its batch entry, head, first token and valid rows
// (intraChunk and intraChunkBackward run one workgroup per (b, h, chunk)).
struct ChunkAt {
  b: u32,
  h: u32,
  t0: u32,
  cv: u32,
}

fn chunkAt(wid: u32) -> ChunkAt {
  let bh = wid / p.NC;
  let t0 = (wid % p.NC) * p.C;
  return ChunkAt(bh / p.H, bh % p.H, t0, min(p.C, p.T - t0));
}

// ---- forward, chunk-parallel: intraChunk ----

@compute @workgroup_size(256)
fn intraChunk(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let wid = groupIndex(wg, nwg);
  if (wid >= p.B * p.H * p.NC) {
    return;
  }
  let K = p.K;
  let V = p.V;
  let C = p.C;
  let at = chunkAt(wid);
  let b = at.b;
  let h = at.h;
  let t0 = at.t0;
  let cv = at.cv;
  let base = wid * workSize();

  // gateCumsum: G_r = sum_{s <= r} g_s, per channel, in token order, in fixed point with 40
  // fractional bits: a gate g becomes the integer pair (floor(256 g), frac(256 g) 2^32)
  // ABLATE cumsum {
  for (var d = lid; d < K; d += WG) {
    var accHi = 0i;
    var accLo = 0u;
    for (var r = 0u; r < cv; r++) {
      // A gate below -1000 decays to exactly 0 in f32 at any span it is part of; clamping it there
      // keeps |G| * 256 under 2^24 over a chunk of 64, so hi = f32(accHi) / 256 stays exact.
      let scaled = max(x[xG() + tok(b, t0 + r, h) * K + d], -1000.0) * 256.0;
      let whole = floor(scaled);
      let gateLo = u32((scaled - whole) * 4294967296.0);
      let lo = accLo + gateLo;
      accHi += i32(whole) + select(0i, 1i, lo < gateLo);
      accLo = lo;
      work[base + wG() + r * K + d] = f32(accHi) * (1.0 / 256.0);
      work[base + wGlo() + r * K + d] = f32(accLo) * (1.0 / 1099511627776.0);
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
  var l0 = vec4f(0.0);
  var l1 = vec4f(0.0);
  var l2 = vec4f(0.0);
  var l3 = vec4f(0.0);
  var p0 = vec4f(0.0);
  var p1 = vec4f(0.0);
  var p2 = vec4f(0.0);
  var p3 = vec4f(0.0);
  let stageK = 0u;
  let stageQ = C * LP_BLOCK;
  let stageGh = 2u * C * LP_BLOCK;
  let stageGl = 3u * C * LP_BLOCK;
  let last = cv - 1u;
  let ir0 = min(rb, last) * LP_BLOCK;
  let ir1 = min(rb + 1u, last) * LP_BLOCK;
  let ir2 = min(rb + 2u, last) * LP_BLOCK;
  let ir3 = min(rb + 3u, last) * LP_BLOCK;
  let is0 = min(sb, last) * LP_BLOCK;
  let is1 = min(sb + 1u, last) * LP_BLOCK;
  let is2 = min(sb + 2u, last) * LP_BLOCK;
  let is3 = min(sb + 3u, last) * LP_BLOCK;
  // ABLATE lp {
  for (var d0 = 0u; d0 < K; d0 += LP_BLOCK) {
    for (var e = lid; e < cv * LP_BLOCK; e += WG) {
      let r = e / LP_BLOCK;
      let d = d0 + e % LP_BLOCK;
      var kv = 0.0;
      var qv = 0.0;
      var gateHi = 0.0;
      var gateLo = 0.0;
      if (d < K) {
        let row = tok(b, t0 + r, h) * K + d;
        kv = x[xK() + row];
        qv = x[xQ() + row];
        gateHi = work[base + wG() + r * K + d];
        gateLo = work[base + wGlo() + r * K + d];
      }
      wgm[stageK + e] = kv;
      wgm[stageQ + e] = qv;
      wgm[stageGh + e] = gateHi;
      wgm[stageGl + e] = gateLo;
    }
    workgroupBarrier();
    if (inTriangle) {
      let dn = min(LP_BLOCK, K - d0);
      for (var dd = 0u; dd < dn; dd++) {
        let ks = vec4f(
          wgm[stageK + is0 + dd],
          wgm[stageK + is1 + dd],
          wgm[stageK + is2 + dd],
          wgm[stageK + is3 + dd],
        );
        let ghs = vec4f(
          wgm[stageGh + is0 + dd],
          wgm[stageGh + is1 + dd],
          wgm[stageGh + is2 + dd],
          wgm[stageGh + is3 + dd],
        );
        let gls = vec4f(
          wgm[stageGl + is0 + dd],
          wgm[stageGl + is1 + dd],
          wgm[stageGl + is2 + dd],
          wgm[stageGl + is3 + dd],
        );
        let ghr = vec4f(
          wgm[stageGh + ir0 + dd],
          wgm[stageGh + ir1 + dd],
          wgm[stageGh + ir2 + dd],
          wgm[stageGh + ir3 + dd],
        );
        let glr = vec4f(
          wgm[stageGl + ir0 + dd],
          wgm[stageGl + ir1 + dd],
          wgm[stageGl + ir2 + dd],
          wgm[stageGl + ir3 + dd],
        );
        let kr = vec4f(
          wgm[stageK + ir0 + dd],
          wgm[stageK + ir1 + dd],
          wgm[stageK + ir2 + dd],
          wgm[stageK + ir3 + dd],
        );
        let qr = vec4f(
          wgm[stageQ + ir0 + dd],
          wgm[stageQ + ir1 + dd],
          wgm[stageQ + ir2 + dd],
          wgm[stageQ + ir3 + dd],
        );
        var e0: vec4f;
        var e1: vec4f;
        var e2: vec4f;
        var e3: vec4f;
        if (diagonal) {
          e0 = ks * decay4((vec4f(ghr.x) - ghs) + (vec4f(glr.x) - gls));
          e1 = ks * decay4((vec4f(ghr.y) - ghs) + (vec4f(glr.y) - gls));
          e2 = ks * decay4((vec4f(ghr.z) - ghs) + (vec4f(glr.z) - gls));
          e3 = ks * decay4((vec4f(ghr.w) - ghs) + (vec4f(glr.w) - gls));
        } else {
          // rows to the anchor rb, and the anchor to the columns
          let rowF = decay4((ghr - vec4f(ghr.x)) + (glr - vec4f(glr.x)));
          let colE = ks * decay4((vec4f(ghr.x) - ghs) + (vec4f(glr.x) - gls));
          e0 = rowF.x * colE;
          e1 = rowF.y * colE;
          e2 = rowF.z * colE;
          e3 = rowF.w * colE;
        }
        l0 = fma(vec4f(kr.x), e0, l0);
        l1 = fma(vec4f(kr.y), e1, l1);
        l2 = fma(vec4f(kr.z), e2, l2);
        l3 = fma(vec4f(kr.w), e3, l3);
        p0 = fma(vec4f(qr.x), e0, p0);
        p1 = fma(vec4f(qr.y), e1, p1);
        p2 = fma(vec4f(qr.z), e2, p2);
        p3 = fma(vec4f(qr.w), e3, p3);
      }
    }
    workgroupBarrier();
  }
  // ABLATE lp }
  if (inTriangle) {
    let lRegion = base + wL();
    let pRegion = base + wP();
    let beta = vec4f(
      x[xBeta() + tok(b, t0 + min(rb, last), h)],
      x[xBeta() + tok(b, t0 + min(rb + 1u, last), h)],
      x[xBeta() + tok(b, t0 + min(rb + 2u, last), h)],
      x[xBeta() + tok(b, t0 + min(rb + 3u, last), h)],
    );
    workStoreTri1(lRegion, rb, sb, beta.x * l0, cv, 1u);
    workStoreTri1(lRegion, rb + 1u, sb, beta.y * l1, cv, 1u);
    workStoreTri1(lRegion, rb + 2u, sb, beta.z * l2, cv, 1u);
    workStoreTri1(lRegion, rb + 3u, sb, beta.w * l3, cv, 1u);
    workStoreTri1(pRegion, rb, sb, p.scale * p0, cv, 0u);
    workStoreTri1(pRegion, rb + 1u, sb, p.scale * p1, cv, 0u);
    workStoreTri1(pRegion, rb + 2u, sb, p.scale * p2, cv, 0u);
    workStoreTri1(pRegion, rb + 3u, sb, p.scale * p3, cv, 0u);
  }
  // the blocks above the diagonal
  for (var e = lid; e < cv * cv; e += WG) {
    let r = e / cv;
    let s = e % cv;
    if (s / 4u > r / 4u) {
      work[base + wL() + r * C + s] = 0.0;
      work[base + wP() + r * C + s] = 0.0;
    }
  }
  // gateFactors: Qg = scale Q (.) Gamma, Kg = K (.) Gamma (Kd = K (.) e^{G_C - G} after W)
  // ABLATE factors1 {
  for (var e = lid; e < cv * K; e += WG) {
    let r = e / K;
    let d = e % K;
    let row = tok(b, t0 + r, h) * K + d;
    let gam = gammaOf(base, r, d);
    work[base + wQg() + r * K + d] = p.scale * x[xQ() + row] * gam;
    // Kg = K (.) Gamma, held in the Kd region until W is built (Kd replaces it below)
    work[base + wKd() + r * K + d] = x[xK() + row] * gam;
  }
  // ABLATE factors1 }
  stageBarrier();

  // T = (I + L)^(-1) by forward substitution; each column solves (I + L) t = e_j on its own.
  // T lives in workgroup memory (C * C <= SHARED) while it is built: each step reads a column
  // entry written by the same invocation one step before.
  // ABLATE subst {
  for (var j = lid; j < cv; j += WG) {
    for (var i = 0u; i < j; i++) {
      wgm[i * C + j] = 0.0;
    }
    wgm[j * C + j] = 1.0;
    for (var i = j + 1u; i < cv; i++) {
      var acc = 0.0;
      for (var m = j; m < i; m++) {
        acc += work[base + wL() + i * C + m] * wgm[m * C + j];
      }
      wgm[i * C + j] = -acc;
    }
  }
  // ABLATE subst }
  workgroupBarrier();
  for (var e = lid; e < cv * cv; e += WG) {
    let i = e / cv;
    let j = e % cv;
    work[base + wT() + i * C + j] = wgm[i * C + j];
  }
  stageBarrier();

  // W = T diag(beta) (K (.) Gamma), U = T diag(beta) V: 4 rows r x 4 columns a block, T from
  // workgroup memory (T_rs = 0 for s > r, so the sum over s ends at the block's last row)
  let nDG = (K + 3u) / 4u;
  let nJG = (V + 3u) / 4u;
  // ABLATE wu {
  for (var blk = lid; blk < nRG * nDG; blk += WG) {
    let r = 4u * (blk / nDG);
    let d = 4u * (blk % nDG);
    let rc0 = min(r, last);
    let rc1 = min(r + 1u, last);
    let rc2 = min(r + 2u, last);
    let rc3 = min(r + 3u, last);
    var a0 = vec4f(0.0);
    var a1 = vec4f(0.0);
    var a2 = vec4f(0.0);
    var a3 = vec4f(0.0);
    for (var s = 0u; s <= rc3; s++) {
      let betaS = x[xBeta() + tok(b, t0 + s, h)];
      let kg = workK4(base + wKd() + s * K, d);
      a0 = fma(vec4f(wgm[rc0 * C + s] * betaS), kg, a0);
      a1 = fma(vec4f(wgm[rc1 * C + s] * betaS), kg, a1);
      a2 = fma(vec4f(wgm[rc2 * C + s] * betaS), kg, a2);
      a3 = fma(vec4f(wgm[rc3 * C + s] * betaS), kg, a3);
    }
    workStoreK(base + wW(), r, d, a0, cv);
    workStoreK(base + wW(), r + 1u, d, a1, cv);
    workStoreK(base + wW(), r + 2u, d, a2, cv);
    workStoreK(base + wW(), r + 3u, d, a3, cv);
  }
  // ABLATE wu }
  // ABLATE u {
  for (var blk = lid; blk < nRG * nJG; blk += WG) {
    let r = 4u * (blk / nJG);
    let j = 4u * (blk % nJG);
    let rc0 = min(r, last);
    let rc1 = min(r + 1u, last);
    let rc2 = min(r + 2u, last);
    let rc3 = min(r + 3u, last);
    var a0 = vec4f(0.0);
    var a1 = vec4f(0.0);
    var a2 = vec4f(0.0);
    var a3 = vec4f(0.0);
    for (var s = 0u; s <= rc3; s++) {
      let rowS = tok(b, t0 + s, h);
      let betaS = x[xBeta() + rowS];
      let vs = xCols(xV() + rowS * V, j);
      a0 = fma(vec4f(wgm[rc0 * C + s] * betaS), vs, a0);
      a1 = fma(vec4f(wgm[rc1 * C + s] * betaS), vs, a1);
      a2 = fma(vec4f(wgm[rc2 * C + s] * betaS), vs, a2);
      a3 = fma(vec4f(wgm[rc3 * C + s] * betaS), vs, a3);
    }
    if (r < cv) { workStoreCols(base + wU() + r * V, j, a0); }
    if (r + 1u < cv) { workStoreCols(base + wU() + (r + 1u) * V, j, a1); }
    if (r + 2u < cv) { workStoreCols(base + wU() + (r + 2u) * V, j, a2); }
    if (r + 3u < cv) { workStoreCols(base + wU() + (r + 3u) * V, j, a3); }
  }
  // ABLATE u }
  stageBarrier();
  // gateFactors, second half: Kd = K (.) e^{G_C - G} replaces Kg
  // ABLATE factors2 {
  for (var e = lid; e < cv * K; e += WG) {
    let r = e / K;
    let d = e % K;
    let row = tok(b, t0 + r, h) * K + d;
    work[base + wKd() + r * K + d] = x[xK() + row] * decay(gateDiff(base, cv - 1u, r, d));
  }
  // ABLATE factors2 }
}
