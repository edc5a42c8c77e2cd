// `prove --candidate … --compare other`: two runs of a kernel on the same inputs, compared bit for
// bit. A deterministic kernel gives identical results from identical inputs; the two files must
// hold the same inputs and the same results (at least one), each stored alike (one dtype, one
// shape), so that "bit-identical" never means "nothing compared" or "equal after a conversion".

import type { SafetensorsFile, SafetensorsTensor } from "../io/mod.ts";
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

/** `F32 [2, 3]`: how a tensor is stored. */
const stored = (t: SafetensorsTensor) => `${t.dtype} [${t.shape.join(", ")}]`;

/**
 * Compares two candidate files bit for bit: a deterministic kernel gives identical results from
 * identical inputs. The files must hold the same inputs (bit for bit, each in one dtype and shape
 * in both) and the same results, at least one, each stored in one dtype and shape in both files,
 * so that "identical" never means "nothing compared" nor "equal once widened or reshaped" (an F64
 * result and an F32 one of equal values come from two different kernels or settings).
 *
 * @param a One file.
 * @param b The other.
 * @returns The results that differ (empty when the runs are bit-identical).
 * @throws {RangeError} When the inputs differ or are stored apart, or a result is in one file only
 *   or stored in another dtype or shape in the other.
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
  /** How `name` is stored apart in the two files, or undefined when alike. */
  const storedApart = (name: string, x: SafetensorsTensor, y: SafetensorsTensor) =>
    stored(x) === stored(y)
      ? undefined
      : `${name} stored as ${stored(x)} in the first file and ${stored(y)} in the second`;
  const inputsApart = only(CANDIDATE_INPUTS);
  for (const name of CANDIDATE_INPUTS) {
    const x = a.tensors.get(name), y = b.tensors.get(name);
    if (x === undefined || y === undefined) continue;
    // inputs of another dtype or shape are other inputs, even where their values convert equal
    const apart = storedApart(name, x, y);
    if (apart !== undefined) {
      inputsApart.push(apart);
      continue;
    }
    const d = differences(x.data, y.data);
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
  const storedOtherwise = common.flatMap((name) =>
    storedApart(name, a.tensors.get(name)!, b.tensors.get(name)!) ?? []
  );
  if (storedOtherwise.length > 0) {
    throw new RangeError(
      `candidate files must store each result in one dtype and shape to be compared bit for bit: got ${
        listNames(storedOtherwise)
      }`,
    );
  }
  const diffs: CandidateDiff[] = [];
  for (const name of common) {
    const d = differences(a.tensors.get(name)!.data, b.tensors.get(name)!.data);
    if (d.differing > 0) diffs.push({ name, ...d });
  }
  return diffs;
}
