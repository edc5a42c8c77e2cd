// The layer's public surface (docs/kda.md 2.4, and the Kimi Linear form of 2.9): construction,
// the argument checks, the tapes of vjp/forwardBackward/forwardOnTape/jvp, and the state across
// calls. The forwards themselves are kda/layer/forward.ts and kda/layer/kimi.ts.

import { alloc, jvp, Tape, Tensor } from "../tape/mod.ts";
import type { Arm, Float } from "./_types.ts";
import {
  CONV_WIDTH,
  isKimi,
  type KdaConfig,
  type KimiConfigInput,
  type LayerConfig,
  resolveConfig,
} from "./layer/config.ts";
import { checkFloatArray, checkKernels } from "./op/_check.ts";
import {
  checkKnownKeys,
  checkObject,
  checkOptionalBoolean,
  checkPositiveInt,
  typeName,
} from "../base/check.ts";
import { initialDraw, layerGroups, scanParameters } from "./layer/parameters.ts";
import { type ForwardResult, kdaForward, type KdaModuleState } from "./layer/forward.ts";
import { kimiForward } from "./layer/kimi.ts";

export {
  KIMI_PARAMETER_TABLE,
  type LayerGroup,
  layerGroups,
  PARAMETER_TABLE,
  type ParameterInit,
  parameterNames,
  type ParameterSpec,
} from "./layer/parameters.ts";
export type { KdaModuleState } from "./layer/forward.ts";
import {
  checkStateDict,
  groupShapes,
  type StateDict,
  stateDict,
  type TensorDict,
} from "./layer/state_dict.ts";
import type { ComputeDType } from "../base/dtype.ts";

/**
 * The private construction path of a layer being loaded: parameter tensors already checked and
 * filled, so the constructor draws no random weights. Module-private: only fromStateDict has it.
 */
const LOADED = Symbol("loaded parameters");

/** The `dtype` of a layer's options: "f64" (default) or "f32". */
function checkDtypeOption(options: unknown): ComputeDType {
  const o = checkObject("options", options);
  checkKnownKeys("options", o, ["dtype"]);
  const dtype = o.dtype ?? "f64";
  if (dtype !== "f64" && dtype !== "f32") {
    throw new TypeError(`options.dtype must be "f64" or "f32": got ${String(dtype)}`);
  }
  return dtype;
}

/** Options of {@linkcode KdaModule.forward} and {@linkcode KdaModule.vjp}. */
export interface KdaModuleRunOptions {
  /** The arm that runs the KDA op. */
  arm?: Arm;
  /** Throw instead of declining to another arm. */
  strict?: boolean;
  /** No stderr warning when the KDA op declines (it is still counted and recorded). */
  quiet?: boolean;
  /**
   * The gpu arm's kernel set for the layer's KDA op (default `KDA_GPU_KERNELS`, else the arm's
   * rule: docs/kda.md 3.2); a decoding step runs the decode set whatever this says.
   */
  kernels?: string;
  /**
   * Scan every parameter for NaN and infinity before running (default true): one bad value would
   * turn every output into NaN. The scan also refuses a `decay.a_log` whose exp overflows the
   * layer's dtype (above about 709.78 in f64, 88.72 in f32), which would give NaN gradients. Set
   * false to skip the scan when the parameters are known good.
   */
  checkParameters?: boolean;
}

const RUN_KEYS = ["arm", "strict", "quiet", "kernels", "checkParameters"];

/** What {@linkcode KdaModule.forwardOnTape} returns. */
export interface KdaModuleTapeResult {
  /** The output [B, T, D], on the input's tape. */
  y: Tensor;
  /**
   * The parameter groups as variables of that tape, by group name (their values shared with the
   * layer's): `tape.backward` gives their gradients keyed by these tensors.
   */
  parameters: Map<string, Tensor>;
  /** The state after the last token. */
  state: KdaModuleState;
}

/**
 * The KDA layer: input `x` [B, T, D] to output [B, T, D], initialised reproducibly from
 * `config.seed`. The KDA form (docs/kda.md 2.4) has 11 parameter groups (14 with the short
 * convolution); `form: "kimi"` builds flash-linear-attention's `KimiDeltaAttention` with fla's
 * parameter names (docs/kda.md 2.9).
 *
 * @example Usage
 * ```ts
 * import { KdaModule } from "@deltanet/kda";
 * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
 * const x = new Float64Array(1 * 5 * 8).fill(0.1);
 * const y = await layer.forward(x, [1, 5], { arm: "cpu" });
 * ```
 *
 * @example A Kimi Linear layer with fla's names
 * ```ts
 * import { KdaModule } from "@deltanet/kda";
 * const kimi = new KdaModule({
 *   form: "kimi",
 *   dModel: 8,
 *   heads: 1,
 *   numVHeads: 2,
 *   keyDim: 4,
 *   valueDim: 4,
 * });
 * kimi.parameters().has("g_proj.1.bias"); // true
 * ```
 */
export class KdaModule {
  /** The resolved configuration. */
  readonly config: Readonly<LayerConfig>;
  /** The element type of the parameters and of every computation. */
  readonly dtype: ComputeDType;
  readonly #params: Map<string, Tensor>;

  /**
   * Builds and initialises the layer.
   *
   * @param config Fields to override in {@linkcode DEFAULT_CONFIG}, or `form: "kimi"` and fields
   *   to override in {@linkcode DEFAULT_KIMI_CONFIG}.
   * @param options `dtype`: "f64" (default) or "f32".
   */
  constructor(
    config: Partial<KdaConfig> | KimiConfigInput = {},
    options: { dtype?: ComputeDType } = {},
  ) {
    this.config = resolveConfig(config);
    this.dtype = checkDtypeOption(options);
    const loaded = (options as { [LOADED]?: Map<string, Tensor> })[LOADED];
    this.#params = loaded ?? this.#initialise();
  }

  #initialise(): Map<string, Tensor> {
    const params = new Map<string, Tensor>();
    for (const p of layerGroups(this.config)) {
      const n = p.shape.reduce((a, b) => a * b, 1);
      let data;
      try {
        data = alloc(this.dtype, n);
      } catch (error) {
        // a config of valid fields can still ask for more than the host can hold
        throw new RangeError(
          `config must give parameters that fit in memory: ${p.name} has shape ` +
            `[${p.shape.join(", ")}] (${n} elements of ${this.dtype}), and allocating it failed ` +
            `(${(error as Error).message})`,
        );
      }
      const draw = initialDraw(p.init, this.config.seed, p.name);
      for (let i = 0; i < data.length; i++) data[i] = draw();
      params.set(p.name, new Tensor(data, p.shape));
    }
    return params;
  }

  /**
   * Copies of the parameter groups by name, in table order (see kda/layer/state_dict.ts for saving
   * them as safetensors).
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
   * @param config The layer's config (its seed does not matter: no group is drawn at random).
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
    dict: TensorDict,
    config: Partial<KdaConfig> | KimiConfigInput = {},
    options: { dtype?: ComputeDType } = {},
  ): KdaModule {
    const resolved = resolveConfig(config);
    const dtype = checkDtypeOption(options);
    // Every tensor is checked against the shapes the config gives before anything is allocated,
    // and the layer is built from the checked values: no random weights are drawn.
    const shapes = groupShapes(resolved);
    const { sources } = checkStateDict(shapes, dtype, dict, true, resolved.shortConv);
    const params = new Map<string, Tensor>();
    for (const [name, shape] of shapes) {
      const source = sources.get(name)!;
      const data = alloc(dtype, source.length);
      data.set(source); // f64 values round to nearest into an f32 layer (checked to stay finite)
      params.set(name, new Tensor(data, shape));
    }
    return new KdaModule(resolved, { dtype, [LOADED]: params } as { dtype: ComputeDType });
  }

  /**
   * The parameter groups by name (11, or 14 with the short conv, in the KDA form; fla's groups in
   * the Kimi form). The tensors are live: writing to their `data` changes the layer.
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
    const kernels = checkKernels(o.kernels);
    if (checkOptionalBoolean("options.checkParameters", o.checkParameters) !== false) {
      scanParameters(this.#params, this.config, this.dtype);
    }
    return { ...o, ...(kernels !== undefined ? { kernels } : {}) };
  }

  /** The form's forward with the given input and parameter tensors (constants or on a tape). */
  #run(
    x: Tensor,
    [B, T]: [number, number],
    params: Map<string, Tensor>,
    options: KdaModuleRunOptions,
    state?: KdaModuleState,
    decode = false,
  ): Promise<ForwardResult> {
    const run = {
      x,
      B,
      T,
      params,
      state,
      dispatch: { arm: options.arm, strict: options.strict, quiet: options.quiet },
      ...(options.kernels !== undefined && !decode ? { kernels: options.kernels } : {}),
      decode,
    };
    return isKimi(this.config) ? kimiForward(this.config, run) : kdaForward(this.config, run);
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
    const input = new Tensor(x, [B, T, this.config.dModel]);
    return (await this.#run(input, [B, T], this.#params, checked)).y.data as F;
  }

  /**
   * Forward, then backward with cotangent `dy`: the output, the gradient of every group and the
   * gradient of the input.
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param dy Cotangent of the output, [B, T, D].
   * @param options `arm`, `strict`, `quiet`, `checkParameters`.
   * @returns The output `y`, `grads` keyed by group name (zeros for a group nothing reached) and
   *   `dx` [B, T, D], of the input's element type.
   *
   * @example The gradient of the input
   * ```ts
   * import { KdaModule } from "@deltanet/kda";
   * const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
   * const x = new Float64Array(1 * 5 * 8).map((_, i) => Math.sin(i));
   * const { dx } = await layer.vjp(x, [1, 5], x, { arm: "cpu" });
   * if (dx.length !== x.length) throw new Error("dx has the input's shape");
   * ```
   */
  async vjp<F extends Float>(
    x: F,
    dims: [number, number],
    dy: F,
    options: KdaModuleRunOptions = {},
  ): Promise<{ y: F; grads: Map<string, F>; dx: F }> {
    const [B, T] = this.#checkInput(x, dims);
    checkFloatArray("dy", dy, B * T * this.config.dModel, this.dtype, "[B, T, D]");
    const checked = this.#checkOptions(options);
    const tape = new Tape(this.dtype);
    try {
      const input = tape.variable(x, [B, T, this.config.dModel]);
      const params = this.#variables(tape);
      const { y } = await this.#run(input, [B, T], params, checked);
      const byTensor = await tape.backward(y, dy);
      return {
        y: y.data as F,
        grads: this.#gradients<F>(byTensor, params),
        dx: (byTensor.get(input) ?? alloc(this.dtype, x.length)) as F,
      };
    } finally {
      tape.dispose();
    }
  }

  /**
   * The layer's forward recorded on the tape of `x`, for models built of several layers on one
   * tape (an embedding, layers in sequence, residual sums, a head and a loss): the parameter groups
   * enter that tape as variables, and `tape.backward` of anything built on `y` reaches them and
   * everything upstream of `x`. Each call makes its own variables, so a layer applied twice on one
   * tape has two gradients to add.
   *
   * @param x Input [B, T, D] of the layer's dtype, on a tape (a variable, or built by tape ops on
   *   one).
   * @param options `state` (default: zeros), and `arm`, `strict`, `quiet`, `checkParameters`.
   * @returns `y` on the tape, the `parameters` as that tape's variables, and the final `state`.
   *
   * @example Two layers and a loss on one tape
   * ```ts
   * import { KdaModule } from "@deltanet/kda";
   * import { add, mul, reshape, sum, Tape } from "@deltanet/kda/tape";
   * const config = { dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 };
   * const first = new KdaModule({ ...config, seed: 1 });
   * const second = new KdaModule({ ...config, seed: 2 });
   * const tape = new Tape("f64");
   * const x = tape.variable(new Float64Array(1 * 5 * 8).map((_, i) => Math.sin(i)), [1, 5, 8]);
   * const h = add(x, (await first.forwardOnTape(x, { arm: "cpu" })).y); // a residual sum
   * const top = await second.forwardOnTape(h, { arm: "cpu" });
   * const flat = reshape(top.y, [top.y.size]);
   * const grads = await tape.backward(sum(mul(flat, flat), 0));
   * const dW = grads.get(top.parameters.get("o_proj.weight")!); // and grads.get(x), the input's
   * tape.dispose();
   * if (dW === undefined) throw new Error("the second layer's o_proj got a gradient");
   * ```
   */
  async forwardOnTape(
    x: Tensor,
    options: KdaModuleRunOptions & { state?: KdaModuleState } = {},
  ): Promise<KdaModuleTapeResult> {
    if (!(x instanceof Tensor)) {
      throw new TypeError(`x must be a Tensor [B, T, D] on a tape: got ${typeName(x)}`);
    }
    const D = this.config.dModel;
    if (x.shape.length !== 3 || x.shape[2] !== D || x.shape[0] < 1 || x.shape[1] < 1) {
      throw new RangeError(`x must have shape [B, T, ${D}]: got [${x.shape.join(", ")}]`);
    }
    if (x.tape === undefined) {
      throw new TypeError(
        "x must be on a tape (tape.variable(...) or a tape op's result): got a constant tensor",
      );
    }
    const [B, T] = this.#checkInput(x.data, [x.shape[0], x.shape[1]]);
    const { state, ...rest } = checkObject("options", options) as typeof options;
    const initial = this.#checkState(state, B);
    const checked = this.#checkOptions(rest);
    const params = this.#variables(x.tape);
    const out = await this.#run(x, [B, T], params, checked, initial);
    return { y: out.y, parameters: params, state: out.state };
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

  /** The state's shapes under this config: the KDA state, and each conv cache (or none). */
  #stateShapes(
    B: number,
  ): { kda: [number, string]; conv?: Record<"q" | "k" | "v", [number, string]> } {
    const c = this.config;
    if (isKimi(c)) {
      const { heads: H, numVHeads: HV, keyDim: K, valueDim: V, convSize: W } = c;
      return {
        kda: [B * HV * K * V, c.stateVFirst ? "[B, HV, V, K]" : "[B, HV, K, V]"],
        ...(c.shortConv
          ? {
            conv: {
              q: [B * H * K * W, "[B, H·K, W]"],
              k: [B * H * K * W, "[B, H·K, W]"],
              v: [B * HV * V * W, "[B, HV·V, W]"],
            },
          }
          : {}),
      };
    }
    const { heads: H, keyDim: K, valueDim: V } = c;
    const W1 = CONV_WIDTH - 1;
    return {
      kda: [B * H * K * V, "[B, H, K, V]"],
      ...(c.shortConv
        ? {
          conv: {
            q: [B * W1 * H * K, "[B, 3, H·K]"],
            k: [B * W1 * H * K, "[B, 3, H·K]"],
            v: [B * W1 * H * V, "[B, 3, H·V]"],
          },
        }
        : {}),
    };
  }

  #checkState(state: unknown, B: number): KdaModuleState | undefined {
    if (state === undefined) return undefined;
    const st = checkObject("options.state", state);
    checkKnownKeys("options.state", st, ["kda", "conv"]);
    const shapes = this.#stateShapes(B);
    checkFloatArray("options.state.kda", st.kda, shapes.kda[0], this.dtype, shapes.kda[1]);
    if (shapes.conv === undefined) {
      if (st.conv !== undefined) {
        throw new TypeError(
          "options.state.conv must be absent without the short conv: got a cache",
        );
      }
      return { kda: st.kda };
    }
    const conv = checkObject("options.state.conv", st.conv);
    checkKnownKeys("options.state.conv", conv, ["q", "k", "v"]);
    for (const s of ["q", "k", "v"] as const) {
      const [n, text] = shapes.conv[s];
      checkFloatArray(`options.state.conv.${s}`, conv[s], n, this.dtype, text);
    }
    return {
      kda: st.kda,
      conv: { q: conv.q as Float, k: conv.k as Float, v: conv.v as Float },
    };
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
    const input = new Tensor(x, [B, T, this.config.dModel]);
    const out = await this.#run(input, [B, T], this.#params, checked, initial);
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
    const typed = this.dtype === "f64" ? x instanceof Float64Array : x instanceof Float32Array;
    if (!typed || x.length === 0 || x.length % (T * D) !== 0) {
      // the wrong kind of array is a TypeError, the wrong length a RangeError
      throw new (typed ? RangeError : TypeError)(
        `x must be a ${this.dtype === "f64" ? "Float64Array" : "Float32Array"} of ${shape}: got ${
          typeName(x)
        }${"length" in Object(x) ? ` of ${(x as F).length}` : ""}`,
      );
    }
    const B = x.length / (T * D);
    this.#checkInput(x, [B, T]);
    const initial = this.#checkState(state, B);
    const checked = this.#checkOptions(rest);
    const input = new Tensor(x, [B, T, D]);
    const out = await this.#run(input, [B, T], this.#params, checked, initial, true);
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
   * @returns The output, the loss, the gradient of every group and the gradient `dx` of the input.
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
  ): Promise<{ y: F; loss: number; grads: Map<string, F>; dx: F }> {
    const [B, T] = this.#checkInput(x, dims);
    if (typeof lossFn !== "function") {
      throw new TypeError(
        `lossFn must be a function of the output tensor: got ${typeName(lossFn)}`,
      );
    }
    const checked = this.#checkOptions(options);
    const tape = new Tape(this.dtype);
    try {
      const input = tape.variable(x, [B, T, this.config.dModel]);
      const params = this.#variables(tape);
      const { y } = await this.#run(input, [B, T], params, checked);
      const loss = await lossFn(y);
      if (!(loss instanceof Tensor) || loss.size !== 1 || loss.tape !== tape) {
        throw new TypeError(
          "lossFn must return a one-element tensor built from tape ops on its argument: got " +
            (loss instanceof Tensor
              ? `${loss.size} elements${loss.tape === tape ? "" : " off the tape"}`
              : typeName(loss)),
        );
      }
      const byTensor = await tape.backward(loss);
      const grads = this.#gradients<F>(byTensor, params);
      const dx = (byTensor.get(input) ?? alloc(this.dtype, x.length)) as F;
      return { y: y.data as F, loss: loss.data[0], grads, dx };
    } finally {
      tape.dispose();
    }
  }

  /**
   * Forward mode: the output and its exact directional derivative along tangents of some groups
   * and of the input (the key `x`; groups and an input left out have a zero tangent). Runs on the
   * `ops` arm, the one built from tape ops that all have forward-mode rules, so the result has no
   * step and no resolution floor.
   *
   * @param x Input [B, T, D], of the layer's dtype.
   * @param dims `[B, T]`.
   * @param tangents A direction per group name, each of that group's size, and optionally one for
   *   the input under the key `x` ([B, T, D]).
   * @returns The output `y` and its tangent `dy`, both [B, T, D].
   *
   * @example Usage
   * ```ts
   * import { KdaModule } from "@deltanet/kda";
   * const layer = new KdaModule({ dModel: 4, heads: 1, keyDim: 2, valueDim: 2, decayRank: 1 });
   * const x = new Float64Array(1 * 3 * 4).fill(0.1);
   * const u = new Map([["o_norm_w", new Float64Array(2).fill(1)], ["x", x.map(() => 1)]]);
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
        `tangents must be a Map of group name (or x) to array: got ${typeName(tangents)}`,
      );
    }
    for (const [name, u] of tangents) {
      if (name === "x") {
        checkFloatArray("tangents x", u, x.length, this.dtype, "[B, T, D]");
        continue;
      }
      const p = this.#params.get(name);
      if (p === undefined) {
        throw new RangeError(
          `tangents has no group ${name}: expected x or one of ${
            [...this.#params.keys()].join(", ")
          }`,
        );
      }
      checkFloatArray(`tangents ${name}`, u, p.size, this.dtype, `[${p.shape.join(", ")}]`);
    }
    this.#checkOptions({});
    const names = [...this.#params.keys()];
    const primals = [
      new Tensor(x, [B, T, this.config.dModel]),
      ...names.map((n) => this.#params.get(n)!),
    ];
    const directions = [
      tangents.get("x") ?? alloc(this.dtype, x.length),
      ...names.map((n) => tangents.get(n) ?? alloc(this.dtype, this.#params.get(n)!.size)),
    ];
    const { outputs: [y], tangents: [dy] } = await jvp(
      (input: Tensor, ...ps: Tensor[]) =>
        this.#run(input, [B, T], new Map(names.map((n, i) => [n, ps[i]])), {
          arm: "ops",
          strict: true,
        }).then((r) => r.y),
      primals,
      directions,
    );
    return { y: y.data as F, dy: dy as F };
  }
}
