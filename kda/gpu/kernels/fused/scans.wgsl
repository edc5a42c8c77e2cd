// The sequential scans of the fused kernel set (stateScan, stateScanBackward): one of the set's
// three files (kda/gpu/kernels/fused/mod.ts; the set's helpers are in kda/chunk.wgsl).

// ---- the scans: sequential over chunks, one workgroup per (b, h, V tile of p.VT columns) ----
//
// The VT columns of a tile form ng = VT / 4 vec4 column groups (VT in {4, 8, 16, 32}, K * VT <=
// 4096, C * VT <= 2048: see makePlan). Invocation lid owns column group cg = lid % ng and rows
// r0 + i * rstep (rstep = 256 / ng): four vec4 entries of the K x VT state, held in registers
// across the whole scan, and two of the C x VT row tiles (Vn, O, dVn). Each chunk's state is
// published to workgroup memory for the row tiles' sums over d. The four state rows form a
// register tile (a mat4x4f, see chunk.wgsl); every sum still runs in one fixed order.

var<workgroup> scanState: array<vec4f, SCAN_STATE_VEC4>; // K x ng
var<workgroup> scanRows: array<vec4f, SCAN_ROWS_VEC4>; // C x ng

// Where a scan invocation works: its (b, h) pair, the first of its four columns j.., its column
// group cg of ng, its four state rows d (and d clamped to K - 1 for reads) and its two row-tile
// rows ra, rb.
struct ScanAt {
  bh: u32,
  b: u32,
  h: u32,
  j: u32,
  cg: u32,
  ng: u32,
  d: vec4u,
  dc: vec4u,
  ra: u32,
  rb: u32,
}

fn scanAt(wg: vec3u, lid: u32) -> ScanAt {
  let ng = p.VT / 4u;
  let cg = lid % ng;
  let rstep = WG / ng;
  let r0 = lid / ng;
  let d = vec4u(r0) + rstep * vec4u(0u, 1u, 2u, 3u);
  let j = wg.x * p.VT + 4u * cg;
  let h = wg.y;
  let b = wg.z;
  return ScanAt(b * p.H + h, b, h, j, cg, ng, d, min(d, vec4u(p.K - 1u)), r0, r0 + rstep);
}

// Chunk n as a scan invocation sees it: first token, valid rows, work block, and its two row-tile
// rows clamped to the last valid row for reads.
struct ScanChunk {
  t0: u32,
  cv: u32,
  base: u32,
  raC: u32,
  rbC: u32,
}

fn scanChunk(at: ScanAt, n: u32) -> ScanChunk {
  let t0 = n * p.C;
  let cv = min(p.C, p.T - t0);
  return ScanChunk(t0, cv, (at.bh * p.NC + n) * workSize(), min(at.ra, cv - 1u), min(at.rb, cv - 1u));
}

// Where row r of a VT-wide tile (state or row tile) keeps this invocation's column group.
fn slot(at: ScanAt, r: u32) -> u32 {
  return r * at.ng + at.cg;
}

// One state row at the start of a scan dispatch: carried over in outp at `carry` from the
// previous dispatch, else the initial value from `first` (flag set) or zero.
fn scanStartRow(carry: u32, bh: u32, d: u32, j: u32, fromFirst: bool, useFirst: bool, isH0: bool) -> vec4f {
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

// The invocation's state tile (or its gradient's) at the start of a scan dispatch.
fn scanStart(carry: u32, at: ScanAt, fromFirst: bool, useFirst: bool, isH0: bool) -> mat4x4f {
  return mat4x4f(
    scanStartRow(carry, at.bh, at.d.x, at.j, fromFirst, useFirst, isH0),
    scanStartRow(carry, at.bh, at.d.y, at.j, fromFirst, useFirst, isH0),
    scanStartRow(carry, at.bh, at.d.z, at.j, fromFirst, useFirst, isH0),
    scanStartRow(carry, at.bh, at.d.w, at.j, fromFirst, useFirst, isH0),
  );
}

// Publishes the state tile to workgroup memory for the row tiles' sums over d.
fn publishState(at: ScanAt, s: mat4x4f) {
  if (at.d.x < p.K) { scanState[at.d.x * at.ng + at.cg] = s[0]; }
  if (at.d.y < p.K) { scanState[at.d.y * at.ng + at.cg] = s[1]; }
  if (at.d.z < p.K) { scanState[at.d.z * at.ng + at.cg] = s[2]; }
  if (at.d.w < p.K) { scanState[at.d.w * at.ng + at.cg] = s[3]; }
}

// Stores the state tile as rows of a [B H, K, V] region of outp (ht, dh0 or the carry).
fn storeStateTile(region: u32, at: ScanAt, s: mat4x4f) {
  let rows = (vec4u(at.bh * p.K) + at.d) * p.V + vec4u(region);
  if (at.d.x < p.K) { outpStoreCols(rows.x, at.j, s[0]); }
  if (at.d.y < p.K) { outpStoreCols(rows.y, at.j, s[1]); }
  if (at.d.z < p.K) { outpStoreCols(rows.z, at.j, s[2]); }
  if (at.d.w < p.K) { outpStoreCols(rows.w, at.j, s[3]); }
}

// ---- forward, sequential per (b, h, V tile): newValues, chunkOutput and stateScan ----

@compute @workgroup_size(256)
fn stateScan(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let at = scanAt(wg, lid);
  let save = (p.flags & SAVE_STATES) != 0u;
  let hasH0 = (p.flags & HAS_H0) != 0u;
  var st = scanStart(oHt(), at, range.n0 == 0u, hasH0, true);

  for (var n = range.n0; n < range.n1; n++) {
    let ch = scanChunk(at, n);
    let sBlock = (at.bh * p.NC + n) * stateSize();
    // publish the chunk-start state; save it for the backward
    publishState(at, st);
    if (save) {
      let sBase = sBlock + sS();
      if (at.d.x < p.K) { statesStoreT(sBase, at.d.x, at.j, st[0]); }
      if (at.d.y < p.K) { statesStoreT(sBase, at.d.y, at.j, st[1]); }
      if (at.d.z < p.K) { statesStoreT(sBase, at.d.z, at.j, st[2]); }
      if (at.d.w < p.K) { statesStoreT(sBase, at.d.w, at.j, st[3]); }
    }
    workgroupBarrier();
    // newValues (W S) and the first term of chunkOutput (Qg S), one pass over d
    var wa = vec4f(0.0);
    var wb = vec4f(0.0);
    var qa = vec4f(0.0);
    var qb = vec4f(0.0);
    let wRowA = ch.base + wW() + ch.raC * p.K;
    let wRowB = ch.base + wW() + ch.rbC * p.K;
    let qRowA = ch.base + wQg() + ch.raC * p.K;
    let qRowB = ch.base + wQg() + ch.rbC * p.K;
    for (var d = 0u; d < p.K; d++) {
      let s = scanState[slot(at, d)];
      wa = fma(vec4f(work[wRowA + d]), s, wa);
      wb = fma(vec4f(work[wRowB + d]), s, wb);
      qa = fma(vec4f(work[qRowA + d]), s, qa);
      qb = fma(vec4f(work[qRowB + d]), s, qb);
    }
    // Vn = U - W S
    let va = workCols(ch.base + wU() + ch.raC * p.V, at.j) - wa;
    let vb = workCols(ch.base + wU() + ch.rbC * p.V, at.j) - wb;
    if (at.ra < ch.cv) {
      scanRows[slot(at, at.ra)] = va;
      if (save) { statesStoreCols(sBlock + sVn() + at.ra * p.V, at.j, va); }
    }
    if (at.rb < ch.cv) {
      scanRows[slot(at, at.rb)] = vb;
      if (save) { statesStoreCols(sBlock + sVn() + at.rb * p.V, at.j, vb); }
    }
    workgroupBarrier();
    // chunkOutput: O = scale (Q (.) Gamma) S + P Vn (P is zero above the diagonal)
    let pRowA = ch.base + wP() + ch.raC * p.C;
    let pRowB = ch.base + wP() + ch.rbC * p.C;
    for (var s = 0u; s < ch.cv; s++) {
      let vn = scanRows[slot(at, s)];
      qa = fma(vec4f(work[pRowA + s]), vn, qa);
      qb = fma(vec4f(work[pRowB + s]), vn, qb);
    }
    if (at.ra < ch.cv) { outpStoreCols(oO() + tok(at.b, ch.t0 + at.ra, at.h) * p.V, at.j, qa); }
    if (at.rb < ch.cv) { outpStoreCols(oO() + tok(at.b, ch.t0 + at.rb, at.h) * p.V, at.j, qb); }
    // stateScan: S' = diag(gamma_C) S + Kd^T Vn
    var next = tileScaleRows(st, workAt4(ch.base + wGam(), at.dc));
    for (var r = 0u; r < ch.cv; r++) {
      next = tileFma(next, workAt4(ch.base + wKd() + r * p.K, at.dc), scanRows[slot(at, r)]);
    }
    st = next;
    workgroupBarrier();
  }

  storeStateTile(oHt(), at, st);
}

// ---- backward, sequential per (b, h, V tile): stateScanBackward, the dS' chain ----

@compute @workgroup_size(256)
fn stateScanBackward(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let at = scanAt(wg, lid);
  let hasDht = (p.flags & HAS_DHT) != 0u;
  // dS', the gradient arriving at the chunk end, in registers
  var st = scanStart(dH0(), at, range.n1 == p.NC, hasDht, false);

  for (var i = range.n0; i < range.n1; i++) {
    let n = range.n1 - 1u - (i - range.n0);
    let ch = scanChunk(at, n);
    let bBase = (at.bh * p.NC + n) * bwSize();
    publishState(at, st);
    if (at.d.x < p.K) { bwStoreT(bBase + bDS(), at.d.x, at.j, st[0]); }
    if (at.d.y < p.K) { bwStoreT(bBase + bDS(), at.d.y, at.j, st[1]); }
    if (at.d.z < p.K) { bwStoreT(bBase + bDS(), at.d.z, at.j, st[2]); }
    if (at.d.w < p.K) { bwStoreT(bBase + bDS(), at.d.w, at.j, st[3]); }
    workgroupBarrier();
    // stateScanBackward + chunkOutputBackward: dVn = Kd dS' + P^T dO (P^T is zero below the
    // diagonal, so the sum over s starts at 0 and adds exact zeros first)
    var a = vec4f(0.0);
    var bb = vec4f(0.0);
    let kRowA = ch.base + wKd() + ch.raC * p.K;
    let kRowB = ch.base + wKd() + ch.rbC * p.K;
    for (var d = 0u; d < p.K; d++) {
      let ds = scanState[slot(at, d)];
      a = fma(vec4f(work[kRowA + d]), ds, a);
      bb = fma(vec4f(work[kRowB + d]), ds, bb);
    }
    for (var s = 0u; s < ch.cv; s++) {
      let dO = cotCols(cDout() + tok(at.b, ch.t0 + s, at.h) * p.V, at.j);
      let pRow = ch.base + wP() + s * p.C;
      a = fma(vec4f(work[pRow + ch.raC]), dO, a);
      bb = fma(vec4f(work[pRow + ch.rbC]), dO, bb);
    }
    if (at.ra < ch.cv) {
      scanRows[slot(at, at.ra)] = a;
      bwStoreCols(bBase + bDVn() + at.ra * p.V, at.j, a);
    }
    if (at.rb < ch.cv) {
      scanRows[slot(at, at.rb)] = bb;
      bwStoreCols(bBase + bDVn() + at.rb * p.V, at.j, bb);
    }
    workgroupBarrier();
    // dS = diag(gamma_C) dS' + scale (Q (.) Gamma)^T dO - W^T dVn (the last term newValuesBackward)
    var q = mat4x4f();
    var w = mat4x4f();
    for (var r = 0u; r < ch.cv; r++) {
      let dO = cotCols(cDout() + tok(at.b, ch.t0 + r, at.h) * p.V, at.j);
      q = tileFma(q, workAt4(ch.base + wQg() + r * p.K, at.dc), dO);
      w = tileFma(w, workAt4(ch.base + wW() + r * p.K, at.dc), scanRows[slot(at, r)]);
    }
    st = tileScaleRows(st, workAt4(ch.base + wGam(), at.dc)) + q - w;
    workgroupBarrier();
  }

  // dS after chunk 0 is dh0
  storeStateTile(dH0(), at, st);
}
