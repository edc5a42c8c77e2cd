// Gating shared by every test that needs the GPU: without an adapter such a test prints why and is
// ignored, unless KDA_REQUIRE_GPU=1 (as CI sets it), which makes it fail instead of skipping.

import { gpuStatus } from "../kda/gpu/mod.ts";
import { gpuDebug } from "../kda/gpu/_debug.ts";

/** The adapter, or why there is none, read once per test file. */
export const status: Awaited<ReturnType<typeof gpuStatus>> = await gpuStatus();
/** Whether a missing adapter must fail the GPU tests. */
export const requireGpu: boolean = Deno.env.get("KDA_REQUIRE_GPU") === "1";

/**
 * Registers a GPU test: ignored without an adapter (the reason printed once per file), failed if
 * the GPU is required; also ignored (reported as such, never as passed) where `options.ignore`
 * says the adapter cannot show what the test is about.
 */
export function gpuTest(
  name: string,
  fn: () => Promise<void>,
  options: { ignore?: boolean } = {},
): void {
  Deno.test({
    name,
    ignore: (!status.available && !requireGpu) || options.ignore === true,
    // The device's lost promise stays pending for the life of the process, by design.
    sanitizeOps: false,
    sanitizeResources: false,
    fn: async () => {
      if (!status.available) throw new Error(`KDA_REQUIRE_GPU=1 but no GPU: ${status.reason}`);
      await fn();
    },
  });
}

/** Prints, once per file, why that file's GPU tests will not run (or must fail). */
export function reportMissingGpu(file: string): void {
  if (status.available) return;
  console.log(
    `${file}: no GPU (${status.reason}); ` +
      (requireGpu ? "KDA_REQUIRE_GPU=1, so its GPU tests fail" : "its GPU tests are ignored"),
  );
}

/**
 * Runs a script in a fresh Deno process (`deno eval`), for what one process cannot show: a
 * second process's bits, or what happens at exit.
 */
export async function runChild(
  script: string,
  ext: "js" | "ts" = "js",
): Promise<{ success: boolean; code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", `--ext=${ext}`, script],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  return {
    success: out.success,
    code: out.code,
    stdout: text.decode(out.stdout),
    stderr: text.decode(out.stderr),
  };
}

let prefillDepth = 0;

/**
 * Runs `fn` with every buffer the gpu arm makes prefilled with NaN, so that a missing write cannot
 * pass as a zero; calls may overlap (the switch stays on until the last one ends).
 */
export async function withNaNPrefill<T>(fn: () => Promise<T>): Promise<T> {
  prefillDepth++;
  gpuDebug.prefillNaN = true;
  try {
    return await fn();
  } finally {
    prefillDepth--;
    gpuDebug.prefillNaN = prefillDepth > 0;
  }
}
