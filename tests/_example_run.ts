// What the example tests share: running an example in a child process with exactly the
// permissions given, and the check that it writes its SVG only to the file `--out` names (the
// test task grants no --allow-write: the child writes the file, and another one removes it).

import assert from "node:assert/strict";

/**
 * Runs `deno` with these arguments in a child process, colours off.
 *
 * @param args The arguments after `deno`.
 * @returns Its output.
 */
export function deno(args: string[]): Promise<Deno.CommandOutput> {
  return new Deno.Command(Deno.execPath(), {
    args,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
}

/**
 * Runs an example without write permission (it must succeed and say it wrote nothing), then with
 * `--out FILE` and write permission for that file alone (it must write an SVG there).
 *
 * @param example The example's path.
 * @param args Its arguments for a short run.
 * @param tag A name for the temporary file.
 * @returns The standard output of the run without `--out`.
 */
export async function assertWritesOnlyWithOut(
  example: string,
  args: string[],
  tag: string,
): Promise<string> {
  // No --allow-write: a write by default would fail the run.
  const plain = await deno(["run", "--no-prompt", "--allow-env", "--allow-read", example, ...args]);
  const stderr = new TextDecoder().decode(plain.stderr);
  assert.equal(plain.code, 0, stderr);
  assert.doesNotMatch(stderr, /wrote /);
  const svg = `${Deno.env.get("TMPDIR") ?? "/tmp"}/kda-${tag}-${crypto.randomUUID()}.svg`;
  try {
    const asked = await deno([
      "run",
      "--no-prompt",
      "--allow-env",
      "--allow-read",
      `--allow-write=${svg}`,
      example,
      ...args,
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
  return new TextDecoder().decode(plain.stdout);
}
