// The decode step (kdaStep, docs/kda.md 2.7): T tokens decoded one at a time give, token by
// token, the outputs and the final state of kda() on the whole sequence, on every arm; bad tokens,
// states and options get named errors.

import assert from "node:assert/strict";
import { type Float, kda, type KdaInputs, resetSeamCounts, seamCounts } from "../mod.ts";
import { kdaStep, type KdaStepToken } from "../kda/op/step.ts";
import type { Arm } from "../kda/_types.ts";
import { randomKda, Worst } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";
import type { ComputeDType } from "../base/dtype.ts";

reportMissingGpu("step_test");

const B = 2, T = 21, K = 8, V = 6;

/** A whole sequence (q, k with H heads; v, g, beta, h0 with HV) in the layout of kda(). */
function sequence(H: number, HV: number, seed: number, dtype: ComputeDType): KdaInputs {
  const qk = randomKda({ B, T, H, K, V }, seed, { dtype });
  const rest = randomKda({ B, T, H: HV, K, V }, seed + 1, { gateMin: -2, withH0: true, dtype });
  return {
    B,
    T,
    H,
    K,
    V,
    ...(HV !== H ? { HV } : {}),
    q: qk.q,
    k: qk.k,
    v: rest.v,
    g: rest.g,
    beta: rest.beta,
    h0: rest.h0!,
  };
}

/** Row t of each batch entry of a [B, T, width] array: token t of every sequence, [B, width]. */
function rowsAt(a: Float, t: number, width: number): Float {
  const out = a instanceof Float32Array ? new Float32Array(B * width) : new Float64Array(B * width);
  for (let b = 0; b < B; b++) {
    out.set(a.subarray((b * T + t) * width, (b * T + t + 1) * width), b * width);
  }
  return out;
}

/** Token t of a whole sequence, as kdaStep takes it. */
function tokenAt(x: KdaInputs, t: number): KdaStepToken {
  const { H, K, V } = x;
  const HV = x.HV ?? H;
  const rows = (a: Float, width: number) => rowsAt(a, t, width);
  return {
    B,
    H,
    K,
    V,
    ...(x.HV !== undefined ? { HV } : {}),
    q: rows(x.q as Float, H * K),
    k: rows(x.k as Float, H * K),
    v: rows(x.v as Float, HV * V),
    g: rows(x.g as Float, HV * K),
    beta: rows(x.beta as Float, HV),
  };
}

/** Decodes the whole sequence token by token on one arm and compares with kda() on that arm. */
async function checkDecode(arm: Arm, dtype: ComputeDType, tolO: number, tolState: number) {
  const worst = new Worst();
  for (const [H, HV] of [[2, 2], [1, 2]]) {
    const x = sequence(H, HV, 40 + HV, dtype);
    const label = `${arm} ${dtype} H${H} HV${HV}`;
    const whole = await kda(x, { arm, strict: true });
    let state = x.h0!;
    for (let t = 0; t < T; t++) {
      const step = await kdaStep(state, tokenAt(x, t), { arm, strict: true });
      assert.equal(step.o.constructor, x.q.constructor, `${label}: o type`);
      worst.check(`o ${label} token ${t}`, step.o, rowsAt(whole.o, t, HV * V), tolO);
      state = step.state;
    }
    worst.check(`state ${label}`, state, whole.ht, tolState);
  }
  worst.report(`kdaStep vs kda on the ${arm} arm`);
}

Deno.test("kdaStep() on the cpu and ops arms matches kda() token by token and in the final state (1e-12, f64), grouped heads too", async () => {
  await checkDecode("cpu", "f64", 1e-12, 1e-12);
  await checkDecode("ops", "f64", 1e-12, 1e-12);
});

Deno.test("kdaStep() on the cpu arm in f32 matches kda() to f32 rounding and counts as a fused forward", async () => {
  await checkDecode("cpu", "f32", 2e-6, 2e-6);
  resetSeamCounts();
  const x = sequence(2, 2, 7, "f32");
  await kdaStep(x.h0!, tokenAt(x, 0), { arm: "cpu", strict: true });
  const c = seamCounts();
  assert.equal(c.asked, 1);
  assert.equal(c.fusedFwd, 1);
  assert.equal(c.declined, 0);
});

gpuTest(
  "kdaStep() on the gpu arm matches kda() token by token and in the final state (f32 bars)",
  async () => {
    await checkDecode("gpu", "f32", 2e-6, 2e-6);
  },
);

Deno.test("kdaStep() with K = 257 runs on the cpu arm (a step uses no chunks) and matches the ops arm", async () => {
  const x = randomKda({ B: 1, T: 1, H: 2, K: 257, V: 3 }, 61, { withH0: true });
  const token = { B: 1, H: 2, K: 257, V: 3, q: x.q, k: x.k, v: x.v, g: x.g, beta: x.beta };
  resetSeamCounts();
  const cpu = await kdaStep(x.h0!, token, { arm: "cpu", strict: true });
  assert.deepEqual(seamCounts().declined, 0);
  const ops = await kdaStep(x.h0!, token, { arm: "ops", strict: true });
  const worst = new Worst();
  worst.check("o K=257", cpu.o, ops.o, 1e-12);
  worst.check("state K=257", cpu.state, ops.state, 1e-12);
  worst.report("kdaStep cpu vs ops at K = 257");
  // The chunked call of the same token is still limited on the cpu arm, by name.
  await assert.rejects(
    () => kda(x, { arm: "cpu", strict: true }),
    /K = 257 and V = 3 must be at most 256 on the cpu arm/,
  );
});

Deno.test("kdaStep() rejects bad tokens, states and options with named errors", async () => {
  const x = sequence(2, 2, 3, "f64");
  const token = tokenAt(x, 0);
  const state = x.h0!;
  const bad = async (run: () => Promise<unknown>, cls: ErrorConstructor, re: RegExp) => {
    await assert.rejects(
      run,
      (e: unknown) => e instanceof cls && re.test((e as Error).message),
      `${re}`,
    );
  };
  await bad(
    () => kdaStep(state, { ...token, q: new Float64Array(3) }),
    RangeError,
    /^token\.q must have 32 elements \[B, H, K\]: got 3$/,
  );
  await bad(
    () => kdaStep(new Float32Array(state.length), token),
    TypeError,
    /^state must be a Float64Array like the other arrays: got Float32Array$/,
  );
  await bad(
    () => kdaStep(new Float64Array(5), token),
    RangeError,
    /^state must have 192 elements \[B, H, K, V\]: got 5$/,
  );
  await bad(
    () => kdaStep(state, { ...token, HV: 3 }),
    RangeError,
    /^token\.HV must be a multiple of token\.H = 2: got 3$/,
  );
  await bad(
    () => kdaStep(state, { ...token, g: new Float64Array(token.g.length).fill(0.5) }),
    RangeError,
    /^token\.g must be <= 0 \(a log decay\): got 0\.5 at index 0$/,
  );
  await bad(
    () => kdaStep(state, { ...token, cuSeqlens: new Int32Array([0, 1]) } as KdaStepToken),
    TypeError,
    /^token\.cuSeqlens is not a known field/,
  );
  await bad(
    () => kdaStep(state, token, { chunkSize: 16 } as never),
    TypeError,
    /^options\.chunkSize is not a known field: expected one of arm, strict, quiet/,
  );
});
