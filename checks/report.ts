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

/** The per-group table's columns, with one sentence each (the README quotes them). */
export const COLUMNS: readonly [string, string][] = [
  ["group", "the parameter group (docs/kda.md 2.4)"],
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
 * Prints a proof as text or markdown.
 *
 * @param report The proof's report.
 * @param format "text" or "markdown".
 * @param log Where lines go.
 */
export function printReport(
  report: ProofReport,
  format: "text" | "markdown",
  log: (line: string) => void,
): void {
  const md = format === "markdown";
  log(
    `${md ? "**gradient proof**" : "gradient proof"}: arm ${report.arm} (${report.dtype}), ` +
      `input [${report.dims.join(", ")}, ${report.config.dModel}], central differences on the ` +
      `${report.fdArm} arm in f64, reference arm ${report.referenceArm} (f64); L = ${
        e(report.loss, 6)
      }, Σ|y·r| = ${e(report.lossScale)}`,
  );
  const { missing, extra } = report.groups;
  log(
    missing.length || extra.length
      ? `GROUPS WRONG: missing [${missing.join(", ")}], extra [${extra.join(", ")}]`
      : `groups: all ${report.rows.length} expected groups present, none extra`,
  );
  log("");
  const header = COLUMNS.map(([c]) => c);
  const cells = report.rows.map((row) => [
    row.name,
    e(row.gradMax),
    row.fd ? e(row.fd.step, 1) : "-",
    fdCell(row.fd),
    report.dtype === "f32" ? fdCell(row.fd32) : "(f64: as left)",
    row.directional ? e(row.directional.rel) : "not run",
    formatAgreement(row.reference),
    row.ok ? (row.fd && !row.fd.resolved ? "ok (exact by JVP; FD unresolved)" : "ok") : "FAIL",
  ]);
  if (md) {
    log(`| ${header.map(cellText).join(" | ")} |`);
    log(`|${header.map(() => "---").join("|")}|`);
    for (const c of cells) log(`| ${c.map(cellText).join(" | ")} |`);
  } else {
    const widths = header.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i].length)) + 2);
    log(header.map((h, i) => h.padEnd(widths[i])).join(""));
    for (const c of cells) log(c.map((x, i) => x.padEnd(widths[i])).join(""));
  }
  log("");
  const ok = (b: boolean) => b ? "ok" : "FAIL";
  log(
    `forward agreement ${report.arm} vs ${report.referenceArm}: |ΔL|/Σ|y·r| = ${
      e(report.forward.rel)
    } (tol ${e(report.forward.tol, 0)}) ${ok(report.forward.ok)}`,
  );
  const op = report.op;
  const { B, T, H, K, V, chunkSize } = op.request;
  log(
    `the op alone (B=${B} T=${T} H=${H} K=${K} V=${V} C=${chunkSize}, with h0 and dht) vs f64 ${op.referenceArm}: ` +
      op.rows.map((r) => `${r.name} ${e(r.agreement.rel)}${r.ok ? "" : " FAIL"}`).join(", "),
  );
  log(
    `  ⟨J u, v⟩ = ${e(op.transpose.jv, 10)} vs ⟨u, Jᵀ v⟩ = ${e(op.transpose.vjt, 10)}: rel ${
      e(op.transpose.rel)
    } (tol ${e(op.transpose.tol, 0)}) ${ok(op.transpose.ok)}`,
  );
  const f = report.falsification;
  log(
    `falsification (KDA outputs detached on ${f.note}): red ${f.red.length} groups, expected ` +
      `${f.expectedRed.length} -> ${
        f.ok ? "ok: the check goes red" : "FAIL: it did not go red as it must"
      }`,
  );
  const rep = report.reproducible;
  log(
    `reruns: ${rep.runs} in this process, second process ${rep.otherProcess}: ${
      rep.ok
        ? "bit-identical output and gradients"
        : `BITS DIFFER in ${
          rep.mismatched.map((m) => `${m.name} (max|Δ| ${e(m.maxDiff)})`).join(", ")
        }`
    }`,
  );
  const s = report.seam;
  log(
    `seam: asked=${s.asked} fusedFwd=${s.fusedFwd} fusedBwd=${s.fusedBwd} declined=${s.declined} ` +
      `opsPath=${s.opsPath} customNodeBwd=${s.customNodeBwd} (expected ${report.seamExpected}) ${
        ok(report.seamOk)
      }`,
  );
  for (const d of report.declines) log(`  decision: ${d}`);
  if (report.diagnosis) log(`diagnosis: ${report.diagnosis}`);
  log(report.ok ? "PROOF HOLDS" : "PROOF FAILED");
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
 */
export function printKillTable(
  rows: readonly KillRow[],
  format: "text" | "markdown",
  log: (line: string) => void,
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
  for (const c of cells) log(`${c[1].padEnd(22)}${c[0]}\n${"".padEnd(22)}by ${c[2]}: ${c[3]}`);
}

/** The checks that went red in a report, in words, for the kill table. */
export function failedChecks(report: ProofReport): string {
  const out: string[] = [];
  if (!report.reproducible.ok) out.push("rerun bit-identity");
  if (!report.forward.ok) out.push("forward agreement");
  const groups = report.rows.filter((r) => !r.referenceOk).length;
  if (groups) out.push(`reference comparison (${groups} groups)`);
  const dir = report.rows.filter((r) => r.directional && !r.directional.ok).length;
  if (dir) out.push(`directional JVP check (${dir} groups)`);
  const op = report.op.rows.filter((r) => !r.ok).map((r) => r.name);
  if (op.length) out.push(`op alone (${op.join(", ")})`);
  if (!report.op.transpose.ok) out.push("⟨Ju,v⟩ = ⟨u,Jᵀv⟩");
  if (!report.seamOk) out.push("seam counters");
  if (!report.falsification.ok) out.push("falsification");
  return out.join(", ") || "none";
}
