// `deno task bench:host B,T,H,K,V [KERNELS]`: what one kda and one kdaVjp on GpuTensors cost the
// host, WebGPU call by WebGPU call. Every method of the device, the queue, the command and pass
// encoders and the buffers is wrapped and timed; CALLS calls run chained (pool on, the last
// result read once at the end), and the table gives each method's calls and milliseconds per
// call (a promise's until it settles). The read after the loop is the mapAsync row: on Deno
// 2.9.6 a mapAsync waits for the queue and then sleeps a fixed 10 ms before it resolves, the floor
// under any read (bench/results/ANALYSIS.md, ninth pass). bench/host_profile.ts splits one
// step's wall by phase instead (forward, backward, read). Prints text; writes nothing.
//
//   deno task bench:host 8,4096,16,128,128 split

import { kda, kdaVjp } from "../kda/op/op.ts";
import { releaseTensors, toGpu } from "../kda/gpu/tensor.ts";
import { uploadProblem, wave, waveProblem } from "./_run.ts";
import { argsOrExit } from "./_args.ts";
import { kernelSet } from "../kda/gpu/kernel_set.ts";
import "../kda/gpu/kernels/mod.ts";

type Stat = { n: number; ms: number };
const stats = new Map<string, Stat>();

/**
 * Wraps every method of a WebGPU prototype so that its calls are counted and timed (the package
 * looks its methods up at each call, so wrapping after its import is seen).
 */
function wrap(proto: object, cls: string): void {
  const methods = proto as Record<string, unknown>;
  for (const name of Object.getOwnPropertyNames(proto)) {
    const d = Object.getOwnPropertyDescriptor(proto, name);
    if (d === undefined || typeof d.value !== "function" || name === "constructor") continue;
    const f = d.value as (...args: unknown[]) => unknown;
    const key = `${cls}.${name}`;
    methods[name] = function (this: unknown, ...args: unknown[]) {
      const s = stats.get(key) ?? { n: 0, ms: 0 };
      stats.set(key, s);
      s.n++;
      const t0 = performance.now();
      const out = f.apply(this, args);
      if (out instanceof Promise) {
        return out.finally(() => {
          s.ms += performance.now() - t0;
        });
      }
      s.ms += performance.now() - t0;
      return out;
    };
  }
}

wrap(GPUDevice.prototype, "device");
wrap(GPUQueue.prototype, "queue");
wrap(GPUCommandEncoder.prototype, "encoder");
wrap(GPUComputePassEncoder.prototype, "pass");
wrap(GPUBuffer.prototype, "buffer");

const { dims, kernels } = argsOrExit("bench:host", () => {
  if (Deno.args.length > 2) {
    throw new RangeError(
      `Invalid arguments: expected B,T,H,K,V and an optional kernel set, got ${
        Deno.args.join(" ")
      }`,
    );
  }
  const text = Deno.args[0] ?? "1,64,1,16,16";
  const dims = text.split(",");
  if (dims.length !== 5 || !dims.every((x) => /^\d+$/.test(x) && Number(x) > 0)) {
    throw new RangeError(
      `Invalid shape: expected B,T,H,K,V as five positive integers, got ${text}`,
    );
  }
  const kernels = Deno.args[1] ?? "split";
  kernelSet(kernels, "the kernel set (second argument)");
  return { dims: dims.map(Number), kernels };
});
const [B, T, H, K, V] = dims;
const CALLS = 20;
const x = waveProblem({ B, T, H, K, V });
const inputs = await uploadProblem(x);
const dout = await toGpu(wave(B * T * H * V, 0.5), [B, T, H, V]);
const options = { arm: "gpu", strict: true, chunkSize: K >= 64 ? 64 : 16, kernels } as const;

for (const which of ["kda", "kdaVjp"] as const) {
  const step = () => which === "kda" ? kda(inputs, options) : kdaVjp(inputs, { dout }, options);
  const readLast = (last: Awaited<ReturnType<typeof step>>) =>
    "ht" in last ? last.ht.read() : last.dbeta.read();
  // warm-up: pipelines, and the pool filled
  let last = await step();
  for (let i = 0; i < 4; i++) {
    releaseTensors(last);
    last = await step();
  }
  await readLast(last);
  stats.clear();
  const t0 = performance.now();
  for (let i = 0; i < CALLS; i++) {
    releaseTensors(last);
    last = await step();
  }
  const hostMs = (performance.now() - t0) / CALLS;
  await readLast(last);
  const wallMs = (performance.now() - t0) / CALLS;
  releaseTensors(last);
  console.log(
    `${which} (${dims.join(", ")}) ${kernels}: host ${hostMs.toFixed(3)} ms a call, ` +
      `wall ${wallMs.toFixed(3)} ms a call with the one read (${CALLS} calls)`,
  );
  for (const [key, s] of [...stats].sort((a, b) => b[1].ms - a[1].ms)) {
    console.log(
      `  ${key.padEnd(34)} ${(s.n / CALLS).toFixed(1).padStart(6)} calls ` +
        `${(s.ms / CALLS).toFixed(3)} ms`,
    );
  }
}
releaseTensors(inputs, dout);
