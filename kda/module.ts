// The KDA layer of DESIGN.md 2.4: projections, optional short convolution, the low-rank decay
// path, the KDA op (through the seam), the gated RMSNorm and the output projection.

import {
  add,
  alloc,
  causalConv,
  exp,
  l2norm,
  linear,
  mul,
  reshape,
  rmsnorm,
  scale,
  sigmoid,
  silu,
  Tape,
  Tensor,
} from "../tape/mod.ts";
import { dispatchKda } from "../seam/seam.ts";
import type { Arm } from "./_types.ts";
import { checkPositiveInt, CONV_WIDTH, type KdaConfig, resolveConfig } from "./config.ts";
import { checkArray } from "./op.ts";
import { mulberry32, normal, subSeed } from "./_random.ts";

/** Options of {@linkcode KdaModule.forward} and {@linkcode KdaModule.vjp}. */
export interface KdaModuleRunOptions {
  /** The arm that runs the KDA op. */
  arm?: Arm;
  /** Throw instead of declining to another arm. */
  strict?: boolean;
  /**
   * Falsification switch: the KDA op's outputs come back detached, so no group upstream of it
   * gets a gradient. For the gradient proof only.
   */
  detachKdaOutputs?: boolean;
}

/** Parameter group names in the order of DESIGN.md 2.4, without and with the short conv. */
export function parameterNames(shortConv: boolean): string[] {
  return [
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    ...(shortConv ? ["q_conv_w", "k_conv_w", "v_conv_w"] : []),
    "decay.w_down.weight",
    "decay.w_up.weight",
    "decay.b_alpha",
    "decay.a_log",
    "beta_proj.weight",
    "o_norm_w",
    "o_gate.weight",
    "o_proj.weight",
  ];
}

/**
 * The KDA layer: input `x` [B, T, D] to output [B, T, D], with 11 parameter groups (14 with the
 * short convolution), initialised reproducibly from `config.seed`.
 *
 * @example Usage
 * ```ts
 * import { KdaModule } from "@deltanet/kda";
 * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
 * const x = new Float64Array(1 * 5 * 8).fill(0.1);
 * const y = await layer.forward(x, [1, 5], { arm: "cpu" });
 * ```
 */
export class KdaModule {
  /** The resolved configuration. */
  readonly config: Readonly<KdaConfig>;
  /** The element type of the parameters and of every computation. */
  readonly dtype: "f64" | "f32";
  readonly #params: Map<string, Tensor>;

  /**
   * Builds and initialises the layer.
   *
   * @param config Fields to override in {@linkcode DEFAULT_CONFIG}.
   * @param options `dtype`: "f64" (default) or "f32".
   */
  constructor(config: Partial<KdaConfig> = {}, options: { dtype?: "f64" | "f32" } = {}) {
    this.config = resolveConfig(config);
    if (typeof options !== "object" || options === null) {
      throw new TypeError(
        `options must be an object: got ${options === null ? "null" : typeof options}`,
      );
    }
    const dtype = options.dtype ?? "f64";
    if (dtype !== "f64" && dtype !== "f32") {
      throw new TypeError(`options.dtype must be "f64" or "f32": got ${String(dtype)}`);
    }
    this.dtype = dtype;
    this.#params = this.#initialise();
  }

  #initialise(): Map<string, Tensor> {
    const { dModel: D, heads: H, keyDim: K, valueDim: V, decayRank: R, seed } = this.config;
    const params = new Map<string, Tensor>();
    const make = (name: string, shape: number[], draw: () => number) => {
      const data = alloc(this.dtype, shape.reduce((a, b) => a * b, 1));
      for (let i = 0; i < data.length; i++) data[i] = draw();
      params.set(name, new Tensor(data, shape));
    };
    const gaussian = (name: string) => {
      const n = normal(mulberry32(subSeed(seed, name)));
      return () => 0.02 * n();
    };
    const uniform = (name: string) => mulberry32(subSeed(seed, name));
    const shapes: Record<string, number[]> = {
      "q_proj.weight": [H * K, D],
      "k_proj.weight": [H * K, D],
      "v_proj.weight": [H * V, D],
      "q_conv_w": [H * K, CONV_WIDTH],
      "k_conv_w": [H * K, CONV_WIDTH],
      "v_conv_w": [H * V, CONV_WIDTH],
      "decay.w_down.weight": [R, D],
      "decay.w_up.weight": [H * K, R],
      "decay.b_alpha": [H * K],
      "decay.a_log": [H],
      "beta_proj.weight": [H, D],
      "o_norm_w": [V],
      "o_gate.weight": [H * V, D],
      "o_proj.weight": [D, H * V],
    };
    for (const name of parameterNames(this.config.shortConv)) {
      if (name === "decay.a_log") {
        const u = uniform(name);
        make(name, shapes[name], () => Math.log(1 + 15 * u()));
      } else if (name === "decay.b_alpha") {
        // inverse softplus of dt = exp(U[ln 1e-3, ln 0.1]): ln(e^dt − 1)
        const u = uniform(name);
        const lo = Math.log(1e-3), hi = Math.log(0.1);
        make(name, shapes[name], () => Math.log(Math.expm1(Math.exp(lo + (hi - lo) * u()))));
      } else if (name === "o_norm_w") {
        make(name, shapes[name], () => 1);
      } else {
        make(name, shapes[name], gaussian(name));
      }
    }
    return params;
  }

  /**
   * The parameter groups by name (11, or 14 with the short conv). The tensors are live: writing
   * to their `data` changes the layer.
   *
   * @returns A map from group name to its tensor.
   */
  parameters(): Map<string, Tensor> {
    return new Map(this.#params);
  }

  #checkInput(x: unknown, dims: unknown): [number, number] {
    if (!Array.isArray(dims) || dims.length !== 2) {
      throw new TypeError(`dims must be [B, T]: got ${JSON.stringify(dims)}`);
    }
    const B = checkPositiveInt("dims[0] (B)", dims[0]);
    const T = checkPositiveInt("dims[1] (T)", dims[1]);
    checkArray("x", x, B * T * this.config.dModel, this.dtype, "[B, T, D]");
    return [B, T];
  }

  async #run(
    x: Float64Array | Float32Array,
    [B, T]: [number, number],
    tape: Tape | undefined,
    options: KdaModuleRunOptions,
  ): Promise<{ y: Tensor; params: Map<string, Tensor> }> {
    const { dModel: D, heads: H, keyDim: K, valueDim: V, shortConv, minDecay, chunkSize } =
      this.config;
    const params = new Map<string, Tensor>();
    for (const [name, p] of this.#params) params.set(name, tape ? tape.variable(p) : p);
    const w = (name: string) => params.get(name)!;
    const rows = new Tensor(x, [B * T, D]);

    // q, k, v: projection, optional causal short conv, then SiLU
    const branch = (proj: string, conv: string, width: number) => {
      let u = linear(rows, w(proj));
      if (shortConv) {
        u = reshape(causalConv(reshape(u, [B, T, width]), w(conv)), [B * T, width]);
      }
      return silu(u);
    };
    // per-head L2 normalisation of q and k
    const perHead = (u: Tensor) => reshape(l2norm(reshape(u, [B * T * H, K])), [B, T, H, K]);
    const q = perHead(branch("q_proj.weight", "q_conv_w", H * K));
    const k = perHead(branch("k_proj.weight", "k_conv_w", H * K));
    const v = reshape(branch("v_proj.weight", "v_conv_w", H * V), [B, T, H, V]);

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

    const { o } = await dispatchKda({ q, k, v, g, beta }, { B, T, H, K, V, scale: K ** -0.5 }, {
      arm: options.arm,
      strict: options.strict,
      chunkSize,
      detachOutputs: options.detachKdaOutputs,
    });

    // y = RMSNorm_V(o) ⊙ o_norm_w ⊙ sigmoid(x W_gateᵀ), then the output projection
    const normed = reshape(rmsnorm(reshape(o, [B * T * H, V]), { eps: 1e-5 }), [B * T, H, V]);
    const gate = reshape(sigmoid(linear(rows, w("o_gate.weight"))), [B * T, H, V]);
    const gated = mul(mul(normed, w("o_norm_w")), gate);
    const y = reshape(linear(reshape(gated, [B * T, H * V]), w("o_proj.weight")), [B, T, D]);
    return { y, params };
  }

  /**
   * The layer's forward, without recording gradients.
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param options `arm`, `strict`.
   * @returns The output [B, T, D].
   */
  async forward(
    x: Float64Array | Float32Array,
    dims: [number, number],
    options: KdaModuleRunOptions = {},
  ): Promise<Float64Array | Float32Array> {
    const [B, T] = this.#checkInput(x, dims);
    return (await this.#run(x, [B, T], undefined, options)).y.data;
  }

  /**
   * Forward, then backward with cotangent `dy`: the output and the gradient of every group.
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param dy Cotangent of the output, [B, T, D].
   * @param options `arm`, `strict`, and the falsification switch `detachKdaOutputs`.
   * @returns The output `y` and `grads` keyed by group name (zeros for a group nothing reached).
   */
  async vjp(
    x: Float64Array | Float32Array,
    dims: [number, number],
    dy: Float64Array | Float32Array,
    options: KdaModuleRunOptions = {},
  ): Promise<{ y: Float64Array | Float32Array; grads: Map<string, Float64Array | Float32Array> }> {
    const [B, T] = this.#checkInput(x, dims);
    checkArray("dy", dy, B * T * this.config.dModel, this.dtype, "[B, T, D]");
    const tape = new Tape(this.dtype);
    try {
      const { y, params } = await this.#run(x, [B, T], tape, options);
      const byTensor = await tape.backward(y, dy);
      const grads = new Map<string, Float64Array | Float32Array>();
      for (const [name, p] of params) grads.set(name, byTensor.get(p) ?? alloc(this.dtype, p.size));
      return { y: y.data, grads };
    } finally {
      tape.dispose();
    }
  }
}
