// Where a chained kdaVjp's (or forward's) wall goes beyond its kernels, on GpuTensors at one
// shape: N steps chained (then 2N), one read at the end, three ways. "plain" as a training loop
// runs them; "timed" gives every compute pass timestamps of its own (injected by wrapping
// beginComputePass), and prints each step's GPU span (its first pass's begin to its last pass's
// end) and first pass, the sum of the pass times, the gaps between passes, and when the first
// call's two submits left the host; "wake" submits a small dispatch just before the chain (does
// a GPU left idle by the read before start late?); "tiny" reads a one-element tensor after the
// chain instead of the step's own output (queue order makes it wait for the chain all the same), so
// what the read's size costs shows against "plain". The slope between N and 2N steps is the
// steady per-step cost; what is left of the wall is the chain's fixed cost (the one read, the
// first call's host work). With --forward the steps are forwards (kda, reading ht at the end)
// instead of kdaVjp. Prints text; writes nothing.
//
// Run: deno run -A bench/chain_gaps.ts B T H K [N] [--forward]   (V = K, C = 64, the split set;
// N = 10)

import { kda, kdaVjp } from "../kda/op/op.ts";
import { releaseTensors, toGpu } from "../kda/gpu/tensor.ts";
import { getContext } from "../kda/gpu/device.ts";
import { uploadProblem, wave, waveProblem } from "./_run.ts";

const FORWARD = Deno.args.includes("--forward");
const nums = Deno.args.filter((a) => a !== "--forward").map(Number);
if (
  (nums.length !== 4 && nums.length !== 5) || !nums.every((x) => Number.isInteger(x) && x > 0)
) {
  throw new RangeError(
    `Invalid arguments: expected B T H K [N] [--forward] as four or five positive integers, got ${
      Deno.args.join(" ") || "none"
    }`,
  );
}
const [B, T, H, K] = nums;
const N = nums[4] ?? 10;
const V = K;
const { device } = await getContext();
// timestamps for every pass of the 2N timed steps (WebGPU's limit on a query set's size)
const MAXQ = 4096;
const qs = device.createQuerySet({ type: "timestamp", count: MAXQ });
let nq = 0;
let inject = false;
let recording = false;
const labels: string[] = [];
const submits: number[] = [];
const origBegin = GPUCommandEncoder.prototype.beginComputePass;
GPUCommandEncoder.prototype.beginComputePass = function (d?: GPUComputePassDescriptor) {
  if (inject && (d === undefined || d.timestampWrites === undefined)) {
    if (nq + 2 > MAXQ) {
      throw new RangeError(
        `Invalid N: expected the ${2 * N} timed steps' passes to fit ${MAXQ} timestamps, got ${N}`,
      );
    }
    labels.push(d?.label ?? "?");
    const w = { querySet: qs, beginningOfPassWriteIndex: nq, endOfPassWriteIndex: nq + 1 };
    nq += 2;
    return origBegin.call(this, { ...(d ?? {}), timestampWrites: w });
  }
  return origBegin.call(this, d);
};
const origSubmit = GPUQueue.prototype.submit;
GPUQueue.prototype.submit = function (b: GPUCommandBuffer[]) {
  if (recording) submits.push(performance.now());
  return origSubmit.call(this, b);
};

const x = waveProblem({ B, T, H, K, V });
const inputs = await uploadProblem(x);
const dout = await toGpu(wave(B * T * H * V, 0.5), [B, T, H, V]);
const options = { arm: "gpu", strict: true, chunkSize: 64, kernels: "split" } as const;
// one step: a kdaVjp (its gradients read at the end through dbeta) or a forward (through ht)
type Step = { release(): void; read(): Promise<unknown> };
const step = async (): Promise<Step> => {
  if (FORWARD) {
    const r = await kda(inputs, options);
    return { release: () => releaseTensors(r), read: () => r.ht.read() };
  }
  const g = await kdaVjp(inputs, { dout }, options);
  return { release: () => releaseTensors(g), read: () => g.dbeta.read() };
};
let last = await step();
const wakeModule = device.createShaderModule({
  code:
    "@group(0) @binding(0) var<storage, read_write> a: array<f32>;\n@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) i: vec3u) { a[i.x] = a[i.x] + 1.0; }",
});
const wakePipe = device.createComputePipeline({
  layout: "auto",
  compute: { module: wakeModule, entryPoint: "main" },
});
const wakeBuf = device.createBuffer({ size: 1 << 20, usage: GPUBufferUsage.STORAGE });
const wakeGroup = device.createBindGroup({
  layout: wakePipe.getBindGroupLayout(0),
  entries: [{ binding: 0, resource: { buffer: wakeBuf } }],
});
const wake = () => {
  const e = device.createCommandEncoder();
  const pass = e.beginComputePass();
  pass.setPipeline(wakePipe);
  pass.setBindGroup(0, wakeGroup);
  pass.dispatchWorkgroups(4096);
  pass.end();
  origSubmit.call(device.queue, [e.finish()]);
};
const tiny = await toGpu(new Float32Array([1]), [1]);
for (const mode of ["plain", "timed", "wake", "tiny"]) {
  last.release();
  last = await step();
  for (let i = 0; i < 3; i++) {
    last.release();
    last = await step();
  }
  await last.read();
  for (const n of [N, 2 * N]) {
    nq = 0;
    labels.length = 0;
    submits.length = 0;
    inject = mode === "timed";
    recording = true;
    const starts: number[] = [];
    const t0 = performance.now();
    if (mode === "wake") wake();
    for (let i = 0; i < n; i++) {
      last.release();
      starts.push(performance.now());
      last = await step();
    }
    const tHost = performance.now();
    await (mode === "tiny" ? tiny.read() : last.read());
    const wall = performance.now() - t0;
    inject = false;
    recording = false;
    console.log(
      `${mode} N=${n}: wall ${(wall / n).toFixed(3)} ms a step (${wall.toFixed(1)} total), host ` +
        `${((tHost - t0) / n).toFixed(3)} ms a call, the read ${
          (wall - (tHost - t0)).toFixed(1)
        } ms after the last call; first submit at ${
          ((submits[0] ?? NaN) - starts[0]).toFixed(3)
        } ms, second ${((submits[1] ?? NaN) - starts[0]).toFixed(3)}; submits a call ${
          (submits.length / n).toFixed(1)
        }`,
    );
    if (mode === "timed" && nq > 0) {
      const resolve = device.createBuffer({
        size: nq * 8,
        usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
      });
      const staging = device.createBuffer({
        size: nq * 8,
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      });
      const enc = device.createCommandEncoder();
      enc.resolveQuerySet(qs, 0, nq, resolve, 0);
      enc.copyBufferToBuffer(resolve, 0, staging, 0, nq * 8);
      device.queue.submit([enc.finish()]);
      await staging.mapAsync(GPUMapMode.READ);
      const t = new BigUint64Array(staging.getMappedRange().slice(0));
      staging.unmap();
      const ms = (a: bigint, b: bigint) => Number(b - a) / 1e6;
      const per = nq / 2 / n;
      let sumAll = 0;
      let gapAll = 0;
      const byLabel = new Map<string, number>();
      const gapAfter = new Map<string, number>();
      for (let p = 0; p < nq / 2; p++) {
        const d = ms(t[2 * p], t[2 * p + 1]);
        sumAll += d;
        byLabel.set(labels[p], (byLabel.get(labels[p]) ?? 0) + d);
        if (p + 1 < nq / 2) {
          const g = ms(t[2 * p + 1], t[2 * p + 2]);
          gapAll += g;
          const key = `${labels[p]} -> ${labels[p + 1]}`;
          gapAfter.set(key, (gapAfter.get(key) ?? 0) + g);
        }
      }
      const span = ms(t[0], t[nq - 1]);
      const stepSpans: string[] = [];
      for (let i = 0; i < n; i++) {
        const a = 2 * per * i;
        const b = 2 * per * (i + 1) - 1;
        stepSpans.push(`${ms(t[a], t[b]).toFixed(2)}/${ms(t[a], t[a + 1]).toFixed(2)}`);
      }
      console.log(`  step spans/first pass: ${stepSpans.join(" ")}`);
      console.log(
        `  passes a step ${per}; GPU span ${(span / n).toFixed(3)} ms a step; pass sum ${
          (sumAll / n).toFixed(3)
        }; gaps ${(gapAll / n).toFixed(3)} (${(gapAll / (nq / 2 - 1) * 1000).toFixed(1)} us a gap)`,
      );
      for (const [k, v] of byLabel) console.log(`    ${k.padEnd(22)} ${(v / n).toFixed(3)}`);
      const gs = [...gapAfter].sort((a, b) => b[1] - a[1]).slice(0, 12);
      for (const [k, v] of gs) console.log(`    gap ${k.padEnd(44)} ${(v / n).toFixed(3)}`);
      resolve.destroy();
      staging.destroy();
    }
  }
}
last.release();
releaseTensors(inputs, dout, tiny);
qs.destroy();
wakeBuf.destroy();
