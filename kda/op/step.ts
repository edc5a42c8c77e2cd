// The decode step: one token per sequence, the state in and out (docs/kda.md 2.7). The arguments
// are checked once here; the seam picks the arm as for every other call (kda/arms.ts).

import { Tensor } from "../../tape/mod.ts";
import type { Arm, Float, PublicFloat } from "../_types.ts";
import { checkKdaStep, checkStepOptions } from "./_check.ts";
import { checkObject, typeName } from "../../base/check.ts";
import { isHalf, narrowHalf, widenHalf } from "./_half.ts";
import { runKda } from "./arms.ts";

/** One token per sequence for {@linkcode kdaStep}: its dimensions and arrays, all of type `F`. */
export interface KdaStepToken<F extends PublicFloat = Float> {
  /** Sequences decoded side by side. */
  B: number;
  /** Query/key heads. */
  H: number;
  /** Key dimension per head. */
  K: number;
  /** Value dimension per head. */
  V: number;
  /** Value heads, a multiple of H (docs/kda.md 2.5); default H. */
  HV?: number;
  /** The token's queries [B, H, K]. */
  q: F;
  /** The token's keys [B, H, K]. */
  k: F;
  /** The token's values [B, HV, V]. */
  v: F;
  /** The token's log decays [B, HV, K], each ≤ 0. */
  g: F;
  /** The token's write strengths [B, HV]. */
  beta: F;
  /** Query scale; default K^(-1/2). */
  scale?: number;
}

/** What one {@linkcode kdaStep} returns. */
export interface KdaStepResult<F extends PublicFloat = Float> {
  /** The token's output [B, HV, V]. */
  o: F;
  /** The state after the token [B, HV, K, V]: hand it to the next step. */
  state: F;
}

/** Options of {@linkcode kdaStep}: those of `kda` without a chunk size. */
export interface KdaStepOptions {
  /** The arm to run; default `KDA_REQUIRE_ARM`, else by dtype and adapter (see the README). */
  arm?: Arm;
  /** Throw instead of declining to another arm (default: on when `KDA_REQUIRE_ARM` is set). */
  strict?: boolean;
  /** No stderr warning when the call declines (it is still counted and recorded). */
  quiet?: boolean;
}

const TOKEN_ARRAYS = ["q", "k", "v", "g", "beta"] as const;

/**
 * One decode step of the KDA op (docs/kda.md 2.7): reads one token per sequence, updates each
 * sequence's state by the recurrence of docs/kda.md 2.1 and returns the token's output with the
 * new state. Running T tokens through `kdaStep` gives, token by token, the outputs and the final
 * state of {@linkcode kda} on the whole sequence with `h0` the first state.
 *
 * Arms: `ops` runs the recurrence with the tape's ops and `cpu` runs it directly on the host (in
 * f64 inside; results in the inputs' type); `gpu` has no decode kernel, so it runs the chunked
 * forward with T = 1 and h0 = state through the seam, uploading the state and reading it back
 * every step (the state does not stay on the device between steps). Inference only: no gradient
 * is recorded. Float16Array inputs compute in f32 and return Float16Array results.
 *
 * @param state The state before the token, [B, HV, K, V], of the token's array type (zeros for a
 *   fresh sequence, or the `ht` of a prefill run by {@linkcode kda}).
 * @param token q, k [B, H, K], v [B, HV, V], g [B, HV, K], beta [B, HV], with B, H, K, V and
 *   optionally HV and scale.
 * @param options `arm`, `strict`, `quiet`.
 * @returns `o` [B, HV, V] and the new `state` [B, HV, K, V], new arrays of the inputs' type.
 *
 * @example A generation loop: prefill with kda, then decode one token at a time
 * ```ts
 * import { kda, kdaStep } from "@deltanet/kda";
 *
 * const [B, H, K, V] = [1, 2, 4, 4];
 * const fill = (n: number, x: number) => new Float32Array(n).fill(x);
 * // Prefill: the prompt's 8 tokens in one chunked call; its final state seeds the decoding.
 * const T = 8;
 * const prompt = {
 *   B, T, H, K, V,
 *   q: fill(B * T * H * K, 0.1), k: fill(B * T * H * K, 0.5), v: fill(B * T * H * V, 1),
 *   g: fill(B * T * H * K, -0.05), beta: fill(B * T * H, 0.5),
 * };
 * let { ht: state } = await kda(prompt, { arm: "cpu" });
 * for (let t = 0; t < 4; t++) {
 *   // In a model, q, k, v, g and beta come from the previous output; here they are constants.
 *   const token = {
 *     B, H, K, V,
 *     q: fill(B * H * K, 0.1), k: fill(B * H * K, 0.5), v: fill(B * H * V, 1),
 *     g: fill(B * H * K, -0.05), beta: fill(B * H, 0.5),
 *   };
 *   const step = await kdaStep(state, token, { arm: "cpu" });
 *   state = step.state; // o: [B, H, V], this token's output
 * }
 * ```
 */
export async function kdaStep<F extends PublicFloat>(
  state: F,
  token: KdaStepToken<F>,
  options: KdaStepOptions = {},
): Promise<KdaStepResult<F>> {
  const half = isHalf((token as { q?: unknown } | null)?.q);
  let stateIn: unknown = state, tokenIn: unknown = token;
  if (half) {
    tokenIn = widenHalf("token", checkObject("token", token), TOKEN_ARRAYS);
    if (!isHalf(state)) {
      throw new TypeError(
        `state must be a Float16Array like the token's arrays: got ${typeName(state)}`,
      );
    }
    stateIn = Float32Array.from(state as ArrayLike<number>);
  }
  const { problem } = checkKdaStep(stateIn, tokenIn);
  const seamOptions = checkStepOptions(options);
  const { B, H, K, V, scale } = problem;
  const HV = problem.HV ?? H;
  const wrap = (data: Float, shape: number[]) => new Tensor(data, shape);
  const { o, ht } = await runKda(
    {
      q: wrap(problem.q, [B, 1, H, K]),
      k: wrap(problem.k, [B, 1, H, K]),
      v: wrap(problem.v, [B, 1, HV, V]),
      g: wrap(problem.g, [B, 1, HV, K]),
      beta: wrap(problem.beta, [B, 1, HV]),
      h0: wrap(problem.h0!, [B, HV, K, V]),
    },
    { B, T: 1, H, K, V, scale, chunkSize: 16, step: true, ...(HV !== H ? { HV } : {}) },
    seamOptions,
  );
  const result = { o: o.data as Float, state: ht.data as Float };
  return (half ? narrowHalf(result) : result) as KdaStepResult<F>;
}
