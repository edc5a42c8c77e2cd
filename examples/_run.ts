// What the training examples share: their flag parsing of step counts, the learning-rate
// schedule, how a run's time prints, and whether a WebGPU adapter exists for the gpu arm's run.

/**
 * A flag's value as a count of steps.
 *
 * @param name The flag, without its dashes.
 * @param text Its value.
 * @returns The count (0 allowed: that run is skipped).
 */
export function count(name: string, text: string): number {
  // decimal digits only: Number() would also take "1e3", "0x10" and " 12 "
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(Number(text))) {
    throw new RangeError(`--${name} must be a non-negative integer: got ${text}`);
  }
  return Number(text);
}

/**
 * A flag's value as a positive count (a batch: 0 would train on nothing).
 *
 * @param name The flag, without its dashes.
 * @param text Its value.
 * @returns The count.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { positive } from "./_run.ts";
 * assert.equal(positive("batch", "32"), 32);
 * assert.throws(() => positive("batch", "0"), RangeError);
 * ```
 */
export function positive(name: string, text: string): number {
  const n = count(name, text);
  if (n === 0) throw new RangeError(`--${name} must be a positive integer: got ${text}`);
  return n;
}

/**
 * Whether this process may write the file `--out` names, asked before a run of minutes (a prompt,
 * where Deno may prompt, comes now), so that a path the run's permissions do not cover fails at
 * once instead of after the training.
 *
 * @param out The path.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkOut } from "./_run.ts";
 * // the doc tests run without write permission and without a prompt
 * assert.throws(() => checkOut("examples/x.svg"), RangeError);
 * ```
 */
export function checkOut(out: string): void {
  const state = Deno.permissions.requestSync({ name: "write", path: out }).state;
  if (state !== "granted") {
    throw new RangeError(
      `--out must name a file this run may write (the example:* tasks allow examples/): got ${out}`,
    );
  }
}

/**
 * Seconds as people read them.
 *
 * @param s Seconds.
 * @returns "12 s" or "3 min 4 s".
 */
export function fmtTime(s: number): string {
  return s < 60 ? `${s.toFixed(0)} s` : `${Math.floor(s / 60)} min ${(s % 60).toFixed(0)} s`;
}

/**
 * Linear warm-up over the first 10% of steps, then cosine decay to a tenth of the peak.
 *
 * @param step The step, from 0.
 * @param steps The steps of the run.
 * @param peak The peak learning rate.
 * @returns The step's learning rate.
 */
export function schedule(step: number, steps: number, peak: number): number {
  const warm = Math.max(1, Math.round(0.1 * steps));
  if (step < warm) return peak * (step + 1) / warm;
  const t = (step - warm) / Math.max(1, steps - warm);
  return peak * (0.1 + 0.45 * (1 + Math.cos(Math.PI * t)));
}

/**
 * Why the gpu arm's run cannot happen here, or undefined when an adapter exists.
 *
 * @returns The reason, or undefined.
 */
export async function hasAdapter(): Promise<string | undefined> {
  try {
    const adapter = await navigator.gpu?.requestAdapter();
    if (!adapter) return "no WebGPU adapter on this machine";
  } catch (e) {
    return `no WebGPU adapter: ${(e as Error).message}`;
  }
  return undefined;
}
