// `deno task prove`'s flags refused before any work, each in one line naming the flag, with exit
// code 2: a combination that would fail only after the run, an output on an input's file, a flag
// given twice, a repeat count out of bounds, a path that cannot be checked, standard input twice.

import assert from "node:assert/strict";

const OP_FILE = "tests/fixtures/fla_chunk_kda_bf16.safetensors";
const OTHER_OP_FILE = "tests/fixtures/fla_chunk_kda_bf16_gva.safetensors";

/**
 * The CLI in a child process with read access only, so that a refusal that fails to come can
 * never overwrite a fixture: the write is then refused by Deno instead, after the run.
 *
 * @param args The flags.
 * @param env More environment.
 * @returns Its exit code and output.
 */
async function prove(args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-env", "--allow-read", "--allow-run", "checks/cli.ts", ...args],
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

/** Asserts a refusal: exit code 2, nothing on stdout, one line on stderr matching `re`. */
async function assertRefused(args: string[], re: RegExp, env: Record<string, string> = {}) {
  const out = await prove(args, env);
  const what = `${args.join(" ")}\n${out.stdout}${out.stderr}`;
  assert.equal(out.code, 2, what);
  assert.equal(out.stdout, "", what);
  assert.equal(out.stderr.trimEnd().split("\n").length, 1, what);
  assert.match(out.stderr.trimEnd(), re, what);
}

Deno.test("prove --mutants on the ops arm is refused before the proof runs, by --arm and by KDA_REQUIRE_ARM", async () => {
  await assertRefused(
    ["--arm", "ops", "--shape", "1,4", "--mutants"],
    /^prove: --mutants plants its defects in the fused arms' seam \(cpu or gpu\), and the ops arm has none: got --arm ops$/,
  );
  await assertRefused(
    ["--shape", "1,4", "--mutants"],
    /^prove: --mutants .*: got KDA_REQUIRE_ARM=ops$/,
    { KDA_REQUIRE_ARM: "ops" },
  );
});

Deno.test("prove --json or --svg on the file of --candidate, --compare, --map or --config, or --compare on the candidate itself, is refused, naming both flags", async () => {
  const cases: [string[], RegExp][] = [
    // "-" is a file for --json and --svg (standard input only for the candidate's files)
    [
      ["--candidate", OP_FILE, "--json", "-", "--svg", "-"],
      /^prove: --json and --svg must name two files: got - for both$/,
    ],
    // a file compared with itself would be called bit-identical whatever the kernel did
    [
      ["--candidate", OP_FILE, "--compare", `./${OP_FILE}`],
      /^prove: --candidate and --compare must name two files \(a file compared with itself agrees whatever the kernel did\): got tests\/fixtures\/fla_chunk_kda_bf16\.safetensors and \.\/tests\/fixtures\/fla_chunk_kda_bf16\.safetensors, one file$/,
    ],
    [
      ["--candidate", OP_FILE, "--json", OP_FILE],
      /^prove: --json and --candidate must name two files \(--json would overwrite its input\): got tests\/fixtures\/fla_chunk_kda_bf16\.safetensors for both$/,
    ],
    [
      ["--candidate", OP_FILE, "--svg", `tests/../${OP_FILE}`],
      /^prove: --svg and --candidate must name two files .*: got tests\/\.\.\/tests\/fixtures\/fla_chunk_kda_bf16\.safetensors and tests\/fixtures\/fla_chunk_kda_bf16\.safetensors, one file$/,
    ],
    [
      ["--candidate", OP_FILE, "--compare", OTHER_OP_FILE, "--json", OTHER_OP_FILE],
      /^prove: --json and --compare must name two files .*: got .*_gva\.safetensors for both$/,
    ],
    [
      [
        "--candidate",
        OP_FILE,
        "--map",
        "tests/fixtures/name_map.json",
        "--svg",
        "tests/fixtures/name_map.json",
      ],
      /^prove: --svg and --map must name two files .* for both$/,
    ],
    [
      [
        "--arm",
        "cpu",
        "--shape",
        "1,4",
        "--config",
        "tests/fixtures/no_conv.json",
        "--json",
        "./tests/fixtures/no_conv.json",
      ],
      /^prove: --json and --config must name two files .*: got \.\/tests\/fixtures\/no_conv\.json and tests\/fixtures\/no_conv\.json, one file$/,
    ],
  ];
  for (const [args, re] of cases) await assertRefused(args, re);
});

Deno.test("prove refuses a flag given twice instead of reading the last one", async () => {
  await assertRefused(
    ["--candidate", OP_FILE, "--candidate", OTHER_OP_FILE],
    /^prove: --candidate must be given once: got it twice \(tests\/fixtures\/fla_chunk_kda_bf16\.safetensors, then tests\/fixtures\/fla_chunk_kda_bf16_gva\.safetensors\)$/,
  );
  await assertRefused(
    ["--shape", "1,4", "--shape=1,8", "--shape", "2,4"],
    /^prove: --shape must be given once: got it 3 times \(1,4, 1,8, then 2,4\)$/,
  );
  await assertRefused(
    ["--conv", "--arm", "cpu", "--conv"],
    /^prove: --conv must be given once: got it twice$/,
  );
});

Deno.test("prove --repeat must be a safe integer from 1 to 1000, and a value with a dash is refused in one line", async () => {
  // --arm bogus is refused after --repeat: without the repeat's refusal the run stops there
  for (const value of ["100000000000000000000", "1001", "0"]) {
    await assertRefused(
      ["--repeat", value, "--arm", "bogus"],
      new RegExp(`^prove: --repeat must be an integer from 1 to 1000, in decimal: got ${value}$`),
    );
  }
  await assertRefused(
    ["--repeat", "-1"],
    /^prove: --repeat must have a value; one that starts with a dash is written --repeat=-1: got --repeat -1$/,
  );
  await assertRefused(
    ["--repeat=-1", "--arm", "bogus"],
    /^prove: --repeat must be an integer from 1 to 1000, in decimal: got -1$/,
  );
  await assertRefused(
    ["--json", "--wide"],
    /^prove: --json must have a value: got the flag --wide after it$/,
  );
});

Deno.test("prove says what failed when a --json path cannot be checked, and refuses reading standard input twice", async () => {
  // without --allow-all Deno refuses to stat /dev/stdout: that is what failed, not the directory
  const out = await prove(["--json", "/dev/stdout", "--arm", "bogus"]);
  assert.equal(out.code, 2, out.stderr);
  assert.match(out.stderr, /^prove: --json \/dev\/stdout could not be checked: .*\/dev\/stdout/);
  assert.doesNotMatch(out.stderr, /existing directory/);
  assert.equal(out.stderr.trimEnd().split("\n").length, 1, out.stderr);
  await assertRefused(
    ["--candidate", "-", "--compare", "-"],
    /^prove: only one of --candidate, --compare and --map may read standard input \(-\): got - for --candidate and --compare$/,
  );
  await assertRefused(
    ["--candidate", "-", "--map", "-"],
    /^prove: only one of .*: got - for --candidate and --map$/,
  );
});
