// `prove --candidate … --compare other`: two runs of a kernel on the same inputs, compared bit for
// bit. A deterministic kernel gives identical results from identical inputs; the two files must
// hold the same inputs and the same results (at least one), so that "bit-identical" never means
// "nothing compared".

import type { SafetensorsFile } from "../io/mod.ts";
import { CANDIDATE_INPUTS, CANDIDATE_RESULTS } from "./candidate.ts";
import { listNames } from "./_candidate_file.ts";

/** Where two candidate files made from the same inputs differ. */
export interface CandidateDiff {
  /** The result's name. */
  name: string;
  /** Entries whose bits differ. */
  differing: number;
  /** max|a−b|. */
  maxDiff: number;
  /** Where the first differing entry sits (flat index). */
  firstIndex: number;
}

/** Entries of two arrays whose values differ (NaN equals NaN, -0 differs from 0). */
function differences(x: ArrayLike<number>, y: ArrayLike<number>) {
  let differing = 0, maxDiff = 0, firstIndex = -1;
  for (let i = 0; i < x.length; i++) {
    if (!Object.is(x[i], y[i])) {
      differing++;
      if (firstIndex < 0) firstIndex = i;
      maxDiff = Math.max(maxDiff, Math.abs(x[i] - y[i]));
    }
  }
  return { differing, maxDiff, firstIndex };
}

/**
 * Compares two candidate files bit for bit: a deterministic kernel gives identical results from
 * identical inputs. The files must hold the same inputs (bit for bit) and the same results, at
 * least one, so that "identical" never means "nothing compared".
 *
 * @param a One file.
 * @param b The other.
 * @returns The results that differ (empty when the runs are bit-identical).
 *
 * @example Usage
 * ```ts
 * import { compareCandidates } from "./candidate_compare.ts";
 * import { readSafetensors, writeSafetensors } from "../io/mod.ts";
 * const run = (o: number) =>
 *   readSafetensors(writeSafetensors({
 *     q: { data: new Float32Array([1]), shape: [1, 1, 1, 1] },
 *     o: { data: new Float32Array([o]), shape: [1, 1, 1, 1] },
 *   }));
 * if (compareCandidates(run(0.5), run(0.5)).length !== 0) throw new Error("differ");
 * ```
 */
export function compareCandidates(a: SafetensorsFile, b: SafetensorsFile): CandidateDiff[] {
  const only = (names: readonly string[]) =>
    names.flatMap((n) =>
      a.tensors.has(n) === b.tensors.has(n)
        ? []
        : [`${n} in the ${a.tensors.has(n) ? "first" : "second"} file only`]
    );
  const lengthOf = (name: string, x: ArrayLike<number>, y: ArrayLike<number>) => {
    if (x.length !== y.length) {
      throw new RangeError(
        `candidate tensor ${name} must have the same length in both files: got ${x.length} and ${y.length}`,
      );
    }
  };
  const inputsApart = only(CANDIDATE_INPUTS);
  for (const name of CANDIDATE_INPUTS) {
    const x = a.tensors.get(name)?.data, y = b.tensors.get(name)?.data;
    if (x === undefined || y === undefined) continue;
    lengthOf(name, x, y);
    const d = differences(x, y);
    if (d.differing > 0) inputsApart.push(`${name} differing in ${d.differing} entries`);
  }
  if (inputsApart.length > 0) {
    throw new RangeError(
      `candidate files must hold the same inputs to be compared bit for bit: got ${
        listNames(inputsApart)
      }`,
    );
  }
  const resultsApart = only(CANDIDATE_RESULTS);
  const common = CANDIDATE_RESULTS.filter((n) => a.tensors.has(n) && b.tensors.has(n));
  if (resultsApart.length > 0 || common.length === 0) {
    throw new RangeError(
      `candidate files must hold the same results, at least one, to be compared: got ${
        resultsApart.length > 0 ? listNames(resultsApart) : "no result in either"
      }`,
    );
  }
  const diffs: CandidateDiff[] = [];
  for (const name of common) {
    const x = a.tensors.get(name)!.data, y = b.tensors.get(name)!.data;
    lengthOf(name, x, y);
    const d = differences(x, y);
    if (d.differing > 0) diffs.push({ name, ...d });
  }
  return diffs;
}
