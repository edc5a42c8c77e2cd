// How many workgroups of each chunk-parallel stage an SM holds, measured on the stages themselves:
// the split set runs at (B, T, H, K = V) = (4k, 64, SMS / 4, 128), one chunk a sequence, so that
// every stage with one workgroup a (chunk, head) dispatches SMS × k of them, k = 1..5 (132 SMs on
// the H100 and the H200: 33 heads). Where w workgroups share an SM, a stage's time stays near flat
// up to k = w and then steps by a wave; where one does, it grows as k. bench/occupancy.ts probes the
// same with a synthetic kernel and a chosen size of workgroup memory; this one asks the real stages,
// whose registers count too (docs/kda.md 3.2, "Workgroup memory sets how many workgroups an SM
// holds"). Steady-state kernel times: each stage's median over REPEAT back-to-back runs in one
// submit, after a warm-up. Prints one line a k; writes nothing.
//
// Run: deno run --allow-env --allow-read bench/stage_occupancy.ts [--sms=132] [--waves=1,2,3,4,5]

import { waveProblem, withGpuJobs } from "./_run.ts";
import { gpuStatus, kernelSet } from "../kda/gpu/mod.ts";
import { makePlan } from "../kda/gpu/layout.ts";

const arg = (name: string, fallback: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback;
const sms = Number(arg("sms", "132"));
const waves = arg("waves", "1,2,3,4,5").split(",").map(Number);
if (!Number.isSafeInteger(sms) || sms < 4 || sms % 4 !== 0) {
  throw new RangeError(`Invalid --sms: expected a positive multiple of 4, got ${arg("sms", "")}`);
}
if (!waves.every((k) => Number.isSafeInteger(k) && k > 0)) {
  throw new RangeError(`Invalid --waves: expected positive integers, got ${arg("waves", "")}`);
}
const status = await gpuStatus();
if (!status.available) {
  console.log(`no GPU arm here: ${status.reason}`);
  Deno.exit(0);
}
/** Back-to-back runs of the stages in one timed submit. */
const REPEAT = 8;
/** Timed submits before the kept ones (the GPU's clocks leave their idle state). */
const WARM = 20;
const set = kernelSet("split");
for (const k of waves) {
  const dims = { B: 4 * k, T: 64, H: sms / 4, K: 128, V: 128 };
  const plan = makePlan(set, dims, 64);
  const on = (st: { when?: (p: typeof plan) => boolean }) => st.when?.(plan) ?? true;
  const names = [
    ...set.forward.stages.filter(on).map((st) => st.entry),
    ...(set.backward?.stages.filter(on).map((st) => st.entry) ?? []),
  ];
  const x = waveProblem(dims);
  const dout = new Float32Array(dims.B * dims.T * dims.H * dims.V).fill(0.01);
  const steady = { timing: { repeat: REPEAT, readData: false } };
  // the stage times (ns) of each submit after the warm-up; the median submit by total is kept
  const keep = async (run: () => Promise<number[] | undefined>) => {
    const kept: number[][] = [];
    for (let i = 0; i < WARM + 3; i++) {
      const ns = await run();
      if (ns === undefined) {
        throw new Error("Timestamps unavailable: the adapter lacks timestamp-query");
      }
      if (i >= WARM) kept.push(ns);
    }
    const total = (ns: number[]) => ns.reduce((a, b) => a + b, 0);
    return kept.sort((a, b) => total(a) - total(b))[1];
  };
  const [fwd, bwd] = await withGpuJobs(
    set,
    x,
    dout,
    64,
    (fjob) => keep(async () => (await fjob.run(steady)).stageNs),
    (bjob) => keep(async () => (await bjob.run(steady)).stageNs),
  );
  const ms = [...fwd, ...bwd].map((ns, i) => `${names[i]} ${(ns / 1e6).toFixed(3)}`);
  console.log(`k=${k} (${sms * k} workgroups a (chunk, head) stage): ${ms.join(", ")} ms`);
}
