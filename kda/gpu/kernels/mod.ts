// The kernel sets of the package, registered by name, and the rule that picks one when a call
// names none (docs/kda.md 3.2); decoding calls run the recurrent set. A new set is a folder beside
// fused/ with its WGSL files and a module that declares it (kernel_set.ts), registered here.

import { kernelSet, registerKernelSet } from "../kernel_set.ts";
import { readyContext } from "../device.ts";
import { FUSED } from "./fused/mod.ts";
import { SPLIT } from "./split/mod.ts";
import { RECURRENT } from "./recurrent/mod.ts";

registerKernelSet(FUSED);
registerKernelSet(SPLIT);
registerKernelSet(RECURRENT);

/** The set decoding calls run (kdaStep, the layer's step): the plain recurrence, forward only. */
export const DECODE_KERNELS: string = RECURRENT.name;

/**
 * The kernel set a training call (a forward, or a forward with its backward) runs when neither
 * `options.kernels` nor `KDA_GPU_KERNELS` names one: the split set on every adapter. It is the
 * faster set per training step on the H200 (bench/results/REPORT.md), and the only one that runs
 * packed batches and grouped value heads without padding or copies, which is why it is also the
 * default on software adapters, where the fused set is now the faster at the shapes measured
 * (llvmpipe: its staged scans cost more there than they save). The fused set stays selectable by
 * name.
 *
 * @param info Whether the adapter is a software one (the rule is the same for both today).
 * @returns The set's name and, when the rule is worth telling, why.
 * @example
 * ```ts
 * defaultKernels({ software: true }).name; // "split"
 * defaultKernels({ software: false }).name; // "split"
 * ```
 */
export function defaultKernels(info: { software: boolean }): { name: string; note: string | null } {
  void info;
  return { name: SPLIT.name, note: null };
}

/**
 * The kernel set a call runs: the one it names, else the rule of {@linkcode defaultKernels} for
 * this adapter (synchronous: the device's kind is known once it exists).
 *
 * @param kernels The set the call names, if any.
 * @returns The set's name, and the note worth recording when the rule chose it.
 * @example
 * ```ts
 * chooseKernels("fused").name; // "fused"
 * ```
 */
export function chooseKernels(kernels: string | undefined): { name: string; note: string | null } {
  if (kernels !== undefined) return { name: kernelSet(kernels).name, note: null };
  const ctx = readyContext();
  return defaultKernels({ software: typeof ctx === "string" ? false : ctx.info.software });
}
