// Turns every bench/results/*.json written by bench/gpu.ts into bench/results/REPORT.md and SVG
// charts. Per results file: one row per shape and kernel set (kernel times, host walls, the bytes
// one kdaVjp creates), a per-stage table per set, and on a hardware adapter each set against
// Triton and issue 18's targets per shape; a stacked per-stage bar per shape and set
// (<file>-stages.svg); kernel time against T, one series per adapter and set (time-vs-T.svg);
// before and after for every *-before.json; the profiles by subtraction of bench/ablate.ts.
// bench/results/ANALYSIS.md, when present, is included as the report's closing section (where the
// time goes, what would close the gap). Files without a `kernels` field timed the fused set.
//
// Run: deno run --allow-read=bench/results --allow-write=bench/results bench/report.ts [--dir=PATH]
//   --dir=PATH   read the results from PATH and write the report there (default bench/results/)

import { checkBenchArgs } from "./_args.ts";
import type { BenchShape } from "./gpu.ts";

/** Colours: one per stage name (the same in every chart), one per series of the T sweep. */
const PALETTE = [
  "#4e79a7",
  "#f28e2b",
  "#e15759",
  "#76b7b2",
  "#59a14f",
  "#edc948",
  "#b07aa1",
  "#ff9da7",
  "#9c755f",
  "#bab0ac",
  "#17becf",
  "#bcbd22",
];

/**
 * Triton chunk_kda (flash-linear-attention, bf16) on one H200, fwd / fwd+bwd ms, timed with
 * triton.testing.do_bench: issue 18's measurement, and issue 9's older one for the small shapes.
 */
const TRITON: Record<string, { ms: [number, number]; older?: true }> = {
  "8,4096,16,128": { ms: [1.77, 9.53] },
  "4,4096,16,128": { ms: [0.96, 4.94] },
  "2,256,2,32": { ms: [1.07, 2.78], older: true },
  "1,4096,2,128": { ms: [0.66, 2.36], older: true },
};
/** The date of issue 18's Triton measurement. */
const TRITON_DATE = "2026-11-30";

/**
 * Issue 18's targets, per step on GpuTensors with the default options: the host walls of kda and
 * kdaVjp (ms) and the bytes of GPU buffers one kdaVjp creates (GB).
 */
const TARGETS: Record<string, { forward: number; forwardBackward: number; gb: number }> = {
  "8,4096,16,128": { forward: 6, forwardBackward: 30, gb: 3 },
  "4,4096,16,128": { forward: 3, forwardBackward: 16, gb: 1.5 },
};

/** A figure as the JSON holds it: NaN is written as null, older files lack some. */
type Num = number | null | undefined;

interface Result extends BenchShape {
  /** The kernel set (absent in older files: fused). */
  kernels?: string;
  skipped?: string;
  failed?: string;
  kernelMs?: {
    forward: number | null;
    backward: number | null;
    total: number | null;
    stages: Record<string, number | null>;
  };
  residentMs?: { forward: Num; backward: Num };
  endToEndMs?: { forward: Num; forwardBackward: Num };
  deviceMs?: {
    forward: Num;
    forwardBackward: Num;
    /** Per step of 10 chained on GpuTensors with one read at the end (newer files). */
    chainedForward?: Num;
    chainedForwardBackward?: Num;
    createdBytesPerVjp?: Num;
    coldBytesPerVjp?: Num;
  };
  tflops?: { forward: Num; forwardBackward: Num };
  gbps?: { forward: Num; backward: Num };
}

/** A result with kernel times. */
type Timed = Result & { kernelMs: NonNullable<Result["kernelMs"]> };

interface ResultsFile {
  file: string;
  /** What the file measured, when it is not the current code (e.g. "before: ..."). */
  label?: string;
  note?: string;
  adapter: { description: string; software: boolean; timestamps: boolean };
  date: string;
  deno: string;
  quick: boolean;
  poolMaxBytes?: number | null;
  results: Result[];
}

/** A profile by subtraction, as bench/ablate.ts writes it. */
interface AblationFile {
  file: string;
  kernels?: string;
  B: number;
  T: number;
  H: number;
  K: number;
  C: number;
  stages: string[];
  rows: { section: string; ms: number[]; savedMs: number[] }[];
  note?: string;
}

const f = (x: Num, digits = 2) =>
  x === null || x === undefined || !Number.isFinite(x) ? "—" : x.toFixed(digits);
const ms = (x: Num) => f(x, x !== null && x !== undefined && x < 10 ? 3 : 1);
const gb = (bytes: Num) => {
  const v = bytes === null || bytes === undefined ? null : bytes / 1e9;
  return f(v, v !== null && v < 1 ? 3 : 2);
};
const ratio = (x: Num, y: Num) => {
  const r = x === null || x === undefined || !y ? null : x / y;
  return r === null || !Number.isFinite(r) ? "—" : `${f(r, r < 10 ? 2 : 1)}×`;
};
/** A ratio to a target, ticked when the target is met. */
const toTarget = (x: Num, target: number) => {
  const r = ratio(x, target);
  return r !== "—" && x! <= target ? `${r} ✓` : r;
};
const key = (r: BenchShape) => `${r.B},${r.T},${r.H},${r.K}`;
const shape = (r: BenchShape) => `(${r.B}, ${r.T}, ${r.H}, ${r.K})`;
const setOf = (r: { kernels?: string }) => r.kernels ?? "fused";
const unique = <T>(xs: T[]) => [...new Set(xs)];
const setsOf = (rows: Result[]) => unique(rows.map(setOf));
/** The stage names of the rows, in the order their stages objects list them. */
const stagesOf = (rows: Result[]) =>
  unique(rows.flatMap((r) => Object.keys(r.kernelMs?.stages ?? {})));
const timed = (rows: Result[]) => rows.filter((r): r is Timed => r.kernelMs !== undefined);

function table(headers: string[], rows: string[][]): string {
  return [
    `| ${headers.join(" | ")} |`,
    `|${headers.map(() => "---").join("|")}|`,
    ...rows.map((r) => `| ${r.join(" | ")} |`),
  ].join("\n");
}

const MAIN_HEADERS = [
  "(B, T, H, K=V)",
  "C",
  "kernels",
  "kernel fwd ms",
  "kernel bwd ms",
  "kernel fwd+bwd ms",
  "resident wall fwd / bwd ms",
  "GpuTensor step fwd / fwd+bwd ms",
  "end-to-end fwd / fwd+bwd ms",
  "created per kdaVjp, steady / cold (GB)",
  "TFLOP/s fwd / fwd+bwd",
  "GB/s fwd / bwd",
];

function mainRow(r: Result): string[] {
  const head = [shape(r), String(r.C), setOf(r)];
  if (r.kernelMs === undefined) {
    const why = r.skipped !== undefined ? `skipped: ${r.skipped}` : `failed: ${r.failed}`;
    return [...head, why, ...Array(MAIN_HEADERS.length - head.length - 1).fill("")];
  }
  const k = r.kernelMs, d = r.deviceMs;
  return [
    ...head,
    ms(k.forward),
    ms(k.backward),
    ms(k.total),
    `${ms(r.residentMs?.forward)} / ${ms(r.residentMs?.backward)}`,
    `${ms(d?.forward)} / ${ms(d?.forwardBackward)}`,
    `${ms(r.endToEndMs?.forward)} / ${ms(r.endToEndMs?.forwardBackward)}`,
    `${gb(d?.createdBytesPerVjp)} / ${gb(d?.coldBytesPerVjp)}`,
    `${f(r.tflops?.forward, 3)} / ${f(r.tflops?.forwardBackward, 3)}`,
    `${f(r.gbps?.forward, 1)} / ${f(r.gbps?.backward, 1)}`,
  ];
}

function stageCell(r: Timed, stage: string): string {
  const v = r.kernelMs.stages[stage];
  if (v === undefined) return "—";
  const share = v !== null && r.kernelMs.total ? v / r.kernelMs.total : null;
  return `${ms(v)} (${share === null ? "—" : Math.round(share * 100)}%)`;
}

/** One per-stage table per kernel set, with that set's own stages. */
function stageTables(rows: Timed[]): string[] {
  return setsOf(rows).flatMap((set) => {
    const mine = rows.filter((r) => setOf(r) === set);
    const stages = stagesOf(mine);
    return [
      `Per-stage kernel time of the ${set} set (ms; share of the row's fwd+bwd):`,
      "",
      table(
        ["(B, T, H, K=V)", "C", ...stages],
        mine.map((r) => [shape(r), String(r.C), ...stages.map((s) => stageCell(r, s))]),
      ),
      "",
    ];
  });
}

/**
 * A result's step walls: per step of 10 chained with one read (how the issue measured), where the
 * file has them, else one read per step.
 */
function stepOf(r: Timed | undefined): { forward: Num; forwardBackward: Num } {
  const d = r?.deviceMs;
  const chained = d?.chainedForward !== undefined && d?.chainedForward !== null &&
    Number.isFinite(d.chainedForward);
  return chained
    ? { forward: d!.chainedForward!, forwardBackward: d!.chainedForwardBackward ?? null }
    : { forward: d?.forward ?? null, forwardBackward: d?.forwardBackward ?? null };
}

/** One set's cells against Triton: kernel and step times, the step's ratio, the cold bytes. */
function tritonCells(r: Timed | undefined, triton: [number, number] | undefined): string[] {
  const d = r?.deviceMs, step = stepOf(r);
  return [
    `${ms(r?.kernelMs.forward)} / ${ms(r?.kernelMs.total)}`,
    `${ms(step.forward)} / ${ms(step.forwardBackward)}`,
    `${ratio(step.forward, triton?.[0])} / ${ratio(step.forwardBackward, triton?.[1])}`,
    gb(d?.coldBytesPerVjp),
  ];
}

/** One set's step walls and bytes (steady, cold) over issue 18's targets. */
function targetCell(r: Timed | undefined, t: (typeof TARGETS)[string] | undefined): string {
  if (t === undefined) return "—";
  const d = r?.deviceMs, step = stepOf(r);
  const bytes = (b: Num) => toTarget(b === null || b === undefined ? b : b / 1e9, t.gb);
  return [
    toTarget(step.forward, t.forward),
    toTarget(step.forwardBackward, t.forwardBackward),
    bytes(d?.createdBytesPerVjp),
    bytes(d?.coldBytesPerVjp),
  ].join(" / ");
}

/** Per shape of the issue group: each set against Triton and issue 18's targets. */
function tritonSection(rows: Timed[]): string[] {
  const issue = rows.filter((r) => r.group === "issue");
  const sets = setsOf(issue);
  const shapes = unique(issue.map(key)).filter((k) => TRITON[k] ?? TARGETS[k]);
  if (shapes.length === 0) return [];
  const body = shapes.map((k) => {
    const mine = issue.filter((r) => key(r) === k);
    const bySet = sets.map((set) => mine.find((r) => setOf(r) === set));
    const triton = TRITON[k], t = TARGETS[k];
    return [
      shape(mine[0]),
      triton === undefined ? "—" : `${triton.ms.join(" / ")}${triton.older ? " †" : ""}`,
      ...bySet.flatMap((r) => tritonCells(r, triton?.ms)),
      t === undefined ? "—" : `${t.forward} / ${t.forwardBackward} / ${t.gb}`,
      ...bySet.map((r) => targetCell(r, t)),
    ];
  });
  return [
    `Against Triton \`chunk_kda\` (flash-linear-attention, bf16, one H200, ` +
    `triton.testing.do_bench; issue 18's measurement of ${TRITON_DATE}; † issue 9's older ` +
    "measurement) and issue 18's targets (per step on GpuTensors, default options):",
    "",
    table(
      [
        "(B, T, H, K=V)",
        "Triton fwd / fwd+bwd ms",
        ...sets.flatMap((s) => [
          `${s} kernel fwd / fwd+bwd ms`,
          `${s} step fwd / fwd+bwd ms`,
          `${s} step / Triton`,
          `${s} cold GB per kdaVjp`,
        ]),
        "target step fwd / fwd+bwd ms / GB per kdaVjp",
        ...sets.map((s) => `${s} to target: fwd / fwd+bwd / steady GB / cold GB`),
      ],
      body,
    ),
    "",
    "The step is kda, or kdaVjp, on GpuTensors: per step of 10 chained with one read at the end, " +
    "as the issue measured (`deviceMs.chained*`; older files: each step followed by its one read, " +
    "`deviceMs.forward`, which adds a host sync of about 10 ms to every step). The targets are " +
    "measured on it, the kernel times (inputs resident, steady state) are beside it. The bytes are compared twice: steady is what one kdaVjp creates once " +
    "the buffer pool (on by default) holds the buffers of the steps before it, cold is what it " +
    "creates with the pool emptied first, its whole footprint on the device beyond the inputs. " +
    "✓: the target is met; GB = 10⁹ bytes.",
    "",
  ];
}

/** Per set: how the fwd+bwd kernel time of the T sweep grows against linear. */
function sweepLines(rows: Timed[]): string[] {
  return setsOf(rows).flatMap((set) => {
    const sweep = rows.filter((r) => r.group === "sweep" && setOf(r) === set && r.kernelMs.total)
      .sort((a, b) => a.T - b.T);
    if (sweep.length < 2) return [];
    const first = sweep[0], last = sweep[sweep.length - 1];
    const growth = (last.kernelMs.total! / first.kernelMs.total!) / (last.T / first.T);
    return [
      `T sweep, ${set} set: fwd+bwd kernel time grows ${f(growth, 2)}× linear from ` +
      `T=${first.T} to T=${last.T} (target ≤ 1.2×).`,
      "",
    ];
  });
}

function fileSection(doc: ResultsFile): string {
  const ok = timed(doc.results);
  const pool = doc.poolMaxBytes === undefined
    ? ""
    : ` Buffer pool bound: ${doc.poolMaxBytes === 0 ? "off" : `${gb(doc.poolMaxBytes)} GB`}.`;
  const out = [
    `## ${doc.adapter.description} — ${doc.date.slice(0, 10)}`,
    "",
    ...(doc.label !== undefined ? [`**${doc.label}**`, ""] : []),
    ...(doc.note !== undefined ? [doc.note, ""] : []),
    `File \`${doc.file}\`; Deno ${doc.deno}; ${doc.quick ? "quick subset" : "full set"}; ` +
    `software adapter: ${doc.adapter.software}; timestamp queries: ${doc.adapter.timestamps}; ` +
    `kernel sets: ${setsOf(doc.results).join(", ")}.${pool}` +
    " Kernel times are GPU timestamps with the inputs resident: steady state (the stages " +
    "repeated back to back in one submit, median per stage) where the file has it, else one " +
    "submit per run. Wall times are host clock: resident (one submit + one readback per call), " +
    "the GpuTensor step (kda, or kdaVjp, and the one read a step needs), end to end (typed " +
    "arrays in and out: kda and kdaVjp as a user calls them from files of 2026-12-07 on, " +
    "gpuForward and gpuBackward, without the calls' checked copies, in earlier files). " +
    "Created per kdaVjp: the bytes of GPU buffers one kdaVjp creates, " +
    "steady (the pool warm) / cold (the pool emptied first); GB = 10⁹ bytes.",
    "",
    table(MAIN_HEADERS, doc.results.map(mainRow)),
    "",
    ...stageTables(ok),
  ];
  if (!doc.adapter.software && doc.label === undefined) {
    out.push(...tritonSection(ok), ...sweepLines(ok));
  }
  return out.join("\n");
}

const svgOpen = (W: number, H: number) => [
  `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
  `<rect width="${W}" height="${H}" fill="white"/>`,
];

function svgTimeVsT(docs: ResultsFile[]): string {
  const W = 880, H = 400, L = 70, R = 380, Tm = 30, Bm = 50;
  const series: { name: string; color: string; dashed: boolean; points: [number, number][] }[] = [];
  // one series pair (fwd, fwd+bwd) per adapter and set, from the newest file that swept it
  const seen = new Set<string>();
  for (const d of [...docs].sort((a, b) => b.date.localeCompare(a.date))) {
    const adapter = d.adapter.description.split(" (")[0];
    for (const set of setsOf(d.results)) {
      const sweep = timed(d.results).filter((r) =>
        r.group === "sweep" && setOf(r) === set && r.kernelMs.total && r.kernelMs.forward
      ).sort((a, b) => a.T - b.T);
      if (sweep.length < 2 || seen.has(`${adapter}\n${set}`)) continue;
      seen.add(`${adapter}\n${set}`);
      const color = PALETTE[(seen.size - 1) % PALETTE.length];
      const tag = `${adapter} ${set} H=${sweep[0].H} (${d.date.slice(0, 10)})`;
      const points = (pick: (r: Timed) => number | null) =>
        sweep.map((r): [number, number] => [r.T, pick(r)!]);
      series.push(
        { name: `${tag} fwd`, color, dashed: true, points: points((r) => r.kernelMs.forward) },
        { name: `${tag} fwd+bwd`, color, dashed: false, points: points((r) => r.kernelMs.total) },
      );
    }
  }
  series.sort((a, b) => a.name.localeCompare(b.name));
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) return "";
  const lx = (t: number) => Math.log2(t);
  const xs = all.map(([t]) => lx(t)), ys = all.map(([, y]) => Math.log10(y));
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.floor(Math.min(...ys)), Math.ceil(Math.max(...ys))];
  const px = (t: number) => L + ((lx(t) - x0) / Math.max(1e-9, x1 - x0)) * (W - L - R);
  const py = (y: number) =>
    Tm + (1 - (Math.log10(y) - y0) / Math.max(1e-9, y1 - y0)) * (H - Tm - Bm);
  const parts = [
    ...svgOpen(W, H),
    `<text x="${L}" y="18" font-size="14">Kernel time vs T (B=1, K=V=128; log-log)</text>`,
    `<line x1="${L}" y1="${H - Bm}" x2="${W - R}" y2="${H - Bm}" stroke="black"/>`,
    `<line x1="${L}" y1="${Tm}" x2="${L}" y2="${H - Bm}" stroke="black"/>`,
  ];
  for (const t of unique(all.map(([t]) => t))) {
    parts.push(
      `<text x="${px(t)}" y="${H - Bm + 16}" text-anchor="middle">${t}</text>`,
      `<line x1="${px(t)}" y1="${H - Bm}" x2="${px(t)}" y2="${H - Bm + 4}" stroke="black"/>`,
    );
  }
  for (let e = y0; e <= y1; e++) {
    const y = py(10 ** e);
    parts.push(
      `<text x="${L - 6}" y="${y + 4}" text-anchor="end">${10 ** e} ms</text>`,
      `<line x1="${L}" y1="${y}" x2="${W - R}" y2="${y}" stroke="#ddd"/>`,
    );
  }
  parts.push(`<text x="${(L + W - R) / 2}" y="${H - 10}" text-anchor="middle">T (tokens)</text>`);
  series.forEach((s, i) => {
    const dash = s.dashed ? ` stroke-dasharray="6 3"` : "";
    const pts = s.points.map(([t, y]) => `${px(t).toFixed(1)},${py(y).toFixed(1)}`).join(" ");
    parts.push(
      `<polyline points="${pts}" fill="none" stroke="${s.color}" stroke-width="2"${dash}/>`,
    );
    for (const [t, y] of s.points) {
      parts.push(
        `<circle cx="${px(t).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3" fill="${s.color}"/>`,
      );
    }
    const y = Tm + i * 18;
    parts.push(
      `<line x1="${W - R + 10}" y1="${y + 6}" x2="${W - R + 30}" y2="${
        y + 6
      }" stroke="${s.color}" stroke-width="2"${dash}/>`,
      `<text x="${W - R + 36}" y="${y + 10}">${s.name}</text>`,
    );
  });
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}

/** Legend entries laid out in lines no wider than `width`; returns the parts and the height. */
function legend(names: string[], colors: Map<string, string>, width: number, y0: number) {
  const parts: string[] = [];
  let x = 10, y = y0;
  for (const name of names) {
    const w = 36 + 7 * name.length;
    if (x > 10 && x + w > width) x = 10, y += 18;
    parts.push(
      `<rect x="${x}" y="${y}" width="12" height="12" fill="${colors.get(name)}"/>`,
      `<text x="${x + 18}" y="${y + 10}">${name}</text>`,
    );
    x += w;
  }
  return { parts, height: y - y0 + 18 };
}

function svgStages(doc: ResultsFile, colors: Map<string, string>): string {
  const rows = timed(doc.results).filter((r) => r.kernelMs.total);
  if (rows.length === 0) return "";
  const W = 800, rowH = 26, L = 230, R = 90;
  const key = legend(stagesOf(rows), colors, W, 28);
  const Tm = 32 + key.height;
  const H = Tm + rows.length * rowH + 20;
  const max = Math.max(...rows.map((r) => r.kernelMs.total!));
  const sx = (v: number) => (v / max) * (W - L - R);
  const parts = [
    ...svgOpen(W, H),
    `<text x="10" y="18" font-size="14">Kernel time per stage, fwd+bwd — ${doc.adapter.description}</text>`,
    ...key.parts,
  ];
  rows.forEach((r, j) => {
    const y = Tm + j * rowH;
    const label = `${shape(r)} C=${r.C} ${setOf(r)}`;
    parts.push(`<text x="${L - 6}" y="${y + 16}" text-anchor="end">${label}</text>`);
    let x = L;
    for (const [stage, v] of Object.entries(r.kernelMs.stages)) {
      const w = sx(v ?? 0);
      parts.push(
        `<rect x="${x.toFixed(1)}" y="${y + 4}" width="${w.toFixed(1)}" height="${
          rowH - 8
        }" fill="${colors.get(stage)}"><title>${stage} ${ms(v)} ms</title></rect>`,
      );
      x += w;
    }
    parts.push(`<text x="${x + 4}" y="${y + 16}">${ms(r.kernelMs.total)} ms</text>`);
  });
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}

function ablationSection(a: AblationFile): string {
  const full = a.rows.find((r) => r.section === "(none)");
  if (full === undefined) return "";
  const shown = a.rows.filter((r) => r.section !== "(none)")
    .map((r) => ({ ...r, stage: r.savedMs.indexOf(Math.max(...r.savedMs)) }))
    .sort((x, y) => y.savedMs[y.stage] - x.savedMs[x.stage]);
  return [
    `## Profile by subtraction — ${setOf(a)} set, \`${a.file}\``,
    "",
    ...(a.note !== undefined ? [`**${a.note}**`, ""] : []),
    `Each marked section of the ${setOf(a)} set's WGSL removed in turn at ` +
    `(${a.B}, ${a.T}, ${a.H}, ${a.K}) C=${a.C} (bench/ablate.ts): the drop in its stage's kernel ` +
    "time is the section's cost. Full stage times: " +
    `${a.stages.map((s, i) => `${s} ${ms(full.ms[i])}`).join(", ")} ms.`,
    "",
    table(
      ["section", "stage", "saved ms", "share of the stage"],
      shown.map((r) => [
        r.section,
        a.stages[r.stage],
        ms(r.savedMs[r.stage]),
        `${f((100 * r.savedMs[r.stage]) / full.ms[r.stage], 0)} %`,
      ]),
    ),
    "",
  ].join("\n");
}

/** One before → after row: rows matched by shape, C and set; the stages of either. */
function beforeAfterRow(b: Timed, a: Timed): string[] {
  const kb = b.kernelMs, ka = a.kernelMs;
  const three = (k: Timed["kernelMs"]) => `${ms(k.forward)} / ${ms(k.backward)} / ${ms(k.total)}`;
  const stages = stagesOf([b, a]);
  return [
    `${shape(a)} C=${a.C}`,
    setOf(a),
    three(kb),
    three(ka),
    `${ratio(kb.forward, ka.forward)} / ${ratio(kb.backward, ka.backward)} / ${
      ratio(kb.total, ka.total)
    }`,
    stages.map((s) => `${s} ${ms(kb.stages[s])} → ${ms(ka.stages[s])}`).join("; "),
  ];
}

/**
 * Each *-before.json against the current file of the same name without "-before" (else the newest
 * current file of its adapter).
 */
function beforeAfter(docs: ResultsFile[]): string {
  const lines: string[] = [];
  for (const before of docs.filter((d) => d.file.endsWith("-before.json"))) {
    const same = docs.filter((d) =>
      d.label === undefined && d.adapter.description === before.adapter.description
    );
    const stem = before.file.replace(/-before\.json$/, ".json");
    const after = same.find((d) => d.file === stem) ?? same.at(-1);
    if (after === undefined) continue;
    const olds = timed(before.results);
    const rows = timed(after.results).flatMap((a) => {
      const b = olds.find((b) => key(b) === key(a) && b.C === a.C && setOf(b) === setOf(a));
      return b === undefined ? [] : [beforeAfterRow(b, a)];
    });
    if (rows.length === 0) continue;
    lines.push(
      `## Before and after — ${after.adapter.description}`,
      "",
      "Kernel time with the inputs resident (each file says how it was timed), " +
        `\`${before.file}\` against \`${after.file}\`, rows matched by shape, C and kernel set.`,
      "",
      table(
        [
          "shape",
          "kernels",
          "before fwd / bwd / total ms",
          "after fwd / bwd / total ms",
          "speed-up fwd / bwd / total",
          "per stage before → after (ms)",
        ],
        rows,
      ),
      "",
    );
  }
  return lines.join("\n");
}

/** Decoding throughput, as bench/decode.ts writes it (tokens per second). */
function decodeSection(file: string, doc: {
  what: string;
  adapter: { description: string };
  results: Record<string, number>[];
}): string {
  const tps = (x: number | undefined) => x === undefined ? "—" : x.toPrecision(3);
  return [
    `## Decoding — ${doc.adapter.description}, \`${file}\``,
    "",
    `${doc.what}: tokens per second.`,
    "",
    table(
      [
        "B",
        "tokens per call",
        "loop on GpuTensors",
        "decode kernel alone",
        "typed arrays",
        "cpu arm",
      ],
      doc.results.map((r) => [
        String(r.B),
        String(r.tokensPerCall),
        tps(r.deviceLoopTokensPerSecond),
        tps(r.kernelTokensPerSecond),
        tps(r.typedTokensPerSecond),
        tps(r.cpuTokensPerSecond),
      ]),
    ),
    "",
  ].join("\n");
}

/** Packed batches against their longest sequence alone, as bench/varlen.ts writes it. */
function varlenSection(file: string, doc: {
  adapter: { description: string };
  rows: Record<string, string | number>[];
}): string {
  return [
    `## Packed batches — ${doc.adapter.description}, \`${file}\``,
    "",
    "Host wall of kda and kdaVjp on GpuTensors with one read each (a chained step), median, per " +
    "kernel set (bench/varlen.ts): a packed batch should cost what its chunks cost.",
    "",
    table(
      ["case", "set", "T", "sequences", "chunks", "kda ms", "kdaVjp ms"],
      doc.rows.map((r) => [
        String(r.case),
        String(r.kernels),
        String(r.T),
        String(r.N),
        String(r.chunks),
        r.failed !== undefined ? `failed: ${r.failed}` : ms(r.forwardMs as number),
        r.failed !== undefined ? "" : ms(r.vjpMs as number),
      ]),
    ),
    "",
  ].join("\n");
}

/** The results folder: --dir=PATH (relative to the working directory), else bench/results/. */
function resultsDir(): URL {
  const arg = Deno.args.find((a) => a.startsWith("--dir="))?.slice(6);
  if (arg === undefined) return new URL("./results/", import.meta.url);
  return new URL(arg.endsWith("/") ? arg : `${arg}/`, `file://${Deno.cwd()}/`);
}

async function main(): Promise<void> {
  checkBenchArgs("bench:report", Deno.args, { valued: ["dir"] });
  const dir = resultsDir();
  const docs: ResultsFile[] = [];
  const ablations: AblationFile[] = [];
  const extras: string[] = [];
  for await (const entry of Deno.readDir(dir)) {
    if (!entry.isFile || !entry.name.endsWith(".json")) continue;
    const doc = JSON.parse(await Deno.readTextFile(new URL(entry.name, dir)));
    // bench/decode.ts and bench/varlen.ts have files of their own; bench/ablate.ts writes rows of
    // sections; bench/gpu.ts writes results
    if (entry.name.endsWith("-decode.json")) extras.push(decodeSection(entry.name, doc));
    else if (entry.name.endsWith("-varlen.json")) extras.push(varlenSection(entry.name, doc));
    else if (Array.isArray(doc.rows)) ablations.push({ ...doc, file: entry.name });
    else if (Array.isArray(doc.results)) docs.push({ ...doc, file: entry.name });
  }
  extras.sort();
  docs.sort((a, b) => a.file.localeCompare(b.file));
  ablations.sort((a, b) => a.file.localeCompare(b.file));
  const current = docs.filter((d) => d.label === undefined);
  const colors = new Map(
    stagesOf(docs.flatMap((d) => d.results)).map((s, i) => [s, PALETTE[i % PALETTE.length]]),
  );
  const lines = [
    "# gpu arm benchmark report",
    "",
    "Generated by `deno task bench:report` from the JSON files that `deno task bench:gpu` writes " +
    "here, one row per shape and kernel set. FLOP counts: `forwardFlops` and `backwardFlops` in " +
    "bench/gpu.ts (useful multiply-adds of the chunked equations, 2 FLOPs each). GB/s: the bytes " +
    "that must move (each input read once, each output written once) over the kernel time.",
    "",
  ];
  const timeVsT = svgTimeVsT(current);
  if (timeVsT !== "") {
    await Deno.writeTextFile(new URL("time-vs-T.svg", dir), timeVsT);
    lines.push("![kernel time vs T](time-vs-T.svg)", "");
  }
  lines.push(beforeAfter(docs));
  for (const doc of [...current, ...docs.filter((d) => d.label !== undefined)]) {
    const svg = svgStages(doc, colors);
    const svgName = doc.file.replace(/\.json$/, "-stages.svg");
    if (svg !== "") await Deno.writeTextFile(new URL(svgName, dir), svg);
    lines.push(fileSection(doc), svg !== "" ? `![per-stage kernel time](${svgName})\n` : "");
  }
  for (const a of ablations) lines.push(ablationSection(a));
  lines.push(...extras);
  try {
    lines.push(await Deno.readTextFile(new URL("ANALYSIS.md", dir)));
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  await Deno.writeTextFile(new URL("REPORT.md", dir), lines.join("\n") + "\n");
  console.log(`wrote ${new URL("REPORT.md", dir).pathname} from ${docs.length} results files`);
}

if (import.meta.main) await main();
