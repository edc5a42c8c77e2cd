// A profile by subtraction: times a kernel set's stages with one marked section of its WGSL
// removed at a time ("// ABLATE name {" ... "// ABLATE name }"), so that the drop in a stage's
// kernel time is that section's cost. The numbers a removed section leaves behind are wrong; only
// the times mean anything. Needs timestamp queries.
//
// Run: deno run --allow-env --allow-read --allow-write bench/ablate.ts [B T H K C] [--runs=N]
//   [--kernels=fused] (the set; default fused) [--sections=bA,bE] (only these sections; default all;
//   `--sections=` times the stages whole, with no section removed)
//   (each stage runs N times back to back in one submit; the median per stage is kept)
//   (default 4 4096 16 128 64 on a card, 1 512 2 64 64 on a software adapter, whose bindings hold
//   128 MiB); KDA_BENCH_OUT names a JSON
//   file to write (under bench/results/ through the task).

import { CHUNK_SIZES, type ChunkSize } from "../kda/_types.ts";
import { destroyDeviceForTests, getContext } from "../kda/gpu/device.ts";
import { gpuDebug } from "../kda/gpu/_debug.ts";
import { type KernelSet, kernelSet } from "../kda/gpu/kernel_set.ts";
import "../kda/gpu/kernels/mod.ts";
import { withGpuJobs } from "./_run.ts";
import { argsOrExit, checkBenchArgs } from "./_args.ts";

/** The marked sections of a set's stages, as its declaration lists them. */
function sectionsOf(set: KernelSet): string[] {
  return [...set.forward.stages, ...(set.backward?.stages ?? [])].flatMap((s) => s.sections ?? []);
}

/**
 * Removes the lines of one marked section from the shader text: every place it is marked (a
 * section may be marked in more than one place of a stage, as chunkPrep's factors are).
 *
 * @param code The shader text.
 * @param name The section.
 * @returns The text without it.
 */
export function ablate(code: string, name: string): string {
  const open = `// ABLATE ${name} {`;
  const close = `// ABLATE ${name} }`;
  let out = code;
  let removed = 0;
  for (let begin = out.indexOf(open); begin >= 0; begin = out.indexOf(open, begin + 1)) {
    const end = out.indexOf(close, begin);
    if (end < 0) throw new Error(`Section ${name} opens without closing in the shader`);
    out = out.slice(0, begin) + out.slice(end);
    removed++;
  }
  if (removed === 0) throw new Error(`No section ${name} in the shader`);
  return out;
}

/** The timed problem, made once: filling 10^8 floats in JS costs more than a variant's timing. */
function problem(dims: { B: number; T: number; H: number; K: number; V: number }) {
  const { B, T, H, K, V } = dims;
  const fill = (n: number, f: (i: number) => number) =>
    Float32Array.from({ length: n }, (_, i) => f(i));
  const x = {
    ...dims,
    scale: 1 / Math.sqrt(K),
    q: fill(B * T * H * K, (i) => Math.sin(i) * 0.1),
    k: fill(B * T * H * K, (i) => Math.cos(i) * 0.1),
    v: fill(B * T * H * V, (i) => Math.sin(3 * i) * 0.5),
    g: fill(B * T * H * K, (i) => -0.1 * ((i * 7919) % 13) / 13),
    beta: fill(B * T * H, (i) => 0.2 + 0.6 * ((i * 31) % 17) / 17),
  };
  const dout = fill(B * T * H * V, (i) => Math.cos(5 * i) * 0.01);
  return { x, dout };
}

async function timeOnce(
  set: KernelSet,
  { x, dout }: ReturnType<typeof problem>,
  C: ChunkSize,
  runs: number,
): Promise<{ names: string[]; ms: number[] }> {
  // the first runs only fill what the backward reads (nothing is read back: a 1 GB readback
  // takes seconds); then the steady state: the stages `runs` times back to back in one submit, median per stage; run
  // twice, keep the last
  const steady = { timing: { repeat: runs, readData: false } };
  const once = { timing: { repeat: 1, readData: false } };
  const [, last] = await withGpuJobs(
    set,
    x,
    dout,
    C,
    (fjob) => fjob.run(once),
    async (bjob, fjob) => {
      await bjob.run(once);
      let ms: number[] = [];
      let names: string[] = [];
      for (let i = 0; i < 2; i++) {
        const f = await fjob.run(steady), b = await bjob.run(steady);
        ms = [...(f.stageNs ?? []), ...(b.stageNs ?? [])].map((ns) => ns / 1e6);
        // the stages that ran (a stage a call does not need is skipped)
        names = [...(f.stages ?? []), ...(b.stages ?? [])];
      }
      return { names, ms };
    },
  );
  return last;
}

/** The default shape on a card, and on a software adapter (whose bindings hold 128 MiB). */
const DEFAULT_SHAPE = [4, 4096, 16, 128, 64];
const SOFTWARE_SHAPE = [1, 512, 2, 64, 64];

/**
 * The arguments, checked before the GPU is opened: B T H K C (or none: the shape is then null, and
 * the default follows the adapter), --runs, --kernels, --sections.
 */
function parseArgs() {
  const flags = Deno.args.filter((a) => a.startsWith("--"));
  // "--sections=" (empty: the stages whole, nothing removed) is this script's one empty value
  checkBenchArgs("bench:ablate", flags.filter((a) => a !== "--sections="), {
    valued: ["runs", "kernels", "sections"],
    integers: { runs: { min: 1 } },
  });
  return argsOrExit("bench:ablate", () => {
    const nums = Deno.args.filter((a) => !a.startsWith("--"));
    if (nums.length !== 0 && nums.length !== 5) {
      throw new RangeError(
        `Invalid shape: expected B T H K C as five positive integers or none, got ${
          nums.join(" ")
        }`,
      );
    }
    if (!nums.every((a) => /^\d+$/.test(a) && Number(a) > 0)) {
      throw new RangeError(
        `Invalid shape: expected B T H K C as five positive integers, got ${nums.join(" ")}`,
      );
    }
    const C = nums.length === 5 ? Number(nums[4]) : DEFAULT_SHAPE[4];
    if (!(CHUNK_SIZES as readonly number[]).includes(C)) {
      throw new RangeError(`Invalid C: expected one of ${CHUNK_SIZES.join(", ")}, got ${C}`);
    }
    const flag = (name: string) =>
      flags.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
    const set = kernelSet(flag("kernels") ?? "fused", "--kernels");
    const sections = sectionsOf(set);
    const only = flag("sections")?.split(",").filter((name) => name !== "");
    for (const name of only ?? []) {
      if (!sections.includes(name)) {
        throw new RangeError(
          `--sections must name sections of ${sections.join(", ")}: got ${name}`,
        );
      }
    }
    return {
      shape: nums.length === 5 ? nums.map(Number) : null,
      runs: Number(flag("runs") ?? 8),
      set,
      sections: only ?? sections,
    };
  });
}

async function main(): Promise<void> {
  const { shape, runs, set, sections } = parseArgs();
  const { info } = await getContext();
  const [B, T, H, K, C] = shape ?? (info.software ? SOFTWARE_SHAPE : DEFAULT_SHAPE);
  const dims = { B, T, H, K, V: K };
  if (shape === null && info.software) {
    console.error(
      `bench:ablate: a software adapter (${info.description}): the default shape is ` +
        `${SOFTWARE_SHAPE.join(" ")} (B T H K C), whose times say nothing of a card's`,
    );
  }
  const timed = problem(dims);
  let stages: string[] = [];
  const rows: Record<string, unknown>[] = [];
  let full: number[] = [];
  for (const section of ["(none)", ...sections]) {
    gpuDebug.shaderTransform = section === "(none)"
      ? null
      : (code, name) => name === set.name ? ablate(code, section) : code;
    destroyDeviceForTests();
    const { names, ms } = await timeOnce(set, timed, C as ChunkSize, runs);
    if (section === "(none)") full = ms, stages = names;
    const saved = ms.map((m, i) => full[i] - m);
    rows.push({ section, ms, savedMs: saved });
    console.log(
      `${section.padEnd(9)} ${
        stages.map((s, i) =>
          `${s} ${ms[i].toFixed(2)} (${saved[i] < 0 ? "+" : "-"}${Math.abs(saved[i]).toFixed(2)})`
        ).join(", ")
      }`,
    );
  }
  gpuDebug.shaderTransform = null;
  const out = Deno.env.get("KDA_BENCH_OUT");
  if (out !== undefined) {
    const doc = { B, T, H, K, C, kernels: set.name, stages, rows };
    await Deno.writeTextFile(out, JSON.stringify(doc, null, 2) + "\n");
  }
}

if (import.meta.main) await main();
