// Layers from files: a checkpoint of this package (loadLayer), and flash-linear-attention's
// `KimiDeltaAttention` (its constructor arguments as a Kimi Linear config, docs/kda.md 2.9, and a
// layer from its state dict, whose names and shapes the Kimi form keeps as they are).

import { KdaModule } from "./module.ts";
import type { KdaConfig, KimiConfigInput } from "./layer/config.ts";
import { checkKnownKeys, checkObject, shown, typeName } from "../base/check.ts";
import type { ComputeDType } from "../base/dtype.ts";
import { readLayerCheckpoint, type ShapedArray } from "./layer/state_dict.ts";

/**
 * The constructor arguments of flash-linear-attention's `KimiDeltaAttention`
 * (`fla/layers/kda.py`), snake_case as fla spells them; a missing one takes fla's default.
 */
export interface FlaKimiConfig {
  /** Model width (default 2048). */
  hidden_size?: number;
  /** V = head_dim · expand_v (default 1). */
  expand_v?: number;
  /** K (default 128). */
  head_dim?: number;
  /** H (default 16). */
  num_heads?: number;
  /** HV (default null: num_heads). */
  num_v_heads?: number | null;
  /**
   * fla's kernel, "chunk" or "fused_recurrent": it changes only the rounding, so it is checked but
   * has no effect here (the arm is this package's choice).
   */
  mode?: string;
  /** Default true. */
  use_short_conv?: boolean;
  /** Default false. */
  allow_neg_eigval?: boolean;
  /** Default false. */
  safe_gate?: boolean;
  /** Default null: the softplus gate. */
  lower_bound?: number | null;
  /** Default 4. */
  conv_size?: number;
  /** Default false. */
  conv_bias?: boolean;
  /** The layer's index in fla's cache: no effect here. */
  layer_idx?: number | null;
  /** Default 1e-5. */
  norm_eps?: number;
}

/** fla's defaults of the constructor arguments this package reads. */
const FLA_DEFAULTS = {
  hidden_size: 2048,
  expand_v: 1,
  head_dim: 128,
  num_heads: 16,
  num_v_heads: null,
  mode: "chunk",
  use_short_conv: true,
  allow_neg_eigval: false,
  safe_gate: false,
  lower_bound: null,
  conv_size: 4,
  conv_bias: false,
  layer_idx: null,
  norm_eps: 1e-5,
} as const;

/** Options of {@linkcode kimiConfigFromFla} and {@linkcode fromFla}. */
export interface FromFlaOptions {
  /**
   * This package's fields that fla has no argument for: `chunkSize`, `stateVFirst` (default true,
   * fla's cache layout) and `seed`.
   */
  config?: Pick<KimiConfigInput, "chunkSize" | "stateVFirst" | "seed">;
}

/**
 * The Kimi Linear config of an fla `KimiDeltaAttention` built with these constructor arguments
 * (fla's defaults fill the missing ones; an argument fla's constructor does not have is refused,
 * where fla's `**kwargs` would swallow it).
 *
 * @param fla The constructor arguments, e.g. the `config` a fixture or a model config holds.
 * @param options `config`: `chunkSize`, `stateVFirst` and `seed`.
 * @returns The config, with `form: "kimi"`.
 *
 * @example Usage
 * ```ts
 * import { kimiConfigFromFla } from "@deltanet/kda";
 * const c = kimiConfigFromFla({ hidden_size: 64, head_dim: 32, num_heads: 2, expand_v: 2 });
 * if (c.valueDim !== 64 || c.numVHeads !== 2) throw new Error("V = head_dim · expand_v, HV = H");
 * ```
 */
export function kimiConfigFromFla(
  fla: FlaKimiConfig,
  options: FromFlaOptions = {},
): KimiConfigInput {
  checkObject("fla", fla);
  checkKnownKeys("fla", fla, Object.keys(FLA_DEFAULTS));
  checkKnownKeys("options", checkObject("options", options), ["config"]);
  const extra = checkObject("options.config", options.config ?? {});
  checkKnownKeys("options.config", extra, ["chunkSize", "stateVFirst", "seed"]);
  const c = { ...FLA_DEFAULTS, ...fla };
  if (c.mode !== "chunk" && c.mode !== "fused_recurrent") {
    throw new RangeError(`fla.mode must be "chunk" or "fused_recurrent": got ${String(c.mode)}`);
  }
  // V is computed here, so its two factors are checked here, by fla's names
  for (const key of ["head_dim", "expand_v"] as const) {
    const value: unknown = c[key];
    if (typeof value !== "number") {
      throw new TypeError(`fla.${key} must be a number: got ${shown(value)}`);
    }
    if (!(value > 0) || !Number.isFinite(value)) {
      throw new RangeError(`fla.${key} must be a finite number above 0: got ${value}`);
    }
  }
  const V = c.head_dim * c.expand_v;
  if (!Number.isInteger(V)) {
    throw new RangeError(
      `fla.expand_v must make head_dim · expand_v an integer: got ${c.head_dim} · ${c.expand_v} = ${V}`,
    );
  }
  // The rest is checked by the config's own validation, with this package's field names.
  return {
    form: "kimi",
    dModel: c.hidden_size,
    heads: c.num_heads,
    numVHeads: c.num_v_heads ?? c.num_heads,
    keyDim: c.head_dim,
    valueDim: V,
    shortConv: c.use_short_conv,
    convSize: c.conv_size,
    convBias: c.conv_bias,
    allowNegEigval: c.allow_neg_eigval,
    lowerBound: c.lower_bound,
    safeGate: c.safe_gate,
    normEps: c.norm_eps,
    ...(extra as FromFlaOptions["config"]),
  };
}

/**
 * A Kimi Linear layer from an fla `KimiDeltaAttention` state dict and its constructor arguments:
 * fla's names and shapes load as they are (`q_conv1d.weight` [C, 1, W], `A_log` [HV], …), every
 * tensor checked before anything is loaded; a missing, unknown or wrongly shaped one is a named
 * error. With `prefix`, only the tensors whose names start with it are read, with it removed (a
 * whole model's file, e.g. `model.layers.0.attn.`).
 *
 * @param tensors The tensors by name, e.g. `readSafetensors(bytes).tensors`.
 * @param fla The layer's constructor arguments.
 * @param options `dtype` (default "f64"), `prefix`, and `config` (`chunkSize`, `stateVFirst`,
 *   `seed`).
 * @returns The layer.
 *
 * @example Round trip through fla's names
 * ```ts
 * import { fromFla, KdaModule, kimiConfigFromFla } from "@deltanet/kda";
 * const fla = { hidden_size: 8, head_dim: 4, num_heads: 1, num_v_heads: 2 };
 * const layer = new KdaModule(kimiConfigFromFla(fla));
 * const tensors = new Map([...layer.parameters()].map(([n, p]) => [`attn.${n}`, p]));
 * const copy = fromFla(tensors, fla, { prefix: "attn." });
 * if (copy.parameters().get("A_log")!.data[0] !== layer.parameters().get("A_log")!.data[0]) {
 *   throw new Error("A_log loads as it is");
 * }
 * ```
 */
export function fromFla(
  tensors: Map<
    string,
    { data: Float64Array | Float32Array | Int32Array; shape: readonly number[] }
  >,
  fla: FlaKimiConfig,
  options: FromFlaOptions & { dtype?: ComputeDType; prefix?: string } = {},
): KdaModule {
  if (!(tensors instanceof Map)) {
    throw new TypeError(
      `tensors must be a Map of name to { data, shape }: got ${typeName(tensors)}`,
    );
  }
  checkKnownKeys("options", checkObject("options", options), ["dtype", "prefix", "config"]);
  const prefix = options.prefix ?? "";
  if (typeof prefix !== "string") {
    throw new TypeError(`options.prefix must be a string: got ${typeName(prefix)}`);
  }
  const config = kimiConfigFromFla(fla, options.config ? { config: options.config } : {});
  const dict = new Map<string, ShapedArray>();
  for (const [name, t] of tensors) {
    if (!name.startsWith(prefix)) continue;
    if (!(t.data instanceof Float64Array || t.data instanceof Float32Array)) {
      throw new TypeError(
        `tensors "${name}" must hold float data: got ${typeName(t.data)}`,
      );
    }
    dict.set(name.slice(prefix.length), { data: t.data, shape: t.shape });
  }
  if (dict.size === 0) {
    throw new RangeError(
      `tensors must hold the layer's parameters${
        prefix ? ` under the prefix "${prefix}"` : ""
      }: got none of ${tensors.size} tensors`,
    );
  }
  return KdaModule.fromStateDict(dict, config, { dtype: options.dtype });
}

/**
 * A layer from checkpoint bytes written by {@linkcode saveLayer} (or by any tool that writes the
 * same names, metadata and shapes). The config and dtype come from the metadata; every group must
 * be present with the shape that config gives, and no other tensor may be. Everything is checked
 * before the layer is built, and it is built from the file's values, with no random draw, so a
 * small file claiming a huge config fails at once. F16 and BF16 tensors are widened exactly.
 *
 * @param bytes The safetensors bytes.
 * @returns A new layer holding the checkpoint's values.
 *
 * @example Usage
 * ```ts
 * import { KdaModule, loadLayer, saveLayer } from "@deltanet/kda";
 * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
 * loadLayer(saveLayer(layer)).config.dModel; // 8
 * ```
 */
export function loadLayer(bytes: Uint8Array): KdaModule {
  const { config, dtype, tensors } = readLayerCheckpoint(bytes);
  return KdaModule.fromStateDict(tensors, config as Partial<KdaConfig> | KimiConfigInput, {
    dtype,
  });
}
