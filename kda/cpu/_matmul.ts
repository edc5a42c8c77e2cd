// The CPU arm's one matmul kernel: C += α·op(A)·op(B) on row-major f64 tiles, with op a plain or
// transposed view, an optional lower-triangular A and an optional triangular output. Every stage of
// the chunked forward and backward (docs/kda.md 2.2, 2.3) is a handful of these products.
//
// Speed: two output rows and four output columns are summed at once in registers (a 2×4 block of
// accumulators sharing each load), several times faster in V8 than one output at a time.
// Reproducibility: each output element still sums its inner index in ascending order, one plain
// `+=` per term, so the same inputs give the same bits whatever the blocking.

/** Which part of a square matrix is nonzero (or, for an output, is formed). */
export type Triangle = "full" | "lower" | "strictLower";

/** Which operands enter transposed: `"AtB"` is Aᵀ·B, `"ABt"` is A·Bᵀ, and so on. */
export type MatmulOp = "AB" | "AtB" | "ABt" | "AtBt";

/** Sizes and options of one product: op(A) is m×p, op(B) is p×n, C is m×n. */
export interface MatmulShape {
  /** Rows of C and of op(A). */
  m: number;
  /** Columns of C and of op(B). */
  n: number;
  /** The inner dimension. */
  p: number;
  /** Factor on the product; 1 when absent. */
  alpha?: number;
  /**
   * A, as stored, is lower triangular (A_ij = 0 for j > i), so the zero half is skipped: with A
   * plain, row i of C sums inner indices ≤ i; with A transposed, inner indices ≥ i.
   */
  lowerA?: boolean;
  /** Which entries of C are formed ("lower": j ≤ i, "strictLower": j < i); the rest are untouched. */
  out?: Triangle;
}

/**
 * Accumulates C += α·op(A)·op(B) into row-major tiles (callers zero or seed C first).
 *
 * @param op Which operands are transposed.
 * @param C The output, row stride `ldc`.
 * @param ldc Row stride of C.
 * @param A The left operand as stored, row stride `lda`.
 * @param lda Row stride of A.
 * @param B The right operand as stored, row stride `ldb`.
 * @param ldb Row stride of B.
 * @param shape Sizes m, n, p, the factor α and the triangle options.
 * @returns Nothing; C is updated in place.
 *
 * @example A 2×2 product and a transposed one
 * ```ts
 * import { matmulAdd } from "./_matmul.ts";
 *
 * const A = Float64Array.of(1, 2, 3, 4), B = Float64Array.of(5, 6, 7, 8);
 * const C = new Float64Array(4);
 * matmulAdd("AB", C, 2, A, 2, B, 2, { m: 2, n: 2, p: 2 });
 * console.log([...C]); // [19, 22, 43, 50]
 * C.fill(0);
 * matmulAdd("AtB", C, 2, A, 2, B, 2, { m: 2, n: 2, p: 2 });
 * console.log([...C]); // [26, 30, 38, 44]
 * ```
 */
export function matmulAdd(
  op: MatmulOp,
  C: Float64Array,
  ldc: number,
  A: Float64Array,
  lda: number,
  B: Float64Array,
  ldb: number,
  shape: MatmulShape,
): void {
  const { m, n, p } = shape;
  const alpha = shape.alpha ?? 1, out = shape.out ?? "full";
  const transA = op === "AtB" || op === "AtBt", transB = op === "ABt" || op === "AtBt";
  // op(A)_iq = A[i·aI + q·aQ], op(B)_qj = B[q·bQ + j·bJ].
  const aI = transA ? 1 : lda, aQ = transA ? lda : 1;
  const bQ = transB ? 1 : ldb, bJ = transB ? ldb : 1;
  const bJ2 = 2 * bJ, bJ3 = 3 * bJ;
  // Inner range [lo, hi) and formed columns [0, end) of output row i.
  const lower = shape.lowerA === true;
  const lo = (i: number) => (lower && transA ? Math.min(i, p) : 0);
  const hi = (i: number) => (lower && !transA ? Math.min(i + 1, p) : p);
  const end = (i: number) => (out === "full" ? n : Math.min(out === "lower" ? i + 1 : i, n));

  let i = 0;
  for (; i + 2 <= m; i += 2) {
    // Row i may start earlier (lowerA transposed) and row i+1 end later (lowerA plain): each row
    // takes its own terms at the end of the range it owns alone, so both sums stay ascending.
    const lo0 = lo(i), lo1 = lo(i + 1), hi0 = hi(i), hi1 = hi(i + 1);
    const end0 = end(i), end1 = end(i + 1);
    const a0 = i * aI, a1 = a0 + aI, c0 = i * ldc, c1 = c0 + ldc;
    let j = 0;
    for (; j + 4 <= end0; j += 4) {
      let x0 = 0, x1 = 0, x2 = 0, x3 = 0, y0 = 0, y1 = 0, y2 = 0, y3 = 0;
      let pa = a0 + lo0 * aQ, pb = lo0 * bQ + j * bJ;
      for (let q = lo0; q < lo1; q++, pa += aQ, pb += bQ) {
        const u = A[pa];
        x0 += u * B[pb];
        x1 += u * B[pb + bJ];
        x2 += u * B[pb + bJ2];
        x3 += u * B[pb + bJ3];
      }
      let pw = a1 + lo1 * aQ;
      for (let q = lo1; q < hi0; q++, pa += aQ, pw += aQ, pb += bQ) {
        const u = A[pa], w = A[pw];
        const b0 = B[pb], b1 = B[pb + bJ], b2 = B[pb + bJ2], b3 = B[pb + bJ3];
        x0 += u * b0;
        x1 += u * b1;
        x2 += u * b2;
        x3 += u * b3;
        y0 += w * b0;
        y1 += w * b1;
        y2 += w * b2;
        y3 += w * b3;
      }
      for (let q = hi0; q < hi1; q++, pw += aQ, pb += bQ) {
        const w = A[pw];
        y0 += w * B[pb];
        y1 += w * B[pb + bJ];
        y2 += w * B[pb + bJ2];
        y3 += w * B[pb + bJ3];
      }
      C[c0 + j] += alpha * x0;
      C[c0 + j + 1] += alpha * x1;
      C[c0 + j + 2] += alpha * x2;
      C[c0 + j + 3] += alpha * x3;
      C[c1 + j] += alpha * y0;
      C[c1 + j + 1] += alpha * y1;
      C[c1 + j + 2] += alpha * y2;
      C[c1 + j + 3] += alpha * y3;
    }
    for (; j < end0; j++) {
      C[c0 + j] += alpha * dot(A, a0, aQ, B, j * bJ, bQ, lo0, hi0);
      C[c1 + j] += alpha * dot(A, a1, aQ, B, j * bJ, bQ, lo1, hi1);
    }
    for (; j < end1; j++) C[c1 + j] += alpha * dot(A, a1, aQ, B, j * bJ, bQ, lo1, hi1);
  }
  if (i < m) {
    const a0 = i * aI, c0 = i * ldc, l = lo(i), h = hi(i), e = end(i);
    for (let j = 0; j < e; j++) C[c0 + j] += alpha * dot(A, a0, aQ, B, j * bJ, bQ, l, h);
  }
}

/** Σ_{q = lo}^{hi − 1} A[a + q·aQ] · B[b + q·bQ], in ascending q. */
function dot(
  A: Float64Array,
  a: number,
  aQ: number,
  B: Float64Array,
  b: number,
  bQ: number,
  lo: number,
  hi: number,
): number {
  let acc = 0;
  for (let q = lo, pa = a + lo * aQ, pb = b + lo * bQ; q < hi; q++, pa += aQ, pb += bQ) {
    acc += A[pa] * B[pb];
  }
  return acc;
}
