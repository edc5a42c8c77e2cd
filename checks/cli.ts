/**
 * The main job, `deno task prove`: the per-group gradient proof of the KDA layer at the trainer
 * shape. Prints one row per parameter group, the reference comparison, the falsification, the
 * rerun and the seam's counters; exits 0 only when every check holds.
 *
 * Flags: `--arm ops|cpu|gpu` (default: gpu when a WebGPU adapter exists, else cpu), `--conv`
 * (the 14-group layer with the short convolution).
 *
 * @example Usage
 * ```sh
 * deno task prove --conv
 * ```
 *
 * @module
 */

import { parseArgs } from "node:util";
import type { Arm } from "../kda/_types.ts";
import { gpuStatus } from "../kda/gpu.ts";
import { formatAgreement } from "./compare.ts";
import { type ProofReport, runProof } from "./prove.ts";

const e = (x: number, digits = 2) => Number.isNaN(x) ? "NaN" : x.toExponential(digits);
const pad = (s: string, n: number) => s.padEnd(n);

function printReport(report: ProofReport, log: (line: string) => void): void {
  log(
    `gradient proof: arm ${report.arm} (${report.dtype}), central differences on the ${report.fdArm} arm in f64, ` +
      `reference arm ${report.referenceArm} (f64); L = ${e(report.loss, 6)}, Σ|y·r| = ${
        e(report.lossScale)
      }`,
  );
  const { missing, extra } = report.groups;
  log(
    missing.length || extra.length
      ? `GROUPS WRONG: missing [${missing.join(", ")}], extra [${extra.join(", ")}]`
      : `groups: all ${report.rows.length} expected groups present, none extra`,
  );
  log("");
  log(
    `${pad("group", 22)}${pad("shape", 12)}${pad("nonzero", 8)}${pad("finite", 7)}${
      pad("max|grad|", 11)
    }${pad("step h", 10)}${pad("rel @ probes (argmax, spread, spread)", 40)}status`,
  );
  for (const row of report.rows) {
    const probes = row.probes.map((p) =>
      p.resolved
        ? `${e(p.rel)}@${p.index}`
        : `UNRESOLVED@${p.index}(|g| ${e(Math.abs(p.grad))} < floor ${e(p.floor[0])})`
    ).join(" ");
    const status = !row.nonZero
      ? "FAIL (zero gradient)"
      : !row.finite
      ? "FAIL (non-finite)"
      : !row.resolved
      ? "UNRESOLVED"
      : row.ok
      ? "RESOLVED ok"
      : "RESOLVED FAIL";
    log(
      `${pad(row.name, 22)}${pad(`[${row.shape.join(",")}]`, 12)}${
        pad(row.nonZero ? "yes" : "NO", 8)
      }${pad(row.finite ? "yes" : "NO", 7)}${pad(e(row.gradMax), 11)}${pad(e(row.step, 1), 10)}${
        pad(probes, 40)
      }${status}`,
    );
  }
  log("");
  log(
    `forward agreement ${report.arm} vs ${report.referenceArm}: |ΔL|/Σ|y·r| = ${
      e(report.forward.rel)
    } ` +
      `(tol ${e(report.forward.tol, 0)}) ${report.forward.ok ? "ok" : "FAIL"}`,
  );
  log(
    `gradient agreement ${report.arm} vs ${report.referenceArm} (max|a−b|/max|b|, tol ${
      e(report.gradTol, 0)
    }):`,
  );
  for (const row of report.reference) {
    log(
      `  ${pad(row.name, 22)}${pad(formatAgreement(row.agreement), 44)}${row.ok ? "ok" : "FAIL"}`,
    );
  }
  const f = report.falsification;
  log(
    `falsification (KDA outputs detached on ${f.note}): red ${f.red.length} groups [${
      f.red.join(", ")
    }], ` +
      `expected ${f.expectedRed.length} -> ${
        f.ok ? "ok: the check goes red" : "FAIL: the check did not go red as it must"
      }`,
  );
  log(
    `rerun: ${
      report.reproducible.ok
        ? "bit-identical output and gradients"
        : `BITS DIFFER in ${report.reproducible.mismatched.join(", ")}`
    }`,
  );
  const s = report.seam;
  log(
    `seam: arm=${report.arm} asked=${s.asked} fusedFwd=${s.fusedFwd} fusedBwd=${s.fusedBwd} declined=${s.declined} ` +
      `opsPath=${s.opsPath} customNodeBwd=${s.customNodeBwd}`,
  );
  for (const d of report.declines) log(`  decline: ${d}`);
  log(report.ok ? "PROOF HOLDS" : "PROOF FAILED");
}

async function main(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { arm: { type: "string" }, conv: { type: "boolean", default: false } },
    strict: true,
  });
  const status = await gpuStatus();
  let arm: Arm;
  if (values.arm === undefined) arm = status.available ? "gpu" : "cpu";
  else if (values.arm === "ops" || values.arm === "cpu" || values.arm === "gpu") arm = values.arm;
  else {
    console.error(`--arm must be ops, cpu or gpu: got ${values.arm}`);
    return 2;
  }
  console.log(
    status.available
      ? `WebGPU adapter: ${status.info.description}`
      : `WebGPU adapter: none (${status.reason})`,
  );
  const started = performance.now();
  const report = await runProof({
    arm,
    config: { shortConv: values.conv },
    progress: (m) => console.error(`[${((performance.now() - started) / 1000).toFixed(1)} s] ${m}`),
  });
  printReport(report, console.log);
  console.error(`done in ${((performance.now() - started) / 1000).toFixed(1)} s`);
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
