// A call computes on exactly what its checks passed (issue 17.2): typed arrays and cuSeqlens
// changed by the caller while the call is pending change nothing, on every arm; and a gate far
// below e^-103 clears the state on the gpu arm as in f64 (issue 17.5), on every kernel set.

import assert from "node:assert/strict";
import { kda, type KdaInputs, kdaVjp } from "../mod.ts";
import type { Arm } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { kernelSetNames } from "../kda/gpu/kernel_set.ts";
import "../kda/gpu/kernels/mod.ts";
import { bitsEqual, randomKda } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu, status } from "./_gpu.ts";

reportMissingGpu("checked_inputs_test");

const H = 2, K = 8, V = 6;

function packedInputs(): KdaInputs {
  const lengths = [7, 20, 13];
  const T = lengths.reduce((a, b) => a + b, 0);
  const x = randomKda({ B: 1, T, H, K, V }, 5, { gateMin: -2, withH0: false, dtype: "f32" });
  return { ...x, cuSeqlens: new Int32Array([0, 7, 27, 40]) };
}

/** Every array and the offsets of a problem, copied. */
function copyOf(x: KdaInputs): KdaInputs {
  const out: Record<string, unknown> = { ...x };
  for (const [k, v] of Object.entries(x)) {
    if (ArrayBuffer.isView(v)) out[k] = (v as Float32Array).slice();
  }
  return out as unknown as KdaInputs;
}

/** Changes the caller's arrays the way the adversary did: offsets, a positive gate, q. */
function vandalize(x: KdaInputs): void {
  x.cuSeqlens![1] = 30;
  x.g.fill(0.5);
  x.q.fill(Number.NaN);
}

const arms: Arm[] = ["ops", "cpu", ...(status.available ? ["gpu" as const] : [])];

Deno.test("a pending kda() or kdaVjp() computes on the values that passed its checks, on every arm", async () => {
  for (const arm of arms) {
    const options = { arm, strict: true, chunkSize: 16 } as const;
    const want = await kda(copyOf(packedInputs()), options);
    const x = packedInputs();
    const pending = kda(x, options);
    vandalize(x);
    const got = await pending;
    assert.ok(bitsEqual(got.o, want.o), `${arm}: o changed with the caller's arrays`);
    assert.ok(bitsEqual(got.ht, want.ht), `${arm}: ht changed with the caller's arrays`);

    const dout = Float32Array.from({ length: 40 * H * V }, (_, i) => Math.sin(i));
    const wantGrads = await kdaVjp(copyOf(packedInputs()), { dout: dout.slice() }, options);
    const y = packedInputs();
    const cot = { dout: dout.slice() };
    const pendingGrads = kdaVjp(y, cot, options);
    vandalize(y);
    cot.dout.fill(Number.NaN);
    const grads = await pendingGrads;
    for (const name of GRAD_NAMES) {
      assert.ok(bitsEqual(grads[name], wantGrads[name]), `${arm}: ${name} changed`);
    }
  }
});

gpuTest(
  "a gate of −1e4 clears a state of 1e38 on the gpu arm as in f64, on every kernel set (no decay floor of 2^-149)",
  async () => {
    const x: KdaInputs = {
      B: 1,
      T: 2,
      H: 1,
      K: 4,
      V: 4,
      scale: 1,
      q: new Float32Array(8).fill(0.5),
      k: new Float32Array(8).fill(0.5),
      v: new Float32Array(8).fill(1e-20),
      g: Float32Array.from([-1e4, -1e4, -1e4, -1e4, -0.1, -0.1, -0.1, -0.1]),
      beta: new Float32Array(2).fill(0.5),
      h0: new Float32Array(16).fill(1e38),
    };
    const wide = (a: Float32Array) => Float64Array.from(a);
    const x64: KdaInputs = {
      ...x,
      q: wide(x.q as Float32Array),
      k: wide(x.k as Float32Array),
      v: wide(x.v as Float32Array),
      g: wide(x.g as Float32Array),
      beta: wide(x.beta as Float32Array),
      h0: wide(x.h0 as Float32Array),
    };
    const ref = await kda(x64, { arm: "cpu", strict: true });
    const refMax = Math.max(...Array.from(ref.o, Math.abs));
    // the first token's state is e^-1e4 * 1e38 = 0 plus its write: o is of the order of v
    assert.ok(refMax < 1e-19, `reference o ${refMax}`);
    for (const kernels of kernelSetNames()) {
      const out = await kda(x, { arm: "gpu", strict: true, kernels });
      let diff = 0;
      for (let i = 0; i < out.o.length; i++) diff = Math.max(diff, Math.abs(out.o[i] - ref.o[i]));
      const rel = diff / refMax;
      if (!(rel <= 2e-6)) {
        throw new Error(
          `${kernels}: o max|a−b|/max|b| = ${rel} (max|a−b| ${diff}, max|b| ${refMax}) exceeds 2e-6`,
        );
      }
    }
  },
);
