// Gates far below −5 (docs/kda.md 2.2, overflow and partial-sum rules): the cpu arm's gate
// gradient dg must follow the ops arm (the tape's gradient of the plain recurrence) when the state
// cotangent dht is given, down to gates where e^g underflows to 0. Its form of dg must let nothing
// cancel: a term of size O(1) added at one row and subtracted at another leaves a rounding error
// of 1e-16 that swamps a true gradient of e^{−50} (docs/kda.md 2.3, gateCumsumBackward).

import assert from "node:assert/strict";
import { kdaVjp } from "../mod.ts";
import type { ChunkSize, KdaCotangents, KdaProblem } from "../kda/_types.ts";
import { DTYPES } from "../base/dtype.ts";
import { agreement, mulberry32, randomCotangents, randomKda, toF64 } from "./_fixtures.ts";

/** The smallest positive subnormal of f64 and of f32: the absolute resolution below the normals. */
const F64_TINY = 2 ** -1074, F32_TINY = 2 ** -149;

/** Gate levels of the sweep, from the usual −5 to where e^g is 0 in f64. */
const LEVELS = [-5, -10, -20, -30, -40, -50, -80, -100, -200, -400, -700, -708, -720, -740, -745];

/** A random problem whose gates all lie in [1.05 g, g] (jittered so no two channels are equal). */
function strongGates(
  g: number,
  seed: number,
  withH0: boolean,
  dtype: "f64" | "f32",
): { x: KdaProblem; ct: KdaCotangents } {
  const x = randomKda({ B: 1, T: 37, H: 2, K: 4, V: 3 }, seed, { withH0, dtype });
  const rand = mulberry32(seed + 17);
  const gates = new Float64Array(x.g.length).map(() => g * (1 + 0.05 * rand()));
  x.g = dtype === "f32" ? Float32Array.from(gates) : gates;
  const ct = randomCotangents(x, seed + 1, true);
  if (dtype === "f32") {
    ct.dout = Float32Array.from(ct.dout);
    ct.dht = Float32Array.from(ct.dht!);
  }
  return { x, ct };
}

/**
 * Throws unless `max|a − b| <= rel · max|b| + floor`: the relative bar of docs/kda.md 4, plus an
 * absolute floor for results that fall into the subnormals, where a dtype resolves only multiples
 * of its smallest subnormal whatever the computation.
 */
function assertClose(
  a: ArrayLike<number>,
  b: ArrayLike<number>,
  rel: number,
  floor: number,
  label: string,
) {
  const r = agreement(a, b);
  if (!(r.absDiff <= rel * r.refMax + floor)) {
    assert.fail(
      `${label}: max|a−b| ${r.absDiff.toExponential(3)}, max|b| ${r.refMax.toExponential(3)}, ` +
        `ratio ${r.rel.toExponential(3)} exceeds ${rel} (floor ${floor.toExponential(2)})`,
    );
  }
}

const CHUNKS: ChunkSize[] = [16, 32, 64];

Deno.test("the cpu arm's dg with dht on one token at g = −50 is the ops arm's 9.644e-23 (f64 and f32), not 0", async () => {
  for (const F of [Float64Array, Float32Array]) {
    const one = (v: number) => new F([v]);
    const inputs = {
      B: 1,
      T: 1,
      H: 1,
      K: 1,
      V: 1,
      scale: 1,
      q: one(1),
      k: one(1),
      v: one(1),
      g: one(-50),
      beta: one(0.5),
      h0: one(1),
    };
    const ct = { dout: one(0), dht: one(1) };
    const cpu = await kdaVjp(inputs, ct, { arm: "cpu", quiet: true });
    const ops = await kdaVjp(inputs, ct, { arm: "ops", quiet: true });
    // S_1 = a·1 + k·β(v − a·k·1) = (1 + a)/2 with a = e^g, so dS_1/dg = a/2 = e^{−50}/2.
    const exact = Math.exp(-50) / 2;
    const bar = F === Float64Array ? DTYPES.f64.bars!.gradients : DTYPES.f32.bars!.gradients;
    for (const [arm, dg] of [["cpu", cpu.dg[0]], ["ops", ops.dg[0]]] as const) {
      const err = Math.abs(dg - exact) / exact;
      assert.ok(err <= bar, `${F.name} ${arm} arm: dg = ${dg}, expected ${exact} (error ${err})`);
    }
  }
});

Deno.test("the cpu arm's dg (f64) with dht matches the ops arm to 1e-10 for gates from −5 to −745, chunk sizes 16/32/64, with and without h0", async () => {
  const bar = DTYPES.f64.bars!.gradients;
  let seed = 900, checked = 0;
  for (const g of LEVELS) {
    for (const withH0 of [false, true]) {
      const { x, ct } = strongGates(g, seed++, withH0, "f64");
      const ops = await kdaVjp(x, ct, { arm: "ops", quiet: true });
      for (const chunkSize of CHUNKS) {
        const cpu = await kdaVjp(x, ct, { arm: "cpu", chunkSize, quiet: true });
        const label = `g≈${g} C${chunkSize}${withH0 ? " h0" : ""}`;
        // Subnormal results carry absolute rounding of a few times 2^-1074 in either arm.
        assertClose(cpu.dg, ops.dg, bar, 16 * F64_TINY, `dg ${label}`);
        assertClose(cpu.dh0, ops.dh0, bar, 16 * F64_TINY, `dh0 ${label}`);
        checked++;
      }
    }
  }
  assert.equal(checked, LEVELS.length * 2 * CHUNKS.length);
});

Deno.test("the cpu arm's dg (f32) with dht matches the f64 ops arm on the same values to the f32 bar for gates from −5 to −745", async () => {
  const bar = DTYPES.f32.bars!.gradients;
  let seed = 1900;
  for (const g of LEVELS) {
    for (const withH0 of [false, true]) {
      const { x, ct } = strongGates(g, seed++, withH0, "f32");
      const ct64 = { dout: Float64Array.from(ct.dout), dht: Float64Array.from(ct.dht!) };
      const ops = await kdaVjp(toF64(x), ct64, { arm: "ops", quiet: true });
      for (const chunkSize of CHUNKS) {
        const cpu = await kdaVjp(x, ct, { arm: "cpu", chunkSize, quiet: true });
        assert.ok(cpu.dg instanceof Float32Array);
        // The cpu arm computes in f64 and rounds once to f32, whose subnormals step by 2^-149.
        assertClose(cpu.dg, ops.dg, bar, F32_TINY, `dg g≈${g} C${chunkSize}${withH0 ? " h0" : ""}`);
      }
    }
  }
});
