// Planted defects the proof must catch (`deno task prove --mutants`), and the proof's falsification.
// Each defect is a seam of its own, derived here from the KDA seam's policy and never part of the
// production path: wrapped fused arms (outputs or gradients changed), or a subclass that runs a
// call otherwise through the seam's extension surface (seam/seam.ts: run, count, record). The proof
// makes the layer's calls reach it with `withKdaSeam` (kda/op/arms.ts), which no entry point
// exports. Each mutant names the diagnosis it must draw.

import { type Data, tapeOf, Tensor } from "../tape/mod.ts";
import { type CompositeArm, type FusedArm, Seam, type SeamArm } from "../seam/seam.ts";
import { type KdaRequest, kdaSeam } from "../kda/op/arms.ts";
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

/** What a wrapped fused arm changes: its forward's outputs, its backward's input gradients. */
interface ArmChange {
  outputs?: (outputs: Data[]) => Data[];
  gradients?: (gradients: (Data | null)[], request: KdaRequest) => (Data | null)[];
}

/** A fused arm whose outputs or gradients pass through `change`; it keeps the call's request. */
function wrapFused(
  arm: FusedArm<KdaRequest>,
  change: ArmChange,
): FusedArm<KdaRequest, { saved: unknown; request: KdaRequest }> {
  return {
    name: arm.name,
    kind: "fused",
    dtypes: arm.dtypes,
    whyNot: (request, dtype, call) => arm.whyNot(request, dtype, call),
    ...(arm.variant !== undefined ? { variant: arm.variant } : {}),
    async forward(request, inputs, save) {
      const { outputs, saved } = await arm.forward(request, inputs, save);
      return {
        outputs: change.outputs ? change.outputs(outputs) : outputs,
        saved: saved === undefined ? undefined : { saved, request },
      };
    },
    async backward({ saved, request }, cotangents) {
      const gradients = await arm.backward(saved, cotangents);
      return change.gradients ? change.gradients(gradients, request) : gradients;
    },
    release: ({ saved }) => arm.release?.(saved),
  };
}

/** The KDA seam's policy with every fused arm wrapped by `change` (the composite arm as it is). */
function changedArms(change: ArmChange): PlantedDefect {
  const policy = kdaSeam.policy;
  const arms = policy.arms.map((arm): SeamArm<KdaRequest> =>
    arm.kind === "fused" ? wrapFused(arm, change) as FusedArm<KdaRequest> : arm
  );
  return { seam: new Seam({ ...policy, arms }) };
}

/** How a {@linkcode PlantedSeam} runs a call its fused arm was chosen for. */
type Plant = "detach" | "discard-fused" | "mislabel";

/** A KDA seam that runs a fused arm's call otherwise, counting and recording as it goes. */
class PlantedSeam extends Seam<KdaRequest> {
  readonly #plant: Plant;

  constructor(plant: Plant) {
    super(kdaSeam.policy);
    this.#plant = plant;
  }

  /** No call runs without a tape here: each goes through `run`, where the plant is. */
  override vjp(): Promise<null> {
    return Promise.resolve(null);
  }

  #composite(): CompositeArm<KdaRequest> {
    return this.policy.arms.find((a) => a.kind === "composite") as CompositeArm<KdaRequest>;
  }

  protected override async run(
    arm: SeamArm<KdaRequest>,
    inputs: readonly (Tensor | undefined)[],
    request: KdaRequest,
    wanted: string,
  ): Promise<Tensor[]> {
    if (this.#plant === "detach") {
      if (arm.kind === "composite") {
        throw new TypeError(
          `the detached seam applies to the fused arms: got the composite arm ${arm.name}`,
        );
      }
      this.record(wanted, arm.name, "outputs detached (the proof's falsification)");
      // The outputs come back as leaves: nothing upstream of the op can get a gradient.
      const { outputs, saved } = await arm.forward(request, inputs.map((t) => t?.data), false);
      this.count("fusedFwd");
      if (saved !== undefined) arm.release?.(saved);
      const shapes = this.policy.outputShapes(request);
      return outputs.map((data, i) => new Tensor(data, shapes[i]));
    }
    if (arm.kind === "composite") return await super.run(arm, inputs, request, wanted);
    if (this.#plant === "discard-fused") {
      // The fused forward runs, its result is dropped, and the composite arm carries the call.
      const save = tapeOf(inputs) !== undefined;
      const { saved } = await arm.forward(request, inputs.map((t) => t?.data), save);
      this.count("fusedFwd");
      if (saved !== undefined) arm.release?.(saved);
      return await super.run(this.#composite(), inputs, request, wanted);
    }
    // mislabel: the composite arm runs, the books say the fused one did.
    this.count("fusedFwd");
    return this.#composite().record(request, inputs);
  }
}

/**
 * A seam whose fused arms return their outputs detached, as leaves: the proof's falsification
 * (every group upstream of the op must go red) and the `detached` mutant.
 *
 * @returns A fresh seam over the KDA seam's policy.
 */
export function detachedSeam(): Seam<KdaRequest> {
  return new PlantedSeam("detach");
}

/** The token range of chunk `c` in a [B, T, heads, X] layout, as flat index ranges. */
function eachInChunk(
  r: KdaRequest,
  width: "K" | "V",
  heads: number,
  chunk: number,
  fn: (i: number) => void,
): void {
  const X = r[width];
  // The layer always names its chunk size (config.chunkSize), so the request carries it.
  const C = r.chunkSize!;
  const t0 = chunk * C, t1 = Math.min(r.T, t0 + C);
  for (let b = 0; b < r.B; b++) {
    for (let t = t0; t < t1; t++) {
      for (let i = 0; i < heads * X; i++) fn(((b * r.T + t) * heads) * X + i);
    }
  }
}

/**
 * A defect that changes input gradient `input` (dq or dk, [B, T, H, K], or dg, [B, T, HV, K]) in
 * chunk `chunk` only.
 */
function oneChunk(input: number, chunk: number, change: (v: number) => number): PlantedDefect {
  return changedArms({
    gradients: (g, request) => {
      const out = g.map((x) => x === null ? null : x.slice());
      const target = out[input]!;
      const heads = input === 3 ? request.HV ?? request.H : request.H;
      eachInChunk(request, "K", heads, chunk, (i) => target[i] = change(target[i]));
      return out;
    },
  });
}

/** The catalogue of docs/kda.md 4's planted defects. */
export const MUTANTS: readonly Mutant[] = [
  {
    name: "detached",
    description: "the op's outputs detached, returned as leaves",
    expected: /^The graph is cut at the op/,
    make: () => ({ seam: detachedSeam() }),
  },
  {
    name: "dh0-zero",
    description: "the state gradient dh0 zeroed",
    expected: /^The op's adjoint is wrong/,
    make: () =>
      changedArms({ gradients: (g) => g.map((x, i) => i === 5 && x !== null ? x.fill(0) : x) }),
  },
  {
    name: "dbeta-scaled",
    description: "dbeta scaled by 1 + 1e-3",
    expected: /^The op's adjoint is wrong/,
    make: () =>
      changedArms({
        gradients: (g) => g.map((x, i) => i === 4 && x !== null ? x.map((v) => v * 1.001) : x),
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
    make: () =>
      changedArms({
        gradients: (g) =>
          g.map((x) => {
            if (x === null) return x;
            let m = 0;
            for (const v of x) m = Math.max(m, Math.abs(v));
            return x.map((v) => v + 1e-6 * m * (2 * Math.random() - 1));
          }),
      }),
  },
  {
    name: "fused-discarded",
    description: "a fused forward runs, its result is discarded and the ops path carries the step",
    expected: /^A fused forward was discarded/,
    make: () => ({ seam: new PlantedSeam("discard-fused") }),
  },
  {
    name: "decline-mislabelled",
    description: "a decline runs the ops path while the counters report the fused arm",
    expected: /^A decline hid behind a fused label/,
    make: () => ({ seam: new PlantedSeam("mislabel") }),
  },
  {
    name: "forward-perturbed",
    description: "the forward's outputs perturbed by 1e-4 relative",
    expected: /^The forward differs/,
    make: () => changedArms({ outputs: (o) => o.map((x) => x.map((v) => v * (1 + 1e-4))) }),
  },
];
