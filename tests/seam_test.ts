import assert from "node:assert/strict";
import * as api from "../mod.ts";
import type { KdaModuleRunOptions, KdaOptions } from "../mod.ts";

const { kda, KdaModule, kdaVjp, resetSeamCounts, seamCounts, seamDecisions } = api;
import { scale, Tape, Tensor } from "../tape/mod.ts";
import { Seam, type SeamArm } from "../seam/seam.ts";
import { detachedSeam } from "../checks/mutants.ts";
import { chunkForward } from "../kda/chunk.ts";
import { runKda, withKdaSeam } from "../kda/op/arms.ts";
import { gpuLiveBuffers } from "../kda/gpu/mod.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";
import { randomKda } from "./_fixtures.ts";
import { withEnv } from "./_fixtures.ts";

const shape = { B: 2, T: 21, H: 2, K: 6, V: 5 };

function dout(n: number): Float64Array {
  return Float64Array.from({ length: n }, (_, i) => Math.sin(0.7 * i));
}

Deno.test("seam counts the ops arm as opsPath and builds no custom node", async () => {
  resetSeamCounts();
  const x = randomKda(shape, 1);
  await kdaVjp(x, { dout: dout(2 * 21 * 2 * 5) }, { arm: "ops" });
  assert.deepEqual(seamCounts(), {
    asked: 1,
    fusedFwd: 0,
    fusedBwd: 0,
    declined: 0,
    opsPath: 1,
    customNodeBwd: 0,
    variants: {},
  });
  assert.deepEqual(seamDecisions(), []);
});

Deno.test("seam counts a cpu training call as fusedFwd, customNodeBwd and fusedBwd", async () => {
  resetSeamCounts();
  const x = randomKda(shape, 2, { withH0: true });
  await kdaVjp(x, { dout: dout(2 * 21 * 2 * 5) }, { arm: "cpu", chunkSize: 16 });
  assert.deepEqual(seamCounts(), {
    asked: 1,
    fusedFwd: 1,
    fusedBwd: 1,
    declined: 0,
    opsPath: 0,
    customNodeBwd: 1,
    variants: {},
  });
});

Deno.test("inference through the seam runs forward only: no node, no backward, no decline", async () => {
  resetSeamCounts();
  const x = randomKda(shape, 3);
  await kda(x, { arm: "cpu" });
  const counts = seamCounts();
  assert.equal(counts.asked, 1);
  assert.equal(counts.fusedFwd, 1);
  assert.equal(counts.customNodeBwd, 0);
  assert.equal(counts.declined, 0);
  // A dispatch on constants hands back constants: nothing was recorded for a backward.
  const t = (data: Float64Array, s: number[]) => new Tensor(data, s);
  const { B, T, H, K, V } = shape;
  const { o, ht } = await runKda(
    {
      q: t(x.q as Float64Array, [B, T, H, K]),
      k: t(x.k as Float64Array, [B, T, H, K]),
      v: t(x.v as Float64Array, [B, T, H, V]),
      g: t(x.g as Float64Array, [B, T, H, K]),
      beta: t(x.beta as Float64Array, [B, T, H]),
    },
    { ...shape, scale: K ** -0.5, chunkSize: 16 },
    { arm: "cpu" },
  );
  assert.equal(o.requiresGrad, false);
  assert.equal(ht.requiresGrad, false);
});

Deno.test("the custom node's forward values are exactly what the caller receives", async () => {
  const x = randomKda(shape, 4, { withH0: true });
  for (const chunkSize of [16, 32, 64] as const) {
    resetSeamCounts();
    const got = await kda(x, { arm: "cpu", chunkSize });
    const direct = chunkForward({ ...x, scale: x.scale ?? shape.K ** -0.5 }, { chunkSize });
    assert.deepEqual(got.o, direct.o);
    assert.deepEqual(got.ht, direct.ht);
    assert.equal(seamCounts().fusedFwd, 1);
    assert.equal(seamCounts().opsPath, 0);
  }
});

Deno.test("every call runs exactly one arm's forward: fusedFwd + opsPath equals asked", async () => {
  resetSeamCounts();
  const x = randomKda(shape, 5);
  const arms = ["ops", "cpu", "cpu", "ops", "cpu"] as const;
  for (const arm of arms) {
    await kda(x, { arm });
    await kdaVjp(x, { dout: dout(2 * 21 * 2 * 5) }, { arm });
  }
  const c = seamCounts();
  assert.equal(c.asked, 2 * arms.length);
  assert.equal(c.fusedFwd + c.opsPath, c.asked);
  assert.equal(c.opsPath, 4);
  assert.equal(c.fusedFwd, 6);
  assert.equal(c.customNodeBwd, 3);
  assert.equal(c.fusedBwd, 3);
});

Deno.test("asking the gpu arm for f64 work declines to cpu with the reason recorded", async () => {
  resetSeamCounts();
  const x = randomKda(shape, 6);
  const viaGpu = await kda(x, { arm: "gpu" });
  const viaCpu = await kda(x, { arm: "cpu" });
  assert.deepEqual(viaGpu.o, viaCpu.o);
  const c = seamCounts();
  assert.equal(c.declined, 1);
  const [d] = seamDecisions();
  assert.equal(d.wanted, "gpu");
  assert.equal(d.ran, "cpu");
  assert.match(d.reason, /f32 only: got an f64 tape/);
});

Deno.test("strict mode turns a decline into an error naming the wanted arm and the reason", async () => {
  const x = randomKda(shape, 7);
  await assert.rejects(
    () => kda(x, { arm: "gpu", strict: true }),
    (e: Error) =>
      /^KDA arm gpu \(asked for by options\.arm\) did not run, and strict mode runs no other: /
        .test(e.message) && /f64/.test(e.message),
  );
  await withEnv({ KDA_REQUIRE_ARM: "gpu" }, async () => {
    await assert.rejects(
      () => kda(x),
      /KDA arm gpu \(required by KDA_REQUIRE_ARM\) did not run, and strict mode runs no other: /,
    );
  });
});

Deno.test("a head dimension over 256 declines the cpu arm to ops with the reason", async () => {
  resetSeamCounts();
  const x = randomKda({ B: 1, T: 2, H: 1, K: 257, V: 2 }, 8);
  await kda(x, { arm: "cpu" });
  assert.equal(seamCounts().opsPath, 1);
  const [d] = seamDecisions();
  assert.deepEqual([d.wanted, d.ran], ["cpu", "ops"]);
  assert.match(d.reason, /K = 257 .* at most 256/);
});

Deno.test("KDA_ARM=ops forces the ops arm and records it as a decline", async () => {
  resetSeamCounts();
  const x = randomKda(shape, 9);
  await withEnv({ KDA_ARM: "ops" }, () => kda(x));
  const c = seamCounts();
  assert.equal(c.opsPath, 1);
  assert.equal(c.declined, 1);
  assert.match(seamDecisions()[0].reason, /forced by KDA_ARM=ops/);
  // strict, the forced arm is refused, and the message does not claim the default was required
  await withEnv({ KDA_ARM: "ops" }, async () => {
    await assert.rejects(
      () => kda(x, { strict: true }),
      /KDA arm cpu \(the default arm\) did not run, and strict mode runs no other: forced by KDA_ARM=ops$/,
    );
  });
  await withEnv({ KDA_ARM: "fast" }, async () => {
    await assert.rejects(() => kda(x), RangeError);
  });
});

Deno.test("the proof's detached seam cuts the graph at the op, says so, and leaves the package's seam alone", async () => {
  const layer = new KdaModule({ dModel: 8, heads: 2, keyDim: 4, valueDim: 3, decayRank: 2 });
  const x = Float64Array.from({ length: 2 * 9 * 8 }, (_, i) => Math.cos(i));
  const dy = Float64Array.from({ length: 2 * 9 * 8 }, (_, i) => Math.sin(i));
  resetSeamCounts();
  const normal = await layer.vjp(x, [2, 9], dy, { arm: "cpu" });
  assert.deepEqual(seamDecisions(), []);
  resetSeamCounts();
  const seam = detachedSeam();
  const detached = await withKdaSeam(seam, () => layer.vjp(x, [2, 9], dy, { arm: "cpu" }));
  assert.deepEqual(detached.y, normal.y);
  // Counted and recorded on the derived seam, not on the package's.
  assert.equal(seamCounts().asked, 0);
  assert.deepEqual(seam.counts(), { ...seamCounts(), asked: 1, fusedFwd: 1 });
  const decisions = seam.decisions();
  assert.equal(decisions.length, 1);
  assert.match(decisions[0].reason, /outputs detached/);
  for (const [name, grad] of detached.grads) {
    const downstream = ["o_norm_w", "o_gate.weight", "o_proj.weight"].includes(name);
    const zero = grad.every((v) => v === 0);
    assert.equal(zero, !downstream, `${name}: zero gradient ${zero}`);
  }
  // The composite arm has no custom node to detach.
  await assert.rejects(
    () => withKdaSeam(detachedSeam(), () => layer.vjp(x, [2, 9], dy, { arm: "ops" })),
    (e: Error) => e instanceof TypeError && /composite arm ops/.test(e.message),
  );
  // After withKdaSeam the layer's calls are back on the package's seam.
  await layer.vjp(x, [2, 9], dy, { arm: "cpu" });
  assert.equal(seamCounts().customNodeBwd, 1);
});

Deno.test("withKdaSeam refuses nesting and restores the package's seam after a throw", async () => {
  const x = randomKda(shape, 11);
  await assert.rejects(
    () =>
      withKdaSeam(
        detachedSeam(),
        () => withKdaSeam(detachedSeam(), () => Promise.resolve()),
      ),
    /must not be nested/,
  );
  await assert.rejects(
    () => withKdaSeam(detachedSeam(), () => Promise.reject(new Error("planted"))),
    /planted/,
  );
  resetSeamCounts();
  await kda(x, { arm: "cpu" });
  assert.equal(seamCounts().asked, 1);
});

Deno.test("a Seam subclass runs a call its own way through run, count and record", async () => {
  const plain = {
    name: "plain",
    kind: "composite" as const,
    dtypes: ["f64" as const],
    whyNot: () => null,
    record: (_r: unknown, [t]: readonly (Tensor | undefined)[]) => [scale(t!, 2)],
  };
  class Halving extends Seam<{ n: number }> {
    protected override run(
      arm: SeamArm<{ n: number }>,
      inputs: readonly (Tensor | undefined)[],
      _request: { n: number },
      wanted: string,
    ): Promise<Tensor[]> {
      this.count("declined");
      this.record(wanted, arm.name, "halved");
      return Promise.resolve([scale(inputs[0]!, 0.5)]);
    }
  }
  const policy = {
    op: "double",
    arms: [plain],
    defaultArm: () => ({ arm: "plain", note: null }),
    outputShapes: (r: { n: number }) => [[r.n]],
    env: { force: "DOUBLE_ARM", require: "DOUBLE_REQUIRE_ARM", quiet: "DOUBLE_QUIET" },
  };
  const base = new Seam(policy);
  const derived = new Halving(base.policy);
  const input = new Tensor(Float64Array.of(2, 4), [2]);
  assert.deepEqual([...(await base.dispatch([input], { n: 2 })).outputs[0].data], [4, 8]);
  assert.deepEqual([...(await derived.dispatch([input], { n: 2 })).outputs[0].data], [1, 2]);
  assert.deepEqual(base.counts(), { ...derived.counts(), declined: 0, opsPath: 1 });
  assert.deepEqual(derived.counts().declined, 1);
  assert.deepEqual(derived.decisions().map((d) => d.reason), ["halved"]);
});

Deno.test("KdaModule takes only its public options: detachKdaOutputs is refused by name", async () => {
  const layer = new KdaModule({ dModel: 8, heads: 2, keyDim: 4, valueDim: 3, decayRank: 2 });
  const x = Float64Array.from({ length: 2 * 9 * 8 }, (_, i) => Math.cos(i));
  const dy = Float64Array.from({ length: 2 * 9 * 8 }, (_, i) => Math.sin(i));
  const refused = (e: Error) =>
    e instanceof TypeError &&
    e.message.startsWith(
      "options.detachKdaOutputs is not a known field: expected one of " +
        "arm, strict, quiet, kernels, checkParameters (",
    );
  const options = { arm: "cpu", detachKdaOutputs: true } as KdaModuleRunOptions;
  await assert.rejects(() => layer.vjp(x, [2, 9], dy, options), refused);
  await assert.rejects(() => layer.forward(x, [2, 9], options), refused);
  // The op's options have no such switch either.
  await assert.rejects(
    () => kda(randomKda(shape, 12), { arm: "cpu", detachOutputs: true } as KdaOptions),
    (e: Error) =>
      e instanceof TypeError && /options.detachOutputs is not a known field/.test(e.message),
  );
});

Deno.test("no entry point of the package exports a way to plant a defect", async () => {
  const entries = [
    "../mod.ts",
    "../tape/mod.ts",
    "../checks/mod.ts",
    "../io/mod.ts",
    "../optim/mod.ts",
  ];
  const planting = /hook|mutant|detach|plant|withKdaSeam|derivedSeam|falsif|^Seam$|kdaSeam/i;
  for (const entry of entries) {
    const names = Object.keys(await import(entry));
    assert.ok(names.length > 0, entry);
    assert.deepEqual(names.filter((n) => planting.test(n)), [], entry);
  }
  // The layer's prototype has no hidden run switch.
  const layerKeys = Object.getOwnPropertyNames(api.KdaModule.prototype);
  assert.deepEqual(layerKeys.filter((n) => planting.test(n)), []);
});

reportMissingGpu("seam_test");

gpuTest(
  "with an adapter, an f32 training step of KdaModule runs the gpu node and never the ops path",
  async () => {
    const layer = new KdaModule({}, { dtype: "f32" });
    const n = 2 * 64 * 64;
    const x = Float32Array.from({ length: n }, (_, i) => Math.sin(0.01 * i));
    const dy = Float32Array.from({ length: n }, (_, i) => Math.cos(0.02 * i));
    resetSeamCounts();
    const { grads } = await layer.vjp(x, [2, 64], dy, { arm: "gpu" });
    const c = seamCounts();
    assert.deepEqual(
      { fusedFwd: c.fusedFwd, customNodeBwd: c.customNodeBwd, fusedBwd: c.fusedBwd },
      { fusedFwd: 1, customNodeBwd: 1, fusedBwd: 1 },
    );
    assert.equal(c.opsPath, 0);
    assert.equal(c.declined, 0, JSON.stringify(seamDecisions()));
    for (const [name, g] of grads) {
      assert.ok(g.some((v) => v !== 0), `${name} has a zero gradient`);
    }
  },
);

gpuTest(
  "a gpu node's device buffers are released when its tape is disposed without a backward",
  async () => {
    const x = randomKda(shape, 10, { dtype: "f32" });
    const { B, T, H, K, V } = shape;
    const before = gpuLiveBuffers();
    const tape = new Tape("f32");
    const v = (data: Float64Array | Float32Array, s: number[]) => tape.variable(data, s);
    const { arm } = await runKda(
      {
        q: v(x.q, [B, T, H, K]),
        k: v(x.k, [B, T, H, K]),
        v: v(x.v, [B, T, H, V]),
        g: v(x.g, [B, T, H, K]),
        beta: v(x.beta, [B, T, H]),
      },
      { ...shape, scale: K ** -0.5, chunkSize: 16 },
      { arm: "gpu", strict: true },
    );
    assert.equal(arm, "gpu");
    assert.ok(gpuLiveBuffers() > before, "the node holds its saved buffers until backward");
    tape.dispose();
    assert.equal(gpuLiveBuffers(), before);
  },
);
