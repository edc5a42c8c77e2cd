// The split set's saved forward keeps neither the gate sums nor Kd and Qg: the backward's first stage
// (gateFactors) forms them again. Its gradients are right only if those are the forward's own bits,
// and an f32 bar could not tell a near miss from them: this file reads both sides' buffers and
// compares every valid entry of Kd, Qg and the sums' low parts bit for bit (the high parts do not
// outlive chunkPrep, where U replaces them: Kd and Qg are formed from them).

import assert from "node:assert/strict";
import type { BackwardJob, ForwardJob } from "../kda/gpu/job.ts";
import { kernelSet } from "../kda/gpu/kernel_set.ts";
import { GATES, GLO, KD, QG } from "../kda/gpu/kernels/split/mod.ts";
import "../kda/gpu/kernels/mod.ts";
import {
  bufferElements,
  bytesOf,
  makePlan,
  sequenceChunks,
  sliceOrder,
  tableOffsets,
} from "../kda/gpu/layout.ts";
import type { ChunkSize, KdaProblem } from "../kda/_types.ts";
import { withGpuJobs } from "../bench/_run.ts";
import { firstBitDifference, randomKda } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("gate_sums_recomputed_test.ts");

const CASES: { label: string; B: number; T: number; H: number; K: number; C: ChunkSize }[] = [
  // a short last chunk, two sequences, and K = 128: one turn of the 32 channel quads
  { label: "K=128 C=64", B: 2, T: 150, H: 2, K: 128, C: 64 },
  // two turns of channel quads, and chunks of 16 rows (two rows a part)
  { label: "K=256 C=16", B: 1, T: 40, H: 1, K: 256, C: 16 },
  // K not a multiple of four: a partial quad, off the vec4 grid
  { label: "K=6 C=32", B: 1, T: 45, H: 3, K: 6, C: 32 },
];

gpuTest(
  "the split set's backward forms the forward's gate sums, Kd and Qg again bit for bit",
  async () => {
    const set = kernelSet("split");
    for (const c of CASES) {
      const V = 8;
      const x64 = randomKda({ B: c.B, T: c.T, H: c.H, K: c.K, V }, 7, { gateMin: -3 });
      const f32 = (a: unknown) => Float32Array.from(a as Float64Array);
      const x: KdaProblem<Float32Array> = {
        B: c.B,
        T: c.T,
        H: c.H,
        K: c.K,
        V,
        scale: x64.scale,
        q: f32(x64.q),
        k: f32(x64.k),
        v: f32(x64.v),
        g: f32(x64.g),
        beta: f32(x64.beta),
      };
      const dout = new Float32Array(c.B * c.T * c.H * V).fill(0.25);
      const plan = makePlan(set, { B: c.B, T: c.T, H: c.H, K: c.K, V }, c.C);
      // one slice: the gate sums' buffer then holds every chunk's block when the backward ends
      assert.equal(plan.slices.length, 1, `${c.label}: ${plan.slices.length} slices`);
      const readsOf = (job: ForwardJob | BackwardJob, names: string[]) =>
        names.map((name) => {
          const decl = set.buffers.find((b) => b.name === name)!;
          return {
            buffer: job.buffer(name)!,
            offset: 0,
            bytes: bytesOf(bufferElements(decl, plan), decl.dtype),
          };
        });
      const [forward, backward] = await withGpuJobs(
        set,
        x,
        dout,
        c.C,
        async (fjob) => (await fjob.run({ reads: readsOf(fjob, ["kd", "qg", "glo"]) })).arrays,
        async (bjob) => (await bjob.run({ reads: readsOf(bjob, ["gate sums"]) })).arrays,
      );
      const [kd, qg, glo] = forward;
      const gates = backward[0];
      const { offsets, total: gatesBlock } = tableOffsets(GATES, plan.dims);
      const sides: [string, Float32Array, number, number][] = [
        ["Kd", kd, tableOffsets(KD, plan.dims).total, offsets.Kd],
        ["Qg", qg, tableOffsets(QG, plan.dims).total, offsets.Qg],
        ["Glo", glo, tableOffsets(GLO, plan.dims).total, offsets.Glo],
      ];
      const hex = (v: number) => `0x${new Uint32Array(Float32Array.of(v).buffer)[0].toString(16)}`;
      // the backward's blocks run in slice order (the chunk at each position), the forward's by
      // chunk; chunk i of a sequence has min(C, T - i C) rows
      const { order } = sliceOrder(sequenceChunks(plan));
      let compared = 0;
      for (let pos = 0; pos < plan.NCT; pos++) {
        const chunk = order[pos];
        const n = Math.min(c.C, c.T - (chunk % plan.NC) * c.C) * c.K;
        for (let h = 0; h < c.H; h++) {
          for (const [name, fwd, fwdBlock, region] of sides) {
            const a = (chunk * c.H + h) * fwdBlock;
            const b = (pos * c.H + h) * gatesBlock + region;
            const e = firstBitDifference(fwd.subarray(a, a + n), gates.subarray(b, b + n));
            if (e >= 0) {
              assert.fail(
                `${c.label}: ${name} of chunk ${chunk}, head ${h}, row ${Math.floor(e / c.K)}, ` +
                  `channel ${e % c.K}: the backward's bits ${hex(gates[b + e])}, ` +
                  `the forward's ${hex(fwd[a + e])}`,
              );
            }
            compared += n;
          }
        }
      }
      assert.equal(compared, 3 * c.B * c.T * c.H * c.K, `${c.label}: entries compared`);
    }
  },
);
