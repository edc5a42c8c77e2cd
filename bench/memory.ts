// `deno task bench:memory`: the bytes a cold kdaVjp and a cold kda on GpuTensors create (every
// buffer made new, the pool emptied first) at the benchmarked shapes, on any adapter: software
// adapters cannot hold their 268 MB tensors in one binding, so each shape runs with B = 1 and
// H = 2 (the rest as it is) and its slice of the backward set to what the full shape gets (the
// same chunk indices a slice), and the bytes are scaled by the full shape's B·H / 2. Every buffer
// of a call grows with B·H except the chunk table and the uniforms (a few KB), so the scaled figure
// is the full shape's to within those. The H200's own figure is `coldBytesPerVjp` in
// bench/gpu.ts's results. Writes bench/results/<adapter>-<YYYY-MM-DD>-memory.json.
//
//   deno task bench:memory [--kernels NAME]

import { parseArgs } from "node:util";
import { kda, kdaVjp, releaseTensors, toGpu } from "../mod.ts";
import { gpuDebug } from "../kda/gpu/_debug.ts";
import { kernelSet } from "../kda/gpu/kernel_set.ts";
import { bufferElements, makePlan } from "../kda/gpu/layout.ts";
import { gpuStatus } from "../kda/gpu/mod.ts";
import "../kda/gpu/kernels/mod.ts";
import { coldBytes, slug } from "./_run.ts";
import { argsOrExit } from "./_args.ts";

const { values } = argsOrExit("bench:memory", () => {
  const parsed = parseArgs({
    args: Deno.args,
    options: { kernels: { type: "string", default: "split" } },
    strict: true,
  });
  kernelSet(parsed.values.kernels, "--kernels");
  return parsed;
});
const SHAPES = [
  { B: 8, T: 4096, H: 16, K: 128, V: 128, C: 64 },
  { B: 4, T: 4096, H: 16, K: 128, V: 128, C: 64 },
] as const;

async function measure(full: typeof SHAPES[number], kernels: string) {
  const set = kernelSet(kernels);
  const small = { ...full, B: 1, H: 2 };
  const scale = (full.B * full.H) / (small.B * small.H);
  // the full shape's chunk indices a slice, as bytes of the small shape's per-slice buffers
  const fullPlan = makePlan(set, full, full.C);
  const smallPlan = makePlan(set, small, full.C);
  const perChunk = set.buffers.filter((b) => b.perSlice === true)
    .reduce((n, b) => n + bufferElements(b, smallPlan) * 4, 0) / smallPlan.NCT;
  const indices = fullPlan.sliceChunks / full.B;
  const { B, T, H, K, V } = small;
  const wave = (n: number, s: number) =>
    Float32Array.from({ length: n }, (_, i) => s * Math.sin(i));
  const x = {
    B,
    T,
    H,
    K,
    V,
    q: await toGpu(wave(B * T * H * K, 0.1), [B, T, H, K]),
    k: await toGpu(wave(B * T * H * K, 0.1), [B, T, H, K]),
    v: await toGpu(wave(B * T * H * V, 1), [B, T, H, V]),
    g: await toGpu(new Float32Array(B * T * H * K).fill(-0.05), [B, T, H, K]),
    beta: await toGpu(new Float32Array(B * T * H).fill(0.5), [B, T, H]),
  };
  const dout = await toGpu(wave(B * T * H * V, 0.01), [B, T, H, V]);
  const options = { arm: "gpu", strict: true, kernels, chunkSize: full.C } as const;
  gpuDebug.sliceBytes = fullPlan.slices.length > 1 ? indices * perChunk : null;
  try {
    const sliced = makePlan(set, small, full.C);
    if (sliced.slices.length !== fullPlan.slices.length) {
      throw new Error(
        `${sliced.slices.length} slices against the full shape's ${fullPlan.slices.length}`,
      );
    }
    // counted before the read, whose staging buffer is not the call's
    const [grads, vjp] = await coldBytes(() => kdaVjp(x, { dout }, options));
    await grads.dbeta.read();
    releaseTensors(grads);
    const [out, forward] = await coldBytes(() => kda(x, options));
    await out.ht.read();
    releaseTensors(out);
    return {
      shape: full,
      measuredAt: small,
      scale,
      slices: fullPlan.slices.length,
      coldVjpBytes: vjp,
      coldForwardBytes: forward,
      scaledColdVjpGB: (vjp * scale) / 1e9,
      scaledColdForwardGB: (forward * scale) / 1e9,
    };
  } finally {
    gpuDebug.sliceBytes = null;
    releaseTensors(x, dout);
  }
}

async function main(): Promise<void> {
  const status = await gpuStatus();
  if (!status.available) {
    console.error(`bench:memory: no GPU adapter (${status.reason})`);
    Deno.exit(1);
  }
  const results = [];
  for (const shape of SHAPES) {
    const r = await measure(shape, values.kernels);
    const { B, T, H, K } = shape;
    console.log(
      `(${B}, ${T}, ${H}, ${K}) ${values.kernels}: a cold kdaVjp creates ` +
        `${r.scaledColdVjpGB.toFixed(2)} GB, a cold kda ${r.scaledColdForwardGB.toFixed(2)} GB ` +
        `(${r.coldVjpBytes} and ${r.coldForwardBytes} bytes at B = 1, H = 2, times ${r.scale}; ` +
        `${r.slices} slices)`,
    );
    results.push(r);
  }
  const date = new Date().toISOString().slice(0, 10);
  const dir = new URL("./results/", import.meta.url);
  await Deno.mkdir(dir, { recursive: true });
  const name = new URL(`${slug(status.info.description)}-${date}-memory.json`, dir).pathname;
  const doc = {
    what: "bytes a cold kdaVjp / kda on GpuTensors creates, scaled from B = 1, H = 2 " +
      "(bench/memory.ts)",
    adapter: status.info,
    date: new Date().toISOString(),
    deno: Deno.version.deno,
    kernels: values.kernels,
    shapes: results,
  };
  await Deno.writeTextFile(name, JSON.stringify(doc, null, 2) + "\n");
  console.log(`wrote ${name}`);
}

if (import.meta.main) await main();
