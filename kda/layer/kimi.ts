// The Kimi Linear form's forward (docs/kda.md 2.9): flash-linear-attention's `KimiDeltaAttention`
// as tape ops around the KDA op. The gate, beta and the L2 normalisation of q and k are tape ops
// here (fla computes them inside its kernels, `use_gate_in_kernel`, `use_beta_sigmoid_in_kernel`,
// `use_qk_l2norm_in_kernel`); the arithmetic is the same.

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
  softplus,
  Tensor,
} from "../../tape/mod.ts";
import type { Float } from "../_types.ts";
import type { KimiConfig } from "./config.ts";
import { runKda } from "../op/arms.ts";
import { computeDtypeOf } from "../../base/dtype.ts";
import type { ForwardResult, ForwardRun } from "./forward.ts";

/** [N, a, b] to [N, b, a], on the host. */
export function swapLastTwo(data: Float, N: number, a: number, b: number): Float {
  const out = alloc(computeDtypeOf(data), data.length);
  for (let n = 0; n < N; n++) {
    const base = n * a * b;
    for (let i = 0; i < a; i++) {
      for (let j = 0; j < b; j++) out[base + j * a + i] = data[base + i * b + j];
    }
  }
  return out;
}

/**
 * The W − 1 inputs before t = 0 that an fla conv cache [B, C, W] holds (its columns 1 … W − 1,
 * column W − 1 the last token; column 0 is the input the next token pushes out), as [B, W − 1, C].
 */
function cacheHistory(cache: Float, B: number, C: number, W: number): Float {
  const out = alloc(computeDtypeOf(cache), B * (W - 1) * C);
  for (let b = 0; b < B; b++) {
    for (let j = 0; j < W - 1; j++) {
      for (let c = 0; c < C; c++) out[(b * (W - 1) + j) * C + c] = cache[(b * C + c) * W + j + 1];
    }
  }
  return out;
}

/**
 * fla's conv cache after a segment: the last W inputs [B, C, W] of the cache's history followed
 * by the segment's T inputs u [B, T, C] (zeros before the first token when there is no cache).
 */
function cacheAfter(
  u: Float,
  cache: Float | undefined,
  B: number,
  T: number,
  C: number,
  W: number,
) {
  const out = alloc(computeDtypeOf(u), B * C * W);
  for (let b = 0; b < B; b++) {
    for (let j = 0; j < W; j++) {
      const p = T - W + j; // the input's time; p < 0 lies in the cache (column W + p)
      for (let c = 0; c < C; c++) {
        out[(b * C + c) * W + j] = p >= 0
          ? u[(b * T + p) * C + c]
          : cache === undefined
          ? 0
          : cache[(b * C + c) * W + W + p];
      }
    }
  }
  return out;
}

/**
 * The Kimi Linear layer's forward of docs/kda.md 2.9.
 *
 * @param config The layer's resolved config.
 * @param run The input, parameters, state (in fla's layouts) and dispatch.
 * @returns The output and the final state, in fla's layouts.
 */
export async function kimiForward(
  config: Readonly<KimiConfig>,
  run: ForwardRun,
): Promise<ForwardResult> {
  const { dModel: D, heads: H, numVHeads: HV, keyDim: K, valueDim: V } = config;
  const { shortConv, convSize: W, convBias, chunkSize } = config;
  const { B, T, params, state } = run;
  const w = (name: string) => params.get(name)!;
  const rows = reshape(run.x, [B * T, D]);

  // q, k, v: projection, then the causal short conv with its optional bias and SiLU, or SiLU
  // alone. A given cache stands for the W − 1 inputs before t = 0 (zeros when there is none).
  const caches: Record<string, Float> = {};
  const branch = (s: "q" | "k" | "v", width: number) => {
    const u = linear(rows, w(`${s}_proj.weight`));
    if (!shortConv) return silu(u);
    const u3 = reshape(u, [B, T, width]);
    const cache = state?.conv?.[s];
    const history = cache === undefined || W === 1
      ? undefined
      : new Tensor(cacheHistory(cache, B, width, W), [B, W - 1, width]);
    const taps = reshape(w(`${s}_conv1d.weight`), [width, W]);
    let c = history === undefined
      ? causalConv(u3, taps)
      : slice(causalConv(concat([history, u3], 1), taps), 1, { start: W - 1, end: W - 1 + T });
    if (convBias) c = add(c, w(`${s}_conv1d.bias`));
    caches[s] = cacheAfter(u3.data, cache, B, T, width, W);
    return reshape(silu(c), [B * T, width]);
  };
  // q and k: per head, x / sqrt(Σ x² + 1e-6) over K (fla's l2norm, eps added to the sum)
  const perHead = (u: Tensor) =>
    reshape(l2norm(reshape(u, [B * T * H, K]), { eps: 1e-6 }), [B, T, H, K]);
  const q = perHead(branch("q", H * K));
  const k = perHead(branch("k", H * K));
  const v = reshape(branch("v", HV * V), [B, T, HV, V]);

  // the gate: z = f_proj(x) + dt_bias per value head and key channel, then
  //   lowerBound null: g = −e^{A_log} · softplus(z);  lowerBound lb: g = lb · sigmoid(e^{A_log} · z)
  const z = reshape(
    add(linear(linear(rows, w("f_proj.0.weight")), w("f_proj.1.weight")), w("dt_bias")),
    [B * T, HV, K],
  );
  const sharpness = reshape(exp(w("A_log")), [HV, 1]);
  const g = reshape(
    config.lowerBound === null
      ? scale(mul(softplus(z), sharpness), -1)
      : scale(sigmoid(mul(z, sharpness)), config.lowerBound),
    [B, T, HV, K],
  );
  // beta = sigmoid(b), times 2 with allowNegEigval
  const b = sigmoid(linear(rows, w("b_proj.weight")));
  const beta = reshape(config.allowNegEigval ? scale(b, 2) : b, [B, T, HV]);

  const h0 = state === undefined ? undefined : new Tensor(
    config.stateVFirst ? swapLastTwo(state.kda, B * HV, V, K) : state.kda,
    [B, HV, K, V],
  );
  const { o, ht } = await runKda(
    { q, k, v, g, beta, h0 },
    {
      B,
      T,
      H,
      K,
      V,
      ...(HV !== H ? { HV } : {}),
      scale: K ** -0.5,
      chunkSize,
      ...(run.decode ? { step: true } : {}),
      ...(run.kernels !== undefined ? { kernels: run.kernels } : {}),
    },
    run.dispatch,
  );

  // y = RMSNorm_V(o) ⊙ o_norm.weight ⊙ sigmoid(g_proj(x)), per value head, then o_proj
  const normed = reshape(rmsnorm(reshape(o, [B * T * HV, V]), { eps: config.normEps }), [
    B * T,
    HV,
    V,
  ]);
  const gate = reshape(
    add(linear(linear(rows, w("g_proj.0.weight")), w("g_proj.1.weight")), w("g_proj.1.bias")),
    [B * T, HV, V],
  );
  const gated = mul(mul(normed, w("o_norm.weight")), sigmoid(gate));
  const y = reshape(linear(reshape(gated, [B * T, HV * V]), w("o_proj.weight")), [B, T, D]);
  return {
    y,
    state: {
      kda: config.stateVFirst ? swapLastTwo(ht.data, B * HV, K, V) : ht.data,
      ...(shortConv ? { conv: { q: caches.q, k: caches.k, v: caches.v } } : {}),
    },
  };
}
