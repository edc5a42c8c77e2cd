// The results of a gpu call (kda/gpu/call.ts): their shapes and the lengths of the typed arrays a
// call reads back, the buffers that hold them (DeviceTensors a caller owns, or the call's scratch),
// and what its run reads back (the results, then the flags of its value checks).

import { BufferSet } from "./buffers.ts";
import type { GpuContext } from "./device.ts";
import { bytesOf } from "./layout.ts";
import { DeviceTensor, type GpuTensor } from "./tensor.ts";
import { type Layout, scratchTensor } from "./_call_view.ts";
import type { ReadPiece } from "./readback.ts";
import type { FreshArrays } from "./fresh_arrays.ts";
import type { CallChecks } from "./range_checks.ts";
import { sizeOf } from "../../tape/mod.ts";

/** A call's dimensions as its results have them (the caller's: B, T, H, HV, K, V and N). */
export type ResultDims = Pick<Layout, "B" | "T" | "H" | "HV" | "K" | "V" | "N">;

/** The gradients a backward returns, in order, with their shapes. */
export function gradShapes(layout: ResultDims, gate: { aLog?: unknown; dtBias?: unknown } | null) {
  const { B, T, H, HV, K, V, N } = layout;
  return {
    dq: [B, T, H, K],
    dk: [B, T, H, K],
    dv: [B, T, HV, V],
    dg: [B, T, HV, K],
    dbeta: [B, T, HV],
    dh0: [N, HV, K, V],
    ...(gate?.aLog ? { daLog: [HV] } : {}),
    ...(gate?.dtBias ? { ddtBias: [HV * K] } : {}),
  } as Record<"dq" | "dk" | "dv" | "dg" | "dbeta" | "dh0" | "daLog" | "ddtBias", number[]>;
}

/**
 * The lengths of the typed arrays a call reads back, in order: its outputs (o, and ht with the
 * final state), or a backward's gradients (with those of aLog and dtBias where the gate in the
 * kernel has them). A caller that starts making them early (freshArrays) asks for these.
 *
 * @param dims The call's B, T, H, HV, K, V and N (sequences).
 * @param what The outputs with or without the final state, or the gradients with the gate's.
 * @returns The lengths.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { resultLengths } from "./_call_results.ts";
 * const dims = { B: 1, T: 4, H: 1, HV: 1, K: 2, V: 3, N: 1 };
 * assert.deepEqual(resultLengths(dims, { grads: false, finalState: true }), [12, 6]);
 * ```
 */
export function resultLengths(
  dims: ResultDims,
  what:
    | { grads: false; finalState: boolean }
    | { grads: true; gate: { aLog: boolean; dtBias: boolean } | null },
): number[] {
  const { B, T, HV, K, V, N } = dims;
  if (what.grads) return Object.values(gradShapes(dims, what.gate)).map(sizeOf);
  return what.finalState ? [B * T * HV * V, N * HV * K * V] : [B * T * HV * V];
}

/** Arrays a caller started (freshArrays), checked to be of the lengths the call reads back. */
export function startedArrays(
  started: FreshArrays | undefined,
  lengths: number[],
  what: string,
): FreshArrays | undefined {
  if (started === undefined) return undefined;
  if (started.lengths.join() !== lengths.join()) {
    started.cancel();
    throw new Error(
      `internal: ${what} started with lengths [${started.lengths.join(", ")}], the call reads ` +
        `back [${lengths.join(", ")}]`,
    );
  }
  return started;
}

/**
 * The buffers of a call's results: DeviceTensors the caller will own (pooled or new) for a call on
 * device tensors, else the call's own scratch, read back and freed with it.
 */
export function allocate<N extends string>(
  ctx: GpuContext,
  scratch: BufferSet,
  device: boolean,
  shapes: Record<N, number[]>,
): Record<N, GpuTensor> {
  const out = {} as Record<N, GpuTensor>;
  for (const [name, shape] of Object.entries(shapes) as [N, number[]][]) {
    const bytes = bytesOf(sizeOf(shape), "f32");
    out[name] = device
      ? new DeviceTensor(ctx, BufferSet.acquire(ctx.device, name, bytes), shape)
      : scratchTensor(scratch, name, shape);
  }
  return out;
}

/** Whole-buffer readbacks of results, in order. */
function readsOf(tensors: GpuTensor[]): ReadPiece[] {
  return tensors.map((t) => ({
    buffer: t.buffer,
    offset: 0,
    bytes: bytesOf(sizeOf(t.shape), "f32"),
  }));
}

/**
 * What a call reads back, for its job's run: nothing on device tensors (`into` undefined); from
 * typed arrays its results, into `into`, and after them the flags of its value checks where any
 * ran. `settle` reports those flags and gives the results' arrays alone, in order.
 */
export function resultReads(
  results: GpuTensor[],
  into: FreshArrays | undefined,
  checks: CallChecks | undefined,
): {
  run: { reads: ReadPiece[]; into?: FreshArrays };
  settle(arrays: Float32Array[]): Float32Array[];
} {
  if (into === undefined) return { run: { reads: [] }, settle: (arrays) => arrays };
  const flags = checks?.ran === true ? checks : undefined;
  return {
    run: { reads: [...readsOf(results), ...(flags !== undefined ? [flags.read()] : [])], into },
    settle(arrays) {
      if (flags !== undefined) flags.report(arrays.pop()!);
      return arrays;
    },
  };
}

/** Releases the DeviceTensors among a call's results (after a failure). */
export function releaseAll(tensors: Record<string, GpuTensor>): void {
  for (const t of Object.values(tensors)) if (t instanceof DeviceTensor) t.release();
}
