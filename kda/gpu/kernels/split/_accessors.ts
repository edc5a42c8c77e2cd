// The split set's accessor table (mod.ts declares the set; this is what its kernels call to reach
// their bindings).

import type { AccessorDecl } from "../../accessors.ts";

/**
 * The generated accessors the split set's WGSL uses (kda/gpu/accessors.ts writes them): loads and
 * stores of the caller's arrays float by float, and of the package's per-chunk buffers through
 * vec4 views where a stage only reads them.
 */
export const SPLIT_ACCESSORS: readonly AccessorDecl[] = [
  // the caller's arrays, and the per-chunk buffers where a stage also writes them: float by float
  // (vec4 views of the caller's arrays beside them measured slower: bench/results/ANALYSIS.md)
  ["load", "q", "K"],
  ["load", "k", "K"],
  ["load", "g", "K"],
  ["load", "dout", "V"],
  ["load", "v", "V"],
  ["load", "work", "K"],
  ["load", "ht", "V"],
  ["load", "h0", "V"],
  ["load", "dht", "V"],
  ["load", "dh0", "V"],
  ["load", "dqh", "K"],
  ["load", "dkh", "K"],
  // the per-chunk buffers as the stages that only read them see them: vec4 views
  ...(["work4", "kd4", "qg4", "gates4", "tri4", "states4", "bw4", "gs4"] as const).map((view) =>
    ["element", view, "K"] as const
  ),
  ...(["qg4", "gates4", "tri4", "states4", "bw4", "gs4"] as const).map((view) =>
    ["gatherVec", view, "K"] as const
  ),
  ...(["work4", "kd4", "gates4", "states4", "bw4", "gs4"] as const).map((view) =>
    ["loadVec", view, "K"] as const
  ),
  // the scans' slab loads (forward.wgsl)
  ...(["work4", "kd4", "gates4"] as const).map((view) => ["loadVecIf", view, "K"] as const),
  ...(["u4", "states4", "bw4"] as const).map((view) => ["loadVec", view, "V"] as const),
  ["element", "u4", "V"],
  ["store", "states", "K"],
  ["storeTileTransposed", "states", "K"],
  ["storeTileTransposed", "bw", "K"],
  ["store", "states", "V"],
  ["store", "o", "V"],
  ["store", "ht", "V"],
  ["store", "dh0", "V"],
  ["store", "bw", "K"],
  ["store", "bw", "V"],
  ["store", "dv", "V"],
  ["store", "dq", "K"],
  ["store", "dk", "K"],
  ...(["bw4w", "dq4w", "dk4w", "dg4w", "dqh4w", "dkh4w"] as const).map((view) =>
    ["storeVec", view, "K"] as const
  ),
  ["store", "gates", "K"],
  ["store", "u", "K"],
  ["store", "glo", "K"],
  ["store", "qg", "K"],
  ["store", "kd", "K"],
  ["store", "work", "K"],
  ["gather", "q", "K"],
  ["gather", "k", "K"],
  ["gather", "v", "K"],
  ["gather", "beta", "K"],
  ["gather", "u", "K"],
  ["gather", "glo", "K"],
  ["gather", "dout", "K"],
  ["gather", "gs", "K"],
  ["storeRows", "work", "K"],
  ["storeRows", "u", "K"],
  ["storeRows", "gs", "K"],
  ["storeTriangle", "tri", "K"],
  ["storeTriangle", "gs", "K"],
];
