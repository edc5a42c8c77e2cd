// Four typed-array kdaVjp calls at (8, 4096, 16, 128) on the gpu arm, each one's wall printed: the
// calls to run under Deno's CPU profiler, to see where the calling thread spends a call (the
// seventeenth pass of issue 18, bench/results/ANALYSIS.md).
//
// Run: deno run --cpu-prof --cpu-prof-dir=DIR --allow-env --allow-read bench/typed_profile.ts

import { randomInputs } from "./_run.ts";
import { kdaVjp } from "../mod.ts";

const [B, T, H, K, V] = [8, 4096, 16, 128, 128];
const x = randomInputs({ B, T, H, K, V }, 1);
const dout = new Float32Array(B * T * H * V).fill(0.01);
for (let i = 0; i < 4; i++) {
  const t0 = performance.now();
  await kdaVjp(x, { dout }, { arm: "gpu", strict: true, quiet: true });
  console.log("kdaVjp", i, (performance.now() - t0).toFixed(1), "ms");
}
