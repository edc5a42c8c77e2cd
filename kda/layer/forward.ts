// The KDA layer's forward (docs/kda.md 2.4) as tape ops around the KDA op: projections, optional
// short convolution, the low-rank decay path, the op (through the seam), the gated RMSNorm and the
// output projection. The Kimi Linear form's forward is kda/layer/kimi.ts; kda/module.ts picks one.

import {
  add,
  alloc,
  causalConv,
  concat,
  exp,
  l2norm,
  linear,
  mul,
  reshape,
  rmsnorm,
  scale,
  sigmoid,
  silu,
  slice,
  Tensor,
} from "../../tape/mod.ts";
import type { Arm, Float } from "../_types.ts";
import { CONV_WIDTH, type KdaConfig } from "./config.ts";
import { runKda } from "../op/arms.ts";
import { computeDtypeOf } from "../../base/dtype.ts";

/**
 * What a layer carries from one segment of a sequence to the next: the KDA state and, with the
 * short convolution, its cache. Run a long input in segments by passing each call's final state to
 * the next; the result equals running it whole. The layouts depend on the form: the KDA layer's
 * are below; Kimi Linear keeps flash-linear-attention's (docs/kda.md 2.9).
 */
export interface KdaModuleState<F extends Float = Float> {
  /**
   * The KDA state after the last token: [B, H, K, V] (KDA form); [B, HV, V, K] with
   * `stateVFirst`, else [B, HV, K, V] (Kimi form).
   */
  kda: F;
  /**
   * With the short convolution, the inputs of q, k and v before the convolution: the last
   * CONV_WIDTH − 1 of them, oldest first, [B, 3, H·K] for q and k and [B, 3, H·V] for v (KDA form);
   * fla's cache, the last `convSize` of them, [B, channels, W] with column W − 1 the last token
   * (Kimi form).
   */
  conv?: { q: F; k: F; v: F };
}

/** One run of a layer's forward: the input, the parameters, the state and the dispatch. */
export interface ForwardRun {
  /** Input [B, T, D]: a constant, or a tensor on the tape that records the gradients. */
  x: Tensor;
  /** Batch. */
  B: number;
  /** Tokens per sequence. */
  T: number;
  /** The parameter groups (constants, or variables on x's tape). */
  params: Map<string, Tensor>;
  /** The state before the first token (zeros when absent). */
  state?: KdaModuleState;
  /** How the KDA op is dispatched. */
  dispatch: { arm?: Arm; strict?: boolean; quiet?: boolean };
  /** The gpu arm's kernel set, when the run names one. */
  kernels?: string;
  /** A decode call (KdaModule.step): the op runs the plain recurrence, kdaStep's path. */
  decode?: boolean;
}

/** A forward's output [B, T, D] and the state after its last token. */
export interface ForwardResult {
  /** The output. */
  y: Tensor;
  /** The state after the last token. */
  state: KdaModuleState;
}

/** The last `n` rows of each batch entry of a [B, rows, width] array, zero-filled in front. */
export function lastRows(data: Float, B: number, rows: number, width: number, n: number): Float {
  const out = alloc(computeDtypeOf(data), B * n * width);
  for (let b = 0; b < B; b++) {
    for (let r = 0; r < n; r++) {
      const src = rows - n + r;
      if (src < 0) continue;
      out.set(
        data.subarray((b * rows + src) * width, (b * rows + src + 1) * width),
        (b * n + r) * width,
      );
    }
  }
  return out;
}

/**
 * The KDA layer's forward of docs/kda.md 2.4.
 *
 * @param config The layer's resolved config.
 * @param run The input, parameters, state and dispatch.
 * @returns The output and the final state.
 */
export async function kdaForward(
  config: Readonly<KdaConfig>,
  run: ForwardRun,
): Promise<ForwardResult> {
  const { dModel: D, heads: H, keyDim: K, valueDim: V, shortConv, minDecay, chunkSize } = config;
  const { B, T, params, state } = run;
  const w = (name: string) => params.get(name)!;
  const rows = reshape(run.x, [B * T, D]);

  // q, k, v: projection, optional causal short conv, then SiLU. A given conv cache stands for
  // the CONV_WIDTH − 1 inputs before t = 0 (zeros when there is none).
  const W1 = CONV_WIDTH - 1;
  const caches: Record<string, Float> = {};
  const branch = (proj: string, conv: string, width: number, which: "q" | "k" | "v") => {
    let u = linear(rows, w(proj));
    if (shortConv) {
      const u3 = reshape(u, [B, T, width]);
      const cache = state?.conv?.[which];
      const full = cache === undefined ? u3 : concat([new Tensor(cache, [B, W1, width]), u3], 1);
      const convolved = causalConv(full, w(conv));
      u = reshape(
        cache === undefined ? convolved : slice(convolved, 1, { start: W1, end: W1 + T }),
        [B * T, width],
      );
      caches[which] = lastRows(full.data, B, full.shape[1], width, W1);
    }
    return silu(u);
  };
  // per-head L2 normalisation of q and k
  const perHead = (u: Tensor) => reshape(l2norm(reshape(u, [B * T * H, K])), [B, T, H, K]);
  const q = perHead(branch("q_proj.weight", "q_conv_w", H * K, "q"));
  const k = perHead(branch("k_proj.weight", "k_conv_w", H * K, "k"));
  const v = reshape(branch("v_proj.weight", "v_conv_w", H * V, "v"), [B, T, H, V]);

  // decay: g = ln(minDecay) · sigmoid(exp(a_log[h]) · (W_up W_down x + b_alpha))
  const z = add(
    linear(linear(rows, w("decay.w_down.weight")), w("decay.w_up.weight")),
    w("decay.b_alpha"),
  );
  const sharpness = reshape(exp(w("decay.a_log")), [H, 1]);
  const g = reshape(
    scale(sigmoid(mul(reshape(z, [B * T, H, K]), sharpness)), Math.log(minDecay)),
    [B, T, H, K],
  );
  const beta = reshape(sigmoid(linear(rows, w("beta_proj.weight"))), [B, T, H]);

  const h0 = state === undefined ? undefined : new Tensor(state.kda, [B, H, K, V]);
  const { o, ht } = await runKda(
    { q, k, v, g, beta, h0 },
    // a decode call runs the plain recurrence (kdaStep's path, docs/kda.md 2.7)
    {
      B,
      T,
      H,
      K,
      V,
      scale: K ** -0.5,
      chunkSize,
      ...(run.decode ? { step: true } : {}),
      ...(run.kernels !== undefined ? { kernels: run.kernels } : {}),
    },
    run.dispatch,
  );

  // y = RMSNorm_V(o) ⊙ o_norm_w ⊙ sigmoid(x W_gateᵀ), then the output projection
  const normed = reshape(rmsnorm(reshape(o, [B * T * H, V]), { eps: 1e-5 }), [B * T, H, V]);
  const gate = reshape(sigmoid(linear(rows, w("o_gate.weight"))), [B * T, H, V]);
  const gated = mul(mul(normed, w("o_norm_w")), gate);
  const y = reshape(linear(reshape(gated, [B * T, H * V]), w("o_proj.weight")), [B, T, D]);
  return {
    y,
    state: {
      kda: ht.data,
      ...(shortConv ? { conv: { q: caches.q, k: caches.k, v: caches.v } } : {}),
    },
  };
}
