// The layer's state dict (docs/kda.md 2.4: one tensor per parameter group, named as in
// PARAMETER_TABLE), its safetensors checkpoint, and the name mapping from flash-linear-attention's
// `KimiDeltaAttention`.

import { readSafetensors, writeSafetensors } from "../../io/safetensors.ts";
import { type KdaConfig, type KimiConfigInput, type LayerConfig, resolveConfig } from "./config.ts";
import { layerGroups } from "./parameters.ts";
import { typeName } from "../../base/check.ts";
import type { ComputeDType } from "../../base/dtype.ts";

/** A state dict: one flat row-major array per parameter group, by group name. */
export type StateDict = Map<string, Float64Array | Float32Array>;

/** A tensor with its shape, as {@linkcode loadStateDict} also accepts (and `readSafetensors` gives). */
export interface ShapedArray {
  /** The values, row-major. */
  readonly data: Float64Array | Float32Array;
  /** The shape. */
  readonly shape: readonly number[];
}

/**
 * What the state-dict functions need of a layer (a `KdaModule` is one): its config, its dtype and
 * its live parameter groups, whose `data` they read or overwrite in place.
 */
export interface LayerParameters {
  /** The resolved configuration (either form). */
  readonly config: Readonly<LayerConfig>;
  /** The element type of the parameters. */
  readonly dtype: ComputeDType;
  /** The parameter groups by name; writing to a group's `data` changes the layer. */
  parameters(): Map<string, ShapedArray>;
}

/** Tensors by group name, as the loaders take them: a Map or a plain object. */
export type TensorDict =
  | Map<string, Float64Array | Float32Array | ShapedArray>
  | Record<string, Float64Array | Float32Array | ShapedArray>;

/** Options of {@linkcode loadStateDict}. */
export interface LoadStateDictOptions {
  /**
   * Throw on any unknown or missing tensor (default true). With false, unknown tensors are skipped
   * and missing groups keep their values; both are listed in the result.
   */
  strict?: boolean;
}

/** What {@linkcode loadStateDict} did not load. */
export interface LoadStateDictResult {
  /** The layer's groups the dict had no tensor for (always empty when strict). */
  missing: string[];
  /** The dict's names that are not groups of the layer (always empty when strict). */
  unexpected: string[];
}

function checkLayer(layer: unknown): LayerParameters {
  const l = layer as Partial<LayerParameters> | null;
  if (
    typeof l !== "object" || l === null || typeof l.parameters !== "function" ||
    typeof l.config !== "object" || l.config === null || (l.dtype !== "f64" && l.dtype !== "f32")
  ) {
    throw new TypeError(`layer must be a KdaModule: got ${typeName(layer)}`);
  }
  return l as LayerParameters;
}

/**
 * The group shapes a config gives (docs/kda.md 2.4, 2.9), by name in table order. Computed from
 * the config alone, so a file's tensors are checked against them before anything is allocated.
 *
 * @param config A resolved config of either form.
 * @returns Group name to shape.
 */
export function groupShapes(config: Readonly<LayerConfig>): Map<string, number[]> {
  return new Map(layerGroups(config).map((g) => [g.name, [...g.shape]]));
}

/** The largest finite f32 value: anything larger in magnitude rounds to ±Infinity in f32. */
const F32_MAX = 3.4028234663852886e38;

/**
 * Checks a dict of tensors against the group shapes `want` and the dtype they load into, and
 * returns what to copy where, without allocating or writing anything: every check comes first.
 *
 * @param want Group name to shape (the layer's, or {@linkcode groupShapes} of a config).
 * @param dtype The dtype the values load into: an f32 layer refuses a finite value that f32
 *   cannot hold (it would round to ±Infinity).
 * @param dict The tensors.
 * @param strict Throw on unknown or missing tensors.
 * @param shortConv Whether the layer has the short convolution (for the messages).
 * @returns The checked sources by group name, and the missing and unexpected names.
 */
export function checkStateDict(
  want: Map<string, readonly number[]>,
  dtype: ComputeDType,
  dict: unknown,
  strict: boolean,
  shortConv: boolean,
): { sources: Map<string, Float64Array | Float32Array>; missing: string[]; unexpected: string[] } {
  const entries = dict instanceof Map
    ? [...dict]
    : typeof dict === "object" && dict !== null && !Array.isArray(dict)
    ? Object.entries(dict)
    : undefined;
  if (entries === undefined) {
    throw new TypeError(`dict must be a Map or an object of tensors: got ${typeName(dict)}`);
  }
  const unexpected = entries.map(([n]) => n).filter((n) => !want.has(n));
  const given = new Set(entries.map(([n]) => n));
  const missing = [...want.keys()].filter((n) => !given.has(n));
  const conv = shortConv ? "with" : "without";
  if (strict && unexpected.length > 0) {
    throw new RangeError(
      `dict has a tensor that is not a parameter group of this layer (${conv} shortConv): ` +
        `expected one of ${[...want.keys()].join(", ")}; got "${unexpected[0]}"`,
    );
  }
  if (strict && missing.length > 0) {
    throw new RangeError(
      `dict must hold every parameter group of this layer (${conv} shortConv): ` +
        `got none for ${missing.map((n) => `"${n}"`).join(", ")}`,
    );
  }
  const sources = new Map<string, Float64Array | Float32Array>();
  for (const [name, value] of entries) {
    const shape = want.get(name);
    if (shape === undefined) continue;
    const size = shape.reduce((a, d) => a * d, 1);
    const bare = value instanceof Float64Array || value instanceof Float32Array;
    const data = bare ? value : (value as ShapedArray | undefined)?.data;
    if (!(data instanceof Float64Array || data instanceof Float32Array)) {
      throw new TypeError(
        `dict "${name}" must be a Float64Array, a Float32Array or { data, shape } over one: got ${
          typeName(bare ? value : data ?? value)
        }`,
      );
    }
    if (!bare) {
      const got = (value as ShapedArray).shape;
      if (
        !Array.isArray(got) || got.length !== shape.length || got.some((d, i) => d !== shape[i])
      ) {
        throw new RangeError(
          `dict "${name}" must have shape [${shape.join(", ")}]: got ${
            Array.isArray(got) ? `[${got.join(", ")}]` : typeName(got)
          }`,
        );
      }
    }
    if (data.length !== size) {
      throw new RangeError(
        `dict "${name}" must have ${size} elements (shape [${
          shape.join(", ")
        }]): got ${data.length}`,
      );
    }
    const narrow = dtype === "f32" && data instanceof Float64Array;
    for (let i = 0; i < data.length; i++) {
      const v = data[i];
      if (!Number.isFinite(v)) {
        throw new RangeError(`dict "${name}" must be finite: got ${v} at index ${i}`);
      }
      if (narrow && Math.abs(v) > F32_MAX && !Number.isFinite(Math.fround(v))) {
        throw new RangeError(
          `dict "${name}" must be finite in the layer's f32 (|x| <= ${F32_MAX}): got ${v} at ` +
            `index ${i}, which rounds to ${Math.fround(v)}`,
        );
      }
    }
    sources.set(name, data);
  }
  return { sources, missing: strict ? [] : missing, unexpected: strict ? [] : unexpected };
}

/**
 * A copy of every parameter group of the layer, by group name (11 groups, 14 with the short
 * convolution), of the layer's dtype. Writing to the copies does not change the layer.
 *
 * @param layer The layer.
 * @returns A new map from group name to a copy of its values, row-major.
 *
 * @example Usage
 * ```ts
 * import { KdaModule, stateDict } from "@deltanet/kda";
 * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
 * stateDict(layer).get("q_proj.weight")?.length; // 32
 * ```
 */
export function stateDict(layer: LayerParameters): StateDict {
  checkLayer(layer);
  const out: StateDict = new Map();
  for (const [name, p] of layer.parameters()) out.set(name, p.data.slice());
  return out;
}

/**
 * Copies tensors into the layer's parameter groups, in place. A tensor may be a bare array (its
 * length is checked) or `{ data, shape }` (its shape is checked); f32 values load exactly into an
 * f64 layer and f64 values are rounded to nearest into an f32 layer (a finite value beyond f32's
 * range, which would round to ±Infinity, is refused). Every tensor is checked before any is
 * written, so a rejected dict leaves the layer unchanged.
 *
 * @param layer The layer to load into.
 * @param dict Tensors by group name: a Map or a plain object.
 * @param options `strict` (default true): throw on unknown or missing tensors.
 * @returns The missing groups and unexpected names (empty when strict).
 *
 * @example Usage
 * ```ts
 * import { KdaModule, loadStateDict, stateDict } from "@deltanet/kda";
 * const config = { dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 };
 * const a = new KdaModule({ ...config, seed: 1 }), b = new KdaModule({ ...config, seed: 2 });
 * loadStateDict(b, stateDict(a)); // b now computes what a computes
 * ```
 */
export function loadStateDict(
  layer: LayerParameters,
  dict: TensorDict,
  options: LoadStateDictOptions = {},
): LoadStateDictResult {
  checkLayer(layer);
  if (typeof options !== "object" || options === null) {
    throw new TypeError(`options must be an object: got ${typeName(options)}`);
  }
  for (const key of Object.keys(options)) {
    if (key !== "strict") {
      throw new TypeError(`options.${key} is not a known field: expected one of strict`);
    }
  }
  const strict = options.strict ?? true;
  if (typeof strict !== "boolean") {
    throw new TypeError(`options.strict must be a boolean: got ${typeName(strict)}`);
  }
  const params = layer.parameters();
  const want = new Map([...params].map(([name, p]) => [name, p.shape]));
  const { sources, missing, unexpected } = checkStateDict(
    want,
    layer.dtype,
    dict,
    strict,
    layer.config.shortConv,
  );
  for (const [name, source] of sources) params.get(name)!.data.set(source);
  return { missing, unexpected };
}

/** The metadata keys of a layer checkpoint. */
const META_FORMAT = "kda.layer";

/**
 * The layer as safetensors bytes: one tensor per parameter group, in table order and of the
 * layer's dtype (F64 or F32), with `__metadata__` holding `format: "kda.layer"`, the resolved
 * `config` as JSON and the `dtype`.
 *
 * @param layer The layer.
 * @returns The checkpoint's bytes.
 *
 * @example Usage
 * ```ts
 * import { KdaModule, loadLayer, saveLayer } from "@deltanet/kda";
 * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
 * const copy = loadLayer(saveLayer(layer)); // same config, dtype and values
 * ```
 */
export function saveLayer(layer: LayerParameters): Uint8Array {
  checkLayer(layer);
  const tensors = new Map<string, ShapedArray>();
  for (const [name, p] of layer.parameters()) {
    tensors.set(name, { data: p.data, shape: p.shape });
  }
  return writeSafetensors(tensors, {
    format: META_FORMAT,
    config: JSON.stringify(layer.config),
    dtype: layer.dtype,
  });
}

/**
 * Reads and checks a layer checkpoint written by {@linkcode saveLayer} (or by any tool that writes
 * the same names, metadata and shapes), building no layer: the metadata's config and dtype, and
 * every group's tensor checked against the shapes that config gives. Only what the file holds is
 * allocated (the decoded tensors), so a small file claiming a huge config fails here, naming the
 * mismatch. F16 and BF16 tensors are widened exactly.
 *
 * @param bytes The safetensors bytes.
 * @returns The resolved config, the dtype and the checked tensors by group name.
 */
export function readLayerCheckpoint(bytes: Uint8Array): {
  config: Readonly<LayerConfig>;
  dtype: ComputeDType;
  tensors: Map<string, Float64Array | Float32Array>;
} {
  const { tensors, metadata } = readSafetensors(bytes);
  if (metadata.format !== META_FORMAT) {
    throw new RangeError(
      `metadata.format must be "${META_FORMAT}" for a layer checkpoint: got ${
        metadata.format === undefined ? "none" : `"${metadata.format}"`
      }`,
    );
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(metadata.config ?? "");
  } catch {
    throw new TypeError(
      `metadata.config must be the layer's config as JSON: got ${
        metadata.config === undefined ? "none" : JSON.stringify(metadata.config.slice(0, 80))
      }`,
    );
  }
  const dtype = metadata.dtype;
  if (dtype !== "f64" && dtype !== "f32") {
    throw new RangeError(`metadata.dtype must be "f64" or "f32": got ${String(dtype)}`);
  }
  const config = resolveConfig(parsed as Partial<KdaConfig> | KimiConfigInput);
  const dict = new Map<string, ShapedArray>();
  for (const [name, t] of tensors) {
    if (t.data instanceof Int32Array) {
      throw new TypeError(`tensor "${name}" must be a float tensor: got ${t.dtype}`);
    }
    dict.set(name, { data: t.data, shape: t.shape });
  }
  const { sources } = checkStateDict(groupShapes(config), dtype, dict, true, config.shortConv);
  return { config, dtype, tensors: sources };
}

/** One correspondence between a flash-linear-attention tensor and a group of this package. */
export interface TritonNameMapping {
  /** The tensor's name in `fla.layers.kda.KimiDeltaAttention.state_dict()`. */
  readonly triton: string;
  /** The group's name here (see {@linkcode PARAMETER_TABLE}). */
  readonly kda: string;
  /** Their shape, in their symbols (H heads, K = head_dim, V = head_v_dim, D = hidden_size). */
  readonly tritonShape: string;
  /** What to check or change for the values to mean the same thing here. */
  readonly note: string;
}

const m = (triton: string, kda: string, tritonShape: string, note: string): TritonNameMapping =>
  Object.freeze({ triton, kda, tritonShape, note });

// q, k and v are named alike on both sides, so their rows come from one rule; each comes with
// its per-head width (K for queries and keys, V for values).
const QKV = [["q", "K"], ["k", "K"], ["v", "V"]] as const;

/**
 * How flash-linear-attention's `KimiDeltaAttention` parameters map onto the KDA form's groups
 * (docs/kda.md 2.4), for the tensors whose shapes and roles correspond. For fla's whole layer, use
 * the Kimi Linear form instead (`form: "kimi"`, docs/kda.md 2.9, `fromFla`), which keeps fla's
 * names, shapes and wiring. The layers compute the
 * same function when theirs is built with `num_v_heads = num_heads`, `conv_size = 4`,
 * `conv_bias = False`, `allow_neg_eigval = False` and `lower_bound = ln(config.minDecay)` (its
 * bounded gate `lower_bound · sigmoid(exp(A_log) · (f + dt_bias))` is the decay path here; its
 * default unbounded gate `−exp(A_log) · softplus(f + dt_bias)` has no counterpart), and ours with
 * `heads = num_heads`, `keyDim = head_dim`, `valueDim = head_v_dim` and `decayRank = head_v_dim`
 * (their `f_proj` bottleneck is `head_v_dim` wide).
 *
 * Theirs with no counterpart here: the output gate `g_proj.0.weight` [V, D], `g_proj.1.weight`
 * [H·V, V] and `g_proj.1.bias` [H·V] (a low-rank gate with a bias, where this package has one
 * full-rank `o_gate.weight` [H·V, D] without bias; the product `g_proj.1.weight · g_proj.0.weight`
 * has its shape, but the bias has no place), and the short convolutions' biases
 * (`q_conv1d.bias`, … with `conv_bias = True`). Load the mapped tensors with
 * `loadStateDict(layer, dict, { strict: false })`; `o_gate.weight` is then reported missing.
 *
 * @example Usage
 * ```ts
 * import { TRITON_NAME_MAP } from "@deltanet/kda";
 * const byTriton = new Map(TRITON_NAME_MAP.map((e) => [e.triton, e.kda]));
 * byTriton.get("dt_bias"); // "decay.b_alpha"
 * ```
 */
export const TRITON_NAME_MAP: readonly TritonNameMapping[] = Object.freeze([
  ...QKV.map(([s, d]) => m(`${s}_proj.weight`, `${s}_proj.weight`, `[H·${d}, D]`, "same layout")),
  ...QKV.map(([s, d]) =>
    m(
      `${s}_conv1d.weight`,
      `${s}_conv_w`,
      `[H·${d}, 1, 4]`,
      `drop the middle axis: [H·${d}, 4], same tap order`,
    )
  ),
  m("f_proj.0.weight", "decay.w_down.weight", "[V, D]", "needs decayRank = head_v_dim"),
  m("f_proj.1.weight", "decay.w_up.weight", "[H·K, V]", "needs decayRank = head_v_dim"),
  m("dt_bias", "decay.b_alpha", "[H·K]", "same layout; needs lower_bound = ln(minDecay)"),
  m("A_log", "decay.a_log", "[H]", "same layout; needs lower_bound = ln(minDecay)"),
  m("b_proj.weight", "beta_proj.weight", "[H, D]", "same layout; needs allow_neg_eigval = False"),
  m("o_norm.weight", "o_norm_w", "[V]", "same layout"),
  m("o_proj.weight", "o_proj.weight", "[D, H·V]", "same layout"),
]);

/**
 * Renames (and reshapes, for the short convolutions) a flash-linear-attention
 * `KimiDeltaAttention` state dict to this package's group names by {@linkcode TRITON_NAME_MAP},
 * ready for `loadStateDict(layer, result, { strict: false })`. Tensors with no counterpart are
 * returned in `unmapped`.
 *
 * @param tensors Their tensors by name, e.g. `readSafetensors(bytes).tensors`.
 * @returns The mapped tensors by group name, and the names left unmapped.
 *
 * @example Usage
 * ```ts
 * import { fromTritonNames } from "@deltanet/kda";
 * const conv = { data: new Float32Array(8 * 4), shape: [8, 1, 4] };
 * fromTritonNames(new Map([["q_conv1d.weight", conv]])).tensors.get("q_conv_w")?.shape; // [8, 4]
 * ```
 */
export function fromTritonNames(
  tensors: Map<
    string,
    { data: Float64Array | Float32Array | Int32Array; shape: readonly number[] }
  >,
): { tensors: Map<string, ShapedArray>; unmapped: string[] } {
  if (!(tensors instanceof Map)) {
    throw new TypeError(
      `tensors must be a Map of name to { data, shape }: got ${typeName(tensors)}`,
    );
  }
  const byTriton = new Map(TRITON_NAME_MAP.map((e) => [e.triton, e.kda]));
  const out = new Map<string, ShapedArray>();
  const unmapped: string[] = [];
  for (const [name, t] of tensors) {
    const kda = byTriton.get(name);
    if (kda === undefined) {
      unmapped.push(name);
      continue;
    }
    if (!(t.data instanceof Float64Array || t.data instanceof Float32Array)) {
      throw new TypeError(
        `tensors "${name}" must hold Float64Array or Float32Array data: got ${typeName(t.data)}`,
      );
    }
    let shape = [...t.shape];
    if (name.endsWith("_conv1d.weight")) {
      if (shape.length !== 3 || shape[1] !== 1) {
        throw new RangeError(
          `tensors "${name}" must have shape [C, 1, W] (a depthwise Conv1d): got [${
            shape.join(", ")
          }]`,
        );
      }
      shape = [shape[0], shape[2]];
    }
    out.set(kda, { data: t.data, shape });
  }
  return { tensors: out, unmapped };
}
