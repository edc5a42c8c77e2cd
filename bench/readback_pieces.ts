// Readback through Deno's WebGPU by staging piece size: in pieces of P MiB (one staging buffer a
// piece, all maps issued at once, each piece copied out and unmapped before the next, as
// kda/gpu/readback.ts does), from one piece of the whole size down to 2 MiB, with the time split
// into the maps, getMappedRange, the copies into the caller's array and the unmaps. What chose
// READ_PIECE_BYTES (bench/results/ANALYSIS.md, thirteenth pass).
//
// Run: deno run --allow-env --allow-read bench/readback_pieces.ts [MB] (default 1024)
import { getContext } from "../kda/gpu/device.ts";
const MB = Number(Deno.args[0] ?? 1024);
const { device } = await getContext();
const bytes = MB * 2 ** 20;
const src = device.createBuffer({
  size: bytes,
  usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
});
const data = new Float32Array(bytes / 4).map((_, i) => i);
device.queue.writeBuffer(src, 0, data);
await device.queue.onSubmittedWorkDone();
async function once(pieceMB: number) {
  const piece = Math.min(bytes, pieceMB * 2 ** 20);
  const n = Math.ceil(bytes / piece);
  const t0 = performance.now();
  const stagings = Array.from(
    { length: n },
    (_, i) =>
      device.createBuffer({
        size: Math.min(piece, bytes - i * piece),
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      }),
  );
  const enc = device.createCommandEncoder();
  stagings.forEach((s, i) => enc.copyBufferToBuffer(src, i * piece, s, 0, s.size));
  device.queue.submit([enc.finish()]);
  await Promise.all(stagings.map((s) => s.mapAsync(GPUMapMode.READ)));
  const t1 = performance.now();
  const out = new Float32Array(bytes / 4);
  let get = 0, set = 0, un = 0;
  stagings.forEach((s, i) => {
    const a = performance.now();
    const ab = s.getMappedRange();
    const b = performance.now();
    out.set(new Float32Array(ab), (i * piece) / 4);
    const c = performance.now();
    s.unmap();
    s.destroy();
    un += performance.now() - c;
    get += b - a;
    set += c - b;
  });
  const ms = performance.now() - t0;
  if (out[12345] !== 12345 || out[out.length - 1] !== Math.fround(out.length - 1)) {
    throw new Error("readback mismatch");
  }
  return { ms, map: t1 - t0, get, set, un };
}
for (const p of [1024, 256, 64, 32, 16, 8, 4, 2]) {
  if (p > MB && p !== 1024) continue;
  const rs = [];
  for (let r = 0; r < 3; r++) rs.push(await once(p));
  rs.sort((a, b) => a.ms - b.ms);
  const m = rs[1];
  console.log(
    `pieces of ${p} MiB: ${m.ms.toFixed(0)} ms (${(bytes / m.ms / 1e6).toFixed(2)} GB/s): maps ${
      m.map.toFixed(0)
    }, getMappedRange ${m.get.toFixed(0)}, copies ${m.set.toFixed(0)}, unmap ${
      m.un.toFixed(0)
    }; runs ${rs.map((x) => x.ms.toFixed(0)).join(" ")}`,
  );
}
src.destroy();
