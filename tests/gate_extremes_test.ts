// The in-kernel gate at its extremes (docs/kda.md 2.8): a gate past its dtype's range passes no
// gradient and daLog counts its terms as 0, not NaN; on the gpu arm a decay that underflows f32
// passes a gradient of 0 (the chunked backward's residue there, times the log decay, was daLog
// −1.9e21), a head whose decays are all strong keeps daLog's digits, and a lowerBound f32 cannot
// hold is a counted decline.

import assert from "node:assert/strict";
import { type KdaInputs, type KdaOptions, kdaVjp, resetSeamCounts, seamCounts } from "../mod.ts";
import type { Arm, Float } from "../kda/_types.ts";
import { kernelSet, kernelSetNames } from "../kda/gpu/mod.ts";
import { mulberry32, Worst } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("gate_extremes_test");

/** The gpu arm's kernel sets that have a backward (the decode set has none). */
const GPU_SETS = kernelSetNames().filter((n) => kernelSet(n).backward !== null);

// A gate that overflows its dtype (aLog at the checker's limit, a softplus of 3 or a sigmoid's
// argument past the largest float) decays to exactly 0 and passes no gradient: each term of daLog
// is that zero gradient times an infinite log decay (or argument), which must count as 0, not NaN.
const overflowing = (arr: Float32ArrayConstructor | Float64ArrayConstructor, aLog: number) => {
  const [B, T, H, K, V] = [1, 4, 1, 4, 4];
  const f = (n: number, v: number) => new arr(n).fill(v);
  return {
    x: {
      B,
      T,
      H,
      K,
      V,
      q: f(T * K, 0.5),
      k: f(T * K, 0.5),
      v: f(T * V, 1),
      g: f(T * K, 3),
      beta: f(T, 0.5),
      aLog: f(H, aLog),
      dtBias: f(H * K, 0),
    } as KdaInputs,
    cot: { dout: f(T * V, 1), dht: f(K * V, 1) },
  };
};

async function assertZeroGateGradients(arm: Arm, dtype: "f32" | "f64", kernels?: string) {
  const [arr, aLog] = dtype === "f64" ? [Float64Array, 709] : [Float32Array, 88];
  const { x, cot } = overflowing(arr, aLog);
  for (const lowerBound of [null, -5]) {
    const options: KdaOptions = {
      useGateInKernel: true,
      ...(lowerBound === null ? {} : { lowerBound }),
      arm,
      strict: true,
      quiet: true,
      ...(kernels ? { kernels } : {}),
    };
    const grads = await kdaVjp(x, cot, options) as unknown as Record<string, Float>;
    const what = `${arm}${kernels ? ` (${kernels})` : ""} ${dtype}, lowerBound ${lowerBound}`;
    for (const [name, a] of Object.entries(grads)) {
      assert.ok(a.every(Number.isFinite), `${what}: ${name} has a value that is not finite`);
    }
    assert.ok(grads.daLog[0] === 0, `${what}: daLog ${grads.daLog[0]}, expected 0`);
    assert.ok(grads.ddtBias.every((v) => v === 0), `${what}: ddtBias not all 0`);
  }
}

Deno.test("in-kernel options: a gate past the dtype's range gives daLog 0 on the ops and cpu arms", async () => {
  for (const dtype of ["f32", "f64"] as const) {
    for (const arm of ["ops", "cpu"] as const) await assertZeroGateGradients(arm, dtype);
  }
});

for (const kernels of GPU_SETS) {
  gpuTest(
    `in-kernel options: a gate past f32's range gives daLog 0 on the gpu arm (kernels ${kernels})`,
    () => assertZeroGateGradients("gpu", "f32", kernels),
  );
}

// One token's raw gate far past the decay's range among ordinary ones: its log decay's gradient is
// the decay (0 in f32) times a finite sum, and daLog multiplies it by the log decay (−1e30 at the
// largest). The chunked backward leaves a rounding residue there; the gpu arm must not return it
// amplified (it returned daLog −1.9e21 against −0.063 for one such token at T = 3).
for (const kernels of GPU_SETS) {
  gpuTest(
    `in-kernel options: an underflowing decay among ordinary ones keeps daLog within 2e-5 of f64 (kernels ${kernels})`,
    async () => {
      const T = 40, K = 4, V = 3;
      const worst = new Worst();
      // the softplus form's log decay at those tokens is below f32's underflow (its gradient is
      // taken as 0 there); the lower-bound form's stays above lowerBound
      for (const big of [1e30, 1e4, 200, 110, 40, 20, 12]) {
        for (const lowerBound of big === 1e30 ? [null, -5] : [null]) {
          const make = <A extends Float64Array | Float32Array>(C: { from(a: number[]): A }) => {
            const r = mulberry32(5);
            const f = (n: number, s: number) =>
              C.from(Array.from({ length: n }, () => s * (r() - 0.5)));
            const g = f(T * K, 2);
            for (let c = 0; c < K; c++) g[7 * K + c] = big; // token 7, every channel
            return {
              x: {
                B: 1,
                T,
                H: 1,
                K,
                V,
                q: f(T * K, 1),
                k: f(T * K, 1),
                v: f(T * V, 2),
                g,
                beta: f(T, 1).map((b) => 0.5 + b / 2),
                aLog: f(1, 0.5),
              } as KdaInputs,
              cot: { dout: f(T * V, 2), dht: f(K * V, 2) },
            };
          };
          const options = { useGateInKernel: true, ...(lowerBound === null ? {} : { lowerBound }) };
          const ref = await kdaVjp(make(Float64Array).x, make(Float64Array).cot, {
            ...options,
            arm: "cpu",
          }) as unknown as Record<string, Float>;
          const f32 = make(Float32Array);
          const got = await kdaVjp(f32.x, f32.cot, {
            ...options,
            arm: "gpu",
            strict: true,
            kernels,
          }) as unknown as Record<string, Float>;
          for (const name of ["daLog", "dg", "dq", "dk", "dv", "dbeta"]) {
            worst.check(
              `raw gate ${big}, lowerBound ${lowerBound}: ${name}`,
              got[name],
              ref[name],
              2e-5,
            );
          }
        }
      }
      worst.report(`kernels ${kernels}`);
    },
  );
}

// Every gate of the head strong (log decays of −15 to −44): the daLog terms are tiny, and so is
// what the chunked backward's sums cancel, so the gpu arm's daLog keeps its digits. A rule that
// counted such terms as 0 (tried: below −16.64) returned daLog 0 against −2e-7 here.
for (const kernels of GPU_SETS) {
  gpuTest(
    `in-kernel options: a head whose decays are all negligible keeps its daLog within 2e-5 of f64 (kernels ${kernels})`,
    async () => {
      const worst = new Worst();
      const [T, H, K, V] = [16, 1, 4, 4];
      for (const level of [17, 25, 40]) {
        const make = <A extends Float64Array | Float32Array>(C: { from(a: number[]): A }) => {
          const r = mulberry32(9);
          const f = (n: number, s: number, at = 0) =>
            C.from(Array.from({ length: n }, () => at + s * (r() - 0.5)));
          return {
            x: {
              B: 1,
              T,
              H,
              K,
              V,
              q: f(T * H * K, 2),
              k: f(T * H * K, 2),
              v: f(T * H * V, 2),
              // a raw gate of about `level` is a log decay of about −level (aLog = 0)
              g: f(T * H * K, 0.1 * level, level),
              beta: f(T * H, 0.8, 0.5),
              h0: f(H * K * V, 2),
              aLog: f(H, 0),
            } as KdaInputs,
            cot: { dout: f(T * H * V, 2), dht: f(H * K * V, 2) },
          };
        };
        const options = { useGateInKernel: true };
        const f64 = make(Float64Array), f32 = make(Float32Array);
        const ref = await kdaVjp(f64.x, f64.cot, { ...options, arm: "cpu" }) as unknown as Record<
          string,
          Float
        >;
        const got = await kdaVjp(f32.x, f32.cot, {
          ...options,
          arm: "gpu",
          strict: true,
          kernels,
        }) as unknown as Record<string, Float>;
        assert.ok(ref.daLog[0] !== 0, `level ${level}: the f64 daLog is not 0`);
        worst.check(`level ${level}: daLog`, got.daLog, ref.daLog, 2e-5);
      }
      worst.report(`kernels ${kernels}`);
    },
  );
}

gpuTest(
  "in-kernel options: a lowerBound f32 cannot hold is a counted, named decline on the gpu arm",
  async () => {
    const f = (n: number, v: number) => new Float32Array(n).fill(v);
    const x = {
      B: 1,
      T: 3,
      H: 1,
      K: 2,
      V: 2,
      q: f(6, 0.1),
      k: f(6, 0.1),
      v: f(6, 1),
      g: f(6, 0.1),
      beta: f(3, 0.5),
      aLog: f(1, 0),
    };
    const cot = { dout: f(6, 1), dht: f(4, 1) };
    for (const [lowerBound, why] of [[-1e39, /-Infinity$/], [-1e-50, /rounds to 0$/]] as const) {
      const options = { useGateInKernel: true, lowerBound, quiet: true } as const;
      // it rounds to −∞ (or 0) in f32, where the gpu arm's gradients were NaN
      await assert.rejects(
        kdaVjp(x, cot, { ...options, arm: "gpu", strict: true }),
        (e: Error) => e.message.includes(`lowerBound must be`) && why.test(e.message),
      );
      resetSeamCounts();
      const grads = await kdaVjp(x, cot, { ...options, arm: "gpu" }) as unknown as Record<
        string,
        Float
      >;
      assert.equal(seamCounts().declined, 1, `lowerBound ${lowerBound}: one counted decline`);
      for (const [name, a] of Object.entries(grads)) {
        assert.ok(a.every(Number.isFinite), `lowerBound ${lowerBound}: ${name} is not all finite`);
      }
    }
  },
);
