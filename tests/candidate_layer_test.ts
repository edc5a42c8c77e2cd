// `prove --candidate` on layer candidates (a layer's run: x, dy, y, its parameters and grad/<name>):
// each wrong or malformed file is found, or refused by name.

import assert from "node:assert/strict";
import { KdaModule, saveLayer } from "../mod.ts";
import { readSafetensors, type SafetensorsInput, writeSafetensors } from "../io/mod.ts";
import { checkCandidate } from "../checks/candidate.ts";
import { checkLayerCandidate } from "../checks/candidate_layer.ts";
import { detachedSeam } from "../checks/mutants.ts";
import { withKdaSeam } from "../kda/op/arms.ts";
import { cli, LAYER_CONFIG, layerCandidate, roundTrip } from "./_candidate_run.ts";

// ---- layer candidates ----

Deno.test("a layer candidate's input gradient grad/x is checked where the file holds it", async () => {
  const { file, dx } = await layerCandidate();
  const without = await checkLayerCandidate(roundTrip(file), { precision: "f32" });
  assert.ok(without.ok);
  assert.equal(without.input, null, "no grad/x: no row, said as unchecked");
  file.set("grad/x", { data: dx, shape: [1, 20, 8], dtype: "F32" });
  const good = await checkLayerCandidate(roundTrip(file), { precision: "f32" });
  assert.ok(good.ok && good.input?.ok, JSON.stringify(good.input));
  assert.deepEqual(good.unused, []);
  const mutants: [string, Float64Array][] = [["zeroed", dx.map(() => 0)], [
    "scaled",
    dx.map((v) => v * 1.01),
  ]];
  for (const [label, bad] of mutants) {
    file.set("grad/x", { data: bad, shape: [1, 20, 8], dtype: "F32" });
    const r = await checkLayerCandidate(roundTrip(file), { precision: "f32" });
    assert.equal(r.input?.ok, false, `grad/x ${label}: ${JSON.stringify(r.input)}`);
    assert.equal(r.ok, false, `grad/x ${label}: the candidate must not agree`);
    assert.ok(r.rows.every((row) => row.ok), `grad/x ${label}: the groups still agree`);
    assert.match(r.diagnosis ?? "", /\bx\b/, `grad/x ${label}: the diagnosis names x`);
  }
  file.set("grad/x", { data: dx.subarray(0, 8), shape: [8], dtype: "F32" });
  await assert.rejects(
    () => checkLayerCandidate(roundTrip(file), { precision: "f32" }),
    /candidate tensor grad\/x must have shape \[1, 20, 8\]: got \[8\]/,
  );
});

Deno.test("a layer candidate missing grad/q_proj.weight gets a failing row named for it", async () => {
  const { file } = await layerCandidate();
  file.delete("grad/q_proj.weight");
  const report = await checkLayerCandidate(roundTrip(file), { precision: "f32" });
  const row = report.rows.find((r) => r.name === "q_proj.weight");
  assert.ok(row, "no row for q_proj.weight");
  assert.equal(row.ok, false);
  assert.equal(row.missing, true);
  assert.equal(report.ok, false);
  assert.match(report.diagnosis ?? "", /grad\/q_proj\.weight/);
  assert.equal(report.rows.length, new KdaModule(LAYER_CONFIG).parameters().size);
});

Deno.test("a layer candidate's tensors must have their shapes, not only their element counts", async () => {
  // dy laid out [T, B, D], and a gradient stored transposed: the same counts, other shapes
  const swapped = (await layerCandidate()).file;
  swapped.set("dy", { ...swapped.get("dy")!, shape: [20, 1, 8] });
  await assert.rejects(checkLayerCandidate(roundTrip(swapped), { precision: "f32" }), {
    name: "RangeError",
    message: "candidate tensor dy must have shape [1, 20, 8]: got [20, 1, 8]",
  });
  const { file: transposed } = await layerCandidate();
  const name = "grad/decay.w_down.weight";
  const shape = transposed.get(name)!.shape;
  transposed.set(name, { ...transposed.get(name)!, shape: [...shape].reverse() });
  await assert.rejects(checkLayerCandidate(roundTrip(transposed), { precision: "f32" }), {
    name: "RangeError",
    message: `candidate tensor ${name} must have shape [${shape.join(", ")}]: got [${
      [...shape].reverse().join(", ")
    }]`,
  });
});

Deno.test("a layer candidate reports the tensors it does not use", async () => {
  const { file } = await layerCandidate();
  file.set("grad/not_a_group", { data: new Float32Array(2), shape: [2] });
  const report = await checkLayerCandidate(roundTrip(file), { precision: "f32" });
  assert.deepEqual(report.unused.map((u) => u.name), ["grad/not_a_group"]);
  assert.ok(report.ok);
});

Deno.test("a layer candidate's precision is read from its dtypes: a bf16 layer agrees at the bf16 bars", async () => {
  const { file } = await layerCandidate("BF16");
  const report = await checkLayerCandidate(roundTrip(file));
  assert.equal(report.precision, "bf16");
  assert.match(report.precisionNote, /^precision bf16 \(from the file's dtypes/);
  assert.ok(
    report.ok,
    JSON.stringify([report.output, ...report.rows].map((r) => [r.name, r.agreement.rel, r.bar])),
  );
});

Deno.test("a layer checkpoint written by saveLayer is refused as such, naming what a candidate holds", async () => {
  const bytes = saveLayer(new KdaModule(LAYER_CONFIG));
  for (
    const check of [
      () => checkCandidate(readSafetensors(bytes)),
      () => checkLayerCandidate(readSafetensors(bytes)),
    ]
  ) {
    await assert.rejects(
      check,
      (e: Error) =>
        e instanceof RangeError && /layer checkpoint/.test(e.message) &&
        /q, k, v, g, beta/.test(e.message) && /x, dy, y and grad\//.test(e.message),
    );
  }
});

Deno.test("a layer candidate whose op output was detached is diagnosed as a graph cut at the op", async () => {
  const config = { dModel: 8, heads: 2, keyDim: 4, valueDim: 4, decayRank: 2 };
  const layer = new KdaModule(config);
  const [b, t] = [1, 20];
  const x = Float64Array.from({ length: b * t * 8 }, (_, i) => Math.sin(i));
  const dy = Float64Array.from({ length: b * t * 8 }, (_, i) => Math.cos(i));
  const cut = await withKdaSeam(detachedSeam(), () => layer.vjp(x, [b, t], dy, { arm: "cpu" }));
  const file = new Map<string, SafetensorsInput>([
    ["x", { data: x, shape: [b, t, 8] }],
    ["dy", { data: dy, shape: [b, t, 8] }],
    ["y", { data: cut.y, shape: [b, t, 8] }],
  ]);
  for (const [name, p] of layer.parameters()) {
    file.set(name, { data: p.data, shape: [...p.shape] });
    file.set(`grad/${name}`, { data: cut.grads.get(name)!, shape: [...p.shape] });
  }
  const report = await checkLayerCandidate(roundTrip(file), { precision: "f32" });
  assert.equal(report.ok, false);
  assert.match(report.diagnosis!, /^The graph is cut at the op/);
  const good = await layer.vjp(x, [b, t], dy, { arm: "cpu" });
  for (const [name, g] of good.grads) {
    file.set(`grad/${name}`, { data: g, shape: file.get(name)!.shape });
  }
  assert.ok((await checkLayerCandidate(roundTrip(file), { precision: "f32" })).ok);
});

Deno.test("a layer candidate missing one of its short-conv groups is refused by name", async () => {
  const layer = new KdaModule({ ...LAYER_CONFIG, shortConv: true });
  const [b, t] = [1, 6];
  const x = Float64Array.from({ length: b * t * 8 }, (_, i) => Math.sin(i));
  const run = await layer.vjp(x, [b, t], x, { arm: "cpu" });
  const file = new Map<string, SafetensorsInput>([
    ["x", { data: x, shape: [b, t, 8] }],
    ["dy", { data: x, shape: [b, t, 8] }],
    ["y", { data: run.y, shape: [b, t, 8] }],
  ]);
  for (const [name, p] of layer.parameters()) {
    if (name !== "q_conv_w") file.set(name, { data: p.data, shape: [...p.shape] });
    file.set(`grad/${name}`, { data: run.grads.get(name)!, shape: [...p.shape] });
  }
  await assert.rejects(
    () => checkLayerCandidate(roundTrip(file)),
    (e: Error) => e instanceof RangeError && /must hold a tensor named q_conv_w/.test(e.message),
  );
});

Deno.test("a layer candidate whose kda_config claims 16 heads of K = V = 256 over tiny tensors fails at once, naming the group, with no random draw", async () => {
  const config = { dModel: 8, heads: 2, keyDim: 4, valueDim: 4, decayRank: 2 };
  const layer = new KdaModule(config);
  const x = new Float64Array(1 * 4 * 8).fill(0.1);
  const file = new Map<string, SafetensorsInput>([
    ["x", { data: x, shape: [1, 4, 8] }],
    ["dy", { data: x, shape: [1, 4, 8] }],
    ["y", { data: x, shape: [1, 4, 8] }],
  ]);
  for (const [name, p] of layer.parameters()) file.set(name, { data: p.data, shape: [...p.shape] });
  // x fits the claim's dModel, so the check reaches the parameters.
  const huge = { ...config, heads: 16, keyDim: 256, valueDim: 256, decayRank: 256 };
  const bytes = writeSafetensors(file, { kda_config: JSON.stringify(huge) });
  // The random initialiser calls Math.expm1 once per b_alpha entry; nothing else does.
  const original = Math.expm1;
  let draws = 0;
  Math.expm1 = (v: number) => (draws++, original(v));
  const t0 = performance.now();
  try {
    await assert.rejects(checkLayerCandidate(readSafetensors(bytes), { precision: "f32" }), {
      name: "RangeError",
      message: "candidate tensor q_proj.weight must have shape [4096, 8]: got [8, 8]",
    });
  } finally {
    Math.expm1 = original;
  }
  const elapsed = performance.now() - t0;
  assert.ok(elapsed < 1000, `the check took ${elapsed.toFixed(0)} ms to refuse the file`);
  assert.equal(draws, 0);
});

Deno.test("prove --compare is refused by name on a layer candidate, whose results it does not know", async () => {
  const { file } = await layerCandidate();
  const bytes = writeSafetensors(file);
  // the second file is read only after the refusal, so any path shows it
  const out = await cli(bytes, "--compare", "tests/fixtures/fla_chunk_kda_bf16.safetensors");
  assert.equal(out.code, 2, out.stdout + out.stderr);
  assert.match(
    out.stderr,
    /^prove: --compare compares two op candidates' results and has no effect on a layer candidate/m,
  );
});
