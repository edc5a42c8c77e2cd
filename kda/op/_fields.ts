// The fields of the op's arguments (inputs, cotangents, options; a decode call's token and
// options), flash-linear-attention's names for them, and where a field given to the wrong argument
// goes: one table each, for the checks of _check.ts and the refusals of base/check.ts's
// checkKnownKeys.

import { IN_KERNEL_KEYS } from "./_options.ts";

/** The array fields of a call's inputs, in the order their checks and messages take them. */
export const ARRAY_KEYS = ["q", "k", "v", "g", "beta", "h0", "aLog", "dtBias"] as const;

/** The fields of `kda`/`kdaVjp`'s inputs. */
export const INPUT_KEYS = [
  "B",
  "T",
  "H",
  "K",
  "V",
  "HV",
  "cuSeqlens",
  "q",
  "k",
  "v",
  "g",
  "beta",
  "h0",
  "aLog",
  "dtBias",
  "scale",
] as const;

/** The fields of `kdaVjp`'s cotangents. */
export const COTANGENT_KEYS = ["dout", "dht"] as const;

/** The fields of `kda`/`kdaVjp`'s options. */
export const OPTION_KEYS: readonly string[] = [
  "arm",
  "chunkSize",
  "kernels",
  "strict",
  "quiet",
  ...IN_KERNEL_KEYS,
  "outputFinalState",
];

/** The fields of a decode call's token (`kdaStep`). */
export const TOKEN_KEYS = [
  "B",
  "T",
  "H",
  "K",
  "V",
  "HV",
  "q",
  "k",
  "v",
  "g",
  "beta",
  "aLog",
  "dtBias",
  "scale",
] as const;

/** The array fields of a decode call's token. */
export const TOKEN_ARRAYS = ["q", "k", "v", "g", "beta", "aLog", "dtBias"] as const;

/** The fields of `kdaStep`'s options. */
export const STEP_OPTION_KEYS: readonly string[] = ["arm", "strict", "quiet", ...IN_KERNEL_KEYS];

/**
 * flash-linear-attention's names (the keyword arguments of `chunk_kda` and `fused_recurrent_kda`,
 * and `do` for the output cotangent) mapped to this package's field for the same thing, so that a
 * refused key points there: to the checked argument's own field, or to where it goes (the tables
 * below). An entry of no field of either (an option this package lacks) is not named, so the table
 * may list them all.
 */
export const FLA_NAMES: Readonly<Record<string, string>> = Object.freeze({
  initial_state: "h0",
  cu_seqlens: "cuSeqlens",
  cu_seqlens_cpu: "cuSeqlens",
  output_final_state: "outputFinalState",
  chunk_size: "chunkSize",
  A_log: "aLog",
  dt_bias: "dtBias",
  use_qk_l2norm_in_kernel: "useQkL2NormInKernel",
  use_gate_in_kernel: "useGateInKernel",
  use_beta_sigmoid_in_kernel: "useBetaSigmoidInKernel",
  allow_neg_eigval: "allowNegEigval",
  lower_bound: "lowerBound",
  safe_gate: "safeGate",
  state_v_first: "stateVFirst",
  return_intermediate_states: "returnIntermediateStates",
  do: "dout",
});

/** Each field of `keys` at its place in the argument `where`. */
function placed(keys: readonly string[], where: string): Record<string, string> {
  return Object.fromEntries(keys.map((k) => [k, `${where}.${k}`]));
}

/** The cotangents' fields (kdaVjp's second argument). */
const COTANGENTS = placed(COTANGENT_KEYS, "cotangents");

/** Where a field of another argument goes, for a key refused in the inputs. */
export const INPUTS_ELSEWHERE: Readonly<Record<string, string>> = Object.freeze({
  ...placed(OPTION_KEYS, "options"),
  ...COTANGENTS,
});

/** Where a field of another argument goes, for a key refused in the options. */
export const OPTIONS_ELSEWHERE: Readonly<Record<string, string>> = Object.freeze({
  ...placed(INPUT_KEYS, "inputs"),
  ...COTANGENTS,
});

/** Where a field of another argument goes, for a key refused in a decode call's token. */
export const TOKEN_ELSEWHERE: Readonly<Record<string, string>> = Object.freeze({
  ...placed(STEP_OPTION_KEYS, "options"),
  h0: "the state (kdaStep's first argument)",
});

/** Where a field of another argument goes, for a key refused in a decode call's options. */
export const STEP_OPTIONS_ELSEWHERE: Readonly<Record<string, string>> = Object.freeze({
  ...placed(TOKEN_KEYS, "token"),
  h0: "the state (kdaStep's first argument)",
});
