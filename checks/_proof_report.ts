// What a proof of the KDA layer reports, and the groups it expects: the shared vocabulary of the
// proof (prove.ts), its diagnosis (diagnose.ts), its printout (report.ts) and its mutants.

import { KIMI_PARAMETER_TABLE, PARAMETER_TABLE } from "../kda/layer/parameters.ts";
import type { Arm } from "../kda/_types.ts";
import { isKimi, type LayerConfig } from "../kda/layer/config.ts";
import type { ComputeDType } from "../base/dtype.ts";
import type { Seam, SeamCounts } from "../seam/seam.ts";
import type { KdaRequest } from "../kda/op/arms.ts";
import type { Agreement } from "./compare.ts";
import type { DirectionalRow, FdRow } from "./gradients.ts";
import type { OpCheck } from "./op_check.ts";

/** The groups the layer must have, spelled out from docs/kda.md 2.4 rather than read from it. */
export const EXPECTED_GROUPS: readonly string[] = [
  "q_proj.weight",
  "k_proj.weight",
  "v_proj.weight",
  "decay.w_down.weight",
  "decay.w_up.weight",
  "decay.b_alpha",
  "decay.a_log",
  "beta_proj.weight",
  "o_norm_w",
  "o_gate.weight",
  "o_proj.weight",
];

/** The three more groups of the short-conv layer. */
export const CONV_GROUPS: readonly string[] = ["q_conv_w", "k_conv_w", "v_conv_w"];

/** Groups after the KDA op: the falsification must leave these green. */
export const DOWNSTREAM_GROUPS: readonly string[] = PARAMETER_TABLE.filter((p) => p.afterOp).map((
  p,
) => p.name);

/**
 * The Kimi Linear form's groups (fla's `KimiDeltaAttention`, docs/kda.md 2.9), spelled out, in
 * the order of fla's constructor: without the short convolution.
 */
export const KIMI_EXPECTED_GROUPS: readonly string[] = [
  "q_proj.weight",
  "k_proj.weight",
  "v_proj.weight",
  "f_proj.0.weight",
  "f_proj.1.weight",
  "b_proj.weight",
  "A_log",
  "dt_bias",
  "g_proj.0.weight",
  "g_proj.1.weight",
  "g_proj.1.bias",
  "o_norm.weight",
  "o_proj.weight",
];

/** The Kimi form's short-convolution groups, and their biases (with `convBias`). */
export const KIMI_CONV_GROUPS: readonly string[] = [
  "q_conv1d.weight",
  "k_conv1d.weight",
  "v_conv1d.weight",
];

/** The Kimi form's short-convolution biases (with `convBias`). */
export const KIMI_CONV_BIAS_GROUPS: readonly string[] = [
  "q_conv1d.bias",
  "k_conv1d.bias",
  "v_conv1d.bias",
];

/** The Kimi form's groups after the KDA op. */
const KIMI_DOWNSTREAM: readonly string[] = KIMI_PARAMETER_TABLE.filter((p) => p.afterOp).map((
  p,
) => p.name);

/**
 * The groups a layer of this config must have (from the lists above, not from the layer's table).
 *
 * @param config A resolved config.
 * @returns The group names.
 */
export function expectedGroups(config: Readonly<LayerConfig>): string[] {
  if (isKimi(config)) {
    return [
      ...KIMI_EXPECTED_GROUPS,
      ...(config.shortConv ? KIMI_CONV_GROUPS : []),
      ...(config.shortConv && config.convBias ? KIMI_CONV_BIAS_GROUPS : []),
    ];
  }
  return [...EXPECTED_GROUPS, ...(config.shortConv ? CONV_GROUPS : [])];
}

/**
 * The groups of this config's layer that act after the KDA op.
 *
 * @param config A resolved config.
 * @returns The group names.
 */
export function downstreamGroups(config: Readonly<LayerConfig>): readonly string[] {
  return isKimi(config) ? KIMI_DOWNSTREAM : DOWNSTREAM_GROUPS;
}

/** The name of the input's row in a proof. */
export const INPUT_ROW = "x";

/** A planted defect: a seam derived from the KDA seam (checks/mutants.ts) that carries it. */
export interface PlantedDefect {
  /** The seam the runs of the arm under test dispatch on (through `withKdaSeam`). */
  seam: Seam<KdaRequest>;
}

/** One parameter group's row. */
export interface GroupRow {
  name: string;
  shape: readonly number[];
  /** `max|grad|` of the arm under test (0: the group got no gradient). */
  gradMax: number;
  /** Central differences of the exact f64 layer on the fd arm. */
  fd: FdRow | null;
  /** Central differences of the arm's own forward in its precision (f32 arms only). */
  fd32: FdRow | null;
  /** ⟨∇L, u⟩ of the arm under test against J·u by forward mode on the f64 ops arm. */
  directional: DirectionalRow | null;
  /** Agreement with the reference arm on the same bytes. */
  reference: Agreement;
  referenceOk: boolean;
  ok: boolean;
}

/** Everything a proof measured. */
export interface ProofReport {
  arm: Arm;
  /** The gpu kernel sets that ran the backward under test, as the seam counted them. */
  kernels: string[];
  referenceArm: Arm;
  fdArm: Arm;
  dtype: ComputeDType;
  config: Readonly<LayerConfig>;
  dims: [number, number];
  groups: { missing: string[]; extra: string[] };
  loss: number;
  lossScale: number;
  rows: GroupRow[];
  /**
   * The input's row (named x): its gradient dx checked as a group's is. x reaches the output
   * through the op and around it (the output gate reads x too).
   */
  input: GroupRow;
  forward: { rel: number; tol: number; ok: boolean };
  gradTol: number;
  directionalTol: number;
  op: OpCheck;
  falsification: { red: string[]; expectedRed: string[]; ok: boolean; note: string };
  reproducible: {
    ok: boolean;
    runs: number;
    mismatched: { name: string; maxDiff: number }[];
    otherProcess: "identical" | "differs" | "not run";
  };
  seam: SeamCounts;
  seamExpected: string;
  seamOk: boolean;
  declines: string[];
  timings: Record<string, number>;
  diagnosis: string | null;
  ok: boolean;
}
