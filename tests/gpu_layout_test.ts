// Tests of the kernel sets' declarations and of kda/gpu/layout.ts, without a GPU, for every
// registered set: the buffer regions are disjoint and in bounds, the generated WGSL header
// computes the same offsets as the TypeScript, the parameters pack as the header's struct says,
// the declaration agrees with the set's WGSL (entry points, bindings, accessors, no hand-written
// offsets), the scan ranges and the slices cover every chunk once, what a backward binds outlives
// the forward, and the limit reasons say what fits. Runs everywhere (no adapter needed).

import assert from "node:assert/strict";
import {
  bufferElements,
  type DimValues,
  f32Problem,
  limitProblem,
  makePlan,
  packParams,
  paramWords,
  sequenceChunks,
  setTables,
  shapeProblem,
  sizeOf,
  sliceOrder,
  tableOffsets,
  wgslHeader,
} from "../kda/gpu/layout.ts";
import { wgslAccessors } from "../kda/gpu/accessors.ts";
import { IN_ARRAYS, type KernelSet, kernelSet, kernelSetNames } from "../kda/gpu/kernel_set.ts";
import { SHARED_WGSL } from "../kda/gpu/device.ts";
import { gpuDebug } from "../kda/gpu/_debug.ts";
import "../kda/gpu/kernels/mod.ts";
import { FUSED, LOOP_BUDGET, scanLoopsPerChunk } from "../kda/gpu/kernels/fused/mod.ts";
import type { ChunkSize } from "../kda/_types.ts";

const SHAPES = [
  { B: 2, T: 256, H: 2, K: 32, V: 32 },
  { B: 1, T: 1, H: 1, K: 1, V: 1 },
  { B: 3, T: 100, H: 2, K: 12, V: 20 },
  { B: 1, T: 70, H: 1, K: 256, V: 256 },
  { B: 8, T: 4096, H: 16, K: 128, V: 128 },
];
const CHUNKS: ChunkSize[] = [16, 32, 64];
const SETS: KernelSet[] = kernelSetNames().map((n) => kernelSet(n));

/** Evaluates a generated WGSL offset expression ("5u * p.C * p.K + p.K") at the given dims. */
function evalWgsl(expr: string, dims: DimValues): number {
  let total = 0;
  for (const term of expr.split("+")) {
    let value = 1;
    for (const factor of term.split("*").map((f) => f.trim())) {
      const sym = factor.match(/^p\.(\w+)$/);
      if (sym !== null) value *= dims[sym[1]];
      else if (/^\d+u$/.test(factor)) value *= Number(factor.slice(0, -1));
      else throw new Error(`Unexpected factor ${factor} in ${expr}`);
    }
    total += value;
  }
  return total;
}

function headerFunctions(set: KernelSet): Map<string, string> {
  const fns = new Map<string, string>();
  for (const m of wgslHeader(set).matchAll(/fn (\w+)\(\) -> u32 \{ return (.*); \}/g)) {
    fns.set(m[1], m[2]);
  }
  return fns;
}

async function wgslOf(set: KernelSet): Promise<string> {
  return (await Promise.all(set.files.map((f) => Deno.readTextFile(f)))).join("\n");
}

Deno.test("the package registers its kernel sets, the fused one first", () => {
  assert.ok(SETS.length >= 1);
  assert.equal(SETS[0], FUSED);
  assert.throws(() => kernelSet("nope"), /^RangeError: options\.kernels must be one of fused/);
});

Deno.test("every set's buffer regions are disjoint, in order and inside the buffer", () => {
  for (const set of SETS) {
    for (const shape of SHAPES) {
      for (const C of CHUNKS) {
        const { dims } = makePlan(set, shape, C);
        for (const table of setTables(set)) {
          const { offsets, total } = tableOffsets(table, dims);
          let end = 0;
          for (const r of table.regions) {
            const size = sizeOf(r.size, dims);
            assert.ok(size > 0, `${set.name}: ${table.prefix}${r.name} is empty`);
            assert.equal(
              offsets[r.name],
              end,
              `${table.prefix}${r.name} starts where the last ends`,
            );
            end += size;
          }
          assert.equal(end, total);
        }
      }
    }
  }
});

Deno.test("every set's generated WGSL header computes the TypeScript offsets and sizes", () => {
  let checked = 0;
  for (const set of SETS) {
    const fns = headerFunctions(set);
    for (const shape of SHAPES) {
      for (const C of CHUNKS) {
        const { dims } = makePlan(set, shape, C);
        for (const table of setTables(set)) {
          const { offsets, total } = tableOffsets(table, dims);
          for (const r of table.regions) {
            const expr = fns.get(`${table.prefix}${r.name}`);
            assert.ok(
              expr !== undefined,
              `${set.name}'s header defines ${table.prefix}${r.name}()`,
            );
            assert.equal(evalWgsl(expr, dims), offsets[r.name], `${table.prefix}${r.name}()`);
            checked++;
          }
          if (table.sizeFn !== undefined) {
            assert.equal(evalWgsl(fns.get(table.sizeFn)!, dims), total, `${table.sizeFn}()`);
          }
        }
      }
    }
  }
  console.log(`  ${checked} offsets agree`);
});

Deno.test("the fused set's buffers are its region tables times the chunk blocks", () => {
  const byName = (name: string) => FUSED.buffers.find((b) => b.name === name)!;
  for (const shape of SHAPES) {
    for (const C of CHUNKS) {
      const plan = makePlan(FUSED, shape, C);
      const per = (name: string) => tableOffsets(byName(name).table, plan.dims).total;
      assert.equal(plan.chunks, shape.B * shape.H * Math.ceil(shape.T / C));
      for (const name of ["work", "states", "backward scratch", "gradient scratch"]) {
        assert.equal(bufferElements(byName(name), plan), plan.chunks * per(name), name);
      }
      assert.equal(per("states"), (shape.K + C) * shape.V);
      const nQK = shape.B * shape.T * shape.H * shape.K;
      const nV = shape.B * shape.T * shape.H * shape.V;
      const nB = shape.B * shape.T * shape.H;
      const nS = shape.B * shape.H * shape.K * shape.V;
      assert.equal(bufferElements(byName("inputs"), plan), 3 * nQK + nV + nB + nS);
      assert.equal(bufferElements(byName("outputs"), plan), nV + nS);
      assert.equal(bufferElements(byName("gradients"), plan), 3 * nQK + nV + nB + nS);
      assert.equal(bufferElements(byName("cotangents"), plan), nV + nS);
      const { VT, nVT } = plan.extra;
      assert.ok(VT >= 4 && VT < 2 * Math.max(shape.V, 4) && nVT * VT >= shape.V);
      assert.ok((nVT - 1) * VT < shape.V, "no empty V tile");
    }
  }
});

Deno.test("every set's scan ranges cover every chunk exactly once (the fused set's within the loop budget)", () => {
  for (const set of SETS) {
    for (const shape of [...SHAPES, { B: 1, T: 16384, H: 16, K: 256, V: 256 }]) {
      for (const C of CHUNKS) {
        const plan = makePlan(set, shape, C);
        const ranges = set.scanRanges(plan);
        let next = 0;
        for (const [n0, n1] of ranges) {
          assert.equal(n0, next);
          assert.ok(n1 > n0);
          next = n1;
        }
        assert.equal(next, plan.NC);
        if (set !== FUSED) continue;
        // the busiest scan invocation's loop count per range (as the fused scans iterate)
        const longest = Math.max(...ranges.map(([a, b]) => b - a));
        assert.ok(longest === 1 || 64 + longest * scanLoopsPerChunk(plan) <= LOOP_BUDGET);
        const { VT } = plan.extra;
        assert.ok(plan.K * VT <= 4096 && C * VT <= 2048 && [4, 8, 16, 32].includes(VT));
      }
    }
  }
});

Deno.test("slice order lists every chunk once, by index within its sequence, then by sequence", () => {
  for (const counts of [[3], [2, 1], [1, 0, 4, 2], [0, 0], [], [5, 5, 5]]) {
    const { order, pos } = sliceOrder(counts);
    const total = counts.reduce((a, b) => a + b, 0);
    assert.equal(order.length, total);
    const first = counts.map((_, s) => counts.slice(0, s).reduce((a, b) => a + b, 0));
    let before = [-1, -1];
    for (let p = 0; p < total; p++) {
      assert.equal(pos[order[p]], p, `${counts}: position ${p}`);
      const seq = first.findLastIndex((f, s) => f <= order[p] && counts[s] > 0);
      const key = [order[p] - first[seq], seq];
      assert.ok(key[0] > before[0] || (key[0] === before[0] && key[1] > before[1]), `${counts}`);
      before = key;
    }
  }
});

Deno.test("every set's slices cover every chunk exactly once, and a per-slice buffer holds one slice", () => {
  const packed = {
    B: 1,
    T: 0,
    H: 2,
    K: 16,
    V: 16,
    cuSeqlens: Int32Array.from([0, 5, 200, 200, 201]),
  };
  for (const set of SETS) {
    const slicedScan = set.backward?.stages.some((s) => s.scan === true && s.sliced === true);
    // many short sequences beside a long one: the first index is more than a slice holds at the
    // widest heads, and is cut into runs of sequences
    const many = Int32Array.from({ length: 202 }, (_, i) => i === 201 ? 200 * 64 + 4096 : i * 64);
    const wide = { B: 1, T: many[201], H: 16, K: 128, V: 128, cuSeqlens: many };
    for (const shape of [...SHAPES, { ...packed, T: 201 }, wide]) {
      for (const C of CHUNKS) {
        const plan = makePlan(set, shape, C);
        const what = `${set.name} ${JSON.stringify({ ...shape, cuSeqlens: undefined })} C=${C}`;
        const ranges = plan.slices;
        const counts = sequenceChunks(plan);
        const { order } = sliceOrder(counts);
        const first = counts.map((_, s) => counts.slice(0, s).reduce((a, b) => a + b, 0));
        const longest = Math.max(...set.scanRanges(plan).map(([a, b]) => b - a));
        let next = 0;
        for (const [n0, n1] of ranges) {
          assert.equal(n0, next, `${what}: slice starts`);
          assert.ok(n1 > n0 && n1 - n0 <= plan.sliceChunks, `${what}: slice [${n0}, ${n1})`);
          // a sliced scan takes each sequence's chunks of a slice in one dispatch
          for (let s = 0; slicedScan && s < counts.length; s++) {
            const mine = Array.from(order.subarray(n0, n1)).filter((c) =>
              c >= first[s] && c < first[s] + counts[s]
            );
            assert.ok(mine.length <= longest, `${what}: sequence ${s} in [${n0}, ${n1})`);
          }
          next = n1;
        }
        assert.equal(next, plan.NCT, `${what}: slices end`);
        for (const b of set.buffers.filter((b) => b.perSlice === true)) {
          const per = tableOffsets(b.table, plan.dims).total;
          assert.equal(bufferElements(b, plan), plan.sliceChunks * plan.H * per, b.name);
        }
      }
    }
  }
  // the split set's gate sums and backward and gradient scratch at the benchmarked shape: eight
  // slices of 8 chunks of each sequence, under 512 MiB together
  const split = kernelSet("split");
  const big = makePlan(split, { B: 8, T: 4096, H: 16, K: 128, V: 128 }, 64);
  const perSlice = split.buffers.filter((b) => b.perSlice === true);
  assert.deepEqual(perSlice.map((b) => b.name), [
    "gate sums",
    "backward scratch",
    "gradient scratch",
  ]);
  const bytes = perSlice.reduce((n, b) => n + bufferElements(b, big) * 4, 0);
  assert.deepEqual(big.slices.map(([n0, n1]) => n1 - n0), Array(8).fill(64));
  if (!(bytes <= 512 * 2 ** 20)) throw new Error(`the backward's scratch is ${bytes} bytes`);
});

Deno.test("the split set's slices are as even as whole indices allow", () => {
  const split = kernelSet("split");
  // two sequences of 64 chunks, a slice budget of 9 indices (18 chunks): eight slices of 8
  // indices, not seven of 9 and one of 1; then a packed batch (sequences of 64, 20 and 3 chunks)
  // under budgets of 1 to 40 chunks: as many slices as a greedy walk of whole indices under the
  // budget makes (the fewest), none over the budget
  const cases: [Parameters<typeof makePlan>[1], number[], number[]?][] = [
    [{ B: 2, T: 1024, H: 2, K: 16, V: 16 }, [18], Array(8).fill(16)],
    [
      { B: 1, T: 1390, H: 2, K: 16, V: 16, cuSeqlens: Int32Array.from([0, 1024, 1344, 1390]) },
      Array.from({ length: 40 }, (_, i) => i + 1),
    ],
  ];
  for (const [shape, budgets, expected] of cases) {
    const plain = makePlan(split, shape, 16);
    const perChunk = split.buffers.filter((b) => b.perSlice === true)
      .reduce((n, b) => n + bufferElements(b, plain) * 4, 0) / plain.NCT;
    for (const budget of budgets) {
      let plan;
      try {
        // half a chunk over, so that the budget's floor is not a rounding away from it
        gpuDebug.sliceBytes = (budget + 0.5) * perChunk;
        plan = makePlan(split, shape, 16);
      } finally {
        gpuDebug.sliceBytes = null;
      }
      const sizes = plan.slices.map(([n0, n1]) => n1 - n0);
      const what = `budget ${budget}: slices ${sizes.join(", ")}`;
      if (expected !== undefined) assert.deepEqual(sizes, expected, what);
      assert.ok(plan.sliceChunks <= budget, what);
      // the greedy walk at the full budget, by whole indices of every sequence: its slice count
      const counts = sequenceChunks(plan);
      let greedy = 0;
      for (let i0 = 0; i0 < Math.max(...counts);) {
        const at = (i: number) => counts.filter((n) => n > i).length;
        if (at(i0) > budget) {
          greedy += Math.ceil(at(i0) / budget);
          i0++;
          continue;
        }
        let sum = at(i0);
        let i1 = i0 + 1;
        while (i1 < Math.max(...counts) && sum + at(i1) <= budget) sum += at(i1++);
        greedy++;
        i0 = i1;
      }
      assert.equal(plan.slices.length, greedy, what);
    }
  }
});

Deno.test("what a backward stage binds outlives the forward, and what a saved forward keeps a backward reads", () => {
  for (const set of SETS) {
    if (set.backward === null) continue;
    const byBinding = (bind: Readonly<Record<string, string>>, stages: typeof set.forward.stages) =>
      new Set(
        stages.flatMap((st) => st.uses ?? set.bindings.map((b) => b.name)).map((b) => bind[b])
          .filter((name) => name !== undefined),
      );
    const readByBackward = byBinding(set.backward.bind, set.backward.stages);
    for (const decl of set.buffers) {
      if (readByBackward.has(decl.name)) {
        assert.notEqual(decl.lifetime, "forward", `${set.name}: the backward binds ${decl.name}`);
      }
      if (decl.lifetime === "saved") {
        assert.ok(readByBackward.has(decl.name), `${set.name}: ${decl.name} is saved, never read`);
      }
    }
  }
});

Deno.test("every set's parameters pack as its header's Params struct declares them", () => {
  for (const set of SETS) {
    const header = wgslHeader(set);
    const struct = header.match(/struct Params \{([^}]*)\}/);
    assert.ok(struct !== null);
    const fields = [...struct[1].matchAll(/(\w+): (u32|f32),/g)].map((m) => [m[1], m[2]]);
    assert.equal(fields.length, paramWords(set));
    set.params.forEach((name, i) => {
      assert.deepEqual(fields[i], [name, name === "scale" ? "f32" : "u32"]);
    });
    const plan = makePlan(set, { B: 2, T: 100, H: 3, K: 12, V: 20 }, 32);
    const bytes = packParams(set, plan, 5, 0.25);
    const u = new Uint32Array(bytes);
    const f = new Float32Array(bytes);
    const index = (name: string) => set.params.indexOf(name);
    for (const [name, value] of Object.entries({ B: 2, T: 100, C: 32, NC: 4, flags: 5 })) {
      if (index(name) >= 0) assert.equal(u[index(name)], value, `${set.name} ${name}`);
    }
    assert.equal(f[index("scale")], 0.25);
    // the params are binding 0, then the set's bindings in order
    assert.match(header, /@binding\(0\) var<uniform> p: Params;/);
    set.bindings.forEach((b, i) => {
      assert.match(header, new RegExp(`@binding\\(${i + 1}\\) var<[^>]+> ${b.name}: `));
    });
  }
});

Deno.test("every set's declaration agrees with its WGSL: entry points, bindings, arrays, flags, includes", async () => {
  for (const set of SETS) {
    const wgsl = await wgslOf(set);
    const buffers = new Set(set.buffers.map((b) => b.name));
    const bindings = new Set(set.bindings.map((b) => b.name));
    for (const direction of [set.forward, ...(set.backward ? [set.backward] : [])]) {
      for (const stage of direction.stages) {
        assert.match(wgsl, new RegExp(`@compute[^\\n]*\\n\\s*fn ${stage.entry}\\(`), stage.entry);
      }
      for (const [binding, buffer] of Object.entries(direction.bind)) {
        assert.ok(bindings.has(binding), `${set.name}: ${binding} is a declared binding`);
        assert.ok(buffers.has(buffer), `${set.name}: ${buffer} is a declared buffer`);
      }
    }
    const held = new Set<string>();
    for (const b of set.buffers) {
      for (const [region, array] of Object.entries(b.arrays ?? {})) {
        assert.ok(b.table.regions.some((r) => r.name === region), `${b.name} has region ${region}`);
        assert.ok(!held.has(array!), `${set.name}: ${array} is held by one buffer`);
        held.add(array!);
      }
    }
    // every array of the op is placed or produced (the backward's only where there is one)
    const arrays = ["q", "k", "v", "g", "beta", "h0", "o", "ht"];
    if (set.backward !== null) arrays.push("dout", "dht", "dq", "dk", "dv", "dg", "dbeta", "dh0");
    for (const a of arrays) assert.ok(held.has(a), `${set.name} holds ${a}`);
    assert.ok([...held].filter((a) => IN_ARRAYS.has(a as never)).length >= 6);
    for (const flag of ["HAS_H0", "HAS_DHT", "SAVE_STATES"] as const) {
      assert.ok(Number.isInteger(set.flags[flag]) && set.flags[flag] > 0, `${set.name} ${flag}`);
    }
    for (const name of set.include) assert.ok(name in SHARED_WGSL, `${set.name} includes ${name}`);
  }
});

Deno.test("the WGSL files have no hand-written offset functions, params or bindings", async () => {
  for (const set of SETS) {
    for (const file of [...set.files, ...set.include.map((n) => SHARED_WGSL[n])]) {
      const wgsl = await Deno.readTextFile(file);
      for (const table of setTables(set)) {
        for (const r of table.regions) {
          assert.doesNotMatch(wgsl, new RegExp(`fn ${table.prefix}${r.name}\\(`), `${file}`);
        }
        if (table.sizeFn) assert.doesNotMatch(wgsl, new RegExp(`fn ${table.sizeFn}\\(`));
      }
      assert.doesNotMatch(wgsl, /struct Params/);
      assert.doesNotMatch(wgsl, /@binding/, `${file}: the bindings are generated`);
    }
  }
});

Deno.test("every generated accessor of a set is used by its kernels and none is also written by hand", async () => {
  for (const set of SETS) {
    const kernels = await wgslOf(set);
    const accessors = wgslAccessors(set.accessors);
    const names = [...accessors.matchAll(/^fn (\w+)\(/gm)].map((m) => m[1]);
    if (set === FUSED) assert.ok(names.length >= 20, `only ${names.length} accessors generated`);
    for (const name of names) {
      assert.doesNotMatch(kernels, new RegExp(`fn ${name}\\(`), `${name} is generated`);
      // used by a kernel, or by the tile store that wraps it
      const uses = new RegExp(`\\b${name}\\(`, "g");
      const count = (kernels.match(uses)?.length ?? 0) + (accessors.match(uses)?.length ?? 0) - 1;
      assert.ok(count > 0, `${set.name}: ${name} is generated but never called`);
    }
  }
});

Deno.test("the dispatch grid is exact, and a dimension over the device's limit names it", () => {
  const plan = makePlan(FUSED, { B: 3, T: 100, H: 5, K: 32, V: 64 }, 16);
  assert.deepEqual(FUSED.forward.stages[0].grid(plan), [plan.NC, 5, 3]);
  assert.deepEqual(FUSED.forward.stages[1].grid(plan), [plan.extra.nVT, 5, 3]);
  const limits = {
    maxStorageBufferBindingSize: 2 ** 40,
    maxBufferSize: 2 ** 40,
    maxComputeWorkgroupsPerDimension: 100,
  };
  const at = (shape: { B: number; T: number; H: number }) =>
    limitProblem(FUSED, makePlan(FUSED, { ...shape, K: 4, V: 4 }, 16), limits) ?? "";
  const long = at({ B: 1, T: 16 * 101, H: 1 });
  assert.match(long, /needs 101 chunks \(or V tiles\) per sequence in one dispatch dimension/);
  assert.match(long, /at B=1 a sequence of T=1600 fits$/);
  const wide = at({ B: 1, T: 16, H: 101 });
  assert.match(wide, /needs 101 heads in one dispatch dimension, over the device's limit of 100/);
  const batch = at({ B: 101, T: 16, H: 1 });
  assert.match(batch, /needs 101 batch entries .* the largest batch that fits is B=100$/);
  assert.equal(at({ B: 100, T: 1600, H: 100 }), "");
});

Deno.test("a grid dimension over the device's limit is named by what the stage's grid counts there", () => {
  const split = kernelSet("split");
  const limits = {
    maxStorageBufferBindingSize: 2 ** 40,
    maxBufferSize: 2 ** 40,
    maxComputeWorkgroupsPerDimension: 100,
  };
  const at = (H: number, K: number) =>
    limitProblem(split, makePlan(split, { B: 1, T: 16, H, K, V: 4 }, 16), limits) ?? "";
  // Stage E takes 64 channels a workgroup: at K = 256 a head is four workgroups in z
  const grouped = at(26, 256);
  assert.match(
    grouped,
    /^The shape needs 104 heads × channel groups of 64 in one dispatch dimension/,
  );
  assert.match(grouped, /not even B=1, T=1 fits at H=26, K=256, V=4$/);
  assert.equal(at(25, 256), "");
  assert.equal(at(100, 64), "");
  assert.match(at(101, 64), /^The shape needs 101 heads in one dispatch dimension/);
});

Deno.test("shape, scale and limit reasons are sentences that name the value", () => {
  assert.equal(
    shapeProblem({ B: 1, T: 2, H: 1, K: 257, V: 4 }, 16),
    "K must be at most 256: got 257",
  );
  assert.equal(
    shapeProblem({ B: 0, T: 2, H: 1, K: 4, V: 4 }, 16),
    "B must be a positive integer: got 0",
  );
  assert.equal(
    shapeProblem({ B: 1, T: 2, H: 1, K: 4, V: 4 }, 8),
    "chunkSize must be 16, 32 or 64: got 8",
  );
  assert.match(f32Problem("scale", 1e39) ?? "", /^scale must be finite in f32: got 1e\+39/);
  assert.match(f32Problem("scale", 1e-50) ?? "", /^scale must be representable in f32/);
  assert.match(
    f32Problem("lowerBound", -1e39) ?? "",
    /^lowerBound must be finite in f32: got -1e\+39, which rounds to -Infinity$/,
  );
  assert.equal(f32Problem("scale", 0), null);
  assert.equal(f32Problem("scale", 3e38), null);
  const limits = {
    maxStorageBufferBindingSize: 1 << 27,
    maxBufferSize: 2 ** 31,
    maxComputeWorkgroupsPerDimension: 65535,
  };
  const at = (B: number) =>
    limitProblem(FUSED, makePlan(FUSED, { B, T: 4096, H: 2, K: 32, V: 32 }, 64), limits);
  const reason = at(64) ?? "";
  assert.match(reason, /largest batch that fits is B=(\d+)/);
  assert.match(reason, /kernels fused/);
  const fitB = Number(reason.match(/B=(\d+)$/)![1]);
  assert.equal(at(fitB), null);
  assert.notEqual(at(fitB + 1), null);
});

Deno.test("a slice holds no more chunks than its per-slice buffers can bind, so a call the binding limit allows in two slices is not refused", () => {
  const split = kernelSet("split");
  // a software adapter's limits: 128 MiB a binding
  const limits = {
    maxStorageBufferBindingSize: 2 ** 27,
    maxBufferSize: 2 ** 31,
    maxComputeWorkgroupsPerDimension: 65535,
  };
  const shape = { B: 1, T: 4096, H: 16, K: 64, V: 1 };
  // by the set's byte budget alone, one slice of 64 chunks: 135 MB of gradient scratch
  const unbounded = makePlan(split, shape, 64);
  assert.equal(unbounded.slices.length, 1);
  assert.match(limitProblem(split, unbounded, limits) ?? "", /gradient scratch buffer needs/);
  const bounded = makePlan(split, shape, 64, 2 ** 27);
  assert.equal(bounded.slices.length, 2);
  assert.equal(limitProblem(split, bounded, limits), null);
  // every per-slice buffer binds
  for (const b of split.buffers.filter((b) => b.perSlice === true)) {
    assert.ok(bufferElements(b, bounded) * 4 <= 2 ** 27, b.name);
  }
  // and where the set's budget already fits, the bound changes nothing
  const small = { B: 1, T: 1024, H: 4, K: 64, V: 64 };
  assert.deepEqual(makePlan(split, small, 64, 2 ** 27).slices, makePlan(split, small, 64).slices);
});
