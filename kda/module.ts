// The KDA layer of docs/kda.md 2.4: projections, optional short convolution, the low-rank decay
// path, the KDA op (through the seam), the gated RMSNorm and the output projection.

import {
  add,
  alloc,
  causalConv,
  concat,
  exp,
  jvp,
  l2norm,
  linear,
  mul,
  reshape,
  rmsnorm,
  scale,
  sigmoid,
  silu,
  slice,
  Tape,
  Tensor,
} from "../tape/mod.ts";
import type { Arm, Float } from "./_types.ts";
import { CONV_WIDTH, type KdaConfig, resolveConfig } from "./layer/config.ts";
import { checkFloatArray } from "./op/_check.ts";
import {
  checkKnownKeys,
  checkObject,
  checkOptionalBoolean,
  checkPositiveInt,
  typeName,
} from "../base/check.ts";
import { runKda } from "./op/arms.ts";
import { initialDraw, PARAMETER_TABLE } from "./layer/parameters.ts";

export {
  PARAMETER_TABLE,
  type ParameterInit,
  parameterNames,
  type ParameterSpec,
} from "./layer/parameters.ts";
import { loadStateDict, type ShapedArray, type StateDict, stateDict } from "./layer/state_dict.ts";
import { type ComputeDType, computeDtypeOf } from "../base/dtype.ts";

/** Options of {@linkcode KdaModule.forward} and {@linkcode KdaModule.vjp}. */
export interface KdaModuleRunOptions {
  /** The arm that runs the KDA op. */
  arm?: Arm;
  /** Throw instead of declining to another arm. */
  strict?: boolean;
  /** No stderr warning when the KDA op declines (it is still counted and recorded). */
  quiet?: boolean;
  /**
   * Scan every parameter for NaN and infinity before running (default true): one bad value would
   * turn every output into NaN. Set false to skip the scan when the parameters are known good.
   */
  checkParameters?: boolean;
}

const RUN_KEYS = ["arm", "strict", "quiet", "checkParameters"];

/**
 * What a layer carries from one segment of a sequence to the next: the KDA state and, with the
 * short convolution, its cache. Run a long input in segments by passing each call's final state to
 * the next; the result equals running it whole.
 */
export interface KdaModuleState<F extends Float = Float> {
  /** The KDA state after the last token, [B, H, K, V]. */
  kda: F;
  /**
   * With the short convolution: the last CONV_WIDTH − 1 projected inputs of q, k and v before the
   * convolution, oldest first, [B, 3, H·K] for q and k and [B, 3, H·V] for v.
   */
  conv?: { q: F; k: F; v: F };
}

/** The last `n` rows of each batch entry of a [B, rows, width] array, zero-filled in front. */
function lastRows(data: Float, B: number, rows: number, width: number, n: number): Float {
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
  readonly dtype: ComputeDType;
  readonly #params: Map<string, Tensor>;

  /**
   * Builds and initialises the layer.
   *
   * @param config Fields to override in {@linkcode DEFAULT_CONFIG}.
   * @param options `dtype`: "f64" (default) or "f32".
   */
  constructor(config: Partial<KdaConfig> = {}, options: { dtype?: ComputeDType } = {}) {
    this.config = resolveConfig(config);
    checkKnownKeys("options", checkObject("options", options), ["dtype"]);
    const dtype = options.dtype ?? "f64";
    if (dtype !== "f64" && dtype !== "f32") {
      throw new TypeError(`options.dtype must be "f64" or "f32": got ${String(dtype)}`);
    }
    this.dtype = dtype;
    this.#params = this.#initialise();
  }

  #initialise(): Map<string, Tensor> {
    const params = new Map<string, Tensor>();
    for (const p of PARAMETER_TABLE) {
      if (p.conv && !this.config.shortConv) continue;
      const shape = p.shape(this.config);
      const data = alloc(this.dtype, shape.reduce((a, b) => a * b, 1));
      const draw = initialDraw(p.init, this.config.seed, p.name);
      for (let i = 0; i < data.length; i++) data[i] = draw();
      params.set(p.name, new Tensor(data, shape));
    }
    return params;
  }

  /**
   * Copies of the parameter groups by name, in table order (see kda/state_dict.ts for saving them
   * as safetensors).
   *
   * @returns A new map from group name to a copy of its values.
   *
   * @example Usage
   * ```ts
   * import { KdaModule } from "@deltanet/kda";
   * const dict = new KdaModule().stateDict();
   * dict.size; // 11
   * ```
   */
  stateDict(): StateDict {
    return stateDict(this);
  }

  /**
   * A layer of the given config with every group loaded from `dict` (strictly: an unknown, missing
   * or wrongly shaped tensor is a named error and nothing is loaded).
   *
   * @param dict Group name to values (bare arrays, or `{ data, shape }` as `readSafetensors` gives).
   * @param config The layer's config (its seed does not matter: every group is overwritten).
   * @param options `dtype` of the new layer.
   * @returns The layer.
   *
   * @example Usage
   * ```ts
   * import { KdaModule } from "@deltanet/kda";
   * const layer = new KdaModule({ seed: 3 });
   * const copy = KdaModule.fromStateDict(layer.stateDict(), { seed: 3 });
   * ```
   */
  static fromStateDict(
    dict: Map<string, Float | ShapedArray> | Record<string, Float | ShapedArray>,
    config: Partial<KdaConfig> = {},
    options: { dtype?: ComputeDType } = {},
  ): KdaModule {
    const layer = new KdaModule(config, options);
    loadStateDict(layer, dict, { strict: true });
    return layer;
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
      throw new TypeError(
        `dims must be [B, T]: got ${Array.isArray(dims) ? JSON.stringify(dims) : typeName(dims)}`,
      );
    }
    const B = checkPositiveInt("dims[0] (B)", dims[0]);
    const T = checkPositiveInt("dims[1] (T)", dims[1]);
    checkFloatArray("x", x, B * T * this.config.dModel, this.dtype, "[B, T, D]");
    return [B, T];
  }

  #checkOptions(options: unknown): KdaModuleRunOptions {
    const o = checkObject("options", options) as KdaModuleRunOptions;
    checkKnownKeys("options", o, RUN_KEYS);
    if (checkOptionalBoolean("options.checkParameters", o.checkParameters) !== false) {
      for (const [name, p] of this.#params) {
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
    }
    return o;
  }

  /** The forward of docs/kda.md 2.4 with the given parameter tensors (constants or on a tape). */
  async #run(
    x: Float64Array | Float32Array,
    [B, T]: [number, number],
    params: Map<string, Tensor>,
    options: KdaModuleRunOptions,
    state?: KdaModuleState,
    decode = false,
  ): Promise<{ y: Tensor; state: KdaModuleState }> {
    const { dModel: D, heads: H, keyDim: K, valueDim: V, shortConv, minDecay, chunkSize } =
      this.config;
    const w = (name: string) => params.get(name)!;
    const rows = new Tensor(x, [B * T, D]);

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
    const { o, ht } = await runKda({ q, k, v, g, beta, h0 }, {
      B,
      T,
      H,
      K,
      V,
      scale: K ** -0.5,
      chunkSize,
      // a decode call runs the plain recurrence (kdaStep's path, docs/kda.md 2.7)
      ...(decode ? { step: true } : {}),
    }, {
      arm: options.arm,
      strict: options.strict,
      quiet: options.quiet,
    });

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

  /**
   * The layer's forward, without recording gradients.
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param options `arm`, `strict`, `quiet`, `checkParameters`.
   * @returns The output [B, T, D], of the input's element type.
   */
  async forward<F extends Float>(
    x: F,
    dims: [number, number],
    options: KdaModuleRunOptions = {},
  ): Promise<F> {
    const [B, T] = this.#checkInput(x, dims);
    const checked = this.#checkOptions(options);
    return (await this.#run(x, [B, T], this.#params, checked)).y.data as F;
  }

  /**
   * Forward, then backward with cotangent `dy`: the output and the gradient of every group.
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param dy Cotangent of the output, [B, T, D].
   * @param options `arm`, `strict`, `quiet`, `checkParameters`.
   * @returns The output `y` and `grads` keyed by group name (zeros for a group nothing reached),
   *   of the input's element type.
   */
  async vjp<F extends Float>(
    x: F,
    dims: [number, number],
    dy: F,
    options: KdaModuleRunOptions = {},
  ): Promise<{ y: F; grads: Map<string, F> }> {
    const [B, T] = this.#checkInput(x, dims);
    checkFloatArray("dy", dy, B * T * this.config.dModel, this.dtype, "[B, T, D]");
    const checked = this.#checkOptions(options);
    const tape = new Tape(this.dtype);
    try {
      const params = this.#variables(tape);
      const { y } = await this.#run(x, [B, T], params, checked);
      return { y: y.data as F, grads: this.#gradients<F>(await tape.backward(y, dy), params) };
    } finally {
      tape.dispose();
    }
  }

  /** The parameter groups as variables on `tape`. */
  #variables(tape: Tape): Map<string, Tensor> {
    const params = new Map<string, Tensor>();
    for (const [name, p] of this.#params) params.set(name, tape.variable(p));
    return params;
  }

  /** Each group's gradient (zeros for a group nothing reached). */
  #gradients<F extends Float>(
    byTensor: Map<Tensor, Float>,
    params: Map<string, Tensor>,
  ): Map<string, F> {
    const grads = new Map<string, F>();
    for (const [name, p] of params) {
      grads.set(name, (byTensor.get(p) ?? alloc(this.dtype, p.size)) as F);
    }
    return grads;
  }

  #checkState(state: unknown, B: number): KdaModuleState | undefined {
    if (state === undefined) return undefined;
    const st = checkObject("options.state", state);
    checkKnownKeys("options.state", st, ["kda", "conv"]);
    const { heads: H, keyDim: K, valueDim: V, shortConv } = this.config;
    checkFloatArray("options.state.kda", st.kda, B * H * K * V, this.dtype, "[B, H, K, V]");
    if (!shortConv) {
      if (st.conv !== undefined) {
        throw new TypeError(
          "options.state.conv must be absent without the short conv: got a cache",
        );
      }
      return { kda: st.kda };
    }
    const conv = checkObject("options.state.conv", st.conv);
    checkKnownKeys("options.state.conv", conv, ["q", "k", "v"]);
    const W1 = CONV_WIDTH - 1;
    checkFloatArray("options.state.conv.q", conv.q, B * W1 * H * K, this.dtype, "[B, 3, H·K]");
    checkFloatArray("options.state.conv.k", conv.k, B * W1 * H * K, this.dtype, "[B, 3, H·K]");
    checkFloatArray("options.state.conv.v", conv.v, B * W1 * H * V, this.dtype, "[B, 3, H·V]");
    return { kda: st.kda, conv: { q: conv.q, k: conv.k, v: conv.v } };
  }

  /**
   * The forward from a given state, returning the final state as well, so a long input can run in
   * segments (each call's state feeds the next; the result equals running it whole).
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param options `state` (default: zeros, i.e. the start of a sequence), and `arm`, `strict`,
   *   `quiet`, `checkParameters`.
   * @returns The output [B, T, D] and the state after its last token.
   *
   * @example Two segments equal one run
   * ```ts
   * import { KdaModule } from "@deltanet/kda";
   * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
   * const x = new Float64Array(1 * 6 * 8).map((_, i) => Math.sin(i));
   * const first = await layer.forwardWithState(x.subarray(0, 24), [1, 3], { arm: "cpu" });
   * const second = await layer.forwardWithState(x.subarray(24), [1, 3], {
   *   arm: "cpu",
   *   state: first.state,
   * });
   * ```
   */
  async forwardWithState<F extends Float>(
    x: F,
    dims: [number, number],
    options: KdaModuleRunOptions & { state?: KdaModuleState<F> } = {},
  ): Promise<{ y: F; state: KdaModuleState<F> }> {
    const [B, T] = this.#checkInput(x, dims);
    const { state, ...rest } = checkObject("options", options) as typeof options;
    const initial = this.#checkState(state, B);
    const checked = this.#checkOptions(rest);
    const out = await this.#run(x, [B, T], this.#params, checked, initial);
    return { y: out.y.data as F, state: out.state as KdaModuleState<F> };
  }

  /**
   * Decodes through the whole layer from `state`: one token per sequence, or `options.tokens`
   * tokens per sequence at once. The KDA op runs as a decode call (docs/kda.md 2.7: the plain
   * recurrence, the gpu arm's decode kernel set); the result equals the forward of the same
   * tokens from that state.
   *
   * @param x The tokens [B, D] (one per sequence), or [B, T, D] with `options.tokens` = T, of
   *   the layer's dtype.
   * @param state The state after the previous token; omit it for the first token.
   * @param options `tokens` (T, default 1), and `arm`, `strict`, `quiet`, `checkParameters`.
   * @returns The outputs [B, D] (or [B, T, D]) and the state after the last token.
   *
   * @example A generation loop
   * ```ts
   * import { KdaModule, type KdaModuleState } from "@deltanet/kda";
   * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
   * let state: KdaModuleState<Float64Array> | undefined;
   * let token: Float64Array = new Float64Array(3 * 8).fill(0.1); // a prompt of 3 tokens, at once
   * for (let t = 0; t < 4; t++) {
   *   const out = await layer.step(token, state, { arm: "cpu", tokens: t === 0 ? 3 : 1 });
   *   state = out.state;
   *   token = out.y.slice(out.y.length - 8); // the last output fed back in, as a toy generator would
   * }
   * ```
   */
  async step<F extends Float>(
    x: F,
    state?: KdaModuleState<F>,
    options: KdaModuleRunOptions & { tokens?: number } = {},
  ): Promise<{ y: F; state: KdaModuleState<F> }> {
    const D = this.config.dModel;
    const { tokens, ...rest } = checkObject("options", options) as typeof options;
    const T = tokens === undefined ? 1 : checkPositiveInt("options.tokens", tokens);
    const shape = T === 1 ? `B·${D} elements [B, D]` : `B·${T}·${D} elements [B, T, D]`;
    if (
      !(x instanceof Float64Array || x instanceof Float32Array) || x.length === 0 ||
      x.length % (T * D) !== 0
    ) {
      throw new RangeError(
        `x must be a ${this.dtype === "f64" ? "Float64Array" : "Float32Array"} of ${shape}: got ${
          typeName(x)
        }${"length" in Object(x) ? ` of ${(x as F).length}` : ""}`,
      );
    }
    const B = x.length / (T * D);
    this.#checkInput(x, [B, T]);
    const initial = this.#checkState(state, B);
    const checked = this.#checkOptions(rest);
    const out = await this.#run(x, [B, T], this.#params, checked, initial, true);
    return { y: out.y.data as F, state: out.state as KdaModuleState<F> };
  }

  /**
   * One forward and one backward of a loss built on the layer's output, with no second forward:
   * `lossFn` receives the output as a tensor on the layer's tape and returns a one-element tensor
   * built from tape ops on it.
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param lossFn The loss of the output.
   * @param options `arm`, `strict`, `quiet`, `checkParameters`.
   * @returns The output, the loss and the gradient of every group.
   *
   * @example Mean squared output
   * ```ts
   * import { KdaModule } from "@deltanet/kda";
   * import { mul, reshape, scale, sum } from "@deltanet/kda/tape";
   * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
   * const x = new Float64Array(1 * 5 * 8).map((_, i) => Math.cos(i));
   * const { loss, grads } = await layer.forwardBackward(x, [1, 5], (y) => {
   *   const flat = reshape(y, [y.size]);
   *   return scale(sum(mul(flat, flat), 0), 1 / y.size);
   * }, { arm: "cpu" });
   * ```
   */
  async forwardBackward<F extends Float>(
    x: F,
    dims: [number, number],
    lossFn: (y: Tensor) => Tensor | Promise<Tensor>,
    options: KdaModuleRunOptions = {},
  ): Promise<{ y: F; loss: number; grads: Map<string, F> }> {
    const [B, T] = this.#checkInput(x, dims);
    if (typeof lossFn !== "function") {
      throw new TypeError(
        `lossFn must be a function of the output tensor: got ${typeName(lossFn)}`,
      );
    }
    const checked = this.#checkOptions(options);
    const tape = new Tape(this.dtype);
    try {
      const params = this.#variables(tape);
      const { y } = await this.#run(x, [B, T], params, checked);
      const loss = await lossFn(y);
      if (!(loss instanceof Tensor) || loss.size !== 1 || loss.tape !== tape) {
        throw new TypeError(
          "lossFn must return a one-element tensor built from tape ops on its argument: got " +
            (loss instanceof Tensor
              ? `${loss.size} elements${loss.tape === tape ? "" : " off the tape"}`
              : typeName(loss)),
        );
      }
      const grads = this.#gradients<F>(await tape.backward(loss), params);
      return { y: y.data as F, loss: loss.data[0], grads };
    } finally {
      tape.dispose();
    }
  }

  /**
   * Forward mode: the output and its exact directional derivative along tangents of some groups
   * (groups left out have a zero tangent). Runs on the `ops` arm, the one built from tape ops that
   * all have forward-mode rules, so the result has no step and no resolution floor.
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param tangents A direction per group name, each of that group's size.
   * @returns The output `y` and its tangent `dy`, both [B, T, D].
   *
   * @example Usage
   * ```ts
   * import { KdaModule } from "@deltanet/kda";
   * const layer = new KdaModule({ dModel: 4, heads: 1, keyDim: 2, valueDim: 2, decayRank: 1 });
   * const x = new Float64Array(1 * 3 * 4).fill(0.1);
   * const u = new Map([["o_norm_w", new Float64Array(2).fill(1)]]);
   * const { dy } = await layer.jvp(x, [1, 3], u);
   * ```
   */
  async jvp<F extends Float>(
    x: F,
    dims: [number, number],
    tangents: Map<string, F>,
  ): Promise<{ y: F; dy: F }> {
    const [B, T] = this.#checkInput(x, dims);
    if (!(tangents instanceof Map)) {
      throw new TypeError(
        `tangents must be a Map of group name to array: got ${typeName(tangents)}`,
      );
    }
    for (const [name, u] of tangents) {
      const p = this.#params.get(name);
      if (p === undefined) {
        throw new RangeError(
          `tangents has no group ${name}: expected one of ${[...this.#params.keys()].join(", ")}`,
        );
      }
      checkFloatArray(`tangents ${name}`, u, p.size, this.dtype, `[${p.shape.join(", ")}]`);
    }
    this.#checkOptions({});
    const names = [...this.#params.keys()];
    const primals = names.map((n) => this.#params.get(n)!);
    const directions = names.map((n) =>
      tangents.get(n) ?? alloc(this.dtype, this.#params.get(n)!.size)
    );
    const { outputs: [y], tangents: [dy] } = await jvp(
      (...ps: Tensor[]) =>
        this.#run(x, [B, T], new Map(names.map((n, i) => [n, ps[i]])), {
          arm: "ops",
          strict: true,
        }).then((r) => r.y),
      primals,
      directions,
    );
    return { y: y.data as F, dy: dy as F };
  }
}
