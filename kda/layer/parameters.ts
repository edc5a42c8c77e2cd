// The layer's parameter groups (docs/kda.md 2.4): one table of name, shape from the config,
// initialisation and role, which drives construction, KdaModule.parameters() and the tests.

import type { KdaConfig } from "./config.ts";
import { CONV_WIDTH } from "./config.ts";
import { mulberry32, normal, subSeed } from "./_random.ts";

/** How a parameter group is initialised (docs/kda.md 2.4). */
export type ParameterInit = "normal" | "aLog" | "bAlpha" | "ones";

/** One parameter group: its name, its shape from the config, its initialisation and its role. */
export interface ParameterSpec {
  /** The group's name. */
  readonly name: string;
  /** Its shape under a config. */
  readonly shape: (c: Readonly<KdaConfig>) => number[];
  /** How it is initialised. */
  readonly init: ParameterInit;
  /** Whether the group exists only with the short convolution. */
  readonly conv: boolean;
  /** Whether it acts after the KDA op (its gradient does not flow through the op). */
  readonly afterOp: boolean;
  /** What it does. */
  readonly role: string;
}

function spec(
  name: string,
  shape: (c: Readonly<KdaConfig>) => number[],
  init: ParameterInit,
  role: string,
  flags: { conv?: boolean; afterOp?: boolean } = {},
): ParameterSpec {
  return Object.freeze({
    name,
    shape,
    init,
    role,
    conv: flags.conv ?? false,
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
  }
}
