// The Kimi Linear form against flash-linear-attention's own KimiDeltaAttention: two fixture files
// written by fla's layer on an H200 (tests/fixtures/make_fla_fixtures.py: the default softplus
// gate with HV = 2H, a conv bias and allow_neg_eigval; and lower_bound = -5 with K, V and D all
// different) load with fla's names and agree with fla's eval-mode output and states (its fused
// recurrent kernel, plain f32) to the f32 bar, and with its training-mode output, input gradient
// and every parameter gradient (its chunk kernel, TF32 products) to the bar derived below.

import assert from "node:assert/strict";
import {
  type Arm,
  DTYPES,
  type FlaKimiConfig,
  fromFla,
  KdaModule,
  type KdaModuleState,
  kimiConfigFromFla,
  type KimiConfigInput,
  loadLayer,
  MEASURED_BAR_FACTOR,
  saveLayer,
} from "../mod.ts";
import { readSafetensors, type SafetensorsFile } from "../io/mod.ts";
import { agreement, bitsEqual } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("kimi_layer_test");

/**
 * The bar of fla's training-mode results. fla's f32 chunk_kda computes its products in TF32 and
 * was measured 0.9-1.6e-3 from f64 (max|a−b|/max|b|); the layer's output and gradients are sums of
 * products with those results in f32, so their error is of the same size. The bar is the worst
 * measured figure times the factor this package gives every measured bar (MEASURED_BAR_FACTOR, 4):
 * 6.4e-3, still 150 times below a wiring mistake (order 1, see the wrong-option test below).
 */
const TF32_CHUNK_MEASURED = 1.6e-3;
const TRAIN_BAR = MEASURED_BAR_FACTOR * TF32_CHUNK_MEASURED;
/** fla's eval-mode path (fused recurrent, no dot products) is plain f32: the layer's f32 bar. */
const EVAL_BAR = DTYPES.f32.bars!.layerForward;

const FILES = ["fla_kimi_layer", "fla_kimi_layer_lower_bound"] as const;
const RUN_TENSORS = ["x", "dy", "y_eval", "y_train"];

interface Fixture {
  name: string;
  file: SafetensorsFile;
  fla: FlaKimiConfig;
  B: number;
  T: number;
  /** fla's parameters, by fla's names. */
  params: Map<string, { data: Float32Array; shape: readonly number[] }>;
  get: (name: string) => Float32Array;
}

function fixture(name: (typeof FILES)[number]): Fixture {
  const file = readSafetensors(
    Deno.readFileSync(new URL(`fixtures/${name}.safetensors`, import.meta.url)),
  );
  assert.equal(file.metadata.format, "fla.kimi_delta_attention");
  const get = (n: string) => {
    const t = file.tensors.get(n);
    assert.ok(t !== undefined && t.data instanceof Float32Array, `${name} has no f32 ${n}`);
    return t.data as Float32Array;
  };
  const params = new Map<string, { data: Float32Array; shape: readonly number[] }>();
  for (const [n, t] of file.tensors) {
    if (!n.includes("/") && !RUN_TENSORS.includes(n)) {
      params.set(n, { data: t.data as Float32Array, shape: t.shape });
    }
  }
  const [B, T] = file.tensors.get("x")!.shape;
  return { name, file, fla: JSON.parse(file.metadata.config), B, T, params, get };
}

const fixtures = FILES.map(fixture);

function check(label: string, a: ArrayLike<number>, b: ArrayLike<number>, tol: number): number {
  const { rel, absDiff, refMax } = agreement(a, b);
  if (!(rel <= tol)) {
    throw new Error(`${label}: ${rel} (abs ${absDiff}, ref ${refMax}, bar ${tol})`);
  }
  if (!(refMax > 0)) throw new Error(`${label}: the reference is all zeros`);
  return rel;
}

/** fla's layer as this package's, in f64 (fla's f32 values widened exactly) or f32. */
function layerOf(
  f: Fixture,
  dtype: "f64" | "f32",
  config: KimiConfigInput | undefined = undefined,
) {
  if (config !== undefined) {
    return KdaModule.fromStateDict(
      new Map([...f.params].map(([n, t]) => [n, { data: t.data, shape: t.shape }])),
      config,
      { dtype },
    );
  }
  return fromFla(f.params, f.fla, { dtype });
}

const input = (f: Fixture, dtype: "f64" | "f32", name: string) =>
  dtype === "f64" ? Float64Array.from(f.get(name)) : f.get(name).slice();

Deno.test("fromFla() builds fla's layer from its state dict and constructor arguments: fla's names and shapes, the gate form, HV, V = head_dim · expand_v", () => {
  for (const f of fixtures) {
    const layer = fromFla(f.params, f.fla);
    assert.deepEqual(
      [...layer.parameters().keys()].sort(),
      [...f.params.keys()].sort(),
      `${f.name}: the layer's groups are fla's`,
    );
    for (const [n, p] of layer.parameters()) {
      assert.deepEqual(p.shape, f.params.get(n)!.shape, `${f.name} ${n} shape`);
      assert.ok(bitsEqual(Float32Array.from(p.data), f.params.get(n)!.data), `${f.name} ${n}`);
    }
    const c = layer.config;
    assert.ok(c.form === "kimi");
    assert.equal(c.numVHeads, f.fla.num_v_heads);
    assert.equal(c.valueDim, f.fla.head_dim! * f.fla.expand_v!);
    assert.equal(c.lowerBound, f.fla.lower_bound);
    assert.equal(c.stateVFirst, true);
  }
});

for (const arm of ["ops", "cpu"] as const) {
  Deno.test(`fla's eval-mode output and states (fused recurrent, plain f32) agree with the f64 ${arm} arm to the f32 layer bar ${EVAL_BAR}`, async () => {
    for (const f of fixtures) {
      const layer = layerOf(f, "f64");
      const x = input(f, "f64", "x");
      const { y, state } = await layer.forwardWithState(x, [f.B, f.T], { arm, strict: true });
      check(`${f.name} y_eval`, y, f.get("y_eval"), EVAL_BAR);
      check(
        `${f.name} recurrent state [B, HV, V, K]`,
        state.kda,
        f.get("state_eval/recurrent"),
        EVAL_BAR,
      );
      for (const s of ["q", "k", "v"] as const) {
        check(
          `${f.name} conv_${s} [B, C, W]`,
          state.conv![s],
          f.get(`state_eval/conv_${s}`),
          EVAL_BAR,
        );
      }
    }
  });
}

Deno.test(`fla's training-mode output, dx and every parameter gradient (chunk path, TF32) agree with the f64 cpu arm to the derived bar ${TRAIN_BAR}, and the f64 cpu arm equals the ops arm to 1e-10`, async () => {
  for (const f of fixtures) {
    const layer = layerOf(f, "f64");
    const x = input(f, "f64", "x"), dy = input(f, "f64", "dy");
    const cpu = await layer.vjp(x, [f.B, f.T], dy, { arm: "cpu", strict: true });
    const ops = await layer.vjp(x, [f.B, f.T], dy, { arm: "ops", strict: true });
    const ours: Record<string, number> = {};
    ours.y_train = check(`${f.name} y_train`, cpu.y, f.get("y_train"), TRAIN_BAR);
    ours["grad/x"] = check(`${f.name} dx`, cpu.dx, f.get("grad/x"), TRAIN_BAR);
    check(`${f.name} dx cpu vs ops`, cpu.dx, ops.dx, 1e-10);
    for (const [n, g] of cpu.grads) {
      ours[`grad/${n}`] = check(`${f.name} grad/${n}`, g, f.get(`grad/${n}`), TRAIN_BAR);
      check(`${f.name} ${n} cpu vs ops`, g, ops.grads.get(n)!, 1e-10);
    }
    check(`${f.name} y cpu vs ops`, cpu.y, ops.y, 1e-12);
    // The fixture maker compared fla with its own plain-PyTorch f64 version of the wiring
    // (metadata wiring_check): fla's distance from that reference and from this layer agree to
    // two significant digits, so the two f64 layers agree far below fla's error.
    const wiring = JSON.parse(f.file.metadata.wiring_check) as Record<string, { rel: number }>;
    for (const [n, rel] of Object.entries(ours)) {
      const theirs = wiring[n].rel;
      if (!(Math.abs(rel - theirs) <= 0.01 * theirs)) {
        throw new Error(
          `${f.name} ${n}: fla is ${rel} from this layer, ${theirs} from the fixture's f64 reference`,
        );
      }
    }
  }
});

Deno.test("a Kimi layer built with one option wrong disagrees with fla's eval output far above the bar (the comparison can fail)", async () => {
  const [softplus, bounded] = fixtures;
  const base = kimiConfigFromFla(softplus.fla);
  const wrong: [Fixture, KimiConfigInput, string][] = [
    [softplus, { ...base, allowNegEigval: false }, "allowNegEigval off"],
    [softplus, { ...base, lowerBound: -5 }, "the bounded gate for the softplus one"],
    [
      bounded,
      { ...kimiConfigFromFla(bounded.fla), lowerBound: null, safeGate: false },
      "the softplus gate for the bounded one",
    ],
    [softplus, { ...base, normEps: 1e-2 }, "norm_eps 1e-2"],
  ];
  for (const [f, config, label] of wrong) {
    const y = await layerOf(f, "f64", config).forward(input(f, "f64", "x"), [f.B, f.T], {
      arm: "cpu",
    });
    const { rel } = agreement(y, f.get("y_eval"));
    if (!(rel > 100 * EVAL_BAR)) throw new Error(`${label}: only ${rel} from fla`);
  }
});

const f32Arms: Arm[] = ["cpu"];
for (const arm of f32Arms) {
  Deno.test(`an f32 Kimi layer on the ${arm} arm agrees with fla's eval output to the f32 layer bar and with its training results to the derived bar`, async () => {
    await f32Agreement(arm);
  });
}
gpuTest(
  "an f32 Kimi layer on the gpu arm agrees with fla's eval output to the f32 layer bar and with its training results to the derived bar",
  async () => {
    await f32Agreement("gpu");
  },
);

async function f32Agreement(arm: Arm) {
  for (const f of fixtures) {
    const layer = layerOf(f, "f32");
    const x = input(f, "f32", "x"), dy = input(f, "f32", "dy");
    const { y, state } = await layer.forwardWithState(x, [f.B, f.T], { arm, strict: true });
    check(`${f.name} ${arm} y_eval`, y, f.get("y_eval"), EVAL_BAR);
    check(`${f.name} ${arm} recurrent state`, state.kda, f.get("state_eval/recurrent"), EVAL_BAR);
    const run = await layer.vjp(x, [f.B, f.T], dy, { arm, strict: true });
    check(`${f.name} ${arm} y_train`, run.y, f.get("y_train"), TRAIN_BAR);
    check(`${f.name} ${arm} dx`, run.dx, f.get("grad/x"), TRAIN_BAR);
    for (const [n, g] of run.grads) {
      check(`${f.name} ${arm} grad/${n}`, g, f.get(`grad/${n}`), TRAIN_BAR);
    }
  }
}

/** The rows [t0, t1) of each batch entry of a [B, T, D] array. */
function rows(x: Float64Array, B: number, T: number, D: number, t0: number, t1: number) {
  const out = new Float64Array(B * (t1 - t0) * D);
  for (let b = 0; b < B; b++) {
    out.set(x.subarray((b * T + t0) * D, (b * T + t1) * D), b * (t1 - t0) * D);
  }
  return out;
}

for (const stateVFirst of [true, false]) {
  Deno.test(`the Kimi layer in segments and token by token equals the whole run, its state in fla's layouts (stateVFirst ${stateVFirst})`, async () => {
    const f = fixtures[1];
    const layer = layerOf(f, "f64", kimiConfigFromFla(f.fla, { config: { stateVFirst } }));
    const D = layer.config.dModel, x = Float64Array.from(f.get("x"));
    const whole = await layer.forwardWithState(x, [f.B, f.T], { arm: "cpu", strict: true });
    let state: KdaModuleState<Float64Array> | undefined;
    const cuts = [0, 2, 3, 30, f.T - 1, f.T];
    for (let i = 0; i + 1 < cuts.length; i++) {
      const [t0, t1] = [cuts[i], cuts[i + 1]];
      const part = t1 - t0 === 1
        ? await layer.step(rows(x, f.B, f.T, D, t0, t1), state, { arm: "cpu", strict: true })
        : await layer.forwardWithState(rows(x, f.B, f.T, D, t0, t1), [f.B, t1 - t0], {
          arm: "cpu",
          strict: true,
          ...(state ? { state } : {}),
        });
      check(`y[${t0}, ${t1})`, part.y, rows(whole.y as Float64Array, f.B, f.T, D, t0, t1), 1e-12);
      state = part.state;
    }
    check("final recurrent state", state!.kda, whole.state.kda, 1e-12);
    for (const s of ["q", "k", "v"] as const) {
      assert.ok(bitsEqual(state!.conv![s], whole.state.conv![s]), `conv cache ${s}`);
    }
    // The layout: V-first is fla's cache ([B, HV, V, K]), else [B, HV, K, V], its transpose.
    const fla = f.get("state_eval/recurrent"),
      { numVHeads: HV, keyDim: K, valueDim: V } = layer.config as KimiConfigInput & {
        numVHeads: number;
        keyDim: number;
        valueDim: number;
      };
    const ours = whole.state.kda;
    const at = (b: number, h: number, k: number, v: number) =>
      stateVFirst ? ours[((b * HV + h) * V + v) * K + k] : ours[((b * HV + h) * K + k) * V + v];
    let worst = 0;
    for (let b = 0; b < f.B; b++) {
      for (let h = 0; h < HV; h++) {
        for (let k = 0; k < K; k++) {
          for (let v = 0; v < V; v++) {
            worst = Math.max(worst, Math.abs(at(b, h, k, v) - fla[((b * HV + h) * V + v) * K + k]));
          }
        }
      }
    }
    if (!(worst <= 1e-5)) throw new Error(`the state's layout: max|Δ| ${worst}`);
  });
}

Deno.test("fla's cached state continues a sequence as this layer's own state does", async () => {
  for (const f of fixtures) {
    const layer = layerOf(f, "f64");
    const D = layer.config.dModel;
    const next = Float64Array.from({ length: f.B * 5 * D }, (_, i) => Math.sin(0.3 * i));
    const own = await layer.forwardWithState(input(f, "f64", "x"), [f.B, f.T], { arm: "cpu" });
    const flaState = {
      kda: Float64Array.from(f.get("state_eval/recurrent")),
      conv: {
        q: Float64Array.from(f.get("state_eval/conv_q")),
        k: Float64Array.from(f.get("state_eval/conv_k")),
        v: Float64Array.from(f.get("state_eval/conv_v")),
      },
    };
    const fromOwn = await layer.forwardWithState(next, [f.B, 5], { arm: "cpu", state: own.state });
    const fromFlaState = await layer.forwardWithState(next, [f.B, 5], {
      arm: "cpu",
      state: flaState,
    });
    check(`${f.name} continuation`, fromFlaState.y, fromOwn.y, EVAL_BAR);
  }
});

Deno.test("a Kimi layer saves and loads with its config and fla's names; the stateDict is fla's", () => {
  for (const f of fixtures) {
    const layer = layerOf(f, "f32");
    const copy = loadLayer(saveLayer(layer));
    assert.deepEqual(copy.config, layer.config);
    assert.equal(copy.dtype, "f32");
    for (const [n, p] of layer.parameters()) {
      assert.ok(bitsEqual(copy.parameters().get(n)!.data, p.data), n);
    }
    assert.deepEqual([...layer.stateDict().keys()], [...layer.parameters().keys()]);
  }
});

Deno.test("Kimi configs and fla arguments refuse what fla's layer would not build, naming the field", () => {
  const bad: [() => unknown, RegExp][] = [
    [
      () => new KdaModule({ form: "kimi", heads: 2, numVHeads: 3 }),
      /config.numVHeads must be a multiple of config.heads \(2\): got 3/,
    ],
    [
      () => new KdaModule({ form: "kimi", safeGate: true }),
      /config.lowerBound must lie in \[-5, 0\) with config.safeGate/,
    ],
    [
      () => new KdaModule({ form: "kimi", lowerBound: 0.5 }),
      /config.lowerBound must be null .* got 0.5/,
    ],
    [
      () => new KdaModule({ form: "kimi", minDecay: 0.9 } as KimiConfigInput),
      /config.minDecay is a field of the KDA form/,
    ],
    [
      () => new KdaModule({ numVHeads: 4 } as never),
      /config.numVHeads is a field of the Kimi Linear form/,
    ],
    [
      () => new KdaModule({ form: "kimi", num_heads: 2 } as never),
      /config.heads is this package's name for it/,
    ],
    [
      () => new KdaModule({ form: "mamba" } as never),
      /config.form must be "kda" or "kimi": got "mamba"/,
    ],
    [
      () => kimiConfigFromFla({ hidden_size: 8, use_gate: true } as never),
      /fla.use_gate is not a known field/,
    ],
    [
      () => kimiConfigFromFla({ head_dim: 3, expand_v: 0.5 }),
      /fla.expand_v must make head_dim · expand_v an integer/,
    ],
    [
      () => kimiConfigFromFla({ mode: "parallel" }),
      /fla.mode must be "chunk" or "fused_recurrent"/,
    ],
    [() => fromFla(new Map(), { hidden_size: 8 }), /tensors must hold the layer's parameters/],
    // the wrong type is a TypeError showing the value, not a RangeError that reads like a refusal
    // of -1; a factor of V is named as fla names it, not as the valueDim it makes
    [
      () => new KdaModule({ form: "kimi", lowerBound: "-1" as never }),
      /^TypeError: config.lowerBound must be null \(the softplus gate\) or a number: got "-1"$/,
    ],
    [
      () => kimiConfigFromFla({ expand_v: true as never }),
      /^TypeError: fla.expand_v must be a number: got true$/,
    ],
    [
      () => kimiConfigFromFla({ expand_v: -1 }),
      /^RangeError: fla.expand_v must be a finite number above 0: got -1$/,
    ],
    // an RMSNorm epsilon of 0 divides a zero row of o by 0: NaN everywhere
    [
      () => new KdaModule({ form: "kimi", normEps: 0 }),
      /^RangeError: config.normEps must be a finite number above 0: got 0$/,
    ],
    [
      () => new KdaModule({ dModel: 8, heads: 1, keyDim: 1e12, valueDim: 2, decayRank: 1 }),
      /^RangeError: config must give parameters that fit in memory: q_proj.weight has shape \[1000000000000, 8\] .*allocating it failed/,
    ],
  ];
  for (const [f, message] of bad) assert.throws(f, message);
  const f = fixtures[0];
  const missing = new Map(f.params);
  missing.delete("g_proj.1.bias");
  assert.throws(() => fromFla(missing, f.fla), /got none for "g_proj.1.bias"/);
  const squeezed = new Map(f.params);
  const conv = f.params.get("q_conv1d.weight")!;
  squeezed.set("q_conv1d.weight", { data: conv.data, shape: [conv.shape[0], conv.shape[2]] });
  assert.throws(() => fromFla(squeezed, f.fla), /"q_conv1d.weight" must have shape \[64, 1, 4\]/);
});

gpuTest(
  "the Kimi layer decodes on the gpu arm (the op's decode call, grouped value heads) as its forward runs, to the f32 layer bar",
  async () => {
    for (const f of fixtures) {
      const layer = layerOf(f, "f32");
      const D = layer.config.dModel, x = f.get("x"), T = 6;
      const prompt = new Float32Array(f.B * T * D);
      for (let b = 0; b < f.B; b++) {
        prompt.set(x.subarray(b * f.T * D, (b * f.T + T) * D), b * T * D);
      }
      const whole = await layer.forwardWithState(prompt, [f.B, T], { arm: "gpu", strict: true });
      const first = await layer.step(
        prompt.filter((_, i) => Math.floor(i / D) % T < T - 1),
        undefined,
        { arm: "gpu", strict: true, tokens: T - 1 },
      );
      const last = await layer.step(
        prompt.filter((_, i) => Math.floor(i / D) % T === T - 1),
        first.state,
        { arm: "gpu", strict: true },
      );
      const tail = whole.y.filter((_, i) => Math.floor(i / D) % T === T - 1);
      check(`${f.name} last token`, last.y, tail, EVAL_BAR);
      check(`${f.name} state`, last.state.kda, whole.state.kda, EVAL_BAR);
    }
  },
);
