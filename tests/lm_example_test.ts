// `deno task example:lm` writes its SVG only when asked: without --out it runs with no write
// permission at all, and with --out FILE it writes exactly that file; and the task it trains on
// is what its comment says (keys that differ only four tokens before their values).

import assert from "node:assert/strict";
import { colonOf, lengthOf, makeBatch, questionOf, TASK } from "../examples/_lm_task.ts";
import { mulberry32 } from "./_fixtures.ts";
import { assertWritesOnlyWithOut } from "./_example_run.ts";

const example = new URL("../examples/lm.ts", import.meta.url).pathname;
const tiny = [
  "--steps",
  "1",
  "--gpu-steps",
  "0",
  "--one-layer-steps",
  "1",
  "--arm-set",
  "cpu,one-layer",
];

Deno.test("the lm example writes nothing without --out, and its SVG only to the --out file", async () => {
  const stdout = await assertWritesOnlyWithOut(example, tiny, "lm");
  assert.match(stdout, /^2 layers, cpu arm \(f64\): 1 steps/m);
  assert.match(stdout, /^1 layer, cpu arm \(f64\): 1 steps/m);
});

Deno.test("the lm task's keys share their last two tokens, so only a token four before the value tells them apart, and each query's target is its key's value", () => {
  const batch = makeBatch(TASK, 8, mulberry32(5));
  const T = lengthOf(TASK), P = TASK.pairs;
  assert.equal(batch.T, T);
  for (let b = 0; b < batch.B; b++) {
    const row = batch.tokens.subarray(b * T, (b + 1) * T);
    const value = new Map<number, number>();
    const suffixes = new Set<string>();
    for (let p = 0; p < P; p++) {
      const [k, s1, s2, colon, v] = row.subarray(5 * p, 5 * p + 5);
      assert.equal(colon, colonOf(TASK));
      assert.ok(k < TASK.keys && !value.has(k), "distinct first key tokens");
      suffixes.add(`${s1},${s2}`);
      value.set(k, v);
    }
    assert.equal(suffixes.size, 1, "one suffix per sequence");
    for (let q = 0; q < P; q++) {
      const at = 5 * P + 4 * q;
      const [k, , , question] = row.subarray(at, at + 4);
      assert.equal(question, questionOf(TASK));
      assert.equal(batch.targets[b * T + at + 3], value.get(k));
    }
    const scored = [...batch.targets.subarray(b * T, (b + 1) * T)].filter((t) => t >= 0);
    assert.equal(scored.length, P);
  }
});
