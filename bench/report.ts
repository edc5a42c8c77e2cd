// Turns every bench/results/*.json written by bench/gpu.ts into bench/results/REPORT.md (tables,
// the issue's targets against Triton, the per-stage profile) and two SVG charts: kernel time
// against T (the T sweep), and stacked per-stage bars per shape. bench/results/ANALYSIS.md, when
// present, is included as the report's closing section (where the time goes, what would close
// the gap).
//
// Run: deno run --allow-read --allow-write bench/report.ts

import type { BenchShape } from "./gpu.ts";

const STAGES = ["intraChunk", "stateScan", "stateScanBackward", "intraChunkBackward"] as const;
const COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2"];
const SERIES_COLORS = ["#4e79a7", "#e15759", "#59a14f", "#b07aa1", "#9c755f", "#edc948"];

/** Triton chunk_kda (bf16) on the same H200, fwd / fwd+bwd ms, as measured for issue 9. */
const TRITON: Record<string, [number, number]> = {
  "2,256,2,32": [1.07, 2.78],
  "1,4096,2,128": [0.66, 2.36],
  "4,4096,16,128": [0.96, 5.21],
  "8,4096,16,128": [1.75, 10.05],
};
/** Issue 9's targets: kernel time, inputs resident (ms). */
const TARGETS: Record<string, { forward?: number; total: number }> = {
  "8,4096,16,128": { forward: 5, total: 30 },
  "4,4096,16,128": { forward: 3, total: 16 },
  "2,256,2,32": { total: 1 },
};

interface Result extends BenchShape {
  skipped?: string;
  failed?: string;
  kernelMs?: {
    forward: number | null;
    backward: number | null;
    total: number | null;
    stages: Record<string, number | null>;
  };
  residentMs?: { forward: number; backward: number };
  endToEndMs?: { forward: number; forwardBackward: number };
  deviceMs?: { forward: number; forwardBackward: number };
  tflops?: { forward: number | null; forwardBackward: number | null };
  gbps?: { forward: number | null; backward: number | null };
}

interface ResultsFile {
  file: string;
  /** What the file measured, when it is not the current code (e.g. "before: ..."). */
  label?: string;
  adapter: { description: string; software: boolean; timestamps: boolean };
  date: string;
  deno: string;
  quick: boolean;
  results: Result[];
}

const f = (x: number | null | undefined, digits = 2) =>
  x === null || x === undefined || !Number.isFinite(x) ? "—" : x.toFixed(digits);
const ms = (x: number | null | undefined) =>
  x === null || x === undefined ? "—" : f(x, x < 10 ? 3 : 1);
const key = (r: Result) => `${r.B},${r.T},${r.H},${r.K}`;

function table(headers: string[], rows: string[][]): string {
  return [
    `| ${headers.join(" | ")} |`,
    `|${headers.map(() => "---").join("|")}|`,
    ...rows.map((r) => `| ${r.join(" | ")} |`),
  ].join("\n");
}

function fileSection(doc: ResultsFile): string {
  const ok = doc.results.filter((r) => r.kernelMs !== undefined);
  const out = [
    `## ${doc.adapter.description} — ${doc.date.slice(0, 10)}`,
    "",
    ...(doc.label !== undefined ? [`**${doc.label}**`, ""] : []),
    `File \`${doc.file}\`; Deno ${doc.deno}; ${doc.quick ? "quick subset" : "full set"}; ` +
    `software adapter: ${doc.adapter.software}; timestamp queries: ${doc.adapter.timestamps}.` +
    " Kernel times are GPU timestamps with the inputs resident: steady state (the stages " +
    "repeated back to back in one submit, median per stage) where the file has it, else one " +
    "submit per run. Wall times are host clock, one submit + one readback per call.",
    "",
    table(
      [
        "(B, T, H, K=V)",
        "C",
        "kernel fwd ms",
        "kernel bwd ms",
        "kernel fwd+bwd ms",
        "resident wall fwd / bwd ms",
        "GpuTensor step fwd / fwd+bwd ms",
        "end-to-end fwd / fwd+bwd ms",
        "TFLOP/s fwd / fwd+bwd",
        "GB/s fwd / bwd",
      ],
      doc.results.map((r) =>
        r.kernelMs === undefined
          ? [
            `(${r.B}, ${r.T}, ${r.H}, ${r.K})`,
            String(r.C),
            r.skipped ? `skipped: ${r.skipped}` : `failed: ${r.failed}`,
            ...Array(7).fill(""),
          ]
          : [
            `(${r.B}, ${r.T}, ${r.H}, ${r.K})`,
            String(r.C),
            ms(r.kernelMs.forward),
            ms(r.kernelMs.backward),
            ms(r.kernelMs.total),
            `${ms(r.residentMs?.forward)} / ${ms(r.residentMs?.backward)}`,
            `${ms(r.deviceMs?.forward)} / ${ms(r.deviceMs?.forwardBackward)}`,
            `${ms(r.endToEndMs?.forward)} / ${ms(r.endToEndMs?.forwardBackward)}`,
            `${f(r.tflops?.forward, 3)} / ${f(r.tflops?.forwardBackward, 3)}`,
            `${f(r.gbps?.forward, 1)} / ${f(r.gbps?.backward, 1)}`,
          ]
      ),
    ),
    "",
    "Per-stage kernel time (ms; share of fwd+bwd):",
    "",
    table(
      ["(B, T, H, K=V)", "C", ...STAGES],
      ok.map((r) => [
        `(${r.B}, ${r.T}, ${r.H}, ${r.K})`,
        String(r.C),
        ...STAGES.map((s) => {
          const v = r.kernelMs!.stages[s];
          const share = v !== null && r.kernelMs!.total ? v / r.kernelMs!.total : null;
          return `${ms(v)} (${share === null ? "—" : Math.round(share * 100)}%)`;
        }),
      ]),
    ),
    "",
  ];
  if (!doc.adapter.software && doc.label === undefined) {
    const rows = ok.filter((r) => r.group === "issue" && TRITON[key(r)] !== undefined).map((r) => {
      const [tf, tb] = TRITON[key(r)];
      const t = TARGETS[key(r)];
      return [
        `(${r.B}, ${r.T}, ${r.H}, ${r.K})`,
        `${tf} / ${tb}`,
        `${ms(r.kernelMs!.forward)} / ${ms(r.kernelMs!.total)}`,
        `${f(r.kernelMs!.forward! / tf, 1)}× / ${f(r.kernelMs!.total! / tb, 1)}×`,
        t === undefined ? "—" : `${t.forward ?? "—"} / ${t.total}`,
        t === undefined
          ? "—"
          : `${t.forward !== undefined ? f(r.kernelMs!.forward! / t.forward, 1) + "×" : "—"} / ${
            f(r.kernelMs!.total! / t.total, 1)
          }×`,
      ];
    });
    out.push(
      "Against Triton `chunk_kda` (bf16, same H200) and issue 9's targets (kernel, resident):",
      "",
      table(
        [
          "(B, T, H, K=V)",
          "Triton fwd / fwd+bwd ms",
          "gpu arm kernel fwd / fwd+bwd ms",
          "ratio to Triton",
          "target fwd / fwd+bwd ms",
          "ratio to target",
        ],
        rows,
      ),
      "",
    );
    const sweep = ok.filter((r) => r.group === "sweep").sort((a, b) => a.T - b.T);
    if (sweep.length >= 2) {
      const first = sweep[0], last = sweep[sweep.length - 1];
      const growth = (last.kernelMs!.total! / first.kernelMs!.total!) / (last.T / first.T);
      out.push(
        `T sweep: fwd+bwd kernel time grows ${f(growth, 2)}× linear from T=${first.T} to ` +
          `T=${last.T} (target ≤ 1.2×).`,
        "",
      );
    }
  }
  return out.join("\n");
}

function svgTimeVsT(docs: ResultsFile[]): string {
  const W = 720, H = 400, L = 70, R = 240, Tm = 30, Bm = 50;
  const series: { name: string; points: [number, number][] }[] = [];
  for (const d of docs) {
    const sweep = d.results.filter((r) => r.group === "sweep" && r.kernelMs?.total)
      .sort((a, b) => a.T - b.T);
    if (sweep.length < 2) continue;
    const tag = `${d.adapter.description.split(" (")[0]} H=${sweep[0].H}`;
    series.push({ name: `${tag} fwd`, points: sweep.map((r) => [r.T, r.kernelMs!.forward!]) });
    series.push({ name: `${tag} fwd+bwd`, points: sweep.map((r) => [r.T, r.kernelMs!.total!]) });
  }
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
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${L}" y="18" font-size="14">Kernel time vs T (B=1, K=V=128; log-log)</text>`,
    `<line x1="${L}" y1="${H - Bm}" x2="${W - R}" y2="${H - Bm}" stroke="black"/>`,
    `<line x1="${L}" y1="${Tm}" x2="${L}" y2="${H - Bm}" stroke="black"/>`,
  ];
  for (const t of [...new Set(all.map(([t]) => t))]) {
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
    const c = SERIES_COLORS[i % SERIES_COLORS.length];
    const pts = s.points.map(([t, y]) => `${px(t).toFixed(1)},${py(y).toFixed(1)}`).join(" ");
    parts.push(`<polyline points="${pts}" fill="none" stroke="${c}" stroke-width="2"/>`);
    for (const [t, y] of s.points) {
      parts.push(`<circle cx="${px(t).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3" fill="${c}"/>`);
    }
    parts.push(
      `<rect x="${W - R + 10}" y="${Tm + i * 18}" width="12" height="12" fill="${c}"/>`,
      `<text x="${W - R + 28}" y="${Tm + i * 18 + 10}">${s.name}</text>`,
    );
  });
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}

function svgStages(doc: ResultsFile): string {
  const rows = doc.results.filter((r) => r.kernelMs?.total);
  if (rows.length === 0) return "";
  const W = 760, rowH = 26, L = 190, R = 40, Tm = 50;
  const H = Tm + rows.length * rowH + 40;
  const max = Math.max(...rows.map((r) => r.kernelMs!.total!));
  const sx = (v: number) => (v / max) * (W - L - R);
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="10" y="18" font-size="14">Kernel time per stage, fwd+bwd — ${doc.adapter.description}</text>`,
  ];
  STAGES.forEach((s, i) => {
    parts.push(
      `<rect x="${10 + i * 180}" y="28" width="12" height="12" fill="${COLORS[i]}"/>`,
      `<text x="${28 + i * 180}" y="38">${s}</text>`,
    );
  });
  rows.forEach((r, j) => {
    const y = Tm + j * rowH;
    parts.push(
      `<text x="${L - 6}" y="${
        y + 16
      }" text-anchor="end">(${r.B}, ${r.T}, ${r.H}, ${r.K}) C=${r.C}</text>`,
    );
    let x = L;
    STAGES.forEach((s, i) => {
      const w = sx(r.kernelMs!.stages[s] ?? 0);
      parts.push(
        `<rect x="${x.toFixed(1)}" y="${y + 4}" width="${w.toFixed(1)}" height="${
          rowH - 8
        }" fill="${COLORS[i]}"/>`,
      );
      x += w;
    });
    parts.push(`<text x="${x + 4}" y="${y + 16}">${ms(r.kernelMs!.total)} ms</text>`);
  });
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}

/** A profile by subtraction, as bench/ablate.ts writes it. */
interface AblationFile {
  file: string;
  B: number;
  T: number;
  H: number;
  K: number;
  C: number;
  stages: string[];
  rows: { section: string; ms: number[]; savedMs: number[] }[];
  note?: string;
}

function ablationSection(a: AblationFile): string {
  const full = a.rows.find((r) => r.section === "(none)");
  if (full === undefined) return "";
  const shown = a.rows.filter((r) => r.section !== "(none)")
    .map((r) => ({ ...r, stage: r.savedMs.indexOf(Math.max(...r.savedMs)) }))
    .sort((x, y) => y.savedMs[y.stage] - x.savedMs[x.stage]);
  return [
    `## Profile by subtraction — \`${a.file}\``,
    "",
    ...(a.note !== undefined ? [`**${a.note}**`, ""] : []),
    `Each marked section of the WGSL removed in turn at (${a.B}, ${a.T}, ${a.H}, ${a.K}) C=${a.C} ` +
    "(bench/ablate.ts): the drop in its stage's kernel time is the section's cost. Full stage " +
    `times: ${a.stages.map((s, i) => `${s} ${ms(full.ms[i])}`).join(", ")} ms.`,
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

function beforeAfter(docs: ResultsFile[]): string {
  const lines: string[] = [];
  for (const after of docs.filter((d) => d.label === undefined)) {
    const before = docs.find((d) =>
      d.file.endsWith("-before.json") && d.adapter.description === after.adapter.description
    );
    if (before === undefined) continue;
    const rows: string[][] = [];
    for (const a of after.results) {
      const b = before.results.find((r) =>
        key(r) === key(a) && r.C === a.C && r.kernelMs !== undefined
      );
      if (b === undefined || a.kernelMs === undefined) continue;
      const sp = (x: number | null, y: number | null) =>
        x !== null && y !== null ? `${f(x / y, 1)}×` : "—";
      rows.push([
        `(${a.B}, ${a.T}, ${a.H}, ${a.K}) C=${a.C}`,
        `${ms(b.kernelMs!.forward)} / ${ms(b.kernelMs!.backward)} / ${ms(b.kernelMs!.total)}`,
        `${ms(a.kernelMs.forward)} / ${ms(a.kernelMs.backward)} / ${ms(a.kernelMs.total)}`,
        `${sp(b.kernelMs!.forward, a.kernelMs.forward)} / ${
          sp(b.kernelMs!.backward, a.kernelMs.backward)
        } / ${sp(b.kernelMs!.total, a.kernelMs.total)}`,
        STAGES.map((s) => `${ms(b.kernelMs!.stages[s])} → ${ms(a.kernelMs!.stages[s])}`).join("; "),
      ]);
    }
    if (rows.length === 0) continue;
    lines.push(
      `## Before and after — ${after.adapter.description}`,
      "",
      `Kernel time with the inputs resident (each file says how it was timed), \`${before.file}\` against ` +
        `\`${after.file}\`.`,
      "",
      table(
        [
          "shape",
          "before fwd / bwd / total ms",
          "after fwd / bwd / total ms",
          "speed-up fwd / bwd / total",
          "per stage before → after (ms): " + STAGES.join(", "),
        ],
        rows,
      ),
      "",
    );
  }
  return lines.join("\n");
}

async function main(): Promise<void> {
  const dir = new URL("./results", import.meta.url);
  const docs: ResultsFile[] = [];
  const ablations: AblationFile[] = [];
  for await (const entry of Deno.readDir(dir)) {
    if (!entry.isFile || !entry.name.endsWith(".json")) continue;
    const doc = JSON.parse(await Deno.readTextFile(new URL(entry.name, dir)));
    // bench/ablate.ts writes rows of sections; bench/gpu.ts writes results
    if (Array.isArray(doc.rows)) ablations.push({ ...doc, file: entry.name });
    else docs.push({ ...doc, file: entry.name });
  }
  docs.sort((a, b) => a.file.localeCompare(b.file));
  ablations.sort((a, b) => a.file.localeCompare(b.file));
  const current = docs.filter((d) => d.label === undefined);
  const lines = [
    "# gpu arm benchmark report",
    "",
    "Generated by `deno task bench:report` from the JSON files that `deno task bench:gpu` writes " +
    "here. FLOP counts: `forwardFlops` and `backwardFlops` in bench/gpu.ts (useful multiply-adds " +
    "of the chunked equations, 2 FLOPs each). GB/s: the bytes that must move (each input read " +
    "once, each output written once) over the kernel time.",
    "",
    "![kernel time vs T](time-vs-T.svg)",
    "",
  ];
  lines.push(beforeAfter(docs));
  const timeVsT = svgTimeVsT(current);
  if (timeVsT !== "") await Deno.writeTextFile(new URL("time-vs-T.svg", dir), timeVsT);
  for (const doc of [...current, ...docs.filter((d) => d.label !== undefined)]) {
    const svg = svgStages(doc);
    const svgName = doc.file.replace(/\.json$/, "-stages.svg");
    if (svg !== "") {
      await Deno.writeTextFile(new URL(svgName, dir), svg);
    }
    lines.push(fileSection(doc), svg !== "" ? `![per-stage kernel time](${svgName})\n` : "");
  }
  for (const a of ablations) lines.push(ablationSection(a));
  try {
    lines.push(await Deno.readTextFile(new URL("ANALYSIS.md", dir)));
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  await Deno.writeTextFile(new URL("REPORT.md", dir), lines.join("\n") + "\n");
  console.log(`wrote ${new URL("REPORT.md", dir).pathname} from ${docs.length} results files`);
}

if (import.meta.main) await main();
