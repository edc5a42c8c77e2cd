// The op's in-kernel options (docs/kda.md 2.8): useQkL2NormInKernel, useGateInKernel (softplus
// and lower-bound forms, with and without aLog and dtBias), useBetaSigmoidInKernel with and without
// allowNegEigval, and outputFinalState: false. Every arm agrees with an f64 reference written here
// loop by loop (forward), the ops arm's gradients with central differences of that reference, the
// cpu arm's with the ops arm's to 1e-10 in f64, and the gpu arm's with the f64 ones to the f32 bars;
// with grouped value heads, packed batches, h0 and dht. Bad values get named errors.

import assert from "node:assert/strict";
import {
  DTYPES,
  kda,
  type KdaInputs,
  type KdaOptions,
  kdaVjp,
  releaseTensors,
  resetSeamCounts,
  seamCounts,
  toGpu,
  toGpuInputs,
} from "../mod.ts";
import type { Arm, Float } from "../kda/_types.ts";
import { gpuSyncs } from "../kda/gpu/tensor.ts";
import { kernelSet, kernelSetNames } from "../kda/gpu/mod.ts";
import { DeviceTensor } from "../kda/gpu/tensor.ts";
import { bitsEqual, mulberry32, normal, Worst } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu, withNaNPrefill } from "./_gpu.ts";

reportMissingGpu("op_options_test");

const F32 = DTYPES.f32.bars!;
/** The gpu arm's kernel sets that have a backward (the decode set has none). */
const GPU_SETS = kernelSetNames().filter((n) => kernelSet(n).backward !== null);

// ---- the reference: docs/kda.md 2.8, then 2.1, loop by loop in f64 ----

interface Case {
  name: string;
  B: number;
  T: number;
  H: number;
  HV: number;
  K: number;
  V: number;
  cu?: number[];
  h0: boolean;
  dht: boolean;
  options: KdaOptions;
  aLog: boolean;
  dtBias: boolean;
}

type Arrays = Record<"q" | "k" | "v" | "g" | "beta", Float64Array> & {
  h0?: Float64Array;
  aLog?: Float64Array;
  dtBias?: Float64Array;
};

const sig = (x: number) => 1 / (1 + Math.exp(-x));
const softplusRef = (x: number) => Math.max(x, 0) + Math.log1p(Math.exp(-Math.abs(x)));

/** o and ht of the options and the recurrence, written out in loops. */
function reference(c: Case, x: Arrays): { o: Float64Array; ht: Float64Array } {
  const { T, H, HV, K, V } = c;
  const o = opts(c);
  const G = HV / H;
  const seqs = c.cu === undefined
    ? Array.from({ length: c.B }, (_, b) => [b * T, (b + 1) * T])
    : c.cu.slice(0, -1).map((s, i) => [s, c.cu![i + 1]]);
  const out = new Float64Array(c.B * T * HV * V), ht = new Float64Array(seqs.length * HV * K * V);
  const scale = 1 / Math.sqrt(K);
  const unit = (a: Float64Array, at: number) => {
    const r = a.slice(at, at + K);
    if (!o.useQkL2NormInKernel) return r;
    let ss = 0;
    for (const e of r) ss += e * e;
    return r.map((e) => e / Math.sqrt(ss + 1e-6));
  };
  for (let s = 0; s < seqs.length; s++) {
    for (let hv = 0; hv < HV; hv++) {
      const h = Math.floor(hv / G);
      const S = new Float64Array(K * V);
      if (x.h0) S.set(x.h0.subarray((s * HV + hv) * K * V, (s * HV + hv + 1) * K * V));
      for (let t = seqs[s][0]; t < seqs[s][1]; t++) {
        // rows of the packed or batched token axis: [B·T] flattened
        const q = unit(x.q, (t * H + h) * K), k = unit(x.k, (t * H + h) * K);
        const gate = new Float64Array(K);
        for (let d = 0; d < K; d++) {
          let z = x.g[(t * HV + hv) * K + d];
          if (!o.useGateInKernel) {
            gate[d] = z;
            continue;
          }
          if (x.dtBias) z += x.dtBias[hv * K + d];
          const a = x.aLog ? Math.exp(x.aLog[hv]) : 1;
          gate[d] = o.lowerBound === undefined ? -a * softplusRef(z) : o.lowerBound * sig(a * z);
        }
        let beta = x.beta[t * HV + hv];
        if (o.useBetaSigmoidInKernel) beta = (o.allowNegEigval ? 2 : 1) * sig(beta);
        for (let d = 0; d < K; d++) {
          for (let j = 0; j < V; j++) S[d * V + j] *= Math.exp(gate[d]);
        }
        for (let j = 0; j < V; j++) {
          let pred = 0;
          for (let d = 0; d < K; d++) pred += S[d * V + j] * k[d];
          const u = beta * (x.v[(t * HV + hv) * V + j] - pred);
          for (let d = 0; d < K; d++) S[d * V + j] += k[d] * u;
        }
        for (let j = 0; j < V; j++) {
          let acc = 0;
          for (let d = 0; d < K; d++) acc += S[d * V + j] * q[d] * scale;
          out[(t * HV + hv) * V + j] = acc;
        }
      }
      ht.set(S, (s * HV + hv) * K * V);
    }
  }
  return { o: out, ht };
}

function opts(c: Case): KdaOptions {
  return c.options;
}

/** Seeded inputs of a case: raw gates of either sign with the gate in the kernel, logits too. */
function draw(c: Case, seed: number): { x: Arrays; dout: Float64Array; dht?: Float64Array } {
  const rand = mulberry32(seed), gauss = normal(rand);
  const { B, T, H, HV, K, V } = c;
  const N = c.cu === undefined ? B : c.cu.length - 1;
  const make = (n: number, f: () => number) => Float64Array.from({ length: n }, f);
  const o = opts(c);
  const x: Arrays = {
    q: make(B * T * H * K, gauss),
    k: make(B * T * H * K, () => gauss() / Math.sqrt(o.useQkL2NormInKernel ? 1 : K)),
    v: make(B * T * HV * V, gauss),
    g: make(B * T * HV * K, o.useGateInKernel ? () => 2 * gauss() : () => -0.1 - 1.9 * rand()),
    beta: make(
      B * T * HV,
      o.useBetaSigmoidInKernel
        ? () => 2 * gauss()
        : () => 0.1 + (o.allowNegEigval ? 1.8 : 0.8) * rand(),
    ),
  };
  if (c.h0) x.h0 = make(N * HV * K * V, () => 0.3 * gauss());
  if (c.aLog) x.aLog = make(HV, () => gauss() * 0.5);
  if (c.dtBias) x.dtBias = make(HV * K, () => gauss());
  const dout = make(B * T * HV * V, gauss);
  return c.dht ? { x, dout, dht: make(N * HV * K * V, gauss) } : { x, dout };
}

function inputsOf<F extends Float>(c: Case, x: Arrays, cast: (a: Float64Array) => F): KdaInputs<F> {
  const { B, T, H, HV, K, V } = c;
  return {
    B,
    T,
    H,
    K,
    V,
    ...(HV !== H ? { HV } : {}),
    ...(c.cu !== undefined ? { cuSeqlens: new Int32Array(c.cu) } : {}),
    q: cast(x.q),
    k: cast(x.k),
    v: cast(x.v),
    g: cast(x.g),
    beta: cast(x.beta),
    ...(x.h0 ? { h0: cast(x.h0) } : {}),
    ...(x.aLog ? { aLog: cast(x.aLog) } : {}),
    ...(x.dtBias ? { dtBias: cast(x.dtBias) } : {}),
  };
}

const ALL: KdaOptions = {
  useQkL2NormInKernel: true,
  useGateInKernel: true,
  useBetaSigmoidInKernel: true,
  allowNegEigval: true,
};

const CASES: Case[] = [
  {
    name: "all options, softplus gate with aLog and dtBias, beta 2·sigmoid",
    B: 2,
    T: 19,
    H: 2,
    HV: 2,
    K: 6,
    V: 5,
    h0: true,
    dht: true,
    options: ALL,
    aLog: true,
    dtBias: true,
  },
  {
    name: "HV = 2H, lowerBound gate with aLog and dtBias, beta sigmoid",
    B: 2,
    T: 21,
    H: 1,
    HV: 2,
    K: 5,
    V: 4,
    h0: true,
    dht: true,
    options: {
      useQkL2NormInKernel: true,
      useGateInKernel: true,
      lowerBound: -5,
      useBetaSigmoidInKernel: true,
    },
    aLog: true,
    dtBias: true,
  },
  {
    name: "packed, lowerBound gate without aLog",
    B: 1,
    T: 30,
    H: 1,
    HV: 2,
    K: 4,
    V: 3,
    cu: [0, 5, 19, 30],
    h0: true,
    dht: true,
    options: { useGateInKernel: true, lowerBound: -3 },
    aLog: false,
    dtBias: true,
  },
  {
    name: "softplus gate without dtBias",
    B: 1,
    T: 17,
    H: 2,
    HV: 2,
    K: 4,
    V: 4,
    h0: false,
    dht: true,
    options: { useGateInKernel: true },
    aLog: true,
    dtBias: false,
  },
  {
    name: "l2norm only, outputFinalState false",
    B: 2,
    T: 18,
    H: 2,
    HV: 4,
    K: 7,
    V: 3,
    h0: true,
    dht: false,
    options: { useQkL2NormInKernel: true, outputFinalState: false },
    aLog: false,
    dtBias: false,
  },
  {
    name: "allowNegEigval without the sigmoid: beta in [0, 2]",
    B: 1,
    T: 20,
    H: 1,
    HV: 1,
    K: 4,
    V: 4,
    cu: [0, 9, 20],
    h0: false,
    dht: true,
    options: { allowNegEigval: true },
    aLog: false,
    dtBias: false,
  },
];

/** L = Σ o·dout + Σ ht·dht of the reference. */
function loss(c: Case, x: Arrays, dout: Float64Array, dht?: Float64Array): number {
  const { o, ht } = reference(c, x);
  let L = 0;
  for (let i = 0; i < o.length; i++) L += o[i] * dout[i];
  if (dht) { for (let i = 0; i < ht.length; i++) L += ht[i] * dht[i]; }
  return L;
}

const GRAD_OF = {
  q: "dq",
  k: "dk",
  v: "dv",
  g: "dg",
  beta: "dbeta",
  h0: "dh0",
  aLog: "daLog",
  dtBias: "ddtBias",
} as const;

for (const c of CASES) {
  Deno.test(`in-kernel options (${c.name}): ops and cpu agree with the loop reference, the ops gradients with its central differences, cpu with ops to 1e-10`, async () => {
    const { x, dout, dht } = draw(c, 7 + c.T);
    const ref = reference(c, x);
    const same = (a: Float64Array) => a;
    const inputs = inputsOf(c, x, same);
    const cot = { dout, ...(dht ? { dht } : {}) };
    const worst = new Worst();
    const grads: Record<string, Record<string, Float>> = {};
    for (const arm of ["ops", "cpu"] as Arm[]) {
      const options = { ...c.options, arm, strict: true };
      const out = await kda(inputs, options);
      worst.check(`${arm} o`, out.o, ref.o, 1e-12);
      if (c.options.outputFinalState === false) {
        assert.equal((out as { ht?: unknown }).ht, undefined, `${arm}: no ht`);
      } else {
        worst.check(`${arm} ht`, (out as { ht: Float }).ht, ref.ht, 1e-12);
      }
      resetSeamCounts();
      grads[arm] = await kdaVjp(inputs, cot, options) as unknown as Record<string, Float>;
      const counts = seamCounts();
      // the options are tape ops or host loops around the core: the seam sees one node
      assert.deepEqual(
        [counts.asked, counts.fusedFwd, counts.fusedBwd, counts.opsPath, counts.declined],
        arm === "cpu" ? [1, 1, 1, 0, 0] : [1, 0, 0, 1, 0],
        `${arm}: the seam's counters`,
      );
      assert.equal("daLog" in grads[arm], c.aLog, `${arm}: daLog iff aLog`);
      assert.equal("ddtBias" in grads[arm], c.dtBias, `${arm}: ddtBias iff dtBias`);
    }
    for (const [input, grad] of Object.entries(GRAD_OF)) {
      const got = grads.ops[grad];
      if ((x as Record<string, Float64Array | undefined>)[input] === undefined) continue;
      worst.check(`cpu ${grad} vs ops`, grads.cpu[grad], got, 1e-10);
      // a directional central difference of the reference along a seeded direction of the input
      const base = (x as Record<string, Float64Array>)[input];
      const rand = mulberry32(input.length * 31 + c.T);
      const u = Float64Array.from(base, () => 2 * rand() - 1);
      let dot = 0, scaleOf = 0;
      for (let i = 0; i < u.length; i++) {
        dot += got[i] * u[i];
        scaleOf += Math.abs(got[i] * u[i]);
      }
      const at = (h: number) =>
        loss(c, { ...x, [input]: base.map((e, i) => e + h * u[i]) }, dout, dht);
      const h = 1e-5;
      const fd = (at(h) - at(-h)) / (2 * h);
      const rel = Math.abs(fd - dot) / scaleOf;
      if (!(rel <= 1e-7)) {
        throw new Error(
          `${c.name}: ops ${grad} disagrees with the reference's central difference: ` +
            `<grad, u> = ${dot}, fd = ${fd}, |diff| / Σ|grad·u| = ${rel}`,
        );
      }
    }
    worst.report(`${c.name}, ops and cpu`);
  });

  for (const kernels of GPU_SETS) {
    gpuTest(
      `in-kernel options (${c.name}): the gpu arm (kernels ${kernels}) agrees with the f64 reference and gradients to the f32 bars, with no host round trip`,
      async () => {
        const { x: x64, dout: dout64, dht: dht64 } = draw(c, 7 + c.T);
        // same bytes: the f64 side runs on the f32-rounded values
        const r32 = (a: Float64Array) => Float32Array.from(a);
        const x: Arrays = Object.fromEntries(
          Object.entries(x64).map(([k, a]) => [k, Float64Array.from(r32(a))]),
        ) as Arrays;
        const dout = Float64Array.from(r32(dout64));
        const dht = dht64 === undefined ? undefined : Float64Array.from(r32(dht64));
        const ref = reference(c, x);
        const inputs32 = inputsOf(c, x, r32);
        const cot32 = { dout: r32(dout), ...(dht ? { dht: r32(dht) } : {}) };
        const options = { ...c.options, arm: "gpu" as const, strict: true, kernels };
        const worst = new Worst();
        const out = await kda(inputs32, options);
        worst.check("gpu o", out.o, ref.o, F32.outputs);
        if (c.options.outputFinalState !== false) {
          worst.check("gpu ht", (out as { ht: Float }).ht, ref.ht, F32.outputs);
        } else {
          assert.equal((out as { ht?: unknown }).ht, undefined, "gpu: no ht");
        }
        // every buffer prefilled with NaN: an element a pass forgot to write cannot pass as 0
        const grads = await withNaNPrefill(() =>
          kdaVjp(inputs32, cot32, options)
        ) as unknown as Record<
          string,
          Float
        >;
        const exact = await kdaVjp(
          inputsOf(c, x, (a) => a),
          { dout, ...(dht ? { dht } : {}) },
          { ...c.options, arm: "cpu" },
        ) as unknown as Record<string, Float>;
        for (const [input, grad] of Object.entries(GRAD_OF)) {
          if ((x as Record<string, Float64Array | undefined>)[input] === undefined) continue;
          worst.check(`gpu ${grad}`, grads[grad], exact[grad], F32.gradients);
        }
        // The same call again gives the same bits (fixed-order reductions, daLog and ddtBias too).
        const again = await kdaVjp(inputs32, cot32, options) as unknown as Record<string, Float>;
        for (const name of Object.keys(grads)) {
          assert.ok(bitsEqual(again[name], grads[name]), `gpu ${name} differs on a rerun`);
        }
        // On GpuTensors: the same bits, DeviceTensors back, no host sync until read.
        const device = await toGpuInputs(inputs32, c.options);
        const doutOnDevice = await toGpu(cot32.dout, [c.B, c.T, c.HV, c.V]);
        const N = c.cu === undefined ? c.B : c.cu.length - 1;
        const dhtOnDevice = cot32.dht === undefined
          ? undefined
          : await toGpu(cot32.dht, [N, c.HV, c.K, c.V]);
        const before = gpuSyncs();
        const dOut = await kda(device, options);
        const dGrads = await kdaVjp(
          device,
          { dout: doutOnDevice, ...(dhtOnDevice ? { dht: dhtOnDevice } : {}) },
          options,
        ) as unknown as Record<string, DeviceTensor>;
        try {
          assert.equal(gpuSyncs() - before, 0, "a call on GpuTensors with options synced");
          assert.ok(dOut.o instanceof DeviceTensor);
          assert.ok(bitsEqual(await dOut.o.read(), out.o), "device o differs");
          if (c.options.outputFinalState === false) {
            assert.equal((dOut as { ht?: unknown }).ht, undefined, "device: no ht");
          }
          assert.deepEqual(Object.keys(dGrads).sort(), Object.keys(grads).sort());
          for (const name of Object.keys(grads)) {
            assert.ok(bitsEqual(await dGrads[name].read(), grads[name]), `device ${name} differs`);
          }
        } finally {
          releaseTensors(dOut, dGrads, device, doutOnDevice, dhtOnDevice);
        }
        worst.report(`${c.name}, gpu, kernels ${kernels}`);
      },
    );
  }
}

Deno.test("in-kernel options: bad values and combinations get named errors", async () => {
  const c = CASES[0];
  const { x, dout } = draw(c, 3);
  const base = inputsOf(c, x, (a) => a);
  const plain: KdaInputs = { ...base, aLog: undefined, dtBias: undefined };
  delete plain.aLog;
  delete plain.dtBias;
  const betaOk = { ...plain, beta: plain.beta.map(() => 0.5), g: plain.g.map(() => -0.5) };
  const bad = async (
    run: () => Promise<unknown>,
    cls: ErrorConstructor,
    re: RegExp,
  ) => {
    await assert.rejects(
      run,
      (e: unknown) => e instanceof cls && re.test((e as Error).message),
      `${re}`,
    );
  };
  const cpu = { arm: "cpu" } as const;
  const at = (a: Float, i: number, v: number) => {
    const b = a.slice();
    b[i] = v;
    return b;
  };
  // beta's range without the sigmoid, with and without allowNegEigval
  await bad(
    () => kda({ ...betaOk, beta: at(betaOk.beta, 3, 1.5) }, cpu),
    RangeError,
    /^inputs\.beta must be in \[0, 1\] \(a write strength; \[0, 2\] with options\.allowNegEigval; set options\.useBetaSigmoidInKernel for raw logits\): got 1\.5 at index 3$/,
  );
  await bad(
    () => kda({ ...betaOk, beta: at(betaOk.beta, 0, -0.25) }, cpu),
    RangeError,
    /^inputs\.beta must be in \[0, 1\] .*: got -0\.25 at index 0$/,
  );
  await bad(
    () => kda({ ...betaOk, beta: at(betaOk.beta, 2, 2.5) }, { ...cpu, allowNegEigval: true }),
    RangeError,
    /^inputs\.beta must be in \[0, 2\] \(a write strength; set options\.useBetaSigmoidInKernel for raw logits\): got 2\.5 at index 2$/,
  );
  await bad(
    () => kdaVjp({ ...betaOk, beta: at(betaOk.beta, 1, 1.01) }, { dout }, cpu),
    RangeError,
    /^inputs\.beta must be in \[0, 1\]/,
  );
  // logits of any sign with the sigmoid; 0 and 1 are in range without it
  await kda({ ...betaOk, beta: betaOk.beta.map((_, i) => i % 2) }, cpu);
  await kda({ ...betaOk, beta: at(betaOk.beta, 0, 7) }, { ...cpu, useBetaSigmoidInKernel: true });
  // the gate's arrays and options
  await bad(
    () => kda({ ...betaOk, aLog: x.aLog }, cpu),
    TypeError,
    /^inputs\.aLog must be absent without options\.useGateInKernel \(the gate is then g itself\): got Float64Array$/,
  );
  await bad(
    () => kda({ ...betaOk, dtBias: x.dtBias }, cpu),
    TypeError,
    /^inputs\.dtBias must be absent without options\.useGateInKernel/,
  );
  await bad(
    () => kda(betaOk, { ...cpu, useGateInKernel: true }),
    TypeError,
    /^inputs\.aLog must be given with options\.useGateInKernel unless options\.lowerBound is set \(the gate is −exp\(aLog\)·softplus\(g \+ dtBias\)\): got undefined$/,
  );
  await bad(
    () => kda(betaOk, { ...cpu, lowerBound: -5 }),
    TypeError,
    /^options\.lowerBound must be absent without options\.useGateInKernel \(it selects the in-kernel gate's form\): got -5$/,
  );
  for (const lb of [0, 2, NaN, -Infinity]) {
    await bad(
      () => kda(betaOk, { ...cpu, useGateInKernel: true, lowerBound: lb }),
      RangeError,
      new RegExp(
        `^options\\.lowerBound must be a finite negative number \\(a log decay\\): got ${lb}$`,
      ),
    );
  }
  await bad(
    () => kda(betaOk, { ...cpu, useGateInKernel: true, lowerBound: "-5" as unknown as number }),
    RangeError,
    /^options\.lowerBound must be a finite negative number \(a log decay\): got string$/,
  );
  await bad(
    () => kda({ ...betaOk, aLog: at(x.aLog!, 1, 800) }, { ...cpu, useGateInKernel: true }),
    RangeError,
    /^inputs\.aLog must be at most 709\.78 \(its exp must be finite in f64\): got 800 at index 1$/,
  );
  await bad(
    () =>
      kda({ ...betaOk, aLog: Float32Array.from(x.aLog!, (v, i) => i === 0 ? 90 : v) } as never, {
        ...cpu,
        useGateInKernel: true,
      }),
    TypeError,
    /^inputs\.aLog must be a Float64Array like the other arrays: got Float32Array$/,
  );
  await bad(
    () => kda({ ...betaOk, aLog: new Float64Array(3) }, { ...cpu, useGateInKernel: true }),
    RangeError,
    /^inputs\.aLog must have 2 elements \[H\]: got 3$/,
  );
  await bad(
    () =>
      kda({ ...betaOk, dtBias: at(x.dtBias!, 4, NaN), aLog: x.aLog }, {
        ...cpu,
        useGateInKernel: true,
      }),
    RangeError,
    /^inputs\.dtBias must be finite: got NaN at index 4$/,
  );
  // a raw gate may be positive only with the gate in the kernel
  const positive = { ...betaOk, g: at(betaOk.g, 5, 0.25) };
  await bad(
    () => kda(positive, cpu),
    RangeError,
    /^inputs\.g must be <= 0 \(a log decay\): got 0\.25 at index 5$/,
  );
  await kda({ ...positive, aLog: x.aLog }, { ...cpu, useGateInKernel: true });
  // option types
  for (
    const key of [
      "useQkL2NormInKernel",
      "useGateInKernel",
      "useBetaSigmoidInKernel",
      "allowNegEigval",
      "outputFinalState",
    ]
  ) {
    await bad(
      () => kda(betaOk, { ...cpu, [key]: "yes" }),
      TypeError,
      new RegExp(`^options\\.${key} must be a boolean: got string$`),
    );
  }
  // no ht, so no cotangent of it
  await bad(
    () =>
      kdaVjp(betaOk, { dout, dht: new Float64Array(2 * 2 * 6 * 5) }, {
        ...cpu,
        outputFinalState: false,
      }),
    TypeError,
    /^cotangents\.dht must be absent with options\.outputFinalState false \(the call returns no ht\): got Float64Array$/,
  );
});
