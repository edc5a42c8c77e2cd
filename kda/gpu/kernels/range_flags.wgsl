// The value checks of a call's uploaded host arrays (kda/gpu/range_checks.ts): one flag a check,
// set when some element lies outside the check's closed interval. The elements are compared by
// their bits, never as floats: a shader may assume that no NaN or infinity occurs and may flush
// subnormals, so a float comparison could pass what the host's check refuses. Each f32's bits map
// to an order key (negative floats with every bit flipped, the others with the sign bit set), which
// orders the keys of all non-NaN floats as the floats are ordered; every NaN's key lies past both
// infinities', so no interval of finite bounds holds it. The host turns the bounds into keys.

struct RangeFlags {
  // elements of this dispatch's slice of the array
  n: u32,
  // the interval's order keys
  lo: u32,
  hi: u32,
  // the check's flag
  slot: u32,
}

@group(0) @binding(0) var<uniform> rp: RangeFlags;
@group(0) @binding(1) var<storage, read> values: array<u32>;
@group(0) @binding(2) var<storage, read_write> flags: array<u32>;

const RANGE_WG: u32 = 256u;

fn orderKey(bits: u32) -> u32 {
  return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

// Every invocation walks its elements with a grid stride; one that meets an element outside
// stores 1 to the check's flag. Every such store writes the same value, so the flag does not
// depend on their order, and nothing is summed.
@compute @workgroup_size(256)
fn rangeFlags(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  var outside = false;
  for (var e = id.x; e < rp.n; e += groups.x * RANGE_WG) {
    let key = orderKey(values[e]);
    outside = outside || key < rp.lo || key > rp.hi;
  }
  if (outside) {
    flags[rp.slot] = 1u;
  }
}
