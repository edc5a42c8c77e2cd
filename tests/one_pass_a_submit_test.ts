// The gpu arm encodes the stages of each submit in one compute pass (kda/gpu/encode.ts, docs/kda.md
// 3.2): a kda on GpuTensors and a kdaVjp, with each kernel set of several stages, encode as many
// compute passes as they submit command buffers, with more dispatches than passes. (A timed run,
// bench/gpu.ts's stage times, keeps a pass a stage.)

import assert from "node:assert/strict";
import { kda, kdaVjp } from "../mod.ts";
import { releaseTensors, toGpu } from "../kda/gpu/tensor.ts";
import { kernelSet, kernelSetNames } from "../kda/gpu/kernel_set.ts";
import "../kda/gpu/kernels/mod.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("one_pass_a_submit_test.ts");

/** Counts compute passes, dispatches and submits while `fn` runs. */
async function counting<T>(
  fn: () => Promise<T>,
): Promise<{ out: T; passes: number; dispatches: number; submits: number }> {
  const pass = GPUCommandEncoder.prototype.beginComputePass;
  const dispatch = GPUComputePassEncoder.prototype.dispatchWorkgroups;
  const submit = GPUQueue.prototype.submit;
  let passes = 0, dispatches = 0, submits = 0;
  GPUCommandEncoder.prototype.beginComputePass = function (
    this: GPUCommandEncoder,
    ...args: Parameters<typeof pass>
  ) {
    passes++;
    return pass.apply(this, args);
  };
  GPUComputePassEncoder.prototype.dispatchWorkgroups = function (
    this: GPUComputePassEncoder,
    ...args: Parameters<typeof dispatch>
  ) {
    dispatches++;
    return dispatch.apply(this, args);
  };
  GPUQueue.prototype.submit = function (this: GPUQueue, ...args: Parameters<typeof submit>) {
    submits += args[0].length;
    return submit.apply(this, args);
  };
  try {
    const out = await fn();
    return { out, passes, dispatches, submits };
  } finally {
    GPUCommandEncoder.prototype.beginComputePass = pass;
    GPUComputePassEncoder.prototype.dispatchWorkgroups = dispatch;
    GPUQueue.prototype.submit = submit;
  }
}

const [B, T, H, K, V] = [1, 40, 2, 16, 16];
const wave = (n: number, s: number, o = 0) =>
  Float32Array.from({ length: n }, (_, i) => o + s * Math.sin(0.37 * i + 0.1));

gpuTest(
  "each submit of a kda and a kdaVjp on GpuTensors encodes its stages in one compute pass",
  async () => {
    const x = {
      B,
      T,
      H,
      K,
      V,
      q: await toGpu(wave(B * T * H * K, 0.3), [B, T, H, K]),
      k: await toGpu(wave(B * T * H * K, 0.3), [B, T, H, K]),
      v: await toGpu(wave(B * T * H * V, 1), [B, T, H, V]),
      g: await toGpu(wave(B * T * H * K, 0.04, -0.05), [B, T, H, K]),
      beta: await toGpu(wave(B * T * H, 0.2, 0.5), [B, T, H]),
    };
    const dout = await toGpu(wave(B * T * H * V, 0.1), [B, T, H, V]);
    try {
      // the sets with a backward and more than one forward stage (fused and split; recurrent has a
      // forward of one stage and no backward)
      const sets = kernelSetNames().filter((name) => {
        const set = kernelSet(name);
        return set.backward !== undefined && set.forward.stages.length > 1;
      });
      assert.ok(sets.includes("split") && sets.includes("fused"), `sets: ${sets.join(", ")}`);
      for (const kernels of sets) {
        const options = { arm: "gpu", strict: true, quiet: true, chunkSize: 16, kernels } as const;
        // the first calls compile the set's pipelines; count the ones after them
        releaseTensors(await kda(x, options));
        releaseTensors(await kdaVjp(x, { dout }, options));
        const forward = await counting(() => kda(x, options));
        await forward.out.ht.read();
        releaseTensors(forward.out);
        const both = await counting(() => kdaVjp(x, { dout }, options));
        await both.out.dbeta.read();
        releaseTensors(both.out);
        for (const [what, c] of [["kda", forward], ["kdaVjp", both]] as const) {
          if (!(c.submits >= 1 && c.passes === c.submits && c.dispatches > c.passes)) {
            assert.fail(
              `${kernels} ${what}: expected one compute pass a submit over the stages' dispatches, ` +
                `got ${c.passes} passes, ${c.submits} submits, ${c.dispatches} dispatches`,
            );
          }
        }
      }
    } finally {
      releaseTensors(x);
      releaseTensors({ dout });
    }
  },
);
