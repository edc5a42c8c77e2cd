/**
 * A worked example: train a small {@linkcode KdaModule} with short convolution on synthetic
 * associative recall (key–value pairs, then the keys again as queries; the target at each query is
 * the value paired with its key), with a hand-differentiated linear readout and AdamW. It runs the
 * same training on the cpu arm, the gpu arm and (for the first steps) the f64 ops arm, prints
 * progress with an ETA to stderr, reports recall accuracy on held-out sequences, and, with
 * `--out FILE`, writes the loss curves side by side as an SVG (nothing is written without it).
 *
 * ```sh
 * deno run --allow-env --allow-read --allow-write=examples examples/recall.ts \
 *   [--steps 300] [--gpu-steps 100] [--ops-steps 10] [--arm-set cpu,gpu,ops] [--seed 0] \
 *   [--dtype f64|f32] [--out examples/recall_loss.svg]
 * ```
 *
 * `--out examples/recall_loss.svg` redraws the chart the README shows.
 *
 * The layer is the one of docs/kda.md 2.4; the arms are those of docs/kda.md 3.
 *
 * @example Usage
 * ```ts ignore
 * // deno task example:recall --steps 300 --out examples/recall_loss.svg
 * ```
 *
 * @module
 */

import { parseArgs } from "node:util";
import { type Arm, KdaModule, resetSeamCounts, seamCounts, seamDecisions } from "../mod.ts";
import { Tensor } from "../tape/mod.ts";
import { AdamW } from "../optim/mod.ts";
import {
  embed,
  makeBatch,
  makeEmbedding,
  readout,
  type RecallBatch,
  type RecallShape,
  uniform,
} from "./_recall_task.ts";
import { chartSvg, type Curve } from "./_svg.ts";
import { checkOut, count, fmtTime, hasAdapter, positive, schedule } from "./_run.ts";
import { argsOrExit } from "../bench/_args.ts";

const HELP = `Usage: examples/recall.ts [flags]
  --steps N        training steps of the cpu arm (default 300)
  --gpu-steps N    training steps of the gpu arm, a slow software adapter here (default 100)
  --ops-steps N    training steps of the f64 ops arm (default 10)
  --arm-set LIST   arms to run, comma-separated from cpu, gpu, ops (default cpu,gpu,ops)
  --dtype f64|f32  element type of the cpu arm's run (default f64; the gpu arm is always f32)
  --batch N        sequences per step (default 32)
  --lr X           peak AdamW learning rate (default 0.01)
  --seed N         seed of the layer, the embedding and the data (default 0)
  --out FILE       write the SVG of the loss curves to FILE (default: none is written;
                   examples/recall_loss.svg is the chart the README shows)`;

/** The task and the layer: 16 keys, 16 values, 8 pairs (T = 24), so chance is 1/16. */
const SHAPE: RecallShape = { keys: 16, values: 16, pairs: 8, dModel: 32 };
const LAYER = {
  dModel: SHAPE.dModel,
  heads: 2,
  keyDim: 16,
  valueDim: 16,
  decayRank: 8,
  chunkSize: 16 as const,
  shortConv: true,
};
const EVAL_SEQUENCES = 512;

interface RunResult {
  arm: Arm;
  dtype: "f64" | "f32";
  losses: number[];
  accuracies: number[];
  heldOut: number;
  seconds: number;
  declines: string[];
  /** KDA op calls of the run, and how many ran another arm than the one asked. */
  calls: { asked: number; declined: number };
}

async function train(
  arm: Arm,
  dtype: "f64" | "f32",
  steps: number,
  opts: { seed: number; batch: number; lr: number; scheduleSteps: number },
): Promise<RunResult> {
  const make = (n: number): Float64Array | Float32Array =>
    dtype === "f64" ? new Float64Array(n) : new Float32Array(n);
  const cast = (a: Float64Array) => dtype === "f64" ? a : Float32Array.from(a);
  const layer = new KdaModule({ ...LAYER, seed: opts.seed }, { dtype });
  const embedding = makeEmbedding(SHAPE, opts.seed + 1);
  const initW = uniform(opts.seed + 2);
  const W = new Tensor(
    make(SHAPE.values * SHAPE.dModel).map(() => (2 * initW() - 1) / Math.sqrt(SHAPE.dModel)),
    [SHAPE.values, SHAPE.dModel],
  );
  const bias = new Tensor(make(SHAPE.values), [SHAPE.values]);
  const params = layer.parameters();
  params.set("readout.weight", W).set("readout.bias", bias);
  const opt = new AdamW(params, { lr: opts.lr, weightDecay: 0 });
  const data = uniform(opts.seed + 3);
  const runOpts = { arm, quiet: true, checkParameters: false };
  resetSeamCounts();
  const losses: number[] = [], accuracies: number[] = [];
  const t0 = performance.now();
  let lastPrint = 0;
  for (let s = 0; s < steps; s++) {
    const batch = makeBatch(SHAPE, opts.batch, data);
    const x = embed(batch, embedding, SHAPE.dModel, make);
    const dims: [number, number] = [batch.B, batch.T];
    const y = await layer.forward(x, dims, runOpts);
    const r = readout(y, batch, W.data, bias.data, SHAPE.dModel);
    const { grads } = await layer.vjp(x, dims, cast(r.dy), runOpts);
    const all = new Map<string, Float64Array | Float32Array>(grads);
    all.set("readout.weight", r.dW).set("readout.bias", r.db);
    opt.lr = schedule(s, opts.scheduleSteps, opts.lr);
    opt.step(all);
    losses.push(r.loss);
    accuracies.push(r.accuracy);
    const now = performance.now();
    if (now - lastPrint > 2000 || s === steps - 1) {
      lastPrint = now;
      const elapsed = (now - t0) / 1000, eta = elapsed / (s + 1) * (steps - s - 1);
      console.error(
        `[${arm} ${dtype}] step ${s + 1}/${steps}  loss ${r.loss.toFixed(4)}  ` +
          `batch acc ${(100 * r.accuracy).toFixed(1)}%  ${fmtTime(elapsed)} elapsed, ` +
          `ETA ${fmtTime(eta)}`,
      );
    }
  }
  const seconds = (performance.now() - t0) / 1000;
  const { asked, declined } = seamCounts();
  const heldOut = await evaluate(layer, embedding, W.data, bias.data, make, opts.seed + 4, arm);
  const declines = [
    ...new Set(seamDecisions().filter((d) => d.ran !== d.wanted).map((d) => d.reason)),
  ];
  return { arm, dtype, losses, accuracies, heldOut, seconds, declines, calls: { asked, declined } };
}

/** Recall accuracy on fresh sequences from a stream the training never saw. */
async function evaluate(
  layer: KdaModule,
  embedding: Float64Array,
  W: Float64Array | Float32Array,
  bias: Float64Array | Float32Array,
  make: (n: number) => Float64Array | Float32Array,
  seed: number,
  arm: Arm,
): Promise<number> {
  const rand = uniform(seed);
  let correct = 0, total = 0;
  for (let done = 0; done < EVAL_SEQUENCES; done += 128) {
    const batch: RecallBatch = makeBatch(SHAPE, 128, rand);
    const x = embed(batch, embedding, SHAPE.dModel, make);
    const y = await layer.forward(x, [batch.B, batch.T], { arm, quiet: true });
    const r = readout(y, batch, W, bias, SHAPE.dModel);
    correct += r.accuracy * batch.queries.length;
    total += batch.queries.length;
  }
  return correct / total;
}

const COLORS: Record<Arm, string> = { cpu: "#1f77b4", gpu: "#d62728", ops: "#2ca02c" };

async function main(): Promise<void> {
  const { values, steps, opts, arms, cpuDtype } = argsOrExit("example:recall", () => {
    const { values } = parseArgs({
      args: Deno.args,
      options: {
        steps: { type: "string", default: "300" },
        "gpu-steps": { type: "string", default: "100" },
        "ops-steps": { type: "string", default: "10" },
        "arm-set": { type: "string", default: "cpu,gpu,ops" },
        dtype: { type: "string", default: "f64" },
        batch: { type: "string", default: "32" },
        lr: { type: "string", default: "0.01" },
        seed: { type: "string", default: "0" },
        out: { type: "string" },
        help: { type: "boolean", default: false },
      },
    });
    const arms = values["arm-set"].split(",").map((a) => a.trim()).filter(Boolean);
    for (const a of arms) {
      if (a !== "cpu" && a !== "gpu" && a !== "ops") {
        throw new RangeError(`--arm-set must list arms from cpu, gpu, ops: got ${a}`);
      }
    }
    if (values.dtype !== "f64" && values.dtype !== "f32") {
      throw new RangeError(`--dtype must be f64 or f32: got ${values.dtype}`);
    }
    const lr = Number(values.lr);
    if (!(lr > 0 && Number.isFinite(lr))) {
      throw new RangeError(`--lr must be a positive number: got ${values.lr}`);
    }
    const steps: Record<Arm, number> = {
      cpu: count("steps", values.steps),
      gpu: count("gpu-steps", values["gpu-steps"]),
      ops: count("ops-steps", values["ops-steps"]),
    };
    // every arm follows the same schedule and data, so the shorter runs are prefixes of the cpu run
    const opts = {
      seed: count("seed", values.seed),
      batch: positive("batch", values.batch),
      lr,
      scheduleSteps: Math.max(steps.cpu, steps.gpu, steps.ops),
    };
    if (values.out !== undefined) checkOut(values.out);
    const cpuDtype: "f64" | "f32" = values.dtype;
    return { values, steps, opts, arms, cpuDtype };
  });
  if (values.help) {
    console.log(HELP);
    return;
  }
  console.error(
    `associative recall: ${SHAPE.keys} keys, ${SHAPE.values} values, ${SHAPE.pairs} pairs ` +
      `(T = ${3 * SHAPE.pairs}, chance ${(100 / SHAPE.values).toFixed(1)}%); layer D = ` +
      `${LAYER.dModel}, H = ${LAYER.heads}, K = V = ${LAYER.keyDim}, short conv; ` +
      `batch ${opts.batch}, AdamW lr ${opts.lr}`,
  );
  const results: RunResult[] = [];
  const notes: string[] = [];
  for (const arm of arms as Arm[]) {
    if (steps[arm] === 0) continue;
    if (arm === "gpu") {
      const why = await hasAdapter();
      if (why) {
        notes.push(`gpu arm skipped: ${why}`);
        console.error(`gpu arm skipped: ${why}`);
        continue;
      }
    }
    const dtype = arm === "gpu" ? "f32" : arm === "ops" ? "f64" : cpuDtype;
    const r = await train(arm, dtype, steps[arm], opts);
    results.push(r);
    if (r.calls.declined > 0) {
      notes.push(`${arm}: ${r.calls.declined} of ${r.calls.asked} KDA calls ran another arm`);
    }
    for (const d of r.declines) {
      notes.push(`${arm} declined: ${d}`);
      console.error(`[${arm} ${dtype}] declined: ${d}`);
    }
    console.error(
      `[${arm} ${dtype}] done: ${steps[arm]} steps in ${fmtTime(r.seconds)}, final loss ` +
        `${r.losses.at(-1)!.toFixed(4)}, held-out recall accuracy ${(100 * r.heldOut).toFixed(1)}%`,
    );
  }

  // how closely the arms' losses agree over the steps they share (same data, same schedule)
  const agreement: string[] = [];
  const cpu = results.find((r) => r.arm === "cpu");
  for (const r of results) {
    if (!cpu || r === cpu) continue;
    const n = Math.min(r.losses.length, cpu.losses.length);
    let worst = 0;
    for (let i = 0; i < n; i++) worst = Math.max(worst, Math.abs(r.losses[i] - cpu.losses[i]));
    agreement.push(
      `${r.arm} vs cpu over ${n} steps: max |Δloss| = ${
        worst === 0 ? "0 (bit-identical losses)" : worst.toExponential(2)
      }`,
    );
  }
  for (const a of agreement) console.error(a);

  const curve = (r: RunResult, upTo = Infinity, dash?: string): Curve => ({
    label: `${r.arm} arm (${r.dtype})`,
    color: COLORS[r.arm],
    dash,
    points: r.losses.slice(0, upTo).map((l, i) => [i + 1, l] as [number, number]),
  });
  const first = Math.max(...results.filter((r) => r.arm === "ops").map((r) => r.losses.length), 8);
  const svg = chartSvg([
    {
      title: "Training loss, cpu arm and gpu arm",
      xLabel: "step",
      yLabel: "cross-entropy (nats)",
      curves: results.filter((r) => r.arm !== "ops").map((r) =>
        curve(r, Infinity, r.arm === "gpu" ? "5 3" : undefined)
      ),
      notes: [
        ...results.filter((r) => r.arm !== "ops").map((r) =>
          `${r.arm}: ${r.losses.length} steps, held-out accuracy ${(100 * r.heldOut).toFixed(1)}%`
        ),
        ...notes,
      ],
    },
    {
      title: `The first ${first} steps, every arm`,
      xLabel: "step",
      yLabel: "cross-entropy (nats)",
      curves: results.map((r) =>
        curve(r, first, r.arm === "gpu" ? "5 3" : r.arm === "ops" ? "2 2" : undefined)
      ),
      notes: agreement,
      yFromZero: false,
    },
  ]);
  if (values.out !== undefined) {
    await Deno.writeTextFile(values.out, svg);
    console.error(`wrote ${values.out}`);
  }
  for (const r of results) {
    console.log(
      `${r.arm} arm (${r.dtype}): ${r.losses.length} steps, final loss ${
        r.losses.at(-1)!.toFixed(4)
      }, held-out recall accuracy ${(100 * r.heldOut).toFixed(1)}% ` +
        `(chance ${(100 / SHAPE.values).toFixed(1)}%), ${fmtTime(r.seconds)}`,
    );
  }
  for (const a of agreement) console.log(a);
}

if (import.meta.main) await main();
