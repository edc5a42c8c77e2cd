// The layer's parameter groups: one table per form (docs/kda.md 2.4 for the KDA layer, 2.9 for
// Kimi Linear, whose names and shapes are flash-linear-attention's) of name, shape from the
// config, initialisation and role, which drives construction, KdaModule.parameters() and the tests.

import { CONV_WIDTH, isKimi, type KdaConfig, type KimiConfig, type LayerConfig } from "./config.ts";
import { mulberry32, normal, subSeed } from "./_random.ts";
import type { ComputeDType } from "../../base/dtype.ts";

/** How a parameter group is initialised (docs/kda.md 2.4). */
export type ParameterInit = "normal" | "aLog" | "bAlpha" | "ones" | "zeros";

/** One parameter group: its name, its shape from the config, its initialisation and its role. */
export interface ParameterSpec<C = KdaConfig> {
  /** The group's name. */
  readonly name: string;
  /** Its shape under a config. */
  readonly shape: (c: Readonly<C>) => number[];
  /** How it is initialised. */
  readonly init: ParameterInit;
  /** Whether the group exists only with the short convolution. */
  readonly conv: boolean;
  /** Whether the group exists only with the short convolution's bias (Kimi form: `convBias`). */
  readonly bias: boolean;
  /** Whether it acts after the KDA op (its gradient does not flow through the op). */
  readonly afterOp: boolean;
  /** What it does. */
  readonly role: string;
}

function spec<C = KdaConfig>(
  name: string,
  shape: (c: Readonly<C>) => number[],
  init: ParameterInit,
  role: string,
  flags: { conv?: boolean; bias?: boolean; afterOp?: boolean } = {},
): ParameterSpec<C> {
  return Object.freeze({
    name,
    shape,
    init,
    role,
    conv: flags.conv ?? flags.bias ?? false,
    bias: flags.bias ?? false,
    afterOp: flags.afterOp ?? false,
  });
}

/**
 * The layer's parameter groups in the order of docs/kda.md 2.4: the one table that drives
 * construction, {@linkcode KdaModule.parameters} and the tests.
 *
 * @example Usage
 * ```ts
 * import { PARAMETER_TABLE } from "@deltanet/kda";
 * PARAMETER_TABLE.filter((p) => !p.conv).length; // 11
 * ```
 */
export const PARAMETER_TABLE: readonly ParameterSpec[] = Object.freeze([
  spec("q_proj.weight", (c) => [c.heads * c.keyDim, c.dModel], "normal", "query projection"),
  spec("k_proj.weight", (c) => [c.heads * c.keyDim, c.dModel], "normal", "key projection"),
  spec("v_proj.weight", (c) => [c.heads * c.valueDim, c.dModel], "normal", "value projection"),
  spec("q_conv_w", (c) => [c.heads * c.keyDim, CONV_WIDTH], "normal", "query short conv", {
    conv: true,
  }),
  spec("k_conv_w", (c) => [c.heads * c.keyDim, CONV_WIDTH], "normal", "key short conv", {
    conv: true,
  }),
  spec("v_conv_w", (c) => [c.heads * c.valueDim, CONV_WIDTH], "normal", "value short conv", {
    conv: true,
  }),
  spec("decay.w_down.weight", (c) => [c.decayRank, c.dModel], "normal", "decay path, D to R"),
  spec(
    "decay.w_up.weight",
    (c) => [c.heads * c.keyDim, c.decayRank],
    "normal",
    "decay path, R to H·K",
  ),
  spec("decay.b_alpha", (c) => [c.heads * c.keyDim], "bAlpha", "per-channel decay bias"),
  spec("decay.a_log", (c) => [c.heads], "aLog", "per-head decay sharpness"),
  spec("beta_proj.weight", (c) => [c.heads, c.dModel], "normal", "write strength"),
  spec("o_norm_w", (c) => [c.valueDim], "ones", "output RMSNorm weight", { afterOp: true }),
  spec("o_gate.weight", (c) => [c.heads * c.valueDim, c.dModel], "normal", "output gate", {
    afterOp: true,
  }),
  spec("o_proj.weight", (c) => [c.dModel, c.heads * c.valueDim], "normal", "output projection", {
    afterOp: true,
  }),
]);

// Kimi Linear's groups in fla's shapes (H query/key heads, HV value heads, W = convSize).
const HK = (c: Readonly<KimiConfig>) => c.heads * c.keyDim;
const HVV = (c: Readonly<KimiConfig>) => c.numVHeads * c.valueDim;
const HVK = (c: Readonly<KimiConfig>) => c.numVHeads * c.keyDim;
const kimiConv = (s: "q" | "k" | "v", width: (c: Readonly<KimiConfig>) => number) => [
  spec<KimiConfig>(
    `${s}_conv1d.weight`,
    (c) => [width(c), 1, c.convSize],
    "normal",
    `${s} short conv`,
    { conv: true },
  ),
  spec<KimiConfig>(`${s}_conv1d.bias`, (c) => [width(c)], "zeros", `${s} short conv bias`, {
    bias: true,
  }),
];

/**
 * The Kimi Linear form's parameter groups (docs/kda.md 2.9): flash-linear-attention's
 * `KimiDeltaAttention` names and shapes, in the order its constructor makes them. The conv groups
 * exist with `shortConv`, their biases with `convBias` too; `A_log` starts at 0 with `safeGate`.
 *
 * @example Usage
 * ```ts
 * import { KIMI_PARAMETER_TABLE } from "@deltanet/kda";
 * KIMI_PARAMETER_TABLE.filter((p) => !p.conv).length; // 13
 * ```
 */
export const KIMI_PARAMETER_TABLE: readonly ParameterSpec<KimiConfig>[] = Object.freeze([
  spec<KimiConfig>("q_proj.weight", (c) => [HK(c), c.dModel], "normal", "query projection"),
  spec<KimiConfig>("k_proj.weight", (c) => [HK(c), c.dModel], "normal", "key projection"),
  spec<KimiConfig>("v_proj.weight", (c) => [HVV(c), c.dModel], "normal", "value projection"),
  ...kimiConv("q", HK),
  ...kimiConv("k", HK),
  ...kimiConv("v", HVV),
  spec<KimiConfig>("f_proj.0.weight", (c) => [c.valueDim, c.dModel], "normal", "gate, D to V"),
  spec<KimiConfig>("f_proj.1.weight", (c) => [HVK(c), c.valueDim], "normal", "gate, V to HV·K"),
  spec<KimiConfig>("b_proj.weight", (c) => [c.numVHeads, c.dModel], "normal", "write strength"),
  spec<KimiConfig>("A_log", (c) => [c.numVHeads], "aLog", "per value head gate scale (log)"),
  spec<KimiConfig>("dt_bias", (c) => [HVK(c)], "bAlpha", "per-channel gate bias"),
  spec<KimiConfig>(
    "g_proj.0.weight",
    (c) => [c.valueDim, c.dModel],
    "normal",
    "output gate, D to V",
    {
      afterOp: true,
    },
  ),
  spec<KimiConfig>(
    "g_proj.1.weight",
    (c) => [HVV(c), c.valueDim],
    "normal",
    "output gate, V to HV·V",
    {
      afterOp: true,
    },
  ),
  spec<KimiConfig>("g_proj.1.bias", (c) => [HVV(c)], "zeros", "output gate bias", {
    afterOp: true,
  }),
  spec<KimiConfig>("o_norm.weight", (c) => [c.valueDim], "ones", "output RMSNorm weight", {
    afterOp: true,
  }),
  spec<KimiConfig>("o_proj.weight", (c) => [c.dModel, HVV(c)], "normal", "output projection", {
    afterOp: true,
  }),
]);

/** One parameter group of a layer, resolved under its config. */
export interface LayerGroup {
  /** The group's name. */
  readonly name: string;
  /** Its shape. */
  readonly shape: number[];
  /** How it is initialised under this config. */
  readonly init: ParameterInit;
  /** Whether it acts after the KDA op. */
  readonly afterOp: boolean;
  /** What it does. */
  readonly role: string;
}

/**
 * The parameter groups a config gives, in table order, with their shapes and initialisation:
 * {@linkcode PARAMETER_TABLE} for the KDA form, {@linkcode KIMI_PARAMETER_TABLE} for Kimi Linear.
 *
 * @param config A resolved config of either form.
 * @returns The groups.
 *
 * @example Usage
 * ```ts
 * import { DEFAULT_CONFIG, layerGroups } from "@deltanet/kda";
 * layerGroups(DEFAULT_CONFIG).length; // 11
 * ```
 */
export function layerGroups(config: Readonly<LayerConfig>): LayerGroup[] {
  const resolve = <C>(p: ParameterSpec<C>, c: Readonly<C>, init: ParameterInit): LayerGroup => ({
    name: p.name,
    shape: p.shape(c),
    init,
    afterOp: p.afterOp,
    role: p.role,
  });
  if (isKimi(config)) {
    return KIMI_PARAMETER_TABLE
      .filter((p) => (config.shortConv || !p.conv) && (config.convBias || !p.bias))
      .map((p) => resolve(p, config, p.name === "A_log" && config.safeGate ? "zeros" : p.init));
  }
  return PARAMETER_TABLE.filter((p) => config.shortConv || !p.conv).map((p) =>
    resolve(p, config, p.init)
  );
}

/**
 * The parameter group names in table order, without and with the short conv.
 *
 * @param shortConv Whether the layer has the short convolution.
 * @returns 11 names, or 14 with the short conv.
 *
 * @example Usage
 * ```ts
 * import { parameterNames } from "@deltanet/kda";
 * parameterNames(true).length; // 14
 * ```
 */
export function parameterNames(shortConv: boolean): string[] {
  return PARAMETER_TABLE.filter((p) => shortConv || !p.conv).map((p) => p.name);
}

/** A draw of one group's initial values (docs/kda.md 2.4), from its own seeded stream. */
export function initialDraw(init: ParameterInit, seed: number, name: string): () => number {
  const uniform = mulberry32(subSeed(seed, name));
  switch (init) {
    case "normal": {
      const n = normal(uniform);
      return () => 0.02 * n();
    }
    case "aLog":
      return () => Math.log(1 + 15 * uniform());
    case "bAlpha": {
      // inverse softplus of dt = exp(U[ln 1e-3, ln 0.1]): ln(e^dt − 1)
      const lo = Math.log(1e-3), hi = Math.log(0.1);
      return () => Math.log(Math.expm1(Math.exp(lo + (hi - lo) * uniform())));
    }
    case "ones":
      return () => 1;
    case "zeros":
      return () => 0;
  }
}

/** The largest a_log whose exp is finite in each dtype: ln of the dtype's largest value. */
const A_LOG_LIMIT: Readonly<Record<ComputeDType, number>> = Object.freeze({
  f64: Math.log(Number.MAX_VALUE),
  f32: Math.log((2 - 2 ** -23) * 2 ** 127),
});

/**
 * Throws unless every parameter is finite and the decay's a_log (the Kimi form's A_log) keeps
 * exp(a_log) finite in the layer's dtype: one bad value would turn every output, or every
 * gradient, into NaN.
 *
 * @param params The layer's groups by name.
 * @param config The layer's config (its form names the a_log group).
 * @param dtype The layer's dtype.
 * @example
 * ```ts
 * scanParameters(new Map([["decay.a_log", { data: new Float64Array([0.5]) }]]), {
 *   form: "kda",
 * } as never, "f64"); // passes
 * ```
 */
export function scanParameters(
  params: ReadonlyMap<string, { readonly data: ArrayLike<number> }>,
  config: Readonly<LayerConfig>,
  dtype: ComputeDType,
): void {
  for (const [name, p] of params) {
    const d = p.data;
    for (let i = 0; i < d.length; i++) {
      if (!Number.isFinite(d[i])) {
        throw new RangeError(
          `parameter ${name} must be finite: got ${d[i]} at index ${i} ` +
            `(set options.checkParameters to false to skip this scan)`,
        );
      }
    }
  }
  // exp(a_log) overflowing to Infinity still gives a finite forward (sigmoid(±Inf) is 0 or 1;
  // the Kimi form's −e^{A_log}·softplus gives gates of −Inf, whose decay is 0), but the backward
  // multiplies that Infinity by a zero slope: NaN gradients.
  const [group, doc] = isKimi(config) ? ["A_log", "2.9"] : ["decay.a_log", "2.4"];
  const aLog = params.get(group)?.data ?? [], limit = A_LOG_LIMIT[dtype];
  for (let i = 0; i < aLog.length; i++) {
    if (!(aLog[i] <= limit)) {
      throw new RangeError(
        `parameter ${group} must be at most ${limit}, where exp(${group}) stays finite in ` +
          `${dtype}: got ${aLog[i]} at index ${i} (exp(${group}) is the decay's sharpness, ` +
          `docs/kda.md ${doc})`,
      );
    }
  }
}
