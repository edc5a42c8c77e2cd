// The layer's configuration, its defaults and its validation.

import type { ChunkSize } from "../_types.ts";
import { checkChunkSize } from "../op/_check.ts";
import { checkKnownKeys, checkObject, checkPositiveInt, shown } from "../../base/check.ts";

/** Configuration of a {@linkcode KdaModule} layer (docs/kda.md 2.4). */
export interface KdaConfig {
  /** The form: absent or "kda" for this layer; see {@linkcode KimiConfig} for "kimi". */
  form?: "kda";
  /** Model width D. */
  dModel: number;
  /** Number of heads H. */
  heads: number;
  /** Key dimension K per head. */
  keyDim: number;
  /** Value dimension V per head. */
  valueDim: number;
  /** Rank R of the low-rank decay path. */
  decayRank: number;
  /** Tokens per chunk of the chunked arms. */
  chunkSize: ChunkSize;
  /** Smallest per-token decay: every decay a = e^g lies in (minDecay, 1). */
  minDecay: number;
  /** Depthwise causal short convolution (width 4) on q, k and v. */
  shortConv: boolean;
  /** Seed of the initialisation. */
  seed: number;
}

/**
 * The trainer shape: D = 64, H = 2, K = V = 32, R = 16, chunk 16, minDecay 0.9, no short conv,
 * seed 0.
 *
 * @example Usage
 * ```ts
 * import { DEFAULT_CONFIG } from "@deltanet/kda";
 * DEFAULT_CONFIG.dModel; // 64
 * ```
 */
export const DEFAULT_CONFIG: Readonly<KdaConfig> = Object.freeze({
  dModel: 64,
  heads: 2,
  keyDim: 32,
  valueDim: 32,
  decayRank: 16,
  chunkSize: 16,
  minDecay: 0.9,
  shortConv: false,
  seed: 0,
});

/**
 * Configuration of the Kimi Linear form of the layer: flash-linear-attention's
 * `KimiDeltaAttention` (`fla/layers/kda.py`), docs/kda.md 2.9. Its parameter groups carry fla's
 * names and shapes, so fla's state dict loads as it is. Fields named after an fla option keep its
 * meaning.
 */
export interface KimiConfig {
  /** Selects the Kimi Linear form. */
  form: "kimi";
  /** Model width D (fla `hidden_size`). */
  dModel: number;
  /** Query/key heads H (fla `num_heads`). */
  heads: number;
  /** Value heads HV (fla `num_v_heads`), a multiple of H; H when not given. */
  numVHeads: number;
  /** Key dimension K per head (fla `head_dim`). */
  keyDim: number;
  /** Value dimension V per head (fla `head_dim · expand_v`); also the rank of `f_proj` and `g_proj`. */
  valueDim: number;
  /** Tokens per chunk of the chunked arms (fla's chunk kernel uses 64; only rounding differs). */
  chunkSize: ChunkSize;
  /** Causal short convolutions on q, k and v, then SiLU (fla `use_short_conv`). */
  shortConv: boolean;
  /** Width W of the short convolutions (fla `conv_size`). */
  convSize: number;
  /** A bias in each short convolution (fla `conv_bias`). */
  convBias: boolean;
  /** beta = 2·sigmoid(b), in (0, 2), instead of sigmoid(b) (fla `allow_neg_eigval`). */
  allowNegEigval: boolean;
  /**
   * The gate's form (fla `lower_bound`): null gives `g = −e^{A_log}·softplus(z)`; a number
   * `lb < 0` gives `g = lb·sigmoid(e^{A_log}·z)`, so every decay lies in `(e^lb, 1)`.
   */
  lowerBound: number | null;
  /**
   * fla `safe_gate`: there it lets the chunk kernel assume `g ∈ [lower_bound, 0)`; here it changes
   * no arithmetic, requires `−5 ≤ lowerBound < 0` as fla does, and starts `A_log` at 0 as fla does.
   */
  safeGate: boolean;
  /** Epsilon of the gated output RMSNorm (fla `norm_eps`), above 0. */
  normEps: number;
  /**
   * The layout of the recurrent state in `forwardWithState` and `step`: `[B, HV, V, K]` (true,
   * the layout fla's layer keeps in its cache, `state_v_first=True`) or `[B, HV, K, V]`.
   */
  stateVFirst: boolean;
  /** Seed of the initialisation. */
  seed: number;
}

/** The config of either form of the layer: the KDA layer of docs/kda.md 2.4, or Kimi Linear. */
export type LayerConfig = KdaConfig | KimiConfig;

/** What a Kimi Linear layer is built from: `form: "kimi"` and any fields to override. */
export type KimiConfigInput = Partial<KimiConfig> & { form: "kimi" };

/**
 * The Kimi Linear form's defaults: fla's `KimiDeltaAttention` defaults (short conv of width 4
 * without bias, `allow_neg_eigval` off, the softplus gate, `norm_eps` 1e-5, the V-first state) at
 * the trainer size (D = 64, H = HV = 2, K = V = 32, chunk 16, seed 0). `numVHeads` follows
 * `heads` when not given.
 *
 * @example Usage
 * ```ts
 * import { DEFAULT_KIMI_CONFIG } from "@deltanet/kda";
 * DEFAULT_KIMI_CONFIG.lowerBound; // null: the softplus gate
 * ```
 */
export const DEFAULT_KIMI_CONFIG: Readonly<KimiConfig> = Object.freeze({
  form: "kimi",
  dModel: 64,
  heads: 2,
  numVHeads: 2,
  keyDim: 32,
  valueDim: 32,
  chunkSize: 16,
  shortConv: true,
  convSize: 4,
  convBias: false,
  allowNegEigval: false,
  lowerBound: null,
  safeGate: false,
  normEps: 1e-5,
  stateVFirst: true,
  seed: 0,
});

/** Whether a config is of the Kimi Linear form. */
export function isKimi(config: Readonly<LayerConfig>): config is Readonly<KimiConfig> {
  return (config as { form?: unknown }).form === "kimi";
}

/** Width of the short convolution. */
export const CONV_WIDTH = 4;

/**
 * Fills defaults and validates every field, for either form (`form: "kimi"` selects Kimi Linear).
 *
 * @param config A partial configuration.
 * @returns A complete, frozen configuration.
 */
export function resolveConfig(config?: Partial<KdaConfig>): Readonly<KdaConfig>;
export function resolveConfig(config: KimiConfigInput): Readonly<KimiConfig>;
export function resolveConfig(
  config?: Partial<KdaConfig> | KimiConfigInput,
): Readonly<LayerConfig>;
export function resolveConfig(
  config: Partial<KdaConfig> | KimiConfigInput = {},
): Readonly<LayerConfig> {
  checkObject("config", config);
  const form = (config as { form?: unknown }).form;
  if (form === "kimi") return resolveKimi(config as KimiConfigInput);
  if (form !== undefined && form !== "kda") {
    throw new RangeError(`config.form must be "kda" or "kimi": got ${JSON.stringify(form)}`);
  }
  const { form: _form, ...rest } = config as Partial<KdaConfig>;
  for (const key of Object.keys(rest)) {
    if (!(key in DEFAULT_CONFIG) && key in DEFAULT_KIMI_CONFIG && !(key in KDA_ALIASES)) {
      throw new TypeError(
        `config.${key} is a field of the Kimi Linear form: got it without form: "kimi"`,
      );
    }
  }
  checkKnownKeys("config", rest, Object.keys(DEFAULT_CONFIG), KDA_ALIASES);
  const c = { ...DEFAULT_CONFIG, ...rest };
  checkCommon(c);
  checkPositiveInt("config.decayRank", c.decayRank);
  if (typeof c.minDecay !== "number" || !(c.minDecay > 0 && c.minDecay < 1)) {
    throw new RangeError(`config.minDecay must lie in (0, 1): got ${shown(c.minDecay)}`);
  }
  return Object.freeze(c);
}

/** fla's option names given to the KDA form, and the field that means the same thing. */
const KDA_ALIASES: Readonly<Record<string, string>> = {
  hidden_size: "dModel",
  num_heads: "heads",
  head_dim: "keyDim",
  use_short_conv: "shortConv",
};

/** The fields both forms share. */
function checkCommon(c: {
  dModel: number;
  heads: number;
  keyDim: number;
  valueDim: number;
  chunkSize: ChunkSize;
  shortConv: boolean;
  seed: number;
}): void {
  checkPositiveInt("config.dModel", c.dModel);
  checkPositiveInt("config.heads", c.heads);
  checkPositiveInt("config.keyDim", c.keyDim);
  checkPositiveInt("config.valueDim", c.valueDim);
  checkChunkSize("config.chunkSize", c.chunkSize);
  checkBoolean("config.shortConv", c.shortConv);
  if (
    typeof c.seed !== "number" || !Number.isInteger(c.seed) || c.seed < 0 || c.seed > 0xffffffff
  ) {
    throw new RangeError(`config.seed must be an integer in [0, 2^32): got ${shown(c.seed)}`);
  }
}

function checkBoolean(name: string, value: unknown): void {
  if (typeof value !== "boolean") {
    throw new TypeError(`${name} must be a boolean: got ${typeof value}`);
  }
}

function resolveKimi(config: KimiConfigInput): Readonly<KimiConfig> {
  for (const key of Object.keys(config)) {
    if (Object.hasOwn(KDA_ONLY, key)) {
      throw new TypeError(
        `config.${key} is a field of the KDA form, not of form: "kimi" (${KDA_ONLY[key]}): got ${
          JSON.stringify((config as Record<string, unknown>)[key])
        }`,
      );
    }
  }
  checkKnownKeys("config", config, Object.keys(DEFAULT_KIMI_CONFIG), KIMI_ALIASES);
  const c: KimiConfig = {
    ...DEFAULT_KIMI_CONFIG,
    ...config,
    numVHeads: config.numVHeads ?? config.heads ?? DEFAULT_KIMI_CONFIG.heads,
  };
  checkCommon(c);
  checkPositiveInt("config.numVHeads", c.numVHeads);
  if (c.numVHeads % c.heads !== 0) {
    throw new RangeError(
      `config.numVHeads must be a multiple of config.heads (${c.heads}): got ${c.numVHeads}`,
    );
  }
  checkPositiveInt("config.convSize", c.convSize);
  for (const key of ["convBias", "allowNegEigval", "safeGate", "stateVFirst"] as const) {
    checkBoolean(`config.${key}`, c[key]);
  }
  const lb = c.lowerBound;
  if (lb !== null && typeof lb !== "number") {
    throw new TypeError(
      `config.lowerBound must be null (the softplus gate) or a number: got ${shown(lb)}`,
    );
  }
  if (lb !== null && !(lb < 0 && Number.isFinite(lb))) {
    throw new RangeError(
      `config.lowerBound must be null (the softplus gate) or a finite number below 0: got ${
        String(lb)
      }`,
    );
  }
  if (c.safeGate && !(lb !== null && lb >= -5 && lb < 0)) {
    throw new RangeError(
      `config.lowerBound must lie in [-5, 0) with config.safeGate, as fla's chunk_kda requires: got ${
        String(lb)
      }`,
    );
  }
  if (typeof c.normEps !== "number") {
    throw new TypeError(`config.normEps must be a number: got ${shown(c.normEps)}`);
  }
  // 0 would divide a zero row of o (a padding token's, say) by 0: NaN in every output and gradient
  if (!(c.normEps > 0) || !Number.isFinite(c.normEps)) {
    throw new RangeError(`config.normEps must be a finite number above 0: got ${c.normEps}`);
  }
  return Object.freeze(c);
}

/** fla's own option names given to the Kimi form, and the field that means the same thing. */
const KIMI_ALIASES: Readonly<Record<string, string>> = {
  hidden_size: "dModel",
  num_heads: "heads",
  num_v_heads: "numVHeads",
  head_dim: "keyDim",
  use_short_conv: "shortConv",
  conv_size: "convSize",
  conv_bias: "convBias",
  allow_neg_eigval: "allowNegEigval",
  lower_bound: "lowerBound",
  safe_gate: "safeGate",
  norm_eps: "normEps",
  state_v_first: "stateVFirst",
};

/** The KDA form's fields that the Kimi form lacks, and what stands for them there. */
const KDA_ONLY: Readonly<Record<string, string>> = {
  decayRank: "the rank of f_proj is valueDim",
  minDecay: "the gate's bound is lowerBound, ln of a smallest decay",
};
