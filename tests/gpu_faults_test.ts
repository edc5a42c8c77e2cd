// Faults of the `gpu` arm (issue 8 "Faults"): a device destroyed while calls are in flight, and a
// GPU out-of-memory error reported through the error scopes. Both must surface as named errors,
// never as wrong numbers, and leave nothing cached in a broken state: the next call works (on a
// fresh device after a loss) and gives the same bits as before the fault.
//
// A separate file, so that destroying the device cannot disturb the other GPU tests.

import assert from "node:assert/strict";
import type { KdaGrads, KdaProblem } from "../kda/_types.ts";
import {
  gpuBackward,
  gpuDiagnostics,
  GpuError,
  gpuForward,
  gpuLiveBuffers,
  gpuStatus,
  gpuUnsupportedReason,
} from "../kda/gpu/mod.ts";
import { destroyDeviceForTests } from "../kda/gpu/device.ts";
import { gpuDebug } from "../kda/gpu/_debug.ts";
import { gpuSettled, kda, releaseTensors, toGpuInputs } from "../mod.ts";
import { firstBitDifference, mulberry32, randomKda } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu, runChild } from "./_gpu.ts";

reportMissingGpu("gpu_faults_test");

const SHAPE = { B: 2, T: 256, H: 2, K: 32, V: 32 };
const GRADS = ["dq", "dk", "dv", "dg", "dbeta", "dh0"] as const;

function inputs(): { x: KdaProblem<Float32Array>; dout: Float32Array } {
  const x = randomKda(SHAPE, 21, { gateMin: -1, withH0: true, dtype: "f32" });
  const rand = mulberry32(22);
  const dout = new Float32Array(SHAPE.B * SHAPE.T * SHAPE.H * SHAPE.V).map(() => rand() - 0.5);
  return { x: x as KdaProblem<Float32Array>, dout };
}

async function run(x: KdaProblem<Float32Array>, dout: Float32Array) {
  const { o, ht, saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
  try {
    return { o, ht, grads: await gpuBackward(saved!, { dout }) };
  } finally {
    saved!.release();
  }
}

function sameBits(
  label: string,
  got: { o: Float32Array; ht: Float32Array; grads: KdaGrads<Float32Array> },
  want: { o: Float32Array; ht: Float32Array; grads: KdaGrads<Float32Array> },
): void {
  const pairs: [string, Float32Array, Float32Array][] = [
    ["o", got.o, want.o],
    ["ht", got.ht, want.ht],
    ...GRADS.map((n): [string, Float32Array, Float32Array] => [n, got.grads[n], want.grads[n]]),
  ];
  for (const [name, a, b] of pairs) {
    assert.equal(a.length, b.length);
    const i = firstBitDifference(a, b);
    if (i >= 0) throw new Error(`${label}: ${name}[${i}] differs from the reference`);
  }
}

gpuTest(
  "a device destroyed mid-run fails the calls in flight; the next call gets a fresh device",
  async () => {
    const { x, dout } = inputs();
    const reference = await run(x, dout);
    const start = gpuLiveBuffers();
    // a forward kept for a backward after the loss
    const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
    for (const delayMs of [0, 1, 5, 20]) {
      const inFlight = Array.from({ length: 4 }, () => run(x, dout));
      if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
      assert.equal(destroyDeviceForTests(), true);
      const results = await Promise.allSettled(inFlight);
      let failed = 0;
      for (const r of results) {
        if (r.status === "rejected") {
          failed++;
          const e = r.reason;
          assert.ok(e instanceof Error, String(e));
          assert.match(e.message, /device was lost|device that ran the forward was lost/);
        } else {
          // a call that finished before the loss must still be right, bit for bit
          sameBits(`delay ${delayMs}`, r.value, reference);
        }
      }
      console.log(`  destroyed after ${delayMs} ms: ${failed} of 4 calls failed, the rest exact`);
      assert.match(gpuUnsupportedReason(SHAPE, 16) ?? "", /device was lost/);
      const status = await gpuStatus();
      assert.equal(status.available, true, "a fresh device after the loss");
      sameBits(`after delay ${delayMs}`, await run(x, dout), reference);
    }
    // the forward saved on the lost device cannot run its backward, and says why
    await assert.rejects(
      gpuBackward(saved!, { dout }),
      (e: unknown) =>
        e instanceof GpuError && e.name === "GpuDeviceLostError" &&
        /device that ran the forward was lost/.test(e.message),
    );
    saved!.release();
    const diagnostics = await gpuDiagnostics();
    assert.match(diagnostics.lastDeviceLoss ?? "", /destroyed by a test/);
    assert.equal(gpuLiveBuffers(), start);
  },
);

gpuTest("an out-of-memory error surfaces as GpuOutOfMemoryError and breaks nothing", async () => {
  const { x, dout } = inputs();
  const reference = await run(x, dout);
  const start = gpuLiveBuffers();
  // llvmpipe allocates lazily and never reports out-of-memory for a buffer, so the error is
  // injected into the scope check; everything after it (the error's name, freeing the call's
  // buffers, the device and pipelines staying usable) is the real path.
  gpuDebug.nextScopeError = "out-of-memory";
  await assert.rejects(
    gpuForward(x, { chunkSize: 16, saveForBackward: true }),
    (e: unknown) =>
      e instanceof GpuError && e.name === "GpuOutOfMemoryError" &&
      /GPU out of memory in gpuForward/.test(e.message),
  );
  assert.equal(gpuLiveBuffers(), start);
  const { saved } = await gpuForward(x, { chunkSize: 16, saveForBackward: true });
  gpuDebug.nextScopeError = "out-of-memory";
  await assert.rejects(
    gpuBackward(saved!, { dout }),
    (e: unknown) => e instanceof GpuError && e.name === "GpuOutOfMemoryError",
  );
  // the saved forward is intact: its backward still runs, and gives the reference bits
  const grads = await gpuBackward(saved!, { dout });
  saved!.release();
  sameBits("after the error", { o: reference.o, ht: reference.ht, grads }, reference);
  sameBits("a following call", await run(x, dout), reference);
  assert.equal(gpuLiveBuffers(), start);
});

gpuTest(
  "the live device is destroyed when the process unloads, before the driver's own teardown",
  async () => {
    const device = new URL("../kda/gpu/device.ts", import.meta.url).href;
    const script = `
    const { getContext, readyContext } = await import(${JSON.stringify(device)});
    await getContext();
    // registered after the package's own unload listener, so it runs after it
    addEventListener("unload", () => {
      const ctx = readyContext();
      console.log("AT EXIT " + (typeof ctx === "string" ? ctx : "device still live"));
    });
  `;
    const out = await runChild(script, "ts");
    assert.ok(out.success, `the child failed (code ${out.code}): ${out.stderr}`);
    assert.match(out.stdout, /AT EXIT The GPU device was lost \(the process is exiting\)/);
  },
);

gpuTest("gpuSettled() returns when the device is lost with releases still pending", async () => {
  const { x } = inputs();
  const onDevice = await toGpuInputs(x);
  const out = await kda(onDevice, { chunkSize: 16 });
  releaseTensors(out, onDevice); // pending: their work may still run
  assert.equal(destroyDeviceForTests(), true);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const hung = new Promise<string>((resolve) => {
    timer = setTimeout(() => resolve("hung"), 5000);
  });
  const result = await Promise.race([gpuSettled().then(() => "settled"), hung]);
  clearTimeout(timer);
  assert.equal(result, "settled");
  await gpuStatus(); // a fresh device for whatever runs next
});
