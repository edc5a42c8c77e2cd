// Host <-> device transfer rates through Deno's WebGPU, the ceiling of a call from typed arrays:
// writeBuffer of large arrays (with the queue drained), and reading back through MAP_READ staging
// buffers, in one piece or in chunks whose copies and maps overlap, and as the package reads
// (kda/gpu/readback.ts: pieces small enough for the host allocator to reuse); then one
// DeviceTensor.read() by size. Prints one JSON line per case.
//
// Run: deno run --allow-env --allow-read bench/transfer.ts [MB] (default 1024)

import { getContext } from "../kda/gpu/device.ts";
import { ownStaging, READ_PIECE_BYTES, stageReads } from "../kda/gpu/readback.ts";
import { toGpu } from "../kda/gpu/tensor.ts";

const MB = Number(Deno.args[0] ?? 1024);
const ctx = await getContext();
const { device } = ctx;
const bytes = MB * 2 ** 20;
const data = new Float32Array(bytes / 4).map((_, i) => i);
const src = device.createBuffer({
  size: bytes,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
});

async function time(label: string, fn: () => Promise<void>, reps = 3): Promise<void> {
  await fn();
  const ms: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    await fn();
    ms.push(performance.now() - t0);
  }
  ms.sort((a, b) => a - b);
  const med = ms[Math.floor(ms.length / 2)];
  console.log(JSON.stringify({ label, MB, ms: med, GBps: bytes / (med * 1e-3) / 1e9 }));
}

for (const pieces of [1, 8, 64]) {
  await time(`writeBuffer in ${pieces} piece(s), then queue drained`, async () => {
    const n = data.length / pieces;
    for (let p = 0; p < pieces; p++) {
      device.queue.writeBuffer(src, p * n * 4, data, p * n, n);
    }
    await device.queue.onSubmittedWorkDone();
  });
}

for (const chunks of [1, 4, 16]) {
  await time(`readback in ${chunks} chunk(s), maps overlapping, sliced out`, async () => {
    const size = bytes / chunks;
    const stagings = Array.from(
      { length: chunks },
      () => device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST }),
    );
    const encoder = device.createCommandEncoder();
    stagings.forEach((s, i) => encoder.copyBufferToBuffer(src, i * size, s, 0, size));
    device.queue.submit([encoder.finish()]);
    const out = new Float32Array(bytes / 4);
    await Promise.all(stagings.map(async (s, i) => {
      await s.mapAsync(GPUMapMode.READ);
      out.set(new Float32Array(s.getMappedRange()), (i * size) / 4);
      s.unmap();
      s.destroy();
    }));
    if (out[12345] !== 12345) throw new Error("readback mismatch");
  });
}
await time(
  `readback as the package does it (stageReads: pieces of ${READ_PIECE_BYTES / 2 ** 20} MiB)`,
  async () => {
    const staging = ownStaging(device);
    const encoder = device.createCommandEncoder();
    const staged = stageReads(
      staging.make,
      encoder,
      [{ buffer: src, offset: 0, bytes }],
      "transfer",
    );
    device.queue.submit([encoder.finish()]);
    await staged.map();
    const [out] = staged.copyOut();
    staging.destroy();
    if (out[12345] !== 12345) throw new Error("readback mismatch");
  },
);
await time("one mapAsync of a staging buffer reused (no copy on the GPU)", async () => {
  const s = device.createBuffer({ size: bytes, usage: GPUBufferUsage.MAP_READ });
  await s.mapAsync(GPUMapMode.READ);
  new Float32Array(s.getMappedRange()).slice();
  s.unmap();
  s.destroy();
}, 2);
src.destroy();

// One DeviceTensor.read() with the GPU idle, by size: Deno's map (its fixed sleep) and the copy
// out, what a chained step's one read adds to the chain (seven reads, median).
for (const floats of [1024, 262144, 524288, 1048576, 4194304]) {
  const t = await toGpu(new Float32Array(floats).fill(1), [floats]);
  await t.read();
  const ms: number[] = [];
  for (let i = 0; i < 7; i++) {
    const t0 = performance.now();
    await t.read();
    ms.push(performance.now() - t0);
  }
  ms.sort((a, b) => a - b);
  console.log(
    JSON.stringify({ label: "DeviceTensor.read, GPU idle", MB: (floats * 4) / 2 ** 20, ms: ms[3] }),
  );
  t.release();
}
