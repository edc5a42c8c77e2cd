// `deno task fuzz`: the adversarial sweep of tests/_adversarial.ts at full size (2,000 cases by
// default): ops against cpu in f64 and, with an adapter, gpu against cpu on the same f32 bytes.
// Then the candidate sweep of tests/_candidate_fuzz.ts (500 random op candidate files by default
// and a tenth as many layer ones, each with its mutations). Exits 1 on any disagreement or
// candidate failure, 2 on a usage error.
//
//   deno task fuzz [--cases N] [--seed S] [--no-gpu] [--candidates N]

import { parseArgs } from "node:util";
import { gpuStatus } from "../kda/gpu/mod.ts";
import { checkCase, type Disagreement, edgeCase } from "./_adversarial.ts";
import { candidateSweep } from "./_candidate_fuzz.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    cases: { type: "string", default: "2000" },
    seed: { type: "string", default: "1" },
    "no-gpu": { type: "boolean", default: false },
    candidates: { type: "string", default: "500" },
  },
  strict: true,
});
const cases = Number(values.cases), seed = Number(values.seed);
if (!Number.isInteger(cases) || cases < 1 || !Number.isInteger(seed)) {
  console.error(
    `fuzz: --cases must be a positive integer and --seed an integer: got ${values.cases}, ${values.seed}`,
  );
  Deno.exit(2);
}
const status = await gpuStatus();
const gpu = !values["no-gpu"] && status.available;
console.log(
  `fuzz: ${cases} cases, seed ${seed}; gpu arm ${
    gpu ? `on ${status.available ? status.info.description : ""}` : "not compared"
  }${!values["no-gpu"] && !status.available ? ` (${status.reason})` : ""}`,
);
const started = performance.now();
const failures: Disagreement[] = [];
const conditioned: string[] = [];
const worst: Record<string, number> = {};
for (let i = 0; i < cases; i++) {
  const c = edgeCase(seed, i);
  const result = await checkCase(c, gpu);
  failures.push(...result.disagreements);
  conditioned.push(...result.conditioned);
  for (const line of result.conditioned) console.log(`ILL-CONDITIONED ${line}`);
  for (const [pair, w] of Object.entries(result.worst)) {
    worst[pair] = Math.max(worst[pair] ?? 0, Number.isNaN(w) ? Infinity : w);
  }
  for (const d of result.disagreements) {
    console.log(`DISAGREE ${d.label} ${d.pair} ${d.tensor}: ${d.detail}`);
  }
  if ((i + 1) % 100 === 0 || i + 1 === cases) {
    const elapsed = (performance.now() - started) / 1000;
    const eta = elapsed / (i + 1) * (cases - i - 1);
    console.error(`[${elapsed.toFixed(0)} s] ${i + 1}/${cases} cases, ETA ${eta.toFixed(0)} s`);
  }
}
for (const [pair, w] of Object.entries(worst)) {
  console.log(`worst ${pair}: max|a−b|/max|b| = ${w.toExponential(2)}`);
}
console.log(
  `fuzz: ${cases} cases, ${failures.length} disagreements, ${conditioned.length} ill-conditioned tensors within 16× what f32 attains on them`,
);

// ---- the candidate sweep (checks/candidate.ts): valid files agree, wrong ones never do, malformed
// ones are refused by name ----
async function candidateSection(): Promise<number> {
  const files = Number(values.candidates);
  if (!Number.isInteger(files) || files < 0) {
    console.error(`fuzz: --candidates must be a non-negative integer: got ${values.candidates}`);
    Deno.exit(2);
  }
  const begun = performance.now();
  const { cases, failures } = await candidateSweep(
    seed,
    files,
    (line) => console.log(`CANDIDATE ${line}`),
  );
  console.log(
    `fuzz: ${files} op and ${
      Math.ceil(files / 10)
    } layer candidate files, ${cases} cases, ${failures.length} failures (${
      ((performance.now() - begun) / 1000).toFixed(0)
    } s)`,
  );
  return failures.length;
}
const candidateFailures = await candidateSection();

Deno.exit(failures.length === 0 && candidateFailures === 0 ? 0 : 1);
