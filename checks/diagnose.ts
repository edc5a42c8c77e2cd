// The diagnosis line a failed proof prints: the pattern of what failed, named as the bug it points
// to. The order matters: the most specific pattern wins.

import { downstreamGroups, type ProofReport } from "./_proof_report.ts";

const e = (x: number) => Number.isNaN(x) ? "NaN" : x.toExponential(2);

/**
 * Classifies a failed proof.
 *
 * @param report The proof's report (not ok).
 * @returns One line starting with the pattern's name.
 */
export function diagnose(report: ProofReport): string {
  const { reproducible, forward, rows, input, op, seam } = report;
  if (!reproducible.ok) {
    const first = reproducible.mismatched[0];
    return `Non-deterministic: reruns differ${
      first ? `, first in ${first.name} (max|Δ| ${e(first.maxDiff)})` : ""
    }${reproducible.otherProcess === "differs" ? "; the second process differs too" : ""}`;
  }
  if (!forward.ok || op.rows.some((r) => (r.name === "o" || r.name === "ht") && !r.ok)) {
    return `The forward differs: |ΔL|/Σ|y·r| = ${e(forward.rel)} (tol ${e(forward.tol)})${
      op.rows.filter((r) => (r.name === "o" || r.name === "ht") && !r.ok).map((r) =>
        `; op ${r.name} ${e(r.agreement.rel)}`
      ).join("")
    }`;
  }
  const after = downstreamGroups(report.config);
  const upstream = rows.filter((r) => !after.includes(r.name));
  const downstream = rows.filter((r) => after.includes(r.name));
  const downstreamAgree = downstream.every((r) => r.referenceOk);
  const upstreamZero = upstream.length > 0 &&
    upstream.every((r) => r.gradMax === 0);
  if (downstreamAgree && upstreamZero) {
    // x reaches the output through the op and around it (the output gate reads x), so a cut at
    // the op leaves dx its paths around the op: wrong, but not zero.
    return `The graph is cut at the op: the ${upstream.length} groups upstream of it have no ` +
      `gradient${
        input.referenceOk
          ? ""
          : ` and dx keeps only its paths around it (off by ${e(input.reference.rel)})`
      }, while the ${downstream.length} applied after it agree`;
  }
  const badUpstream = [...upstream, input].filter((r) => !r.ok).map((r) => r.name);
  const badOp = op.rows.filter((r) => !r.ok).map((r) => r.name);
  if (downstreamAgree && (badUpstream.length > 0 || badOp.length > 0 || !op.transpose.ok)) {
    return `The op's adjoint is wrong: the forward and the ${downstream.length} groups after the ` +
      `op agree, but ${
        [...badUpstream, ...badOp.map((n) => `op ${n}`)].join(", ") || "no tensor"
      }` +
      ` ${badUpstream.length + badOp.length === 1 ? "does" : "do"} not${
        op.transpose.ok ? "" : ` (⟨Ju,v⟩ vs ⟨u,Jᵀv⟩ off by ${e(op.transpose.rel)})`
      }`;
  }
  if (!report.seamOk) {
    if (seam.fusedFwd > 0 && seam.opsPath > 0) {
      return `A fused forward was discarded: the counters read fusedFwd ${seam.fusedFwd}, ` +
        `fusedBwd ${seam.fusedBwd}, opsPath ${seam.opsPath}, so the ops path carried the step`;
    }
    if (seam.fusedFwd > 0 && seam.customNodeBwd === 0) {
      return `A decline hid behind a fused label: the counters read fusedFwd ${seam.fusedFwd} but ` +
        `customNodeBwd ${seam.customNodeBwd} and fusedBwd ${seam.fusedBwd} after a backward`;
    }
    return `The seam's counters are off: expected ${report.seamExpected}, got ${
      JSON.stringify(seam)
    }`;
  }
  const failed = [
    ...[...rows, input].filter((r) => !r.ok).map((r) => r.name),
    ...(report.falsification.ok ? [] : ["falsification"]),
    ...(report.groups.missing.length || report.groups.extra.length ? ["groups"] : []),
  ];
  return `Unclassified failure: ${failed.join(", ") || "see the table"}`;
}
