// `prove --candidate`: a candidate file with planted errors is checked against the exact f64
// reference, and each error is found in the right tensor and the right chunk.

import assert from "node:assert/strict";
import { kda, KdaModule, kdaVjp } from "../mod.ts";
import { readSafetensors, type SafetensorsInput, writeSafetensors } from "../io/mod.ts";
import { bf16Bits, bf16Value } from "../io/mod.ts";
import { checkCandidate, compareCandidates } from "../checks/candidate.ts";
import { checkLayerCandidate } from "../checks/candidate_layer.ts";
import { heatmapSvg } from "../checks/heatmap.ts";
import { detachedSeam } from "../checks/mutants.ts";
import { withKdaSeam } from "../kda/op/arms.ts";
import { randomKda } from "./_fixtures.ts";

const [B, T, H, K, V] = [2, 150, 2, 8, 6];
const C = 64 as const;

/** A perfect f32 candidate: the inputs and every result of the f64 reference, stored as F32. */
async function perfectCandidate(): Promise<Map<string, SafetensorsInput>> {
  const x = randomKda({ B, T, H, K, V }, 7, { withH0: true, dtype: "f32", gateMin: -2 });
  const f64 = (a: Float64Array | Float32Array) => Float64Array.from(a);
  const inputs = {
    B,
    T,
    H,
    K,
    V,
    q: f64(x.q),
    k: f64(x.k),
    v: f64(x.v),
    g: f64(x.g),
    beta: f64(x.beta),
    h0: f64(x.h0!),
  };
  const dout = Float32Array.from({ length: B * T * H * V }, (_, i) => Math.sin(0.3 * i));
  const dht = Float32Array.from({ length: B * H * K * V }, (_, i) => Math.cos(0.7 * i));
  const { o, ht } = await kda(inputs, { arm: "cpu", chunkSize: C });
  const grads = await kdaVjp(inputs, { dout: f64(dout), dht: f64(dht) }, {
    arm: "cpu",
    chunkSize: C,
  });
  const t = (a: Float64Array | Float32Array, shape: number[]): SafetensorsInput => ({
    data: Float32Array.from(a),
    shape,
  });
  return new Map([
    ["q", t(x.q, [B, T, H, K])],
    ["k", t(x.k, [B, T, H, K])],
    ["v", t(x.v, [B, T, H, V])],
    ["g", t(x.g, [B, T, H, K])],
    ["beta", t(x.beta, [B, T, H])],
    ["h0", t(x.h0!, [B, H, K, V])],
    ["dout", t(dout, [B, T, H, V])],
    ["dht", t(dht, [B, H, K, V])],
    ["o", t(o, [B, T, H, V])],
    ["ht", t(ht, [B, H, K, V])],
    ["dq", t(grads.dq, [B, T, H, K])],
    ["dk", t(grads.dk, [B, T, H, K])],
    ["dv", t(grads.dv, [B, T, H, V])],
    ["dg", t(grads.dg, [B, T, H, K])],
    ["dbeta", t(grads.dbeta, [B, T, H])],
    ["dh0", t(grads.dh0, [B, H, K, V])],
  ]);
}

const roundTrip = (m: Map<string, SafetensorsInput>) => readSafetensors(writeSafetensors(m));

Deno.test("a perfect f32 candidate agrees with the reference in every tensor", async () => {
  const report = await checkCandidate(roundTrip(await perfectCandidate()), { precision: "f32" });
  assert.deepEqual(report.rows.filter((r) => !r.ok).map((r) => r.name), []);
  assert.equal(report.rows.length, 8);
  assert.ok(report.ok);
});

Deno.test("one chunk's dbeta off by 1e-3 is found in dbeta, in that chunk, sequence and head", async () => {
  const file = await perfectCandidate();
  const dbeta = file.get("dbeta")!.data as Float32Array;
  // sequence 1, head 0, the second chunk (tokens 64..127)
  for (let t = C; t < 2 * C; t++) dbeta[(1 * T + t) * H + 0] *= 1 + 1e-3;
  const report = await checkCandidate(roundTrip(file), { precision: "f32", chunkSize: C });
  assert.deepEqual(report.rows.filter((r) => !r.ok).map((r) => r.name), ["dbeta"]);
  const row = report.rows.find((r) => r.name === "dbeta")!;
  assert.deepEqual([row.worst.b, row.worst.h, row.worst.chunk], [1, 0, 1]);
  // The heat map's only hot cell is (sequence 1 · head 0, chunk 1).
  const { cols, values } = row.cells;
  const hot = [...values.keys()].filter((i) => values[i] > 1e-5 * row.agreement.refMax);
  assert.deepEqual(hot, [(1 * H + 0) * cols + 1]);
  assert.match(heatmapSvg(report), /dbeta: .*FAIL/);
});

Deno.test("dh0 zeroed is found in dh0 alone", async () => {
  const file = await perfectCandidate();
  (file.get("dh0")!.data as Float32Array).fill(0);
  const report = await checkCandidate(roundTrip(file), { precision: "f32" });
  assert.deepEqual(report.rows.filter((r) => !r.ok).map((r) => r.name), ["dh0"]);
  assert.equal(report.rows.find((r) => r.name === "dh0")!.agreement.rel, 1);
});

Deno.test("bf16-rounded outputs pass at --precision bf16 and fail at f32", async () => {
  const file = await perfectCandidate();
  for (const name of ["dq", "dk", "dv", "dg", "dbeta", "dh0"]) file.delete(name);
  for (const name of ["o", "ht"]) {
    const a = file.get(name)!.data as Float32Array;
    for (let i = 0; i < a.length; i++) a[i] = bf16Value(bf16Bits(a[i]));
  }
  const asBf16 = await checkCandidate(roundTrip(file), { precision: "bf16" });
  assert.ok(asBf16.ok, JSON.stringify(asBf16.rows.map((r) => [r.name, r.agreement.rel, r.bar])));
  const asF32 = await checkCandidate(roundTrip(file), { precision: "f32" });
  assert.deepEqual(asF32.rows.filter((r) => !r.ok).map((r) => r.name), ["o", "ht"]);
});

Deno.test("two candidate files from the same inputs are compared bit for bit", async () => {
  const a = await perfectCandidate();
  const b = await perfectCandidate();
  assert.deepEqual(compareCandidates(roundTrip(a), roundTrip(b)), []);
  (b.get("dk")!.data as Float32Array)[77] += 1e-6;
  const diffs = compareCandidates(roundTrip(a), roundTrip(b));
  assert.deepEqual(diffs.map((d) => [d.name, d.differing, d.firstIndex]), [["dk", 1, 77]]);
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
