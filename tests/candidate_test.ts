// `prove --candidate`: a candidate file with planted errors is checked against the exact f64
// reference, and each error is found in the right tensor and the right chunk.

import assert from "node:assert/strict";
import { kda, kdaVjp } from "../mod.ts";
import { readSafetensors, type SafetensorsInput, writeSafetensors } from "../io/mod.ts";
import { bf16Bits, bf16Value } from "../io/mod.ts";
import { checkCandidate } from "../checks/candidate.ts";
import { compareCandidates } from "../checks/candidate_compare.ts";
import { heatmapSvg } from "../checks/heatmap.ts";
import { randomKda } from "./_fixtures.ts";
import { candidateSweep, makeCandidate } from "./_candidate_fuzz.ts";
import { cli, layerCandidate, roundTrip } from "./_candidate_run.ts";
import { DTYPES } from "../base/dtype.ts";

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

// ---- a candidate that checks nothing must not agree (project issue, item 1) ----

/** A file of the op's layouts with the given dims, every tensor zero-filled except g's decay. */
function zeroFile(B: number, T: number, h: number, k: number, v: number, cu?: number[]) {
  const t = (shape: number[], fill = 0.5): SafetensorsInput => ({
    data: new Float32Array(shape.reduce((a, d) => a * d, 1)).fill(fill),
    shape,
  });
  const m = new Map<string, SafetensorsInput>([
    ["q", t([B, T, h, k])],
    ["k", t([B, T, h, k])],
    ["v", t([B, T, h, v])],
    ["g", t([B, T, h, k], -0.1)],
    ["beta", t([B, T, h])],
    ["o", t([B, T, h, v])],
  ]);
  if (cu) m.set("cu_seqlens", { data: Int32Array.from(cu), shape: [cu.length] });
  return m;
}

Deno.test("a candidate with a zero dimension (no sequence, token, head or channel) is refused: it checks nothing", async () => {
  for (const dims of [[0, 5, 2, 4, 3], [2, 0, 2, 4, 3], [2, 5, 0, 4, 3], [2, 5, 2, 0, 3]]) {
    const [b, t, h, k, v] = dims;
    await assert.rejects(
      () => checkCandidate(roundTrip(zeroFile(b, t, h, k, v)), { precision: "f32" }),
      (e: Error) => e instanceof RangeError && /checks nothing/.test(e.message),
      `dims ${dims}`,
    );
  }
  await assert.rejects(
    () => checkCandidate(roundTrip(zeroFile(2, 5, 2, 4, 0)), { precision: "f32" }),
    (e: Error) => e instanceof RangeError && /v must .*positive/.test(e.message),
  );
});

Deno.test("a packed candidate with cu_seqlens = [0] (T = 0) is refused: it holds no sequence", async () => {
  await assert.rejects(
    () => checkCandidate(roundTrip(zeroFile(1, 0, 2, 4, 3, [0])), { precision: "f32" }),
    (e: Error) =>
      e instanceof RangeError && /cu_seqlens must hold at least 2 offsets/.test(e.message),
  );
});

Deno.test("a packed candidate may hold an empty sequence (as the op and fla run it); decreasing offsets are refused", async () => {
  const report = await checkCandidate(roundTrip(zeroFile(1, 5, 2, 4, 3, [0, 3, 3, 5])), {
    precision: "f32",
  });
  assert.ok(report.rows.some((r) => r.name === "o"), "no row for o");
  await assert.rejects(
    () => checkCandidate(roundTrip(zeroFile(1, 5, 2, 4, 3, [0, 4, 3, 5])), { precision: "f32" }),
    (e: Error) =>
      e instanceof RangeError &&
      /cu_seqlens must not decrease and must run from 0 to T = 5/.test(e.message),
  );
});

Deno.test("a result whose reference is all zeros is marked unchecked, and a candidate with no checked row does not agree", async () => {
  const file = zeroFile(1, 6, 1, 2, 2);
  (file.get("v")!.data as Float32Array).fill(0);
  (file.get("o")!.data as Float32Array).fill(0);
  const report = await checkCandidate(roundTrip(file), { precision: "f32" });
  const row = report.rows.find((r) => r.name === "o")!;
  assert.equal(row.agreement.refMax, 0);
  assert.equal(row.checked, false);
  assert.match(row.note ?? "", /reference is all zeros/);
  assert.equal(report.ok, false);
  // A nonzero candidate where the reference is zero is an error found, not an unchecked row.
  (file.get("o")!.data as Float32Array)[3] = 1e-3;
  const found = (await checkCandidate(roundTrip(file), { precision: "f32" })).rows[0];
  assert.deepEqual([found.checked, found.ok, found.agreement.rel], [true, false, Infinity]);
});

Deno.test("a result whose reference lies outside f32's range cannot be checked at f32: the file is refused, not passed", async () => {
  // one token, q = k = v = 1e30: o = 5e89, past f32; its f32 rounding is Infinity, and a bar of
  // Infinity passed a candidate of zeros
  const one = (x: number): SafetensorsInput => ({ data: Float64Array.of(x), shape: [1, 1, 1, 1] });
  const file = new Map<string, SafetensorsInput>([
    ["q", one(1e30)],
    ["k", one(1e30)],
    ["v", one(1e30)],
    ["g", one(0)],
    ["beta", { data: Float64Array.of(0.5), shape: [1, 1, 1] }],
    ["o", one(0)],
  ]);
  await assert.rejects(() => checkCandidate(readSafetensors(writeSafetensors(file))), {
    name: "RangeError",
    message:
      /^candidate o cannot be checked at f32: its reference \(max \|o\| 5\.00e\+89\) lies outside f32's normal range, so its bar would be Infinity/,
  });
});

Deno.test("a candidate without h0 or dht says in its report that each is taken as zeros", async () => {
  const spec = { ...SMALL, h0: false, dht: false, results: ["o", "dq"] };
  const report = await checkCandidate(roundTrip(await makeCandidate(spec)));
  assert.ok(report.ok);
  assert.ok(report.notes.some((n) => /^h0 absent: .*zeros/.test(n)), report.notes.join("; "));
  assert.ok(report.notes.some((n) => /^dht absent: .*zeros/.test(n)), report.notes.join("; "));
  const full = await checkCandidate(
    roundTrip(await makeCandidate({ ...spec, h0: true, dht: true })),
  );
  assert.ok(!full.notes.some((n) => /absent/.test(n)), full.notes.join("; "));
});

Deno.test("tensors the candidate checker does not use are reported as unused", async () => {
  const file = await makeCandidate({ ...SMALL, results: ["o"] });
  // dout without any gradient result: nothing to pull it back into.
  file.set("dout", {
    data: new Float32Array(file.get("o")!.data.length),
    shape: file.get("o")!.shape,
  });
  file.set("final_state", { data: new Float32Array(4), shape: [4] });
  const report = await checkCandidate(roundTrip(file));
  assert.deepEqual(report.unused.map((u) => u.name).sort(), ["dout", "final_state"]);
  assert.ok(report.ok);
});

// ---- the precision from the file's dtypes, grouped value heads (project issue, item 2) ----

const SMALL = {
  B: 2,
  T: 23,
  H: 2,
  HV: 2,
  K: 4,
  V: 3,
  dtype: "F32" as const,
  h0: true,
  dht: true,
  results: ["o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"],
  seed: 11,
};

Deno.test("without a precision, a bf16 candidate is judged at the bf16 bars read from its dtypes, and says so", async () => {
  // fla's layout of dtypes: inputs and gradients bf16, the states h0, dht, ht in f32.
  const file = roundTrip(await makeCandidate({ ...SMALL, dtype: "BF16", stateDtype: "F32" }));
  const report = await checkCandidate(file);
  assert.equal(report.precision, "bf16");
  assert.match(
    report.precisionNote,
    /^precision bf16 \(from the file's dtypes: q, k, v, g, beta are BF16/,
  );
  assert.ok(report.ok, JSON.stringify(report.rows.map((r) => [r.name, r.agreement.rel, r.bar])));
  const asF32 = await checkCandidate(file, { precision: "f32" });
  assert.match(
    asF32.precisionNote,
    /^precision f32 \(from --precision; the file's inputs are BF16\)/,
  );
  assert.equal(asF32.ok, false);
});

Deno.test("the precision follows the inputs' dtype: F16 sets the f16 bars, F32 and F64 the f32 bars", async () => {
  for (const [dtype, precision] of [["F16", "f16"], ["F32", "f32"], ["F64", "f32"]] as const) {
    const report = await checkCandidate(roundTrip(await makeCandidate({ ...SMALL, dtype })));
    assert.equal(report.precision, precision, dtype);
    assert.match(
      report.precisionNote,
      new RegExp(`from the file's dtypes: q, k, v, g, beta are ${dtype}`),
    );
    assert.ok(report.ok, dtype);
  }
});

Deno.test("inputs of mixed dtypes are refused, naming each dtype's tensors, unless a precision is given", async () => {
  const file = await makeCandidate({ ...SMALL, dtype: "BF16" });
  file.set("beta", { ...file.get("beta")!, dtype: "F32" });
  await assert.rejects(
    () => checkCandidate(roundTrip(file)),
    (e: Error) => e instanceof RangeError && /BF16 \(q, k, v, g\) and F32 \(beta\)/.test(e.message),
  );
  assert.ok((await checkCandidate(roundTrip(file), { precision: "bf16" })).ok);
});

Deno.test("a grouped-value-head candidate (HV = 3·H) made by the f64 reference agrees in every tensor", async () => {
  const report = await checkCandidate(roundTrip(await makeCandidate({ ...SMALL, HV: 6 })));
  assert.equal(report.dims.HV, 6);
  assert.deepEqual(report.rows.filter((r) => !r.ok).map((r) => r.name), []);
  assert.equal(report.rows.length, 8);
});

Deno.test("a grouped-value-head candidate with one head off fails in that tensor alone, at that head", async () => {
  const { B, T, H, K, V } = SMALL, HV = 6;
  for (
    const [name, heads, width, head] of [["dk", H, K, 1], ["dv", HV, V, 4], [
      "o",
      HV,
      V,
      5,
    ]] as const
  ) {
    const file = await makeCandidate(
      { ...SMALL, HV, packed: undefined } as typeof SMALL & { HV: number },
    );
    const a = file.get(name)!.data as Float64Array;
    for (let t = 0; t < T; t++) {
      for (let c = 0; c < width; c++) a[((1 * T + t) * heads + head) * width + c] *= 1.01;
    }
    const report = await checkCandidate(roundTrip(file));
    assert.deepEqual(report.rows.filter((r) => !r.ok).map((r) => r.name), [name]);
    const row = report.rows.find((r) => r.name === name)!;
    assert.deepEqual([row.worst.b, row.worst.h], [1, head], name);
    assert.equal(row.cells.rows, B * heads, name);
  }
});

Deno.test("a candidate with K above 256 or a state too large for the reference is refused before it is allocated", async () => {
  const wide = zeroFile(1, 1, 1, 300, 1);
  await assert.rejects(
    () => checkCandidate(roundTrip(wide), { precision: "f32" }),
    (e: Error) => e instanceof RangeError && /K .*at most 256/.test(e.message),
  );
  // 2^11 one-token sequences of 256 × 256 states: 2^27 state elements.
  const cu = Array.from({ length: 2049 }, (_, i) => i);
  const big = zeroFile(1, 2048, 1, 256, 256, cu);
  big.delete("o");
  big.set("ht", { data: new Float32Array(1), shape: [1] });
  await assert.rejects(
    () => checkCandidate(roundTrip(big), { precision: "f32" }),
    (e: Error) => e instanceof RangeError && /state .* must hold at most/.test(e.message),
  );
});

Deno.test("two candidate files are not called bit-identical when they share no result or differ in their inputs", async () => {
  const a = await makeCandidate({ ...SMALL, results: ["o", "dq"] });
  const b = await makeCandidate({ ...SMALL, results: ["dq"] });
  assert.deepEqual(compareCandidates(roundTrip(b), roundTrip(b)), []);
  assert.throws(
    () => compareCandidates(roundTrip(a), roundTrip(b)),
    /same results.*o in the first file only/,
  );
  const c = await makeCandidate({ ...SMALL, results: ["o", "dq"], seed: 12 });
  assert.throws(() => compareCandidates(roundTrip(a), roundTrip(c)), /same inputs.*q differing/);
  a.delete("dq");
  a.delete("o");
  a.set("final_state", { data: new Float32Array(1), shape: [1] });
  assert.throws(() => compareCandidates(roundTrip(a), roundTrip(a)), /at least one/);
});

Deno.test("two candidate files are not called bit-identical when a tensor is stored in another dtype or shape", async () => {
  const a = await makeCandidate({ ...SMALL, results: ["o", "dq"] });
  const { B, T, HV, V } = SMALL;
  const alike = (change: (m: Map<string, SafetensorsInput>) => void) => {
    const b = new Map(a);
    change(b);
    return () => compareCandidates(roundTrip(a), roundTrip(b));
  };
  const refused = (re: RegExp) => (e: Error) => e instanceof RangeError && re.test(e.message);
  // F32 values are exact in F64: equal after widening, yet another kernel's result
  assert.throws(
    alike((b) => b.set("o", { ...a.get("o")!, dtype: "F64" })),
    refused(
      /^candidate files must store each result in one dtype and shape .*: got o stored as F32 \[2, 23, 2, 3\] in the first file and F64 \[2, 23, 2, 3\] in the second$/,
    ),
  );
  assert.throws(
    alike((b) => b.set("o", { ...a.get("o")!, shape: [B, T, HV * V] })),
    refused(
      /: got o stored as F32 \[2, 23, 2, 3\] in the first file and F32 \[2, 23, 6\] in the second$/,
    ),
  );
  assert.throws(
    alike((b) => b.set("q", { ...a.get("q")!, dtype: "F64" })),
    refused(
      /^candidate files must hold the same inputs .*: got q stored as F32 \[2, 23, 2, 4\] in the first file and F64 \[2, 23, 2, 4\] in the second$/,
    ),
  );
  assert.deepEqual(alike(() => {})(), []);
});

Deno.test("a result of the wrong shape is refused with its own layout's labels, also where K = V and HV = H", async () => {
  const file = await makeCandidate({ ...SMALL, V: SMALL.K });
  const { B, T, H, K } = SMALL;
  // each result's layout, by its name: the sizes cannot tell K from V nor H from HV here
  for (
    const [name, layout] of [
      ["o", "[B, T, HV, V]"],
      ["dq", "[B, T, H, K]"],
      ["dk", "[B, T, H, K]"],
      ["dv", "[B, T, HV, V]"],
      ["dg", "[B, T, HV, K]"],
    ]
  ) {
    const wrong = new Map(file);
    wrong.set(name, { data: new Float32Array(B * T * H * (K - 1)), shape: [B, T, H, K - 1] });
    await assert.rejects(
      () => checkCandidate(roundTrip(wrong)),
      (e: Error) =>
        e instanceof RangeError &&
        e.message ===
          `candidate tensor ${name} must have shape ${layout} = [2, 23, 2, 4]: got [2, 23, 2, 3]`,
      name,
    );
  }
});

Deno.test("a candidate's beta outside [0, 2] is refused by the candidate tensor's name, with no option a file cannot set", async () => {
  for (const [index, value] of [[0, 3], [5, -0.25]]) {
    const file = await makeCandidate(SMALL);
    (file.get("beta")!.data as Float64Array)[index] = value;
    await assert.rejects(
      () => checkCandidate(roundTrip(file)),
      (e: Error) =>
        e instanceof RangeError &&
        /^candidate tensor beta must be in \[0, 2\] everywhere \(.*\): got [-\d.]+ at index \d+$/
          .test(
            e.message,
          ) &&
        e.message.endsWith(`got ${value} at index ${index}`) &&
        !/options\./.test(e.message),
    );
  }
});

// ---- prove --candidate on the command line ----

Deno.test("prove --candidate says where the precision came from, and exits 2 on a file that checks nothing", async () => {
  const bf16 = writeSafetensors(
    await makeCandidate({ ...SMALL, dtype: "BF16", stateDtype: "F32" }),
  );
  const good = await cli(bf16);
  assert.equal(good.code, 0, good.stdout + good.stderr);
  assert.match(good.stdout, /precision bf16 \(from the file's dtypes: q, k, v, g, beta are BF16/);
  assert.match(good.stdout, /^CANDIDATE AGREES$/m);
  const forced = await cli(bf16, "--precision", "f32");
  assert.equal(forced.code, 1);
  assert.match(forced.stdout, /precision f32 \(from --precision; the file's inputs are BF16\)/);
  const empty = await cli(writeSafetensors(zeroFile(0, 5, 2, 4, 3)));
  assert.equal(empty.code, 2, empty.stdout);
  assert.match(empty.stderr, /^prove: candidate .*checks nothing/m);
  assert.doesNotMatch(empty.stdout, /AGREES/);
  // a flag that means nothing for this kind of file is refused, not ignored
  const op = await cli(bf16, "--map", "tests/fixtures/name_map.json");
  assert.equal(op.code, 2, op.stdout);
  assert.match(
    op.stderr,
    /^prove: --map names a layer's parameters and has no effect on an op candidate/m,
  );
  const { file } = await layerCandidate();
  const layerBytes = writeSafetensors(file);
  for (const flag of [["--svg", "x.svg"], ["--chunk-size", "32"]]) {
    const layer = await cli(layerBytes, ...flag);
    assert.equal(layer.code, 2, layer.stdout);
    assert.match(
      layer.stderr,
      new RegExp(
        `^prove: ${flag[0]} places the op's errors by chunk and has no effect on a layer candidate`,
        "m",
      ),
    );
  }
  const layer = await cli(layerBytes);
  assert.equal(layer.code, 0, layer.stdout + layer.stderr);
  assert.match(
    layer.stdout,
    /^note: the file holds no grad\/x, so nothing checks the input's gradient$/m,
  );
});

// ---- flash-linear-attention's real chunk_kda (project issue, item 3) ----

// Written on an H200 by tests/fixtures/make_fla_fixtures.py (fla bc3b101d, Triton 3.6): a batch,
// a packed batch and grouped value heads (HV = 2 H).
const FLA_FIXTURES = [
  "tests/fixtures/fla_chunk_kda_bf16.safetensors",
  "tests/fixtures/fla_chunk_kda_bf16_varlen.safetensors",
  "tests/fixtures/fla_chunk_kda_bf16_gva.safetensors",
];
const FLA_COMMAND = "examples/candidate_from_torch.py --impl fla.ops.kda:chunk_kda --dtype bf16";

Deno.test({
  name:
    "the candidate checker agrees with flash-linear-attention's chunk_kda (bf16) within the bf16 bars, the precision read from the file, packed and with grouped value heads too",
  fn: async () => {
    for (const path of FLA_FIXTURES) {
      let bytes: Uint8Array;
      try {
        bytes = await Deno.readFile(path);
      } catch (error) {
        assert.fail(
          `the fixture ${path} is missing (${(error as Error).message}): write it on a GPU ` +
            `machine with ${FLA_COMMAND}${path.includes("varlen") ? " --B 1 --cu-seqlens …" : ""}`,
        );
      }
      const report = await checkCandidate(readSafetensors(bytes));
      assert.equal(report.precision, "bf16", path);
      assert.match(report.precisionNote, /from the file's dtypes/, path);
      assert.deepEqual(
        report.rows.map((r) => r.name).sort(),
        ["dbeta", "dg", "dh0", "dk", "dq", "dv", "ht", "o"],
        path,
      );
      assert.deepEqual(
        report.rows.filter((r) => !r.ok).map((r) =>
          `${r.name} ${r.agreement.rel.toExponential(2)} > bar ${r.bar.toExponential(2)}`
        ),
        [],
        path,
      );
      assert.deepEqual(report.unused, [], path);
      assert.ok(report.ok, path);
    }
    assert.equal(
      readSafetensors(await Deno.readFile(FLA_FIXTURES[1])).tensors.has("cu_seqlens"),
      true,
      `${FLA_FIXTURES[1]} must be a packed batch (cu_seqlens)`,
    );
    const gva = readSafetensors(await Deno.readFile(FLA_FIXTURES[2])).tensors;
    assert.equal(gva.get("v")!.shape[2], 2 * gva.get("q")!.shape[2], "HV = 2 H in the gva file");
  },
});

// ---- the standing slice of the candidate sweep (`deno task fuzz` runs it at full size) ----

Deno.test("the candidate checker agrees with random valid files, never with a wrong one, and refuses malformed ones by name (seeded slice)", async () => {
  const { cases, failures } = await candidateSweep(1, 20);
  assert.ok(cases >= 20 * 15, `only ${cases} cases`);
  assert.deepEqual(failures, []);
});

// ---- found by the candidate sweep ----

Deno.test("an f32 result in f32's subnormal range is judged at what storing it in f32 allows", async () => {
  // o is linear in v without h0: scaling v by 2^-140 scales o into f32's subnormals (~1e-42),
  // where f32 keeps a few bits only; the candidate stores the exact o in F32.
  const file = await makeCandidate({ ...SMALL, dtype: "F64", h0: false, results: ["o"] });
  for (const name of ["v", "o"]) {
    const t = file.get(name)!;
    file.set(name, {
      ...t,
      data: (t.data as Float64Array).map((x) => x * 2 ** -140),
      dtype: name === "o" ? "F32" : "F64",
    });
  }
  const report = await checkCandidate(roundTrip(file));
  const row = report.rows[0];
  assert.ok(row.agreement.rel > DTYPES.f32.bars!.outputs, `rel ${row.agreement.rel}`);
  assert.ok(row.ok, `rel ${row.agreement.rel} > bar ${row.bar}`);
  // A real error there still fails.
  (file.get("o")!.data as Float64Array)[5] *= 2;
  assert.equal((await checkCandidate(roundTrip(file))).ok, false);
});
