// Tests of kda/gpu/layout.ts without a GPU: the buffer regions are disjoint and in bounds, the
// generated WGSL header computes the same offsets as the TypeScript, the scan ranges cover every
// chunk once, the parameters pack as the header's struct says, and the limit reasons say what
// fits. Runs everywhere (no adapter needed).

import assert from "node:assert/strict";
import {
  BINDINGS,
  type DimValues,
  FORWARD_STAGES,
  limitProblem,
  LOOP_BUDGET,
  makePlan,
  packParams,
  PARAM_FIELDS,
  PARAM_WORDS,
  type Plan,
  scaleProblem,
  scanLoopsPerChunk,
  scanRanges,
  shapeProblem,
  sizeOf,
  stageGrid,
  STAGES,
  tableOffsets,
  TABLES,
  wgslHeader,
} from "../kda/gpu/layout.ts";
import { wgslAccessors } from "../kda/gpu/accessors.ts";
import type { ChunkSize } from "../kda/_types.ts";

const SHAPES = [
  { B: 2, T: 256, H: 2, K: 32, V: 32 },
  { B: 1, T: 1, H: 1, K: 1, V: 1 },
  { B: 3, T: 100, H: 2, K: 12, V: 20 },
  { B: 1, T: 70, H: 1, K: 256, V: 256 },
  { B: 8, T: 4096, H: 16, K: 128, V: 128 },
];
const CHUNKS: ChunkSize[] = [16, 32, 64];

/** Evaluates a generated WGSL offset expression ("5u * p.C * p.K + p.K") at the given dims. */
function evalWgsl(expr: string, dims: DimValues): number {
  let total = 0;
  for (const term of expr.split("+")) {
    let value = 1;
    for (const factor of term.split("*").map((f) => f.trim())) {
      const sym = factor.match(/^p\.([A-Z])$/);
      if (sym !== null) value *= dims[sym[1] as keyof DimValues];
      else if (/^\d+u$/.test(factor)) value *= Number(factor.slice(0, -1));
      else throw new Error(`Unexpected factor ${factor} in ${expr}`);
    }
    total += value;
  }
  return total;
}

function headerFunctions(): Map<string, string> {
  const fns = new Map<string, string>();
  for (const m of wgslHeader().matchAll(/fn (\w+)\(\) -> u32 \{ return (.*); \}/g)) {
    fns.set(m[1], m[2]);
  }
  return fns;
}

Deno.test("every buffer's regions are disjoint, in order and inside the buffer", () => {
  for (const shape of SHAPES) {
    for (const C of CHUNKS) {
      const { dims } = makePlan(shape, C);
      for (const table of TABLES) {
        const { offsets, total } = tableOffsets(table, dims);
        let end = 0;
        for (const r of table.regions) {
          const size = sizeOf(r.size, dims);
          assert.ok(size > 0, `${table.prefix}${r.name} is empty`);
          assert.equal(offsets[r.name], end, `${table.prefix}${r.name} starts where the last ends`);
          end += size;
        }
        assert.equal(end, total);
      }
    }
  }
});

Deno.test("the generated WGSL header computes the TypeScript offsets and sizes", () => {
  const fns = headerFunctions();
  let checked = 0;
  for (const shape of SHAPES) {
    for (const C of CHUNKS) {
      const { dims } = makePlan(shape, C);
      for (const table of TABLES) {
        const { offsets, total } = tableOffsets(table, dims);
        for (const r of table.regions) {
          const expr = fns.get(`${table.prefix}${r.name}`);
          assert.ok(expr !== undefined, `the header defines ${table.prefix}${r.name}()`);
          assert.equal(evalWgsl(expr, dims), offsets[r.name], `${table.prefix}${r.name}()`);
          checked++;
        }
        if (table.sizeFn !== undefined) {
          assert.equal(evalWgsl(fns.get(table.sizeFn)!, dims), total, `${table.sizeFn}()`);
        }
      }
    }
  }
  console.log(`  ${checked} offsets agree`);
});

Deno.test("the plan's buffer sizes are the region tables times the chunk blocks", () => {
  for (const shape of SHAPES) {
    for (const C of CHUNKS) {
      const plan = makePlan(shape, C);
      const per = (prefix: string) =>
        tableOffsets(TABLES.find((t) => t.prefix === prefix)!, plan.dims).total;
      assert.equal(plan.chunks, shape.B * shape.H * Math.ceil(shape.T / C));
      assert.equal(plan.floats.work, plan.chunks * per("w"));
      assert.equal(plan.floats.bw, plan.chunks * per("b"));
      assert.equal(plan.floats.gs, plan.chunks * per("g"));
      assert.equal(plan.floats.states, plan.chunks * (shape.K + C) * shape.V);
      const nQK = shape.B * shape.T * shape.H * shape.K;
      const nV = shape.B * shape.T * shape.H * shape.V;
      const nB = shape.B * shape.T * shape.H;
      const nS = shape.B * shape.H * shape.K * shape.V;
      assert.equal(plan.floats.inputsWithH0, 3 * nQK + nV + nB + nS);
      assert.equal(plan.floats.outputs, nV + nS);
      assert.equal(plan.floats.grads, 3 * nQK + nV + nB + nS);
      assert.equal(plan.floats.cotangents, nV + nS);
      assert.ok(
        plan.VT >= 4 && plan.VT < 2 * Math.max(shape.V, 4) && plan.nVT * plan.VT >= shape.V,
      );
      assert.ok((plan.nVT - 1) * plan.VT < shape.V, "no empty V tile");
    }
  }
});

Deno.test("the scan ranges cover every chunk exactly once and respect the loop budget", () => {
  for (const shape of [...SHAPES, { B: 1, T: 16384, H: 16, K: 256, V: 256 }]) {
    for (const C of CHUNKS) {
      const plan: Plan = makePlan(shape, C);
      const ranges = scanRanges(plan);
      let next = 0;
      for (const [n0, n1] of ranges) {
        assert.equal(n0, next);
        assert.ok(n1 > n0);
        next = n1;
      }
      assert.equal(next, plan.NC);
      // the busiest scan invocation's loop count per range (as chunk.wgsl's scans iterate)
      const longest = Math.max(...ranges.map(([a, b]) => b - a));
      assert.ok(longest === 1 || 64 + longest * scanLoopsPerChunk(plan) <= LOOP_BUDGET);
      assert.ok(
        plan.K * plan.VT <= 4096 && C * plan.VT <= 2048 && [4, 8, 16, 32].includes(plan.VT),
      );
    }
  }
});

Deno.test("the parameters pack as the header's Params struct declares them", () => {
  const header = wgslHeader();
  const struct = header.match(/struct Params \{([^}]*)\}/);
  assert.ok(struct !== null);
  const fields = [...struct[1].matchAll(/(\w+): (u32|f32),/g)].map((m) => [m[1], m[2]]);
  assert.equal(fields.length, PARAM_WORDS);
  PARAM_FIELDS.forEach(([name, type], i) => assert.deepEqual(fields[i], [name, type]));
  const plan = makePlan({ B: 2, T: 100, H: 3, K: 12, V: 20 }, 32);
  const bytes = packParams(plan, 5, 0.25);
  const u = new Uint32Array(bytes);
  const f = new Float32Array(bytes);
  const index = (name: string) => PARAM_FIELDS.findIndex(([n]) => n === name);
  assert.equal(u[index("B")], 2);
  assert.equal(u[index("T")], 100);
  assert.equal(u[index("C")], 32);
  assert.equal(u[index("NC")], 4);
  assert.equal(u[index("flags")], 5);
  assert.equal(f[index("scale")], 0.25);
  // the header binds what the TypeScript binds, in order
  BINDINGS.forEach((b, i) => {
    assert.match(header, new RegExp(`@binding\\(${i}\\) var<[^>]+> ${b.name}: `));
  });
  assert.deepEqual(FORWARD_STAGES, STAGES.slice(0, 2));
});

Deno.test("the WGSL files have no hand-written offset functions left", async () => {
  for (
    const file of ["../kda/chunk.wgsl", "../kda/gpu/scans.wgsl", "../kda/gpu/intra_backward.wgsl"]
  ) {
    const wgsl = await Deno.readTextFile(new URL(file, import.meta.url));
    for (const name of ["wG", "wGam", "gKd", "gBv", "workSize", "bwSize", "gsSize", "stateSize"]) {
      assert.doesNotMatch(wgsl, new RegExp(`fn ${name}\\(`), `${file}: ${name} is generated`);
    }
    assert.doesNotMatch(wgsl, /struct Params/);
    assert.doesNotMatch(wgsl, /@binding/, `${file}: the bindings are generated`);
  }
});

Deno.test("every generated accessor is used by the kernels and none is also written by hand", async () => {
  const kernels = (await Promise.all(
    ["../kda/chunk.wgsl", "../kda/gpu/scans.wgsl", "../kda/gpu/intra_backward.wgsl"].map((f) =>
      Deno.readTextFile(new URL(f, import.meta.url))
    ),
  )).join("\n");
  const accessors = wgslAccessors();
  const names = [...accessors.matchAll(/^fn (\w+)\(/gm)].map((m) => m[1]);
  assert.ok(names.length >= 20, `only ${names.length} accessors generated`);
  for (const name of names) {
    assert.doesNotMatch(kernels, new RegExp(`fn ${name}\\(`), `${name} is generated`);
    // used by a kernel, or by the tile store that wraps it
    const uses = new RegExp(`\\b${name}\\(`, "g");
    const count = (kernels.match(uses)?.length ?? 0) + (accessors.match(uses)?.length ?? 0) - 1;
    assert.ok(count > 0, `${name} is generated but never called`);
  }
});

Deno.test("the dispatch grid is exact, and a dimension over the device's limit names it", () => {
  const plan = makePlan({ B: 3, T: 100, H: 5, K: 32, V: 64 }, 16);
  assert.deepEqual(stageGrid(plan, "intraChunk"), [plan.NC, 5, 3]);
  assert.deepEqual(stageGrid(plan, "stateScan"), [plan.nVT, 5, 3]);
  const limits = {
    maxStorageBufferBindingSize: 2 ** 40,
    maxBufferSize: 2 ** 40,
    maxComputeWorkgroupsPerDimension: 100,
  };
  const long = limitProblem(makePlan({ B: 1, T: 16 * 101, H: 1, K: 4, V: 4 }, 16), limits) ?? "";
  assert.match(long, /needs 101 chunks \(or V tiles\) per sequence in one dispatch dimension/);
  assert.match(long, /the longest sequence that fits is T=1600$/);
  const wide = limitProblem(makePlan({ B: 1, T: 16, H: 101, K: 4, V: 4 }, 16), limits) ?? "";
  assert.match(wide, /needs 101 heads in one dispatch dimension, over the device's limit of 100/);
  const batch = limitProblem(makePlan({ B: 101, T: 16, H: 1, K: 4, V: 4 }, 16), limits) ?? "";
  assert.match(batch, /needs 101 batch entries .* the largest batch that fits is B=100$/);
  assert.equal(limitProblem(makePlan({ B: 100, T: 1600, H: 100, K: 4, V: 4 }, 16), limits), null);
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
  assert.match(scaleProblem(1e39) ?? "", /^scale must be finite in f32: got 1e\+39/);
  assert.match(scaleProblem(1e-50) ?? "", /^scale must be representable in f32/);
  assert.equal(scaleProblem(0), null);
  assert.equal(scaleProblem(3e38), null);
  const limits = {
    maxStorageBufferBindingSize: 1 << 27,
    maxBufferSize: 2 ** 31,
    maxComputeWorkgroupsPerDimension: 65535,
  };
  const reason = limitProblem(makePlan({ B: 64, T: 4096, H: 2, K: 32, V: 32 }, 64), limits) ?? "";
  assert.match(reason, /largest batch that fits is B=(\d+)/);
  assert.doesNotMatch(reason, /larger chunk size/);
  const fitB = Number(reason.match(/B=(\d+)$/)![1]);
  assert.equal(limitProblem(makePlan({ B: fitB, T: 4096, H: 2, K: 32, V: 32 }, 64), limits), null);
  assert.notEqual(
    limitProblem(makePlan({ B: fitB + 1, T: 4096, H: 2, K: 32, V: 32 }, 64), limits),
    null,
  );
});
