// The proof's op-level section: the KDA op alone, with an initial state and a final-state
// cotangent (which the layer never uses), on the arm under test against the exact f64 ops arm on the
// same bytes, and the transpose identity ⟨J u, v⟩ = ⟨u, Jᵀ v⟩ with J u by forward mode.

import { jvp, Tape, Tensor } from "../tape/mod.ts";
import type { Seam } from "../seam/seam.ts";
import { type KdaRequest, runKda, withKdaSeam } from "../kda/op/arms.ts";
import type { Arm, ChunkSize, Float } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { mulberry32, normal, subSeed } from "../kda/layer/_random.ts";
import { type Agreement, agreement } from "./compare.ts";
import type { ComputeDType } from "../base/dtype.ts";

/** One tensor's agreement with the reference. */
export interface OpRow {
  /** The tensor: o, ht, dq, dk, dv, dg, dbeta or dh0. */
  name: string;
  /** Agreement with the reference. */
  agreement: Agreement;
  /** Whether it is within the tolerance. */
  ok: boolean;
}

/** What the op-level section measured. */
export interface OpCheck {
  /** The op's shape. */
  request: KdaRequest;
  /** The arm of the f64 reference (ops, or cpu when the ops arm is proven). */
  referenceArm: Arm;
  /** Outputs and gradients against the f64 reference. */
  rows: OpRow[];
  /** ⟨J u, v⟩ (forward mode, f64 ops arm) against ⟨u, Jᵀ v⟩ (the arm under test). */
  transpose: { jv: number; vjt: number; rel: number; tol: number; ok: boolean };
  /** Whether every row and the transpose identity hold. */
  ok: boolean;
}

function draws(seed: number, request: KdaRequest) {
  const { B, T, H, K, V } = request;
  const stream = (name: string) => normal(mulberry32(subSeed(seed, `op.${name}`)));
  const uni = mulberry32(subSeed(seed, "op.uniform"));
  const make = (n: number, f: () => number) => Float64Array.from({ length: n }, f);
  const k = make(B * T * H * K, stream("k"));
  for (let r = 0; r < B * T * H; r++) {
    let ss = 0;
    for (let d = 0; d < K; d++) ss += k[r * K + d] ** 2;
    for (let d = 0; d < K; d++) k[r * K + d] /= Math.sqrt(ss);
  }
  const inputs = [
    make(B * T * H * K, stream("q")),
    k,
    make(B * T * H * V, stream("v")),
    make(B * T * H * K, () => -3 * uni()),
    make(B * T * H, () => 0.05 + 0.9 * uni()),
    make(B * H * K * V, () => 0.5 * stream("h0")()),
  ];
  const cot = [make(B * T * H * V, stream("dout")), make(B * H * K * V, stream("dht"))];
  const dirs = inputs.map((x, i) => make(x.length, stream(`u${i}`)));
  return { inputs, cot, dirs };
}

function shapesOf(r: KdaRequest): number[][] {
  const { B, T, H, K, V } = r;
  return [[B, T, H, K], [B, T, H, K], [B, T, H, V], [B, T, H, K], [B, T, H], [B, H, K, V]];
}

async function vjpOn(
  arm: Arm,
  dtype: ComputeDType,
  request: KdaRequest,
  inputs: Float[],
  cot: Float[],
  seam: Seam<KdaRequest> | undefined,
): Promise<{ o: Float; ht: Float; grads: Float[] }> {
  const tape = new Tape(dtype);
  try {
    const shapes = shapesOf(request);
    const [q, k, v, g, beta, h0] = inputs.map((x, i) => tape.variable(x, shapes[i]));
    const run = () => runKda({ q, k, v, g, beta, h0 }, request, { arm, strict: true, quiet: true });
    const { o, ht } = await (seam === undefined ? run() : withKdaSeam(seam, run));
    // Detached outputs (the falsification) are constants: nothing flows back from them.
    const seeds = [];
    if (o.requiresGrad) seeds.push({ output: o, cotangent: cot[0] });
    if (ht.requiresGrad) seeds.push({ output: ht, cotangent: cot[1] });
    const grads = seeds.length ? await tape.backwardFrom(seeds) : new Map();
    const vars = [q, k, v, g, beta, h0];
    return {
      o: o.data,
      ht: ht.data,
      grads: vars.map((t) =>
        grads.get(t) ?? new (dtype === "f64" ? Float64Array : Float32Array)(t.size)
      ),
    };
  } finally {
    tape.dispose();
  }
}

/**
 * Runs the op-level section.
 *
 * @param options The arm and dtype under test, the head dims and chunk size, tolerances, seed,
 *   and the seam of any planted defect.
 * @returns Every figure and whether it holds.
 */
export async function checkOp(options: {
  arm: Arm;
  dtype: ComputeDType;
  K: number;
  V: number;
  chunkSize: ChunkSize;
  forwardTol: number;
  gradTol: number;
  seed: number;
  seam?: Seam<KdaRequest>;
  kernels?: string;
}): Promise<OpCheck> {
  const { arm, dtype, K, V, chunkSize } = options;
  // Ragged: three full chunks and a short one, so chunk boundaries and the short tail both count.
  const request: KdaRequest = {
    B: 2,
    T: 3 * chunkSize + 5,
    H: 2,
    K,
    V,
    scale: K ** -0.5,
    chunkSize,
    ...(options.kernels !== undefined ? { kernels: options.kernels } : {}),
  };
  const { inputs, cot, dirs } = draws(options.seed, request);
  const cast = (a: Float64Array): Float => dtype === "f32" ? Float32Array.from(a) : a;
  const tested = await vjpOn(
    arm,
    dtype,
    request,
    inputs.map(cast),
    cot.map(cast),
    options.seam,
  );
  // The reference sees the very bytes the tested arm saw.
  const same = (a: Float64Array) => Float64Array.from(cast(a));
  const refInputs = inputs.map(same), refCot = cot.map(same);
  // The reference is the plain recurrence, or the f64 chunked arm when the recurrence is on trial.
  const referenceArm: Arm = arm === "ops" ? "cpu" : "ops";
  const reference = await vjpOn(referenceArm, "f64", request, refInputs, refCot, undefined);
  const rows: OpRow[] = [];
  const add = (name: string, a: Float, b: Float, tol: number) => {
    const ag = agreement(a, b);
    rows.push({ name, agreement: ag, ok: ag.rel <= tol });
  };
  add("o", tested.o, reference.o, options.forwardTol);
  add("ht", tested.ht, reference.ht, options.forwardTol);
  GRAD_NAMES.forEach((name, i) => add(name, tested.grads[i], reference.grads[i], options.gradTol));

  // ⟨J u, v⟩ by forward mode on the exact ops arm, against ⟨u, Jᵀ v⟩ from the arm under test.
  const shapes = shapesOf(request);
  const { tangents: [to, tht] } = await jvp(
    async (q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, h0: Tensor) => {
      const { o, ht } = await runKda({ q, k, v, g, beta, h0 }, request, {
        arm: "ops",
        strict: true,
      });
      return [o, ht];
    },
    refInputs.map((x, i) => new Tensor(x, shapes[i])),
    dirs,
  );
  let jv = 0, vjt = 0, scale = 0;
  for (let i = 0; i < to.length; i++) jv += to[i] * refCot[0][i];
  for (let i = 0; i < tht.length; i++) jv += tht[i] * refCot[1][i];
  tested.grads.forEach((g, j) => {
    for (let i = 0; i < g.length; i++) {
      vjt += dirs[j][i] * g[i];
      scale += Math.abs(dirs[j][i] * g[i]);
    }
  });
  const rel = Math.abs(jv - vjt) / scale;
  const tol = dtype === "f64" ? 1e-12 : options.gradTol;
  const transpose = { jv, vjt, rel, tol, ok: rel <= tol };
  return { request, referenceArm, rows, transpose, ok: transpose.ok && rows.every((r) => r.ok) };
}
