// The in-kernel options' passes (kda/gpu/options.ts, docs/kda.md 2.8): before a kernel set's
// forward, q and k are L2-normalised, the raw gate becomes the log decay and the beta logits
// become beta; after its backward, the gradients are pulled back through those maps, and daLog
// and ddtBias are summed in a fixed order (rows in blocks, then the blocks, then the channels), with
// no atomics. The shared WGSL (kda/gpu/kernels/shared.wgsl, for decay: e^x to about one ulp) is
// prepended. Each invocation walks its elements with a grid stride.

struct Opt {
  // elements or rows of the pass
  n: u32,
  // channels per row
  K: u32,
  // value heads
  HV: u32,
  // token rows (B·T) of the gate's reductions
  rows: u32,
  // row blocks of the gate's reductions
  nblk: u32,
  flags: u32,
  lowerBound: f32,
  // beta's sigmoid factor (1 or 2)
  c: f32,
}

@group(0) @binding(0) var<uniform> op: Opt;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> c3: array<f32>;
@group(0) @binding(4) var<storage, read_write> out0: array<f32>;
@group(0) @binding(5) var<storage, read_write> out1: array<f32>;

const OPT_WG: u32 = 256u;
// rows summed by one invocation of gateReduce1
const ROW_BLOCK: u32 = 256u;
const HAS_ALOG: u32 = 1u;
const HAS_DTBIAS: u32 = 2u;
const LOWER_BOUND: u32 = 4u;
const SAVE: u32 = 8u;

fn stride(groups: vec3u) -> u32 {
  return groups.x * OPT_WG;
}

// sigmoid(x) from e^-|x| (never overflows)
fn sigm(x: f32) -> f32 {
  let e = decay(-abs(x));
  return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}

// ln(1 + u) for u in [0, 1], to a few ulp relative: 2 atanh(s), s = u / (2 + u) <= 1/3, whose
// odd series in s converges by a factor 1/9 a term (the built-in log is only accurate to 2^-21
// absolute near 1, far too coarse for small u).
fn log1pSmall(u: f32) -> f32 {
  let s = u / (2.0 + u);
  let s2 = s * s;
  var poly = 1.0 / 17.0;
  poly = poly * s2 + 1.0 / 15.0;
  poly = poly * s2 + 1.0 / 13.0;
  poly = poly * s2 + 1.0 / 11.0;
  poly = poly * s2 + 1.0 / 9.0;
  poly = poly * s2 + 1.0 / 7.0;
  poly = poly * s2 + 1.0 / 5.0;
  poly = poly * s2 + 1.0 / 3.0;
  poly = poly * s2 + 1.0;
  return 2.0 * s * poly;
}

// ln(1 + e^z) = max(z, 0) + ln(1 + e^-|z|)
fn softplusOf(z: f32) -> f32 {
  return max(z, 0.0) + log1pSmall(decay(-abs(z)));
}

// 1 / sqrt(x), refined by one Newton step from the built-in estimate
fn rsqrtOf(x: f32) -> f32 {
  let r = inverseSqrt(x);
  return r * (1.5 - 0.5 * x * r * r);
}

// e^{aLog[h]}, or 1 without aLog
fn sharpness(h: u32) -> f32 {
  return select(1.0, decay(b[h]), (op.flags & HAS_ALOG) != 0u);
}

// ---- q and k: y = x / sqrt(Σx² + eps) per row of K ----

// a: x; out0: y; out1: each row's 1 / sqrt(Σx² + eps)
@compute @workgroup_size(256)
fn l2normFwd(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var row = id.x; row < op.n; row += stride(groups)) {
    let base = row * op.K;
    var ss = 0.0;
    for (var c = 0u; c < op.K; c++) {
      ss = fma(a[base + c], a[base + c], ss);
    }
    let r = rsqrtOf(ss + L2NORM_EPS);
    for (var c = 0u; c < op.K; c++) {
      out0[base + c] = a[base + c] * r;
    }
    out1[row] = r;
  }
}

// a: y; b: r; c3: dy; out0: dx = r (dy − y (y·dy))
@compute @workgroup_size(256)
fn l2normBwd(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var row = id.x; row < op.n; row += stride(groups)) {
    let base = row * op.K;
    var dot = 0.0;
    for (var c = 0u; c < op.K; c++) {
      dot = fma(a[base + c], c3[base + c], dot);
    }
    for (var c = 0u; c < op.K; c++) {
      out0[base + c] = b[row] * (c3[base + c] - a[base + c] * dot);
    }
  }
}

// ---- the gate ----

// z = g + dtBias of element e of [rows, HV, K]
fn gateInput(raw: f32, e: u32) -> f32 {
  let hk = e % (op.HV * op.K);
  return raw + select(0.0, c3[hk], (op.flags & HAS_DTBIAS) != 0u);
}

// The log decay of z at value head h.
fn gateOf(z: f32, h: u32) -> f32 {
  let sharp = sharpness(h);
  if ((op.flags & LOWER_BOUND) != 0u) {
    return op.lowerBound * sigm(sharp * z);
  }
  return -sharp * softplusOf(z);
}

// Below this log decay the decay underflows f32 to 0 (e^-104 < 2^-149).
const DECAY_UNDERFLOW = -104.0;

// The gradient of z from that of the log decay, and the term of daLog. Where the decay underflows
// f32, the forward applied a decay of exactly 0, and the log decay's true gradient (the decay times
// a finite sum of the state's terms) is 0 in f32 too; but the chunked backward forms it from
// pairwise terms that cancel only to rounding and returns their residue, which the daLog term
// would multiply by the log decay itself (1e30 for a raw gate of 1e30, or ∞ at aLog = 88). There
// the gradient is taken as 0. Above the threshold the residue stays, times at most 104 in the
// term (docs/kda.md 2.8). The term is a gradient times a value that may have overflowed f32 (sharp
// z, or the log decay, past 3.4e38 for accepted inputs such as aLog = 88): where the gradient is
// exactly 0 the term is 0, not 0 · ∞ = NaN.
fn gateGrad(z: f32, h: u32, dyIn: f32) -> vec2f {
  let sharp = sharpness(h);
  let y = gateOf(z, h);
  let dy = select(dyIn, 0.0, y < DECAY_UNDERFLOW);
  if ((op.flags & LOWER_BOUND) != 0u) {
    // y = lb σ(u), u = sharp z
    let u = sharp * z;
    let du = dy * op.lowerBound * sigm(u) * sigm(-u);
    return vec2f(du * sharp, select(du * u, 0.0, du == 0.0));
  }
  // y = −sharp softplus(z): dy/dz = −sharp σ(z), dy/daLog = y
  return vec2f(-sharp * sigm(z) * dy, select(dy * y, 0.0, dy == 0.0));
}

// a: raw g; b: aLog; c3: dtBias; out0: the log decay; out1: z (when saving)
@compute @workgroup_size(256)
fn gateFwd(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < op.n; e += stride(groups)) {
    let z = gateInput(a[e], e);
    out0[e] = gateOf(z, (e / op.K) % op.HV);
    if ((op.flags & SAVE) != 0u) {
      out1[e] = z;
    }
  }
}

// a: z; b: aLog; c3: dy; out0: dz (the raw gate's gradient)
@compute @workgroup_size(256)
fn gateBwd(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < op.n; e += stride(groups)) {
    out0[e] = gateGrad(a[e], (e / op.K) % op.HV, c3[e]).x;
  }
}

// a: z; b: aLog; c3: dy; out0 [2, nblk, HV·K]: per block of ROW_BLOCK rows, the sums of dz and of
// the daLog terms of each (head, channel), rows ascending
@compute @workgroup_size(256)
fn gateReduce1(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  let HK = op.HV * op.K;
  for (var i = id.x; i < op.n; i += stride(groups)) {
    let blk = i / HK;
    let hk = i % HK;
    let h = hk / op.K;
    let r1 = min((blk + 1u) * ROW_BLOCK, op.rows);
    var acc = vec2f(0.0);
    for (var r = blk * ROW_BLOCK; r < r1; r++) {
      let e = r * HK + hk;
      acc += gateGrad(a[e], h, c3[e]);
    }
    out0[i] = acc.x;
    out0[op.n + i] = acc.y;
  }
}

// a: the block sums; out0: ddtBias [HV·K] (the blocks in order); out1: the daLog terms per channel
@compute @workgroup_size(256)
fn gateReduce2(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  let HK = op.HV * op.K;
  for (var hk = id.x; hk < op.n; hk += stride(groups)) {
    var acc = vec2f(0.0);
    for (var blk = 0u; blk < op.nblk; blk++) {
      acc += vec2f(a[blk * HK + hk], a[(op.nblk + blk) * HK + hk]);
    }
    if ((op.flags & HAS_DTBIAS) != 0u) {
      out0[hk] = acc.x;
    }
    out1[hk] = acc.y;
  }
}

// a: the daLog terms per channel; out0: daLog [HV] (channels in order)
@compute @workgroup_size(256)
fn gateReduce3(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var h = id.x; h < op.n; h += stride(groups)) {
    var acc = 0.0;
    for (var c = 0u; c < op.K; c++) {
      acc += a[h * op.K + c];
    }
    out0[h] = acc;
  }
}

// ---- beta = c σ(x) ----

// a: x; out0: beta; out1: x (when saving)
@compute @workgroup_size(256)
fn betaFwd(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < op.n; e += stride(groups)) {
    out0[e] = op.c * sigm(a[e]);
    if ((op.flags & SAVE) != 0u) {
      out1[e] = a[e];
    }
  }
}

// a: x; b: dy; out0: dx = dy c σ(x) σ(−x)
@compute @workgroup_size(256)
fn betaBwd(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < op.n; e += stride(groups)) {
    out0[e] = b[e] * op.c * sigm(a[e]) * sigm(-a[e]);
  }
}

// a -> out0, elementwise (a device tensor's aLog or dtBias kept for the backward)
@compute @workgroup_size(256)
fn copyArray(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < op.n; e += stride(groups)) {
    out0[e] = a[e];
  }
}
