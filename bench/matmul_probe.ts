// What an f32 matmul in WGSL reaches through Deno's WebGPU with 8 x 8 outputs an invocation: a
// 128 x 128 tile per workgroup of 256 invocations, sixteen vec4 accumulators named one by one (the
// WGSL text generated here), A given transposed so that both operands load as vec4 along the tile,
// BK (env, default 8) rows of k staged in workgroup memory at a time. The 4 x 4 form that the design
// measured at 17.3 TFLOP/s on the H200 is not the ceiling: this form reached 28.2 (BK 8) and 32.1
// (BK 16) TFLOP/s at 4096^3 on an H100 (bench/results/ANALYSIS.md, fourteenth pass). Times REP
// dispatches in one submit, so Deno's 10 ms map wait is amortised; at n <= 256 it also checks the
// product against the CPU.
//
// Run: deno run -A bench/matmul_probe.ts [n] [REP]   (BK=16 in the environment for 16 rows of k)
const n = Number(Deno.args[0] ?? 4096), REP = Number(Deno.args[1] ?? 20);
const BK = Number(Deno.env.get("BK") ?? 8);
const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
if (!adapter) throw new Error("no adapter");
const device = await adapter.requestDevice({
  requiredLimits: {
    maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
    maxBufferSize: adapter.limits.maxBufferSize,
  },
});
const acc: string[] = [];
for (let r = 0; r < 8; r++) for (let h = 0; h < 2; h++) acc.push(`c${r}${h}`);
const rowsA = (k: string) =>
  `let a0 = As[${k} * 32u + ty]; let a1 = As[${k} * 32u + ty + 16u]; let b0 = Bs[${k} * 32u + tx]; let b1 = Bs[${k} * 32u + tx + 16u];`;
const fmas = [] as string[];
const comp = ["x", "y", "z", "w"];
for (let r = 0; r < 8; r++) {
  for (let h = 0; h < 2; h++) {
    fmas.push(`c${r}${h} = fma(vec4f(a${r >> 2}.${comp[r & 3]}), b${h}, c${r}${h});`);
  }
}
const loads = [] as string[];
for (let i = 0; i < BK / 8; i++) {
  loads.push(`As[(lk + ${i * 8}u) * 32u + l4] = A[((kt + lk + ${i * 8}u) * N + row0) / 4u + l4];`);
  loads.push(`Bs[(lk + ${i * 8}u) * 32u + l4] = B[((kt + lk + ${i * 8}u) * N + col0) / 4u + l4];`);
}
const stores = [] as string[];
for (let r = 0; r < 8; r++) {
  for (let h = 0; h < 2; h++) {
    const row = `row0 + ${r >> 2 ? 64 : 0}u + ty * 4u + ${r & 3}u`;
    stores.push(`C[(${row}) * N / 4u + col0 / 4u + tx + ${h * 16}u] = c${r}${h};`);
  }
}
const code = `
@group(0) @binding(0) var<storage, read> A: array<vec4f>;  // A^T: [K][M]
@group(0) @binding(1) var<storage, read> B: array<vec4f>;  // [K][N]
@group(0) @binding(2) var<storage, read_write> C: array<vec4f>;
const N: u32 = ${n}u;
var<workgroup> As: array<vec4f, ${BK * 32}>;
var<workgroup> Bs: array<vec4f, ${BK * 32}>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let row0 = wg.y * 128u; let col0 = wg.x * 128u;
  let tx = lid % 16u; let ty = lid / 16u;
  let lk = lid / 32u; let l4 = lid % 32u;
  ${acc.map((a) => `var ${a} = vec4f(0.0);`).join(" ")}
  for (var kt = 0u; kt < N; kt += ${BK}u) {
    ${loads.join("\n    ")}
    workgroupBarrier();
    for (var k = 0u; k < ${BK}u; k++) {
      ${rowsA("k")}
      ${fmas.join("\n      ")}
    }
    workgroupBarrier();
  }
  // rows: r < 4 -> ty*4 + r; r >= 4 -> 64 + ty*4 + r-4  (a1 is As[... ty + 16] = m 64 + 4 ty)
  ${stores.join("\n  ")}
}`;
const mod = device.createShaderModule({ code });
const pipe = device.createComputePipeline({
  layout: "auto",
  compute: { module: mod, entryPoint: "main" },
});
const bytes = n * n * 4;
const mk = (usage: number) => device.createBuffer({ size: bytes, usage });
const A = mk(GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST),
  Bb = mk(GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST);
const C = mk(GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC);
const host = new Float32Array(n * n).map((_, i) => ((i * 2654435761) % 1000) / 1000 - 0.5);
device.queue.writeBuffer(A, 0, host);
device.queue.writeBuffer(Bb, 0, host);
const bg = device.createBindGroup({
  layout: pipe.getBindGroupLayout(0),
  entries: [A, Bb, C].map((buffer, binding) => ({ binding, resource: { buffer } })),
});
async function run(rep: number) {
  const enc = device.createCommandEncoder();
  for (let r = 0; r < rep; r++) {
    const p = enc.beginComputePass();
    p.setPipeline(pipe);
    p.setBindGroup(0, bg);
    p.dispatchWorkgroups(n / 128, n / 128);
    p.end();
  }
  device.queue.submit([enc.finish()]);
  await device.queue.onSubmittedWorkDone();
}
await run(1);
if (n <= 256) {
  const rb = device.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.MAP_READ,
  });
  const e = device.createCommandEncoder();
  e.copyBufferToBuffer(C, 0, rb, 0, bytes);
  device.queue.submit([e.finish()]);
  await rb.mapAsync(GPUMapMode.READ);
  const got = new Float32Array(rb.getMappedRange().slice(0));
  let worst = 0;
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      let s = 0;
      for (let k = 0; k < n; k++) s += host[k * n + i] * host[k * n + j];
      worst = Math.max(worst, Math.abs(s - got[i * n + j]));
    }
  }
  console.log(`check n=${n}: max abs err ${worst.toExponential(2)}`);
}
await run(2);
const t1 = performance.now();
await run(1);
const one = performance.now() - t1;
const t0 = performance.now();
await run(REP);
const many = performance.now() - t0;
const per = (many - one) / (REP - 1);
console.log(
  `${adapter.info?.description ?? "adapter"}: 8x8 f32 matmul BK=${BK} ${n}^3: ${
    per.toFixed(3)
  } ms/dispatch, ${(2 * n ** 3 / per / 1e9).toFixed(2)} TFLOP/s`,
);
