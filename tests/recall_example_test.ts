// `deno task example:recall` writes its SVG only when asked: without --out it runs with no write
// permission at all, and with --out FILE it writes exactly that file.

import assert from "node:assert/strict";

const example = new URL("../examples/recall.ts", import.meta.url).pathname;
const tiny = ["--steps", "1", "--gpu-steps", "1", "--ops-steps", "1", "--arm-set", "cpu"];

function deno(args: string[]): Promise<Deno.CommandOutput> {
  return new Deno.Command(Deno.execPath(), {
    args,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
}

Deno.test("the recall example writes nothing without --out, and its SVG only to the --out file", async () => {
  // No --allow-write: a write by default would fail the run.
  const plain = await deno(["run", "--no-prompt", "--allow-env", "--allow-read", example, ...tiny]);
  const stderr = new TextDecoder().decode(plain.stderr);
  assert.equal(plain.code, 0, stderr);
  assert.doesNotMatch(stderr, /wrote /);
  assert.match(new TextDecoder().decode(plain.stdout), /^cpu arm \(f64\): 1 steps/m);

  // The test task grants no --allow-write: the child writes the file, and another one removes it.
  const svg = `${Deno.env.get("TMPDIR") ?? "/tmp"}/kda-recall-${crypto.randomUUID()}.svg`;
  try {
    const asked = await deno([
      "run",
      "--no-prompt",
      "--allow-env",
      "--allow-read",
      `--allow-write=${svg}`,
      example,
      ...tiny,
      "--out",
      svg,
    ]);
    assert.equal(asked.code, 0, new TextDecoder().decode(asked.stderr));
    assert.match(new TextDecoder().decode(asked.stderr), /wrote /);
    assert.match(await Deno.readTextFile(svg), /^<svg /);
  } finally {
    await deno([
      "eval",
      `try { Deno.removeSync(${JSON.stringify(svg)}); } catch { /* not written */ }`,
    ]);
  }
});
