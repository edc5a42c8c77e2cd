// The split set's backward scan (docs/kda.md 2.3): the dS' chain of stateScanBackward with
// chunkOutputBackward and newValuesBackward, sequential over each sequence's chunks from the last,
// one workgroup per (V tile, head, sequence), as the forward scan (forward.wgsl) lays out its
// invocations. It leaves dS' and dVn per chunk for the chunk-parallel stages and dh0.

// One row of dS' at the start of a backward scan dispatch: dht at a sequence's last chunk (or
// zero without it), else the carry of the previous dispatch in dh0.
fn backwardStartRow(at: ScanAt, d: u32, fromLast: bool, hasDht: bool) -> vec4f {
  if (d >= p.K) {
    return vec4f(0.0);
  }
  let row = (at.bh * p.K + d) * p.V;
  if (!fromLast) {
    return dh0Cols(aDh0() + row, at.j);
  }
  if (!hasDht) {
    return vec4f(0.0);
  }
  return dhtCols(aDht() + row, at.j);
}

@compute @workgroup_size(256)
fn stateScanBackward(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let at = scanAt(wg, lid);
  let hasDht = (p.flags & HAS_DHT) != 0u;
  // the dispatches run the chunk ranges from the last; a sequence starts from dht in the first
  // one that reaches its end (also when it has no chunk in it, or none at all)
  let fromLast = range.n1 >= at.seq.count;
  var st = mat4x4f(
    backwardStartRow(at, at.d.x, fromLast, hasDht),
    backwardStartRow(at, at.d.y, fromLast, hasDht),
    backwardStartRow(at, at.d.z, fromLast, hasDht),
    backwardStartRow(at, at.d.w, fromLast, hasDht),
  );
  let n1 = min(range.n1, at.seq.count);
  for (var i = range.n0; i < n1; i++) {
    let n = n1 - 1u - (i - range.n0);
    let ch = scanChunk(at, n);
    let base = ch.wid * workSize();
    let tbase = ch.wid * triSize();
    let bBase = ch.wid * bwSize();
    publishState(at, st);
    if (at.d.x < p.K) { bwStoreT(bBase + bDS(), at.d.x, at.j, st[0]); }
    if (at.d.y < p.K) { bwStoreT(bBase + bDS(), at.d.y, at.j, st[1]); }
    if (at.d.z < p.K) { bwStoreT(bBase + bDS(), at.d.z, at.j, st[2]); }
    if (at.d.w < p.K) { bwStoreT(bBase + bDS(), at.d.w, at.j, st[3]); }
    workgroupBarrier();
    // stateScanBackward + chunkOutputBackward: dVn = Kd dS' + P^T dO (P^T is zero below the
    // diagonal, so the sum over s starts at 0 and adds exact zeros first)
    var a = vec4f(0.0);
    var b = vec4f(0.0);
    let kRowA = base + wKd() + ch.raC * p.K;
    let kRowB = base + wKd() + ch.rbC * p.K;
    for (var d = 0u; d < p.K; d++) {
      let ds = scanState[slot(at, d)];
      a = fma(vec4f(work[kRowA + d]), ds, a);
      b = fma(vec4f(work[kRowB + d]), ds, b);
    }
    for (var s = 0u; s < ch.cv; s++) {
      let dO = doutCols(aDout() + ((ch.t0 + s) * p.H + at.h) * p.V, at.j);
      let pRow = tbase + rP() + s * p.C;
      a = fma(vec4f(tri[pRow + ch.raC]), dO, a);
      b = fma(vec4f(tri[pRow + ch.rbC]), dO, b);
    }
    if (at.ra < ch.cv) {
      scanRows[slot(at, at.ra)] = a;
      bwStoreCols(bBase + bDVn() + at.ra * p.V, at.j, a);
    }
    if (at.rb < ch.cv) {
      scanRows[slot(at, at.rb)] = b;
      bwStoreCols(bBase + bDVn() + at.rb * p.V, at.j, b);
    }
    workgroupBarrier();
    // dS = diag(gamma_C) dS' + scale (Q (.) Gamma)^T dO - W^T dVn (the last term newValuesBackward)
    var qt = mat4x4f();
    var wt = mat4x4f();
    for (var r = 0u; r < ch.cv; r++) {
      let dO = doutCols(aDout() + ((ch.t0 + r) * p.H + at.h) * p.V, at.j);
      qt = tileFma(qt, workAt4(base + wQg() + r * p.K, at.dc), dO);
      wt = tileFma(wt, workAt4(base + wW() + r * p.K, at.dc), scanRows[slot(at, r)]);
    }
    st = tileScaleRows(st, workAt4(base + wGam(), at.dc)) + qt - wt;
    workgroupBarrier();
  }
  // dS after a sequence's first chunk is its dh0 (the carry of the next dispatch otherwise)
  let rows = (vec4u(at.bh * p.K) + at.d) * p.V + vec4u(aDh0());
  if (at.d.x < p.K) { dh0StoreCols(rows.x, at.j, st[0]); }
  if (at.d.y < p.K) { dh0StoreCols(rows.y, at.j, st[1]); }
  if (at.d.z < p.K) { dh0StoreCols(rows.z, at.j, st[2]); }
  if (at.d.w < p.K) { dh0StoreCols(rows.w, at.j, st[3]); }
}
