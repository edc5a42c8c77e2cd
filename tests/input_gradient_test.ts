// The layer's input gradient: vjp() and forwardBackward() return dx on every arm, jvp() takes a
// tangent for x, and forwardOnTape() records layers on one tape, so a model of an embedding and
// two stacked layers gets every gradient (the embedding's too) from one backward, equal on the
// cpu arm to the f64 ops arm and on the gpu arm within the f32 bars.

import assert from "node:assert/strict";
import {
  type Arm,
  DTYPES,
  type Float,
  type KdaConfig,
  KdaModule,
  type KimiConfigInput,
} from "../mod.ts";
import { add, constant, matmul, mul, reshape, sum, Tape, Tensor } from "../tape/mod.ts";
import { agreement, bitsEqual, mulberry32, normal } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("input_gradient_test");

const KDA: Partial<KdaConfig> = { dModel: 12, heads: 2, keyDim: 4, valueDim: 3, decayRank: 2 };
const KIMI: KimiConfigInput = {
  form: "kimi",
  dModel: 10,
  heads: 1,
  numVHeads: 2,
  keyDim: 4,
  valueDim: 6,
  convBias: true,
  allowNegEigval: true,
};
const CONFIGS: [string, Partial<KdaConfig> | KimiConfigInput][] = [
  ["KDA", KDA],
  ["KDA with the short conv", { ...KDA, shortConv: true }],
  ["Kimi", KIMI],
  ["Kimi, lowerBound", { ...KIMI, lowerBound: -4, convSize: 3, stateVFirst: false }],
];

function draw(n: number, seed: number, sd = 1): Float64Array {
  const gauss = normal(mulberry32(seed));
  return Float64Array.from({ length: n }, () => sd * gauss());
}

function check(label: string, a: ArrayLike<number>, b: ArrayLike<number>, tol: number): void {
  const { rel, absDiff, refMax } = agreement(a, b);
  if (!(rel <= tol)) {
    throw new Error(`${label}: ${rel} (abs ${absDiff}, ref ${refMax}, tol ${tol})`);
  }
  if (!(refMax > 0)) throw new Error(`${label}: the reference is all zeros`);
}

/** A layer whose parameters are moved off their initial values, so no group sits at 0 or 1. */
function layerOf(config: Partial<KdaConfig> | KimiConfigInput, seed: number): KdaModule {
  const layer = new KdaModule({ ...config, seed } as Partial<KdaConfig>);
  let i = 0;
  for (const [, p] of layer.parameters()) {
    const noise = draw(p.size, seed * 100 + i++, 0.1);
    for (let j = 0; j < p.size; j++) p.data[j] += noise[j];
  }
  return layer;
}

for (const [label, config] of CONFIGS) {
  Deno.test(`vjp() dx (${label}) on the cpu arm equals the f64 ops arm to 1e-10 and central differences of forward() to 1e-6`, async () => {
    const layer = layerOf(config, 3);
    const [B, T, D] = [2, 21, layer.config.dModel];
    const x = draw(B * T * D, 1), dy = draw(B * T * D, 2);
    const ops = await layer.vjp(x, [B, T], dy, { arm: "ops", strict: true });
    const cpu = await layer.vjp(x, [B, T], dy, { arm: "cpu", strict: true });
    check("dx cpu vs ops", cpu.dx, ops.dx, 1e-10);
    for (const [name, g] of cpu.grads) check(`${name} cpu vs ops`, g, ops.grads.get(name)!, 1e-10);
    // L = Σ y·dy; its derivative along x's coordinate i is dx[i]
    const loss = async (xs: Float64Array) => {
      const y = await layer.forward(xs, [B, T], { arm: "ops", strict: true });
      let s = 0;
      for (let i = 0; i < y.length; i++) s += y[i] * dy[i];
      return s;
    };
    let scale = 0;
    for (const v of ops.dx) scale = Math.max(scale, Math.abs(v));
    for (const i of [0, 7 * D + 3, x.length - 1]) {
      const h = 1e-5, xs = x.slice();
      xs[i] = x[i] + h;
      const up = await loss(xs);
      xs[i] = x[i] - h;
      const down = await loss(xs);
      const fd = (up - down) / (2 * h);
      if (!(Math.abs(fd - ops.dx[i]) <= 1e-6 * scale)) {
        throw new Error(`dx[${i}]: fd ${fd} vs ${ops.dx[i]} (scale ${scale})`);
      }
    }
  });
}

Deno.test("jvp() along x gives ⟨dx, u⟩ exactly, and forwardBackward() returns vjp()'s dx bit for bit", async () => {
  for (const [label, config] of CONFIGS) {
    const layer = layerOf(config, 5);
    const [B, T, D] = [1, 17, layer.config.dModel];
    const x = draw(B * T * D, 6), r = draw(B * T * D, 7), u = draw(B * T * D, 8);
    const { dx } = await layer.vjp(x, [B, T], r, { arm: "cpu", strict: true });
    const { dy } = await layer.jvp(x, [B, T], new Map([["x", u]]));
    let jv = 0, vjp = 0, scale = 0;
    for (let i = 0; i < dy.length; i++) jv += dy[i] * r[i];
    for (let i = 0; i < u.length; i++) {
      vjp += dx[i] * u[i];
      scale += Math.abs(dx[i] * u[i]);
    }
    if (!(Math.abs(jv - vjp) <= 1e-12 * scale)) {
      throw new Error(`${label}: ⟨J u, r⟩ ${jv} vs ⟨u, dx⟩ ${vjp} (scale ${scale})`);
    }
    const rt = constant("f64", r, [B, T, D]);
    const fb = await layer.forwardBackward(x, [B, T], (y) => {
      const flat = (t: Tensor) => reshape(t, [t.size]);
      return sum(mul(flat(y), flat(rt)), 0);
    }, { arm: "cpu", strict: true });
    assert.ok(bitsEqual(fb.dx, dx), `${label}: forwardBackward dx`);
  }
});

/** The model of the stacking test: embedding, two layers with residual sums, Σ h·r as the loss. */
interface Stack {
  layers: KdaModule[];
  embedding: Float;
  tokens: Int32Array;
  vocab: number;
  B: number;
  T: number;
  r: Float;
}

/** Every gradient of the stacked model from one backward on one tape. */
async function stackGradients(s: Stack, arm: Arm) {
  const dtype = s.layers[0].dtype, D = s.layers[0].config.dModel;
  const tape = new Tape(dtype);
  try {
    const E = tape.variable(s.embedding, [s.vocab, D]);
    const onehot = new Float64Array(s.B * s.T * s.vocab);
    s.tokens.forEach((t, i) => onehot[i * s.vocab + t] = 1);
    let h = reshape(matmul(constant(dtype, onehot, [s.B * s.T, s.vocab]), E), [s.B, s.T, D]);
    const params: Map<string, Tensor>[] = [];
    for (const layer of s.layers) {
      const out = await layer.forwardOnTape(h, { arm, strict: true, quiet: true });
      params.push(out.parameters);
      h = add(h, out.y);
    }
    const loss = sum(mul(reshape(h, [h.size]), constant(dtype, s.r, [h.size])), 0);
    const grads = await tape.backward(loss);
    return {
      loss: loss.data[0],
      embedding: grads.get(E)!,
      layers: params.map((ps) => new Map([...ps].map(([n, p]) => [n, grads.get(p)!]))),
    };
  } finally {
    tape.dispose();
  }
}

function makeStack(config: Partial<KdaConfig> | KimiConfigInput): Stack {
  const layers = [layerOf(config, 11), layerOf(config, 12)];
  const D = layers[0].config.dModel, [B, T, vocab] = [2, 19, 7];
  const rand = mulberry32(13);
  return {
    layers,
    embedding: draw(vocab * D, 14),
    tokens: Int32Array.from({ length: B * T }, () => Math.floor(rand() * vocab)),
    vocab,
    B,
    T,
    r: draw(B * T * D, 15),
  };
}

for (const [label, config] of [CONFIGS[1], CONFIGS[2]]) {
  Deno.test(`an embedding and two stacked layers (${label}) on one tape: every gradient, the embedding's too, on the cpu arm equals the f64 ops arm to 1e-10, and the embedding's agrees with central differences`, async () => {
    const stack = makeStack(config);
    const ops = await stackGradients(stack, "ops");
    const cpu = await stackGradients(stack, "cpu");
    check("embedding cpu vs ops", cpu.embedding, ops.embedding, 1e-10);
    cpu.layers.forEach((grads, l) => {
      for (const [name, g] of grads) {
        assert.ok(g !== undefined, `layer ${l} ${name} got no gradient`);
        check(`layer ${l} ${name} cpu vs ops`, g, ops.layers[l].get(name)!, 1e-10);
      }
    });
    // The ops arm itself against central differences of the whole model's loss.
    let scale = 0;
    for (const v of ops.embedding) scale = Math.max(scale, Math.abs(v));
    const E = stack.embedding;
    for (const i of [0, 17, E.length - 1]) {
      const h = 1e-5, e0 = E[i];
      E[i] = e0 + h;
      const up = (await stackGradients(stack, "ops")).loss;
      E[i] = e0 - h;
      const down = (await stackGradients(stack, "ops")).loss;
      E[i] = e0;
      const fd = (up - down) / (2 * h);
      if (!(Math.abs(fd - ops.embedding[i]) <= 1e-6 * scale)) {
        throw new Error(`embedding[${i}]: fd ${fd} vs ${ops.embedding[i]} (scale ${scale})`);
      }
    }
  });
}

gpuTest(
  "an embedding and two stacked layers on the gpu arm (f32): every gradient within the f32 layer bar of the f64 ops arm on the same bytes",
  async () => {
    const bar = DTYPES.f32.bars!.layerGradients;
    for (const [label, config] of [CONFIGS[1], CONFIGS[2]]) {
      const stack = makeStack(config);
      // the same bytes on both sides: the f32 values, widened for the f64 reference
      const f32 = {
        ...stack,
        layers: stack.layers.map((l) =>
          KdaModule.fromStateDict(
            new Map([...l.parameters()].map(([n, p]) => [n, Float32Array.from(p.data)])),
            l.config as Partial<KdaConfig>,
            { dtype: "f32" },
          )
        ),
        embedding: Float32Array.from(stack.embedding),
        r: Float32Array.from(stack.r),
      };
      const f64 = {
        ...stack,
        layers: f32.layers.map((l) =>
          KdaModule.fromStateDict(l.stateDict(), l.config as Partial<KdaConfig>)
        ),
        embedding: Float64Array.from(f32.embedding),
        r: Float64Array.from(f32.r),
      };
      const gpu = await stackGradients(f32, "gpu");
      const ops = await stackGradients(f64, "ops");
      check(`${label} embedding gpu vs ops`, gpu.embedding, ops.embedding, bar);
      gpu.layers.forEach((grads, l) => {
        for (const [name, g] of grads) {
          check(`${label} layer ${l} ${name} gpu vs ops`, g, ops.layers[l].get(name)!, bar);
        }
      });
    }
  },
);

Deno.test("forwardOnTape() refuses an input that is not a tensor on a tape of the layer's width", async () => {
  const layer = new KdaModule(KDA);
  const D = KDA.dModel!;
  await assert.rejects(
    () => layer.forwardOnTape(new Float64Array(D) as unknown as Tensor),
    TypeError,
  );
  await assert.rejects(
    () => layer.forwardOnTape(new Tensor(new Float64Array(2 * D), [1, 2, D])),
    /x must be on a tape/,
  );
  const tape = new Tape("f64");
  await assert.rejects(
    () => layer.forwardOnTape(tape.variable(new Float64Array(2 * (D + 1)), [1, 2, D + 1])),
    /x must have shape \[B, T, 12\]: got \[1, 2, 13\]/,
  );
  await assert.rejects(
    () =>
      new KdaModule(KDA, { dtype: "f32" }).forwardOnTape(
        tape.variable(new Float64Array(D), [1, 1, D]),
      ),
    /x must be a Float32Array/,
  );
  tape.dispose();
});
