// The gpu arm's glue passes (kda/gpu/glue.ts): element-wise moves that let a kernel set without
// native grouped value heads or packed batches run them (docs/kda.md 2.5, 2.6). Each invocation
// walks the elements with a grid stride; sums run in one fixed order, with no atomics.

struct Glue {
  // elements of the destination
  n: u32,
  // elements per row (X, or HV * X for rows of tokens)
  width: u32,
  // value heads per query/key head, or the padded length Tmax
  g: u32,
  // sequences of a packed batch
  seqs: u32,
}

@group(0) @binding(0) var<uniform> gp: Glue;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;

const GLUE_WG: u32 = 256u;

fn stride(groups: vec3u) -> u32 {
  return groups.x * GLUE_WG;
}

// dst [rows, H * G, X] from src [rows, H, X]: value head j reads query/key head j / G.
// width = X; g = G; heads of src = (n / rows) ... taken from the index: e = (row * H * G + j) * X + c
@compute @workgroup_size(256)
fn expandHeads(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < gp.n; e += stride(groups)) {
    let c = e % gp.width;
    let head = e / gp.width; // row * H * G + j
    // head / G = row * H + j / G: the source row of heads
    dst[e] = src[(head / gp.g) * gp.width + c];
  }
}

// dst [rows, H, X] = sum over g < G of src [rows, H * G, X] at head i * G + g, g ascending.
@compute @workgroup_size(256)
fn sumHeads(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < gp.n; e += stride(groups)) {
    let c = e % gp.width;
    let head = e / gp.width; // row * H + i
    var acc = src[(head * gp.g) * gp.width + c];
    for (var k = 1u; k < gp.g; k++) {
      acc += src[(head * gp.g + k) * gp.width + c];
    }
    dst[e] = acc;
  }
}

// dst [N, Tmax, width] from src [T, width] packed by offsets: rows past a sequence's end are zero.
@compute @workgroup_size(256)
fn padRows(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < gp.n; e += stride(groups)) {
    let c = e % gp.width;
    let row = e / gp.width;
    let s = row / gp.g;
    let t = row % gp.g;
    let start = offsets[s];
    var value = 0.0;
    if (start + t < offsets[s + 1u]) {
      value = src[(start + t) * gp.width + c];
    }
    dst[e] = value;
  }
}

// dst [T, width] packed by offsets from src [N, Tmax, width].
@compute @workgroup_size(256)
fn unpadRows(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  for (var e = id.x; e < gp.n; e += stride(groups)) {
    let c = e % gp.width;
    let row = e / gp.width;
    // the sequence holding the packed row: the last s with offsets[s] <= row (binary search)
    var lo = 0u;
    var hi = gp.seqs - 1u;
    while (lo < hi) {
      let mid = (lo + hi + 1u) / 2u;
      if (offsets[mid] <= row) {
        lo = mid;
      } else {
        hi = mid - 1u;
      }
    }
    dst[e] = src[(lo * gp.g + row - offsets[lo]) * gp.width + c];
  }
}
