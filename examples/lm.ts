/**
 * A model example: a two-layer KDA model with token embeddings and an output head, trained end to
 * end with AdamW on one tape per step (the loss's gradient flows through both layers'
 * `forwardOnTape` into the embedding), on a task one layer cannot solve: multi-query associative
 * recall whose keys are longer than the short convolution (examples/_lm_task.ts). It trains the
 * model on the cpu arm (f64) and the gpu arm (f32), and a one-layer model alike on the cpu arm for
 * comparison; prints progress with an ETA to stderr, held-out accuracy and times to stdout, and
 * with `--out FILE` writes the loss curves as SVG (nothing is written without it).
 *
 * ```sh
 * deno run --allow-env --allow-read --allow-write=examples examples/lm.ts \
 *   [--steps 600] [--gpu-steps 100] [--one-layer-steps 600] [--arm-set cpu,gpu,one-layer] \
 *   [--batch 16] [--lr 0.01] [--seed 0] [--out examples/lm_loss.svg]
 * ```
 *
 * The layer is the one of docs/kda.md 2.4; the arms are those of docs/kda.md 3.
 *
 * @example Usage
 * ```ts ignore
 * // deno task example:lm --out examples/lm_loss.svg
 * ```
 *
 * @module
 */

import { parseArgs } from "node:util";
import { type Arm, resetSeamCounts, seamCounts, seamDecisions } from "../mod.ts";
import { AdamW } from "../optim/mod.ts";
import { mulberry32 } from "../kda/layer/_random.ts";
import { type LmShape, TinyLm } from "./_lm_model.ts";
import { lengthOf, makeBatch, TASK, vocabOf } from "./_lm_task.ts";
import { chartSvg, type Curve } from "./_svg.ts";
import { checkOut, count, fmtTime, hasAdapter, positive, schedule } from "./_run.ts";
import { argsOrExit } from "../bench/_args.ts";

const HELP = `Usage: examples/lm.ts [flags]
  --steps N            training steps of the two-layer model on the cpu arm (default 600)
  --gpu-steps N        training steps of the two-layer model on the gpu arm, a slow software
                       adapter here (default 100)
  --one-layer-steps N  training steps of the one-layer model on the cpu arm (default 600)
  --arm-set LIST       runs, comma-separated from cpu, gpu, one-layer (default all three)
  --batch N            sequences per step (default 16)
  --lr X               peak AdamW learning rate (default 0.01)
  --seed N             seed of the models and the data (default 0)
  --out FILE           write the SVG of the loss curves to FILE (default: none is written;
                       examples/lm_loss.svg is the chart the README shows)`;

/** Each layer: D = 32, H = 2, K = V = 16, R = 8, chunk 16, the short convolution. */
const LAYER = {
  dModel: 32,
  heads: 2,
  keyDim: 16,
  valueDim: 16,
  decayRank: 8,
  chunkSize: 16 as const,
  shortConv: true,
};
const EVAL_SEQUENCES = 512;

type Run = "cpu" | "gpu" | "one-layer";

interface RunResult {
  run: Run;
  arm: Arm;
  dtype: "f64" | "f32";
  layers: number;
  losses: number[];
  heldOut: number;
  seconds: number;
  declines: string[];
  calls: { asked: number; declined: number };
}

async function train(
  run: Run,
  steps: number,
  opts: { seed: number; batch: number; lr: number; scheduleSteps: number },
): Promise<RunResult> {
  const arm: Arm = run === "gpu" ? "gpu" : "cpu";
  const dtype = run === "gpu" ? "f32" : "f64";
  const layers = run === "one-layer" ? 1 : 2;
  const shape: LmShape = { vocab: vocabOf(TASK), layers, layer: LAYER };
  const model = new TinyLm(shape, opts.seed, dtype);
  const opt = new AdamW(model.parameters(), { lr: opts.lr, weightDecay: 0 });
  // every run draws the same batches and follows the same schedule: shorter runs are prefixes
  const data = mulberry32(opts.seed + 3);
  resetSeamCounts();
  const losses: number[] = [];
  const t0 = performance.now();
  let lastPrint = 0;
  const label = `[${run} ${dtype}, ${layers} layer${layers > 1 ? "s" : ""}]`;
  for (let s = 0; s < steps; s++) {
    const r = await model.step(makeBatch(TASK, opts.batch, data), arm);
    opt.lr = schedule(s, opts.scheduleSteps, opts.lr);
    opt.step(r.grads);
    losses.push(r.loss);
    const now = performance.now();
    if (now - lastPrint > 5000 || s === steps - 1) {
      lastPrint = now;
      const elapsed = (now - t0) / 1000, eta = elapsed / (s + 1) * (steps - s - 1);
      console.error(
        `${label} step ${s + 1}/${steps}  loss ${r.loss.toFixed(4)}  batch acc ` +
          `${(100 * r.accuracy).toFixed(1)}%  ${fmtTime(elapsed)} elapsed, ETA ${fmtTime(eta)}`,
      );
    }
  }
  const seconds = (performance.now() - t0) / 1000;
  const { asked, declined } = seamCounts();
  const declines = [
    ...new Set(seamDecisions().filter((d) => d.ran !== d.wanted).map((d) => d.reason)),
  ];
  // held-out: fresh sequences from a stream the training never saw
  const held = mulberry32(opts.seed + 4);
  let correct = 0, scored = 0;
  for (let done = 0; done < EVAL_SEQUENCES; done += 64) {
    const e = await model.evaluate(makeBatch(TASK, 64, held), arm);
    correct += e.correct;
    scored += e.scored;
  }
  return {
    run,
    arm,
    dtype,
    layers,
    losses,
    heldOut: correct / scored,
    seconds,
    declines,
    calls: { asked, declined },
  };
}

const COLORS: Record<Run, string> = { cpu: "#1f77b4", gpu: "#d62728", "one-layer": "#7f7f7f" };

async function main(): Promise<void> {
  const { values, steps, opts, runs } = argsOrExit("example:lm", () => {
    const { values } = parseArgs({
      args: Deno.args,
      options: {
        steps: { type: "string", default: "600" },
        "gpu-steps": { type: "string", default: "100" },
        "one-layer-steps": { type: "string", default: "600" },
        "arm-set": { type: "string", default: "cpu,gpu,one-layer" },
        batch: { type: "string", default: "16" },
        lr: { type: "string", default: "0.01" },
        seed: { type: "string", default: "0" },
        out: { type: "string" },
        help: { type: "boolean", default: false },
      },
    });
    const runs = values["arm-set"].split(",").map((a) => a.trim()).filter(Boolean);
    for (const r of runs) {
      if (r !== "cpu" && r !== "gpu" && r !== "one-layer") {
        throw new RangeError(`--arm-set must list runs from cpu, gpu, one-layer: got ${r}`);
      }
    }
    const lr = Number(values.lr);
    if (!(lr > 0 && Number.isFinite(lr))) {
      throw new RangeError(`--lr must be a positive number: got ${values.lr}`);
    }
    const steps: Record<Run, number> = {
      cpu: count("steps", values.steps),
      gpu: count("gpu-steps", values["gpu-steps"]),
      "one-layer": count("one-layer-steps", values["one-layer-steps"]),
    };
    const opts = {
      seed: count("seed", values.seed),
      batch: positive("batch", values.batch),
      lr,
      scheduleSteps: Math.max(steps.cpu, steps.gpu, steps["one-layer"]),
    };
    if (values.out !== undefined) checkOut(values.out);
    return { values, steps, opts, runs };
  });
  if (values.help) {
    console.log(HELP);
    return;
  }
  const chance = 1 / TASK.values, guess = 1 / TASK.pairs;
  console.error(
    `recall with keys longer than the short conv: ${TASK.pairs} pairs "k s1 s2 : v" and ` +
      `${TASK.pairs} queries "k s1 s2 ?" (T = ${lengthOf(TASK)}, vocabulary ${vocabOf(TASK)}, ` +
      `${TASK.values} values: chance ${(100 * chance).toFixed(1)}%, a guess among the ` +
      `${TASK.pairs} values seen ${(100 * guess).toFixed(0)}%); layers D = ${LAYER.dModel}, ` +
      `H = ${LAYER.heads}, K = V = ${LAYER.keyDim}, short conv; batch ${opts.batch}, ` +
      `AdamW lr ${opts.lr}`,
  );
  const results: RunResult[] = [];
  const notes: string[] = [];
  for (const run of runs as Run[]) {
    if (steps[run] === 0) continue;
    if (run === "gpu") {
      const why = await hasAdapter();
      if (why) {
        notes.push(`gpu arm skipped: ${why}`);
        console.error(`gpu arm skipped: ${why}`);
        continue;
      }
    }
    const r = await train(run, steps[run], opts);
    results.push(r);
    if (r.calls.declined > 0) {
      notes.push(`${run}: ${r.calls.declined} of ${r.calls.asked} KDA calls ran another arm`);
    }
    for (const d of r.declines) {
      notes.push(`${run} declined: ${d}`);
      console.error(`[${run}] declined: ${d}`);
    }
  }

  // the gpu arm against the cpu arm over the steps they share (same model, data and schedule)
  const agreement: string[] = [];
  const cpu = results.find((r) => r.run === "cpu"), gpu = results.find((r) => r.run === "gpu");
  if (cpu && gpu) {
    const n = Math.min(cpu.losses.length, gpu.losses.length);
    let worst = 0;
    for (let i = 0; i < n; i++) worst = Math.max(worst, Math.abs(gpu.losses[i] - cpu.losses[i]));
    agreement.push(`gpu vs cpu over ${n} steps: max |Δloss| = ${worst.toExponential(2)}`);
  }

  const describe = (r: RunResult) =>
    `${r.layers} layer${r.layers > 1 ? "s" : ""}, ${r.arm} arm (${r.dtype})`;
  const svg = chartSvg([
    {
      title: "Training loss: two layers against one",
      xLabel: "step",
      yLabel: "cross-entropy (nats)",
      curves: results.map((r): Curve => ({
        label: describe(r),
        color: COLORS[r.run],
        dash: r.run === "gpu" ? "5 3" : undefined,
        points: r.losses.map((l, i) => [i + 1, l] as [number, number]),
      })),
      notes: [
        ...results.map((r) =>
          `${describe(r)}: ${r.losses.length} steps, held-out accuracy ${
            (100 * r.heldOut).toFixed(1)
          }%`
        ),
        `chance ${(100 * chance).toFixed(1)}%, a guess among the values seen ${
          (100 * guess).toFixed(0)
        }%`,
        ...agreement,
        ...notes,
      ],
    },
  ]);
  if (values.out !== undefined) {
    await Deno.writeTextFile(values.out, svg);
    console.error(`wrote ${values.out}`);
  }
  for (const r of results) {
    console.log(
      `${describe(r)}: ${r.losses.length} steps, final loss ${r.losses.at(-1)!.toFixed(4)}, ` +
        `held-out accuracy ${(100 * r.heldOut).toFixed(1)}% on ${EVAL_SEQUENCES * TASK.pairs} ` +
        `queries, ${fmtTime(r.seconds)}`,
    );
  }
  for (const a of agreement) console.log(a);
}

if (import.meta.main) await main();
