// The KDA layer of docs/kda.md 2.4: projections, optional short convolution, the low-rank decay
// path, the KDA op (through the seam), the gated RMSNorm and the output projection.

import {
  add,
  alloc,
  causalConv,
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
  Tape,
  Tensor,
} from "../tape/mod.ts";
import { type DispatchOptions, SEAM_HOOKS } from "../seam/seam.ts";
import type { Arm, DType, Float } from "./_types.ts";
import { CONV_WIDTH, type KdaConfig, resolveConfig } from "./config.ts";
import {
  checkFloatArray,
  checkKnownKeys,
  checkObject,
  checkOptionalBoolean,
  checkPositiveInt,
  typeName,
} from "./_check.ts";
import { runKda } from "./arms.ts";
import { mulberry32, normal, subSeed } from "./_random.ts";

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

/**
 * The proof's private run options: the falsification switch and planted defects. Not exported by
 * the package's entry point.
 */
export interface KdaModuleProofOptions extends KdaModuleRunOptions {
  /** Return the KDA op's outputs detached, so no group upstream of it gets a gradient. */
  detachKdaOutputs?: boolean;
  /** Planted defects of the seam. */
  [SEAM_HOOKS]?: DispatchOptions[typeof SEAM_HOOKS];
}

const RUN_KEYS = ["arm", "strict", "quiet", "checkParameters", "detachKdaOutputs"];

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
function initialDraw(init: ParameterInit, seed: number, name: string): () => number {
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
  readonly dtype: DType;
  readonly #params: Map<string, Tensor>;

  /**
   * Builds and initialises the layer.
   *
   * @param config Fields to override in {@linkcode DEFAULT_CONFIG}.
   * @param options `dtype`: "f64" (default) or "f32".
   */
  constructor(config: Partial<KdaConfig> = {}, options: { dtype?: DType } = {}) {
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

  #checkOptions(options: unknown): KdaModuleProofOptions {
    const o = checkObject("options", options) as KdaModuleProofOptions;
    checkKnownKeys("options", o, RUN_KEYS);
    checkOptionalBoolean("options.detachKdaOutputs", o.detachKdaOutputs);
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
    options: KdaModuleProofOptions,
  ): Promise<Tensor> {
    const { dModel: D, heads: H, keyDim: K, valueDim: V, shortConv, minDecay, chunkSize } =
      this.config;
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

    const { o } = await runKda({ q, k, v, g, beta }, {
      B,
      T,
      H,
      K,
      V,
      scale: K ** -0.5,
      chunkSize,
    }, {
      arm: options.arm,
      strict: options.strict,
      quiet: options.quiet,
      detachOutputs: options.detachKdaOutputs,
      ...(options[SEAM_HOOKS] ? { [SEAM_HOOKS]: options[SEAM_HOOKS] } : {}),
    });

    // y = RMSNorm_V(o) ⊙ o_norm_w ⊙ sigmoid(x W_gateᵀ), then the output projection
    const normed = reshape(rmsnorm(reshape(o, [B * T * H, V]), { eps: 1e-5 }), [B * T, H, V]);
    const gate = reshape(sigmoid(linear(rows, w("o_gate.weight"))), [B * T, H, V]);
    const gated = mul(mul(normed, w("o_norm_w")), gate);
    return reshape(linear(reshape(gated, [B * T, H * V]), w("o_proj.weight")), [B, T, D]);
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
    return (await this.#run(x, [B, T], this.#params, checked)).data as F;
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
      const params = new Map<string, Tensor>();
      for (const [name, p] of this.#params) params.set(name, tape.variable(p));
      const y = await this.#run(x, [B, T], params, checked);
      const byTensor = await tape.backward(y, dy);
      const grads = new Map<string, F>();
      for (const [name, p] of params) {
        grads.set(name, (byTensor.get(p) ?? alloc(this.dtype, p.size)) as F);
      }
      return { y: y.data as F, grads };
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
        }),
      primals,
      directions,
    );
    return { y: y.data as F, dy: dy as F };
  }
}
