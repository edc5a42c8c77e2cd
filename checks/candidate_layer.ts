// `prove --candidate` at layer level: a candidate file that holds a KdaModule's named parameters,
// the input `x` and cotangent `dy`, and the candidate's output `y` and parameter gradients
// (`grad/<name>`) gets the proof's per-group table against the exact f64 layer, and a diagnosis;
// the input's gradient (`grad/x`) a row of its own where the file holds it.
// Every group of the layer has a row: a gradient the file lacks is a failing row that names it.

import { KdaModule, PARAMETER_TABLE } from "../kda/module.ts";
import {
  type KdaConfig,
  type KimiConfigInput,
  type LayerConfig,
  resolveConfig,
} from "../kda/layer/config.ts";
import { groupShapes } from "../kda/layer/state_dict.ts";
import type { Arm } from "../kda/_types.ts";
import type { SafetensorsFile } from "../io/mod.ts";
import { DTYPES, MEASURED_BAR_FACTOR } from "../base/dtype.ts";
import { type Agreement, agreement } from "./compare.ts";
import {
  choosePrecision,
  floatTensor,
  listNames,
  notACandidate,
  type Precision,
  rounder,
} from "./_candidate_file.ts";
import { checkableBar, f32Floor, type UnusedTensor } from "./candidate.ts";

/** One group (or the output) against the reference. */
export interface LayerCandidateRow {
  /** The group's name in this package (`y` for the output). */
  name: string;
  /** max|a−b|/max|b| with both magnitudes (NaN for a missing gradient). */
  agreement: Agreement;
  /** The bar of the precision. */
  bar: number;
  /** Within the bar. */
  ok: boolean;
  /** Whether the candidate's gradient of this group is all zeros. */
  zero: boolean;
  /** The file lacks this group's gradient, so nothing checks the group. */
  missing: boolean;
}

/** What a layer-level candidate check measured. */
export interface LayerCandidateReport {
  /** The output and every group within their bars. */
  ok: boolean;
  /** The precision judged at. */
  precision: Precision;
  /** Whether the precision was claimed (`--precision`) or read from the file's dtypes. */
  precisionSource: "option" | "file";
  /** One line: the precision and where it came from. */
  precisionNote: string;
  /** The arm that computed the f64 reference. */
  referenceArm: Arm;
  /** The layer's resolved config. */
  config: Readonly<LayerConfig>;
  /** The output y. */
  output: LayerCandidateRow;
  /** One row per group of the layer, in table order. */
  rows: LayerCandidateRow[];
  /**
   * The input's gradient (`grad/x`) against the exact dx, where the file holds it (what carries
   * the gradient to the layers below); null where it does not, and then nothing checks it.
   */
  input: LayerCandidateRow | null;
  /** What the figures say went wrong, or null when the candidate agrees. */
  diagnosis: string | null;
  /** The file's tensors that the check did not read. */
  unused: UnusedTensor[];
}

/** Options of {@linkcode checkLayerCandidate}. */
export interface LayerCandidateOptions {
  /** The precision the candidate claims; default: read from the dtype of x and the parameters. */
  precision?: Precision;
  /** The candidate's names to this package's (`grad/<name>` follows the parameter's mapping). */
  map?: Record<string, string>;
}

/**
 * Whether a candidate file holds a layer (an input `x`) rather than the op alone.
 *
 * @param file The candidate file.
 * @param map The candidate's names to this package's, as for {@linkcode checkLayerCandidate}.
 * @returns True when the file holds `x` (or a name mapped to it).
 *
 * @example Usage
 * ```ts
 * import { isLayerCandidate } from "./candidate_layer.ts";
 * import { readSafetensors, writeSafetensors } from "../io/mod.ts";
 * const x = { data: new Float32Array(8), shape: [1, 1, 8] };
 * if (!isLayerCandidate(readSafetensors(writeSafetensors({ x })))) throw new Error("not a layer");
 * ```
 */
export function isLayerCandidate(file: SafetensorsFile, map?: Record<string, string>): boolean {
  return [...file.tensors.keys()].some((n) => (map?.[n] ?? n) === "x");
}

function inferConfig(
  file: SafetensorsFile,
  shape: (n: string) => readonly number[] | undefined,
  xShape: readonly number[],
): Partial<KdaConfig> {
  // A layer checkpoint's metadata (saveLayer) or a candidate's own kda_config names the config.
  const meta = file.metadata.kda_config ??
    (file.metadata.format === "kda.layer" ? file.metadata.config : undefined);
  if (meta !== undefined) {
    try {
      return JSON.parse(meta);
    } catch {
      throw new RangeError(`candidate metadata kda_config must be JSON: got ${meta.slice(0, 40)}`);
    }
  }
  const H = shape("decay.a_log")?.reduce((a, d) => a * d, 1);
  const V = shape("o_norm_w")?.reduce((a, d) => a * d, 1);
  const R = shape("decay.w_down.weight")?.[0];
  const qRows = shape("q_proj.weight")?.[0];
  if (H === undefined || V === undefined || R === undefined || qRows === undefined) {
    throw new RangeError(
      "candidate must hold decay.a_log, o_norm_w, decay.w_down.weight and q_proj.weight (or a kda_config in its metadata) to infer the layer's shape: got too few",
    );
  }
  return {
    dModel: xShape[2],
    heads: H,
    keyDim: qRows / H,
    valueDim: V,
    decayRank: R,
    // Any conv group present makes it a conv layer, so a missing one is refused by name.
    shortConv: PARAMETER_TABLE.some((p) => p.conv && shape(p.name) !== undefined),
  };
}

/**
 * Checks a layer-level candidate: the output and every group's gradient against the exact f64
 * layer. A group whose gradient the file lacks gets a failing row; tensors nothing reads are
 * listed in `unused`.
 *
 * @param file The candidate file.
 * @param options The claimed precision (default: from the dtype of x and the parameters) and a
 *   name map (the candidate's names to this package's).
 * @returns The per-group table and the diagnosis.
 *
 * @example Usage
 * ```ts
 * import { checkLayerCandidate } from "./candidate_layer.ts";
 * import { readSafetensors, writeSafetensors } from "../io/mod.ts";
 * // A file that holds no layer run is refused with what a candidate holds.
 * const file = readSafetensors(writeSafetensors({ w: { data: new Float32Array(1), shape: [1] } }));
 * await checkLayerCandidate(file).then(
 *   () => { throw new Error("accepted"); },
 *   (e) => { if (!(e instanceof RangeError)) throw e; },
 * );
 * ```
 */
export async function checkLayerCandidate(
  file: SafetensorsFile,
  options: LayerCandidateOptions = {},
): Promise<LayerCandidateReport> {
  const ours = new Map<string, string>(); // our name -> the file's name
  for (const name of file.tensors.keys()) {
    const mapped = options.map?.[name] ??
      (name.startsWith("grad/") && options.map?.[name.slice(5)] !== undefined
        ? `grad/${options.map[name.slice(5)]}`
        : name);
    ours.set(mapped, name);
  }
  const fileName = (n: string) => ours.get(n) ?? n;
  const used = new Set<string>();
  const tensorOf = (n: string) => file.tensors.get(fileName(n));
  const get = (n: string) => {
    const t = tensorOf(n);
    if (t === undefined) return undefined;
    used.add(fileName(n));
    const a = Float64Array.from(floatTensor(fileName(n), t).data);
    return a;
  };
  const need = (n: string, finite = true) => {
    const a = get(n);
    if (a === undefined) {
      throw new RangeError(`candidate must hold a tensor named ${fileName(n)}: got none`);
    }
    if (finite) {
      for (let i = 0; i < a.length; i++) {
        if (!Number.isFinite(a[i])) {
          throw new RangeError(
            `candidate tensor ${fileName(n)} must be finite: got ${a[i]} at index ${i}`,
          );
        }
      }
    }
    return a;
  };
  const xt = tensorOf("x");
  if (xt === undefined) throw notACandidate(file);
  if (xt.shape.length !== 3 || xt.shape.some((d) => d === 0)) {
    throw new RangeError(
      `candidate tensor x must have shape [B, T, D] with every size positive, since a layer run without a token checks nothing: got [${
        xt.shape.join(", ")
      }]`,
    );
  }
  const config = resolveConfig(
    inferConfig(file, (n) => tensorOf(n)?.shape, xt.shape) as Partial<KdaConfig> | KimiConfigInput,
  );
  const [B, T, D] = xt.shape;
  if (D !== config.dModel) {
    throw new RangeError(
      `candidate tensor x must have shape [B, T, D] with D = dModel = ${config.dModel}: got [${
        xt.shape.join(", ")
      }]`,
    );
  }
  // Every group is checked against the shape the config gives before the layer is built, and the
  // layer is built from the candidate's values (KdaModule.fromStateDict): a small file claiming a
  // huge config fails naming the mismatch, and no random weights are drawn.
  const shapes = groupShapes(config);
  const names = [...shapes.keys()];
  const choice = choosePrecision(
    file,
    ["x", ...names].map(fileName),
    "x and the parameters",
    options.precision,
  );
  // the file's shape itself, not only its element count: a gradient stored [in, out] where the
  // parameter is [out, in] holds the same count in another order
  const sized = (n: string, a: Float64Array, size: number, shape: readonly number[]) => {
    const got = tensorOf(n)?.shape ?? [a.length];
    if (a.length !== size || got.length !== shape.length || got.some((d, i) => d !== shape[i])) {
      throw new RangeError(
        `candidate tensor ${fileName(n)} must have shape [${shape.join(", ")}]: got [${
          got.join(", ")
        }]`,
      );
    }
    return a;
  };
  const values = new Map<string, Float64Array>();
  for (const [name, shape] of shapes) {
    values.set(name, sized(name, need(name), shape.reduce((a, d) => a * d, 1), shape));
  }
  const layer = KdaModule.fromStateDict(values, config, { dtype: "f64" });
  const x = need("x");
  const dy = sized("dy", need("dy"), x.length, xt.shape);
  const y = sized("y", need("y", false), x.length, xt.shape);
  const candidateGrads = new Map<string, Float64Array | undefined>();
  for (const [name, p] of layer.parameters()) {
    const g = get(`grad/${name}`);
    candidateGrads.set(
      name,
      g === undefined ? undefined : sized(`grad/${name}`, g, p.size, p.shape),
    );
  }
  const candidateDx = get("grad/x");
  if (candidateDx !== undefined) sized("grad/x", candidateDx, x.length, xt.shape);
  const referenceArm: Arm = B * T <= 2048 ? "ops" : "cpu";
  const run = { arm: referenceArm, strict: true, quiet: true };
  const exact = await layer.vjp(x, [B, T], dy, run);
  // Bars: as for the op (checks/candidate.ts), at the layer's f32 bars of the dtype table; for
  // bf16/f16 MEASURED_BAR_FACTOR × the error of the f64 layer run at that precision (its inputs
  // rounded when the precision was claimed, as stored when the file's dtypes gave it) with its
  // outputs rounded too.
  const f32 = DTYPES.f32.bars!;
  let attainable: { y: Float64Array; grads: Map<string, Float64Array> } | undefined;
  if (choice.precision !== "f32") {
    const round = rounder(choice.precision);
    const r = (a: Float64Array) => choice.source === "option" ? a.map(round) : a;
    const rounded = KdaModule.fromStateDict(
      new Map([...values].map(([name, v]) => [name, r(v)])),
      config,
      { dtype: "f64" },
    );
    const a = await rounded.vjp(r(x), [B, T], r(dy), run);
    attainable = {
      y: a.y.map(round),
      grads: new Map([...a.grads, ["x", a.dx] as const].map(([n, g]) => [n, g.map(round)])),
    };
  }
  const row = (
    name: string,
    got: Float64Array | undefined,
    ref: Float64Array,
    tableBar: number,
  ): LayerCandidateRow => {
    const f32Bar = f32Floor(tableBar, ref);
    const bar = checkableBar(
      name,
      attainable
        ? Math.max(
          f32Bar,
          MEASURED_BAR_FACTOR *
            agreement(name === "y" ? attainable.y : attainable.grads.get(name)!, ref).rel,
        )
        : f32Bar,
      agreement(ref, ref).refMax,
      choice.precision,
    );
    if (got === undefined) {
      const refMax = agreement(ref, ref).refMax;
      return {
        name,
        agreement: { rel: NaN, absDiff: NaN, refMax },
        bar,
        ok: false,
        zero: false,
        missing: true,
      };
    }
    const ag = agreement(got, ref);
    return {
      name,
      agreement: ag,
      bar,
      ok: ag.rel <= bar,
      zero: got.every((v) => v === 0),
      missing: false,
    };
  };
  // The layer's forward bar is the table's layerForward (the proof's loss agreement), here on y.
  const output = row("y", y, exact.y, f32.layerForward);
  const rows = names.map((n) =>
    row(n, candidateGrads.get(n), exact.grads.get(n)!, f32.layerGradients)
  );
  const input = candidateDx === undefined
    ? null
    : row("x", candidateDx, exact.dx, f32.layerGradients);
  const ok = output.ok && rows.every((r) => r.ok) && (input?.ok ?? true);
  const unused: UnusedTensor[] = [...file.tensors.keys()].filter((n) => !used.has(n)).map((
    name,
  ) => ({
    name,
    reason: "not a name of the layer's run (x, dy, y), parameters, grad/<name> or grad/x",
  }));
  return {
    ok,
    precision: choice.precision,
    precisionSource: choice.source,
    precisionNote: choice.note,
    referenceArm,
    config: layer.config,
    output,
    rows,
    input,
    diagnosis: ok ? null : diagnose(output, input === null ? rows : [...rows, input], fileName),
    unused,
  };
}

/** What a failing layer table says went wrong. */
function diagnose(
  output: LayerCandidateRow,
  rows: LayerCandidateRow[],
  fileName: (n: string) => string,
): string {
  const missing = rows.filter((r) => r.missing);
  const lacking = missing.length > 0
    ? `The file lacks ${listNames(missing.map((r) => fileName(`grad/${r.name}`)))}: ${
      missing.length === 1 ? "that group is" : "those groups are"
    } unchecked`
    : "";
  const present = rows.filter((r) => !r.missing);
  const after = new Set(PARAMETER_TABLE.filter((p) => p.afterOp).map((p) => p.name));
  const upstream = present.filter((r) => !after.has(r.name)),
    downstream = present.filter((r) => after.has(r.name));
  let cause = "";
  if (!output.ok) {
    cause = `The forward differs: y is off by ${output.agreement.rel.toExponential(2)} (bar ${
      output.bar.toExponential(1)
    })`;
  } else if (present.every((r) => r.ok)) {
    cause = "";
  } else if (
    downstream.every((r) => r.ok) && upstream.length > 0 && upstream.every((r) => r.zero)
  ) {
    cause =
      `The graph is cut at the op: the ${upstream.length} groups upstream of it have no gradient, while the ${downstream.length} applied after it agree`;
  } else if (downstream.every((r) => r.ok)) {
    cause = `The op's adjoint is wrong: the forward and the groups after the op agree, but ${
      upstream.filter((r) => !r.ok).map((r) => r.name).join(", ")
    } do not`;
  } else {
    cause = `Unclassified failure: ${present.filter((r) => !r.ok).map((r) => r.name).join(", ")}`;
  }
  return [cause, lacking].filter((s) => s !== "").join("; ");
}
