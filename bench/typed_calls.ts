// kda and kdaVjp from typed arrays, as a user calls them (checks, upload, kernels, read back), on
// the gpu arm: per shape, the first call's wall and the median of the calls after it. The first call
// of a process copies its arrays (its device is made after its first await); the calls after it
// upload them as they check them (kda/gpu/snapshot.ts).
// The package is imported from --root (default: this checkout), so that the same script times
// another tree of the package (an earlier commit checked out beside this one) on the same machine.
// Prints one JSON line per shape and call.
//
// Run: deno run --allow-env --allow-read bench/typed_calls.ts [B,T,H,K,V ...] [--runs=N] [--root=DIR]
//   (default shapes: the (8, 4096, 16, 128) and (4, 4096, 16, 128); runs: 5)

import { median, randomInputs } from "./_run.ts";

const flag = (name: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
const runs = Number(flag("runs") ?? 5);
if (!Number.isSafeInteger(runs) || runs < 1) {
  throw new RangeError(`--runs must be a positive integer: got ${flag("runs")}`);
}
// a --root is relative to the working directory
const root = flag("root") === undefined
  ? new URL("../", import.meta.url)
  : new URL(`${flag("root")}/`, `file://${Deno.cwd()}/`);
const shapes = Deno.args.filter((a) => !a.startsWith("--")).map((a) => {
  const dims = a.split(",").map(Number);
  if (dims.length !== 5 || !dims.every((n) => Number.isSafeInteger(n) && n > 0)) {
    throw new RangeError(`a shape must be B,T,H,K,V of positive integers: got ${a}`);
  }
  return dims;
});
if (shapes.length === 0) shapes.push([8, 4096, 16, 128, 128], [4, 4096, 16, 128, 128]);

const { kda, kdaVjp } = await import(new URL("mod.ts", root).href);

for (const [B, T, H, K, V] of shapes) {
  const x = randomInputs({ B, T, H, K, V }, 1);
  const dout = new Float32Array(B * T * H * V).fill(0.01);
  const options = { arm: "gpu", strict: true, quiet: true };
  for (
    const [call, run] of [
      ["kda", () => kda(x, options)],
      ["kdaVjp", () => kdaVjp(x, { dout }, options)],
    ] as const
  ) {
    const walls: number[] = [];
    for (let i = 0; i <= runs; i++) {
      const t0 = performance.now();
      await run();
      walls.push(performance.now() - t0);
    }
    console.log(JSON.stringify({
      root: flag("root") ?? ".",
      shape: [B, T, H, K, V],
      call,
      firstMs: +walls[0].toFixed(1),
      medianMs: +median(walls.slice(1)).toFixed(1),
      ms: walls.map((w) => +w.toFixed(1)),
    }));
  }
}
