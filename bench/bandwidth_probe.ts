// What a WGSL kernel moves through Deno's WebGPU between the card's memory and its SMs: three
// plain kernels over buffers of MIB MiB (default 1024, larger than any L2), one vec4 per step of an
// invocation, UNROLL (env, default 4) steps an invocation, consecutive invocations on consecutive
// vec4s:
//   copy   dst = src            (reads MIB, writes MIB)
//   read   a sum of src per invocation, one vec4 written per workgroup (reads MIB)
//   write  dst = a value of the index (writes MIB)
// Each kernel's run is checked: no validation error, and dst's last 4 KiB as written (copy, write).
// The rates bound every stage whose operands cannot stay in L2 between kernels: a stage that must
// read R bytes and write W bytes takes at least about R / (read rate) + W / (write rate)
// (bench/results/ANALYSIS.md, twentieth pass). Times REP back-to-back dispatches by timestamps (the
// first one's start to the last one's end; the host's clock beside them, REP against one).
//
// Run: deno run -A bench/bandwidth_probe.ts [MIB] [REP]

import { spanTimer } from "./_span.ts";

const mib = Number(Deno.args[0] ?? 1024), REP = Number(Deno.args[1] ?? 20);
const UNROLL = Number(Deno.env.get("UNROLL") ?? 4);
/** Wall time of warm-up runs before each kernel's timed one, in ms. */
const WARM_MS = 300;
if (!Number.isSafeInteger(mib) || mib < 1) {
  throw new RangeError(`Invalid MIB: expected a positive integer, got ${Deno.args[0]}`);
}
if (!Number.isSafeInteger(REP) || REP < 2) {
  throw new RangeError(`Invalid REP: expected an integer of at least 2, got ${Deno.args[1]}`);
}
if (![1, 2, 4, 8].includes(UNROLL)) {
  throw new RangeError(`Invalid UNROLL: expected 1, 2, 4 or 8, got ${UNROLL}`);
}
const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
if (!adapter) throw new Error("no adapter");
if (!adapter.features.has("timestamp-query")) {
  throw new Error("Timestamps unavailable: the adapter lacks timestamp-query");
}
const device = await adapter.requestDevice({
  requiredFeatures: ["timestamp-query"],
  requiredLimits: {
    maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
    maxBufferSize: adapter.limits.maxBufferSize,
  },
});
const bytes = mib * 2 ** 20;
if (bytes > adapter.limits.maxStorageBufferBindingSize) {
  throw new RangeError(
    `Invalid MIB: expected at most ${
      Math.floor(adapter.limits.maxStorageBufferBindingSize / 2 ** 20)
    } (the adapter's binding size), got ${mib}`,
  );
}
const n4 = bytes / 16;
const WG = 256;
const perWg = WG * UNROLL;
if (n4 % perWg !== 0) throw new RangeError(`Invalid MIB: ${mib} MiB is not a whole grid`);
const groups = n4 / perWg;
// a 2D grid: at most 65535 workgroups a dimension
const gx = Math.min(groups, 32768), gy = Math.ceil(groups / gx);
if (gx * gy !== groups) throw new RangeError(`Invalid MIB: ${groups} workgroups do not tile`);
const steps = (body: string) =>
  Array.from({ length: UNROLL }, (_, u) => body.replaceAll("U", `${u}u`)).join("\n  ");
const head = `
@group(0) @binding(0) var<storage, read> src: array<vec4f>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4f>;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let base = (wg.y * ${gx}u + wg.x) * ${perWg}u + lid;`;
const kernels: Record<string, string> = {
  copy: `${head}
  ${steps(`dst[base + U * ${WG}u] = src[base + U * ${WG}u];`)}
}`,
  read: `${head}
  var s = vec4f(0.0);
  ${steps(`s += src[base + U * ${WG}u];`)}
  // one vec4 a workgroup reaches memory, so that the sums are not removed
  if (lid == 0u || s.x == 12345.0) { dst[base / ${perWg}u] = s; }
}`,
  write: `${head}
  ${steps(`dst[base + U * ${WG}u] = vec4f(f32((base + U * ${WG}u) & 65535u));`)}
}`,
};
const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
const src = device.createBuffer({ size: bytes, usage });
const dst = device.createBuffer({ size: bytes, usage });
const host = new Float32Array(bytes / 4).map((_, i) => i % 1024);
device.queue.writeBuffer(src, 0, host);
// the bytes each kernel moves: read + written
const moved: Record<string, number> = {
  copy: 2 * bytes,
  read: bytes + groups * 16,
  write: bytes,
};
const span = spanTimer(device);
const label = adapter.info?.description || adapter.info?.device || "adapter";
// one explicit layout for the three kernels: with "auto", the write kernel (which reads nothing)
// would get a layout without src, the bind group below would be invalid, and nothing would run
const layout = device.createBindGroupLayout({
  entries: [
    { binding: 0, visibility: GPUShaderStage.COMPUTE, buffer: { type: "read-only-storage" } },
    { binding: 1, visibility: GPUShaderStage.COMPUTE, buffer: { type: "storage" } },
  ],
});
const bg = device.createBindGroup({
  layout,
  entries: [src, dst].map((buffer, binding) => ({ binding, resource: { buffer } })),
});
/** The last 4 KiB of dst, read back. */
async function dstTail(): Promise<Float32Array> {
  const rb = device.createBuffer({
    size: 4096,
    usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.MAP_READ,
  });
  const e = device.createCommandEncoder();
  e.copyBufferToBuffer(dst, bytes - 4096, rb, 0, 4096);
  device.queue.submit([e.finish()]);
  await rb.mapAsync(GPUMapMode.READ);
  const got = new Float32Array(rb.getMappedRange().slice(0));
  rb.unmap();
  rb.destroy();
  return got;
}
for (const [name, code] of Object.entries(kernels)) {
  device.pushErrorScope("validation");
  const pipe = device.createComputePipeline({
    layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
    compute: { module: device.createShaderModule({ code }), entryPoint: "main" },
  });
  // the span from the first pass's start to the last one's end, by timestamps
  const run = async (rep: number) => {
    const enc = device.createCommandEncoder();
    for (let r = 0; r < rep; r++) {
      const p = enc.beginComputePass(span.pass(r, rep));
      p.setPipeline(pipe);
      p.setBindGroup(0, bg);
      p.dispatchWorkgroups(gx, gy);
      p.end();
    }
    span.resolve(enc);
    device.queue.submit([enc.finish()]);
    return await span.read();
  };
  // and the same by the host's clock: REP dispatches against one, so Deno's map wait cancels
  const wall = async (rep: number) => {
    const t0 = performance.now();
    await run(rep);
    return performance.now() - t0;
  };
  // dst is cleared first, so that a kernel that ran nothing fails its check below
  const clear = device.createCommandEncoder();
  clear.clearBuffer(dst);
  device.queue.submit([clear.finish()]);
  // runs of REP dispatches until WARM_MS of wall have passed: a GPU left idle runs its memory at
  // a lower clock, and 20 dispatches over 1 GiB take 15 ms, too short to leave it (the first
  // call of the twenty-second pass read 1.83 TB/s there, 3.13 once torch had run first)
  for (const t0 = performance.now(); performance.now() - t0 < WARM_MS;) await run(REP);
  const per = (await run(REP)) / REP;
  const byWall = (await wall(REP) - await wall(1)) / (REP - 1);
  const error = await device.popErrorScope();
  if (error) throw new Error(`the ${name} kernel did not run: ${error.message}`);
  let check = "";
  if (name !== "read") {
    // copy: the source's last floats; write: each float its vec4's index mod 2^16 (exact in f32)
    const got = await dstTail();
    const first4 = n4 - 256;
    const want = name === "copy"
      ? host.subarray(host.length - 1024)
      : Float32Array.from({ length: 1024 }, (_, i) => (first4 + Math.floor(i / 4)) % 65536);
    const bad = got.findIndex((v, i) => v !== want[i]);
    if (bad >= 0) {
      throw new Error(`${name} check failed at ${bad}: got ${got[bad]}, want ${want[bad]}`);
    }
    check = ", the last 4 KiB checked";
  }
  console.log(
    `${label}: ${name} of ${mib} MiB (UNROLL ${UNROLL}): ${per.toFixed(3)} ms/dispatch, ${
      (moved[name] / per / 1e9).toFixed(2)
    } TB/s moved (by the host's clock: ${byWall.toFixed(3)} ms)${check}`,
  );
}
