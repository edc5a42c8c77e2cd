// What the package's kernel sets share in how they plan a call: the workgroup size, llvmpipe's
// loop budget and the scan's chunk ranges under it, the widest scan tile that fits the scans'
// register tiles, and the sizes of a chunk's C x K, C x V and C x C regions. Each set still
// declares its own values; these are the rules, written once.

import type { ChunkSize, KdaDims } from "../../_types.ts";
import type { Size } from "../layout.ts";

/** Invocations per workgroup of every kernel of the package's sets. */
export const WORKGROUP_SIZE = 256;

/**
 * llvmpipe ends an invocation, silently, after 65535 loop iterations counted over all its loops;
 * each scan dispatch covers only as many chunks as keep the busiest invocation under this. The
 * chunk-parallel kernels stay under it by construction (about 36,000 at K = V = 256, C = 64).
 */
export const LOOP_BUDGET = 60000;

/** One chunk's C x K, C x V and C x C regions. */
export const CK: Size = [[1, "C", "K"]];
/** One chunk's C x V region. */
export const CV: Size = [[1, "C", "V"]];
/** One chunk's C x C region. */
export const CC: Size = [[1, "C", "C"]];

/**
 * The scans' V tile: a power of two times 4, the widest up to `maxTile` whose K x VT state tile
 * and C x VT row tile fit the scans' register tiles (each invocation owns 4 state and 2 row vec4
 * entries), no wider than V needs; and how many tiles cover V.
 *
 * @param shape The call's K and V.
 * @param C The chunk size.
 * @param tiles The widest tile and the vec4 entries of the state and row tiles.
 * @returns `VT` and `nVT`.
 * @example
 * ```ts
 * scanTile({ B: 1, T: 64, H: 1, K: 128, V: 128 }, 64, { maxTile: 32, stateVec4: 1024, rowsVec4: 512 });
 * // { VT: 32, nVT: 4 }
 * ```
 */
export function scanTile(
  shape: KdaDims,
  C: ChunkSize,
  tiles: { maxTile: number; stateVec4: number; rowsVec4: number },
): { VT: number; nVT: number } {
  const { K, V } = shape;
  let VT = tiles.maxTile;
  while (
    VT > 4 && (K * VT > 4 * tiles.stateVec4 || C * VT > 4 * tiles.rowsVec4 || VT / 2 >= V)
  ) VT /= 2;
  return { VT, nVT: Math.ceil(V / VT) };
}

/**
 * The chunk ranges of successive scan dispatches: as many chunks each as keep an invocation that
 * loops `perChunk` times a chunk under {@linkcode LOOP_BUDGET}; half-open, ascending, covering
 * 0..NC (none when NC is 0).
 *
 * @param NC Chunks per sequence.
 * @param perChunk Loop iterations of the busiest invocation per chunk.
 * @returns The ranges.
 * @example
 * ```ts
 * chunkRanges(3, 30000); // [[0, 1], [1, 2], [2, 3]]
 * ```
 */
export function chunkRanges(NC: number, perChunk: number): [number, number][] {
  return evenRanges(NC, Math.floor((LOOP_BUDGET - 64) / perChunk));
}

/**
 * The chunk ranges of successive scan dispatches of `chunksPer` chunks each (at least one): as
 * {@linkcode chunkRanges}, with the count given.
 *
 * @param NC Chunks per sequence.
 * @param chunksPer Chunks a range.
 * @returns The ranges.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * assert.deepEqual(evenRanges(5, 2), [[0, 2], [2, 4], [4, 5]]);
 * ```
 */
export function evenRanges(NC: number, chunksPer: number): [number, number][] {
  const per = Math.max(1, Math.floor(chunksPer));
  const ranges: [number, number][] = [];
  for (let n0 = 0; n0 < NC; n0 += per) ranges.push([n0, Math.min(NC, n0 + per)]);
  return ranges;
}
