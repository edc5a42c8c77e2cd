// Kernel sets are pluggable: a deliberately tiny set declared outside the package
// (tests/fixtures/kernels/tiny/) registers, compiles and runs through the same encode path as the
// package's sets, agrees with the cpu arm, and the seam names it; what it cannot run (it has no
// backward, or it asks the device for more than the device has) is a counted decline that names it.

import assert from "node:assert/strict";
import { kda, kdaVjp, resetSeamCounts, seamCounts, seamDecisions } from "../mod.ts";
import { type KernelSet, kernelSetNames, registerKernelSet } from "../kda/gpu/kernel_set.ts";
import { agreement, formatAgreement } from "../checks/compare.ts";
import { DTYPES } from "../base/dtype.ts";
import { TINY } from "./fixtures/kernels/tiny/mod.ts";
import { randomKda } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu, status } from "./_gpu.ts";

reportMissingGpu("kernel_set_test.ts");
registerKernelSet(TINY);

Deno.test("a kernel set from outside the package registers by name, and a taken name is refused", () => {
  assert.ok(kernelSetNames().includes("tiny-recurrent"));
  registerKernelSet(TINY); // the same set again: harmless
  assert.throws(
    () => registerKernelSet({ ...TINY }),
    /^RangeError: set\.name must be new: a kernel set named tiny-recurrent exists$/,
  );
  assert.throws(() => registerKernelSet({ ...TINY, name: "Tiny" }), /set\.name must be lower-case/);
});

gpuTest(
  "a tiny kernel set runs through the package's encode path, agrees with the cpu arm, and the seam names it",
  async () => {
    const bars = DTYPES.f32.bars!;
    for (const withH0 of [false, true]) {
      const x = randomKda({ B: 2, T: 37, H: 3, K: 16, V: 12 }, 5, { withH0, dtype: "f32" });
      resetSeamCounts();
      const tiny = await kda(x, { arm: "gpu", kernels: "tiny-recurrent", strict: true });
      assert.deepEqual(seamCounts().variants, { "gpu:tiny-recurrent": 1 });
      const cpu = await kda(x, { arm: "cpu", strict: true });
      for (const [name, a, b] of [["o", tiny.o, cpu.o], ["ht", tiny.ht, cpu.ht]] as const) {
        const ag = agreement(a, b);
        if (!(ag.rel <= bars.outputs)) {
          assert.fail(`${name} (h0 ${withH0}): ${formatAgreement(ag)} over ${bars.outputs}`);
        }
      }
      // the fused set on the same call gives what the tiny set gives, to the f32 bars
      const fused = await kda(x, { arm: "gpu", kernels: "fused", strict: true });
      const ag = agreement(fused.o, tiny.o);
      assert.ok(ag.rel <= bars.outputs, `fused vs tiny: ${formatAgreement(ag)}`);
    }
  },
);

gpuTest(
  "a call the tiny set cannot run (it has no backward) is a counted decline that names it",
  async () => {
    const x = randomKda({ B: 1, T: 20, H: 1, K: 8, V: 8 }, 6, { dtype: "f32" });
    const dout = new Float32Array(20 * 8).fill(0.5);
    await assert.rejects(
      () => kdaVjp(x, { dout }, { arm: "gpu", kernels: "tiny-recurrent", strict: true }),
      /the kernel set tiny-recurrent has no backward, and this call needs one/,
    );
    resetSeamCounts();
    await kdaVjp(x, { dout }, { arm: "gpu", kernels: "tiny-recurrent", quiet: true });
    assert.equal(seamCounts().declined, 1);
    const [decision] = seamDecisions();
    assert.equal(decision.wanted, "gpu");
    assert.equal(decision.ran, "cpu");
    assert.match(decision.reason, /tiny-recurrent has no backward/);
    // and a shape over the set's own limit is declined with the set's reason
    const long = randomKda({ B: 1, T: 2000, H: 1, K: 16, V: 4 }, 7, { dtype: "f32" });
    await assert.rejects(
      () => kda(long, { arm: "gpu", kernels: "tiny-recurrent", strict: true }),
      /the kernel set tiny-recurrent cannot run this call: T must keep one invocation's/,
    );
  },
);

Deno.test("options.kernels names a registered set or is refused with the known ones", async () => {
  const x = randomKda({ B: 1, T: 4, H: 1, K: 4, V: 4 }, 1);
  await assert.rejects(
    () => kda(x, { arm: "cpu", kernels: "nope" }),
    /^RangeError: options\.kernels must be one of fused, .*tiny-recurrent: got nope$/,
  );
});

gpuTest(
  "a set that asks the device for more than it has (a feature, workgroup memory, invocations) is a counted decline that names both",
  async () => {
    if (!status.available) throw new Error(status.reason);
    const { limits, description } = status.info;
    const bytes = limits.maxComputeWorkgroupStorageSize;
    const invocations = limits.maxComputeInvocationsPerWorkgroup;
    const wants: [Partial<KernelSet>, RegExp][] = [
      [
        { features: ["float32-filterable"] },
        /needs the feature float32-filterable, which the device on .* lacks \(it is created with/,
      ],
      [
        { workgroupBytes: bytes + 16 },
        new RegExp(`needs ${bytes + 16} bytes of workgroup memory, and ".*" offers ${bytes}$`),
      ],
      [
        { workgroupSize: invocations * 2 },
        new RegExp(
          `needs ${invocations * 2} invocations per workgroup, and ".*" offers ${invocations}$`,
        ),
      ],
      [
        { largestWorkgroup: invocations * 2 },
        new RegExp(
          `needs ${invocations * 2} invocations per workgroup, and ".*" offers ${invocations}$`,
        ),
      ],
    ];
    const x = randomKda({ B: 1, T: 8, H: 1, K: 4, V: 4 }, 8, { dtype: "f32" });
    for (const [i, [want, reason]] of wants.entries()) {
      const name = `tiny-asks-${i}`;
      registerKernelSet({ ...TINY, ...want, name });
      await assert.rejects(() => kda(x, { arm: "gpu", kernels: name, strict: true }), reason);
      resetSeamCounts();
      const out = await kda(x, { arm: "gpu", kernels: name, quiet: true });
      assert.equal(seamCounts().declined, 1);
      const [decision] = seamDecisions();
      assert.equal(decision.ran, "cpu");
      assert.match(decision.reason, reason);
      // the adapter is named beside what the set needs (and, for a limit, what the device offers)
      assert.ok(decision.reason.includes(description), decision.reason);
      const cpu = await kda(x, { arm: "cpu", strict: true });
      assert.deepEqual(out.o, cpu.o);
    }
  },
);
