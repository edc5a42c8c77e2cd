// The in-kernel options (docs/kda.md 2.8) on the host, for the cpu arm: the forward maps the raw
// q, k, g, beta (and aLog, dtBias) to the op's own arrays in f64, keeping what the backward needs;
// the backward maps the core's gradients back to the raw arrays and adds daLog and ddtBias. Every
// reduction runs in one fixed order (rows ascending, then channels), so reruns give the same bits.

import type { Float, InKernel, KdaProblem } from "../_types.ts";
import { L2NORM_EPS } from "../_types.ts";

/** sigmoid(x), without overflow for either sign. */
export function sigmoid(x: number): number {
  if (x >= 0) return 1 / (1 + Math.exp(-x));
  const e = Math.exp(x);
  return e / (1 + e);
}

/** ln(1 + e^x), without overflow for large x and without cancellation for very negative x. */
export function softplus(x: number): number {
  return x > 0 ? x + Math.log1p(Math.exp(-x)) : Math.log1p(Math.exp(x));
}

/** What the host backward of the options needs, all f64. */
export interface HostInKernelSaved {
  inKernel: InKernel;
  /** Dims of the raw call: rows = B·T, heads H (q, k) and HV (g, beta), K. */
  rows: number;
  H: number;
  HV: number;
  K: number;
  /** The normalised q and k, and each row's 1/sqrt(Σx² + eps). */
  qHat?: Float64Array;
  qR?: Float64Array;
  kHat?: Float64Array;
  kR?: Float64Array;
  /** z = g + dtBias, and e^{aLog} per value head (1 without aLog). */
  z?: Float64Array;
  sharp?: Float64Array;
  /** The raw beta logits. */
  betaRaw?: Float64Array;
}

/** Rows of `width` scaled by 1/sqrt(Σx² + eps), with each row's factor. */
function l2normRows(x: Float, width: number): { y: Float64Array; r: Float64Array } {
  const rows = x.length / width;
  const y = new Float64Array(x.length), r = new Float64Array(rows);
  for (let i = 0; i < rows; i++) {
    let ss = 0;
    for (let c = 0; c < width; c++) ss += x[i * width + c] * x[i * width + c];
    const inv = 1 / Math.sqrt(ss + L2NORM_EPS);
    r[i] = inv;
    for (let c = 0; c < width; c++) y[i * width + c] = x[i * width + c] * inv;
  }
  return { y, r };
}

/** dx = r·(dy − y·(y·dy)) per row: the VJP of y = x·r(x). */
function l2normRowsBackward(y: Float64Array, r: Float64Array, dy: Float, width: number) {
  const dx = new Float64Array(y.length);
  for (let i = 0; i < r.length; i++) {
    let dot = 0;
    for (let c = 0; c < width; c++) dot += y[i * width + c] * dy[i * width + c];
    for (let c = 0; c < width; c++) {
      dx[i * width + c] = r[i] * (dy[i * width + c] - y[i * width + c] * dot);
    }
  }
  return dx;
}

/**
 * The op's own q, k, g, beta from a problem's raw ones, in f64, and what the backward needs.
 *
 * @param x The problem with its in-kernel options (raw arrays, aLog and dtBias as given).
 * @param save Whether a backward will follow.
 * @returns The problem the chunked code runs (f64 arrays, no options) and the saved state.
 * @example
 * ```ts
 * import { inKernelForward } from "./_in_kernel_host.ts";
 * const one = (n: number, v: number) => new Float64Array(n).fill(v);
 * const { problem } = inKernelForward({
 *   B: 1, T: 1, H: 1, K: 2, V: 1, scale: 1, q: one(2, 3), k: one(2, 4), v: one(1, 1),
 *   g: one(2, 0), beta: one(1, 0),
 *   inKernel: { l2norm: false, gate: null, betaSigmoid: 1, finalState: true },
 * }, false);
 * console.log(problem.beta[0]); // 0.5
 * ```
 */
export function inKernelForward(
  x: KdaProblem,
  save: boolean,
): { problem: KdaProblem<Float64Array>; saved?: HostInKernelSaved } {
  const ik = x.inKernel!;
  const { B, T, H, K } = x;
  const HV = x.HV ?? H;
  const rows = B * T;
  const saved: HostInKernelSaved = { inKernel: ik, rows, H, HV, K };
  let q: Float64Array = Float64Array.from(x.q), k: Float64Array = Float64Array.from(x.k);
  if (ik.l2norm) {
    const nq = l2normRows(x.q, K), nk = l2normRows(x.k, K);
    q = nq.y;
    k = nk.y;
    Object.assign(saved, { qHat: nq.y, qR: nq.r, kHat: nk.y, kR: nk.r });
  }
  const g = Float64Array.from(x.g);
  const gate = ik.gate;
  if (gate !== null) {
    const sharp = new Float64Array(HV).fill(1);
    if (x.aLog !== undefined) { for (let h = 0; h < HV; h++) sharp[h] = Math.exp(x.aLog[h]); }
    const z = new Float64Array(g.length);
    for (let e = 0; e < g.length; e++) {
      const hk = e % (HV * K);
      z[e] = x.g[e] + (x.dtBias === undefined ? 0 : x.dtBias[hk]);
      const a = sharp[Math.floor(hk / K)];
      g[e] = gate.lowerBound === null ? -a * softplus(z[e]) : gate.lowerBound * sigmoid(a * z[e]);
    }
    Object.assign(saved, { z, sharp });
  }
  const beta = Float64Array.from(x.beta);
  if (ik.betaSigmoid !== 0) {
    saved.betaRaw = Float64Array.from(x.beta);
    for (let i = 0; i < beta.length; i++) beta[i] = ik.betaSigmoid * sigmoid(x.beta[i]);
  }
  const { inKernel: _, aLog: _a, dtBias: _d, h0: _h, ...rest } = x;
  const problem: KdaProblem<Float64Array> = {
    ...rest,
    q,
    k,
    v: Float64Array.from(x.v),
    g,
    beta,
    ...(x.h0 !== undefined ? { h0: Float64Array.from(x.h0) } : {}),
  };
  return save ? { problem, saved } : { problem };
}

/**
 * The raw arrays' gradients from the core's (all in the raw call's layouts, dq and dk already
 * summed over grouped value heads), with daLog and ddtBias where those inputs were given.
 *
 * @param s What {@linkcode inKernelForward} saved.
 * @param grads dq, dk, dg, dbeta of the core op.
 * @returns The raw arrays' gradients, f64.
 * @example
 * ```ts
 * import { inKernelBackward, inKernelForward } from "./_in_kernel_host.ts";
 * const one = (n: number, v: number) => new Float64Array(n).fill(v);
 * const { saved } = inKernelForward({
 *   B: 1, T: 1, H: 1, K: 2, V: 1, scale: 1, q: one(2, 3), k: one(2, 4), v: one(1, 1),
 *   g: one(2, 0), beta: one(1, 0),
 *   inKernel: { l2norm: false, gate: null, betaSigmoid: 1, finalState: true },
 * }, true);
 * const d = inKernelBackward(saved!, { dq: one(2, 0), dk: one(2, 0), dg: one(2, 0), dbeta: one(1, 1) });
 * console.log(d.dbeta[0]); // 0.25
 * ```
 */
export function inKernelBackward(
  s: HostInKernelSaved,
  grads: { dq: Float; dk: Float; dg: Float; dbeta: Float },
): {
  dq: Float64Array;
  dk: Float64Array;
  dg: Float64Array;
  dbeta: Float64Array;
  daLog?: Float64Array;
  ddtBias?: Float64Array;
} {
  const { inKernel: ik, rows, HV, K } = s;
  const dq = ik.l2norm
    ? l2normRowsBackward(s.qHat!, s.qR!, grads.dq, K)
    : Float64Array.from(grads.dq);
  const dk = ik.l2norm
    ? l2normRowsBackward(s.kHat!, s.kR!, grads.dk, K)
    : Float64Array.from(grads.dk);
  const out: ReturnType<typeof inKernelBackward> = {
    dq,
    dk,
    dg: Float64Array.from(grads.dg),
    dbeta: Float64Array.from(grads.dbeta),
  };
  const gate = ik.gate;
  if (gate !== null) {
    const z = s.z!, sharp = s.sharp!;
    const dz = out.dg;
    const daLog = new Float64Array(HV), ddtBias = new Float64Array(HV * K);
    for (let r = 0; r < rows; r++) {
      for (let h = 0; h < HV; h++) {
        const a = sharp[h];
        for (let c = 0; c < K; c++) {
          const hk = h * K + c, e = r * HV * K + hk;
          const dy = grads.dg[e];
          if (gate.lowerBound === null) {
            // y = −a·softplus(z): dy/dz = −a·σ(z), dy/daLog = y
            dz[e] = -a * sigmoid(z[e]) * dy;
            // where dy is 0 (as wherever the decay is) the term is 0, though y may have overflowed
            if (dy !== 0) daLog[h] += dy * (-a * softplus(z[e]));
          } else {
            // y = lb·σ(u), u = a·z: dy/du = lb·σ(u)σ(−u), du/dz = a, du/daLog = u
            const u = a * z[e];
            const du = dy * gate.lowerBound * sigmoid(u) * sigmoid(-u);
            dz[e] = du * a;
            if (du !== 0) daLog[h] += du * u;
          }
          ddtBias[hk] += dz[e];
        }
      }
    }
    if (gate.aLog) out.daLog = daLog;
    if (gate.dtBias) out.ddtBias = ddtBias;
  }
  if (ik.betaSigmoid !== 0) {
    const b = s.betaRaw!;
    for (let i = 0; i < b.length; i++) {
      out.dbeta[i] = grads.dbeta[i] * ik.betaSigmoid * sigmoid(b[i]) * sigmoid(-b[i]);
    }
  }
  return out;
}
