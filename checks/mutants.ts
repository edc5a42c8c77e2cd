// Planted defects the proof must catch (`deno task prove --mutants`), injected through the seam's
// test hooks without editing any source. Each mutant names the diagnosis it must draw.

import type { KdaRequest } from "../kda/op/arms.ts";
import type { PlantedDefect } from "./_proof_report.ts";

/** One planted defect and the diagnosis the proof must give for it. */
export interface Mutant {
  /** Short name. */
  name: string;
  /** What it breaks. */
  description: string;
  /** The diagnosis pattern the proof must print (its leading words). */
  expected: RegExp;
  /** The defect, made fresh for each run. */
  make: () => PlantedDefect;
}

/** The token range of chunk `c` in a [B, T, H, X] layout, as flat index ranges. */
function eachInChunk(
  request: unknown,
  width: "K" | "V",
  chunk: number,
  fn: (i: number) => void,
): void {
  const r = request as KdaRequest;
  const X = r[width];
  // The layer always names its chunk size (config.chunkSize), so the request carries it.
  const C = r.chunkSize!;
  const t0 = chunk * C, t1 = Math.min(r.T, t0 + C);
  for (let b = 0; b < r.B; b++) {
    for (let t = t0; t < t1; t++) {
      for (let i = 0; i < r.H * X; i++) fn(((b * r.T + t) * r.H) * X + i);
    }
  }
}

/** A defect that changes input gradient `input` (a [B, T, H, K] one) in chunk `chunk` only. */
function oneChunk(input: number, chunk: number, change: (v: number) => number): PlantedDefect {
  return {
    hooks: {
      mapGradients: (g, request) => {
        const out = g.map((x) => x === null ? null : x.slice());
        const target = out[input]!;
        eachInChunk(request, "K", chunk, (i) => target[i] = change(target[i]));
        return out;
      },
    },
  };
}

/** The catalogue of docs/kda.md 4's planted defects. */
export const MUTANTS: readonly Mutant[] = [
  {
    name: "detached",
    description: "the op's outputs detached, returned as leaves",
    expected: /^The graph is cut at the op/,
    make: () => ({ detach: true }),
  },
  {
    name: "dh0-zero",
    description: "the state gradient dh0 zeroed",
    expected: /^The op's adjoint is wrong/,
    make: () => ({
      hooks: { mapGradients: (g) => g.map((x, i) => i === 5 && x !== null ? x.fill(0) : x) },
    }),
  },
  {
    name: "dbeta-scaled",
    description: "dbeta scaled by 1 + 1e-3",
    expected: /^The op's adjoint is wrong/,
    make: () => ({
      hooks: {
        mapGradients: (g) => g.map((x, i) => i === 4 && x !== null ? x.map((v) => v * 1.001) : x),
      },
    }),
  },
  {
    name: "dg-sign-one-chunk",
    description: "dg sign-flipped in the second chunk only",
    expected: /^The op's adjoint is wrong/,
    make: () => oneChunk(3, 1, (v) => -v),
  },
  {
    name: "dk-drop-one-chunk",
    description: "the third chunk's contribution to dk dropped",
    expected: /^The op's adjoint is wrong/,
    make: () => oneChunk(1, 2, () => 0),
  },
  {
    name: "noisy-backward",
    description: "a backward that adds noise of relative size 1e-6, different on every run",
    expected: /^Non-deterministic/,
    make: () => ({
      hooks: {
        mapGradients: (g) =>
          g.map((x) => {
            if (x === null) return x;
            let m = 0;
            for (const v of x) m = Math.max(m, Math.abs(v));
            return x.map((v) => v + 1e-6 * m * (2 * Math.random() - 1));
          }),
      },
    }),
  },
  {
    name: "fused-discarded",
    description: "a fused forward runs, its result is discarded and the ops path carries the step",
    expected: /^A fused forward was discarded/,
    make: () => ({ hooks: { discardFused: true } }),
  },
  {
    name: "decline-mislabelled",
    description: "a decline runs the ops path while the counters report the fused arm",
    expected: /^A decline hid behind a fused label/,
    make: () => ({ hooks: { mislabel: true } }),
  },
  {
    name: "forward-perturbed",
    description: "the forward's outputs perturbed by 1e-4 relative",
    expected: /^The forward differs/,
    make: () => ({ hooks: { mapOutputs: (o) => o.map((x) => x.map((v) => v * (1 + 1e-4))) } }),
  },
];
