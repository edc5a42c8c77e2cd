// The WGSL every kernel set shares, included by name ("shared", see kda/gpu/device.ts): the exact
// exp of the decays (and the built-in one for gradient stages), the fixed-point gate sums, the
// register-tile helpers and the stage barrier. It binds no buffer, so any set can include it;
// docs/kda.md 2.2 has the math.

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
// Below -103 the true value is at most the smallest f32 denormal (e^-103.3 = 2^-149), so it is
// returned as 0: a decay there must clear the state, however large (a denormal times 1e38 is not
// negligible). Clamping the argument keeps n ln2_hi exact.
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
  return select(ldexp(poly, vec4<i32>(n)), vec4f(0.0), x < vec4f(-103.0));
}

// e^x of one exponent, as decay4
fn decay(x: f32) -> f32 {
  return decay4(vec4f(x)).x;
}

// e^x (x <= 0) through the built-in exp, for the backward's gradient stages alone: WGSL allows it
// 3 + 2|x| ulps, at most about 5 ulps (under 6e-7 relative) for the decays near 1 that carry a
// sum, more only where e^x is small beside them: well inside the gradients' 2e-5 bar. The forward
// keeps decay4 (its 2e-6 bar is the reason decay4 exists), and so does anything whose bits must
// meet the forward's. On the H200 decay4's reduction, polynomial and scaling took a third of
// pairwiseGrads (docs/kda.md 3.2). Below -103 the result is 0, as decay4's.
fn coarseDecay4(x: vec4f) -> vec4f {
  return select(exp(x), vec4f(0.0), x < vec4f(-103.0));
}

// ---- the fixed-point gate sums ----

// A running sum of gates in 64-bit fixed point with 40 fractional bits: a gate g becomes the
// integer pair (floor(256 g), frac(256 g) 2^32), and integer sums are exact (and safe from the
// float reassociation shader compilers may apply). The sum is read as hi + lo: hi, a multiple of
// 2^-8, and lo in [0, 2^-8), so that differences of two sums are accurate relative to themselves.
struct GateSum {
  hi: i32,
  lo: u32,
}

fn gateSumAdd(acc: GateSum, g: f32) -> GateSum {
  // A gate below -1000 decays to exactly 0 in f32 at any span it is part of; clamping it there
  // keeps |G| * 256 under 2^24 over a chunk of 64, so hi = f32(acc.hi) / 256 stays exact.
  let scaled = max(g, -1000.0) * 256.0;
  let whole = floor(scaled);
  let gateLo = u32((scaled - whole) * 4294967296.0);
  let lo = acc.lo + gateLo;
  return GateSum(acc.hi + i32(whole) + select(0i, 1i, lo < gateLo), lo);
}

// The multiple of 2^-8 of the sum (exact in f32)
fn gateSumHi(acc: GateSum) -> f32 {
  return f32(acc.hi) * (1.0 / 256.0);
}

// The rest of the sum, in [0, 2^-8)
fn gateSumLo(acc: GateSum) -> f32 {
  return f32(acc.lo) * (1.0 / 1099511627776.0);
}

// ---- register tiles ----

// A 4 x 4 register tile is a mat4x4f whose column i holds row i of the block, one vec4 over four
// columns (or channels): constant indices only, so it stays in registers (a function-scope array
// indexed at run time would spill). The vec4 loads and stores that fill and empty tiles, one per
// storage buffer, come from kda/gpu/accessors.ts (workK4, gsAt4, workStoreTri, ...).

// The rows r..r + 3 of a block, clamped to the last valid row for reads.
fn rows4(r: u32, last: u32) -> vec4u {
  return min(vec4u(r) + vec4u(0u, 1u, 2u, 3u), vec4u(last));
}

// Block blk of a grid of 4 x 4 blocks, nCols blocks to a row: its first row and first column, and
// its rows and columns clamped to the last valid row for reads (cols only where columns are rows).
struct Block {
  r: u32,
  c: u32,
  rows: vec4u,
  cols: vec4u,
}

fn blockOf(blk: u32, nCols: u32, last: u32) -> Block {
  let r = 4u * (blk / nCols);
  let c = 4u * (blk % nCols);
  return Block(r, c, rows4(r, last), rows4(c, last));
}

// t + lhs_i rhs for each row i: one step of a sum of outer products, in fused multiply-adds.
fn tileFma(t: mat4x4f, lhs: vec4f, rhs: vec4f) -> mat4x4f {
  return mat4x4f(
    fma(vec4f(lhs.x), rhs, t[0]),
    fma(vec4f(lhs.y), rhs, t[1]),
    fma(vec4f(lhs.z), rhs, t[2]),
    fma(vec4f(lhs.w), rhs, t[3]),
  );
}

// t + lhs_i rhs_i for each row i (each row with its own right-hand vec4).
fn tileFmaRows(t: mat4x4f, lhs: vec4f, rhs: mat4x4f) -> mat4x4f {
  return mat4x4f(
    fma(vec4f(lhs.x), rhs[0], t[0]),
    fma(vec4f(lhs.y), rhs[1], t[1]),
    fma(vec4f(lhs.z), rhs[2], t[2]),
    fma(vec4f(lhs.w), rhs[3], t[3]),
  );
}

// Row i of t times s_i.
fn tileScaleRows(t: mat4x4f, s: vec4f) -> mat4x4f {
  return mat4x4f(s.x * t[0], s.y * t[1], s.z * t[2], s.w * t[3]);
}

// Column c of t times s_c.
fn tileScaleCols(t: mat4x4f, s: vec4f) -> mat4x4f {
  return mat4x4f(s * t[0], s * t[1], s * t[2], s * t[3]);
}

// Storage writes of one stage must be visible to every invocation of the workgroup in the next.
fn stageBarrier() {
  storageBarrier();
  workgroupBarrier();
}

