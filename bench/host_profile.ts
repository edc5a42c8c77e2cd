// Where the host wall of a kdaVjp on GpuTensors goes: creating the forward's buffers, encoding and
// submitting it, the same for the backward, and the one read that ends the step (it waits for
// the GPU: the kernels, the input and output copies, and the clearing of newly created buffers).
// The same internals kdaVjpOnDevice runs, timed one by one.
//
// Run: deno run --allow-env --allow-read bench/host_profile.ts [B T H K C] [--pool=BYTES] [--reps=N]
//   (default 8 4096 16 128 64; --pool keeps buffers between steps, see gpuPool)

import type { ChunkSize } from "../kda/_types.ts";
import { getContext } from "../kda/gpu/device.ts";
import { BackwardJob, ForwardJob } from "../kda/gpu/calls.ts";
import { DeviceTensor, toGpu } from "../kda/gpu/tensor.ts";
import { BufferSet, gpuPool } from "../kda/gpu/buffers.ts";

const PHASES = ["fwd create", "fwd submit", "bwd create", "bwd submit", "free", "read"] as const;

async function main(): Promise<void> {
  const nums = Deno.args.filter((a) => !a.startsWith("--")).map(Number);
  const [B, T, H, K, C] = nums.length === 5 ? nums : [8, 4096, 16, 128, 64];
  const V = K;
  const option = (name: string) => Deno.args.find((a) => a.startsWith(`--${name}=`))?.split("=")[1];
  gpuPool({ maxBytes: Number(option("pool") ?? 0) });
  const reps = Number(option("reps") ?? 4);
  const ctx = await getContext();
  const fill = (n: number, v: number) => new Float32Array(n).fill(v);
  const x = {
    B,
    T,
    H,
    K,
    V,
    scale: K ** -0.5,
    q: await toGpu(fill(B * T * H * K, 0.01), [B, T, H, K]),
    k: await toGpu(fill(B * T * H * K, 0.01), [B, T, H, K]),
    v: await toGpu(fill(B * T * H * V, 0.1), [B, T, H, V]),
    g: await toGpu(fill(B * T * H * K, -0.1), [B, T, H, K]),
    beta: await toGpu(fill(B * T * H, 0.5), [B, T, H]),
  };
  const dout = await toGpu(fill(B * T * H * V, 0.01), [B, T, H, V]);
  const shapes = [[B, T, H, K], [B, T, H, K], [B, T, H, V], [B, T, H, K], [B, T, H], [B, H, K, V]];
  console.log(`(${B}, ${T}, ${H}, ${K}) C=${C}, pool ${gpuPool().maxBytes} bytes`);
  for (let rep = 0; rep < reps; rep++) {
    const t = [performance.now()];
    const mark = () => t.push(performance.now());
    const grads = shapes.map((s) => {
      const bytes = s.reduce((a, b) => a * b, 1) * 4;
      return new DeviceTensor(ctx, BufferSet.acquire(ctx.device, "grad", bytes), s);
    });
    const fjob = await ForwardJob.create(ctx, x, {
      chunkSize: C as ChunkSize,
      saveForBackward: true,
    });
    mark();
    await fjob.run(false, []);
    mark();
    const saved = fjob.takeSaved();
    fjob.destroy();
    const bjob = await BackwardJob.create(saved, dout, undefined, false);
    mark();
    await bjob.run(false, grads.map((g) => g.buffer));
    mark();
    bjob.destroy();
    saved.release();
    mark();
    await grads[4].read();
    mark();
    for (const g of grads) g.release();
    const ms = PHASES.map((name, i) => `${name} ${(t[i + 1] - t[i]).toFixed(1)}`).join(", ");
    console.log(`step ${rep}: ${ms} | total ${(t[t.length - 1] - t[0]).toFixed(1)} ms`);
  }
  const t0 = performance.now();
  await x.beta.read();
  console.log(`a read with no work queued: ${(performance.now() - t0).toFixed(1)} ms`);
  for (const t of [x.q, x.k, x.v, x.g, x.beta, dout]) t.release();
  gpuPool({ maxBytes: 0 });
}

if (import.meta.main) await main();
