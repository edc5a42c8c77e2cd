// What the candidate checker's test files share: a candidate written and read back as the CLI
// reads it, the CLI run on candidate bytes given on stdin, and a correct layer candidate.

import { KdaModule } from "../mod.ts";
import {
  bf16Bits,
  bf16Value,
  readSafetensors,
  type SafetensorsInput,
  writeSafetensors,
} from "../io/mod.ts";

/**
 * A candidate's tensors written to safetensors and read back.
 *
 * @param m The tensors.
 * @returns The file as the checker reads it.
 */
export const roundTrip = (m: Map<string, SafetensorsInput>) => readSafetensors(writeSafetensors(m));

/**
 * `prove --candidate -` on these bytes, in a child process.
 *
 * @param bytes The candidate file.
 * @param args More flags.
 * @returns Its exit code and output.
 */
export async function cli(bytes: Uint8Array, ...args: string[]) {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-env",
      "--allow-read",
      "checks/cli.ts",
      "--candidate",
      "-",
      ...args,
    ],
    env: { NO_COLOR: "1" },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(bytes);
  await writer.close();
  const out = await child.output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

/** The small layer of the layer-candidate tests. */
export const LAYER_CONFIG = { dModel: 8, heads: 2, keyDim: 4, valueDim: 4, decayRank: 2 };

/**
 * A correct layer candidate from the f64 layer's run on the cpu arm, every tensor stored in
 * `dtype`.
 *
 * @param dtype The file's dtype.
 * @returns The layer, the file's tensors, and the input gradient (not in the file).
 */
export async function layerCandidate(dtype: "F32" | "BF16" = "F32") {
  const layer = new KdaModule(LAYER_CONFIG);
  const round = dtype === "BF16" ? (x: number) => bf16Value(bf16Bits(x)) : Math.fround;
  for (const p of layer.parameters().values()) p.data.set(p.data.map(round));
  const [b, t] = [1, 20];
  const x = Float64Array.from({ length: b * t * 8 }, (_, i) => round(Math.sin(i)));
  const dy = Float64Array.from({ length: b * t * 8 }, (_, i) => round(Math.cos(i)));
  const run = await layer.vjp(x, [b, t], dy, { arm: "cpu" });
  const file = new Map<string, SafetensorsInput>([
    ["x", { data: x, shape: [b, t, 8], dtype }],
    ["dy", { data: dy, shape: [b, t, 8], dtype }],
    ["y", { data: run.y, shape: [b, t, 8], dtype }],
  ]);
  for (const [name, p] of layer.parameters()) {
    file.set(name, { data: p.data, shape: [...p.shape], dtype });
    file.set(`grad/${name}`, { data: run.grads.get(name)!, shape: [...p.shape], dtype });
  }
  return { layer, file, dx: run.dx };
}
