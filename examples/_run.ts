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
  const n = Number(text);
  if (!Number.isInteger(n) || n < 0) {
    throw new RangeError(`--${name} must be a non-negative integer: got ${text}`);
  }
  return n;
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
