// Run as a child process by adversarial_test.ts with chosen permissions: f64 calls of the op, then
// the seam's decisions as JSON on stdout. The mode (first argument) picks the calls: "default"
// (one call that names no arm), "explicit" (calls that name their arm and say strict, which no
// environment variable can change), "many" (calls of every kind, declines included).

import { kda, seamDecisions } from "../mod.ts";

const x = {
  B: 1,
  T: 2,
  H: 1,
  K: 2,
  V: 2,
  q: new Float64Array(4).fill(0.5),
  k: new Float64Array(4).fill(0.5),
  v: new Float64Array(4).fill(1),
  g: new Float64Array(4).fill(-0.1),
  beta: new Float64Array(2).fill(0.5),
};
const mode = Deno.args[0] ?? "default";
if (mode === "default") {
  await kda(x);
} else if (mode === "explicit") {
  // The gpu arm takes f32 only: with strict said, the decline to cpu is the caller's choice.
  await kda(x, { arm: "cpu", strict: false });
  await kda(x, { arm: "ops", strict: true });
  await kda(x, { arm: "gpu", strict: false, quiet: true });
} else if (mode === "many") {
  await kda(x);
  await kda(x);
  await kda(x, { arm: "cpu" });
  await kda(x, { arm: "gpu" }); // a decline, where the require variable could have made it an error
  await kda(x, { arm: "ops" });
} else {
  throw new RangeError(`mode must be default, explicit or many: got ${mode}`);
}
console.log(JSON.stringify(seamDecisions()));
