// `prove --candidate` at layer level: a candidate file that holds a KdaModule's named parameters,
// the input `x` and cotangent `dy`, and the candidate's output `y` and parameter gradients
// (`grad/<name>`) gets the proof's per-group table against the exact f64 layer, and a diagnosis.

import { KdaModule, PARAMETER_TABLE } from "../kda/module.ts";
import type { KdaConfig } from "../kda/layer/config.ts";
import type { Arm } from "../kda/_types.ts";
import type { SafetensorsFile } from "../io/mod.ts";
import { type Agreement, agreement } from "./compare.ts";
import type { Precision } from "./candidate.ts";
import { bf16Bits, bf16Value, f16Bits, f16Value } from "../io/mod.ts";

/** One group (or the output) against the reference. */
export interface LayerCandidateRow {
  name: string;
  agreement: Agreement;
  bar: number;
  ok: boolean;
  /** Whether the candidate's gradient of this group is all zeros. */
  zero: boolean;
}

/** What a layer-level candidate check measured. */
export interface LayerCandidateReport {
  ok: boolean;
  precision: Precision;
  referenceArm: Arm;
  config: Readonly<KdaConfig>;
  output: LayerCandidateRow;
  rows: LayerCandidateRow[];
  diagnosis: string | null;
}

/** Whether a candidate file holds a layer (an input `x`) rather than the op alone. */
export function isLayerCandidate(file: SafetensorsFile): boolean {
  return file.tensors.has("x");
}

function inferConfig(
  file: SafetensorsFile,
  get: (n: string) => Float64Array | undefined,
): Partial<KdaConfig> {
  const meta = file.metadata.kda_config;
  if (meta !== undefined) {
    try {
      return JSON.parse(meta);
    } catch {
      throw new RangeError(`candidate metadata kda_config must be JSON: got ${meta.slice(0, 40)}`);
    }
  }
  const shape = (n: string) => file.tensors.get(n)?.shape;
  const x = file.tensors.get("x")!.shape;
  const H = get("decay.a_log")?.length;
  const V = get("o_norm_w")?.length;
  const R = shape("decay.w_down.weight")?.[0];
  const qRows = shape("q_proj.weight")?.[0];
  if (H === undefined || V === undefined || R === undefined || qRows === undefined) {
    throw new RangeError(
      "candidate must hold decay.a_log, o_norm_w, decay.w_down.weight and q_proj.weight (or a kda_config in its metadata) to infer the layer's shape: got too few",
    );
  }
  return {
    dModel: x[2],
    heads: H,
    keyDim: qRows / H,
    valueDim: V,
    decayRank: R,
    shortConv: file.tensors.has("q_conv_w"),
  };
}

/**
 * Checks a layer-level candidate.
 *
 * @param file The candidate file.
 * @param options The claimed precision and a name map (the candidate's names to this package's).
 * @returns The per-group table and the diagnosis.
 */
export async function checkLayerCandidate(
  file: SafetensorsFile,
  options: { precision: Precision; map?: Record<string, string> },
): Promise<LayerCandidateReport> {
  const ours = new Map<string, string>(); // our name -> the file's name
  for (const name of file.tensors.keys()) ours.set(options.map?.[name] ?? name, name);
  const get = (n: string) => {
    const t = file.tensors.get(ours.get(n) ?? n);
    return t === undefined ? undefined : Float64Array.from(t.data);
  };
  const need = (n: string) => {
    const a = get(n);
    if (a === undefined) throw new RangeError(`candidate must hold a tensor named ${n}: got none`);
    return a;
  };
  const config = inferConfig(file, get);
  const layer = new KdaModule(config, { dtype: "f64" });
  for (const [name, p] of layer.parameters()) {
    const data = need(name);
    if (data.length !== p.size) {
      throw new RangeError(
        `candidate parameter ${name} must have ${p.size} elements [${
          p.shape.join(", ")
        }]: got ${data.length}`,
      );
    }
    p.data.set(data);
  }
  const xShape = file.tensors.get("x")!.shape;
  const [B, T] = [xShape[0], xShape[1]];
  const x = need("x"), dy = need("dy");
  const referenceArm: Arm = B * T <= 2048 ? "ops" : "cpu";
  const exact = await layer.vjp(x, [B, T], dy, { arm: referenceArm, strict: true, quiet: true });
  // Bars: as for the op (checks/candidate.ts), at the layer's tolerances for f32 (the proof's
  // 1e-5 forward, 1e-4 gradients); for bf16/f16 4× the error of the reference run with the
  // parameters and the input rounded to that precision.
  let attainable: typeof exact | undefined;
  if (options.precision !== "f32") {
    const round = options.precision === "bf16"
      ? (v: number) => bf16Value(bf16Bits(v))
      : (v: number) => f16Value(f16Bits(v));
    const rounded = new KdaModule(config, { dtype: "f64" });
    for (const [name, p] of rounded.parameters()) p.data.set(need(name).map(round));
    attainable = await rounded.vjp(x.map(round), [B, T], dy.map(round), {
      arm: referenceArm,
      strict: true,
    });
  }
  const bar = (name: string, f32Bar: number, ref: Float64Array) =>
    attainable
      ? Math.max(
        f32Bar,
        4 * agreement(name === "y" ? attainable.y : attainable.grads.get(name)!, ref).rel,
      )
      : f32Bar;
  const row = (
    name: string,
    got: Float64Array,
    ref: Float64Array,
    f32Bar: number,
  ): LayerCandidateRow => {
    const ag = agreement(got, ref);
    const b = bar(name, f32Bar, ref);
    return { name, agreement: ag, bar: b, ok: ag.rel <= b, zero: got.every((v) => v === 0) };
  };
  const output = row("y", need("y"), exact.y, 1e-5);
  const rows: LayerCandidateRow[] = [];
  for (const name of layer.parameters().keys()) {
    const g = get(`grad/${name}`);
    if (g !== undefined) rows.push(row(name, g, exact.grads.get(name)!, 1e-4));
  }
  const ok = output.ok && rows.every((r) => r.ok);
  const after = new Set(PARAMETER_TABLE.filter((p) => p.afterOp).map((p) => p.name));
  const upstream = rows.filter((r) => !after.has(r.name)),
    downstream = rows.filter((r) => after.has(r.name));
  let diagnosis: string | null = null;
  if (!ok) {
    if (!output.ok) {
      diagnosis = `The forward differs: y is off by ${output.agreement.rel.toExponential(2)} (bar ${
        output.bar.toExponential(1)
      })`;
    } else if (
      downstream.every((r) => r.ok) && upstream.length > 0 && upstream.every((r) => r.zero)
    ) {
      diagnosis =
        `The graph is cut at the op: the ${upstream.length} groups upstream of it have no gradient, while the ${downstream.length} applied after it agree`;
    } else if (downstream.every((r) => r.ok)) {
      diagnosis = `The op's adjoint is wrong: the forward and the groups after the op agree, but ${
        upstream.filter((r) => !r.ok).map((r) => r.name).join(", ")
      } do not`;
    } else {
      diagnosis = `Unclassified failure: ${
        rows.filter((r) => !r.ok).map((r) => r.name).join(", ")
      }`;
    }
  }
  return {
    ok,
    precision: options.precision,
    referenceArm,
    config: layer.config,
    output,
    rows,
    diagnosis,
  };
}
