// Half-precision inputs (docs/kda.md 3): where the runtime has Float16Array, kda(), kdaVjp() and
// kdaStep() accept it, compute in f32 on the same (widened) values, and return Float16Array
// results equal to the f32 results rounded once; mixing array types is a named TypeError.

import assert from "node:assert/strict";
import { type Float, kda, type KdaCotangents, type KdaInputs, kdaVjp } from "../mod.ts";
import { kdaStep } from "../kda/op/step.ts";
import type { Arm, PublicFloat } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { randomKda } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("f16_test");

const HAS_HALF = typeof Float16Array !== "undefined";
const SHAPE = { B: 2, T: 19, H: 2, K: 6, V: 5 };

/** The same draw as Float16Array inputs and as the Float32Array values they hold. */
function draw(seed: number) {
  const x = randomKda(SHAPE, seed, { gateMin: -2, withH0: true });
  const half = (a: PublicFloat) => new Float16Array(a);
  const x16: KdaInputs<Float16Array> = {
    ...SHAPE,
    q: half(x.q),
    k: half(x.k),
    v: half(x.v),
    g: half(x.g),
    beta: half(x.beta),
    h0: half(x.h0!),
  };
  const widen = (a: Float16Array) => Float32Array.from(a);
  const x32: KdaInputs<Float32Array> = {
    ...SHAPE,
    q: widen(x16.q),
    k: widen(x16.k),
    v: widen(x16.v),
    g: widen(x16.g),
    beta: widen(x16.beta),
    h0: widen(x16.h0!),
  };
  const { B, T, H, K, V } = SHAPE;
  const dout16 = new Float16Array(B * T * H * V).map((_, i) => Math.sin(0.3 * i));
  const dht16 = new Float16Array(B * H * K * V).map((_, i) => Math.cos(0.2 * i));
  const ct16: KdaCotangents<Float16Array> = { dout: dout16, dht: dht16 };
  const ct32: KdaCotangents<Float32Array> = { dout: widen(dout16), dht: widen(dht16) };
  return { x16, x32, ct16, ct32 };
}

/** The f32 result rounded once to half precision, as bits. */
function sameAsRounded(a: PublicFloat, f32: Float): boolean {
  return a instanceof Float16Array && bitsEqualHalf(a, new Float16Array(f32));
}

function bitsEqualHalf(a: Float16Array, b: Float16Array): boolean {
  if (a.length !== b.length) return false;
  const ua = new Uint16Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint16Array(b.buffer, b.byteOffset, b.length);
  return ua.every((x, i) => x === ub[i]);
}

async function checkArm(arm: Arm) {
  const { x16, x32, ct16, ct32 } = draw(arm.length);
  const options = { arm, strict: true };
  const out16 = await kda(x16, options), out32 = await kda(x32, options);
  assert.ok(sameAsRounded(out16.o, out32.o), `${arm}: o is the f32 o rounded to f16`);
  assert.ok(sameAsRounded(out16.ht, out32.ht), `${arm}: ht`);
  const g16 = await kdaVjp(x16, ct16, options), g32 = await kdaVjp(x32, ct32, options);
  for (const name of GRAD_NAMES) assert.ok(sameAsRounded(g16[name], g32[name]), `${arm}: ${name}`);
  // The decode step, on the first token of every sequence.
  const { B, T, H, K, V } = SHAPE;
  const first = <A extends Float16Array | Float32Array>(a: A, width: number): A => {
    const out = new (a.constructor as { new (n: number): A })(B * width);
    for (let b = 0; b < B; b++) {
      out.set(a.subarray(b * T * width, (b * T + 1) * width), b * width);
    }
    return out;
  };
  const token = <A extends Float16Array | Float32Array>(x: KdaInputs<A>) => ({
    B,
    H,
    K,
    V,
    q: first(x.q, H * K),
    k: first(x.k, H * K),
    v: first(x.v, H * V),
    g: first(x.g, H * K),
    beta: first(x.beta, H),
  });
  const s16 = await kdaStep(x16.h0!, token(x16), options);
  const s32 = await kdaStep(x32.h0!, token(x32), options);
  assert.ok(sameAsRounded(s16.o, s32.o), `${arm}: step o`);
  assert.ok(sameAsRounded(s16.state, s32.state), `${arm}: step state`);
}

Deno.test({
  name:
    "kda(), kdaVjp() and kdaStep() on Float16Array inputs return the f32 results rounded to Float16Array, on the ops and cpu arms",
  ignore: !HAS_HALF,
  async fn() {
    await checkArm("ops");
    await checkArm("cpu");
  },
});

if (HAS_HALF) {
  gpuTest(
    "kda(), kdaVjp() and kdaStep() on Float16Array inputs return the f32 results rounded to Float16Array, on the gpu arm",
    async () => {
      await checkArm("gpu");
    },
  );
}

Deno.test({
  name: "Float16Array mixed with other array types is a named TypeError, and f16 NaN is named",
  ignore: !HAS_HALF,
  async fn() {
    const { x16, x32, ct16, ct32 } = draw(1);
    const rejects = async (run: () => Promise<unknown>, re: RegExp) => {
      await assert.rejects(
        run,
        (e: unknown) => e instanceof TypeError && re.test(e.message),
        `${re}`,
      );
    };
    await rejects(
      () => kda({ ...x16, k: x32.k } as unknown as KdaInputs, { arm: "cpu" }),
      /^inputs\.k must be a Float16Array like the other arrays: got Float32Array$/,
    );
    await rejects(
      () => kda({ ...x32, h0: x16.h0 } as unknown as KdaInputs, { arm: "cpu" }),
      /^inputs\.h0 must be a Float32Array like the other arrays: got Float16Array$/,
    );
    await rejects(
      () => kdaVjp(x16, ct32 as unknown as KdaCotangents<Float16Array>, { arm: "cpu" }),
      /^cotangents\.dout must be a Float16Array like the other arrays: got Float32Array$/,
    );
    await rejects(
      () => kdaVjp(x32, ct16 as unknown as KdaCotangents<Float32Array>, { arm: "cpu" }),
      /^cotangents\.dout must be a Float32Array like the other arrays: got Float16Array$/,
    );
    const nan = new Float16Array(x16.v);
    nan[4] = NaN;
    await assert.rejects(
      () => kda({ ...x16, v: nan }, { arm: "cpu" }),
      (e: unknown) =>
        e instanceof RangeError && /^inputs\.v must be finite: got NaN at index 4$/.test(e.message),
    );
  },
});
