/**
 * The main job, `deno task prove`: the per-group gradient proof of the KDA layer (docs/kda.md 4),
 * and the checker of someone else's kernel (`--candidate FILE`). It is a program, not a library:
 * it exports nothing, and runs when it is the main module, from a checkout or from the registry.
 * Run it with `--help` for every flag, the exit codes and the tolerances.
 *
 * @example From a checkout
 * ```sh
 * deno task prove --conv --repeat 5 --json proof.json
 * ```
 *
 * @example From the registry
 * ```sh
 * deno run --allow-env --allow-read --allow-write --allow-run --allow-net=jsr.io \
 *   jsr:@deltanet/kda/cli --arm cpu
 * ```
 *
 * @module
 */

import { parseArgs } from "node:util";
import { computeDtypeOf } from "../base/dtype.ts";
import type { Arm, Float } from "../kda/_types.ts";
import { type KdaConfig, type KimiConfigInput, resolveConfig } from "../kda/layer/config.ts";
import { layerGroups } from "../kda/layer/parameters.ts";
import { gpuStatus } from "../kda/gpu/mod.ts";
import { kernelSet, kernelSetNames } from "../kda/gpu/kernel_set.ts";
import { type ProofOptions, provenRun, runProof } from "./prove.ts";
import { cellText, failedChecks, type KillRow, printKillTable, printReport } from "./report.ts";
import { MUTANTS } from "./mutants.ts";
import { readSafetensors } from "../io/mod.ts";
import { checkCandidate, type Precision } from "./candidate.ts";
import { compareCandidates } from "./candidate_compare.ts";
import {
  checkFilesApart,
  checkModeFlags,
  checkOnce,
  checkStdinOnce,
  checkWritable,
  decimal,
  MAX_REPEAT,
  OPTIONS,
  parseError,
  parseShape,
  UsageError,
} from "./_cli_flags.ts";
import { checkLayerCandidate, isLayerCandidate } from "./candidate_layer.ts";
import { heatmapSvg } from "./heatmap.ts";

const HELP = `deno task prove [flags]: the per-group gradient proof of the KDA layer

Flags:
  --arm ops|cpu|gpu   the arm to prove (default: KDA_REQUIRE_ARM, else gpu when a WebGPU adapter
                      exists, else cpu)
  --kernels NAME      the gpu arm's kernel set to prove (default: KDA_GPU_KERNELS, else the
                      arm's rule: split); see docs/kda.md 3.2
  --conv              the 14-group layer with the short convolution
  --shape B,T         the input's batch and length, T >= 2 (default 2,256: the trainer shape);
                      above 2048 tokens central differences are sampled (one coordinate a group)
                      and the exact directional checks carry the proof
  --config FILE       a JSON object of KdaConfig fields to override, or of a Kimi Linear layer
                      ({"form": "kimi", ...}: fla's KimiDeltaAttention, docs/kda.md 2.9)
  --repeat N          N reruns (1 to 1000) in this process plus one in a second process, compared
                      bit for bit
  --mutants           also plant each of the 9 defects and check that the proof catches each one
                      with its expected diagnosis (prints the kill table); cpu and gpu arms only:
                      the defects are planted in the fused arms, which the ops arm does not use
  --json FILE         write every figure (steps, floors, probes, directional and op checks,
                      counters, timings, adapter) to FILE, which must not be an input's file
  --format text|markdown   how the tables print (default text)
  --wide              every column of the per-group table, each probe with its index and floor
                      (default: a compact table that fits 100 characters)
  --help              this text

Someone else's kernel (instead of the proof; a flag of one mode is refused in the other):
  --candidate FILE    a safetensors file with the inputs (q, k, v, g, beta; optionally h0, dout,
                      dht, cu_seqlens; v, g, beta, h0 may have HV = a multiple of H heads) and
                      any results (o, ht, dq, dk, dv, dg, dbeta, dh0) of a KDA kernel, checked
                      against the exact f64 reference on the same values; or a layer (x, dy, the
                      parameters, y and grad/<name> for every group; grad/x, the input's gradient,
                      is checked where present); - reads standard input (as one of --candidate,
                      --compare and --map may)
  --precision bf16|f16|f32  the precision the candidate claims, which sets the bars (default:
                      read from the inputs' dtypes: BF16 -> bf16, F16 -> f16, F32 and F64 -> f32)
  --chunk-size N      the candidate's chunk size, to place errors in chunks (default 64)
  --svg FILE          write the heat map of the error per (sequence·head, chunk) to FILE
  --map FILE          a JSON object mapping the candidate's parameter names to this package's
  --compare FILE      a second candidate file from the same inputs: where the two differ

Each flag may be given once. Exit codes: 0 the proof holds (and every mutant is killed); 1 a check
failed or a mutant survived; 2 a usage or environment error (a bad flag, a flag given twice, an
output on an input's file, a required arm that cannot run).

Tolerances: central differences 1e-6 (f64), 0.5 in f32 (that column shows what f32 can resolve:
at the f32 step truncation and rounding cost a few percent, so it catches only gross errors); floor 32·eps·|L|/h, step h* = (3·eps·|L|/|g|max)^(1/3)
clamped to 0.1 of the group's RMS; reference agreement 1e-10 (f64 arms) or 1e-4 (f32 gpu arm);
forward 1e-12 or 1e-5; directional check 1e-10 or 1e-4 of Σ|∇L⊙u|; the op alone: outputs 1e-12
or 2e-6, gradients 1e-10 or 2e-5, ⟨Ju,v⟩ vs ⟨u,Jᵀv⟩ 1e-12 or 2e-5.`;

/**
 * A run that needs more memory than the host gives fails in V8's allocator ("Array buffer
 * allocation failed"); said in one line naming the flags that set its size.
 */
async function sized<X>(run: () => Promise<X>, what: string): Promise<X> {
  try {
    return await run();
  } catch (error) {
    if (
      error instanceof RangeError &&
      /allocation failed|Invalid typed array length/.test(error.message)
    ) {
      throw new UsageError(`${what} does not fit in this process's memory: ${error.message}`);
    }
    throw error;
  }
}

async function readConfig(
  path: string | undefined,
  conv: boolean,
): Promise<Partial<KdaConfig> | KimiConfigInput> {
  let config: Partial<KdaConfig> | KimiConfigInput = {};
  if (path !== undefined) {
    try {
      config = JSON.parse(await Deno.readTextFile(path));
    } catch (error) {
      throw new UsageError(
        `--config ${path} could not be read as JSON: ${(error as Error).message}`,
      );
    }
    if (typeof config !== "object" || config === null || Array.isArray(config)) {
      throw new UsageError(`--config must hold a JSON object: got ${JSON.stringify(config)}`);
    }
  }
  if (conv && (config as { shortConv?: unknown }).shortConv === false) {
    throw new UsageError(`--conv conflicts with --config ${path}, whose shortConv is false`);
  }
  return conv ? { ...config, shortConv: true } : config;
}

function requiredArm(): Arm | undefined {
  if (
    Deno.permissions.querySync({ name: "env", variable: "KDA_REQUIRE_ARM" }).state !== "granted"
  ) {
    return undefined;
  }
  const value = Deno.env.get("KDA_REQUIRE_ARM");
  if (value === undefined || value === "") return undefined;
  if (value !== "ops" && value !== "cpu" && value !== "gpu") {
    throw new UsageError(`KDA_REQUIRE_ARM must be ops, cpu or gpu: got ${value}`);
  }
  return value;
}

function encode(run: Map<string, Float>): string {
  const out: Record<string, { dtype: string; bytes: string }> = {};
  for (const [name, a] of run) {
    const bytes = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    let text = "";
    for (let i = 0; i < bytes.length; i += 8192) {
      text += String.fromCharCode(...bytes.subarray(i, i + 8192));
    }
    out[name] = { dtype: computeDtypeOf(a), bytes: btoa(text) };
  }
  return JSON.stringify(out);
}

function decode(json: string): Map<string, Float> {
  const parsed = JSON.parse(json) as Record<string, { dtype: string; bytes: string }>;
  const out = new Map<string, Float>();
  for (const [name, { dtype, bytes }] of Object.entries(parsed)) {
    const raw = Uint8Array.from(atob(bytes), (c) => c.charCodeAt(0));
    out.set(name, dtype === "f64" ? new Float64Array(raw.buffer) : new Float32Array(raw.buffer));
  }
  return out;
}

async function otherProcess(args: string[]): Promise<Map<string, Float>> {
  // A local checkout runs this file; one imported from the registry runs its URL, and its gpu arm
  // fetches the kernels from there.
  const local = import.meta.filename;
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-env",
      "--allow-read",
      ...(local === undefined ? [`--allow-net=${new URL(import.meta.url).host}`] : []),
      local ?? import.meta.url,
      "--child",
      ...args,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (out.code !== 0) {
    throw new Error(`the second process failed: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
  return decode(new TextDecoder().decode(out.stdout));
}

/** The kernel set `--kernels` names (checked against the registered ones), for the gpu arm only. */
function parseKernels(value: string | undefined, arm: Arm): string | undefined {
  if (value === undefined) return undefined;
  if (arm !== "gpu") throw new UsageError(`--kernels names a gpu kernel set: got --arm ${arm}`);
  // the proof needs a backward: a forward-only set (the decode set) cannot be proven here
  const names = kernelSetNames().filter((name) => kernelSet(name).backward !== null);
  if (!names.includes(value)) {
    throw new UsageError(`--kernels must be one of ${names.join(", ")}: got ${value}`);
  }
  return value;
}

async function main(args: string[]): Promise<number> {
  let values, flags;
  try {
    ({ values, tokens: flags } = parseArgs({ args, options: OPTIONS, strict: true, tokens: true }));
  } catch (error) {
    throw parseError(error as Error, args);
  }
  checkOnce(flags);
  if (values.help) {
    console.log(HELP);
    return 0;
  }
  checkModeFlags(values);
  checkWritable(values.json, "--json");
  checkWritable(values.svg, "--svg");
  checkFilesApart(values);
  checkStdinOnce(values);

  if (values.format !== "text" && values.format !== "markdown") {
    throw new UsageError(`--format must be text or markdown: got ${values.format}`);
  }
  const format = values.format;
  const repeat = values.repeat === undefined ? undefined : decimal(values.repeat);
  if (
    repeat !== undefined && !(Number.isSafeInteger(repeat) && repeat >= 1 && repeat <= MAX_REPEAT)
  ) {
    throw new UsageError(
      `--repeat must be an integer from 1 to ${MAX_REPEAT}, in decimal: got ${values.repeat}`,
    );
  }
  if (values.arm !== undefined && !["ops", "cpu", "gpu"].includes(values.arm)) {
    throw new UsageError(`--arm must be ops, cpu or gpu: got ${values.arm}`);
  }
  const required = requiredArm();
  if (required !== undefined && values.arm !== undefined && values.arm !== required) {
    throw new UsageError(`--arm ${values.arm} conflicts with KDA_REQUIRE_ARM=${required}`);
  }
  if (values.mutants && (values.arm ?? required) === "ops") {
    // The mutants are planted in the seam's fused arms (checks/mutants.ts); the ops arm is the
    // composite one, so the first mutant failed only after the whole proof had run.
    throw new UsageError(
      `--mutants plants its defects in the fused arms' seam (cpu or gpu), and the ops arm has none: got ${
        values.arm !== undefined ? "--arm ops" : "KDA_REQUIRE_ARM=ops"
      }`,
    );
  }
  if (values.candidate !== undefined) {
    return await candidateMain(values.candidate, {
      precision: values.precision,
      chunkSize: values["chunk-size"],
      svg: values.svg,
      map: values.map,
      compare: values.compare,
      json: values.json,
      format,
    });
  }
  const dims = parseShape(values.shape);
  const config = await readConfig(values.config, values.conv);
  const status = await gpuStatus();
  const arm = (values.arm as Arm | undefined) ?? required ?? (status.available ? "gpu" : "cpu");
  const kernels = parseKernels(values.kernels, arm);
  const childArgs = [
    "--arm",
    arm,
    ...(kernels !== undefined ? ["--kernels", kernels] : []),
    ...(values.conv ? ["--conv"] : []),
    ...(values.shape ? ["--shape", values.shape] : []),
    ...(values.config ? ["--config", values.config] : []),
  ];
  const size = `--shape ${dims?.join(",") ?? "2,256"}${
    values.config ? ` with --config ${values.config}` : ""
  }`;
  if (values.child) {
    console.log(encode(await sized(() => provenRun({ arm, kernels, config, dims }), size)));
    return 0;
  }
  console.log(
    status.available
      ? `WebGPU adapter: ${status.info.description}`
      : `WebGPU adapter: none (${status.reason})`,
  );
  const started = performance.now();
  const tokens = (dims?.[0] ?? 2) * (dims?.[1] ?? 256);
  // The proof's steps: a row per group and one for x, three checks each, and the rest.
  const groups = layerGroups(resolveConfig(config)).length + 1;
  const totalSteps = 6 + 3 * groups + (repeat ?? 1);
  let done = 0;
  const progress = (m: string) => {
    const elapsed = (performance.now() - started) / 1000;
    const eta = done > 0
      ? ` ETA ${(elapsed / done * Math.max(0, totalSteps - done)).toFixed(0)} s`
      : "";
    done++;
    console.error(`prove: [${elapsed.toFixed(1)} s${eta}] ${m}`);
  };
  const base: ProofOptions = {
    arm,
    ...(kernels !== undefined ? { kernels } : {}),
    config,
    dims,
    progress,
    repeat,
    fdProbes: tokens > 2048 ? 1 : 3,
    ...(repeat !== undefined ? { otherProcess: () => otherProcess(childArgs) } : {}),
  };
  const report = await sized(() => runProof(base), size);
  printReport(report, format, console.log, { wide: values.wide });
  let ok = report.ok;
  const kills: KillRow[] = [];
  if (values.mutants) {
    console.log("");
    console.log(
      "mutants (central differences and the directional check skipped: they read the unmutated f64 arms):",
    );
    for (const mutant of MUTANTS) {
      progress(`mutant ${mutant.name}`);
      const r = await runProof({
        arm,
        ...(kernels !== undefined ? { kernels } : {}),
        config,
        dims,
        repeat: 1,
        checks: { fd: false, fd32: false, directional: false },
        defect: mutant.make(),
      });
      const diagnosis = r.diagnosis ?? "(none: the proof held)";
      kills.push({
        mutant: mutant.name,
        description: mutant.description,
        caught: !r.ok,
        by: r.ok ? "-" : failedChecks(r),
        diagnosis,
        expected: !r.ok && mutant.expected.test(diagnosis),
      });
    }
    printKillTable(kills, format, console.log, { wide: values.wide });
    const killed = kills.filter((k) => k.caught && k.expected).length;
    console.log(`mutants: ${killed} of ${kills.length} killed with their expected diagnosis`);
    ok &&= killed === kills.length;
  }
  if (values.json !== undefined) {
    const adapter = status.available ? status.info : { unavailable: status.reason };
    await Deno.writeTextFile(
      values.json,
      `${JSON.stringify({ ok, adapter, report, mutants: kills }, null, 2)}\n`,
    );
    console.error(`prove: wrote ${values.json}`);
  }
  console.error(`prove: done in ${((performance.now() - started) / 1000).toFixed(1)} s`);
  return ok ? 0 : 1;
}

async function readFileBytes(path: string, flag: string): Promise<Uint8Array> {
  try {
    if (path === "-") return new Uint8Array(await new Response(Deno.stdin.readable).arrayBuffer());
    return await Deno.readFile(path);
  } catch (error) {
    throw new UsageError(`${flag} ${path} could not be read: ${(error as Error).message}`);
  }
}

const fmt = (x: number) => Number.isNaN(x) ? "NaN" : x.toExponential(2);

async function readMap(path: string): Promise<Record<string, string>> {
  const text = new TextDecoder().decode(await readFileBytes(path, "--map"));
  let map: unknown;
  try {
    map = JSON.parse(text);
  } catch (error) {
    throw new UsageError(`--map ${path} must hold JSON: got ${(error as Error).message}`);
  }
  if (
    typeof map !== "object" || map === null || Array.isArray(map) ||
    !Object.values(map).every((v) => typeof v === "string")
  ) {
    throw new UsageError(
      `--map must hold a JSON object of names to names: got ${text.slice(0, 60)}`,
    );
  }
  return map as Record<string, string>;
}

/** Every tensor of the file is either checked or listed here. */
function printUnused(unused: readonly { name: string; reason: string }[]): void {
  for (const u of unused) console.log(`unused: ${u.name} (${u.reason})`);
}

async function candidateMain(path: string, o: {
  precision?: string;
  chunkSize?: string;
  svg?: string;
  map?: string;
  compare?: string;
  json?: string;
  format: "text" | "markdown";
}): Promise<number> {
  if (
    o.precision !== undefined && o.precision !== "bf16" && o.precision !== "f16" &&
    o.precision !== "f32"
  ) {
    throw new UsageError(`--precision must be bf16, f16 or f32: got ${o.precision}`);
  }
  const chunkSize = decimal(o.chunkSize ?? "64");
  if (chunkSize !== 16 && chunkSize !== 32 && chunkSize !== 64) {
    throw new UsageError(`--chunk-size must be 16, 32 or 64: got ${o.chunkSize}`);
  }
  const file = readSafetensors(await readFileBytes(path, "--candidate"));
  const precision = o.precision as Precision | undefined;
  const map = o.map === undefined ? undefined : await readMap(o.map);
  if (o.compare !== undefined && isLayerCandidate(file, map)) {
    throw new UsageError(
      `--compare compares two op candidates' results and has no effect on a layer candidate: got --compare ${o.compare}`,
    );
  }
  if (o.compare !== undefined) {
    const other = readSafetensors(await readFileBytes(o.compare, "--compare"));
    const diffs = compareCandidates(file, other);
    for (const d of diffs) {
      console.log(
        `${d.name}: ${d.differing} entries differ, max|Δ| ${
          fmt(d.maxDiff)
        }, first at ${d.firstIndex}`,
      );
    }
    console.log(
      diffs.length === 0
        ? "the two runs are bit-identical"
        : "NON-DETERMINISTIC: the two runs differ",
    );
    if (diffs.length > 0) return 1;
  }
  if (isLayerCandidate(file, map)) {
    const chunked = "places the op's errors by chunk";
    for (
      const [flag, value, does] of [
        ["--svg", o.svg, chunked],
        ["--chunk-size", o.chunkSize, chunked],
        [
          "--format",
          o.format === "markdown" ? o.format : undefined,
          "sets how the op's tables print",
        ],
      ] as const
    ) {
      if (value !== undefined) {
        throw new UsageError(
          `${flag} ${does} and has no effect on a layer candidate: got ${flag} ${value}`,
        );
      }
    }
    const report = await checkLayerCandidate(file, { precision, map });
    console.log(
      `layer candidate; reference: the f64 ${report.referenceArm} arm; ${report.precisionNote}`,
    );
    for (const r of [report.output, ...report.rows, ...(report.input ? [report.input] : [])]) {
      console.log(
        r.missing
          ? `  ${r.name.padEnd(22)}missing: the file holds no grad/${r.name}  FAIL`
          : `  ${r.name.padEnd(22)}${fmt(r.agreement.rel)} (abs ${fmt(r.agreement.absDiff)}, ref ${
            fmt(r.agreement.refMax)
          })  bar ${r.bar.toExponential(1)}  ${r.ok ? "ok" : "FAIL"}`,
      );
    }
    if (report.input === null) {
      console.log("note: the file holds no grad/x, so nothing checks the input's gradient");
    }
    printUnused(report.unused);
    if (report.diagnosis) console.log(`diagnosis: ${report.diagnosis}`);
    console.log(report.ok ? "CANDIDATE AGREES" : "CANDIDATE DISAGREES");
    if (o.json !== undefined) {
      await Deno.writeTextFile(o.json, `${JSON.stringify(report, null, 2)}\n`);
      console.error(`prove: wrote ${o.json}`);
    }
    return report.ok ? 0 : 1;
  }
  if (o.map !== undefined) {
    throw new UsageError(
      `--map names a layer's parameters and has no effect on an op candidate: got --map ${o.map}`,
    );
  }
  const report = await checkCandidate(file, { precision, chunkSize });
  const { N, lengths, H, HV, K, V } = report.dims;
  console.log(
    `candidate: ${N} sequence(s) of ${[...new Set(lengths)].join("/")} tokens, H=${H}${
      HV !== H ? ` HV=${HV}` : ""
    } K=${K} V=${V}; reference: the f64 ${report.referenceArm} arm; ${report.precisionNote}`,
  );
  console.log(report.barNote);
  for (const note of report.notes) console.log(`note: ${note}`);
  printUnused(report.unused);
  const header = [
    "tensor",
    "max|a−b|/max|b|",
    "max|a−b|",
    "max|b|",
    "rms ratio",
    "worst at",
    "bar",
    "verdict",
  ];
  const cells = report.rows.map((r) => [
    r.name,
    fmt(r.agreement.rel),
    fmt(r.agreement.absDiff),
    fmt(r.agreement.refMax),
    fmt(r.rmsRatio),
    r.worst.t === undefined
      ? `b=${r.worst.b} h=${r.worst.h} k=${r.worst.channel}`
      : `b=${r.worst.b} t=${r.worst.t} h=${r.worst.h} chunk=${r.worst.chunk} ch=${r.worst.channel}`,
    r.bar.toExponential(1),
    !r.checked ? `unchecked: ${r.note}` : r.ok ? "ok" : "FAIL",
  ]);
  if (o.format === "markdown") {
    console.log(`| ${header.map(cellText).join(" | ")} |\n|${header.map(() => "---").join("|")}|`);
    for (const c of cells) console.log(`| ${c.map(cellText).join(" | ")} |`);
  } else {
    const w = header.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i].length)) + 2);
    console.log(header.map((h, i) => h.padEnd(w[i])).join(""));
    for (const c of cells) console.log(c.map((x, i) => x.padEnd(w[i])).join(""));
  }
  console.log(
    report.ok
      ? "CANDIDATE AGREES"
      : report.rows.some((r) => r.checked)
      ? "CANDIDATE DISAGREES"
      : "CANDIDATE CHECKS NOTHING: every result's reference is all zeros",
  );
  if (o.svg !== undefined) {
    await Deno.writeTextFile(o.svg, heatmapSvg(report));
    console.error(`prove: wrote ${o.svg}`);
  }
  if (o.json !== undefined) {
    const rows = report.rows.map(({ cells: _cells, ...r }) => ({
      ...r,
      rel: r.agreement.rel,
      absMax: r.agreement.absDiff,
      refMax: r.agreement.refMax,
    }));
    await Deno.writeTextFile(o.json, `${JSON.stringify({ ...report, rows }, null, 2)}\n`);
    console.error(`prove: wrote ${o.json}`);
  }
  return report.ok ? 0 : 1;
}

if (import.meta.main) {
  try {
    Deno.exit(await main(Deno.args));
  } catch (error) {
    // A refused arm or a bad flag is an answer, not a crash: say it in one line.
    console.error(`prove: ${error instanceof Error ? error.message : String(error)}`);
    Deno.exit(2);
  }
}
