// The split set's backward scan (docs/kda.md 2.3): the dS' chain of stateScanBackward with
// chunkOutputBackward and newValuesBackward, sequential over each sequence's chunks from the last,
// one workgroup per (V tile, head, sequence), with the forward scan's invocation layout and slab
// stream (forward.wgsl), slice by slice with the chunk-parallel stages (mod.ts). It leaves dS' and
// dVn per chunk of the slice for those stages, and dh0 (the carry to the next slice, then dh0).

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

// This invocation's vec4 of P slab i: P[4q.., r] for group q = i qp + lid / C and column
// r = lid % C (zero past cv).
fn pSlabLoad(sl: ScanSlabs, tbase: u32, cv: u32, i: u32, lid: u32) -> vec4f {
  let rows = 4u * (i * sl.qp + lid / p.C) + vec4u(0u, 1u, 2u, 3u);
  let r = lid % p.C;
  if (r >= cv || rows.x >= cv) {
    return vec4f(0.0);
  }
  return select(vec4f(0.0), tri4At4(tbase + rP() + r, min(rows, vec4u(cv - 1u)) * p.C), rows < vec4u(cv));
}

// acc + the P slab's part of P^T dO for rows ra and rb (dO in the row tile at the region's start),
// the rows s of dO in ascending order across the slabs.
fn pSlabProduct(at: ScanAt, sl: ScanSlabs, slab: u32, i: u32, ch: ScanChunk, acc: ScanRows) -> ScanRows {
  let q0 = i * sl.qp;
  let cq = (ch.cv + 3u) / 4u;
  var n = 0u;
  if (q0 < cq) {
    n = min(sl.qp, cq - q0);
  }
  var rows = acc;
  for (var q = 0u; q < n; q++) {
    let y = 4u * (q0 + q) * at.ng + at.cg;
    rows = rowsFma(rows, scanMem[slab + q * p.C + ch.raC], scanMem[slab + q * p.C + ch.rbC], y, at.ng);
  }
  return rows;
}

// Entry e of the chunk's C x VT tile of dO (row e / ng, column group e % ng; zero past cv).
fn doutTileLoad(at: ScanAt, ch: ScanChunk, e: u32) -> vec4f {
  let s = e / at.ng;
  if (s >= ch.cv) {
    return vec4f(0.0);
  }
  return doutCols(aDout() + ((ch.t0 + s) * p.H + at.h) * p.V, at.j0 + 4u * (e % at.ng));
}

// The index of the first chunk of a sequence whose position in slice order is at least `position`
// (its count where none is): its chunks' positions ascend with their index
fn firstAtOrAfter(seq: SeqAt, position: u32) -> u32 {
  var lo = 0u;
  var hi = seq.count;
  while (lo < hi) {
    let mid = (lo + hi) / 2u;
    if (chunks[tPos() + seq.first + mid] < position) {
      lo = mid + 1u;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Slab i of a backward chunk: the d-slabs of Kd, the P slabs, the r-slabs of Qg, then those of W
// negated (so that its products subtract, exactly as fma(-w, x, s)). Kd and Qg come from the
// slice's gate sums (its block at pos), W from the saved forward.
fn backwardSlabLoad(sl: ScanSlabs, ch: ScanChunk, pos: u32, h: u32, i: u32, lid: u32) -> vec4f {
  let gates = sliceBlock(pos, h) * gatesSize();
  if (i < sl.nD) {
    let a = dSlabAt(sl, gates + xKd(), ch.cv, i, lid);
    return gates4K4If(a.row, a.d, a.live);
  }
  if (i < sl.nD + sl.nP) {
    return pSlabLoad(sl, ch.wid * triSize(), ch.cv, i - sl.nD, lid);
  }
  let r = i - sl.nP - sl.nD;
  if (r < sl.nR) {
    let a = rSlabAt(sl, gates + xQg(), ch.cv, r, lid);
    return gates4K4If(a.row, a.d, a.live);
  }
  let a = rSlabAt(sl, ch.wid * workSize() + wW(), ch.cv, r - sl.nR, lid);
  return -work4K4If(a.row, a.d, a.live);
}

// dO and dVn side by side in the state tile's region
const_assert 2u * SCAN_ROWS_VEC4 <= SCAN_STATE_VEC4;

// Per chunk, from the last: dVn = Kd dS' + P^T dO (stateScanBackward, chunkOutputBackward) over the
// Kd slabs (dS' in the state tile) and the P slabs (dO), then
// dS = diag(gamma_C) dS' + (scale Q (.) Gamma)^T dO - W^T dVn (the last term newValuesBackward) over
// the Qg slabs (dO) and the W slabs (dVn). Once the Kd slabs are done the state tile's region holds
// the row tiles (forward.wgsl): dO from its start, dVn from SCAN_ROWS_VEC4. dS' is published with
// the first Kd slab, behind a barrier after the previous chunk's last W slab (which read dVn
// there), dO with the first P slab, behind one after this chunk's last Kd slab (which read dS'),
// and dVn with the first W slab (its half of the region was last read by the Kd slabs).
@compute @workgroup_size(256)
fn stateScanBackward(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let at = scanAt(wg, lid);
  let sl = scanSlabs();
  let hasDht = (p.flags & HAS_DHT) != 0u;
  // a sliced scan (mod.ts): the dispatch's range is a slice, positions in slice order, and the
  // dispatches run the slices from the last. A sequence takes its own chunks in the slice (local
  // n0..n1: its chunks' positions ascend with their index) and starts from dht in the slice that
  // reaches its end, else from its carry in dh0. One with no chunk in the slice writes back its
  // carry unchanged, or dht where the slice lies past its end (before its own slices run; also
  // when it has no chunk at all).
  let n0 = firstAtOrAfter(at.seq, range.n0);
  let n1 = firstAtOrAfter(at.seq, range.n1);
  let fromLast = n1 == at.seq.count;
  var st = mat4x4f(
    backwardStartRow(at, at.d.x, fromLast, hasDht),
    backwardStartRow(at, at.d.y, fromLast, hasDht),
    backwardStartRow(at, at.d.z, fromLast, hasDht),
    backwardStartRow(at, at.d.w, fromLast, hasDht),
  );
  let steps = n1 - n0;
  // m >= 4 slabs a chunk (one of each operand at least)
  let m = sl.nP + sl.nD + 2u * sl.nR;
  let tileEntries = p.C * at.ng;
  var next = vec4f(0.0);
  var after = vec4f(0.0);
  var dO0 = vec4f(0.0);
  var dO1 = vec4f(0.0);
  // the chunk's position in slice order (its block of the scratch), loaded a chunk ahead: its
  // first store is at the chunk's first slab
  var pos = 0u;
  if (steps > 0u) {
    pos = chunks[tPos() + at.seq.first + n1 - 1u];
    let ch = scanChunk(at, n1 - 1u);
    next = backwardSlabLoad(sl, ch, pos, at.h, 0u, lid);
    after = backwardSlabLoad(sl, ch, pos, at.h, 1u, lid);
    dO0 = doutTileLoad(at, ch, lid);
    dO1 = doutTileLoad(at, ch, lid + WG);
  }
  var g = 0u;
  for (var t = 0u; t < steps; t++) {
    let n = n1 - 1u - t;
    let ch = scanChunk(at, n);
    var later = ch;
    var posLater = pos;
    if (t + 1u < steps) {
      later = scanChunk(at, n - 1u);
      posLater = chunks[tPos() + at.seq.first + n - 1u];
    }
    let base = ch.wid * workSize();
    let bBase = sliceBlock(pos, at.h) * bwSize();
    let gam = work4K4(base + wGam(), at.d.x);
    var dv = ScanRows(vec4f(0.0), vec4f(0.0));
    for (var i = 0u; i < m; i++) {
      let slab = SCAN_SLAB_AT + (g % 2u) * SCAN_SLAB_VEC4;
      scanMem[slab + lid] = next;
      // the region's last reads (the previous chunk's dVn, this chunk's dS') are done
      if ((i == 0u && t > 0u) || i == sl.nD) {
        workgroupBarrier();
      }
      if (i == 0u) {
        // dS' saved transposed ([V, K]), four channels a store
        bwStoreTileT(bBase + bDS(), at.d.x, at.j, st);
        publishState(at, sl, st);
      }
      if (i == sl.nD) {
        scanMem[lid] = dO0;
        if (lid + WG < tileEntries) {
          scanMem[lid + WG] = dO1;
        }
      }
      if (i == sl.nP + sl.nD + sl.nR) {
        if (at.ra < ch.cv) {
          scanMem[SCAN_ROWS_VEC4 + at.ra * at.ng + at.cg] = dv.a;
          bwStoreCols(bBase + bDVn() + at.ra * p.V, at.j, dv.a);
        }
        if (at.rb < ch.cv) {
          scanMem[SCAN_ROWS_VEC4 + at.rb * at.ng + at.cg] = dv.b;
          bwStoreCols(bBase + bDVn() + at.rb * p.V, at.j, dv.b);
        }
      }
      // the slab two ahead in the stream (and, from the chunk's last two, the next chunk's dO;
      // this one's is written), in flight through two barriers and slabs' products
      next = after;
      if (i + 2u < m) {
        after = backwardSlabLoad(sl, ch, pos, at.h, i + 2u, lid);
      } else if (t + 1u < steps) {
        after = backwardSlabLoad(sl, later, posLater, at.h, i + 2u - m, lid);
        if (i + 2u == m) {
          dO0 = doutTileLoad(at, later, lid);
          dO1 = doutTileLoad(at, later, lid + WG);
        }
      }
      workgroupBarrier();
      if (i < sl.nD) {
        dv = dSlabProduct(at, sl, slab, i, ch, dv);
      } else if (i < sl.nD + sl.nP) {
        dv = pSlabProduct(at, sl, slab, i - sl.nD, ch, dv);
      } else if (i < sl.nP + sl.nD + sl.nR) {
        if (i == sl.nP + sl.nD) {
          st = tileScaleRows(st, gam);
        }
        st = rSlabProduct(at, sl, slab, 0u, i - sl.nP - sl.nD, ch.cv, st);
      } else {
        st = rSlabProduct(at, sl, slab, SCAN_ROWS_VEC4, i - sl.nP - sl.nD - sl.nR, ch.cv, st);
      }
      g++;
    }
    pos = posLater;
  }
  // dS after a sequence's first chunk is its dh0 (the carry of the next dispatch otherwise)
  let rows = (vec4u(at.bh * p.K) + at.d) * p.V + vec4u(aDh0());
  if (at.d.x < p.K) { dh0StoreCols(rows.x, at.j, st[0]); }
  if (at.d.y < p.K) { dh0StoreCols(rows.y, at.j, st[1]); }
  if (at.d.z < p.K) { dh0StoreCols(rows.z, at.j, st[2]); }
  if (at.d.w < p.K) { dh0StoreCols(rows.w, at.j, st[3]); }
}
