// Shared by the test files: tolerance checks on the agreement metric of checks/compare.ts that keep
// the worst case for a one-line summary.

import { agreement } from "../checks/compare.ts";

export { agreement, sameBits as bitsEqual } from "../checks/compare.ts";

/** Checks agreements against a tolerance and keeps the worst one for a one-line summary. */
export class Worst {
  ratio = 0;
  label = "none";
  detail = "";
  count = 0;

  /** Throws unless `max|a − b| / max|b| <= tol` (NaN fails). */
  check(label: string, a: ArrayLike<number>, b: ArrayLike<number>, tol: number): void {
    const { rel, absDiff, refMax } = agreement(a, b);
    const detail = `ratio=${rel.toExponential(2)} max|a−b|=${absDiff.toExponential(2)} ` +
      `max|b|=${refMax.toExponential(2)}`;
    this.count++;
    if (!(rel <= tol)) throw new Error(`${label}: ${detail} exceeds tolerance ${tol}`);
    if (rel >= this.ratio) {
      this.ratio = rel;
      this.label = label;
      this.detail = detail;
    }
  }

  /** Prints the worst case. */
  report(what: string): void {
    console.log(`  ${what}: ${this.count} comparisons, worst ${this.label}: ${this.detail}`);
  }
}
