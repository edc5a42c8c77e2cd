// `deno task example:recall` writes its SVG only when asked: without --out it runs with no write
// permission at all, and with --out FILE it writes exactly that file.

import assert from "node:assert/strict";
import { assertWritesOnlyWithOut } from "./_example_run.ts";

const example = new URL("../examples/recall.ts", import.meta.url).pathname;
const tiny = ["--steps", "1", "--gpu-steps", "1", "--ops-steps", "1", "--arm-set", "cpu"];

Deno.test("the recall example writes nothing without --out, and its SVG only to the --out file", async () => {
  const stdout = await assertWritesOnlyWithOut(example, tiny, "recall");
  assert.match(stdout, /^cpu arm \(f64\): 1 steps/m);
});
