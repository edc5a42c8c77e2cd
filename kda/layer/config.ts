// The layer's configuration, its defaults and its validation.

import type { ChunkSize } from "../_types.ts";
import { checkChunkSize } from "../op/_check.ts";
import { checkKnownKeys, checkObject, checkPositiveInt } from "../../base/check.ts";

/** Configuration of a {@linkcode KdaModule} layer (docs/kda.md 2.4). */
export interface KdaConfig {
  /** Model width D. */
  dModel: number;
  /** Number of heads H. */
  heads: number;
  /** Key dimension K per head. */
  keyDim: number;
  /** Value dimension V per head. */
  valueDim: number;
  /** Rank R of the low-rank decay path. */
  decayRank: number;
  /** Tokens per chunk of the chunked arms. */
  chunkSize: ChunkSize;
  /** Smallest per-token decay: every decay a = e^g lies in (minDecay, 1). */
  minDecay: number;
  /** Depthwise causal short convolution (width 4) on q, k and v. */
  shortConv: boolean;
  /** Seed of the initialisation. */
  seed: number;
}

/**
 * The trainer shape: D = 64, H = 2, K = V = 32, R = 16, chunk 16, minDecay 0.9, no short conv,
 * seed 0.
 *
 * @example Usage
 * ```ts
 * import { DEFAULT_CONFIG } from "@deltanet/kda";
 * DEFAULT_CONFIG.dModel; // 64
 * ```
 */
export const DEFAULT_CONFIG: Readonly<KdaConfig> = Object.freeze({
  dModel: 64,
  heads: 2,
  keyDim: 32,
  valueDim: 32,
  decayRank: 16,
  chunkSize: 16,
  minDecay: 0.9,
  shortConv: false,
  seed: 0,
});

/** Width of the short convolution. */
export const CONV_WIDTH = 4;

/**
 * Fills defaults and validates every field.
 *
 * @param config A partial configuration.
 * @returns A complete, frozen configuration.
 */
export function resolveConfig(config: Partial<KdaConfig> = {}): Readonly<KdaConfig> {
  checkObject("config", config);
  checkKnownKeys("config", config, Object.keys(DEFAULT_CONFIG));
  const c = { ...DEFAULT_CONFIG, ...config };
  checkPositiveInt("config.dModel", c.dModel);
  checkPositiveInt("config.heads", c.heads);
  checkPositiveInt("config.keyDim", c.keyDim);
  checkPositiveInt("config.valueDim", c.valueDim);
  checkPositiveInt("config.decayRank", c.decayRank);
  checkChunkSize("config.chunkSize", c.chunkSize);
  if (typeof c.minDecay !== "number" || !(c.minDecay > 0 && c.minDecay < 1)) {
    throw new RangeError(`config.minDecay must lie in (0, 1): got ${String(c.minDecay)}`);
  }
  if (typeof c.shortConv !== "boolean") {
    throw new TypeError(`config.shortConv must be a boolean: got ${typeof c.shortConv}`);
  }
  if (
    typeof c.seed !== "number" || !Number.isInteger(c.seed) || c.seed < 0 || c.seed > 0xffffffff
  ) {
    throw new RangeError(`config.seed must be an integer in [0, 2^32): got ${String(c.seed)}`);
  }
  return Object.freeze(c);
}
