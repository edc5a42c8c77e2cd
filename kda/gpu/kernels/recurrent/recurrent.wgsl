// The decode kernel (kda/gpu/kernels/recurrent/mod.ts): the recurrence of docs/kda.md 2.1 over the
// tokens of one dispatch's chunk range, for one (batch entry, head, tile of BV value columns) per
// workgroup. Lane l works on column c = l / NS of the tile and holds channels
// 4 (s + NS i) .. 4 (s + NS i) + 3, i < 4, s = l % NS, of that column's state in four vec4
// registers. Per token, one reduction over the NS lanes of a column gives both the output read of
// this token and the decayed memory's answer for the next token's key (both read the same
// state), in one fixed order. The state enters from h0 (or zeros) in the first range and from ht,
// where each range leaves it, in the later ones.

var<workgroup> red: array<vec2f, 256>;

// Four channels 4 c4 .. 4 c4 + 3 of one row of a [rows, K] array, zero past K.
fn rowQ(row: u32, c4: u32) -> vec4f {
  let d = 4u * c4;
  let at = row * p.K + d;
  let last = p.B * p.T * p.H * p.K - 1u;
  let i = min(vec4u(at) + vec4u(0u, 1u, 2u, 3u), vec4u(last));
  let x = vec4f(q[i.x], q[i.y], q[i.z], q[i.w]);
  return select(vec4f(0.0), x, vec4u(d) + vec4u(0u, 1u, 2u, 3u) < vec4u(p.K));
}

fn rowK(row: u32, c4: u32) -> vec4f {
  let d = 4u * c4;
  let at = row * p.K + d;
  let last = p.B * p.T * p.H * p.K - 1u;
  let i = min(vec4u(at) + vec4u(0u, 1u, 2u, 3u), vec4u(last));
  let x = vec4f(k[i.x], k[i.y], k[i.z], k[i.w]);
  return select(vec4f(0.0), x, vec4u(d) + vec4u(0u, 1u, 2u, 3u) < vec4u(p.K));
}

// The decays e^g of four channels (1 past K, where the state is 0 anyway).
fn rowDecay(row: u32, c4: u32) -> vec4f {
  let d = 4u * c4;
  let at = row * p.K + d;
  let last = p.B * p.T * p.H * p.K - 1u;
  let i = min(vec4u(at) + vec4u(0u, 1u, 2u, 3u), vec4u(last));
  let x = vec4f(g[i.x], g[i.y], g[i.z], g[i.w]);
  return decay4(select(vec4f(0.0), x, vec4u(d) + vec4u(0u, 1u, 2u, 3u) < vec4u(p.K)));
}

// State entries (d .. d + 3, j) of head bh from h0 or ht, zero past K.
fn stateIn(bh: u32, c4: u32, j: u32, fromH0: bool, hasH0: bool) -> vec4f {
  let d = 4u * c4;
  let last = p.B * p.H * p.K * p.V - 1u;
  let i = min((vec4u(bh * p.K + d) + vec4u(0u, 1u, 2u, 3u)) * p.V + j, vec4u(last));
  var x = vec4f(0.0);
  if (fromH0) {
    if (hasH0) {
      x = vec4f(h0[i.x], h0[i.y], h0[i.z], h0[i.w]);
    }
  } else {
    x = vec4f(ht[i.x], ht[i.y], ht[i.z], ht[i.w]);
  }
  return select(vec4f(0.0), x, vec4u(d) + vec4u(0u, 1u, 2u, 3u) < vec4u(p.K));
}

fn stateOut(bh: u32, c4: u32, j: u32, x: vec4f) {
  let d = 4u * c4;
  let base = (bh * p.K + d) * p.V + j;
  if (d < p.K) {
    ht[base] = x.x;
  }
  if (d + 1u < p.K) {
    ht[base + p.V] = x.y;
  }
  if (d + 2u < p.K) {
    ht[base + 2u * p.V] = x.z;
  }
  if (d + 3u < p.K) {
    ht[base + 3u * p.V] = x.w;
  }
}

// The sums of the NS lanes of column c, in lane order: every lane of the column gets the same bits.
fn columnSum(lid: u32, c: u32, x: vec2f) -> vec2f {
  red[lid] = x;
  workgroupBarrier();
  var acc = vec2f(0.0);
  for (var i = 0u; i < p.NS; i++) {
    acc += red[c * p.NS + i];
  }
  workgroupBarrier();
  return acc;
}

@compute @workgroup_size(256)
fn recurrentScan(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let s = lid % p.NS;
  let c = lid / p.NS;
  let j = wg.x * p.BV + c;
  let live = j < p.V;
  let jj = min(j, p.V - 1u);
  let h = wg.y;
  let b = wg.z;
  let bh = b * p.H + h;
  let t0 = range.n0 * p.C;
  let t1 = min(range.n1 * p.C, p.T);
  // this lane's channel groups
  let c0 = s;
  let c1 = s + p.NS;
  let c2 = s + 2u * p.NS;
  let c3 = s + 3u * p.NS;
  let fromH0 = range.n0 == 0u;
  let hasH0 = (p.flags & HAS_H0) != 0u;
  var s0 = stateIn(bh, c0, jj, fromH0, hasH0);
  var s1 = stateIn(bh, c1, jj, fromH0, hasH0);
  var s2 = stateIn(bh, c2, jj, fromH0, hasH0);
  var s3 = stateIn(bh, c3, jj, fromH0, hasH0);
  // The first token's decay and the decayed memory's answer for its key; the current token's
  // key stays in registers from the moment it is first read.
  var row = (b * p.T + t0) * p.H + h;
  var k0 = rowK(row, c0);
  var k1 = rowK(row, c1);
  var k2 = rowK(row, c2);
  var k3 = rowK(row, c3);
  s0 *= rowDecay(row, c0);
  s1 *= rowDecay(row, c1);
  s2 *= rowDecay(row, c2);
  s3 *= rowDecay(row, c3);
  let pp0 = dot(s0, k0) + dot(s1, k1) + dot(s2, k2) + dot(s3, k3);
  var pred = columnSum(lid, c, vec2f(0.0, pp0)).y;
  for (var t = t0; t < t1; t++) {
    row = (b * p.T + t) * p.H + h;
    // the correction u = beta (v - S~^T k), written along k
    let u = beta[row] * (v[row * p.V + jj] - pred);
    s0 += k0 * u;
    s1 += k1 * u;
    s2 += k2 * u;
    s3 += k3 * u;
    // the read of this token, and the next token's decay and answer for its key
    let po = dot(s0, rowQ(row, c0)) + dot(s1, rowQ(row, c1)) + dot(s2, rowQ(row, c2)) +
      dot(s3, rowQ(row, c3));
    var pp = 0.0;
    if (t + 1u < t1) {
      let next = row + p.H;
      k0 = rowK(next, c0);
      k1 = rowK(next, c1);
      k2 = rowK(next, c2);
      k3 = rowK(next, c3);
      s0 *= rowDecay(next, c0);
      s1 *= rowDecay(next, c1);
      s2 *= rowDecay(next, c2);
      s3 *= rowDecay(next, c3);
      pp = dot(s0, k0) + dot(s1, k1) + dot(s2, k2) + dot(s3, k3);
    }
    let sums = columnSum(lid, c, vec2f(po, pp));
    pred = sums.y;
    if (live && s == 0u) {
      o[row * p.V + j] = p.scale * sums.x;
    }
  }
  if (live) {
    stateOut(bh, c0, j, s0);
    stateOut(bh, c1, j, s1);
    stateOut(bh, c2, j, s2);
    stateOut(bh, c3, j, s3);
  }
}
