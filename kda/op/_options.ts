// The in-kernel options of the op (docs/kda.md 2.8), checked once at the public boundary: the
// flags flash-linear-attention passes to chunk_kda and fused_recurrent_kda, camelCased, and the
// rules that tie them to the arrays (aLog and dtBias only with the gate in the kernel, beta's
// range without the sigmoid). The arrays themselves are checked for type, shape and finiteness
// with the other arrays (kda/op/_check.ts); what is checked here is what depends on the options.

import type { Float, InKernel, KdaProblem } from "../_types.ts";
import { checkOptionalBoolean, typeName } from "../../base/check.ts";
import type { ComputeDType } from "../../base/dtype.ts";
import { ValueChecks } from "./_value_checks.ts";

/** The in-kernel options' names, as `kda`, `kdaVjp` and `kdaStep` take them. */
export const IN_KERNEL_KEYS: readonly string[] = [
  "useQkL2NormInKernel",
  "useGateInKernel",
  "lowerBound",
  "useBetaSigmoidInKernel",
  "allowNegEigval",
];

/**
 * Reads the in-kernel options of an options object whose keys were already checked.
 *
 * @param o The options.
 * @param finalState Whether `outputFinalState` is one of the call's options (kda, kdaVjp; a
 *   decode step always returns its state).
 * @returns `inKernel`, the options resolved (undefined when no processing applies: the op's
 *   plain path), and `allowNegEigval`, which also widens beta's range without the sigmoid.
 * @example
 * ```ts
 * import { checkInKernel } from "./_options.ts";
 * const o = { useBetaSigmoidInKernel: true, allowNegEigval: true };
 * checkInKernel(o, true).inKernel?.betaSigmoid; // 2
 * ```
 */
export function checkInKernel(
  o: Record<string, unknown>,
  finalState: boolean,
): { inKernel: InKernel | undefined; allowNegEigval: boolean } {
  const l2norm = checkOptionalBoolean("options.useQkL2NormInKernel", o.useQkL2NormInKernel) ??
    false;
  const gateOn = checkOptionalBoolean("options.useGateInKernel", o.useGateInKernel) ?? false;
  const sigmoid =
    checkOptionalBoolean("options.useBetaSigmoidInKernel", o.useBetaSigmoidInKernel) ??
      false;
  const negative = checkOptionalBoolean("options.allowNegEigval", o.allowNegEigval) ?? false;
  const keepState = finalState
    ? checkOptionalBoolean("options.outputFinalState", o.outputFinalState) ?? true
    : true;
  let lowerBound: number | null = null;
  if (o.lowerBound !== undefined) {
    const lb = o.lowerBound;
    if (typeof lb !== "number" || !Number.isFinite(lb) || !(lb < 0)) {
      throw new RangeError(
        `options.lowerBound must be a finite negative number (a log decay): got ${
          typeof lb === "number" ? lb : typeName(lb)
        }`,
      );
    }
    if (!gateOn) {
      throw new TypeError(
        "options.lowerBound must be absent without options.useGateInKernel (it selects the " +
          `in-kernel gate's form): got ${lb}`,
      );
    }
    lowerBound = lb;
  }
  if (!l2norm && !gateOn && !sigmoid && keepState) {
    return { inKernel: undefined, allowNegEigval: negative };
  }
  return {
    inKernel: {
      l2norm,
      // which of aLog and dtBias the call has is filled in by checkInKernelArrays
      gate: gateOn ? { lowerBound, aLog: false, dtBias: false } : null,
      betaSigmoid: sigmoid ? (negative ? 2 : 1) : 0,
      finalState: keepState,
    },
    allowNegEigval: negative,
  };
}

/** The largest aLog whose exp is finite in a compute dtype (e^x overflows past it). */
const ALOG_MAX: Readonly<Record<ComputeDType, number>> = { f64: 709.78, f32: 88 };

/**
 * Checks what depends on the in-kernel options in a checked problem, and completes its `gate`
 * with which of aLog and dtBias were given. Host arrays are checked element by element; a
 * problem on the device is checked for presence only (reading its elements would be a host sync).
 *
 * @param problem The checked problem (arrays already of the right type, length, finite).
 * @param inKernel The checked options, or undefined.
 * @param allowNegEigval Whether `allowNegEigval` was set (it widens beta's range to [0, 2] when
 *   beta is given after its activation).
 * @param what The argument holding the arrays, for messages ("inputs", "token").
 * @param dtype The call's compute dtype, or undefined for a problem on the device.
 * @param checks Where the host arrays' values are checked (default: at once).
 * @returns The options as the arms see them (undefined when none applies).
 * @example
 * ```ts
 * import { checkInKernelArrays } from "./_options.ts";
 * const one = (x: number) => new Float64Array([x]);
 * const p = { B: 1, T: 1, H: 1, K: 1, V: 1, scale: 1, q: one(1), k: one(1), v: one(1), g: one(0),
 *   beta: one(1.5) };
 * checkInKernelArrays(p, undefined, true, "inputs", "f64"); // RangeError: beta above 1 needs it
 * ```
 */
export function checkInKernelArrays(
  problem: KdaProblem<unknown>,
  inKernel: InKernel | undefined,
  allowNegEigval: boolean,
  what: string,
  dtype: ComputeDType | undefined,
  checks: ValueChecks = new ValueChecks(),
): InKernel | undefined {
  const gate = inKernel?.gate ?? null;
  for (const name of ["aLog", "dtBias"] as const) {
    if (gate === null && problem[name] !== undefined) {
      throw new TypeError(
        `${what}.${name} must be absent without options.useGateInKernel (the gate is then g ` +
          `itself): got ${typeName(problem[name])}`,
      );
    }
  }
  if (gate !== null && problem.aLog === undefined && gate.lowerBound === null) {
    throw new TypeError(
      `${what}.aLog must be given with options.useGateInKernel unless options.lowerBound is set ` +
        "(the gate is −exp(aLog)·softplus(g + dtBias)): got undefined",
    );
  }
  if (dtype !== undefined) {
    const host = problem as KdaProblem<Float>;
    if (host.aLog !== undefined) {
      const max = ALOG_MAX[dtype];
      checks.check(host.aLog, -Infinity, max, (v, i) =>
        new RangeError(
          `${what}.aLog must be at most ${max} (its exp must be finite in ${dtype}): got ` +
            `${v} at index ${i}`,
        ));
    }
    if ((inKernel?.betaSigmoid ?? 0) === 0) {
      const hi = allowNegEigval ? 2 : 1;
      checks.check(host.beta, 0, hi, (v, i) =>
        new RangeError(
          `${what}.beta must be in [0, ${hi}] (a write strength${
            allowNegEigval ? "" : "; [0, 2] with options.allowNegEigval"
          }; set options.useBetaSigmoidInKernel for raw logits): got ${v} at index ${i}`,
        ));
    }
  }
  if (dtype === undefined && inKernel !== undefined) {
    // the in-kernel passes read these arrays in place on the device
    const read = [
      ...(inKernel.l2norm ? ["q", "k"] : []),
      ...(gate !== null ? ["g", "aLog", "dtBias"] : []),
      ...(inKernel.betaSigmoid !== 0 ? ["beta"] : []),
    ] as const;
    for (const name of read) {
      const t = (problem as unknown as Record<string, { buffer: GPUBuffer } | undefined>)[name];
      if (t !== undefined && (t.buffer.usage & GPUBufferUsage.STORAGE) === 0) {
        throw new TypeError(
          `${what}.${name}.buffer must have STORAGE usage with the in-kernel options (their ` +
            `passes read it in place): got usage ${t.buffer.usage}`,
        );
      }
    }
  }
  if (inKernel === undefined) return undefined;
  return {
    ...inKernel,
    gate: gate === null
      ? null
      : { ...gate, aLog: problem.aLog !== undefined, dtBias: problem.dtBias !== undefined },
  };
}
