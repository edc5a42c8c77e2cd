import assert from "node:assert/strict";
import { provenRun, runProof } from "../checks/prove.ts";
import {
  CONV_GROUPS,
  EXPECTED_GROUPS,
  KIMI_CONV_BIAS_GROUPS,
  KIMI_CONV_GROUPS,
  KIMI_EXPECTED_GROUPS,
} from "../checks/_proof_report.ts";
import { MUTANTS } from "../checks/mutants.ts";
import { proveGradients } from "../checks/mod.ts";
import { customNode, linear, mul, sigmoid, sum, Tensor } from "../tape/mod.ts";
import {
  agreement,
  derivedStep,
  probeCoordinate,
  probeIndices,
  resolvableFloor,
} from "../checks/compare.ts";
import {
  COLUMNS,
  COMPACT_COLUMNS,
  printKillTable,
  printReport,
  WIDTH,
  wrapLine,
} from "../checks/report.ts";
import type { ProofReport } from "../checks/_proof_report.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

/** What printReport prints, line by line. */
function printed(report: ProofReport, options: { wide?: boolean } = {}): string[] {
  const lines: string[] = [];
  printReport(report, "text", (l) => lines.push(...l.split("\n")), options);
  return lines;
}

/** The lines longer than the default width. */
const tooLong = (lines: string[]) => lines.filter((l) => l.length > WIDTH);

const small = { dModel: 16, heads: 2, keyDim: 8, valueDim: 8, decayRank: 4 };

Deno.test("runProof() holds on the cpu arm: every group and the input x resolved, falsification red, rerun identical", async () => {
  const report = await runProof({ arm: "cpu", config: small, dims: [2, 40] });
  assert.deepEqual(report.groups, { missing: [], extra: [] });
  assert.equal(report.rows.length, EXPECTED_GROUPS.length);
  assert.equal(report.input.name, "x");
  assert.deepEqual(report.input.shape, [2, 40, small.dModel]);
  if (!(report.input.reference.rel <= 1e-10)) throw new Error(`x: ${report.input.reference.rel}`);
  for (const row of [...report.rows, report.input]) {
    assert.ok(row.fd?.resolved, `${row.name} unresolved`);
    if (!(row.fd!.rel <= 1e-6)) throw new Error(`${row.name}: rel ${row.fd!.rel}`);
    if (!(row.directional!.rel <= 1e-10)) {
      throw new Error(`${row.name}: directional ${row.directional!.rel}`);
    }
  }
  assert.ok(report.op.ok, JSON.stringify(report.op.rows.filter((r) => !r.ok)));
  if (!(report.op.transpose.rel <= 1e-12)) throw new Error(`transpose ${report.op.transpose.rel}`);
  assert.ok(report.falsification.ok);
  assert.equal(report.falsification.red.length, 9); // the 8 groups upstream of the op, and x
  assert.ok(report.reproducible.ok);
  assert.equal(report.seam.fusedFwd, 1);
  assert.equal(report.seam.customNodeBwd, 1);
  assert.equal(report.seam.opsPath, 0);
  assert.ok(report.ok);
});

Deno.test("runProof() with the short conv proves 14 groups", async () => {
  const report = await runProof({
    arm: "cpu",
    config: { ...small, shortConv: true },
    dims: [1, 24],
  });
  assert.deepEqual(
    report.rows.map((r) => r.name).sort(),
    [...EXPECTED_GROUPS, ...CONV_GROUPS].sort(),
  );
  assert.ok(report.ok, JSON.stringify(report.rows.filter((r) => !r.ok)));
});

Deno.test("the falsification goes red: detached outputs zero every upstream group and leave x its path around the op only", async () => {
  const report = await runProof({ arm: "cpu", config: small, dims: [1, 20] });
  assert.deepEqual(
    report.falsification.red.sort(),
    [
      ...EXPECTED_GROUPS.filter((n) => !["o_norm_w", "o_gate.weight", "o_proj.weight"].includes(n)),
      "x",
    ].sort(),
  );
});

Deno.test("runProof() on a Kimi Linear config proves fla's groups and x, the falsification turns the groups before the op and x red, and the detached mutant is diagnosed as a cut", async () => {
  const kimi = {
    form: "kimi" as const,
    dModel: 12,
    heads: 1,
    numVHeads: 2,
    keyDim: 4,
    valueDim: 6,
    convBias: true,
    allowNegEigval: true,
  };
  const report = await runProof({ arm: "cpu", config: kimi, dims: [1, 24] });
  assert.deepEqual(
    report.rows.map((r) => r.name).sort(),
    [...KIMI_EXPECTED_GROUPS, ...KIMI_CONV_GROUPS, ...KIMI_CONV_BIAS_GROUPS].sort(),
  );
  assert.ok(report.ok, JSON.stringify([...report.rows, report.input].filter((r) => !r.ok)));
  const after = [
    "g_proj.0.weight",
    "g_proj.1.weight",
    "g_proj.1.bias",
    "o_norm.weight",
    "o_proj.weight",
  ];
  assert.deepEqual(
    report.falsification.red.sort(),
    [...report.rows.map((r) => r.name).filter((n) => !after.includes(n)), "x"].sort(),
  );
  const detached = MUTANTS.find((m) => m.name === "detached")!;
  const cut = await runProof({
    arm: "cpu",
    config: kimi,
    dims: [1, 24],
    checks: { fd: false, fd32: false, directional: false },
    defect: detached.make(),
  });
  assert.match(
    cut.diagnosis ?? "",
    /^The graph is cut at the op: the 14 groups upstream of it have no gradient and dx keeps only its paths around it .*, while the 5 applied after it agree$/,
  );
});

Deno.test("the proof's text fits 100 characters by default, and --wide prints every column and probe", async () => {
  const report = await runProof({ arm: "cpu", config: small, dims: [1, 20] });
  const compact = printed(report);
  assert.deepEqual(tooLong(compact), []);
  const header = compact.find((l) => l.startsWith("group "))!;
  // An f64 arm has no own-precision column to show.
  assert.deepEqual(
    header.split(/\s{2,}/),
    COMPACT_COLUMNS.map(([c]) => c).filter((c) => c !== "f32 resolves"),
  );
  const wide = printed(report, { wide: true });
  const wideHeader = wide.find((l) => l.startsWith("group "))!;
  assert.deepEqual(wideHeader.trim().split(/\s{2,}/), COLUMNS.map(([c]) => c));
  // Every probe with its index, and the unwrapped lines, are in the wide output only.
  const row = wide.find((l) => l.startsWith("q_proj.weight"))!;
  assert.equal(row.match(/@\d+/g)!.length, 3);
  assert.ok(tooLong(wide).length > 0, "the wide output is wider than the default");
  assert.equal(compact.find((l) => l.startsWith("q_proj.weight"))!.match(/@\d+/g), null);
});

Deno.test("wrapLine() breaks at spaces within the width and the kill table's text fits it", () => {
  const words = Array.from({ length: 60 }, (_, i) => `w${i}`).join(" ");
  const pieces = wrapLine(words, 40, "    ");
  assert.ok(pieces.every((p) => p.length <= 40));
  assert.ok(pieces.slice(1).every((p) => p.startsWith("    ")));
  assert.equal(pieces.map((p) => p.trim()).join(" "), words);
  // A line's own indent stays on its first piece.
  const indented = wrapLine(`      ${words}`, 40, "    ");
  assert.ok(indented[0].startsWith("      w0 "), indented[0]);
  assert.ok(indented.every((p) => p.length <= 40));
  const row = {
    mutant: "fused-discarded",
    description: "a fused forward runs, its result is discarded and the ops path carries the step",
    caught: true,
    by: "seam counters",
    diagnosis: "A fused forward was discarded: ".padEnd(160, "x y "),
    expected: true,
  };
  const lines: string[] = [];
  printKillTable([row], "text", (l) => lines.push(...l.split("\n")));
  assert.deepEqual(tooLong(lines), []);
  const wide: string[] = [];
  printKillTable([row], "text", (l) => wide.push(...l.split("\n")), { wide: true });
  assert.equal(wide.length, 2);
  assert.equal(lines.map((l) => l.trim()).join(" "), wide.map((l) => l.trim()).join(" "));
  // The mark column stays clear: every line after a row's first is indented under the text.
  assert.ok(lines.slice(1).every((l) => l.startsWith("".padEnd(22))), lines.join("\n"));
});

Deno.test("agreement() reports NaN as a failure and keeps both magnitudes", () => {
  const nan = agreement([1, NaN], [1, 2]);
  assert.ok(!(nan.rel <= 1));
  const a = agreement([1, 2.5], [1, 2]);
  assert.equal(a.absDiff, 0.5);
  assert.equal(a.refMax, 2);
  assert.equal(a.rel, 0.25);
  assert.equal(agreement([1], [0]).rel, Infinity);
  assert.throws(() => agreement([1], [1, 2]), RangeError);
});

Deno.test("probeCoordinate() refuses to judge a derivative below the resolvable floor", async () => {
  // L(θ) = 1e3 + 1e-12·θ: the slope is far below what rounding of a loss of size 1e3 resolves.
  const probe = await probeCoordinate(
    (d) => Promise.resolve(1e3 + 1e-12 * d),
    1e-12,
    0,
    1e-3,
    Number.EPSILON,
    1e3,
  );
  assert.equal(probe.resolved, false);
  assert.ok(Number.isNaN(probe.rel));
  assert.ok(probe.floor[0] > 1e-12);
  // A resolvable slope with a wrong claimed gradient gives a large relative error.
  const wrong = await probeCoordinate((d) => Promise.resolve(3 * d), 2, 0, 1e-3, Number.EPSILON, 1);
  assert.ok(wrong.resolved);
  assert.ok(Math.abs(wrong.rel - 0.5) < 1e-9);
});

Deno.test("derivedStep() and resolvableFloor() follow docs/kda.md 4", () => {
  const h = derivedStep(Number.EPSILON, 10, 2, 1);
  assert.ok(Math.abs(h - Math.cbrt(3 * Number.EPSILON * 10 / 2)) < 1e-18);
  assert.equal(derivedStep(Number.EPSILON, 1e30, 1e-30, 0.02), 0.002);
  assert.equal(resolvableFloor(Number.EPSILON, 4, 1e-3), 32 * Number.EPSILON * 4 / 1e-3);
});

Deno.test("probeIndices() picks the argmax and two large coordinates spread over the tensor", () => {
  assert.deepEqual(probeIndices([0.1, 5, 0.2, 3, 0.01, 2, 0.3]), [1, 3, 5]);
  assert.deepEqual(probeIndices([0, 1]), [1]);
});

reportMissingGpu("prove_test");
gpuTest("runProof() holds on the gpu arm against the f64 reference on the same bytes", async () => {
  const report = await runProof({ arm: "gpu", config: small, dims: [2, 40] });
  assert.equal(report.dtype, "f32");
  assert.ok(report.forward.ok, `forward ${report.forward.rel}`);
  for (const row of report.rows) assert.ok(row.ok, `${row.name} ${JSON.stringify(row)}`);
  assert.ok(report.op.ok, JSON.stringify(report.op.rows));
  assert.ok(report.falsification.ok);
  assert.ok(report.reproducible.ok, JSON.stringify(report.reproducible.mismatched));
  assert.equal(report.seam.opsPath, 0);
  assert.equal(report.seam.declined, 0);
  assert.ok(report.ok);
  // The f32 arm's own-precision column fits the default width too, and says what f32 resolves.
  const lines = printed(report);
  assert.deepEqual(tooLong(lines), []);
  assert.ok(lines.find((l) => l.startsWith("group "))!.includes("f32 resolves"));
  for (const row of report.rows) {
    const cell = lines.find((l) => l.startsWith(`${row.name} `))!;
    const resolved = row.fd32!.probes.filter((p) => p.resolved).length;
    assert.match(cell, new RegExp(` ${resolved}/${row.fd32!.probes.length}[ ,]`), cell);
  }
});

gpuTest(
  "runProof() proves the kernel set it is asked for: each set with a backward, named in the report and held to the seam's variant count",
  async () => {
    for (const kernels of ["fused", "split"]) {
      const report = await runProof({
        arm: "gpu",
        kernels,
        config: small,
        dims: [1, 40],
        checks: { fd: false, fd32: false, directional: false },
      });
      assert.deepEqual(report.kernels, [kernels]);
      assert.match(report.seamExpected, new RegExp(`variants gpu:${kernels} 1`));
      assert.ok(report.seamOk, JSON.stringify(report.seam));
      assert.ok(report.ok, `${kernels}: ${report.diagnosis}`);
      assert.match(printed(report)[0], new RegExp(`kernel set ${kernels}\\)`));
    }
  },
);

Deno.test("every planted mutant makes the proof fail with its expected diagnosis (cpu arm)", async () => {
  const caught: string[] = [];
  for (const mutant of MUTANTS) {
    const report = await runProof({
      arm: "cpu",
      config: small,
      dims: [1, 40],
      checks: { fd: false, fd32: false, directional: false },
      defect: mutant.make(),
    });
    assert.equal(report.ok, false, `${mutant.name} survived`);
    assert.match(report.diagnosis ?? "", mutant.expected, `${mutant.name}: ${report.diagnosis}`);
    caught.push(mutant.name);
  }
  assert.equal(caught.length, 9);
});

Deno.test("the diagnosis names the first differing group of a non-deterministic backward", async () => {
  const noisy = MUTANTS.find((m) => m.name === "noisy-backward")!;
  const report = await runProof({
    arm: "cpu",
    config: small,
    dims: [1, 20],
    repeat: 2,
    checks: { fd: false, fd32: false, directional: false },
    defect: noisy.make(),
  });
  assert.match(report.diagnosis!, /^Non-deterministic: reruns differ, first in \S+ \(max\|Δ\| /);
  assert.equal(report.reproducible.runs, 2);
});

Deno.test("a second process gives the same bits, and a differing one is reported", async () => {
  const options = { arm: "cpu" as const, config: small, dims: [1, 20] as [number, number] };
  const same = await runProof({
    ...options,
    checks: { fd: false, fd32: false, directional: false },
    otherProcess: () => provenRun(options),
  });
  assert.equal(same.reproducible.otherProcess, "identical");
  const differs = await runProof({
    ...options,
    checks: { fd: false, fd32: false, directional: false },
    otherProcess: async () => {
      const run = await provenRun(options);
      run.get("decay.a_log")![0] += 1e-9;
      return run;
    },
  });
  assert.equal(differs.reproducible.otherProcess, "differs");
  assert.match(differs.diagnosis!, /^Non-deterministic: reruns differ, first in decay\.a_log/);
});

Deno.test("proveGradients() holds on a small layer and flags only the group behind a wrong custom VJP", async () => {
  const x = new Tensor(Float64Array.from({ length: 12 }, (_, i) => Math.sin(i + 1)), [4, 3]);
  // scaleByTwo is a custom node whose VJP is off by 1%: only the group it touches may go red.
  const scaleByTwo = (t: Tensor, wrong: boolean) =>
    customNode("scaleByTwo", {
      inputs: [t],
      outputs: [{ data: t.data.map((v) => 2 * v), shape: t.shape }],
      vjp: ([g]) => [g === null ? null : g.map((v) => (wrong ? 2.02 : 2) * v)],
      jvp: ([u]) => [u === null ? null : u.map((v) => 2 * v)],
    })[0];
  const subject = (wrong: boolean) => ({
    parameters: new Map([
      ["w1", { data: Float64Array.of(0.3, -0.2, 0.5, 0.1, 0.4, -0.6), shape: [2, 3] }],
      ["w2", { data: Float64Array.of(0.7, -0.3), shape: [1, 2] }],
    ]),
    loss: (p: Map<string, Tensor>) => {
      const h = sigmoid(linear(x, p.get("w1")!));
      return sum(
        sum(mul(linear(h, scaleByTwo(p.get("w2")!, wrong)), linear(h, p.get("w2")!)), 1),
        0,
      );
    },
  });
  const good = await proveGradients(subject(false));
  assert.ok(good.ok, JSON.stringify(good.rows.map((r) => r.status)));
  const bad = await proveGradients(subject(true));
  assert.equal(bad.ok, false);
  assert.deepEqual(bad.rows.filter((r) => !r.ok).map((r) => r.name), ["w2"]);
  assert.match(bad.rows.find((r) => r.name === "w2")!.status, /FAIL/);
});

/** A layer w ↦ Σ aᵢ·wᵢ through a custom node without a JVP rule, whose VJP `change` may break. */
function noJvpSubject(change: (g: number, i: number) => number) {
  const a = Float64Array.of(1, 0.5, 0.6, 0.5, 1e-3, 0.3);
  const scaleBy = (t: Tensor) =>
    customNode("scaleBy", {
      inputs: [t],
      outputs: [{ data: t.data.map((v, i) => a[i] * v), shape: t.shape }],
      vjp: ([g]) => [g === null ? null : g.map((v, i) => change(a[i] * v, i))],
    })[0];
  const ones = new Tensor(new Float64Array(6).fill(1), [6]);
  return {
    parameters: new Map([
      ["w", { data: Float64Array.of(0.3, -0.2, 0.5, 0.1, 0.4, -0.6), shape: [6] }],
    ]),
    loss: (p: Map<string, Tensor>) => sum(mul(scaleBy(p.get("w")!), ones), 0),
  };
}

Deno.test("proveGradients() without a JVP rule does not pass a ×100 error or a sign flip at a coordinate the three probes miss", async () => {
  // The usual probes of this gradient are 0, 1 and 5: the errors sit at 4 and 2.
  assert.deepEqual(probeIndices([1, 0.5, 0.6, 0.5, 1e-3, 0.3]), [0, 1, 5]);
  const good = await proveGradients(noJvpSubject((g) => g));
  assert.ok(good.ok, good.rows[0].status);
  assert.match(good.rows[0].status, /^RESOLVED ok at all 6 coordinates \(no directional check: /);
  const plants: [string, (g: number, i: number) => number, number][] = [
    ["×100", (g, i) => i === 4 ? 100 * g : g, 4],
    ["sign flip", (g, i) => i === 2 ? -g : g, 2],
  ];
  for (const [what, change, index] of plants) {
    const report = await proveGradients(noJvpSubject(change));
    assert.equal(report.ok, false, what);
    assert.equal(report.rows[0].ok, false, what);
    assert.doesNotMatch(report.rows[0].status, /ok/, what);
    assert.match(
      report.rows[0].status,
      new RegExp(`^FAIL \\(central differences .* at index ${index};`),
    );
  }
});

Deno.test("proveGradients() reports a group it could not cover without a JVP rule as NOT PROVEN, and fails", async () => {
  // With room for four probes of six coordinates, even right gradients are not proven.
  const good = await proveGradients(noJvpSubject((g) => g), { probeAllUpTo: 4 });
  assert.equal(good.ok, false);
  assert.deepEqual(good.notProven, ["w"]);
  assert.match(good.rows[0].status, /^NOT PROVEN \(no directional check: .*4 of 6 coordinates/);
  const bad = await proveGradients(noJvpSubject((g, i) => i === 4 ? 100 * g : g), {
    probeAllUpTo: 4,
  });
  assert.equal(bad.ok, false);
  assert.doesNotMatch(bad.rows[0].status, /ok/);
  await assert.rejects(
    () => proveGradients(noJvpSubject((g) => g), { probeAllUpTo: 0 }),
    RangeError,
  );
});

Deno.test("proveGradients() names a NaN gradient NaN and an infinite one infinite, not zero", async () => {
  const nan = await proveGradients(noJvpSubject((g, i) => i === 3 ? NaN : g));
  assert.equal(nan.ok, false);
  assert.equal(nan.rows[0].status, "FAIL (NaN gradient at index 3)");
  assert.deepEqual(nan.rows[0].fd.nonFinite?.index, 3);
  const inf = await proveGradients(noJvpSubject((g, i) => i === 1 ? -Infinity : g));
  assert.equal(inf.rows[0].status, "FAIL (infinite gradient at index 1)");
  const zero = await proveGradients(noJvpSubject(() => 0));
  assert.equal(zero.rows[0].status, "FAIL (zero gradient)");
});

Deno.test("deno task prove --help lists the flags and exit codes, and a bad flag exits 2 with a prove: line", async () => {
  const run = (args: string[], env: Record<string, string> = {}) =>
    new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-env",
        "--allow-read",
        "--allow-write",
        "--allow-run",
        "checks/cli.ts",
        ...args,
      ],
      env: { NO_COLOR: "1", ...env },
      stdout: "piped",
      stderr: "piped",
    }).output();
  const help = await run(["--help"]);
  assert.equal(help.code, 0);
  const text = new TextDecoder().decode(help.stdout);
  for (
    const flag of [
      "--arm",
      "--conv",
      "--shape",
      "--config",
      "--repeat",
      "--mutants",
      "--json",
      "--format",
      "--wide",
    ]
  ) {
    assert.ok(text.includes(flag), flag);
  }
  assert.match(text, /Exit codes: 0 .* 1 .* 2 /s);
  const bad = await run(["--shape", "2"]);
  assert.equal(bad.code, 2);
  assert.match(
    new TextDecoder().decode(bad.stderr),
    /^prove: --shape must be two positive integers/m,
  );
  // each refused before any work, with the flag named and exit code 2
  const refusals: [string[], RegExp][] = [
    [
      ["--shape", "0x1,1e1"],
      /^prove: --shape must be two positive integers B,T, in decimal: got 0x1,1e1$/m,
    ],
    [["--shape", "2,1"], /^prove: --shape T must be at least 2 .*: got 2,1$/m],
    [
      ["--repeat", " 3"],
      /^prove: --repeat must be an integer from 1 to 1000, in decimal: got {2}3$/m,
    ],
    [
      ["--candidate", "f.safetensors", "--mutants"],
      /^prove: --mutants belongs to the proof and has no effect with --candidate/m,
    ],
    [["--candidate", "f.safetensors", "--shape", "1,8"], /^prove: --shape belongs to the proof/m],
    [["--svg", "x.svg"], /^prove: --svg belongs to --candidate and has no effect on the proof/m],
    [["--chunk-size", "32"], /^prove: --chunk-size belongs to --candidate/m],
    [
      ["--conv", "--config", "tests/fixtures/no_conv.json"],
      /^prove: --conv conflicts with --config tests\/fixtures\/no_conv\.json, whose shortConv is false$/m,
    ],
    [
      ["--json", "/no-such-dir-kda/x.json"],
      /^prove: --json must name a file in an existing directory: got \/no-such-dir-kda\/x\.json$/m,
    ],
    // a directory, an empty path or two outputs on one file: refused before the run, not after it
    [
      ["--json", "tests"],
      /^prove: --json must name a file in an existing directory: got tests, a directory$/m,
    ],
    [["--json="], /^prove: --json must name a file .*: got an empty path$/m],
    [
      [
        "--candidate",
        "tests/fixtures/fla_chunk_kda_bf16.safetensors",
        "--json",
        "tests/x.out",
        "--svg",
        "tests/x.out",
      ],
      /^prove: --json and --svg must name two files: got tests\/x\.out for both$/m,
    ],
    [
      [
        "--candidate",
        "tests/fixtures/fla_chunk_kda_bf16.safetensors",
        "--json",
        "tests/x.out",
        "--svg",
        "tests/./x.out",
      ],
      /^prove: --json and --svg must name two files: got tests\/x\.out and tests\/\.\/x\.out, one file$/m,
    ],
    [
      ["--json", "no-such-dir/"],
      /^prove: --json must name a file .*: got no-such-dir\/, which ends with \/$/m,
    ],
    [
      ["--candidate", "tests/fixtures/fla_kimi_layer.safetensors", "--format", "markdown"],
      /^prove: --format sets how the op's tables print and has no effect on a layer candidate/m,
    ],
  ];
  for (const [args, re] of refusals) {
    const out = await run(args);
    assert.equal(out.code, 2, args.join(" "));
    assert.match(new TextDecoder().decode(out.stderr), re, args.join(" "));
  }
  const conflict = await run(["--arm", "cpu"], { KDA_REQUIRE_ARM: "ops" });
  assert.equal(conflict.code, 2);
  assert.match(
    new TextDecoder().decode(conflict.stderr),
    /prove: --arm cpu conflicts with KDA_REQUIRE_ARM=ops/,
  );
});

Deno.test("prove --json FILE ends the file with a newline, and --wide reaches the printed table", async () => {
  // The test task grants no --allow-write: the child writes the file, and another one removes it.
  const json = `${Deno.env.get("TMPDIR") ?? "/tmp"}/kda-prove-${crypto.randomUUID()}.json`;
  const deno = (args: string[]) =>
    new Deno.Command(Deno.execPath(), {
      args,
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
  try {
    const out = await deno([
      "run",
      "--allow-env",
      "--allow-read",
      `--allow-write=${json}`,
      "checks/cli.ts",
      "--arm",
      "cpu",
      "--shape",
      "1,16",
      "--json",
      json,
      "--wide",
    ]);
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    const text = await Deno.readTextFile(json);
    assert.ok(text.endsWith("}\n"), JSON.stringify(text.slice(-5)));
    assert.equal(JSON.parse(text).ok, true);
    const stdout = new TextDecoder().decode(out.stdout).split("\n");
    const header = stdout.find((l) => l.startsWith("group "))!;
    assert.deepEqual(header.trim().split(/\s{2,}/), COLUMNS.map(([c]) => c));
  } finally {
    await deno([
      "eval",
      `try { Deno.removeSync(${JSON.stringify(json)}); } catch { /* not written */ }`,
    ]);
  }
});
