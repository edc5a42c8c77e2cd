// How many workgroups an SM holds at a given size of workgroup memory: a probe kernel of 256
// invocations with few registers (four live vec4s) and S KB of workgroup memory walks a chain of
// 4000 steps (a store, a barrier, a load, a few multiply-adds, a barrier) and is dispatched over
// 132 × k workgroups, k = 1..5 (132 is the H200's SM count). Where k workgroups an SM fit at once,
// the time grows slowly up to that k and then jumps by a wave; where only one fits, it grows as k.
// GPU time from timestamp queries, the best of three submits. This is what showed the split set's
// 32 KB scan workgroups running one an SM on the H200 (bench/results/ANALYSIS.md, sixth pass).
//
// Run: deno run --allow-env bench/occupancy.ts [--kb=14,16,20,22,24,27,28,32] [--sms=132]

import { spanTimer } from "./_span.ts";

const adapter = await navigator.gpu?.requestAdapter();
if (!adapter) {
  console.log("no WebGPU adapter: nothing to probe");
  Deno.exit(0);
}
if (!adapter.features.has("timestamp-query")) {
  console.log("the adapter has no timestamp-query: nothing to probe");
  Deno.exit(0);
}
const maxBytes = adapter.limits.maxComputeWorkgroupStorageSize;
const device = await adapter.requestDevice({
  requiredFeatures: ["timestamp-query"],
  requiredLimits: { maxComputeWorkgroupStorageSize: maxBytes },
});
const arg = (name: string, fallback: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback;
const kbs = arg("kb", "14,16,20,22,24,27,28,32").split(",").map(Number);
const sms = Number(arg("sms", "132"));
const STEPS = 4000;
const LIVE = 4;
const WAVES = [1, 2, 3, 4, 5];

/** The probe's WGSL for `vec4s` vec4s of workgroup memory. */
function probe(vec4s: number): string {
  const live = Array.from({ length: LIVE }, (_, i) => `a${i}`);
  return `
var<workgroup> mem: array<vec4f, ${vec4s}>;
@group(0) @binding(0) var<storage, read_write> out: array<vec4f>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3u) {
  ${live.map((a, i) => `var ${a} = vec4f(f32(lid + ${i}u) * 1e-3);`).join("\n  ")}
  for (var it = 0u; it < ${STEPS}u; it++) {
    mem[(lid + it * 256u) % ${vec4s}u] = a0;
    workgroupBarrier();
    let x = mem[(lid * 7u + it) % ${vec4s}u] * 0.5;
    ${live.map((a, i) => `${a} = fma(${a}, x, ${live[(i + 1) % LIVE]});`).join("\n    ")}
    workgroupBarrier();
  }
  out[wg.x * 256u + lid] = ${live.join(" + ")};
}`;
}

const out = device.createBuffer({
  size: sms * Math.max(...WAVES) * 256 * 16,
  usage: GPUBufferUsage.STORAGE,
});
const span = spanTimer(device);

/** GPU milliseconds of one dispatch of `groups` workgroups, the best of three. */
async function time(pipeline: GPUComputePipeline, groups: number): Promise<number> {
  const bindGroup = device.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: out } }],
  });
  let best = Infinity;
  for (let run = 0; run < 3; run++) {
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass(span.pass(0, 1));
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(groups);
    pass.end();
    span.resolve(encoder);
    device.queue.submit([encoder.finish()]);
    best = Math.min(best, await span.read());
  }
  return best;
}

console.log(`${adapter.info.description || adapter.info.vendor}: ${sms} × k workgroups of 256`);
for (const kb of kbs) {
  if (kb * 1024 > maxBytes) {
    console.log(`${kb} KB: over the adapter's ${maxBytes} bytes, skipped`);
    continue;
  }
  const module = device.createShaderModule({ code: probe(kb * 64) });
  const pipeline = device.createComputePipeline({
    layout: "auto",
    compute: { module, entryPoint: "main" },
  });
  const ms: number[] = [];
  for (const k of WAVES) ms.push(await time(pipeline, sms * k));
  const rel = ms.map((t) => (t / ms[0]).toFixed(2));
  console.log(
    `${kb} KB: k = ${WAVES.join("/")}: ${ms.map((t) => t.toFixed(3)).join(" / ")} ms ` +
      `(${rel.join(" / ")} of k = 1)`,
  );
}
