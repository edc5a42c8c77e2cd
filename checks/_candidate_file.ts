// What the two candidate checkers (candidate.ts for the op, candidate_layer.ts for the layer)
// share: the precision a candidate is judged at (the caller's claim, else read from the file's
// dtypes), the rounding of each precision, the float-tensor check, and the refusal of a file that
// holds no candidate at all.

import type { SafetensorsDType, SafetensorsFile, SafetensorsTensor } from "../io/mod.ts";
import { bf16Bits, bf16Value, f16Bits, f16Value } from "../base/dtype.ts";

/** The precisions a candidate may claim. */
export type Precision = "bf16" | "f16" | "f32";

/** The precision a check runs at, and how it was chosen. */
export interface PrecisionChoice {
  /** The precision whose bars the candidate is judged against. */
  precision: Precision;
  /** `"option"`: the caller claimed it (`--precision`); `"file"`: read from the inputs' dtypes. */
  source: "option" | "file";
  /** One line for the report, e.g. `precision bf16 (from the file's dtypes: q, k, v, g, beta are BF16)`. */
  note: string;
}

const PRECISIONS: readonly Precision[] = ["bf16", "f16", "f32"];

/**
 * The precision a file's dtype claims. F64 inputs are judged at the f32 bars: the table's f64 bars
 * (base/dtype.ts) are what this package's own f64 arms attain against each other, and a foreign
 * f64 kernel that orders its sums otherwise need not attain them; the f32 bars are the tightest a
 * candidate is held to.
 */
const PRECISION_OF: Record<"F64" | "F32" | "F16" | "BF16", Precision> = {
  F64: "f32",
  F32: "f32",
  F16: "f16",
  BF16: "bf16",
};

const FLOAT_DTYPES: readonly SafetensorsDType[] = ["F64", "F32", "F16", "BF16"];

/** A file's tensor, checked to be a float tensor. */
export function floatTensor(name: string, t: SafetensorsTensor): SafetensorsTensor {
  if (!FLOAT_DTYPES.includes(t.dtype)) {
    throw new TypeError(
      `candidate tensor ${name} must be a float tensor (${
        FLOAT_DTYPES.join(", ")
      }): got ${t.dtype}`,
    );
  }
  return t;
}

/** `a, b and c` (at most `max` names, then a count). */
export function listNames(names: readonly string[], max = 8): string {
  const shown = names.length > max ? [...names.slice(0, max), `${names.length - max} more`] : names;
  return shown.length <= 1
    ? shown.join("")
    : `${shown.slice(0, -1).join(", ")} and ${shown[shown.length - 1]}`;
}

/**
 * The precision of a check: the caller's, or else the one the given input tensors' dtype claims
 * (they must share one dtype then).
 *
 * @param file The candidate file.
 * @param inputs The file's names of the tensors whose dtype decides (the kernel's inputs).
 * @param label How the note names them ("q, k, v, g, beta").
 * @param claimed The caller's claim, if any.
 * @returns The precision, its source and the report's line.
 */
export function choosePrecision(
  file: SafetensorsFile,
  inputs: readonly string[],
  label: string,
  claimed: Precision | undefined,
): PrecisionChoice {
  const byDtype = new Map<string, string[]>();
  for (const name of inputs) {
    const t = file.tensors.get(name);
    if (t === undefined) continue;
    floatTensor(name, t);
    byDtype.set(t.dtype, [...(byDtype.get(t.dtype) ?? []), name]);
  }
  const dtypes = [...byDtype.keys()];
  if (claimed !== undefined) {
    if (!PRECISIONS.includes(claimed)) {
      throw new RangeError(`precision must be bf16, f16 or f32: got ${String(claimed)}`);
    }
    const stored = dtypes.length === 1 && PRECISION_OF[dtypes[0] as "F32"] === claimed
      ? ""
      : dtypes.length === 0
      ? ""
      : `; the file's inputs are ${listNames(dtypes)}`;
    return {
      precision: claimed,
      source: "option",
      note: `precision ${claimed} (from --precision${stored})`,
    };
  }
  if (dtypes.length > 1) {
    const groups = dtypes.map((d) => `${d} (${byDtype.get(d)!.join(", ")})`);
    throw new RangeError(
      `candidate inputs must share one dtype for the precision to be read from the file (or give --precision): got ${
        listNames(groups)
      }`,
    );
  }
  if (dtypes.length === 0) {
    throw new RangeError(`candidate must hold its inputs (${label}) to read a precision: got none`);
  }
  const dtype = dtypes[0] as keyof typeof PRECISION_OF;
  const precision = PRECISION_OF[dtype];
  const judged = dtype === "F64" ? ", judged at the f32 bars" : "";
  return {
    precision,
    source: "file",
    note: `precision ${precision} (from the file's dtypes: ${label} are ${dtype}${judged})`,
  };
}

/** Rounding to a precision, to nearest, ties to even. */
export function rounder(p: Precision): (x: number) => number {
  if (p === "bf16") return (x) => bf16Value(bf16Bits(x));
  if (p === "f16") return (x) => f16Value(f16Bits(x));
  return Math.fround;
}

/**
 * The refusal of a file that is neither an op candidate (q, …) nor a layer candidate (x, …),
 * saying what it is and what a candidate holds.
 */
export function notACandidate(file: SafetensorsFile): RangeError {
  const names = [...file.tensors.keys()];
  const what = file.metadata.format === "kda.layer"
    ? `a layer checkpoint (metadata format "kda.layer", as saveLayer writes it) holding ${names.length} parameter groups and nothing else; add a run of the layer (x, dy, y and grad/<name>) to check it`
    : names.length === 0
    ? "no tensor"
    : `${names.length} tensor(s): ${listNames(names)}`;
  return new RangeError(
    `candidate must hold a kernel's inputs q, k, v, g, beta with its results (o, ht, dq, dk, dv, dg, dbeta, dh0), or a layer's x, dy, y and grad/<name> beside its parameters: got ${what}`,
  );
}
