// deno task bench: the KDA op's forward + backward on each arm, side by side, and the cpu arm's
// scaling in T. Inputs are drawn once per shape, outside the timed region.

import { type KdaInputs, KdaModule, kdaVjp } from "../mod.ts";
import { mulberry32, normal } from "../kda/layer/_random.ts";
import { gpuStatus } from "../kda/gpu/mod.ts";
import { kdaStep, type KdaStepToken } from "../kda/op/step.ts";
import { releaseTensors, toGpu } from "../kda/gpu/tensor.ts";

function inputs(B: number, T: number, H: number, K: number, V: number, f32 = false): KdaInputs {
  const gauss = normal(mulberry32(1234));
  const uni = mulberry32(99);
  const make = (n: number, f: () => number) => {
    const a = f32 ? new Float32Array(n) : new Float64Array(n);
    for (let i = 0; i < n; i++) a[i] = f();
    return a;
  };
  const k = make(B * T * H * K, gauss);
  for (let r = 0; r < B * T * H; r++) {
    let s = 0;
    for (let d = 0; d < K; d++) s += k[r * K + d] ** 2;
    for (let d = 0; d < K; d++) k[r * K + d] /= Math.sqrt(s);
  }
  return {
    B,
    T,
    H,
    K,
    V,
    q: make(B * T * H * K, gauss),
    k,
    v: make(B * T * H * V, gauss),
    g: make(B * T * H * K, () => Math.log(0.9) * uni()),
    beta: make(B * T * H, uni),
  };
}

const dout = (x: KdaInputs) => {
  const n = x.B * x.T * x.H * x.V;
  const a = x.q instanceof Float32Array ? new Float32Array(n) : new Float64Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.sin(i);
  return a;
};

const trainer = inputs(2, 256, 2, 32, 32);
const trainerDout = dout(trainer);
const gpu = await gpuStatus();

Deno.bench({
  name: "ops arm (tape recurrence), f64",
  group: "kdaVjp at the trainer shape B=2 T=256 H=2 K=V=32 chunk 16",
  baseline: true,
  async fn() {
    await kdaVjp(trainer, { dout: trainerDout }, { arm: "ops" });
  },
});
Deno.bench({
  name: "cpu arm (chunked, hand-written backward), f64",
  group: "kdaVjp at the trainer shape B=2 T=256 H=2 K=V=32 chunk 16",
  async fn() {
    await kdaVjp(trainer, { dout: trainerDout }, { arm: "cpu", chunkSize: 16 });
  },
});
const trainer32 = inputs(2, 256, 2, 32, 32, true);
const trainer32Dout = dout(trainer32);
Deno.bench({
  name: "gpu arm (WGSL), f32",
  group: "kdaVjp at the trainer shape B=2 T=256 H=2 K=V=32 chunk 16",
  ignore: !gpu.available,
  async fn() {
    await kdaVjp(trainer32, { dout: trainer32Dout }, { arm: "gpu", chunkSize: 16, strict: true });
  },
});

for (const T of [256, 1024, 4096]) {
  const x = inputs(2, T, 2, 32, 32);
  const d = dout(x);
  Deno.bench({
    name: `cpu arm T=${T}`,
    group: "cpu arm kdaVjp scaling in T (B=2 H=2 K=V=32 chunk 16)",
    baseline: T === 256,
    async fn() {
      await kdaVjp(x, { dout: d }, { arm: "cpu", chunkSize: 16 });
    },
  });
}

const layer = new KdaModule();
const layerX = Float64Array.from({ length: 2 * 256 * 64 }, (_, i) => Math.sin(0.37 * i));
const layerDy = Float64Array.from({ length: 2 * 256 * 64 }, (_, i) => Math.cos(0.11 * i));
for (const arm of ["ops", "cpu"] as const) {
  Deno.bench({
    name: `KdaModule.vjp on the ${arm} arm, f64`,
    group: "KdaModule.vjp at the trainer shape [2, 256, 64]",
    baseline: arm === "ops",
    async fn() {
      await layer.vjp(layerX, [2, 256], layerDy, { arm });
    },
  });
}

// Decode: one kdaStep call is one token for each of the B = 2 sequences, so the time per
// iteration is the time per token. The gpu arm runs its decode kernel set (recurrent) and, from
// typed arrays, uploads the state and reads it back every call.
function stepArgs(f32: boolean) {
  const [B, H, K, V] = [2, 2, 32, 32];
  const x = inputs(B, 1, H, K, V, f32);
  const state = f32 ? new Float32Array(B * H * K * V) : new Float64Array(B * H * K * V);
  for (let i = 0; i < state.length; i++) state[i] = 0.1 * Math.sin(i);
  const { q, k, v, g, beta } = x;
  return { state, token: { B, H, K, V, q, k, v, g, beta } };
}
const decode64 = stepArgs(false), decode32 = stepArgs(true);
const decodeGroup = "kdaStep: ms per token (B=2 sequences, H=2, K=V=32)";
Deno.bench({
  name: "decode step, ops arm, f64",
  group: decodeGroup,
  baseline: true,
  async fn() {
    await kdaStep(decode64.state, decode64.token, { arm: "ops" });
  },
});
Deno.bench({
  name: "decode step, cpu arm, f64",
  group: decodeGroup,
  async fn() {
    await kdaStep(decode64.state, decode64.token, { arm: "cpu" });
  },
});
Deno.bench({
  name: "decode step, cpu arm, f32",
  group: decodeGroup,
  async fn() {
    await kdaStep(decode32.state, decode32.token, { arm: "cpu" });
  },
});
Deno.bench({
  name: "decode step, gpu arm, f32",
  group: decodeGroup,
  ignore: !gpu.available,
  async fn() {
    await kdaStep(decode32.state, decode32.token, { arm: "gpu", strict: true });
  },
});

// Decode at the shape of the issue (H = 16, K = V = 128), f32. Tokens per second are
// B · T · calls / (seconds per iteration): each iteration's name says how many tokens it decodes.
// On GpuTensors an iteration is a loop of DEVICE_CALLS calls chaining the state on the device and
// one read at its end (the one host sync a decode loop pays); bench/decode.ts writes the tokens
// per second of the same shapes into bench/results/ (deno task bench:decode).
const DEVICE_CALLS = 8;
for (const B of [1, 32]) {
  const [H, K, V] = [16, 128, 128];
  const x = inputs(B, 1, H, K, V, true);
  const state = new Float32Array(B * H * K * V).map((_, i) => 0.01 * Math.sin(i));
  const token = { B, H, K, V, q: x.q, k: x.k, v: x.v, g: x.g, beta: x.beta } as const;
  const group = `kdaStep decode, B=${B}, H=16, K=V=128, f32`;
  Deno.bench({
    name: `cpu arm: ${B} token${B === 1 ? "" : "s"} per iteration (1 per sequence)`,
    group,
    baseline: true,
    n: B === 1 ? 20 : 3,
    warmup: 1,
    async fn() {
      await kdaStep(state, token as KdaStepToken<Float32Array>, { arm: "cpu" });
    },
  });
  Deno.bench({
    name: `gpu arm, typed arrays: ${B} token${B === 1 ? "" : "s"} per iteration (1 call)`,
    group,
    ignore: !gpu.available,
    n: 5,
    warmup: 1,
    async fn() {
      await kdaStep(state, token as KdaStepToken<Float32Array>, { arm: "gpu", strict: true });
    },
  });
  Deno.bench({
    name: `gpu arm, GpuTensors: ${DEVICE_CALLS * B} tokens per iteration (${DEVICE_CALLS} calls)`,
    group,
    ignore: !gpu.available,
    n: 3,
    warmup: 1,
    async fn(b) {
      const up = (a: Float32Array, shape: number[]) => toGpu(a, shape);
      const onDevice = {
        B,
        H,
        K,
        V,
        q: await up(x.q as Float32Array, [B, H, K]),
        k: await up(x.k as Float32Array, [B, H, K]),
        v: await up(x.v as Float32Array, [B, H, V]),
        g: await up(x.g as Float32Array, [B, H, K]),
        beta: await up(x.beta as Float32Array, [B, H]),
      };
      const start = await up(state, [B, H, K, V]);
      b.start();
      let s = start;
      const outs = [];
      for (let c = 0; c < DEVICE_CALLS; c++) {
        const step = await kdaStep(s, onDevice, { arm: "gpu", strict: true });
        outs.push(step.o);
        if (s !== start) s.release();
        s = step.state;
      }
      await s.read();
      b.end();
      releaseTensors(outs, s, start, onDevice);
    },
  });
}
