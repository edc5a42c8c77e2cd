// Printing a proof: one table row per parameter group, then every other check, as plain text or as
// markdown; and the kill table of the mutants.

import type { ProofReport } from "./_proof_report.ts";
import type { FdRow } from "./gradients.ts";
import { formatAgreement } from "./compare.ts";

/** A markdown table cell: its pipes (as in max|grad|) escaped. */
export const cellText = (s: string): string => s.replace(/\|/g, "\\|");

const e = (x: number, digits = 2) => Number.isNaN(x) ? "NaN" : x.toExponential(digits);

function fdCell(fd: FdRow | null): string {
  if (fd === null) return "not run";
  if (!fd.finite) {
    const { index, value } = fd.nonFinite!;
    return `${Number.isNaN(value) ? "NaN" : "INFINITE"} gradient@${index}`;
  }
  if (!fd.nonZero) return "ZERO gradient";
  return fd.probes.map((p) =>
    p.resolved
      ? `${e(p.rel)}@${p.index}`
      : `UNRESOLVED@${p.index} (|g| ${e(Math.abs(p.grad))} < floor ${e(p.floor[0])})`
  ).join(" ");
}

/**
 * The per-group table's columns with `--wide`, one sentence each (the README quotes them).
 */
export const COLUMNS: readonly [string, string][] = [
  ["group", "the parameter group (docs/kda.md 2.4), then x, the layer's input"],
  ["max|grad|", "the largest gradient entry of the arm under test; 0 means the group got none"],
  [
    "step h",
    "the derived central-difference step h* = (3·eps·|L|/|g|max)^(1/3), clamped to 0.1 of the group's RMS",
  ],
  [
    "FD f64 (rel@index)",
    "min(rel(h), rel(h/10)) of central differences of the exact f64 layer at three coordinates, or UNRESOLVED below the floor 32·eps·|L|/h",
  ],
  [
    "FD own precision",
    "the same in the arm's own precision (f32 for gpu): what f32 can resolve, beside what f64 resolves",
  ],
  [
    "directional",
    "|⟨∇L,u⟩ − J·u| / Σ|∇L⊙u| for a seeded direction u, J·u exact by forward mode on the f64 ops arm",
  ],
  [
    "vs reference",
    "max|a−b|/max|b| against the reference arm on the same bytes (abs diff and reference magnitude beside it)",
  ],
  ["status", "ok only when every column holds"],
];

/**
 * The per-group table's columns by default, which fit 100 characters: the worst figure of each
 * check, the details left to `--wide`. The own-precision column appears for f32 arms only.
 */
export const COMPACT_COLUMNS: readonly [string, string][] = [
  ["group", "the parameter group (docs/kda.md 2.4), then x, the layer's input"],
  ["max|grad|", "the largest gradient entry of the arm under test; 0 means the group got none"],
  [
    "FD f64",
    "the worst rel of central differences of the exact f64 layer over the probed coordinates, with resolved/probed beside it when some fall below the floor",
  ],
  [
    "f32 resolves",
    "how many probed coordinates central differences in the arm's own f32 forward resolve, and the worst rel among them: what f32 can see, beside f64",
  ],
  ["directional", "|⟨∇L,u⟩ − J·u| / Σ|∇L⊙u|, J·u exact by forward mode on the f64 ops arm"],
  ["vs ref", "max|a−b|/max|b| against the reference arm on the same bytes"],
  ["status", "ok only when every column holds; ok by JVP: FD unresolved, the exact check held"],
];

/** The compact central-difference cell: the worst resolved rel, and resolved/probed if not all. */
function compactFdCell(fd: FdRow | null): string {
  if (fd === null) return "not run";
  if (!fd.finite) {
    const { index, value } = fd.nonFinite!;
    return `${Number.isNaN(value) ? "NaN" : "INF"}@${index}`;
  }
  if (!fd.nonZero) return "ZERO";
  const resolved = fd.probes.filter((p) => p.resolved).length;
  if (resolved === 0) return `unres. 0/${fd.probes.length}`;
  return resolved === fd.probes.length ? e(fd.rel) : `${e(fd.rel)} ${resolved}/${fd.probes.length}`;
}

/** The compact own-precision cell: how many probes f32 resolves, and the worst rel among them. */
function compactOwnCell(fd: FdRow | null): string {
  if (fd === null) return "not run";
  if (!fd.finite || !fd.nonZero) return compactFdCell(fd);
  const resolved = fd.probes.filter((p) => p.resolved);
  const n = fd.probes.length;
  if (resolved.length === 0) return `0/${n} below floor`;
  return `${resolved.length}/${n}, ≤ ${e(Math.max(...resolved.map((p) => p.rel)))}`;
}

/** The width the default text output fits. */
export const WIDTH = 100;

/**
 * Breaks a line at spaces so each piece fits `width` characters, the pieces after the first
 * indented by `indent` (the first keeps its own indent); a word longer than the width stays whole.
 *
 * @param line The line.
 * @param width The width.
 * @param indent The continuation indent.
 * @returns The pieces.
 */
export function wrapLine(line: string, width: number, indent: string): string[] {
  if (line.length <= width) return [line];
  const lead = line.match(/^ */)![0];
  const out: string[] = [];
  let current = lead;
  for (const word of line.slice(lead.length).split(" ")) {
    const next = current.trim() === "" ? current + word : `${current} ${word}`;
    if (next.length <= width || current.trim() === "") {
      current = next;
    } else {
      out.push(current);
      current = indent + word;
    }
  }
  out.push(current);
  return out;
}

/** Options of {@linkcode printReport}. */
export interface PrintOptions {
  /**
   * Every column with every probe, and no line wrapped (default false: the compact table, and
   * text that fits {@linkcode WIDTH} characters).
   */
  wide?: boolean;
}

/**
 * Prints a proof as text or markdown.
 *
 * @param report The proof's report.
 * @param format "text" or "markdown".
 * @param log Where lines go.
 * @param options `wide` for every column (the default table fits 100 characters).
 */
export function printReport(
  report: ProofReport,
  format: "text" | "markdown",
  log: (line: string) => void,
  options: PrintOptions = {},
): void {
  const md = format === "markdown";
  // The default text output fits WIDTH: long lines wrap with an indent; the table is compact.
  const say = md || options.wide === true
    ? log
    : (line: string) => wrapLine(line, WIDTH, "  ").forEach((l) => log(l));
  say(
    `${md ? "**gradient proof**" : "gradient proof"}: arm ${report.arm} (${report.dtype}${
      report.kernels.length > 0 ? `, kernel set ${report.kernels.join(", ")}` : ""
    }), ` +
      `input [${report.dims.join(", ")}, ${report.config.dModel}], central differences on the ` +
      `${report.fdArm} arm in f64, reference arm ${report.referenceArm} (f64); L = ${
        e(report.loss, 6)
      }, Σ|y·r| = ${e(report.lossScale)}`,
  );
  const { missing, extra } = report.groups;
  say(
    missing.length || extra.length
      ? `GROUPS WRONG: missing [${missing.join(", ")}], extra [${extra.join(", ")}]`
      : `groups: all ${report.rows.length} expected groups present, none extra`,
  );
  say("");
  const own = report.dtype === "f32";
  const tableRows = [...report.rows, report.input];
  const { header, cells } = options.wide === true
    ? {
      header: COLUMNS.map(([c]) => c),
      cells: tableRows.map((row) => [
        row.name,
        e(row.gradMax),
        row.fd ? e(row.fd.step, 1) : "-",
        fdCell(row.fd),
        own ? fdCell(row.fd32) : "(f64: as left)",
        row.directional ? e(row.directional.rel) : "not run",
        formatAgreement(row.reference),
        row.ok ? (row.fd && !row.fd.resolved ? "ok (exact by JVP; FD unresolved)" : "ok") : "FAIL",
      ]),
    }
    : {
      header: COMPACT_COLUMNS.filter(([c]) => own || c !== "f32 resolves").map(([c]) => c),
      cells: tableRows.map((row) => [
        row.name,
        e(row.gradMax),
        compactFdCell(row.fd),
        ...(own ? [compactOwnCell(row.fd32)] : []),
        row.directional ? e(row.directional.rel) : "not run",
        e(row.reference.rel),
        row.ok ? (row.fd && !row.fd.resolved ? "ok by JVP" : "ok") : "FAIL",
      ]),
    };
  if (md) {
    log(`| ${header.map(cellText).join(" | ")} |`);
    log(`|${header.map(() => "---").join("|")}|`);
    for (const c of cells) log(`| ${c.map(cellText).join(" | ")} |`);
  } else {
    const widths = header.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i].length)) + 2);
    const line = (c: string[]) => c.map((x, i) => x.padEnd(widths[i])).join("");
    // The wide table keeps its padding as it always printed; the compact one ends at its text.
    const end = options.wide === true ? (t: string) => t : (t: string) => t.trimEnd();
    log(end(line(header)));
    for (const c of cells) log(end(line(c)));
  }
  if (options.wide !== true && !md) {
    say("(--wide: every probe with its index and floor, the step h, and vs ref's |a−b| and |b|)");
  }
  say("");
  const ok = (b: boolean) => b ? "ok" : "FAIL";
  say(
    `forward agreement ${report.arm} vs ${report.referenceArm}: |ΔL|/Σ|y·r| = ${
      e(report.forward.rel)
    } (tol ${e(report.forward.tol, 0)}) ${ok(report.forward.ok)}`,
  );
  const op = report.op;
  const { B, T, H, K, V, chunkSize } = op.request;
  say(
    `the op alone (B=${B} T=${T} H=${H} K=${K} V=${V} C=${chunkSize}, with h0 and dht) vs f64 ${op.referenceArm}: ` +
      op.rows.map((r) => `${r.name} ${e(r.agreement.rel)}${r.ok ? "" : " FAIL"}`).join(", "),
  );
  say(
    `  ⟨J u, v⟩ = ${e(op.transpose.jv, 10)} vs ⟨u, Jᵀ v⟩ = ${e(op.transpose.vjt, 10)}: rel ${
      e(op.transpose.rel)
    } (tol ${e(op.transpose.tol, 0)}) ${ok(op.transpose.ok)}`,
  );
  const f = report.falsification;
  const count = (names: readonly string[]) => {
    const groups = names.filter((n) => n !== report.input.name).length;
    return `${groups} groups${
      names.includes(report.input.name) ? ` and ${report.input.name}` : ""
    }`;
  };
  say(
    `falsification (KDA outputs detached on ${f.note}): red ${count(f.red)}, expected ` +
      `${count(f.expectedRed)} -> ${
        f.ok ? "ok: the check goes red" : "FAIL: it did not go red as it must"
      }`,
  );
  const rep = report.reproducible;
  say(
    `reruns: ${rep.runs} in this process, second process ${rep.otherProcess}: ${
      rep.ok
        ? "bit-identical output and gradients"
        : `BITS DIFFER in ${
          rep.mismatched.map((m) => `${m.name} (max|Δ| ${e(m.maxDiff)})`).join(", ")
        }`
    }`,
  );
  const s = report.seam;
  say(
    `seam: asked=${s.asked} fusedFwd=${s.fusedFwd} fusedBwd=${s.fusedBwd} declined=${s.declined} ` +
      `opsPath=${s.opsPath} customNodeBwd=${s.customNodeBwd} (expected ${report.seamExpected}) ${
        ok(report.seamOk)
      }`,
  );
  for (const d of report.declines) say(`  decision: ${d}`);
  if (report.diagnosis) say(`diagnosis: ${report.diagnosis}`);
  say(report.ok ? "PROOF HOLDS" : "PROOF FAILED");
}

/** One row of the kill table. */
export interface KillRow {
  mutant: string;
  description: string;
  caught: boolean;
  by: string;
  diagnosis: string;
  expected: boolean;
}

/**
 * Prints the mutants' kill table.
 *
 * @param rows One row per mutant.
 * @param format "text" or "markdown".
 * @param log Where lines go.
 * @param options `wide`: one line per row and check, however long (default: text fits 100).
 */
export function printKillTable(
  rows: readonly KillRow[],
  format: "text" | "markdown",
  log: (line: string) => void,
  options: PrintOptions = {},
): void {
  const header = ["mutant", "caught", "by which check", "diagnosis printed"];
  const cells = rows.map((r) => [
    `${r.mutant}: ${r.description}`,
    r.caught ? (r.expected ? "yes" : "yes, WRONG diagnosis") : "SURVIVED",
    r.by,
    r.diagnosis,
  ]);
  if (format === "markdown") {
    log(`| ${header.map(cellText).join(" | ")} |`);
    log(`|${header.map(() => "---").join("|")}|`);
    for (const c of cells) log(`| ${c.map(cellText).join(" | ")} |`);
    return;
  }
  const indent = "".padEnd(22);
  for (const c of cells) {
    const lines = [`${c[1].padEnd(22)}${c[0]}`, `${indent}by ${c[2]}: ${c[3]}`];
    if (options.wide === true) log(lines.join("\n"));
    else for (const l of lines.flatMap((x) => wrapLine(x, WIDTH, indent))) log(l);
  }
}

/** The checks that went red in a report, in words, for the kill table. */
export function failedChecks(report: ProofReport): string {
  const out: string[] = [];
  if (!report.reproducible.ok) out.push("rerun bit-identity");
  if (!report.forward.ok) out.push("forward agreement");
  const groups = report.rows.filter((r) => !r.referenceOk).length;
  const x = report.input;
  const withX = (n: number, bad: boolean) =>
    bad ? (n ? `${n} groups and ${x.name}` : x.name) : `${n} groups`;
  if (groups || !x.referenceOk) {
    out.push(`reference comparison (${withX(groups, !x.referenceOk)})`);
  }
  const dir = report.rows.filter((r) => r.directional && !r.directional.ok).length;
  const dirX = x.directional !== null && !x.directional.ok;
  if (dir || dirX) out.push(`directional JVP check (${withX(dir, dirX)})`);
  const op = report.op.rows.filter((r) => !r.ok).map((r) => r.name);
  if (op.length) out.push(`op alone (${op.join(", ")})`);
  if (!report.op.transpose.ok) out.push("⟨Ju,v⟩ = ⟨u,Jᵀv⟩");
  if (!report.seamOk) out.push("seam counters");
  if (!report.falsification.ok) out.push("falsification");
  return out.join(", ") || "none";
}
