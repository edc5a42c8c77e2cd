// Packed variable-length batches (docs/kda.md 2.6): the sequence table every arm walks, and the gpu
// arm's host-side padding of a packed batch into a regular [N, Tmax] one and back.

import type { Float, KdaProblem } from "../_types.ts";

/**
 * The sequences of one call on the flattened [B·T] token axis: sequence i covers tokens
 * `start[i] .. start[i] + length[i] − 1`, and its chunk-start states begin at chunk `chunk0[i]`
 * of the saved `[ΣNCᵢ, H, K, V]`-ordered states (docs/kda.md 2.6).
 */
export interface Sequences {
  /** How many sequences (B for a regular batch, cuSeqlens.length − 1 for a packed one). */
  N: number;
  /** First token of each sequence on the flattened [B·T] token axis. */
  start: number[];
  /** Tokens of each sequence. */
  length: number[];
  /** Index of each sequence's first chunk among all chunks of the call. */
  chunk0: number[];
  /** Chunks of the whole call, Σ ceil(length[i] / C). */
  chunks: number;
}

/**
 * The sequence table of a problem: a regular batch is the special case `start = b·T` of a packed
 * one, so one loop serves both and a packed batch computes exactly what its sequences compute
 * one by one.
 *
 * @param x The problem (B, T and optionally cuSeqlens).
 * @param C The chunk size.
 * @returns The table.
 *
 * @example A packed batch of lengths 3 and 20 with chunks of 16
 * ```ts
 * import { sequencesOf } from "./varlen.ts";
 * const s = sequencesOf({ B: 1, T: 23, cuSeqlens: new Int32Array([0, 3, 23]) }, 16);
 * console.log(s.chunk0, s.chunks); // [0, 1] 3
 * ```
 */
export function sequencesOf(
  x: Pick<KdaProblem, "B" | "T" | "cuSeqlens">,
  C: number,
): Sequences {
  const start: number[] = [], length: number[] = [], chunk0: number[] = [];
  let chunks = 0;
  const push = (s: number, n: number) => {
    start.push(s);
    length.push(n);
    chunk0.push(chunks);
    chunks += Math.ceil(n / C);
  };
  const cu = x.cuSeqlens;
  if (cu === undefined) { for (let b = 0; b < x.B; b++) push(b * x.T, x.T); }
  else for (let i = 0; i + 1 < cu.length; i++) push(cu[i], cu[i + 1] - cu[i]);
  return { N: start.length, start, length, chunk0, chunks };
}

/**
 * The longest sequence of a packed batch: the padded length Tmax of {@linkcode padProblem}.
 *
 * @param cuSeqlens The sequence offsets.
 * @returns max over i of cuSeqlens[i + 1] − cuSeqlens[i].
 *
 * @example
 * ```ts
 * import { longestSequence } from "./varlen.ts";
 * longestSequence(new Int32Array([0, 3, 23])); // 20
 * ```
 */
export function longestSequence(cuSeqlens: Int32Array): number {
  let most = 0;
  for (let i = 0; i + 1 < cuSeqlens.length; i++) {
    most = Math.max(most, cuSeqlens[i + 1] - cuSeqlens[i]);
  }
  return most;
}

/**
 * Copies the rows of a packed `[1, T, H, width]` array into a zeroed `[N, Tmax, H, width]` one,
 * each sequence at the start of its own batch row (the pad rows at the end stay 0).
 *
 * @param packed The packed array.
 * @param cuSeqlens The sequence offsets.
 * @param Tmax Rows per padded sequence.
 * @param rowWidth Elements per token (H·K, H·V or H).
 * @returns The padded array, of the type of `packed`.
 *
 * @example
 * ```ts
 * import { padRows } from "./varlen.ts";
 * padRows(new Float32Array([1, 2, 3]), new Int32Array([0, 1, 3]), 2, 1); // [1, 0, 2, 3]
 * ```
 */
export function padRows(
  packed: Float,
  cuSeqlens: Int32Array,
  Tmax: number,
  rowWidth: number,
): Float {
  const N = cuSeqlens.length - 1;
  const out = packed instanceof Float32Array
    ? new Float32Array(N * Tmax * rowWidth)
    : new Float64Array(N * Tmax * rowWidth);
  for (let i = 0; i < N; i++) {
    out.set(
      packed.subarray(cuSeqlens[i] * rowWidth, cuSeqlens[i + 1] * rowWidth),
      i * Tmax * rowWidth,
    );
  }
  return out;
}

/**
 * The inverse of {@linkcode padRows}: the real rows of a padded `[N, Tmax, H, width]` array,
 * packed back into `[1, T, H, width]`.
 *
 * @param padded The padded array.
 * @param cuSeqlens The sequence offsets.
 * @param Tmax Rows per padded sequence.
 * @param rowWidth Elements per token.
 * @returns The packed array, of the type of `padded`.
 *
 * @example
 * ```ts
 * import { unpadRows } from "./varlen.ts";
 * unpadRows(new Float32Array([1, 0, 2, 3]), new Int32Array([0, 1, 3]), 2, 1); // [1, 2, 3]
 * ```
 */
export function unpadRows(
  padded: Float,
  cuSeqlens: Int32Array,
  Tmax: number,
  rowWidth: number,
): Float {
  const N = cuSeqlens.length - 1;
  const T = cuSeqlens[N];
  const out = padded instanceof Float32Array
    ? new Float32Array(T * rowWidth)
    : new Float64Array(T * rowWidth);
  for (let i = 0; i < N; i++) {
    const n = cuSeqlens[i + 1] - cuSeqlens[i];
    out.set(
      padded.subarray(i * Tmax * rowWidth, (i * Tmax + n) * rowWidth),
      cuSeqlens[i] * rowWidth,
    );
  }
  return out;
}

/**
 * A packed problem as a regular batch of N sequences of Tmax tokens, for an arm that knows no
 * packed layout (the gpu arm). Pad rows sit at the end of each sequence with q = k = v = 0,
 * g = 0 and beta = 0. By the recurrence of docs/kda.md 2.1 such a token decays the state by
 * e^0 = 1 and writes u = 0 · (v − S̃ᵀk) = 0, so the state passes through unchanged and the final
 * state of each row is that of its sequence; its read is Sᵀ·0 = 0, and no real token follows it.
 * The same holds for the gradients: every pad row is an identity on the state, so the state
 * cotangent passes back through it unchanged, and the real rows' gradients are untouched.
 *
 * @param x The packed problem (B = 1, cuSeqlens set).
 * @returns The padded problem (B = N, T = Tmax, no cuSeqlens), with its Tmax.
 *
 * @example
 * ```ts
 * import { padProblem } from "./varlen.ts";
 * const x = {
 *   B: 1, T: 3, H: 1, K: 1, V: 1, scale: 1, cuSeqlens: new Int32Array([0, 1, 3]),
 *   q: new Float32Array(3), k: new Float32Array(3), v: new Float32Array(3),
 *   g: new Float32Array(3), beta: new Float32Array(3),
 * };
 * console.log(padProblem(x).problem.B); // 2
 * ```
 */
export function padProblem(x: KdaProblem): { problem: KdaProblem; Tmax: number } {
  const cu = x.cuSeqlens!;
  const { H, K, V, scale } = x;
  const Tmax = longestSequence(cu);
  const pad = (a: Float, width: number) => padRows(a, cu, Tmax, width);
  const problem: KdaProblem = {
    B: cu.length - 1,
    T: Tmax,
    H,
    K,
    V,
    scale,
    q: pad(x.q, H * K),
    k: pad(x.k, H * K),
    v: pad(x.v, H * V),
    g: pad(x.g, H * K),
    beta: pad(x.beta, H),
    ...(x.h0 !== undefined ? { h0: x.h0 } : {}),
  };
  return { problem, Tmax };
}
