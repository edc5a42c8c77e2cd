// Run as a child process by adversarial_test.ts with chosen permissions: one f64 call of the op,
// then the seam's decisions as JSON on stdout.

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
await kda(x);
console.log(JSON.stringify(seamDecisions()));
