// The split set's gate sums (docs/kda.md 2.2, 3.2), by channel quads: what chunkPrep (prep.wgsl)
// and the backward's gateFactors share, so that the backward forms the forward's bits again, and
// gateFactors itself, one workgroup per (chunk, head) of a slice of the backward.

// gateCumsum and gateFactors run by channel quads, straight from memory: each invocation takes a
// quad of channels (one vec4 of a row: a warp reads 32 of them, a whole row of K = 128, at once)
// and one of GQ_PARTS parts of the rows. It sums its part (gateQuadPart), the parts' totals meet in
// workgroup memory, and it sums its part again from the sum of the parts before it, forming the
// factors row by row (gateQuadRow). Integer sums are exact, so a part that restarts from the sum
// of the parts before it gives the bits of one pass, and the order of the parts' joins is free.
const GQ_QUADS: u32 = 32u;
const GQ_PARTS: u32 = WG / GQ_QUADS;

// The running sums of four channels
struct GateSums4 {
  s: array<GateSum, 4>,
}

fn gateSums4Add(a: GateSums4, g: vec4f) -> GateSums4 {
  return GateSums4(array<GateSum, 4>(
    gateSumAdd(a.s[0], g.x),
    gateSumAdd(a.s[1], g.y),
    gateSumAdd(a.s[2], g.z),
    gateSumAdd(a.s[3], g.w),
  ));
}

fn gateSums4Join(a: GateSums4, b: GateSums4) -> GateSums4 {
  return GateSums4(array<GateSum, 4>(
    gateSumJoin(a.s[0], b.s[0]),
    gateSumJoin(a.s[1], b.s[1]),
    gateSumJoin(a.s[2], b.s[2]),
    gateSumJoin(a.s[3], b.s[3]),
  ));
}

fn gateSums4Zero() -> GateSums4 {
  return GateSums4(array<GateSum, 4>(GateSum(0i, 0u), GateSum(0i, 0u), GateSum(0i, 0u), GateSum(0i, 0u)));
}

// Where an invocation works: its channel quad's first channel d in the turn from d0, its part's
// rows r0..r1 (C / GQ_PARTS rows; none past the valid rows)
struct GateQuad {
  d: u32,
  part: u32,
  r0: u32,
  r1: u32,
}

fn gateQuad(at: ChunkAt, d0: u32, lid: u32) -> GateQuad {
  let rp = (p.C + GQ_PARTS - 1u) / GQ_PARTS;
  let part = lid / GQ_QUADS;
  let r0 = min(part * rp, at.cv);
  return GateQuad(d0 + 4u * (lid % GQ_QUADS), part, r0, min(r0 + rp, at.cv));
}

// The sums of a part's rows (g is zero past K)
fn gateQuadPart(at: ChunkAt, w: GateQuad) -> GateSums4 {
  var acc = gateSums4Zero();
  for (var r = w.r0; r < w.r1; r++) {
    acc = gateSums4Add(acc, gK4(aG() + vrow(at, r) * p.K, w.d));
  }
  return acc;
}

// What a row's sums give its four channels: G as hi + lo, Qg = scale Q (.) Gamma, Kd = K (.)
// e^{G_C - G} and K (.) Gamma
struct GateRow {
  hi: vec4f,
  lo: vec4f,
  qg: vec4f,
  kd: vec4f,
  kg: vec4f,
}

fn gateQuadRow(total: GateSums4, acc: GateSums4, x: GateIn) -> GateRow {
  let f0 = gateDecays(total.s[0], acc.s[0]);
  let f1 = gateDecays(total.s[1], acc.s[1]);
  let f2 = gateDecays(total.s[2], acc.s[2]);
  let f3 = gateDecays(total.s[3], acc.s[3]);
  let gam = vec4f(f0.x, f1.x, f2.x, f3.x);
  return GateRow(
    vec4f(gateSumHi(acc.s[0]), gateSumHi(acc.s[1]), gateSumHi(acc.s[2]), gateSumHi(acc.s[3])),
    vec4f(gateSumLo(acc.s[0]), gateSumLo(acc.s[1]), gateSumLo(acc.s[2]), gateSumLo(acc.s[3])),
    p.scale * x.q * gam,
    x.k * vec4f(f0.y, f1.y, f2.y, f3.y),
    x.k * gam,
  );
}

// What a row's factors read: g, q and k at the quad's four channels. gateFactors loads the next
// row's while it stores this one's, which would otherwise hold its loads back; chunkPrep loads
// each row as it reaches it (a row ahead measured slower there; docs/kda.md 3.2).
struct GateIn {
  g: vec4f,
  q: vec4f,
  k: vec4f,
}

fn gateIn(at: ChunkAt, r: u32, d: u32) -> GateIn {
  let qk = qrow(at, r) * p.K;
  return GateIn(gK4(aG() + vrow(at, r) * p.K, d), qK4(aQ() + qk, d), kK4(aK() + qk, d));
}

// The first row's inputs of a part (none where it has no rows)
fn gateInFirst(at: ChunkAt, w: GateQuad) -> GateIn {
  if (w.r0 >= w.r1) {
    return GateIn(vec4f(0.0), vec4f(0.0), vec4f(0.0));
  }
  return gateIn(at, w.r0, w.d);
}

// e^{G_r} and e^{G_C - G_r} of a row's running sum G_r in a chunk of sum G_C (gateFactors). G_C -
// G_r is the integer sum of the gates after row r, exact before its one rounding: formed from the
// floats hi and lo, a compiler may regroup it around the G_r beside it (e^{G_r}) and lose it.
fn gateDecays(total: GateSum, acc: GateSum) -> vec2f {
  let rest = gateSumSub(total, acc);
  return decay4(vec4f(gateSumHi(acc) + gateSumLo(acc), gateSumHi(rest) + gateSumLo(rest), 0.0, 0.0)).xy;
}

// ---- gateFactors: the backward's gate sums ----

// A saved forward keeps neither the gate sums nor Kd and Qg. At the start of each slice the
// backward forms them again into the slice's gate sums (GATES, its block at the chunk's position)
// as chunkPrep formed them (gateQuad, gateQuadPart, gateQuadRow), so their bits are the ones the
// forward computed with. Its parts' totals meet in 8 KB of its own instead of chunkPrep's 24 KB,
// so that more of its workgroups share an SM.
// A part's running sums of its four channels as u32 pairs (hi, lo; hi, lo), two vec4u an invocation
var<workgroup> gfTotals: array<vec4u, 2u * WG>;

fn gfTotalsSet(i: u32, a: GateSums4) {
  gfTotals[2u * i] = vec4u(bitcast<u32>(a.s[0].hi), a.s[0].lo, bitcast<u32>(a.s[1].hi), a.s[1].lo);
  gfTotals[2u * i + 1u] = vec4u(bitcast<u32>(a.s[2].hi), a.s[2].lo, bitcast<u32>(a.s[3].hi), a.s[3].lo);
}

fn gfTotalsAt(i: u32) -> GateSums4 {
  let a = gfTotals[2u * i];
  let b = gfTotals[2u * i + 1u];
  return GateSums4(array<GateSum, 4>(
    GateSum(bitcast<i32>(a.x), a.y),
    GateSum(bitcast<i32>(a.z), a.w),
    GateSum(bitcast<i32>(b.x), b.y),
    GateSum(bitcast<i32>(b.z), b.w),
  ));
}

@compute @workgroup_size(256)
fn gateFactors(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let pos = range.n0 + chunkIndex(wg);
  if (pos >= range.n1) {
    return;
  }
  let at = slicedChunkOf(pos, wg.z);
  for (var d0 = 0u; d0 < p.K; d0 += 4u * GQ_QUADS) {
    let w = gateQuad(at, d0, lid);
    gfTotalsSet(lid, gateQuadPart(at, w));
    workgroupBarrier();
    var total = gateSums4Zero();
    var before = total;
    for (var j = 0u; j < GQ_PARTS; j++) {
      if (j == w.part) {
        before = total;
      }
      total = gateSums4Join(total, gfTotalsAt(j * GQ_QUADS + lid % GQ_QUADS));
    }
    workgroupBarrier();
    if (w.d < p.K) {
      var acc = before;
      var next = gateInFirst(at, w);
      for (var r = w.r0; r < w.r1; r++) {
        let x = next;
        if (r + 1u < w.r1) {
          next = gateIn(at, r + 1u, w.d);
        }
        acc = gateSums4Add(acc, x.g);
        let i = at.gates + r * p.K;
        let f = gateQuadRow(total, acc, x);
        gatesStoreK(xG() + i, w.d, f.hi);
        gatesStoreK(xGlo() + i, w.d, f.lo);
        gatesStoreK(xQg() + i, w.d, f.qg);
        gatesStoreK(xKd() + i, w.d, f.kd);
      }
    }
  }
}
