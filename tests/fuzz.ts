// `deno task fuzz`: the adversarial sweeps at full size. The op's edge sweep (tests/_adversarial.ts,
// 2,000 cases by default: regular, packed with zero-length sequences, grouped value heads, strong
// gates), ops against cpu in f64 and, with an adapter, gpu against cpu on the same f32 bytes; the
// decode sweep (tests/_adversarial_step.ts, 500 cases); and the state-dict sweep
// (tests/_adversarial_state.ts, 3,000 cases: valid and invalid dicts, checkpoints and optimizer
// steps); then the candidate sweep of tests/_candidate_fuzz.ts (500 random op candidate files by
// default and a tenth as many layer ones, each with its mutations). Exits 1 on any disagreement or
// failure, 2 on a usage error.
//
//   deno task fuzz [--cases N] [--step-cases N] [--state-cases N] [--candidates N] [--seed S]
//                  [--no-gpu] [--sweep all|edge|step|state|candidate]

import { parseArgs } from "node:util";
import { gpuStatus } from "../kda/gpu/mod.ts";
import { checkCase, type Disagreement, edgeCase } from "./_adversarial.ts";
import { checkStepCase, stepCase } from "./_adversarial_step.ts";
import { checkStateCase, stateCase } from "./_adversarial_state.ts";
import { candidateSweep } from "./_candidate_fuzz.ts";

const USAGE = "deno task fuzz [--cases N] [--step-cases N] [--state-cases N] [--candidates N] " +
  "[--seed S] [--no-gpu] [--sweep all|edge|step|state|candidate]";
let parsed;
try {
  parsed = parseArgs({
    args: Deno.args,
    options: {
      cases: { type: "string", default: "2000" },
      "step-cases": { type: "string", default: "500" },
      "state-cases": { type: "string", default: "3000" },
      candidates: { type: "string", default: "500" },
      seed: { type: "string", default: "1" },
      sweep: { type: "string", default: "all" },
      "no-gpu": { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
    strict: true,
  });
} catch (error) {
  console.error(`fuzz: ${(error as Error).message}; usage: ${USAGE}`);
  Deno.exit(2);
}
const { values } = parsed;
if (values.help) {
  console.log(USAGE);
  Deno.exit(0);
}
// decimal digits only: an empty value must not read as 0 and check nothing
const integer = (text: string) => /^-?\d+$/.test(text) ? Number(text) : NaN;
const counts = [values.cases, values["step-cases"], values["state-cases"], values.candidates]
  .map(integer);
const seed = integer(values.seed);
const sweeps = ["all", "edge", "step", "state", "candidate"];
if (
  !counts.every((n) => Number.isInteger(n) && n >= 0) || !Number.isInteger(seed) ||
  !sweeps.includes(values.sweep)
) {
  console.error(
    `fuzz: --cases, --step-cases, --state-cases and --candidates must be non-negative ` +
      `integers, --seed an integer and --sweep one of ${sweeps.join(", ")}: got ` +
      `${values.cases}, ${values["step-cases"]}, ${values["state-cases"]}, ` +
      `${values.candidates}, ${values.seed}, ${values.sweep}`,
  );
  Deno.exit(2);
}
const run = (sweep: string) => values.sweep === "all" || values.sweep === sweep;
const [edgeCases, stepCases, stateCases, candidateFiles] = counts;
const status = await gpuStatus();
const gpu = !values["no-gpu"] && status.available;
console.log(
  `fuzz: seed ${seed}; gpu arm ${
    gpu ? `on ${status.available ? status.info.description : ""}` : "not compared"
  }${!values["no-gpu"] && !status.available ? ` (${status.reason})` : ""}`,
);
const failures: Disagreement[] = [];
const conditioned: string[] = [];
const worst: Record<string, number> = {};

/** Runs `n` cases of one sweep, printing progress, disagreements and ill-conditioned tensors. */
async function sweep(
  name: string,
  n: number,
  one: (i: number) => Promise<
    { disagreements: Disagreement[]; worst: Record<string, number>; conditioned: string[] }
  >,
) {
  const started = performance.now();
  for (let i = 0; i < n; i++) {
    const result = await one(i);
    failures.push(...result.disagreements);
    conditioned.push(...result.conditioned);
    for (const line of result.conditioned) console.log(`ILL-CONDITIONED ${line}`);
    for (const [pair, w] of Object.entries(result.worst)) {
      worst[pair] = Math.max(worst[pair] ?? 0, Number.isNaN(w) ? Infinity : w);
    }
    for (const d of result.disagreements) {
      console.log(`DISAGREE ${d.label} ${d.pair} ${d.tensor}: ${d.detail}`);
    }
    if ((i + 1) % 100 === 0 || i + 1 === n) {
      const elapsed = (performance.now() - started) / 1000;
      const eta = elapsed / (i + 1) * (n - i - 1);
      console.error(
        `[${elapsed.toFixed(0)} s] ${name}: ${i + 1}/${n} cases, ETA ${eta.toFixed(0)} s`,
      );
    }
  }
}

if (run("edge")) await sweep("edge", edgeCases, (i) => checkCase(edgeCase(seed, i), gpu));
if (run("step")) await sweep("step", stepCases, (i) => checkStepCase(stepCase(seed, i), gpu));
if (run("state")) {
  await sweep("state", stateCases, (i) => {
    const c = stateCase(seed, i);
    const lines = checkStateCase(c);
    return Promise.resolve({
      disagreements: lines.map((detail) => ({
        label: c.label,
        pair: "state dict",
        tensor: "",
        detail,
      })),
      worst: {},
      conditioned: [],
    });
  });
}
// The candidate sweep (checks/candidate.ts): valid files agree, wrong ones never do, malformed ones
// are refused by name.
if (run("candidate")) {
  const begun = performance.now();
  const { cases, failures: bad } = await candidateSweep(
    seed,
    candidateFiles,
    (line) => console.log(`CANDIDATE ${line}`),
  );
  for (const detail of bad) {
    failures.push({
      label: "candidate",
      pair: "candidate sweep",
      tensor: "",
      detail: String(detail),
    });
  }
  console.log(
    `fuzz: ${candidateFiles} op and ${
      Math.ceil(candidateFiles / 10)
    } layer candidate files, ${cases} cases, ${bad.length} failures (${
      ((performance.now() - begun) / 1000).toFixed(0)
    } s)`,
  );
}
for (const [pair, w] of Object.entries(worst)) {
  console.log(`worst ${pair}: max|a−b|/max|b| = ${w.toExponential(2)}`);
}
const ran = [
  run("edge") && `${edgeCases} edge`,
  run("step") && `${stepCases} decode`,
  run("state") && `${stateCases} state-dict`,
].filter(Boolean).join(", ");
console.log(
  `fuzz: ${ran} cases, ${failures.length} disagreements or failures, ${conditioned.length} ` +
    "ill-conditioned tensors within 16× what f32 attains on them",
);
Deno.exit(failures.length === 0 ? 0 : 1);
