// Where the host wall of a kdaVjp on GpuTensors goes: the forward (creating its buffers, encoding
// and submitting), the backward likewise, and the one read that ends the step (it waits for the
// GPU: the kernels, the input and output copies, and the clearing of newly created buffers).
//
// Run: deno run --allow-env --allow-read bench/host_profile.ts [B T H K C] [--pool=BYTES]
//   [--reps=N] [--kernels=NAME]
//   (default 8 4096 16 128 64; --pool sets the buffer pool's bound, see gpuPool)

import type { ChunkSize } from "../kda/_types.ts";
import { gpuBackward, gpuForward } from "../kda/gpu/mod.ts";
import { releaseTensors, toGpu } from "../kda/gpu/tensor.ts";
import { gpuCreatedBytes, gpuPool } from "../kda/gpu/buffers.ts";
import { uploadProblem } from "./_run.ts";

const PHASES = ["forward", "backward", "read"] as const;

async function main(): Promise<void> {
  const nums = Deno.args.filter((a) => !a.startsWith("--")).map(Number);
  const [B, T, H, K, C] = nums.length === 5 ? nums : [8, 4096, 16, 128, 64];
  const V = K;
  const option = (name: string) => Deno.args.find((a) => a.startsWith(`--${name}=`))?.split("=")[1];
  const pool = option("pool");
  if (pool !== undefined) gpuPool({ maxBytes: Number(pool) });
  const reps = Number(option("reps") ?? 4);
  const kernels = option("kernels");
  const fill = (n: number, v: number) => new Float32Array(n).fill(v);
  const x = await uploadProblem({
    B,
    T,
    H,
    K,
    V,
    scale: K ** -0.5,
    q: fill(B * T * H * K, 0.01),
    k: fill(B * T * H * K, 0.01),
    v: fill(B * T * H * V, 0.1),
    g: fill(B * T * H * K, -0.1),
    beta: fill(B * T * H, 0.5),
  });
  const dout = await toGpu(fill(B * T * H * V, 0.01), [B, T, H, V]);
  console.log(`(${B}, ${T}, ${H}, ${K}) C=${C}, pool ${gpuPool().maxBytes} bytes`);
  for (let rep = 0; rep < reps; rep++) {
    const created = gpuCreatedBytes();
    const t = [performance.now()];
    const mark = () => t.push(performance.now());
    const { saved } = await gpuForward(x, {
      chunkSize: C as ChunkSize,
      saveForBackward: true,
      outputs: false,
      ...(kernels !== undefined ? { kernels } : {}),
    });
    mark();
    const grads = await gpuBackward(saved!, { dout });
    saved!.release(true);
    mark();
    await grads.dbeta.read();
    mark();
    releaseTensors(grads);
    const ms = PHASES.map((name, i) => `${name} ${(t[i + 1] - t[i]).toFixed(1)}`).join(", ");
    const gb = (gpuCreatedBytes() - created) / 1e9;
    console.log(
      `step ${rep}: ${ms} | total ${(t[t.length - 1] - t[0]).toFixed(1)} ms, ` +
        `${gb.toFixed(2)} GB of buffers created`,
    );
  }
  const t0 = performance.now();
  await x.beta.read();
  console.log(`a read with no work queued: ${(performance.now() - t0).toFixed(1)} ms`);
  releaseTensors(x, dout);
}

if (import.meta.main) await main();
