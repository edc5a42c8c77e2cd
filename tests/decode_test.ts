// Multi-token decode (kdaStep with token.T, docs/kda.md 2.7): T ≥ 1 tokens per call from a state,
// the plain recurrence on every arm (the gpu arm's decode kernel set "recurrent"), equal to kda()
// on the whole sequence however it is cut into calls, with grouped value heads and the in-kernel
// options; on GpuTensors the calls chain DeviceTensor states with no host sync until a read. Bad
// token counts get named errors.

import assert from "node:assert/strict";
import {
  DTYPES,
  gpuSyncs,
  kda,
  type KdaInputs,
  KdaModule,
  type KdaModuleState,
  type KdaOptions,
  releaseTensors,
  resetSeamCounts,
  seamCounts,
  toGpu,
} from "../mod.ts";
import { kdaStep, type KdaStepToken } from "../kda/op/step.ts";
import type { Arm, Float } from "../kda/_types.ts";
import { DeviceTensor } from "../kda/gpu/tensor.ts";
import { mulberry32, normal, Worst } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";
import type { ComputeDType } from "../base/dtype.ts";

reportMissingGpu("decode_test");

const F32 = DTYPES.f32.bars!;

interface Shape {
  B: number;
  T: number;
  H: number;
  HV: number;
  K: number;
  V: number;
}

/** A whole sequence of each batch entry, raw inputs for the options where asked. */
function sequence(s: Shape, seed: number, dtype: ComputeDType, raw: KdaOptions = {}): KdaInputs {
  const rand = mulberry32(seed), gauss = normal(rand);
  const { B, T, H, HV, K, V } = s;
  const like = (n: number, f: () => number): Float => {
    const a = Float64Array.from({ length: n }, f);
    return dtype === "f32" ? Float32Array.from(a) : a;
  };
  return {
    B,
    T,
    H,
    K,
    V,
    ...(HV !== H ? { HV } : {}),
    q: like(B * T * H * K, gauss),
    k: like(B * T * H * K, () => gauss() / Math.sqrt(K)),
    v: like(B * T * HV * V, gauss),
    g: like(B * T * HV * K, raw.useGateInKernel ? gauss : () => -0.05 - rand()),
    beta: like(B * T * HV, raw.useBetaSigmoidInKernel ? gauss : () => 0.05 + 0.9 * rand()),
    h0: like(B * HV * K * V, () => 0.3 * gauss()),
    ...(raw.useGateInKernel
      ? { aLog: like(HV, () => 0.3 * gauss()), dtBias: like(HV * K, gauss) }
      : {}),
  };
}

/** Tokens t0 .. t1 − 1 of every sequence, as kdaStep takes them (with T). */
function tokens(x: KdaInputs, t0: number, t1: number): KdaStepToken {
  const { B, T, H, K, V } = x;
  const HV = x.HV ?? H;
  const n = t1 - t0;
  const rows = (a: Float, width: number) => {
    const out = a instanceof Float32Array ? new Float32Array(B * n * width) : new Float64Array(
      B * n * width,
    );
    for (let b = 0; b < B; b++) {
      out.set(a.subarray((b * T + t0) * width, (b * T + t1) * width), b * n * width);
    }
    return out;
  };
  return {
    B,
    T: n,
    H,
    K,
    V,
    ...(x.HV !== undefined ? { HV } : {}),
    q: rows(x.q as Float, H * K),
    k: rows(x.k as Float, H * K),
    v: rows(x.v as Float, HV * V),
    g: rows(x.g as Float, HV * K),
    beta: rows(x.beta as Float, HV),
    ...(x.aLog !== undefined ? { aLog: x.aLog as Float, dtBias: x.dtBias as Float } : {}),
  };
}

/** Rows t0 .. t1 − 1 of each batch entry of a [B, T, width] array, of the array's type. */
function outRows(a: Float, B: number, T: number, width: number, t0: number, t1: number): Float {
  const n = B * (t1 - t0) * width;
  const out = a instanceof Float32Array ? new Float32Array(n) : new Float64Array(n);
  for (let b = 0; b < B; b++) {
    out.set(a.subarray((b * T + t0) * width, (b * T + t1) * width), b * (t1 - t0) * width);
  }
  return out;
}

/** Decodes the sequence in calls of the given lengths and checks each against kda() on it all. */
async function checkCuts(
  arm: Arm,
  s: Shape,
  x: KdaInputs,
  cuts: number[],
  options: KdaOptions,
  tol: number,
  worst: Worst,
  label: string,
) {
  const whole = await kda(x, { ...options, arm: arm === "gpu" ? "cpu" : arm, strict: true });
  let state = x.h0 as Float;
  let t0 = 0;
  for (const n of cuts) {
    const step = await kdaStep(state, tokens(x, t0, t0 + n), { ...options, arm, strict: true });
    assert.equal(step.o.constructor, x.q.constructor, `${label}: o type`);
    assert.equal(step.o.length, s.B * n * s.HV * s.V);
    worst.check(
      `${label} o ${t0}..${t0 + n}`,
      step.o,
      outRows(whole.o, s.B, s.T, s.HV * s.V, t0, t0 + n),
      tol,
    );
    state = step.state;
    t0 += n;
  }
  assert.equal(t0, s.T);
  worst.check(`${label} state`, state, whole.ht, tol);
}

const SHAPES: Shape[] = [
  { B: 2, T: 23, H: 2, HV: 2, K: 8, V: 6 },
  { B: 3, T: 20, H: 1, HV: 2, K: 20, V: 9 },
];
const CUTS = [[23], [1, 1, 5, 16], [20], [3, 17]];
const OPTIONS: KdaOptions[] = [
  {},
  { useQkL2NormInKernel: true, useGateInKernel: true, useBetaSigmoidInKernel: true },
  { useGateInKernel: true, lowerBound: -4, useBetaSigmoidInKernel: true, allowNegEigval: true },
];

for (const arm of ["ops", "cpu"] as Arm[]) {
  Deno.test(`kdaStep() with T tokens per call on the ${arm} arm equals kda() on the whole sequence however it is cut (1e-12, f64), grouped heads and in-kernel options too`, async () => {
    const worst = new Worst();
    for (const [i, s] of SHAPES.entries()) {
      for (const options of OPTIONS) {
        const x = sequence(s, 5 + i, "f64", options);
        for (const cuts of CUTS.filter((c) => c.reduce((a, b) => a + b) === s.T)) {
          await checkCuts(
            arm,
            s,
            x,
            cuts,
            options,
            1e-12,
            worst,
            `${arm} ${JSON.stringify(options)} cuts ${cuts}`,
          );
        }
      }
    }
    worst.report(`decode on the ${arm} arm`);
  });
}

Deno.test("kdaStep() on the cpu arm is one fused forward per call, whatever T, and runs the plain recurrence (no chunk limit on K)", async () => {
  const s = { B: 1, T: 9, H: 1, HV: 1, K: 300, V: 3 };
  const x = sequence(s, 2, "f64");
  resetSeamCounts();
  const cpu = await kdaStep(x.h0 as Float, tokens(x, 0, 9), { arm: "cpu", strict: true });
  const c = seamCounts();
  assert.deepEqual([c.asked, c.fusedFwd, c.opsPath, c.declined], [1, 1, 0, 0]);
  const ops = await kdaStep(x.h0 as Float, tokens(x, 0, 9), { arm: "ops", strict: true });
  const worst = new Worst();
  worst.check("o K=300", cpu.o, ops.o, 1e-12);
  worst.check("state K=300", cpu.state, ops.state, 1e-12);
  worst.report("decode at K = 300, cpu vs ops");
});

gpuTest(
  "kdaStep() with T tokens per call on the gpu arm (kernel set recurrent) equals the f64 kda() on the same bytes to the f32 bars, however it is cut",
  async () => {
    const worst = new Worst();
    for (const [i, s] of SHAPES.entries()) {
      for (const options of OPTIONS) {
        const x = sequence(s, 5 + i, "f32", options);
        for (const cuts of CUTS.filter((c) => c.reduce((a, b) => a + b) === s.T)) {
          resetSeamCounts();
          await checkCuts(
            "gpu",
            s,
            x,
            cuts,
            options,
            F32.outputs,
            worst,
            `gpu ${JSON.stringify(options)} cuts ${cuts}`,
          );
          assert.equal(
            seamCounts().variants["gpu:recurrent"],
            cuts.length,
            "each call ran the decode set",
          );
        }
      }
    }
    worst.report("decode on the gpu arm");
  },
);

gpuTest(
  "kdaStep() at K = V = 128 and 256, and across the decode set's dispatch ranges, agrees with the cpu arm to the f32 bars",
  async () => {
    const worst = new Worst();
    for (
      const s of [
        { B: 1, T: 40, H: 2, HV: 2, K: 128, V: 128 },
        { B: 2, T: 6, H: 1, HV: 1, K: 256, V: 40 },
        // one dispatch covers about 6,000 tokens at K = 128 on llvmpipe's loop budget
        { B: 1, T: 6500, H: 1, HV: 1, K: 128, V: 8 },
      ]
    ) {
      const x = sequence(s, 9, "f32");
      const t = tokens(x, 0, s.T);
      const gpu = await kdaStep(x.h0 as Float, t, { arm: "gpu", strict: true });
      const cpu = await kdaStep(
        Float64Array.from(x.h0 as Float),
        Object.fromEntries(
          Object.entries(t).map((
            [k, a],
          ) => [k, a instanceof Float32Array ? Float64Array.from(a) : a]),
        ) as unknown as KdaStepToken,
        { arm: "cpu", strict: true },
      );
      worst.check(`o K=${s.K} T=${s.T}`, gpu.o, cpu.o, F32.outputs);
      worst.check(`state K=${s.K} T=${s.T}`, gpu.state, cpu.state, F32.outputs);
    }
    worst.report("decode at wide heads, gpu vs cpu f64");
  },
);

gpuTest(
  "a decode loop on GpuTensors chains DeviceTensor states with no host sync, and reading is one sync per tensor read",
  async () => {
    const s = { B: 2, T: 12, H: 2, HV: 4, K: 16, V: 8 };
    const options = {
      useQkL2NormInKernel: true,
      useGateInKernel: true,
      useBetaSigmoidInKernel: true,
    };
    const x = sequence(s, 4, "f32", options);
    const cuts = [1, 4, 7];
    // the typed-array gpu arm, call by call, as the reference for the bits
    let hostState = x.h0 as Float32Array;
    const hostOuts: Float32Array[] = [];
    let t0 = 0;
    for (const n of cuts) {
      const step = await kdaStep(hostState, tokens(x, t0, t0 + n), { ...options, arm: "gpu" });
      hostOuts.push(step.o as Float32Array);
      hostState = step.state as Float32Array;
      t0 += n;
    }
    // the same on the device: every token array uploaded first, then the loop
    const uploads: DeviceTensor[] = [];
    const up = async (a: Float, shape: number[]) => {
      const t = await toGpu(a as Float32Array, shape);
      uploads.push(t);
      return t;
    };
    const steps: KdaStepToken<DeviceTensor>[] = [];
    t0 = 0;
    for (const n of cuts) {
      const t = tokens(x, t0, t0 + n);
      steps.push({
        ...t,
        q: await up(t.q, [s.B, n, s.H, s.K]),
        k: await up(t.k, [s.B, n, s.H, s.K]),
        v: await up(t.v, [s.B, n, s.HV, s.V]),
        g: await up(t.g, [s.B, n, s.HV, s.K]),
        beta: await up(t.beta, [s.B, n, s.HV]),
        aLog: await up(t.aLog!, [s.HV]),
        dtBias: await up(t.dtBias!, [s.HV * s.K]),
      });
      t0 += n;
    }
    let state: DeviceTensor = await up(x.h0 as Float, [s.B, s.HV, s.K, s.V]);
    const outs: DeviceTensor[] = [];
    const before = gpuSyncs();
    try {
      for (const token of steps) {
        const step = await kdaStep(state, token, { ...options, arm: "gpu" });
        assert.ok(step.o instanceof DeviceTensor && step.state instanceof DeviceTensor);
        outs.push(step.o);
        if (!uploads.includes(state)) state.release();
        state = step.state;
      }
      assert.equal(gpuSyncs() - before, 0, "the decode loop synced with the host");
      const last = await state.read();
      assert.equal(gpuSyncs() - before, 1, "reading the state is one sync");
      assert.deepEqual(
        Array.from(last),
        Array.from(hostState),
        "device state differs from the typed-array calls",
      );
      for (const [i, o] of outs.entries()) {
        assert.deepEqual(
          Array.from(await o.read()),
          Array.from(hostOuts[i]),
          `output of call ${i}`,
        );
      }
    } finally {
      releaseTensors(outs, uploads);
      if (!uploads.includes(state)) state.release();
    }
  },
);

Deno.test("kdaStep() refuses bad token counts and mixed kinds with named errors", async () => {
  const s = { B: 2, T: 4, H: 1, HV: 1, K: 4, V: 3 };
  const x = sequence(s, 1, "f64");
  const t = tokens(x, 0, 4);
  const state = x.h0 as Float;
  const bad = async (run: () => Promise<unknown>, cls: ErrorConstructor, re: RegExp) => {
    await assert.rejects(
      run,
      (e: unknown) => e instanceof cls && re.test((e as Error).message),
      `${re}`,
    );
  };
  for (const T of [0, 1.5, -1]) {
    await bad(
      () => kdaStep(state, { ...t, T }),
      RangeError,
      /^token\.T must be a positive integer/,
    );
  }
  await bad(
    () => kdaStep(state, { ...t, T: 3 }),
    RangeError,
    /^token\.q must have 24 elements \[B, T, H, K\]: got 32$/,
  );
  const { T: _, ...one } = t;
  await bad(
    () => kdaStep(state, one as KdaStepToken),
    RangeError,
    /^token\.q must have 8 elements \[B, H, K\]: got 32$/,
  );
  await bad(
    () => kdaStep(state, { ...t, beta: t.beta.map(() => 1.5) }),
    RangeError,
    /^token\.beta must be in \[0, 1\]/,
  );
  await bad(
    () => kdaStep(state, t, { outputFinalState: false } as never),
    TypeError,
    /^options\.outputFinalState is not a known field/,
  );
});

gpuTest(
  "kdaStep() refuses a host state with GpuTensor tokens, and a released state, by name",
  async () => {
    const s = { B: 1, T: 2, H: 1, HV: 1, K: 4, V: 4 };
    const x = sequence(s, 3, "f32");
    const t = tokens(x, 0, 2);
    const { aLog: _a, dtBias: _d, ...plain } = t;
    const d = {
      ...plain,
      q: await toGpu(t.q as Float32Array, [1, 2, 1, 4]),
      k: await toGpu(t.k as Float32Array, [1, 2, 1, 4]),
      v: await toGpu(t.v as Float32Array, [1, 2, 1, 4]),
      g: await toGpu(t.g as Float32Array, [1, 2, 1, 4]),
      beta: await toGpu(t.beta as Float32Array, [1, 2, 1]),
    };
    const state = await toGpu(x.h0 as Float32Array, [1, 1, 4, 4]);
    try {
      await assert.rejects(
        () => kdaStep(x.h0 as Float32Array as never, d),
        /^TypeError: state must be a GpuTensor like the token's arrays: got Float32Array$/,
      );
      state.release();
      await assert.rejects(
        () => kdaStep(state, d),
        /^RangeError: state must be a live tensor: got a released DeviceTensor$/,
      );
    } finally {
      releaseTensors(d);
    }
  },
);

/** Decodes a layer's input in calls of the given token counts and checks them against forward(). */
async function layerStepsEqualForward(arm: Arm, f32: boolean, tol: number) {
  const config = { dModel: 16, heads: 2, keyDim: 4, valueDim: 4, decayRank: 3, shortConv: true };
  const layer = new KdaModule(config, { dtype: f32 ? "f32" : "f64" });
  const [B, T, D] = [2, 11, config.dModel];
  const make = (n: number) => Float64Array.from({ length: n }, (_, i) => Math.sin(0.37 * i + 0.1));
  const x = f32 ? Float32Array.from(make(B * T * D)) : make(B * T * D);
  const whole = await layer.forward(x, [B, T], { arm, strict: true });
  const worst = new Worst();
  let state: KdaModuleState | undefined;
  let t0 = 0;
  for (const n of [1, 3, 7]) {
    resetSeamCounts();
    const out = await layer.step(outRows(x, B, T, D, t0, t0 + n), state, {
      arm,
      strict: true,
      ...(n === 1 ? {} : { tokens: n }),
    });
    assert.equal(out.y.length, B * n * D);
    if (arm === "gpu") {
      assert.equal(seamCounts().variants["gpu:recurrent"], 1, "the decode set ran");
    }
    worst.check(
      `layer ${arm} tokens ${t0}..${t0 + n}`,
      out.y,
      outRows(whole, B, T, D, t0, t0 + n),
      tol,
    );
    state = out.state;
    t0 += n;
  }
  worst.report(`KdaModule.step with tokens on the ${arm} arm`);
}

Deno.test("KdaModule.step() with options.tokens decodes T tokens per call exactly as forward() over the whole input (cpu, ops)", async () => {
  await layerStepsEqualForward("cpu", false, 1e-12);
  await layerStepsEqualForward("ops", false, 1e-12);
  const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
  await assert.rejects(
    () => layer.step(new Float64Array(8 * 5), undefined, { tokens: 3 }),
    /^RangeError: x must be a Float64Array of B·3·8 elements \[B, T, D\]: got Float64Array of 40$/,
  );
  await assert.rejects(
    () => layer.step(Array.from(new Float64Array(8)) as never),
    /^TypeError: x must be a Float64Array of B·8 elements \[B, D\]: got Array of 8$/,
  );
  await assert.rejects(
    () => layer.step(new Float32Array(8) as never),
    /^TypeError: x must be a Float64Array of B·8 elements \[B, D\]: got Float32Array of 8$/,
  );
  await assert.rejects(
    () => layer.step(new Float64Array(8), undefined, { tokens: 0 }),
    /^RangeError: options\.tokens must be a positive integer/,
  );
});

gpuTest(
  "KdaModule.step() with options.tokens on the gpu arm runs the decode set and matches forward() to f32 accuracy",
  async () => {
    await layerStepsEqualForward("gpu", true, F32.outputs);
  },
);
