// The sequential scans of the gpu arm (stateScan, stateScanBackward): the second of the three
// WGSL files that kda/gpu/device.ts joins, in order, after the generated layout header:
// kda/chunk.wgsl, kda/gpu/scans.wgsl, kda/gpu/intra_backward.wgsl (one module; see chunk.wgsl).

// ---- the scans: sequential over chunks, one workgroup per (b, h, V tile of p.VT columns) ----
//
// The VT columns of a tile form ng = VT / 4 vec4 column groups (VT in {4, 8, 16, 32}, K * VT <=
// 4096, C * VT <= 2048: see makePlan). Invocation lid owns column group cg = lid % ng and rows
// r0 + i * rstep (rstep = 256 / ng): four vec4 entries of the K x VT state, held in registers
// across the whole scan, and two of the C x VT row tiles (Vn, O, dVn). Each chunk's state is
// published to workgroup memory for the row tiles' sums over d. Accumulators are named vec4f
// registers; every sum still runs in one fixed order.

var<workgroup> scanState: array<vec4f, SCAN_STATE_VEC4>; // K x ng
var<workgroup> scanRows: array<vec4f, SCAN_ROWS_VEC4>; // C x ng

// Four consecutive columns j.. of a row of length p.V starting at `row`; zero past p.V.
fn xCols(row: u32, j: u32) -> vec4f {
  var v = vec4f(0.0);
  if (j < p.V) { v.x = x[row + j]; }
  if (j + 1u < p.V) { v.y = x[row + j + 1u]; }
  if (j + 2u < p.V) { v.z = x[row + j + 2u]; }
  if (j + 3u < p.V) { v.w = x[row + j + 3u]; }
  return v;
}
fn cotCols(row: u32, j: u32) -> vec4f {
  var v = vec4f(0.0);
  if (j < p.V) { v.x = cot[row + j]; }
  if (j + 1u < p.V) { v.y = cot[row + j + 1u]; }
  if (j + 2u < p.V) { v.z = cot[row + j + 2u]; }
  if (j + 3u < p.V) { v.w = cot[row + j + 3u]; }
  return v;
}
fn workCols(row: u32, j: u32) -> vec4f {
  var v = vec4f(0.0);
  if (j < p.V) { v.x = work[row + j]; }
  if (j + 1u < p.V) { v.y = work[row + j + 1u]; }
  if (j + 2u < p.V) { v.z = work[row + j + 2u]; }
  if (j + 3u < p.V) { v.w = work[row + j + 3u]; }
  return v;
}
fn outpCols(row: u32, j: u32) -> vec4f {
  var v = vec4f(0.0);
  if (j < p.V) { v.x = outp[row + j]; }
  if (j + 1u < p.V) { v.y = outp[row + j + 1u]; }
  if (j + 2u < p.V) { v.z = outp[row + j + 2u]; }
  if (j + 3u < p.V) { v.w = outp[row + j + 3u]; }
  return v;
}
fn workStoreCols(row: u32, j: u32, v: vec4f) {
  if (j < p.V) { work[row + j] = v.x; }
  if (j + 1u < p.V) { work[row + j + 1u] = v.y; }
  if (j + 2u < p.V) { work[row + j + 2u] = v.z; }
  if (j + 3u < p.V) { work[row + j + 3u] = v.w; }
}
fn statesStoreCols(row: u32, j: u32, v: vec4f) {
  if (j < p.V) { states[row + j] = v.x; }
  if (j + 1u < p.V) { states[row + j + 1u] = v.y; }
  if (j + 2u < p.V) { states[row + j + 2u] = v.z; }
  if (j + 3u < p.V) { states[row + j + 3u] = v.w; }
}
fn outpStoreCols(row: u32, j: u32, v: vec4f) {
  if (j < p.V) { outp[row + j] = v.x; }
  if (j + 1u < p.V) { outp[row + j + 1u] = v.y; }
  if (j + 2u < p.V) { outp[row + j + 2u] = v.z; }
  if (j + 3u < p.V) { outp[row + j + 3u] = v.w; }
}
fn bwStoreCols(row: u32, j: u32, v: vec4f) {
  if (j < p.V) { bw[row + j] = v.x; }
  if (j + 1u < p.V) { bw[row + j + 1u] = v.y; }
  if (j + 2u < p.V) { bw[row + j + 2u] = v.z; }
  if (j + 3u < p.V) { bw[row + j + 3u] = v.w; }
}
// Stores row d of a state tile transposed, [V, K]: the chunk-parallel backward reads it with
// lanes along K.
fn statesStoreT(base: u32, d: u32, j: u32, v: vec4f) {
  let K = p.K;
  if (j < p.V) { states[base + j * K + d] = v.x; }
  if (j + 1u < p.V) { states[base + (j + 1u) * K + d] = v.y; }
  if (j + 2u < p.V) { states[base + (j + 2u) * K + d] = v.z; }
  if (j + 3u < p.V) { states[base + (j + 3u) * K + d] = v.w; }
}
fn bwStoreT(base: u32, d: u32, j: u32, v: vec4f) {
  let K = p.K;
  if (j < p.V) { bw[base + j * K + d] = v.x; }
  if (j + 1u < p.V) { bw[base + (j + 1u) * K + d] = v.y; }
  if (j + 2u < p.V) { bw[base + (j + 2u) * K + d] = v.z; }
  if (j + 3u < p.V) { bw[base + (j + 3u) * K + d] = v.w; }
}

// The state (or its gradient) at the start of a scan dispatch: carried over in outp at `carry`
// from the previous dispatch, else the initial value from `first` (flag set) or zero.
fn scanStart(carry: u32, bh: u32, d: u32, j: u32, fromFirst: bool, useFirst: bool, isH0: bool) -> vec4f {
  if (d >= p.K) {
    return vec4f(0.0);
  }
  let row = (bh * p.K + d) * p.V;
  if (!fromFirst) {
    return outpCols(carry + row, j);
  }
  if (!useFirst) {
    return vec4f(0.0);
  }
  if (isH0) {
    return xCols(xH0() + row, j);
  }
  return cotCols(cDht() + row, j);
}

// ---- forward, sequential per (b, h, V tile): newValues, chunkOutput and stateScan ----

@compute @workgroup_size(256)
fn stateScan(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let wid = groupIndex(wg, nwg);
  if (wid >= p.B * p.H * p.nVT) {
    return;
  }
  let K = p.K;
  let V = p.V;
  let C = p.C;
  let bh = wid / p.nVT;
  let b = bh / p.H;
  let h = bh % p.H;
  let ng = p.VT / 4u;
  let cg = lid % ng;
  let rstep = WG / ng;
  let r0 = lid / ng;
  let j = (wid % p.nVT) * p.VT + 4u * cg;
  let save = (p.flags & SAVE_STATES) != 0u;
  let htBase = oHt();
  // this invocation's state rows, clamped for reads (entries with d >= K are never stored)
  let d0 = r0;
  let d1 = r0 + rstep;
  let d2 = r0 + 2u * rstep;
  let d3 = r0 + 3u * rstep;
  let d0c = min(d0, K - 1u);
  let d1c = min(d1, K - 1u);
  let d2c = min(d2, K - 1u);
  let d3c = min(d3, K - 1u);
  let ra = r0;
  let rb = r0 + rstep;
  let first = range.n0 == 0u;
  let hasH0 = (p.flags & HAS_H0) != 0u;
  var s0 = scanStart(htBase, bh, d0, j, first, hasH0, true);
  var s1 = scanStart(htBase, bh, d1, j, first, hasH0, true);
  var s2 = scanStart(htBase, bh, d2, j, first, hasH0, true);
  var s3 = scanStart(htBase, bh, d3, j, first, hasH0, true);

  for (var n = range.n0; n < range.n1; n++) {
    let t0 = n * C;
    let cv = min(C, p.T - t0);
    let base = (bh * p.NC + n) * workSize();
    let sBlock = (bh * p.NC + n) * stateSize();
    let sBase = sBlock + sS();
    let raC = min(ra, cv - 1u);
    let rbC = min(rb, cv - 1u);
    // publish the chunk-start state; save it for the backward
    if (d0 < K) { scanState[d0 * ng + cg] = s0; }
    if (d1 < K) { scanState[d1 * ng + cg] = s1; }
    if (d2 < K) { scanState[d2 * ng + cg] = s2; }
    if (d3 < K) { scanState[d3 * ng + cg] = s3; }
    if (save) {
      if (d0 < K) { statesStoreT(sBase, d0, j, s0); }
      if (d1 < K) { statesStoreT(sBase, d1, j, s1); }
      if (d2 < K) { statesStoreT(sBase, d2, j, s2); }
      if (d3 < K) { statesStoreT(sBase, d3, j, s3); }
    }
    workgroupBarrier();
    // newValues (W S) and the first term of chunkOutput (Qg S), one pass over d
    var wa = vec4f(0.0);
    var wb = vec4f(0.0);
    var qa = vec4f(0.0);
    var qb = vec4f(0.0);
    let wRowA = base + wW() + raC * K;
    let wRowB = base + wW() + rbC * K;
    let qRowA = base + wQg() + raC * K;
    let qRowB = base + wQg() + rbC * K;
    for (var d = 0u; d < K; d++) {
      let s = scanState[d * ng + cg];
      wa = fma(vec4f(work[wRowA + d]), s, wa);
      wb = fma(vec4f(work[wRowB + d]), s, wb);
      qa = fma(vec4f(work[qRowA + d]), s, qa);
      qb = fma(vec4f(work[qRowB + d]), s, qb);
    }
    // Vn = U - W S
    let va = workCols(base + wU() + raC * V, j) - wa;
    let vb = workCols(base + wU() + rbC * V, j) - wb;
    if (ra < cv) {
      scanRows[ra * ng + cg] = va;
      if (save) { statesStoreCols(sBlock + sVn() + ra * V, j, va); }
    }
    if (rb < cv) {
      scanRows[rb * ng + cg] = vb;
      if (save) { statesStoreCols(sBlock + sVn() + rb * V, j, vb); }
    }
    workgroupBarrier();
    // chunkOutput: O = scale (Q (.) Gamma) S + P Vn (P is zero above the diagonal)
    let pRowA = base + wP() + raC * C;
    let pRowB = base + wP() + rbC * C;
    for (var s = 0u; s < cv; s++) {
      let vn = scanRows[s * ng + cg];
      qa = fma(vec4f(work[pRowA + s]), vn, qa);
      qb = fma(vec4f(work[pRowB + s]), vn, qb);
    }
    if (ra < cv) { outpStoreCols(oO() + tok(b, t0 + ra, h) * V, j, qa); }
    if (rb < cv) { outpStoreCols(oO() + tok(b, t0 + rb, h) * V, j, qb); }
    // stateScan: S' = diag(gamma_C) S + Kd^T Vn
    var u0 = work[base + wGam() + d0c] * s0;
    var u1 = work[base + wGam() + d1c] * s1;
    var u2 = work[base + wGam() + d2c] * s2;
    var u3 = work[base + wGam() + d3c] * s3;
    for (var r = 0u; r < cv; r++) {
      let vn = scanRows[r * ng + cg];
      let kRow = base + wKd() + r * K;
      u0 = fma(vec4f(work[kRow + d0c]), vn, u0);
      u1 = fma(vec4f(work[kRow + d1c]), vn, u1);
      u2 = fma(vec4f(work[kRow + d2c]), vn, u2);
      u3 = fma(vec4f(work[kRow + d3c]), vn, u3);
    }
    s0 = u0;
    s1 = u1;
    s2 = u2;
    s3 = u3;
    workgroupBarrier();
  }

  if (d0 < K) { outpStoreCols(htBase + (bh * K + d0) * V, j, s0); }
  if (d1 < K) { outpStoreCols(htBase + (bh * K + d1) * V, j, s1); }
  if (d2 < K) { outpStoreCols(htBase + (bh * K + d2) * V, j, s2); }
  if (d3 < K) { outpStoreCols(htBase + (bh * K + d3) * V, j, s3); }
}

// ---- backward, sequential per (b, h, V tile): stateScanBackward, the dS' chain ----

@compute @workgroup_size(256)
fn stateScanBackward(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(num_workgroups) nwg: vec3<u32>,
  @builtin(local_invocation_index) lid: u32,
) {
  let wid = groupIndex(wg, nwg);
  if (wid >= p.B * p.H * p.nVT) {
    return;
  }
  let K = p.K;
  let V = p.V;
  let C = p.C;
  let bh = wid / p.nVT;
  let b = bh / p.H;
  let h = bh % p.H;
  let ng = p.VT / 4u;
  let cg = lid % ng;
  let rstep = WG / ng;
  let r0 = lid / ng;
  let j = (wid % p.nVT) * p.VT + 4u * cg;
  let dh0Base = dH0();
  let d0 = r0;
  let d1 = r0 + rstep;
  let d2 = r0 + 2u * rstep;
  let d3 = r0 + 3u * rstep;
  let d0c = min(d0, K - 1u);
  let d1c = min(d1, K - 1u);
  let d2c = min(d2, K - 1u);
  let d3c = min(d3, K - 1u);
  let ra = r0;
  let rb = r0 + rstep;
  let first = range.n1 == p.NC;
  let hasDht = (p.flags & HAS_DHT) != 0u;
  // dS', the gradient arriving at the chunk end, in registers
  var s0 = scanStart(dh0Base, bh, d0, j, first, hasDht, false);
  var s1 = scanStart(dh0Base, bh, d1, j, first, hasDht, false);
  var s2 = scanStart(dh0Base, bh, d2, j, first, hasDht, false);
  var s3 = scanStart(dh0Base, bh, d3, j, first, hasDht, false);

  for (var i = range.n0; i < range.n1; i++) {
    let n = range.n1 - 1u - (i - range.n0);
    let t0 = n * C;
    let cv = min(C, p.T - t0);
    let base = (bh * p.NC + n) * workSize();
    let bBase = (bh * p.NC + n) * bwSize();
    let raC = min(ra, cv - 1u);
    let rbC = min(rb, cv - 1u);
    if (d0 < K) { scanState[d0 * ng + cg] = s0; bwStoreT(bBase + bDS(), d0, j, s0); }
    if (d1 < K) { scanState[d1 * ng + cg] = s1; bwStoreT(bBase + bDS(), d1, j, s1); }
    if (d2 < K) { scanState[d2 * ng + cg] = s2; bwStoreT(bBase + bDS(), d2, j, s2); }
    if (d3 < K) { scanState[d3 * ng + cg] = s3; bwStoreT(bBase + bDS(), d3, j, s3); }
    workgroupBarrier();
    // stateScanBackward + chunkOutputBackward: dVn = Kd dS' + P^T dO (P^T is zero below the
    // diagonal, so the sum over s starts at 0 and adds exact zeros first)
    var a = vec4f(0.0);
    var bb = vec4f(0.0);
    let kRowA = base + wKd() + raC * K;
    let kRowB = base + wKd() + rbC * K;
    for (var d = 0u; d < K; d++) {
      let ds = scanState[d * ng + cg];
      a = fma(vec4f(work[kRowA + d]), ds, a);
      bb = fma(vec4f(work[kRowB + d]), ds, bb);
    }
    for (var s = 0u; s < cv; s++) {
      let dO = cotCols(cDout() + tok(b, t0 + s, h) * V, j);
      let pRow = base + wP() + s * C;
      a = fma(vec4f(work[pRow + raC]), dO, a);
      bb = fma(vec4f(work[pRow + rbC]), dO, bb);
    }
    if (ra < cv) {
      scanRows[ra * ng + cg] = a;
      bwStoreCols(bBase + bDVn() + ra * V, j, a);
    }
    if (rb < cv) {
      scanRows[rb * ng + cg] = bb;
      bwStoreCols(bBase + bDVn() + rb * V, j, bb);
    }
    workgroupBarrier();
    // dS = diag(gamma_C) dS' + scale (Q (.) Gamma)^T dO - W^T dVn (the last term newValuesBackward)
    var q0 = vec4f(0.0);
    var q1 = vec4f(0.0);
    var q2 = vec4f(0.0);
    var q3 = vec4f(0.0);
    var w0 = vec4f(0.0);
    var w1 = vec4f(0.0);
    var w2 = vec4f(0.0);
    var w3 = vec4f(0.0);
    for (var r = 0u; r < cv; r++) {
      let dO = cotCols(cDout() + tok(b, t0 + r, h) * V, j);
      let dv = scanRows[r * ng + cg];
      let qRow = base + wQg() + r * K;
      let wRow = base + wW() + r * K;
      q0 = fma(vec4f(work[qRow + d0c]), dO, q0);
      q1 = fma(vec4f(work[qRow + d1c]), dO, q1);
      q2 = fma(vec4f(work[qRow + d2c]), dO, q2);
      q3 = fma(vec4f(work[qRow + d3c]), dO, q3);
      w0 = fma(vec4f(work[wRow + d0c]), dv, w0);
      w1 = fma(vec4f(work[wRow + d1c]), dv, w1);
      w2 = fma(vec4f(work[wRow + d2c]), dv, w2);
      w3 = fma(vec4f(work[wRow + d3c]), dv, w3);
    }
    s0 = work[base + wGam() + d0c] * s0 + q0 - w0;
    s1 = work[base + wGam() + d1c] * s1 + q1 - w1;
    s2 = work[base + wGam() + d2c] * s2 + q2 - w2;
    s3 = work[base + wGam() + d3c] * s3 + q3 - w3;
    workgroupBarrier();
  }

  // dS after chunk 0 is dh0
  if (d0 < K) { outpStoreCols(dh0Base + (bh * K + d0) * V, j, s0); }
  if (d1 < K) { outpStoreCols(dh0Base + (bh * K + d1) * V, j, s1); }
  if (d2 < K) { outpStoreCols(dh0Base + (bh * K + d2) * V, j, s2); }
  if (d3 < K) { outpStoreCols(dh0Base + (bh * K + d3) * V, j, s3); }
}

