// What one read of a GpuTensor costs the host, part by part, and what a chain of forwards pays for
// reading its last ht instead of one float (bench/chain_gaps.ts's "tiny" mode put that at about
// 10 ms a chain at (8, 4096, 16, 128) on an H100: a millisecond a step of the chained forward).
//
// 1. Reads of S bytes (a tiny read and one of ht's size) with the GPU idle, three ways, MAPS times
//    each: "fresh" makes a MAP_READ staging buffer per read and destroys it after (as
//    DeviceTensor.read does), timing createBuffer, the submit of the copy, mapAsync,
//    getMappedRange, the copy into a Float32Array, unmap and destroy apiece; "reused" copies into
//    one staging buffer kept between reads; "api" is DeviceTensor.read itself.
// 2. Chains of N forwards at B T H K, then one read of ht through "api" or "reused", or of one
//    float, interleaved (ABCABC...), REPS each: the chain's wall.
// Prints text; writes nothing.
//
// Run: deno run -A bench/read_cost.ts [B T H K] [N]   (default 8 4096 16 128, N = 10; V = K)

import { kda } from "../kda/op/op.ts";
import { releaseTensors, toGpu } from "../kda/gpu/tensor.ts";
import { getContext } from "../kda/gpu/device.ts";
import { uploadProblem, waveProblem } from "./_run.ts";
import { argsOrExit } from "./_args.ts";

const [B, T, H, K, N] = argsOrExit("read_cost", () => {
  const nums = Deno.args;
  if (
    (nums.length !== 0 && nums.length !== 4 && nums.length !== 5) ||
    !nums.every((a) => /^\d+$/.test(a) && Number(a) > 0)
  ) {
    throw new RangeError(
      `Invalid arguments: expected B T H K [N] as positive integers, got ${nums.join(" ")}`,
    );
  }
  const d = nums.length === 0 ? [8, 4096, 16, 128] : nums.slice(0, 4).map(Number);
  return [...d, Number(nums[4] ?? 10)];
});
const MAPS = 8, REPS = 3;
const { device } = await getContext();
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const usage = GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST;

/** One read of `bytes` of `src` through a staging buffer, fresh or the one given; timed by part. */
async function stagedRead(src: GPUBuffer, bytes: number, reuse?: GPUBuffer) {
  const t: Record<string, number> = {};
  let at = performance.now();
  const lap = (name: string) => {
    const now = performance.now();
    t[name] = now - at;
    at = now;
  };
  const staging = reuse ?? device.createBuffer({ size: bytes, usage });
  lap("create");
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(src, 0, staging, 0, bytes);
  device.queue.submit([enc.finish()]);
  lap("submit");
  await staging.mapAsync(GPUMapMode.READ, 0, bytes);
  lap("mapAsync");
  const range = staging.getMappedRange(0, bytes);
  lap("getMappedRange");
  const out = new Float32Array(bytes / 4);
  out.set(new Float32Array(range));
  lap("copy");
  staging.unmap();
  lap("unmap");
  if (reuse === undefined) staging.destroy();
  lap("destroy");
  return { t, out };
}

const sizes = [4, B * H * K * K * 4];
for (const bytes of sizes) {
  const src = device.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  });
  const want = Float32Array.from({ length: bytes / 4 }, (_, i) => i % 977);
  device.queue.writeBuffer(src, 0, want);
  const tensor = await toGpu(want, [bytes / 4]);
  const kept = device.createBuffer({ size: bytes, usage });
  const rows: Record<string, Record<string, number[]>> = { fresh: {}, reused: {}, api: {} };
  for (let i = 0; i < MAPS + 1; i++) {
    for (const way of ["fresh", "reused", "api"] as const) {
      const t0 = performance.now();
      let out: Float32Array;
      let parts: Record<string, number> = {};
      if (way === "api") out = await tensor.read();
      else ({ t: parts, out } = await stagedRead(src, bytes, way === "reused" ? kept : undefined));
      const total = performance.now() - t0;
      if (out.some((v, j) => v !== want[j])) throw new Error(`${way}: wrong values read`);
      if (i === 0) continue; // the first of each: pipelines and first allocations
      for (const [k, v] of Object.entries({ ...parts, total })) (rows[way][k] ??= []).push(v);
    }
  }
  for (const [way, parts] of Object.entries(rows)) {
    console.log(
      `read of ${bytes} B, ${way}: ` +
        Object.entries(parts).map(([k, v]) => `${k} ${median(v).toFixed(3)}`).join(", ") +
        ` ms (medians of ${MAPS})`,
    );
  }
  src.destroy();
  kept.destroy();
  releaseTensors(tensor);
}

// chains of forwards, each ended by one read three ways
const inputs = await uploadProblem(waveProblem({ B, T, H, K, V: K }));
const options = { arm: "gpu", strict: true, chunkSize: 64, kernels: "split" } as const;
const htBytes = B * H * K * K * 4;
const kept = device.createBuffer({ size: htBytes, usage });
const one = await toGpu(new Float32Array([1]), [1]);
const walls: Record<string, number[]> = { api: [], reused: [], tiny: [] };
for (let rep = 0; rep < REPS + 1; rep++) {
  for (const way of ["api", "reused", "tiny"] as const) {
    const t0 = performance.now();
    let last = await kda(inputs, options);
    for (let i = 1; i < N; i++) {
      releaseTensors(last);
      last = await kda(inputs, options);
    }
    if (way === "api") await last.ht.read();
    else if (way === "reused") await stagedRead(last.ht.buffer, htBytes, kept);
    else await one.read();
    const wall = performance.now() - t0;
    releaseTensors(last);
    if (rep > 0) walls[way].push(wall);
  }
}
for (const [way, w] of Object.entries(walls)) {
  console.log(
    `${N} forwards at (${B}, ${T}, ${H}, ${K}), then a read (${way}): ${
      w.map((x) => x.toFixed(1)).join(", ")
    } ms; ${(median(w) / N).toFixed(3)} ms a step`,
  );
}
kept.destroy();
releaseTensors(inputs, one);
