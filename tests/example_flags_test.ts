// The training examples refuse a bad flag before any training, with one line that names it and
// exit code 2: no stack trace, no default run, and no run of minutes that fails at its end because
// --out names a file its permissions do not cover.

import assert from "node:assert/strict";
import { deno } from "./_example_run.ts";

const cases: [string, string[], RegExp][] = [
  ["recall", ["--steps=abc"], /^example:recall: --steps must be a non-negative integer: got abc/],
  ["recall", ["--steps=1e3"], /^example:recall: --steps must be a non-negative integer: got 1e3/],
  ["recall", ["--batch=0"], /^example:recall: --batch must be a positive integer: got 0/],
  ["recall", ["--bogus"], /^example:recall: .*--bogus/],
  ["recall", ["--dtype=f16"], /^example:recall: --dtype must be f64 or f32: got f16/],
  ["lm", ["--lr=-1"], /^example:lm: --lr must be a positive number: got -1/],
  ["lm", ["--arm-set=cpu,tpu"], /^example:lm: --arm-set must list runs from .*: got tpu/],
  ["lm", ["--out=elsewhere.svg"], /^example:lm: --out must name a file this run may write/],
];

for (const [name, args, want] of cases) {
  Deno.test(`example:${name} refuses ${args.join(" ")} with one line and exit code 2`, async () => {
    // the tasks' permissions: reads, env, and writes under examples/ alone
    const out = await deno([
      "run",
      "--no-prompt",
      "--allow-env",
      "--allow-read",
      "--allow-write=examples",
      `examples/${name}.ts`,
      ...args,
    ]);
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 2, stderr);
    assert.match(stderr, want);
    assert.equal(stderr.trim().split("\n").length, 1, stderr);
    assert.equal(new TextDecoder().decode(out.stdout), "");
  });
}
