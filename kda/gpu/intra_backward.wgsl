// The chunk-parallel backward of the gpu arm (intraChunkBackward): the third of the three WGSL
// files that kda/gpu/device.ts joins, in order, after the generated layout header:
// kda/chunk.wgsl, kda/gpu/scans.wgsl, kda/gpu/intra_backward.wgsl (one module; see chunk.wgsl).

// ---- register-tile helpers of intraChunkBackward ----

// Four consecutive channels d.. of a row at `row` (stride 1), zero past p.K.
fn statesK4(row: u32, d: u32) -> vec4f {
  var v = vec4f(0.0);
  if (d < p.K) { v.x = states[row + d]; }
  if (d + 1u < p.K) { v.y = states[row + d + 1u]; }
  if (d + 2u < p.K) { v.z = states[row + d + 2u]; }
  if (d + 3u < p.K) { v.w = states[row + d + 3u]; }
  return v;
}
fn bwK4(row: u32, d: u32) -> vec4f {
  var v = vec4f(0.0);
  if (d < p.K) { v.x = bw[row + d]; }
  if (d + 1u < p.K) { v.y = bw[row + d + 1u]; }
  if (d + 2u < p.K) { v.z = bw[row + d + 2u]; }
  if (d + 3u < p.K) { v.w = bw[row + d + 3u]; }
  return v;
}
fn gsK4(row: u32, d: u32) -> vec4f {
  var v = vec4f(0.0);
  if (d < p.K) { v.x = gs[row + d]; }
  if (d + 1u < p.K) { v.y = gs[row + d + 1u]; }
  if (d + 2u < p.K) { v.z = gs[row + d + 2u]; }
  if (d + 3u < p.K) { v.w = gs[row + d + 3u]; }
  return v;
}
fn bwCols(row: u32, j: u32) -> vec4f {
  var v = vec4f(0.0);
  if (j < p.V) { v.x = bw[row + j]; }
  if (j + 1u < p.V) { v.y = bw[row + j + 1u]; }
  if (j + 2u < p.V) { v.z = bw[row + j + 2u]; }
  if (j + 3u < p.V) { v.w = bw[row + j + 3u]; }
  return v;
}
// gs[row + c] for four (clamped) columns
fn gsRow4(row: u32, c0: u32, c1: u32, c2: u32, c3: u32) -> vec4f {
  return vec4f(gs[row + c0], gs[row + c1], gs[row + c2], gs[row + c3]);
}
// Stores one row of a block: channels d.. of row `row` of a [C, width] region, skipping a row
// >= cv and channels >= width.
fn gsStoreRow1(region: u32, row: u32, d: u32, v: vec4f, cv: u32, width: u32) {
  if (row >= cv) {
    return;
  }
  let at = region + row * width + d;
  if (d < width) { gs[at] = v.x; }
  if (d + 1u < width) { gs[at + 1u] = v.y; }
  if (d + 2u < width) { gs[at + 2u] = v.z; }
  if (d + 3u < width) { gs[at + 3u] = v.w; }
}
// Stores a 4 x 4 block (rows r.., channels d..) of a [C, width] region.
fn gsStoreRow(region: u32, r: u32, d: u32, v0: vec4f, v1: vec4f, v2: vec4f, v3: vec4f, cv: u32, width: u32) {
  gsStoreRow1(region, r, d, v0, cv, width);
  gsStoreRow1(region, r + 1u, d, v1, cv, width);
  gsStoreRow1(region, r + 2u, d, v2, cv, width);
  gsStoreRow1(region, r + 3u, d, v3, cv, width);
}
// Stores one row of a block of a [C, C] region for columns s.. < cv, keeping the lower triangle
// (s <= row, or s < row when strict = 1) and writing zeros above it.
fn gsStoreTri1(region: u32, row: u32, s: u32, v: vec4f, cv: u32, strict: u32) {
  if (row >= cv) {
    return;
  }
  let at = region + row * p.C + s;
  if (s < cv) { gs[at] = select(0.0, v.x, s + strict <= row); }
  if (s + 1u < cv) { gs[at + 1u] = select(0.0, v.y, s + 1u + strict <= row); }
  if (s + 2u < cv) { gs[at + 2u] = select(0.0, v.z, s + 2u + strict <= row); }
  if (s + 3u < cv) { gs[at + 3u] = select(0.0, v.w, s + 3u + strict <= row); }
}
// Stores a 4 x 4 block (rows r.., columns s..) of a lower-triangular [C, C] region.
fn gsStoreTri(region: u32, r: u32, s: u32, v0: vec4f, v1: vec4f, v2: vec4f, v3: vec4f, cv: u32, strict: u32) {
  gsStoreTri1(region, r, s, v0, cv, strict);
  gsStoreTri1(region, r + 1u, s, v1, cv, strict);
  gsStoreTri1(region, r + 2u, s, v2, cv, strict);
  gsStoreTri1(region, r + 3u, s, v3, cv, strict);
}

// Four consecutive channels d.. of an x row (stride 1), zero past p.K.
fn xK4(row: u32, d: u32) -> vec4f {
  var v = vec4f(0.0);
  if (d < p.K) { v.x = x[row + d]; }
  if (d + 1u < p.K) { v.y = x[row + d + 1u]; }
  if (d + 2u < p.K) { v.z = x[row + d + 2u]; }
  if (d + 3u < p.K) { v.w = x[row + d + 3u]; }
  return v;
}
fn outpStoreK(at: u32, d: u32, v: vec4f) {
  if (d < p.K) { outp[at + d] = v.x; }
  if (d + 1u < p.K) { outp[at + d + 1u] = v.y; }
  if (d + 2u < p.K) { outp[at + d + 2u] = v.z; }
  if (d + 3u < p.K) { outp[at + d + 3u] = v.w; }
}

// elementwiseGrads for one row r (token row `row`) and channels d..: dq and dk into outp; the
// dG pieces, the K half of dbeta and x_r = dKd (.) K (.) e^{G_C - G} into gs (the last two reuse
// the dKb and dKd slots, which only this row's invocation reads). x_r enters dG_r with a minus and
// dG_C with a plus; dg_t sums dG_r for r >= t and dG_C, so the x_r of rows r >= t cancel exactly:
// they are left out of both, and Stage F adds the x_r of rows r < t alone (no cancellation in f32).
fn elementwiseGrads(
  gBase: u32,
  outDq: u32,
  outDk: u32,
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
  let betaR = x[xBeta() + row];
  let dPrr = gs[gBase + gP() + r * p.C + r];
  let gam = decay4(gh + gl);
  let ed = decay4((ghL - gh) + (glL - gl));
  let dQg = gsK4(gBase + gQg() + r * K, d);
  let dKb = gsK4(gBase + gKb() + r * K, d);
  let dKd = gsK4(gBase + gKd() + r * K, d);
  let pairL = betaR * rowL;
  let pairP = p.scale * rowP;
  let colSum = colL + p.scale * colP;
  outpStoreK(outDq + row * K, d, dQg * gam + pairP + p.scale * dPrr * kr);
  outpStoreK(
    outDk + row * K,
    d,
    betaR * dKb * gam + dKd * ed + pairL + colSum + p.scale * dPrr * qr,
  );
  gsStoreRow1(
    gBase + gG(),
    r,
    d,
    (dQg * qr + betaR * dKb * kr) * gam + kr * pairL + qr * pairP - kr * colSum,
    cv,
    K,
  );
  gsStoreRow1(gBase + gKb(), r, d, dKb * kr * gam + kr * rowL, cv, K);
  gsStoreRow1(gBase + gKd(), r, d, dKd * kr * ed, cv, K);
}

// ---- backward, chunk-parallel: intraChunkBackward ----

@compute @workgroup_size(256)
fn intraChunkBackward(
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
  let sBlock = wid * stateSize();
  let sBase = sBlock + sS();
  let bBase = wid * bwSize();
  let gBase = wid * gsSize();
  let outDq = dQ();
  let outDk = dK();
  let outDv = dV();
  let outDg = dG();
  let outDbeta = dBeta();

  // Register tiles: a block is 4 rows x 4 columns (one vec4 per row, named accumulators); blocks
  // are spread over the invocations, rows past cv are clamped for reads and never stored. Each
  // sum keeps the reference's order; terms outside a triangle are exact zeros of T or P.
  let nRG = (cv + 3u) / 4u;
  let nDG = (K + 3u) / 4u;
  let nJG = (V + 3u) / 4u;
  let last = cv - 1u;

  // Stage A, the sums over V of stateScanBackward, chunkOutputBackward, newValuesBackward and
  // wyBackward: dKd = Vn dS'^T, dQg = scale dO S^T, dW = -dVn S^T (4 rows x 4 channels a block)
  // ABLATE bA {
  for (var blk = lid; blk < nRG * nDG; blk += WG) {
    let r = 4u * (blk / nDG);
    let d = 4u * (blk % nDG);
    let rc0 = min(r, last);
    let rc1 = min(r + 1u, last);
    let rc2 = min(r + 2u, last);
    let rc3 = min(r + 3u, last);
    let o0 = cDout() + tok(b, t0 + rc0, h) * V;
    let o1 = cDout() + tok(b, t0 + rc1, h) * V;
    let o2 = cDout() + tok(b, t0 + rc2, h) * V;
    let o3 = cDout() + tok(b, t0 + rc3, h) * V;
    var k0 = vec4f(0.0);
    var k1 = vec4f(0.0);
    var k2 = vec4f(0.0);
    var k3 = vec4f(0.0);
    var q0 = vec4f(0.0);
    var q1 = vec4f(0.0);
    var q2 = vec4f(0.0);
    var q3 = vec4f(0.0);
    var w0 = vec4f(0.0);
    var w1 = vec4f(0.0);
    var w2 = vec4f(0.0);
    var w3 = vec4f(0.0);
    for (var j = 0u; j < V; j++) {
      let sd = statesK4(sBase + j * K, d);
      let ds = bwK4(bBase + bDS() + j * K, d);
      k0 = fma(vec4f(states[sBlock + sVn() + rc0 * V + j]), ds, k0);
      k1 = fma(vec4f(states[sBlock + sVn() + rc1 * V + j]), ds, k1);
      k2 = fma(vec4f(states[sBlock + sVn() + rc2 * V + j]), ds, k2);
      k3 = fma(vec4f(states[sBlock + sVn() + rc3 * V + j]), ds, k3);
      q0 = fma(vec4f(cot[o0 + j]), sd, q0);
      q1 = fma(vec4f(cot[o1 + j]), sd, q1);
      q2 = fma(vec4f(cot[o2 + j]), sd, q2);
      q3 = fma(vec4f(cot[o3 + j]), sd, q3);
      w0 = fma(vec4f(bw[bBase + bDVn() + rc0 * V + j]), sd, w0);
      w1 = fma(vec4f(bw[bBase + bDVn() + rc1 * V + j]), sd, w1);
      w2 = fma(vec4f(bw[bBase + bDVn() + rc2 * V + j]), sd, w2);
      w3 = fma(vec4f(bw[bBase + bDVn() + rc3 * V + j]), sd, w3);
    }
    gsStoreRow(gBase + gKd(), r, d, k0, k1, k2, k3, cv, K);
    gsStoreRow(gBase + gQg(), r, d, p.scale * q0, p.scale * q1, p.scale * q2, p.scale * q3, cv, K);
    gsStoreRow(gBase + gW(), r, d, -w0, -w1, -w2, -w3, cv, K);
  }
  // ABLATE bA }
  // Kg = K (.) Gamma for wyBackward, held in the dG region until Stage E writes dG there
  // ABLATE bKg {
  for (var e = lid; e < cv * K; e += WG) {
    let r = e / K;
    let d = e % K;
    gs[gBase + gG() + r * K + d] = x[xK() + tok(b, t0 + r, h) * K + d] * gammaOf(base, r, d);
  }
  // ABLATE bKg }
  // dgamma_C = rowsum(S (.) dS')
  for (var d = lid; d < K; d += WG) {
    var acc = 0.0;
    for (var j = 0u; j < V; j++) {
      acc += states[sBase + j * K + d] * bw[bBase + bDS() + j * K + d];
    }
    gs[gBase + gGam() + d] = acc;
  }
  // dP = lower_incl(dO Vn^T), M = lower_incl(dVn V^T) (4 rows r x 4 columns s a block)
  // ABLATE bPM {
  for (var blk = lid; blk < nRG * nRG; blk += WG) {
    let r = 4u * (blk / nRG);
    let s = 4u * (blk % nRG);
    let rc0 = min(r, last);
    let rc1 = min(r + 1u, last);
    let rc2 = min(r + 2u, last);
    let rc3 = min(r + 3u, last);
    let sc0 = min(s, last);
    let sc1 = min(s + 1u, last);
    let sc2 = min(s + 2u, last);
    let sc3 = min(s + 3u, last);
    let o0 = cDout() + tok(b, t0 + rc0, h) * V;
    let o1 = cDout() + tok(b, t0 + rc1, h) * V;
    let o2 = cDout() + tok(b, t0 + rc2, h) * V;
    let o3 = cDout() + tok(b, t0 + rc3, h) * V;
    let v0 = xV() + tok(b, t0 + sc0, h) * V;
    let v1 = xV() + tok(b, t0 + sc1, h) * V;
    let v2 = xV() + tok(b, t0 + sc2, h) * V;
    let v3 = xV() + tok(b, t0 + sc3, h) * V;
    var p0 = vec4f(0.0);
    var p1 = vec4f(0.0);
    var p2 = vec4f(0.0);
    var p3 = vec4f(0.0);
    var m0 = vec4f(0.0);
    var m1 = vec4f(0.0);
    var m2 = vec4f(0.0);
    var m3 = vec4f(0.0);
    for (var j = 0u; j < V; j++) {
      let vn = vec4f(
        states[sBlock + sVn() + sc0 * V + j],
        states[sBlock + sVn() + sc1 * V + j],
        states[sBlock + sVn() + sc2 * V + j],
        states[sBlock + sVn() + sc3 * V + j],
      );
      let vv = vec4f(x[v0 + j], x[v1 + j], x[v2 + j], x[v3 + j]);
      p0 = fma(vec4f(cot[o0 + j]), vn, p0);
      p1 = fma(vec4f(cot[o1 + j]), vn, p1);
      p2 = fma(vec4f(cot[o2 + j]), vn, p2);
      p3 = fma(vec4f(cot[o3 + j]), vn, p3);
      m0 = fma(vec4f(bw[bBase + bDVn() + rc0 * V + j]), vv, m0);
      m1 = fma(vec4f(bw[bBase + bDVn() + rc1 * V + j]), vv, m1);
      m2 = fma(vec4f(bw[bBase + bDVn() + rc2 * V + j]), vv, m2);
      m3 = fma(vec4f(bw[bBase + bDVn() + rc3 * V + j]), vv, m3);
    }
    gsStoreTri(gBase + gP(), r, s, p0, p1, p2, p3, cv, 0u);
    gsStoreTri(gBase + gM(), r, s, m0, m1, m2, m3, cv, 0u);
  }
  // ABLATE bPM }
  // dV = beta (.) T^T dVn (4 rows s x 4 columns j a block; T_rs = 0 for r < s)
  // ABLATE bdV {
  for (var blk = lid; blk < nRG * nJG; blk += WG) {
    let s = 4u * (blk / nJG);
    let j = 4u * (blk % nJG);
    let sc0 = min(s, last);
    let sc1 = min(s + 1u, last);
    let sc2 = min(s + 2u, last);
    let sc3 = min(s + 3u, last);
    var a0 = vec4f(0.0);
    var a1 = vec4f(0.0);
    var a2 = vec4f(0.0);
    var a3 = vec4f(0.0);
    for (var r = s; r < cv; r++) {
      let dv = bwCols(bBase + bDVn() + r * V, j);
      let tRow = base + wT() + r * C;
      a0 = fma(vec4f(work[tRow + sc0]), dv, a0);
      a1 = fma(vec4f(work[tRow + sc1]), dv, a1);
      a2 = fma(vec4f(work[tRow + sc2]), dv, a2);
      a3 = fma(vec4f(work[tRow + sc3]), dv, a3);
    }
    let row0 = tok(b, t0 + sc0, h);
    let row1 = tok(b, t0 + sc1, h);
    let row2 = tok(b, t0 + sc2, h);
    let row3 = tok(b, t0 + sc3, h);
    if (s < cv) { outpStoreCols(outDv + row0 * V, j, x[xBeta() + row0] * a0); }
    if (s + 1u < cv) { outpStoreCols(outDv + row1 * V, j, x[xBeta() + row1] * a1); }
    if (s + 2u < cv) { outpStoreCols(outDv + row2 * V, j, x[xBeta() + row2] * a2); }
    if (s + 3u < cv) { outpStoreCols(outDv + row3 * V, j, x[xBeta() + row3] * a3); }
  }
  // ABLATE bdV }
  stageBarrier();

  // Stage B, wyBackward: dT = dW Kb^T + dU Vb^T (strictly lower part only: dL needs no more),
  // with dW Kb^T = (dW Kg^T) diag(beta), Kg from the dG region; 4 rows r x 4 columns s a block
  // ABLATE bdT {
  for (var blk = lid; blk < nRG * nRG; blk += WG) {
    let r = 4u * (blk / nRG);
    let s = 4u * (blk % nRG);
    let rc0 = min(r, last);
    let rc1 = min(r + 1u, last);
    let rc2 = min(r + 2u, last);
    let rc3 = min(r + 3u, last);
    let sc0 = min(s, last);
    let sc1 = min(s + 1u, last);
    let sc2 = min(s + 2u, last);
    let sc3 = min(s + 3u, last);
    var a0 = vec4f(0.0);
    var a1 = vec4f(0.0);
    var a2 = vec4f(0.0);
    var a3 = vec4f(0.0);
    for (var d = 0u; d < K; d++) {
      let kg = vec4f(
        gs[gBase + gG() + sc0 * K + d],
        gs[gBase + gG() + sc1 * K + d],
        gs[gBase + gG() + sc2 * K + d],
        gs[gBase + gG() + sc3 * K + d],
      );
      a0 = fma(vec4f(gs[gBase + gW() + rc0 * K + d]), kg, a0);
      a1 = fma(vec4f(gs[gBase + gW() + rc1 * K + d]), kg, a1);
      a2 = fma(vec4f(gs[gBase + gW() + rc2 * K + d]), kg, a2);
      a3 = fma(vec4f(gs[gBase + gW() + rc3 * K + d]), kg, a3);
    }
    let beta = vec4f(
      x[xBeta() + tok(b, t0 + sc0, h)],
      x[xBeta() + tok(b, t0 + sc1, h)],
      x[xBeta() + tok(b, t0 + sc2, h)],
      x[xBeta() + tok(b, t0 + sc3, h)],
    );
    let mRow = gBase + gM();
    a0 = beta * (a0 + gsRow4(mRow + rc0 * C, sc0, sc1, sc2, sc3));
    a1 = beta * (a1 + gsRow4(mRow + rc1 * C, sc0, sc1, sc2, sc3));
    a2 = beta * (a2 + gsRow4(mRow + rc2 * C, sc0, sc1, sc2, sc3));
    a3 = beta * (a3 + gsRow4(mRow + rc3 * C, sc0, sc1, sc2, sc3));
    gsStoreTri(gBase + gT(), r, s, a0, a1, a2, a3, cv, 1u);
  }
  // ABLATE bdT }
  // dKb = T^T dW (4 rows s x 4 channels a block; T_rs = 0 for r < s)
  // ABLATE bKb {
  for (var blk = lid; blk < nRG * nDG; blk += WG) {
    let s = 4u * (blk / nDG);
    let d = 4u * (blk % nDG);
    let sc0 = min(s, last);
    let sc1 = min(s + 1u, last);
    let sc2 = min(s + 2u, last);
    let sc3 = min(s + 3u, last);
    var a0 = vec4f(0.0);
    var a1 = vec4f(0.0);
    var a2 = vec4f(0.0);
    var a3 = vec4f(0.0);
    for (var r = s; r < cv; r++) {
      let dw = gsK4(gBase + gW() + r * K, d);
      let tRow = base + wT() + r * C;
      a0 = fma(vec4f(work[tRow + sc0]), dw, a0);
      a1 = fma(vec4f(work[tRow + sc1]), dw, a1);
      a2 = fma(vec4f(work[tRow + sc2]), dw, a2);
      a3 = fma(vec4f(work[tRow + sc3]), dw, a3);
    }
    gsStoreRow(gBase + gKb(), s, d, a0, a1, a2, a3, cv, K);
  }
  // ABLATE bKb }
  // the V half of dbeta, sum_{r >= s} T_rs M_rs
  for (var s = lid; s < cv; s += WG) {
    var acc = 0.0;
    for (var r = s; r < cv; r++) {
      acc += work[base + wT() + r * C + s] * gs[gBase + gM() + r * C + s];
    }
    gs[gBase + gBv() + s] = acc;
  }
  stageBarrier();

  // Stage C, inverseBackward: X = dT T^T for a > s (T lower, dT strictly lower: b <= s; the
  // terms past a row's own s are zeros of T). 4 rows a x 4 columns s a block
  // ABLATE bC {
  for (var blk = lid; blk < nRG * nRG; blk += WG) {
    let a = 4u * (blk / nRG);
    let s = 4u * (blk % nRG);
    let ac0 = min(a, last);
    let ac1 = min(a + 1u, last);
    let ac2 = min(a + 2u, last);
    let ac3 = min(a + 3u, last);
    let sc0 = min(s, last);
    let sc1 = min(s + 1u, last);
    let sc2 = min(s + 2u, last);
    let sc3 = min(s + 3u, last);
    var a0 = vec4f(0.0);
    var a1 = vec4f(0.0);
    var a2 = vec4f(0.0);
    var a3 = vec4f(0.0);
    for (var bb = 0u; bb <= sc3; bb++) {
      let t = vec4f(
        work[base + wT() + sc0 * C + bb],
        work[base + wT() + sc1 * C + bb],
        work[base + wT() + sc2 * C + bb],
        work[base + wT() + sc3 * C + bb],
      );
      a0 = fma(vec4f(gs[gBase + gT() + ac0 * C + bb]), t, a0);
      a1 = fma(vec4f(gs[gBase + gT() + ac1 * C + bb]), t, a1);
      a2 = fma(vec4f(gs[gBase + gT() + ac2 * C + bb]), t, a2);
      a3 = fma(vec4f(gs[gBase + gT() + ac3 * C + bb]), t, a3);
    }
    gsStoreTri(gBase + gX(), a, s, a0, a1, a2, a3, cv, 1u);
  }
  // ABLATE bC }
  stageBarrier();

  // Stage D, inverseBackward: dL = strict_lower(-T^T X); 4 rows r x 4 columns s a block
  // (T_ar = 0 for a < r, so the sum over a starts at the block's first row)
  // ABLATE bD {
  for (var blk = lid; blk < nRG * nRG; blk += WG) {
    let r = 4u * (blk / nRG);
    let s = 4u * (blk % nRG);
    let rc0 = min(r, last);
    let rc1 = min(r + 1u, last);
    let rc2 = min(r + 2u, last);
    let rc3 = min(r + 3u, last);
    let sc0 = min(s, last);
    let sc1 = min(s + 1u, last);
    let sc2 = min(s + 2u, last);
    let sc3 = min(s + 3u, last);
    var a0 = vec4f(0.0);
    var a1 = vec4f(0.0);
    var a2 = vec4f(0.0);
    var a3 = vec4f(0.0);
    for (var a = r; a < cv; a++) {
      let xs = gsRow4(gBase + gX() + a * C, sc0, sc1, sc2, sc3);
      let tRow = base + wT() + a * C;
      a0 = fma(vec4f(work[tRow + rc0]), xs, a0);
      a1 = fma(vec4f(work[tRow + rc1]), xs, a1);
      a2 = fma(vec4f(work[tRow + rc2]), xs, a2);
      a3 = fma(vec4f(work[tRow + rc3]), xs, a3);
    }
    gsStoreTri(gBase + gL(), r, s, -a0, -a1, -a2, -a3, cv, 1u);
  }
  // ABLATE bD }
  stageBarrier();

  // Stage E, elementwiseGrads + pairwiseGrads: the pieces of dq, dk, dG and dbeta, a block of 4
  // rows r.. x 4 channels d.. at a time. The pairwise sums factor E through an anchor row inside
  // the block, so that each row outside the block costs one vec4 exp for all 16 entries:
  //   rows s < r:       E_{r_i s} = e^{G_ri - G_r} e^{G_r - G_s}          (anchor r, the first row)
  //   rows r' > r_last: E_{r' r_i} = e^{G_r' - G_rlast} e^{G_rlast - G_ri} (anchor the last row)
  // Every exponent is <= 0. Pairs inside the block are formed directly. The diagonal s = r has
  // E = 1 and is added apart: its two contributions to dG (at both ends of the pair) cancel
  // exactly and are left out.
  // ABLATE bE {
  for (var blk = lid; blk < nRG * nDG; blk += WG) {
    let r = 4u * (blk / nDG);
    let d = 4u * (blk % nDG);
    let rc1 = min(r + 1u, last);
    let rc2 = min(r + 2u, last);
    let rc3 = min(r + 3u, last);
    let gh0 = workK4(base + wG() + r * K, d);
    let gh1 = workK4(base + wG() + rc1 * K, d);
    let gh2 = workK4(base + wG() + rc2 * K, d);
    let gh3 = workK4(base + wG() + rc3 * K, d);
    let gl0 = workK4(base + wGlo() + r * K, d);
    let gl1 = workK4(base + wGlo() + rc1 * K, d);
    let gl2 = workK4(base + wGlo() + rc2 * K, d);
    let gl3 = workK4(base + wGlo() + rc3 * K, d);
    // the six pairs inside the block, e_ij = e^{G_i - G_j}, i > j
    let e10 = decay4((gh1 - gh0) + (gl1 - gl0));
    let e20 = decay4((gh2 - gh0) + (gl2 - gl0));
    let e30 = decay4((gh3 - gh0) + (gl3 - gl0));
    let e21 = decay4((gh2 - gh1) + (gl2 - gl1));
    let e31 = decay4((gh3 - gh1) + (gl3 - gl1));
    let e32 = decay4((gh3 - gh2) + (gl3 - gl2));
    let row0 = tok(b, t0 + r, h);
    let row1 = tok(b, t0 + rc1, h);
    let row2 = tok(b, t0 + rc2, h);
    let row3 = tok(b, t0 + rc3, h);
    let k0 = xK4(xK() + row0 * K, d);
    let k1 = xK4(xK() + row1 * K, d);
    let k2 = xK4(xK() + row2 * K, d);
    let k3 = xK4(xK() + row3 * K, d);
    let q0 = xK4(xQ() + row0 * K, d);
    let q1 = xK4(xQ() + row1 * K, d);
    let q2 = xK4(xQ() + row2 * K, d);
    let q3 = xK4(xQ() + row3 * K, d);
    let lReg = gBase + gL();
    let pReg = gBase + gP();

    // row terms: sum_{s < r_i} dL_{r_i s} k_s E_{r_i s} (and the same with dP)
    var rl0 = vec4f(0.0);
    var rl1 = vec4f(0.0);
    var rl2 = vec4f(0.0);
    var rl3 = vec4f(0.0);
    var rp0 = vec4f(0.0);
    var rp1 = vec4f(0.0);
    var rp2 = vec4f(0.0);
    var rp3 = vec4f(0.0);
    for (var s = 0u; s < r; s++) {
      let gs4 = workK4(base + wG() + s * K, d);
      let gls4 = workK4(base + wGlo() + s * K, d);
      let ks = xK4(xK() + tok(b, t0 + s, h) * K, d) * decay4((gh0 - gs4) + (gl0 - gls4));
      rl0 = fma(vec4f(gs[lReg + r * C + s]), ks, rl0);
      rl1 = fma(vec4f(gs[lReg + rc1 * C + s]), ks, rl1);
      rl2 = fma(vec4f(gs[lReg + rc2 * C + s]), ks, rl2);
      rl3 = fma(vec4f(gs[lReg + rc3 * C + s]), ks, rl3);
      rp0 = fma(vec4f(gs[pReg + r * C + s]), ks, rp0);
      rp1 = fma(vec4f(gs[pReg + rc1 * C + s]), ks, rp1);
      rp2 = fma(vec4f(gs[pReg + rc2 * C + s]), ks, rp2);
      rp3 = fma(vec4f(gs[pReg + rc3 * C + s]), ks, rp3);
    }
    // through the anchor, then the pairs inside the block (s = r, r + 1, r + 2)
    rl1 = e10 * rl1 + gs[lReg + rc1 * C + r] * (k0 * e10);
    rp1 = e10 * rp1 + gs[pReg + rc1 * C + r] * (k0 * e10);
    rl2 = e20 * rl2 + gs[lReg + rc2 * C + r] * (k0 * e20) + gs[lReg + rc2 * C + rc1] * (k1 * e21);
    rp2 = e20 * rp2 + gs[pReg + rc2 * C + r] * (k0 * e20) + gs[pReg + rc2 * C + rc1] * (k1 * e21);
    rl3 = e30 * rl3 + gs[lReg + rc3 * C + r] * (k0 * e30) + gs[lReg + rc3 * C + rc1] * (k1 * e31) +
      gs[lReg + rc3 * C + rc2] * (k2 * e32);
    rp3 = e30 * rp3 + gs[pReg + rc3 * C + r] * (k0 * e30) + gs[pReg + rc3 * C + rc1] * (k1 * e31) +
      gs[pReg + rc3 * C + rc2] * (k2 * e32);

    // column terms: sum_{r' > r_i} beta_r' dL_{r' r_i} k_r' E_{r' r_i} (and dP with q_r')
    var cl0 = vec4f(0.0);
    var cl1 = vec4f(0.0);
    var cl2 = vec4f(0.0);
    var cl3 = vec4f(0.0);
    var cp0 = vec4f(0.0);
    var cp1 = vec4f(0.0);
    var cp2 = vec4f(0.0);
    var cp3 = vec4f(0.0);
    for (var rr = rc3 + 1u; rr < cv; rr++) {
      let row = tok(b, t0 + rr, h);
      let e = decay4(
        (workK4(base + wG() + rr * K, d) - gh3) + (workK4(base + wGlo() + rr * K, d) - gl3),
      );
      let ke = x[xBeta() + row] * xK4(xK() + row * K, d) * e;
      let qe = xK4(xQ() + row * K, d) * e;
      cl0 = fma(vec4f(gs[lReg + rr * C + r]), ke, cl0);
      cl1 = fma(vec4f(gs[lReg + rr * C + rc1]), ke, cl1);
      cl2 = fma(vec4f(gs[lReg + rr * C + rc2]), ke, cl2);
      cl3 = fma(vec4f(gs[lReg + rr * C + rc3]), ke, cl3);
      cp0 = fma(vec4f(gs[pReg + rr * C + r]), qe, cp0);
      cp1 = fma(vec4f(gs[pReg + rr * C + rc1]), qe, cp1);
      cp2 = fma(vec4f(gs[pReg + rr * C + rc2]), qe, cp2);
      cp3 = fma(vec4f(gs[pReg + rr * C + rc3]), qe, cp3);
    }
    // through the anchor e^{G_last - G_ri}, then the pairs inside the block (r' <= the last row)
    let b1 = x[xBeta() + row1];
    let b2 = x[xBeta() + row2];
    let b3 = x[xBeta() + row3];
    let v1 = r + 1u < cv;
    let v2 = r + 2u < cv;
    let v3 = r + 3u < cv;
    cl0 = e30 * cl0;
    cp0 = e30 * cp0;
    cl1 = e31 * cl1;
    cp1 = e31 * cp1;
    cl2 = e32 * cl2;
    cp2 = e32 * cp2;
    if (v1) {
      cl0 += b1 * gs[lReg + rc1 * C + r] * k1 * e10;
      cp0 += gs[pReg + rc1 * C + r] * q1 * e10;
    }
    if (v2) {
      cl0 += b2 * gs[lReg + rc2 * C + r] * k2 * e20;
      cp0 += gs[pReg + rc2 * C + r] * q2 * e20;
      cl1 += b2 * gs[lReg + rc2 * C + rc1] * k2 * e21;
      cp1 += gs[pReg + rc2 * C + rc1] * q2 * e21;
    }
    if (v3) {
      cl0 += b3 * gs[lReg + rc3 * C + r] * k3 * e30;
      cp0 += gs[pReg + rc3 * C + r] * q3 * e30;
      cl1 += b3 * gs[lReg + rc3 * C + rc1] * k3 * e31;
      cp1 += gs[pReg + rc3 * C + rc1] * q3 * e31;
      cl2 += b3 * gs[lReg + rc3 * C + rc2] * k3 * e32;
      cp2 += gs[pReg + rc3 * C + rc2] * q3 * e32;
    }
    let ghL = workK4(base + wG() + last * K, d);
    let glL = workK4(base + wGlo() + last * K, d);
    elementwiseGrads(gBase, outDq, outDk, row0, r, d, cv, k0, q0, gh0, gl0, ghL, glL, rl0, rp0, cl0, cp0);
    if (v1) {
      elementwiseGrads(gBase, outDq, outDk, row1, rc1, d, cv, k1, q1, gh1, gl1, ghL, glL, rl1, rp1, cl1, cp1);
    }
    if (v2) {
      elementwiseGrads(gBase, outDq, outDk, row2, rc2, d, cv, k2, q2, gh2, gl2, ghL, glL, rl2, rp2, cl2, cp2);
    }
    if (v3) {
      elementwiseGrads(gBase, outDq, outDk, row3, rc3, d, cv, k3, q3, gh3, gl3, ghL, glL, rl3, rp3, cl3, cp3);
    }
  }
  // ABLATE bE }
  stageBarrier();

  // Stage F: dbeta row sums; gateCumsumBackward: dG_C, then the reverse cumsum to dg, per channel
  // ABLATE bF {
  for (var e = lid; e < cv + K; e += WG) {
    if (e < cv) {
      let r = e;
      var acc = gs[gBase + gBv() + r];
      for (var d = 0u; d < K; d++) {
        acc += gs[gBase + gKb() + r * K + d];
      }
      outp[outDbeta + tok(b, t0 + r, h)] = acc;
    } else {
      let d = e - cv;
      // dg_t = dgamma_C gamma_C + sum_{r >= t} dG_r + sum_{r < t} x_r (see elementwiseGrads)
      var before = 0.0;
      for (var r = 0u; r < cv; r++) {
        outp[outDg + tok(b, t0 + r, h) * K + d] = before;
        before += gs[gBase + gKd() + r * K + d];
      }
      var acc = gs[gBase + gGam() + d] * work[base + wGam() + d];
      for (var i = 0u; i < cv; i++) {
        let r = cv - 1u - i;
        acc += gs[gBase + gG() + r * K + d];
        let at = outDg + tok(b, t0 + r, h) * K + d;
        outp[at] = acc + outp[at];
      }
    }
  }
  // ABLATE bF }
}
