// A kdaVjp from typed arrays on the gpu arm runs its forward and backward as one (Seam.vjp, the
// gpu arm's vjp), without a tape: it gives the tape route's bits for every kind of call (h0 or
// none, dht or none, packed sequences, grouped value heads, the in-kernel options, 16-bit
// storage), reads back only the gradients (one host sync, not two), is counted as one fused
// forward and backward, and leaves its checked copies to the next call without letting them reach
// that call's results.

import assert from "node:assert/strict";
import {
  kda,
  type KdaInputs,
  type KdaOptions,
  kdaVjp,
  resetSeamCounts,
  seamCounts,
} from "../mod.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { kdaSeam, withKdaSeam } from "../kda/op/arms.ts";
import { type FusedArm, Seam, type SeamArm } from "../seam/seam.ts";
import { gpuSyncs } from "../kda/gpu/tensor.ts";
import { agreement, bitsEqual, randomKda, toF32 } from "./_fixtures.ts";
import { DTYPES } from "../base/dtype.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("typed_vjp_test.ts");

/** The KDA seam's policy with no arm offering a vjp: every kdaVjp goes on a tape. */
function tapeOnly(): Seam<never> {
  const arms = kdaSeam.policy.arms.map((arm): SeamArm<never> => {
    if (arm.kind !== "fused") return arm as SeamArm<never>;
    const { vjp: _, ...rest } = arm as FusedArm<unknown>;
    return rest as SeamArm<never>;
  });
  return new Seam({ ...kdaSeam.policy, arms } as never) as Seam<never>;
}

function wave(n: number, seed: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => Math.sin(0.37 * i + seed));
}

interface Case {
  name: string;
  inputs: KdaInputs<Float32Array>;
  dout: Float32Array;
  dht?: Float32Array;
  options: KdaOptions;
}

function cases(): Case[] {
  const [H, K, V] = [2, 8, 6];
  const plain = toF32(randomKda({ B: 2, T: 37, H, K, V }, 11, { withH0: true }));
  const noH0 = toF32(randomKda({ B: 1, T: 20, H, K, V }, 12, { withH0: false }));
  const packedBase = toF32(randomKda({ B: 1, T: 45, H, K, V }, 13, { withH0: false }));
  const HV = 4;
  const packed: KdaInputs<Float32Array> = {
    ...packedBase,
    HV,
    v: wave(45 * HV * V, 1),
    g: wave(45 * HV * K, 2).map((x) => -0.1 - 0.4 * Math.abs(x)),
    beta: wave(45 * HV, 3).map((x) => 0.5 + 0.4 * x),
    cuSeqlens: new Int32Array([0, 9, 9, 30, 45]),
  };
  const raw = toF32(randomKda({ B: 1, T: 24, H, K, V }, 14, { withH0: true }));
  const inKernel: KdaInputs<Float32Array> = {
    ...raw,
    g: wave(24 * H * K, 4),
    beta: wave(24 * H, 5),
    aLog: wave(H, 6),
    dtBias: wave(H * K, 7),
  };
  const base = { arm: "gpu", strict: true, quiet: true, chunkSize: 16 } as const;
  return [
    {
      name: "h0 and dht",
      inputs: plain,
      dout: wave(2 * 37 * H * V, 8),
      dht: wave(2 * H * K * V, 9),
      options: base,
    },
    { name: "no h0, no dht", inputs: noH0, dout: wave(20 * H * V, 10), options: base },
    {
      name: "packed, HV = 2H",
      inputs: packed,
      dout: wave(45 * HV * V, 11),
      dht: wave(4 * HV * K * V, 12),
      options: base,
    },
    {
      name: "in-kernel options, no ht",
      inputs: inKernel,
      dout: wave(24 * H * V, 13),
      options: {
        ...base,
        useQkL2NormInKernel: true,
        useGateInKernel: true,
        useBetaSigmoidInKernel: true,
        outputFinalState: false,
      },
    },
  ];
}

gpuTest(
  "a typed kdaVjp on the gpu arm gives the tape route's bits, one host sync, one fused forward and backward",
  async () => {
    for (const c of cases()) {
      const cot = { dout: c.dout, ...(c.dht !== undefined ? { dht: c.dht } : {}) };
      const syncs0 = gpuSyncs();
      resetSeamCounts();
      const direct = await kdaVjp(c.inputs, cot, c.options);
      const counts = seamCounts();
      assert.equal(gpuSyncs() - syncs0, 1, `${c.name}: host syncs of the direct route`);
      assert.equal(counts.asked, 1, `${c.name}: asked`);
      assert.equal(counts.fusedFwd, 1, `${c.name}: fusedFwd`);
      assert.equal(counts.fusedBwd, 1, `${c.name}: fusedBwd`);
      assert.equal(counts.customNodeBwd, 0, `${c.name}: no tape node entered`);
      assert.equal(counts.declined, 0, `${c.name}: declined`);
      assert.equal(Object.keys(counts.variants).length, 1, `${c.name}: one variant counted`);
      assert.ok(Object.keys(counts.variants)[0].startsWith("gpu:"), `${c.name}: the gpu arm ran`);

      const syncs1 = gpuSyncs();
      const taped = await withKdaSeam(tapeOnly() as never, () => kdaVjp(c.inputs, cot, c.options));
      assert.equal(gpuSyncs() - syncs1, 2, `${c.name}: the tape route reads o back too`);
      const names = [
        ...GRAD_NAMES,
        ...(c.inputs.aLog !== undefined ? ["daLog" as const] : []),
        ...(c.inputs.dtBias !== undefined ? ["ddtBias" as const] : []),
      ];
      assert.deepEqual(Object.keys(direct).sort(), Object.keys(taped).sort(), `${c.name}: keys`);
      for (const name of names) {
        const a = direct[name as keyof typeof direct] as Float32Array;
        const b = taped[name as keyof typeof taped] as Float32Array;
        assert.ok(a instanceof Float32Array, `${c.name}: ${name} is a Float32Array`);
        assert.ok(bitsEqual(a, b), `${c.name}: ${name} differs from the tape route's`);
      }
    }
  },
);

gpuTest(
  "typed kdaVjp and kda calls that reuse the last call's checked copies compute on their own inputs",
  async () => {
    const [B, T, H, K, V] = [1, 33, 2, 8, 8];
    const options = { arm: "gpu", strict: true, quiet: true, chunkSize: 16 } as const;
    const x64 = [1, 2, 3].map((s) => randomKda({ B, T, H, K, V }, 20 + s, { withH0: true }));
    const xs = x64.map(toF32);
    const dout = (i: number) => wave(B * T * H * V, i);
    // the f64 reference on the very same values, which no copy of this call's is part of
    const refs = [];
    for (const [i, x] of x64.entries()) {
      refs.push({
        grads: await kdaVjp(x, { dout: Float64Array.from(dout(i)) }, { arm: "cpu", chunkSize: 16 }),
        out: await kda(x, { arm: "cpu", chunkSize: 16 }),
      });
    }
    const bars = DTYPES.f32.bars!;
    const near = (a: ArrayLike<number>, b: ArrayLike<number>, bar: number, what: string) => {
      const { rel, absDiff, refMax } = agreement(a, b);
      if (!(rel <= bar)) {
        throw new Error(
          `${what}: max|a−b|/max|b| = ${rel} (max|a−b| ${absDiff}, max|b| ${refMax}) > ${bar}`,
        );
      }
    };
    // two rounds, one call after another: from the second call on, each copies into the arrays the
    // call before gave back, and must overwrite every element
    const firsts: Awaited<ReturnType<typeof kdaVjp<Float32Array>>>[] = [];
    for (let round = 0; round < 2; round++) {
      for (const [i, x] of xs.entries()) {
        const grads = await kdaVjp(x, { dout: dout(i) }, options);
        for (const name of GRAD_NAMES) {
          near(
            grads[name],
            refs[i].grads[name],
            bars.gradients,
            `round ${round}, call ${i}: ${name}`,
          );
        }
        const out = await kda(x, options);
        near(out.o, refs[i].out.o, bars.outputs, `round ${round}, call ${i}: o`);
        near(out.ht, refs[i].out.ht, bars.outputs, `round ${round}, call ${i}: ht`);
        if (round === 0) firsts.push(grads);
        else {
          for (const name of GRAD_NAMES) {
            assert.ok(
              bitsEqual(grads[name], firsts[i][name]),
              `call ${i}: ${name} differs by round`,
            );
          }
        }
      }
    }
    // a call's results are none of the copies handed on: later calls left them as they were
    for (const [i, grads] of firsts.entries()) {
      for (const name of GRAD_NAMES) {
        near(grads[name], refs[i].grads[name], bars.gradients, `call ${i}'s ${name}, kept`);
      }
    }
  },
);

gpuTest(
  "a typed kdaVjp from 16-bit storage takes the direct route with the tape route's bits",
  async () => {
    const x = randomKda({ B: 1, T: 24, H: 2, K: 8, V: 8 }, 31, { withH0: false });
    const half: KdaInputs<Float16Array> = {
      ...x,
      q: Float16Array.from(x.q),
      k: Float16Array.from(x.k),
      v: Float16Array.from(x.v),
      g: Float16Array.from(x.g),
      beta: Float16Array.from(x.beta),
    } as unknown as KdaInputs<Float16Array>;
    const dout = Float16Array.from(wave(24 * 2 * 8, 3));
    const options = { arm: "gpu", strict: true, quiet: true, chunkSize: 16 } as const;
    resetSeamCounts();
    const direct = await kdaVjp(half, { dout }, options);
    assert.equal(seamCounts().customNodeBwd, 0);
    const taped = await withKdaSeam(tapeOnly() as never, () => kdaVjp(half, { dout }, options));
    for (const name of GRAD_NAMES) {
      assert.ok(direct[name] instanceof Float16Array, `${name} keeps the storage type`);
      const bits = (a: unknown) => Float32Array.from(a as Float16Array);
      assert.ok(bitsEqual(bits(direct[name]), bits(taped[name])), `${name}`);
    }
  },
);

Deno.test("kdaVjp on an arm without a vjp runs on a tape, counted as before", async () => {
  const x = randomKda({ B: 1, T: 12, H: 1, K: 4, V: 4 }, 41, { withH0: true });
  resetSeamCounts();
  await kdaVjp(x, { dout: Float64Array.from(wave(48, 1)) }, { arm: "cpu", chunkSize: 16 });
  const counts = seamCounts();
  assert.equal(counts.asked, 1);
  assert.equal(counts.fusedFwd, 1);
  assert.equal(counts.customNodeBwd, 1, "the cpu arm's backward ran as a tape node");
  assert.equal(counts.fusedBwd, 1);
});
