// KdaModule across calls: the state (the KDA state and the short conv's cache) carried from one
// segment to the next equals running the input whole; step() decodes token by token; and
// forwardBackward() gives vjp()'s gradients with no second forward.

import assert from "node:assert/strict";
import { type Arm, type Float, KdaModule, type KdaModuleState } from "../mod.ts";
import { mul, reshape, sum, Tensor } from "../tape/mod.ts";
import { agreement, bitsEqual } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("module_state_test");

const CONFIG = { dModel: 12, heads: 2, keyDim: 4, valueDim: 3, decayRank: 2 };

function input(B: number, T: number, D: number, f32: boolean): Float {
  const a = Float64Array.from({ length: B * T * D }, (_, i) => Math.sin(0.37 * i + 0.1));
  return f32 ? Float32Array.from(a) : a;
}

/** The rows [t0, t1) of each batch entry of a [B, T, D] array. */
function rowsOf(x: Float, B: number, T: number, D: number, t0: number, t1: number): Float {
  const out = new (x.constructor as Float64ArrayConstructor)(B * (t1 - t0) * D);
  for (let b = 0; b < B; b++) {
    out.set(x.subarray((b * T + t0) * D, (b * T + t1) * D), b * (t1 - t0) * D);
  }
  return out;
}

function check(label: string, a: ArrayLike<number>, b: ArrayLike<number>, tol: number): void {
  const { rel, absDiff, refMax } = agreement(a, b);
  if (!(rel <= tol)) {
    throw new Error(`${label}: ${rel} (abs ${absDiff}, ref ${refMax}, tol ${tol})`);
  }
}

async function segmentsEqualWhole(arm: Arm, f32: boolean, shortConv: boolean, tol: number) {
  const layer = new KdaModule({ ...CONFIG, shortConv, chunkSize: 16 }, {
    dtype: f32 ? "f32" : "f64",
  });
  const [B, T, D] = [2, 41, CONFIG.dModel];
  const x = input(B, T, D, f32);
  const whole = await layer.forwardWithState(x, [B, T], { arm, strict: true });
  let state: KdaModuleState | undefined;
  const cuts = [0, 2, 19, 20, 41];
  for (let i = 0; i + 1 < cuts.length; i++) {
    const [t0, t1] = [cuts[i], cuts[i + 1]];
    const part = await layer.forwardWithState(rowsOf(x, B, T, D, t0, t1), [B, t1 - t0], {
      arm,
      strict: true,
      ...(state ? { state } : {}),
    });
    check(`${arm} y[${t0}, ${t1})`, part.y, rowsOf(whole.y, B, T, D, t0, t1), tol);
    state = part.state;
  }
  check(`${arm} final KDA state`, state!.kda, whole.state.kda, tol);
  if (shortConv) {
    for (const n of ["q", "k", "v"] as const) {
      assert.ok(bitsEqual(state!.conv![n], whole.state.conv![n]), `conv cache ${n}`);
    }
  }
}

for (const shortConv of [false, true]) {
  Deno.test(`KdaModule.forwardWithState() in segments equals the whole run on the cpu and ops arms${shortConv ? ", with the short conv's cache" : ""}`, async () => {
    await segmentsEqualWhole("cpu", false, shortConv, 1e-12);
    await segmentsEqualWhole("ops", false, shortConv, 1e-12);
  });
  gpuTest(
    `KdaModule.forwardWithState() in segments equals the whole run on the gpu arm${
      shortConv ? ", with the short conv's cache" : ""
    }`,
    async () => {
      await segmentsEqualWhole("gpu", true, shortConv, 2e-6);
    },
  );
}

async function stepEqualsForward(arm: Arm, f32: boolean, tol: number) {
  const layer = new KdaModule({ ...CONFIG, shortConv: true }, { dtype: f32 ? "f32" : "f64" });
  const [B, T, D] = [2, 9, CONFIG.dModel];
  const x = input(B, T, D, f32);
  const whole = await layer.forward(x, [B, T], { arm, strict: true });
  let state: KdaModuleState | undefined;
  for (let t = 0; t < T; t++) {
    const out = await layer.step(rowsOf(x, B, T, D, t, t + 1), state, { arm, strict: true });
    check(`${arm} step ${t}`, out.y, rowsOf(whole, B, T, D, t, t + 1), tol);
    state = out.state;
  }
}

Deno.test("KdaModule.step() decodes token by token exactly as the forward over the whole input (cpu, ops)", async () => {
  await stepEqualsForward("cpu", false, 1e-12);
  await stepEqualsForward("ops", false, 1e-12);
});

gpuTest("KdaModule.step() on the gpu arm matches the forward to f32 accuracy", async () => {
  await stepEqualsForward("gpu", true, 2e-6);
});

Deno.test("KdaModule.forwardBackward() gives vjp()'s output and gradients bit for bit, with one forward", async () => {
  const layer = new KdaModule(CONFIG);
  const [B, T, D] = [2, 17, CONFIG.dModel];
  const x = input(B, T, D, false);
  const r = Float64Array.from({ length: B * T * D }, (_, i) => Math.cos(0.11 * i));
  const viaVjp = await layer.vjp(x, [B, T], r, { arm: "cpu" });
  const rT = new Tensor(r, [B, T, D]);
  const viaLoss = await layer.forwardBackward(
    x,
    [B, T],
    (y) => sum(reshape(mul(y, rT), [y.size]), 0),
    {
      arm: "cpu",
    },
  );
  assert.ok(bitsEqual(viaLoss.y, viaVjp.y));
  let expected = 0;
  for (let i = 0; i < r.length; i++) expected += viaVjp.y[i] * r[i];
  assert.ok(Math.abs(viaLoss.loss - expected) <= 1e-12 * Math.abs(expected));
  for (const [name, g] of viaVjp.grads) {
    assert.ok(bitsEqual(viaLoss.grads.get(name)!, g), `forwardBackward ${name}`);
  }
});

Deno.test("KdaModule state, step and forwardBackward refuse bad arguments with named errors", async () => {
  const layer = new KdaModule({ ...CONFIG, shortConv: true });
  const x = input(1, 3, CONFIG.dModel, false);
  await assert.rejects(
    () =>
      layer.forwardWithState(x, [1, 3], { state: { kda: new Float64Array(5) } as KdaModuleState }),
    /options\.state\.kda must have 24 elements \[B, H, K, V\]: got 5/,
  );
  await assert.rejects(
    () =>
      layer.forwardWithState(x, [1, 3], { state: { kda: new Float64Array(24) } as KdaModuleState }),
    /options\.state\.conv must be an object: got undefined/,
  );
  await assert.rejects(() => layer.step(new Float64Array(5)), RangeError);
  await assert.rejects(
    () => layer.forwardBackward(x, [1, 3], (y) => y, { arm: "cpu" }),
    /lossFn must return a one-element tensor/,
  );
});
