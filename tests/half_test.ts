// 16-bit storage (docs/kda.md 3): kda(), kdaVjp() and kdaStep() accept Float16Array (where the
// runtime has it) and BFloat16Array, through one path driven by the dtype table: they compute in
// f32 on the same (widened) values and return results of the call's type equal to the f32 results
// rounded once; mixing array types is a named TypeError. Each dtype's agreement with the exact f64
// reference is held to its measured bar: MEASURED_BAR_FACTOR times the error of the f64 reference
// run on that dtype's rounded inputs with its outputs rounded too, never tighter than the f32 bar.

import assert from "node:assert/strict";
import {
  type BFloat16Array,
  DTYPES,
  type Float,
  kda,
  type KdaCotangents,
  type KdaInputs,
  kdaVjp,
  MEASURED_BAR_FACTOR,
} from "../mod.ts";
import { kdaStep } from "../kda/op/step.ts";
import type { Arm, PublicFloat } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { roundFromF32, type StorageDType, storageDtypeOf, widenToF32 } from "../base/dtype.ts";
import { agreement, randomKda } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("half_test");

const STORAGE: StorageDType[] = DTYPES.f16.array === undefined ? ["bf16"] : ["f16", "bf16"];
const SHAPE = { B: 2, T: 19, H: 2, K: 6, V: 5 };
const ARRAYS = ["q", "k", "v", "g", "beta", "h0"] as const;

/** f32 values rounded to the storage dtype, as an array of it. */
const round = (a: ArrayLike<number>, d: StorageDType) => roundFromF32(Float32Array.from(a), d);
/** The values of a storage array, in f64 (exact). */
const value = (a: PublicFloat) => Float64Array.from(widenToF32(a as Float16Array | BFloat16Array));

/** One draw as arrays of the storage dtype, and as the Float32Array values they hold. */
function draw(seed: number, d: StorageDType) {
  const x = randomKda(SHAPE, seed, { gateMin: -2, withH0: true });
  const xs = { ...SHAPE } as Record<string, unknown>;
  const x32 = { ...SHAPE } as Record<string, unknown>;
  for (const name of ARRAYS) {
    const r = round(x[name]!, d);
    xs[name] = r;
    x32[name] = widenToF32(r);
  }
  const { B, T, H, K, V } = SHAPE;
  const dout = round(Array.from({ length: B * T * H * V }, (_, i) => Math.sin(0.3 * i)), d);
  const dht = round(Array.from({ length: B * H * K * V }, (_, i) => Math.cos(0.2 * i)), d);
  return {
    x64: x,
    xs: xs as unknown as KdaInputs<PublicFloat>,
    x32: x32 as unknown as KdaInputs<Float32Array>,
    cts: { dout, dht } as unknown as KdaCotangents<PublicFloat>,
    ct32: { dout: widenToF32(dout), dht: widenToF32(dht) },
  };
}

/** The f32 result rounded once to the storage dtype, compared as bits. */
function sameAsRounded(a: unknown, f32: Float | undefined, d: StorageDType): boolean {
  if (storageDtypeOf(a) !== d || !(f32 instanceof Float32Array)) return false;
  const want = roundFromF32(f32, d);
  const ua = new Uint16Array((a as Uint16Array).buffer, (a as Uint16Array).byteOffset, want.length);
  const ub = new Uint16Array(want.buffer, want.byteOffset, want.length);
  return (a as Uint16Array).length === want.length && ua.every((x, i) => x === ub[i]);
}

async function checkArm(arm: Arm, d: StorageDType) {
  const { xs, x32, cts, ct32 } = draw(arm.length, d);
  const options = { arm, strict: true };
  const outS = await kda(xs, options), out32 = await kda(x32, options);
  assert.ok(sameAsRounded(outS.o, out32.o, d), `${arm} ${d}: o is the f32 o rounded`);
  assert.ok(sameAsRounded(outS.ht, out32.ht, d), `${arm} ${d}: ht`);
  const gS = await kdaVjp(xs, cts, options), g32 = await kdaVjp(x32, ct32, options);
  for (const name of GRAD_NAMES) {
    assert.ok(sameAsRounded(gS[name], g32[name], d), `${arm} ${d}: ${name}`);
  }
  // Decoding, three tokens of every sequence in one call.
  const { B, T, H, K, V } = SHAPE;
  const first = <A extends PublicFloat>(a: A, width: number): A => {
    const out = new (a.constructor as { new (n: number): A })(B * 3 * width);
    for (let b = 0; b < B; b++) {
      out.set(a.subarray(b * T * width, (b * T + 3) * width) as never, b * 3 * width);
    }
    return out;
  };
  const tokens = <A extends PublicFloat>(x: KdaInputs<A>) => ({
    B,
    T: 3,
    H,
    K,
    V,
    q: first(x.q, H * K),
    k: first(x.k, H * K),
    v: first(x.v, H * V),
    g: first(x.g, H * K),
    beta: first(x.beta, H),
  });
  const sS = await kdaStep(xs.h0!, tokens(xs), options);
  const s32 = await kdaStep(x32.h0!, tokens(x32), options);
  assert.ok(sameAsRounded(sS.o, s32.o as Float, d), `${arm} ${d}: step o`);
  assert.ok(sameAsRounded(sS.state, s32.state as Float, d), `${arm} ${d}: step state`);
}

for (const d of STORAGE) {
  const name = DTYPES[d].array!.name;
  Deno.test(`kda(), kdaVjp() and kdaStep() on ${name} inputs return the f32 results rounded to ${name}, on the ops and cpu arms`, async () => {
    await checkArm("ops", d);
    await checkArm("cpu", d);
  });
  gpuTest(
    `kda(), kdaVjp() and kdaStep() on ${name} inputs return the f32 results rounded to ${name}, on the gpu arm`,
    async () => {
      await checkArm("gpu", d);
    },
  );
}

/**
 * Each result of a storage-dtype call against the exact f64 reference of the unrounded draw,
 * within its measured bar. Returns the bars and agreements, for the report.
 */
async function checkBars(arm: Arm, d: StorageDType): Promise<string[]> {
  const { x64, xs, cts } = draw(11, d);
  const dout64 = value((cts as { dout: PublicFloat }).dout);
  const dht64 = value((cts as { dht: PublicFloat }).dht!);
  const exactIn = { ...x64 } as KdaInputs;
  const exact = {
    ...(await kda(exactIn, { arm: "cpu" })),
    ...(await kdaVjp(exactIn, { dout: dout64, dht: dht64 }, { arm: "cpu" })),
  } as Record<string, Float>;
  // What a perfect computation at this precision attains: the f64 reference on the rounded
  // inputs, its outputs rounded too.
  const roundedIn = { ...SHAPE } as Record<string, unknown>;
  for (const a of ARRAYS) roundedIn[a] = value((xs as unknown as Record<string, PublicFloat>)[a]);
  const attainable = {
    ...(await kda(roundedIn as unknown as KdaInputs, { arm: "cpu" })),
    ...(await kdaVjp(roundedIn as unknown as KdaInputs, { dout: dout64, dht: dht64 }, {
      arm: "cpu",
    })),
  } as Record<string, Float>;
  const got = {
    ...(await kda(xs, { arm, strict: true })),
    ...(await kdaVjp(xs, cts, { arm, strict: true })),
  } as Record<string, PublicFloat>;
  const lines: string[] = [];
  for (const name of ["o", "ht", ...GRAD_NAMES]) {
    const ref = exact[name];
    const best = value(round(attainable[name], d));
    const f32Bar = name === "o" || name === "ht"
      ? DTYPES.f32.bars!.outputs
      : DTYPES.f32.bars!.gradients;
    const measured = agreement(best, ref).rel;
    const bar = Math.max(f32Bar, MEASURED_BAR_FACTOR * measured);
    const ag = agreement(value(got[name]), ref);
    lines.push(
      `${d} ${arm} ${name}: rel ${ag.rel.toExponential(2)} (max|a−b| ${
        ag.absDiff.toExponential(2)
      }, max|b| ${ag.refMax.toExponential(2)}) bar ${
        bar.toExponential(2)
      } = ${MEASURED_BAR_FACTOR} × ${measured.toExponential(2)}`,
    );
    if (!(ag.rel <= bar)) throw new Error(`${lines[lines.length - 1]}: over the bar`);
  }
  return lines;
}

for (const d of STORAGE) {
  Deno.test(`${d} results agree with the exact f64 reference within ${d}'s measured bars on the ops and cpu arms`, async () => {
    for (const arm of ["ops", "cpu"] as Arm[]) console.log((await checkBars(arm, d)).join("\n"));
  });
  gpuTest(
    `${d} results agree with the exact f64 reference within ${d}'s measured bars on the gpu arm`,
    async () => {
      console.log((await checkBars("gpu", d)).join("\n"));
    },
  );
}

Deno.test("a 16-bit storage array mixed with other array types is a named TypeError, and a NaN is named", async () => {
  for (const d of STORAGE) {
    const { xs, x32, cts, ct32 } = draw(1, d);
    const name = DTYPES[d].array!.name;
    const rejects = async (run: () => Promise<unknown>, re: RegExp) => {
      await assert.rejects(
        run,
        (e: unknown) => e instanceof TypeError && re.test(e.message),
        `${re}`,
      );
    };
    await rejects(
      () => kda({ ...xs, k: x32.k } as unknown as KdaInputs, { arm: "cpu" }),
      new RegExp(`^inputs\\.k must be a ${name} like the other arrays: got Float32Array$`),
    );
    await rejects(
      () => kda({ ...x32, h0: xs.h0 } as unknown as KdaInputs, { arm: "cpu" }),
      new RegExp(`^inputs\\.h0 must be a Float32Array like the other arrays: got ${name}$`),
    );
    // the odd one out is named, q included: the call's type is the one most arrays share
    await rejects(
      () => kda({ ...x32, q: xs.q } as unknown as KdaInputs, { arm: "cpu" }),
      new RegExp(`^inputs\\.q must be a Float32Array like the other arrays: got ${name}$`),
    );
    await rejects(
      () => kda({ ...xs, q: x32.q } as unknown as KdaInputs, { arm: "cpu" }),
      new RegExp(`^inputs\\.q must be a ${name} like the other arrays: got Float32Array$`),
    );
    await rejects(
      () => kdaVjp(xs, ct32 as unknown as KdaCotangents<PublicFloat>, { arm: "cpu" }),
      new RegExp(`^cotangents\\.dout must be a ${name} like the other arrays: got Float32Array$`),
    );
    await rejects(
      () => kdaVjp(x32, cts as unknown as KdaCotangents<Float32Array>, { arm: "cpu" }),
      new RegExp(`^cotangents\\.dout must be a Float32Array like the other arrays: got ${name}$`),
    );
    const other = d === "bf16" ? "f16" : "bf16";
    if (DTYPES[other].array !== undefined) {
      await rejects(
        () => kda({ ...xs, v: round(x32.v, other) } as unknown as KdaInputs, { arm: "cpu" }),
        new RegExp(
          `^inputs\\.v must be a ${name} like the other arrays: got ${DTYPES[other].array!.name}$`,
        ),
      );
    }
    const nan = round(x32.v, d);
    nan[4] = d === "bf16" ? 0x7fc0 : NaN;
    await assert.rejects(
      () => kda({ ...xs, v: nan }, { arm: "cpu" }),
      (e: unknown) =>
        e instanceof RangeError && /^inputs\.v must be finite: got NaN at index 4$/.test(e.message),
    );
    const token = {
      B: 2,
      H: 2,
      K: 6,
      V: 5,
      q: xs.q.slice(0, 24),
      k: xs.k.slice(0, 24),
      v: xs.v.slice(0, 20),
      g: xs.g.slice(0, 24),
      beta: xs.beta.slice(0, 4),
    };
    await rejects(
      () => kdaStep(x32.h0! as unknown as PublicFloat, token as never),
      new RegExp(`^state must be a ${name} like the other arrays: got Float32Array$`),
    );
    await rejects(
      () => kdaStep(xs.h0! as unknown as PublicFloat, { ...token, q: x32.q.slice(0, 24) } as never),
      new RegExp(`^token\\.q must be a ${name} like the other arrays: got Float32Array$`),
    );
  }
  // a plain Uint16Array is not bf16 data
  const { x32 } = draw(2, "bf16");
  await assert.rejects(
    () => kda({ ...x32, q: new Uint16Array(x32.q.length) } as unknown as KdaInputs, { arm: "cpu" }),
    /inputs\.q must be one of Float64Array, Float32Array, Float16Array, BFloat16Array: got Uint16Array \(bf16 data must be a BFloat16Array\)/,
  );
});
