// The standing adversarial suite: every defect found by hostile or careless use, held as a
// regression; seeded slices of the edge sweep of the op (tests/_adversarial.ts), the decode sweep
// (tests/_adversarial_step.ts) and the state-dict sweep (tests/_adversarial_state.ts), which
// `deno task fuzz` runs at full size; and concurrency on shared tapes, compared bit for bit with
// sequential runs.

import assert from "node:assert/strict";
import {
  type Float,
  kda,
  type KdaInputs,
  KdaModule,
  type KdaModuleRunOptions,
  kdaStep,
  kdaVjp,
  resetSeamCounts,
  seamCounts,
  seamDecisions,
} from "../mod.ts";
import { Tape, type Tensor } from "../tape/mod.ts";
import { type KdaRequest, runKda } from "../kda/op/arms.ts";
import type { Arm, KdaProblem } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { gpuLiveBuffers } from "../kda/gpu/mod.ts";
import { checkCase, edgeCase, LAYOUTS } from "./_adversarial.ts";
import { checkStepCase, stepCase } from "./_adversarial_step.ts";
import { checkStateCase, MUTATIONS, stateCase } from "./_adversarial_state.ts";
import { agreement, bitsEqual, randomKda } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu, status } from "./_gpu.ts";

reportMissingGpu("adversarial_test");

const SHAPE = { B: 2, T: 37, H: 2, K: 8, V: 6 };

/** The op recorded on a tape through the seam, with its variables and outputs. */
async function recordOnTape(x: KdaProblem, arm: Arm, tape: Tape) {
  const { B, T, H, K, V } = x;
  const v = (data: Float, shape: number[]) => tape.variable(data, shape);
  const vars = {
    q: v(x.q, [B, T, H, K]),
    k: v(x.k, [B, T, H, K]),
    v: v(x.v, [B, T, H, V]),
    g: v(x.g, [B, T, H, K]),
    beta: v(x.beta, [B, T, H]),
    h0: v(x.h0 ?? new (x.q.constructor as Float64ArrayConstructor)(B * H * K * V), [B, H, K, V]),
  };
  const request: KdaRequest = { B, T, H, K, V, scale: x.scale, chunkSize: 16 };
  const { o, ht } = await runKda(vars, request, { arm, strict: true });
  return { vars, o, ht };
}

function cotangent(x: KdaProblem, seed: number): Float {
  const n = x.B * x.T * x.H * x.V;
  const a = new (x.q.constructor as Float64ArrayConstructor)(n);
  for (let i = 0; i < n; i++) a[i] = Math.sin(0.37 * i + seed);
  return a;
}

function gradsOf(grads: Map<Tensor, Float>, vars: Record<string, Tensor>): Float[] {
  return Object.values(vars).map((t) => grads.get(t)!);
}

function armsHere(): Arm[] {
  return status.available ? ["ops", "cpu", "gpu"] : ["ops", "cpu"];
}

// ---- defects 1 and 2: backward twice, and concurrently, on one tape ----

Deno.test("concurrent and repeated backward on one tape give the bits of sequential runs on every arm", async () => {
  for (const arm of armsHere()) {
    const x = randomKda(SHAPE, 11, { withH0: true, dtype: arm === "gpu" ? "f32" : "f64" });
    const tape = new Tape(arm === "gpu" ? "f32" : "f64");
    try {
      const { vars, o } = await recordOnTape(x, arm, tape);
      const dyA = cotangent(x, 1), dyB = cotangent(x, 2);
      const seqA = gradsOf(await tape.backward(o, dyA), vars);
      const seqB = gradsOf(await tape.backward(o, dyB), vars);
      for (let round = 0; round < 3; round++) {
        const [a, b] = await Promise.all([tape.backward(o, dyA), tape.backward(o, dyB)]);
        gradsOf(a, vars).forEach((g, i) => assert.ok(bitsEqual(g, seqA[i]), `${arm} A #${i}`));
        gradsOf(b, vars).forEach((g, i) => assert.ok(bitsEqual(g, seqB[i]), `${arm} B #${i}`));
      }
      assert.ok(!bitsEqual(seqA[0], seqB[0]), "the two cotangents give different gradients");
    } finally {
      tape.dispose();
    }
  }
});

// ---- defects 3 and 4: extreme gates on the cpu arm ----

Deno.test("kda() cpu arm agrees with ops when one gate is −1e20 among small ones, in f64 and f32", async () => {
  for (const F of [Float64Array, Float32Array]) {
    const x: KdaInputs = {
      B: 1,
      T: 3,
      H: 1,
      K: 1,
      V: 1,
      q: F.from([1, 1, 1]),
      k: F.from([1, 1, 1]),
      v: F.from([1, 2, 3]),
      g: F.from([-1e20, -0.5, -0.5]),
      beta: F.from([0.5, 0.5, 0.5]),
      scale: 1,
    };
    const ops = await kda(x, { arm: "ops" });
    const cpu = await kda(x, { arm: "cpu" });
    const { rel, absDiff, refMax } = agreement(cpu.o, ops.o);
    if (!(rel <= 1e-7)) throw new Error(`${F.name}: o ${rel} (abs ${absDiff}, ref ${refMax})`);
    assert.ok(Math.abs(ops.o[1] - 1.1516) < 1e-4, `ops o[1] = ${ops.o[1]}`);
  }
});

Deno.test("kda() and kdaVjp() cpu arm stay finite and agree with ops for g = −1e308 and −1.2e307 in f64", async () => {
  for (const gate of [-1e308, -1.2e307]) {
    const x = randomKda({ B: 1, T: 40, H: 1, K: 3, V: 2 }, 5, { withH0: true });
    for (let i = 0; i < x.g.length; i += 7) x.g[i] = gate;
    const dout = cotangent(x, 3);
    for (const chunkSize of [16, 32, 64] as const) {
      const ops = await kdaVjp(x, { dout }, { arm: "ops" });
      const cpu = await kdaVjp(x, { dout }, { arm: "cpu", chunkSize });
      const outOps = await kda(x, { arm: "ops" }), outCpu = await kda(x, { arm: "cpu", chunkSize });
      for (
        const [name, a, b] of [
          ["o", outCpu.o, outOps.o],
          ["ht", outCpu.ht, outOps.ht],
          ...GRAD_NAMES.map((n) => [n, cpu[n], ops[n]] as const),
        ] as const
      ) {
        const { rel, absDiff, refMax } = agreement(a, b);
        if (!(rel <= 1e-10)) {
          throw new Error(
            `g=${gate} C=${chunkSize} ${name}: ${rel} (abs ${absDiff}, ref ${refMax})`,
          );
        }
      }
    }
  }
});

// ---- defect 5: nothing leaks when the tape is already disposed ----

gpuTest("a gpu call recorded on a disposed tape throws and leaks no device buffer", async () => {
  const x = randomKda(SHAPE, 12, { dtype: "f32" });
  const before = gpuLiveBuffers();
  const tape = new Tape("f32");
  const { B, T, H, K, V } = x;
  const vars = {
    q: tape.variable(x.q, [B, T, H, K]),
    k: tape.variable(x.k, [B, T, H, K]),
    v: tape.variable(x.v, [B, T, H, V]),
    g: tape.variable(x.g, [B, T, H, K]),
    beta: tape.variable(x.beta, [B, T, H]),
  };
  tape.dispose();
  for (let i = 0; i < 3; i++) {
    await assert.rejects(
      () => runKda(vars, { B, T, H, K, V, scale: x.scale, chunkSize: 16 }, { arm: "gpu" }),
      /disposed tape/,
    );
  }
  assert.equal(gpuLiveBuffers(), before);
});

// ---- defect 6: every returned array owns its buffer ----

Deno.test("kda() and kdaVjp() return arrays that each own their whole buffer, on every arm", async () => {
  for (const arm of armsHere()) {
    const x = randomKda(SHAPE, 13, { withH0: true, dtype: arm === "gpu" ? "f32" : "f64" });
    const { o, ht } = await kda(x, { arm, strict: true });
    const grads = await kdaVjp(x, { dout: cotangent(x, 4) }, { arm, strict: true });
    const arrays: [string, Float][] = [
      ["o", o],
      ["ht", ht],
      ...GRAD_NAMES.map((n) => [n, grads[n]] as [string, Float]),
    ];
    const buffers = new Set<ArrayBufferLike>();
    for (const [name, a] of arrays) {
      assert.equal(a.byteOffset, 0, `${arm} ${name} starts its buffer`);
      assert.equal(a.buffer.byteLength, a.byteLength, `${arm} ${name} fills its buffer`);
      assert.ok(!buffers.has(a.buffer), `${arm} ${name} shares a buffer`);
      buffers.add(a.buffer);
    }
    // Transferring one output leaves the other intact.
    const htCopy = ht.slice();
    structuredClone(o, { transfer: [o.buffer as ArrayBuffer] });
    assert.ok(bitsEqual(ht, htCopy));
  }
});

// ---- defect 7: a scale that is finite in f64 but not in f32 ----

gpuTest(
  "a scale that overflows f32 declines the gpu arm with the reason, and strict mode refuses it",
  async () => {
    const x = { ...randomKda({ B: 1, T: 5, H: 1, K: 2, V: 2 }, 14, { dtype: "f32" }), scale: 1e39 };
    for (let i = 0; i < x.q.length; i++) x.q[i] *= 1e-40;
    resetSeamCounts();
    const viaGpu = await kda(x, { arm: "gpu", quiet: true });
    const viaCpu = await kda(x, { arm: "cpu" });
    assert.ok(viaGpu.o.every(Number.isFinite), "finite outputs");
    assert.ok(bitsEqual(viaGpu.o, viaCpu.o));
    const [d] = seamDecisions();
    assert.deepEqual([d.wanted, d.ran], ["gpu", "cpu"]);
    assert.match(d.reason, /scale/);
    await assert.rejects(() => kda(x, { arm: "gpu", strict: true }), /scale/);
  },
);

// ---- defect 8: an unreadable policy variable is named, not lost ----

Deno.test("KDA_REQUIRE_ARM without env permission is named in the decision and on stderr", async () => {
  const probe = new URL("./_env_probe.ts", import.meta.url);
  for (const flags of [[], ["--allow-env=KDA_ARM"]]) {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--no-prompt", "--allow-read", ...flags, probe.pathname],
      env: { KDA_REQUIRE_ARM: "gpu", NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stdout = new TextDecoder().decode(out.stdout);
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    const decisions = JSON.parse(stdout) as { reason: string }[];
    assert.ok(
      decisions.some((d) => /KDA_REQUIRE_ARM .*could not be read/.test(d.reason)),
      stdout,
    );
    assert.match(stderr, /KDA_REQUIRE_ARM .*could not be read/);
  }
});

Deno.test("without env permission a process says so in one line at most, and not at all when the variables could not matter", async () => {
  const probe = new URL("./_env_probe.ts", import.meta.url);
  const run = async (mode: string) => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "--no-prompt", "--allow-read", probe.pathname, mode],
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    const decisions = JSON.parse(new TextDecoder().decode(out.stdout)) as { reason: string }[];
    return { stderr: stderr.split("\n").filter((l) => l !== ""), decisions };
  };
  const unreadable = /could not be read/;
  // Calls of every kind, two of them naming no arm and one declining: one line about the variables.
  const many = await run("many");
  assert.equal(many.stderr.filter((l) => unreadable.test(l)).length, 1, many.stderr.join("\n"));
  assert.match(many.stderr.find((l) => unreadable.test(l))!, /KDA_REQUIRE_ARM and KDA_ARM/);
  // The decline's own line names its reason, not the variables again.
  assert.ok(many.stderr.some((l) => /gpu arm was wanted but the cpu arm ran/.test(l)));
  // Each call the variables could have changed says so in its decision; the call that named cpu
  // and ran it did not depend on them, and the decline only on the require variable.
  const noted = many.decisions.filter((d) => unreadable.test(d.reason)).map((d) => d.reason);
  assert.equal(noted.length, 3, JSON.stringify(many.decisions));
  assert.match(noted[2], /KDA_REQUIRE_ARM could not be read .*so it is not honoured/);
  // Arm and strict named: no variable could change the outcome, so nothing is said.
  const explicit = await run("explicit");
  assert.deepEqual(explicit.stderr, []);
  assert.deepEqual(explicit.decisions.filter((d) => unreadable.test(d.reason)), []);
});

// ---- the smaller items ----

Deno.test("the decision log is bounded and keeps the running total in each entry's index", async () => {
  const prev = Deno.env.get("KDA_ARM");
  Deno.env.set("KDA_ARM", "ops");
  try {
    resetSeamCounts();
    const x = randomKda({ B: 1, T: 2, H: 1, K: 2, V: 2 }, 15);
    for (let i = 0; i < 200; i++) await kda(x, { quiet: true });
    const log = seamDecisions();
    assert.ok(log.length <= 64, `${log.length} entries kept`);
    assert.equal(log[log.length - 1].index, 200);
    assert.equal(seamCounts().declined, 200);
  } finally {
    if (prev === undefined) Deno.env.delete("KDA_ARM");
    else Deno.env.set("KDA_ARM", prev);
  }
});

Deno.test("unknown fields in inputs, cotangents and options are refused, naming the key and the nearest known one", async () => {
  const x = randomKda({ B: 1, T: 3, H: 1, K: 2, V: 2 }, 16);
  const dout = cotangent(x, 5);
  const typo = (p: Promise<unknown>, re: RegExp) =>
    assert.rejects(p, (e: Error) => e instanceof TypeError && re.test(e.message));
  await typo(kda(x, { chunksize: 64 } as never), /options\.chunksize .*did you mean chunkSize/);
  await typo(kda({ ...x, betas: x.beta } as never), /inputs\.betas .*did you mean beta/);
  await typo(kdaVjp(x, { dout, dh: dout } as never), /cotangents\.dh .*did you mean dht/);
  const layer = new KdaModule({ dModel: 4, heads: 1, keyDim: 2, valueDim: 2, decayRank: 1 });
  await typo(
    layer.forward(new Float64Array(12), [1, 3], { arms: "cpu" } as KdaModuleRunOptions),
    /options\.arms .*did you mean arm/,
  );
  assert.throws(
    () => new KdaModule({}, { dtyp: "f32" } as never),
    /options\.dtyp .*did you mean dtype/,
  );
});

Deno.test("flash-linear-attention's names for inputs, cotangents and options are refused, pointing to this package's name for the same thing", async () => {
  const x = randomKda({ B: 1, T: 3, H: 1, K: 2, V: 2 }, 16);
  const dout = cotangent(x, 5);
  /** The refusal of `foreign` in `where`, naming `ours` as this package's field for it. */
  const refused = (p: Promise<unknown>, where: string, foreign: string, ours: string) =>
    assert.rejects(
      p,
      (e: Error) =>
        e instanceof TypeError &&
        e.message.startsWith(`${where}.${foreign} is not a known field: expected one of `) &&
        e.message.endsWith(`(${where}.${ours} is this package's name for it)`),
      `${where}.${foreign}`,
    );
  const withInput = (key: string, value: unknown) => kda({ ...x, [key]: value } as never);
  await refused(withInput("initial_state", new Float64Array(4)), "inputs", "initial_state", "h0");
  await refused(
    withInput("cu_seqlens", new Int32Array([0, 3])),
    "inputs",
    "cu_seqlens",
    "cuSeqlens",
  );
  await refused(withInput("A_log", new Float64Array(1)), "inputs", "A_log", "aLog");
  await refused(withInput("dt_bias", new Float64Array(2)), "inputs", "dt_bias", "dtBias");
  const withOption = (key: string, value: unknown) => kda(x, { [key]: value } as never);
  await refused(withOption("chunk_size", 64), "options", "chunk_size", "chunkSize");
  await refused(
    withOption("output_final_state", false),
    "options",
    "output_final_state",
    "outputFinalState",
  );
  await refused(
    withOption("use_qk_l2norm_in_kernel", true),
    "options",
    "use_qk_l2norm_in_kernel",
    "useQkL2NormInKernel",
  );
  await refused(
    withOption("allow_neg_eigval", true),
    "options",
    "allow_neg_eigval",
    "allowNegEigval",
  );
  await refused(kdaVjp(x, { do: dout } as never), "cotangents", "do", "dout");
});

Deno.test("a field of the inputs given as an option, or of the options given as an input, is refused, pointing to where it goes", async () => {
  const x = randomKda({ B: 1, T: 3, H: 1, K: 2, V: 2 }, 16);
  const misplaced = (p: Promise<unknown>, key: string, hint: string) =>
    assert.rejects(
      p,
      (e: Error) =>
        e instanceof TypeError && e.message.startsWith(`${key} is not a known field`) &&
        e.message.endsWith(`(${hint})`),
      key,
    );
  // fla passes these to chunk_kda as keywords beside its tensors: here they are inputs
  await misplaced(kda(x, { scale: 0.5 } as never), "options.scale", "it belongs in inputs.scale");
  await misplaced(kda(x, { h0: x.q } as never), "options.h0", "it belongs in inputs.h0");
  await misplaced(
    kda(x, { initial_state: x.q } as never),
    "options.initial_state",
    "inputs.h0 is this package's name for it",
  );
  await misplaced(
    kda(x, { A_log: x.q } as never),
    "options.A_log",
    "inputs.aLog is this package's name for it",
  );
  await misplaced(kda(x, { scael: 1 } as never), "options.scael", "did you mean inputs.scale?");
  await misplaced(kda(x, { dout: x.v } as never), "options.dout", "it belongs in cotangents.dout");
  // a one-letter field of another argument (T, B, q) draws no key that is not close to it
  await misplaced(kda(x, { x: 1 } as never), "options.x", "did you mean arm?");
  await misplaced(kda(x, { dot: 1 } as never), "options.dot", "did you mean cotangents.dout?");
  await misplaced(
    kda({ ...x, outputFinalState: false } as never),
    "inputs.outputFinalState",
    "it belongs in options.outputFinalState",
  );
  await misplaced(
    kda({ ...x, chunk_size: 16 } as never),
    "inputs.chunk_size",
    "options.chunkSize is this package's name for it",
  );
  const t = (n: number) => new Float64Array(n).fill(0.1);
  const token = {
    B: 1,
    H: 1,
    K: 2,
    V: 2,
    q: t(2),
    k: t(2),
    v: t(2),
    g: t(2).fill(-0.1),
    beta: t(1),
  };
  await misplaced(
    kdaStep(t(4), token, { scale: 1 } as never),
    "options.scale",
    "it belongs in token.scale",
  );
  await misplaced(
    kdaStep(t(4), { ...token, arm: "cpu" } as never, {}),
    "token.arm",
    "it belongs in options.arm",
  );
  await misplaced(
    kdaStep(t(4), token, { h0: t(4) } as never),
    "options.h0",
    "it belongs in the state (kdaStep's first argument)",
  );
});

Deno.test("a KdaModule parameter set to NaN or Inf is named with its index, unless the scan is skipped", async () => {
  const layer = new KdaModule({ dModel: 4, heads: 1, keyDim: 2, valueDim: 2, decayRank: 1 });
  const x = new Float64Array(12).fill(0.1);
  layer.parameters().get("decay.w_up.weight")!.data[1] = NaN;
  await assert.rejects(
    () => layer.forward(x, [1, 3], { arm: "cpu" }),
    (e: Error) =>
      e instanceof RangeError && /parameter decay\.w_up\.weight must be finite: got NaN at index 1/
        .test(e.message),
  );
  layer.parameters().get("decay.w_up.weight")!.data[1] = 0;
  layer.parameters().get("o_proj.weight")!.data[3] = Infinity;
  await assert.rejects(
    () => layer.vjp(x, [1, 3], x, { arm: "cpu" }),
    /parameter o_proj\.weight must be finite: got Infinity at index 3/,
  );
  const y = await layer.forward(x, [1, 3], { arm: "cpu", checkParameters: false });
  assert.ok(!y.every(Number.isFinite), "without the scan the bad value flows through");
});

Deno.test("each distinct decline is said once per process on stderr, and quiet silences it", async () => {
  const said: string[] = [];
  const original = console.error;
  console.error = (...args: unknown[]) => said.push(args.join(" "));
  try {
    const x = randomKda({ B: 1, T: 3, H: 1, K: 300, V: 2 }, 17);
    await kda(x, { arm: "cpu" });
    await kda(x, { arm: "cpu" });
    const y = randomKda({ B: 1, T: 3, H: 1, K: 2, V: 301 }, 18);
    await kda(y, { arm: "cpu", quiet: true });
  } finally {
    console.error = original;
  }
  const declines = said.filter((s) => /the cpu arm was wanted but the ops arm ran/.test(s));
  assert.equal(declines.length, 1, said.join("\n"));
  assert.match(declines[0], /K = 300/);
});

Deno.test("the default arm for f32 work follows the adapter kind and a software adapter's choice is recorded", async () => {
  const x = randomKda({ B: 1, T: 3, H: 1, K: 2, V: 2 }, 19, { dtype: "f32" });
  resetSeamCounts();
  const out: { o: Float32Array } = await kda(x as KdaProblem<Float32Array>);
  assert.ok(out.o instanceof Float32Array);
  const c = seamCounts();
  if (status.available && status.info.software) {
    assert.equal(c.declined, 0);
    const [d] = seamDecisions();
    assert.deepEqual([d.wanted, d.ran], ["cpu", "cpu"]);
    assert.match(d.reason, /software adapter/);
  } else if (status.available) {
    assert.deepEqual([c.declined, c.fusedFwd], [0, 1]);
  } else {
    assert.equal(c.declined, 1);
  }
});

// ---- the edge sweep and concurrency ----

Deno.test("a seeded slice of the edge sweep (regular, packed with zero-length sequences, grouped value heads, strong gates): cpu agrees with ops in f64 and gpu with cpu in f32", async () => {
  const failures: string[] = [];
  const worst: Record<string, number> = {};
  const seen = new Set<string>();
  for (let i = 0; i < 24; i++) {
    const c = edgeCase(20261130, i);
    seen.add(c.label.split(" ")[1] + (c.strong ? " strong" : ""));
    if (c.problem.cuSeqlens?.some((v, j, a) => j > 0 && v === a[j - 1])) seen.add("empty sequence");
    const r = await checkCase(c, status.available);
    failures.push(...r.disagreements.map((d) => `${d.label} ${d.pair} ${d.tensor}: ${d.detail}`));
    for (const [pair, w] of Object.entries(r.worst)) worst[pair] = Math.max(worst[pair] ?? 0, w);
  }
  console.log(`  worst: ${JSON.stringify(worst)}`);
  assert.deepEqual(failures, []);
  // The slice covers every layout, in both gate regimes, and at least one empty sequence.
  for (const layout of LAYOUTS) {
    assert.ok(seen.has(layout) && seen.has(`${layout} strong`), `the slice has no ${layout} case`);
  }
  assert.ok(seen.has("empty sequence"), "the slice has no zero-length sequence");
});

Deno.test("a seeded slice of the decode sweep: kdaStep chains on the cpu and ops arms equal the op on the whole sequence in f64 (K = 257 and grouped heads included), the gpu chain the cpu chain in f32", async () => {
  const failures: string[] = [];
  const worst: Record<string, number> = {};
  let wide = 0, grouped = 0;
  for (let i = 0; i < 12; i++) {
    const c = stepCase(20261130, i);
    if (c.x.K > 256) wide++;
    if (c.x.HV !== undefined) grouped++;
    const r = await checkStepCase(c, status.available);
    failures.push(...r.disagreements.map((d) => `${d.label} ${d.pair} ${d.tensor}: ${d.detail}`));
    for (const [pair, w] of Object.entries(r.worst)) worst[pair] = Math.max(worst[pair] ?? 0, w);
  }
  console.log(`  worst: ${JSON.stringify(worst)}`);
  assert.deepEqual(failures, []);
  assert.ok(wide > 0 && grouped > 0, `the slice has ${wide} K > 256 and ${grouped} grouped cases`);
});

Deno.test("a seeded slice of the state-dict sweep: valid dicts load exactly and round-trip, invalid dicts and files are refused by name with nothing loaded and no random draw, optimizer steps are all or nothing", () => {
  const failures: string[] = [];
  for (let i = 0; i < 3 * MUTATIONS.length; i++) {
    failures.push(...checkStateCase(stateCase(20261130, i)));
  }
  assert.deepEqual(failures, []);
});

Deno.test("concurrent calls of mixed arms and shapes give the bits of sequential calls", async () => {
  const shapes = [SHAPE, { B: 1, T: 70, H: 3, K: 5, V: 9 }, { B: 3, T: 1, H: 1, K: 4, V: 4 }];
  const calls: (() => Promise<Float[]>)[] = [];
  for (const [i, shape] of shapes.entries()) {
    for (const arm of armsHere()) {
      const x = randomKda(shape, 30 + i, {
        withH0: i % 2 === 0,
        dtype: arm === "gpu" ? "f32" : "f64",
      });
      const dout = cotangent(x, i);
      calls.push(async () => {
        const { o, ht } = await kda(x, { arm, strict: true });
        const g = await kdaVjp(x, { dout }, { arm, strict: true, chunkSize: 32 });
        return [o, ht, ...GRAD_NAMES.map((n) => g[n])];
      });
    }
  }
  const sequential: Float[][] = [];
  for (const call of calls) sequential.push(await call());
  const concurrent = await Promise.all(calls.map((call) => call()));
  concurrent.forEach((arrays, i) =>
    arrays.forEach((a, j) => assert.ok(bitsEqual(a, sequential[i][j]), `call ${i} array ${j}`))
  );
});

Deno.test("a KdaModule a_log (the Kimi form's A_log) whose exp overflows the layer's dtype is refused by name before running (it gave NaN gradients)", async () => {
  const forms = [
    {
      group: "decay.a_log",
      doc: "2.4",
      config: { dModel: 4, heads: 2, keyDim: 2, valueDim: 2, decayRank: 1 },
    },
    {
      group: "A_log",
      doc: "2.9",
      config: { form: "kimi", dModel: 4, heads: 1, numVHeads: 2, keyDim: 2, valueDim: 2 },
    },
  ] as const;
  for (const { group, doc, config } of forms) {
    for (const dtype of ["f64", "f32"] as const) {
      const limit = dtype === "f64" ? "709.782712893384" : "88.72283905206835";
      const layer = new KdaModule(config, { dtype });
      const x64 = Float64Array.from({ length: 12 }, (_, i) => Math.sin(i));
      const x = dtype === "f64" ? x64 : Float32Array.from(x64);
      const aLog = layer.parameters().get(group)!.data;
      aLog[1] = dtype === "f64" ? 1e30 : 100;
      // Unscanned, the forward is finite but the backward multiplies Infinity by zero.
      const { y, grads: bad } = await layer.vjp(x, [1, 3], x, {
        arm: "cpu",
        checkParameters: false,
      });
      assert.ok(y.every(Number.isFinite), `${group} ${dtype}: y is finite`);
      assert.ok([...bad.values()].some((g) => g.some(Number.isNaN)), `${group} ${dtype}: NaN`);
      const message = `parameter ${group} must be at most ${limit}, where exp(${group}) stays ` +
        `finite in ${dtype}: got ${aLog[1]} at index 1 (exp(${group}) is the decay's ` +
        `sharpness, docs/kda.md ${doc})`;
      await assert.rejects(() => layer.vjp(x, [1, 3], x, { arm: "cpu" }), {
        name: "RangeError",
        message,
      });
      await assert.rejects(() => layer.forward(x, [1, 3], { arm: "ops" }), {
        name: "RangeError",
        message,
      });
      // Just inside the limit the gradients are finite: exp(a_log) is finite, nothing is Inf · 0.
      aLog[1] = dtype === "f64" ? 709 : 88.5;
      const { grads } = await layer.vjp(x, [1, 3], x, { arm: "cpu" });
      for (const [name, g] of grads) {
        assert.ok(g.every(Number.isFinite), `${group} ${dtype} ${name} is finite`);
      }
    }
  }
});
