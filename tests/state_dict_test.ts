// Tests of the layer's state dict and checkpoints (kda/layer/state_dict.ts, loadLayer in kda/module.ts): copies, save→load round
// trips of every group bit for bit (f64 and f32, with and without the short conv), named errors
// for unknown, missing and wrong-shape tensors, and the flash-linear-attention name mapping.

import assert from "node:assert/strict";
import {
  fromTritonNames,
  KdaModule,
  loadLayer,
  loadStateDict,
  parameterNames,
  saveLayer,
  stateDict,
  TRITON_NAME_MAP,
} from "../mod.ts";
import { readSafetensors, writeSafetensors } from "../io/mod.ts";

const SMALL = { dModel: 8, heads: 2, keyDim: 4, valueDim: 3, decayRank: 2 };

/** A layer whose values differ from any seed's initialisation, so loading is really tested. */
function perturbed(shortConv: boolean, dtype: "f64" | "f32"): KdaModule {
  const layer = new KdaModule({ ...SMALL, shortConv, seed: 7 }, { dtype });
  let k = 0;
  for (const p of layer.parameters().values()) {
    for (let i = 0; i < p.data.length; i++) p.data[i] += 0.01 * Math.sin(1e3 * ++k) + 1e-17 * k;
  }
  return layer;
}

function bits(a: Float64Array | Float32Array): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

for (const dtype of ["f64", "f32"] as const) {
  for (const shortConv of [false, true]) {
    const tag = `${dtype}, ${shortConv ? "with" : "without"} shortConv`;
    Deno.test(`save then load round-trips every group bit for bit (${tag})`, async () => {
      const layer = perturbed(shortConv, dtype);
      const bytes = saveLayer(layer);
      const back = loadLayer(bytes);
      assert.equal(back.dtype, dtype);
      assert.deepEqual(back.config, layer.config);
      const want = layer.parameters(), got = back.parameters();
      assert.deepEqual([...got.keys()], parameterNames(shortConv));
      for (const [name, p] of want) {
        const q = got.get(name)!;
        assert.deepEqual(q.shape, p.shape, name);
        assert.equal(q.data.constructor, p.data.constructor, name);
        assert.deepEqual(bits(q.data), bits(p.data), name);
      }
      const x64 = Float64Array.from({ length: 2 * 5 * SMALL.dModel }, (_, i) => Math.cos(0.3 * i));
      const x = dtype === "f64" ? x64 : Float32Array.from(x64);
      const y0 = await layer.forward(x, [2, 5], { arm: "cpu" });
      const y1 = await back.forward(x, [2, 5], { arm: "cpu" });
      assert.deepEqual(bits(y1), bits(y0), "same forward");
      const meta = readSafetensors(bytes).metadata;
      assert.equal(meta.format, "kda.layer");
      assert.equal(meta.dtype, dtype);
      assert.deepEqual(JSON.parse(meta.config), { ...layer.config });
    });
  }
}

Deno.test("stateDict returns copies in table order and loadStateDict copies them back", () => {
  const a = perturbed(true, "f64");
  const dict = stateDict(a);
  assert.deepEqual([...dict.keys()], parameterNames(true));
  dict.get("o_norm_w")![0] = 123;
  assert.notEqual(a.parameters().get("o_norm_w")!.data[0], 123, "a copy, not a view");
  const b = new KdaModule({ ...SMALL, shortConv: true, seed: 99 });
  const result = loadStateDict(b, stateDict(a));
  assert.deepEqual(result, { missing: [], unexpected: [] });
  for (const [name, p] of a.parameters()) {
    assert.deepEqual(b.parameters().get(name)!.data, p.data, name);
  }
});

Deno.test("f32 values load exactly into an f64 layer", () => {
  const f32 = perturbed(false, "f32");
  const f64 = new KdaModule({ ...SMALL, seed: 3 }, { dtype: "f64" });
  loadStateDict(f64, stateDict(f32));
  for (const [name, p] of f32.parameters()) {
    assert.deepEqual([...f64.parameters().get(name)!.data], [...p.data], name);
  }
});

Deno.test("an unknown tensor gives a named RangeError unless strict is false", () => {
  const layer = new KdaModule(SMALL);
  const dict = stateDict(layer);
  dict.set("q_conv_w", new Float64Array(4 * 2 * 4)); // a conv group, but this layer has none
  assert.throws(() => loadStateDict(layer, dict), {
    name: "RangeError",
    message:
      /^dict has a tensor that is not a parameter group of this layer \(without shortConv\): expected one of q_proj\.weight, .*; got "q_conv_w"$/,
  });
  assert.deepEqual(loadStateDict(layer, dict, { strict: false }), {
    missing: [],
    unexpected: ["q_conv_w"],
  });
});

Deno.test("a missing tensor gives a named RangeError unless strict is false", () => {
  const layer = new KdaModule(SMALL);
  const before = stateDict(layer);
  const dict = stateDict(perturbed(false, "f64"));
  dict.delete("decay.a_log");
  dict.delete("o_proj.weight");
  assert.throws(() => loadStateDict(layer, dict), {
    name: "RangeError",
    message: "dict must hold every parameter group of this layer (without shortConv): " +
      'got none for "decay.a_log", "o_proj.weight"',
  });
  assert.deepEqual(stateDict(layer), before, "a rejected dict changes nothing");
  const result = loadStateDict(layer, dict, { strict: false });
  assert.deepEqual(result, { missing: ["decay.a_log", "o_proj.weight"], unexpected: [] });
  assert.deepEqual(layer.parameters().get("decay.a_log")!.data, before.get("decay.a_log"));
});

Deno.test("a wrong shape, length or value gives a named error and loads nothing", () => {
  const layer = new KdaModule(SMALL);
  const before = stateDict(layer);
  const good = stateDict(perturbed(false, "f64"));
  const withShape = new Map<
    string,
    Float64Array | Float32Array | { data: Float64Array; shape: number[] }
  >(
    good,
  );
  withShape.set("q_proj.weight", { data: new Float64Array(64), shape: [4, 16] });
  assert.throws(() => loadStateDict(layer, withShape), {
    name: "RangeError",
    message: 'dict "q_proj.weight" must have shape [8, 8]: got [4, 16]',
  });
  const wrongLength = new Map(good).set("decay.a_log", new Float64Array(10));
  assert.throws(() => loadStateDict(layer, wrongLength), {
    name: "RangeError",
    message: 'dict "decay.a_log" must have 2 elements (shape [2]): got 10',
  });
  const nan = new Map(good).set("decay.a_log", new Float64Array([0, NaN]));
  assert.throws(() => loadStateDict(layer, nan), {
    name: "RangeError",
    message: 'dict "decay.a_log" must be finite: got NaN at index 1',
  });
  // deno-lint-ignore no-explicit-any
  const notArray = new Map<string, any>(good).set("o_norm_w", [1, 1, 1]);
  assert.throws(() => loadStateDict(layer, notArray), {
    name: "TypeError",
    message:
      'dict "o_norm_w" must be a Float64Array, a Float32Array or { data, shape } over one: ' +
      "got Array",
  });
  // deno-lint-ignore no-explicit-any
  assert.throws(() => loadStateDict(layer, good, { strcit: true } as any), {
    name: "TypeError",
    message: "options.strcit is not a known field: expected one of strict",
  });
  // deno-lint-ignore no-explicit-any
  assert.throws(() => stateDict({} as any), {
    name: "TypeError",
    message: "layer must be a KdaModule: got Object",
  });
  assert.deepEqual(stateDict(layer), before, "nothing was loaded");
});

Deno.test("loadLayer names what is wrong with a checkpoint", () => {
  const layer = perturbed(false, "f64");
  const { tensors, metadata } = readSafetensors(saveLayer(layer));
  const rewrite = (
    drop: string | undefined,
    meta: Record<string, string>,
    extra?: [string, Float64Array, number[]],
  ) => {
    const out = new Map<string, { data: Float64Array; shape: readonly number[] }>();
    for (const [name, t] of tensors) {
      if (name !== drop) out.set(name, { data: t.data as Float64Array, shape: t.shape });
    }
    if (extra) out.set(extra[0], { data: extra[1], shape: extra[2] });
    return writeSafetensors(out, meta);
  };
  assert.throws(() => loadLayer(rewrite(undefined, { format: "pt" })), {
    name: "RangeError",
    message: 'metadata.format must be "kda.layer" for a layer checkpoint: got "pt"',
  });
  assert.throws(() => loadLayer(rewrite(undefined, { ...metadata, config: "{dModel" })), {
    name: "TypeError",
    message: 'metadata.config must be the layer\'s config as JSON: got "{dModel"',
  });
  assert.throws(() => loadLayer(rewrite(undefined, { ...metadata, dtype: "f16" })), {
    name: "RangeError",
    message: 'metadata.dtype must be "f64" or "f32": got f16',
  });
  assert.throws(() => loadLayer(rewrite("beta_proj.weight", metadata)), {
    name: "RangeError",
    message: "dict must hold every parameter group of this layer (without shortConv): " +
      'got none for "beta_proj.weight"',
  });
  assert.throws(
    () => loadLayer(rewrite(undefined, metadata, ["lm_head.weight", new Float64Array(2), [2]])),
    { name: "RangeError", message: /not a parameter group of this layer.*got "lm_head\.weight"$/ },
  );
  assert.throws(
    () => loadLayer(rewrite("o_norm_w", metadata, ["o_norm_w", new Float64Array(6), [2, 3]])),
    { name: "RangeError", message: 'dict "o_norm_w" must have shape [3]: got [2, 3]' },
  );
});

Deno.test("TRITON_NAME_MAP targets only this package's groups, each once", () => {
  const groups = new Set(parameterNames(true));
  const targets = TRITON_NAME_MAP.map((e) => e.kda);
  assert.equal(new Set(targets).size, targets.length);
  for (const t of targets) assert.ok(groups.has(t), t);
  // every group but the full-rank output gate has a counterpart in theirs
  assert.deepEqual([...groups].filter((g) => !targets.includes(g)), ["o_gate.weight"]);
});

Deno.test("a flash-linear-attention state dict loads through the mapping, o_gate reported", () => {
  // Their KimiDeltaAttention(hidden_size=8, head_dim=4, num_heads=2, expand_v=0.75,
  // use_short_conv=True): K = 4, V = 3, and their f_proj bottleneck is V wide, so decayRank = 3.
  const [D, H, K, V] = [8, 2, 4, 3];
  const shapes: Record<string, number[]> = {
    "q_proj.weight": [H * K, D],
    "k_proj.weight": [H * K, D],
    "v_proj.weight": [H * V, D],
    "q_conv1d.weight": [H * K, 1, 4],
    "k_conv1d.weight": [H * K, 1, 4],
    "v_conv1d.weight": [H * V, 1, 4],
    "f_proj.0.weight": [V, D],
    "f_proj.1.weight": [H * K, V],
    "A_log": [H],
    "dt_bias": [H * K],
    "b_proj.weight": [H, D],
    "g_proj.0.weight": [V, D],
    "g_proj.1.weight": [H * V, V],
    "g_proj.1.bias": [H * V],
    "o_norm.weight": [V],
    "o_proj.weight": [D, H * V],
  };
  const theirs = new Map<string, { data: Float32Array; shape: number[] }>();
  let k = 0;
  for (const [name, shape] of Object.entries(shapes)) {
    const n = shape.reduce((a, b) => a * b, 1);
    theirs.set(name, { data: Float32Array.from({ length: n }, () => 0.01 * ++k), shape });
  }
  // through a safetensors file, as it would arrive from torch
  const file = readSafetensors(writeSafetensors(theirs));
  const { tensors, unmapped } = fromTritonNames(file.tensors);
  assert.deepEqual(unmapped.sort(), ["g_proj.0.weight", "g_proj.1.bias", "g_proj.1.weight"]);
  assert.deepEqual(tensors.get("k_conv_w")!.shape, [H * K, 4]);
  const layer = new KdaModule(
    { dModel: D, heads: H, keyDim: K, valueDim: V, decayRank: V, shortConv: true },
    { dtype: "f32" },
  );
  const result = loadStateDict(layer, tensors, { strict: false });
  assert.deepEqual(result, { missing: ["o_gate.weight"], unexpected: [] });
  assert.deepEqual(layer.parameters().get("decay.b_alpha")!.data, theirs.get("dt_bias")!.data);
  assert.deepEqual(layer.parameters().get("v_conv_w")!.data, theirs.get("v_conv1d.weight")!.data);
  assert.throws(
    () =>
      fromTritonNames(new Map([["q_conv1d.weight", { data: new Float32Array(8), shape: [8] }]])),
    {
      name: "RangeError",
      message: 'tensors "q_conv1d.weight" must have shape [C, 1, W] (a depthwise Conv1d): got [8]',
    },
  );
});

/** The tiny tensors a checkpoint would hold for SMALL, under a metadata that may claim otherwise. */
function tinyCheckpoint(config: Record<string, unknown>, dtype = "f64"): Uint8Array {
  const layer = new KdaModule(SMALL);
  const tensors = new Map<string, { data: Float64Array; shape: readonly number[] }>();
  for (const [name, p] of layer.parameters()) {
    tensors.set(name, { data: p.data as Float64Array, shape: p.shape });
  }
  return writeSafetensors(tensors, { format: "kda.layer", config: JSON.stringify(config), dtype });
}

/**
 * How often `fn` calls Math.expm1, which the random initialiser calls once per b_alpha entry
 * (docs/kda.md 2.4: b_alpha = ln(e^dt − 1)) and nothing else in the package calls.
 */
function expm1Calls(fn: () => unknown): number {
  const original = Math.expm1;
  let calls = 0;
  Math.expm1 = (x: number) => (calls++, original(x));
  try {
    fn();
  } finally {
    Math.expm1 = original;
  }
  return calls;
}

Deno.test("loadLayer of a tiny file claiming dModel 8192, 16 heads, K = V = 256 fails at once, naming the first mismatched group", () => {
  const huge = { ...SMALL, dModel: 8192, heads: 16, keyDim: 256, valueDim: 256, decayRank: 256 };
  const bytes = tinyCheckpoint(huge);
  const t0 = performance.now();
  assert.throws(() => loadLayer(bytes), {
    name: "RangeError",
    message: 'dict "q_proj.weight" must have shape [4096, 8192]: got [8, 8]',
  });
  const elapsed = performance.now() - t0;
  // A guard beside the message: building the claimed layer first took 17.6 s and 1.34 GB.
  assert.ok(elapsed < 1000, `loadLayer took ${elapsed.toFixed(0)} ms to refuse the file`);
  // The same for a dict handed to fromStateDict with a config that does not fit it.
  const dict = stateDict(new KdaModule(SMALL));
  assert.throws(() => KdaModule.fromStateDict(dict, huge), {
    name: "RangeError",
    message: 'dict "q_proj.weight" must have 33554432 elements (shape [4096, 8192]): got 64',
  });
});

Deno.test("loading a layer (loadLayer, fromStateDict) never draws random weights", () => {
  const layer = perturbed(true, "f64");
  const bytes = saveLayer(layer);
  // The positive control: building a layer does draw, once per b_alpha entry (H·K).
  assert.equal(expm1Calls(() => new KdaModule({ ...SMALL, shortConv: true })), 2 * 4);
  let loaded: KdaModule | undefined;
  assert.equal(expm1Calls(() => (loaded = loadLayer(bytes))), 0);
  assert.equal(expm1Calls(() => KdaModule.fromStateDict(stateDict(layer), layer.config)), 0);
  for (const [name, p] of layer.parameters()) {
    assert.deepEqual(bits(loaded!.parameters().get(name)!.data), bits(p.data), name);
  }
  const misfit = tinyCheckpoint({ ...SMALL, heads: 3 });
  assert.equal(expm1Calls(() => assert.throws(() => loadLayer(misfit), RangeError)), 0);
});

Deno.test("loadStateDict into an f32 layer refuses a finite f64 value that rounds to Infinity in f32, and loads nothing", () => {
  const layer = new KdaModule(SMALL, { dtype: "f32" });
  const before = stateDict(layer);
  const dict = stateDict(new KdaModule(SMALL, { dtype: "f64" }));
  dict.get("o_norm_w")![2] = 1e300;
  assert.throws(() => loadStateDict(layer, dict), {
    name: "RangeError",
    message:
      'dict "o_norm_w" must be finite in the layer\'s f32 (|x| <= 3.4028234663852886e+38): ' +
      "got 1e+300 at index 2, which rounds to Infinity",
  });
  assert.deepEqual(stateDict(layer), before, "nothing was loaded");
  // The largest f32 value and values that round down to it still load.
  dict.get("o_norm_w")![2] = -3.4028235e38;
  loadStateDict(layer, dict);
  assert.equal(layer.parameters().get("o_norm_w")!.data[2], -3.4028234663852886e38);
  // The same refusal from a checkpoint: an f64 file loaded as an f32 layer.
  const bytes = saveLayer(new KdaModule(SMALL));
  const { tensors, metadata } = readSafetensors(bytes);
  const out = new Map<string, { data: Float64Array; shape: readonly number[] }>();
  for (const [name, t] of tensors) out.set(name, { data: t.data as Float64Array, shape: t.shape });
  out.get("decay.a_log")!.data[1] = -1e39;
  assert.throws(() => loadLayer(writeSafetensors(out, { ...metadata, dtype: "f32" })), {
    name: "RangeError",
    message: /^dict "decay\.a_log" must be finite in the layer's f32 .*got -1e\+39 at index 1/,
  });
});
