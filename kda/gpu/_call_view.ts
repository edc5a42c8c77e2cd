// The kernel set's view of a call: the call's layout (what the set takes natively, and what the
// glue passes expand or pad for it: grouped value heads, packed batches), the dims the set then
// sees, and the glue passes that turn the caller's arrays into that view and the set's results
// back into the caller's (kda/gpu/glue.ts, docs/kda.md 3.2).

import type { BufferSet } from "./buffers.ts";
import type { ExtraPass } from "./encode.ts";
import type { Glue } from "./glue.ts";
import type { JobArrays } from "./job.ts";
import type { ArrayName, KernelSet } from "./kernel_set.ts";
import { bytesOf } from "./layout.ts";
import type { GpuTensor } from "./tensor.ts";

/** The call's layout beyond the set's view: grouped heads and packing the glue provides. */
export interface Layout {
  /** The caller's dims. */
  B: number;
  T: number;
  H: number;
  HV: number;
  K: number;
  V: number;
  /** Sequences (the leading axis of h0 and ht). */
  N: number;
  /** Value heads per query/key head, expanded by the glue (1: none, or the set takes them). */
  expand: number;
  /** The packed offsets, when the glue pads them to [N, Tmax] (on the device once uploaded). */
  padded: { cuSeqlens: Int32Array; Tmax: number; offsets: GPUBuffer | null } | null;
  /** The packed offsets, when the set walks the packed batch itself. */
  packed: Int32Array | null;
}

/** The layout of a call's dims on a set: what the glue must expand or pad. */
export function layoutFor(
  set: KernelSet,
  x: { B: number; T: number; H: number; K: number; V: number; HV?: number; cuSeqlens?: Int32Array },
): Layout {
  const HV = x.HV ?? x.H;
  const cu = x.cuSeqlens;
  let padded: Layout["padded"] = null;
  if (cu !== undefined && !set.native.packed) {
    let Tmax = 1;
    for (let i = 0; i + 1 < cu.length; i++) Tmax = Math.max(Tmax, cu[i + 1] - cu[i]);
    padded = { cuSeqlens: cu, Tmax, offsets: null };
  }
  return {
    B: x.B,
    T: x.T,
    H: x.H,
    HV,
    K: x.K,
    V: x.V,
    N: cu === undefined ? x.B : cu.length - 1,
    expand: HV !== x.H && !set.native.groupedHeads ? HV / x.H : 1,
    padded,
    packed: cu !== undefined && padded === null ? cu : null,
  };
}

/**
 * The dims the set sees: grouped heads expanded and a packed batch padded where the glue does, and
 * the value heads and packed offsets it takes itself. The one view of a call: its limits are
 * checked on it (callProblem) and its job is planned on it, so the two cannot disagree.
 *
 * @param layout The call's layout on the set (layoutFor).
 * @returns B, T and H as the set runs them, with HV and cuSeqlens where it takes them itself.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { layoutFor, viewDims } from "./_call_view.ts";
 * import { kernelSet } from "./kernel_set.ts";
 * import "./kernels/mod.ts";
 * const layout = layoutFor(kernelSet("split"), { B: 1, T: 8, H: 1, HV: 4, K: 4, V: 4 });
 * assert.deepEqual(viewDims(layout), { B: 1, T: 8, H: 1, HV: 4 });
 * ```
 */
export function viewDims(
  layout: Layout,
): { B: number; T: number; H: number; HV?: number; cuSeqlens?: Int32Array } {
  const H = layout.expand > 1 ? layout.HV : layout.H;
  const own = {
    ...(layout.expand === 1 && layout.HV !== layout.H ? { HV: layout.HV } : {}),
    ...(layout.packed !== null ? { cuSeqlens: layout.packed } : {}),
  };
  if (layout.padded === null) return { B: layout.B, T: layout.T, H, ...own };
  return { B: layout.N, T: layout.padded.Tmax, H, ...own };
}

/** A call-scoped tensor view of a scratch buffer (not owned by any DeviceTensor). */
export function scratchTensor(scratch: BufferSet, name: string, shape: number[]): GpuTensor {
  const bytes = bytesOf(shape.reduce((a, b) => a * b, 1), "f32");
  return { buffer: scratch.make(name, bytes), shape, dtype: "f32" };
}

/** Glue passes that turn the caller's arrays into the set's view, and the view's arrays. */
export function glueIn(
  glue: Glue,
  scratch: BufferSet,
  layout: Layout,
  arrays: JobArrays,
): { view: JobArrays; passes: ExtraPass[] } {
  const { B, T, H, HV, K, V } = layout;
  const passes: ExtraPass[] = [];
  const view: JobArrays = { ...arrays };
  if (layout.expand > 1) {
    for (const name of ["q", "k"] as const) {
      const src = view[name];
      if (src === undefined) continue;
      const dst = scratchTensor(scratch, `expanded ${name}`, [B, T, HV, K]);
      passes.push(glue.pass(scratch, "expandHeads", {
        src: src.buffer,
        dst: dst.buffer,
        n: B * T * HV * K,
        width: K,
        g: layout.expand,
      }));
      view[name] = dst;
    }
  }
  const padded = layout.padded;
  if (padded !== null) {
    const Hv = layout.expand > 1 ? HV : H;
    const widths: Partial<Record<ArrayName, number>> = {
      q: Hv * K,
      k: Hv * K,
      v: HV * V,
      g: HV * K,
      beta: HV,
      dout: HV * V,
    };
    for (const [name, width] of Object.entries(widths) as [ArrayName, number][]) {
      const src = view[name];
      if (src === undefined) continue;
      const dst = scratchTensor(scratch, `padded ${name}`, [layout.N, padded.Tmax, width]);
      passes.push(glue.pass(scratch, "padRows", {
        src: src.buffer,
        dst: dst.buffer,
        n: layout.N * padded.Tmax * width,
        width,
        g: padded.Tmax,
        offsets: padded.offsets!,
        seqs: layout.N,
      }));
      view[name] = dst;
    }
  }
  return { view, passes };
}

/**
 * The buffers the set writes its results into, and the glue passes that turn them into the
 * caller's results: unpack a padded batch, then sum the gradient of each group of value heads.
 */
export function glueOut(
  glue: Glue,
  scratch: BufferSet,
  layout: Layout,
  results: Partial<Record<ArrayName, GpuTensor>>,
): { view: JobArrays; passes: ExtraPass[] } {
  const { T, HV, K, V, N } = layout;
  const passes: ExtraPass[] = [];
  const view: JobArrays = {};
  const padded = layout.padded;
  const Hv = layout.expand > 1 ? HV : layout.H;
  const widths: Partial<Record<ArrayName, number>> = {
    o: HV * V,
    dq: Hv * K,
    dk: Hv * K,
    dv: HV * V,
    dg: HV * K,
    dbeta: HV,
  };
  for (const [name, result] of Object.entries(results) as [ArrayName, GpuTensor][]) {
    let target = result;
    if (layout.expand > 1 && (name === "dq" || name === "dk")) {
      // the set's per-value-head gradient, summed over each group into the caller's
      const perHead = scratchTensor(scratch, `per-head ${name}`, [layout.B, T, HV, K]);
      passes.unshift(glue.pass(scratch, "sumHeads", {
        src: perHead.buffer,
        dst: target.buffer,
        n: layout.B * T * layout.H * K,
        width: K,
        g: layout.expand,
      }));
      target = perHead;
    }
    const width = widths[name];
    if (padded !== null && width !== undefined) {
      const rows = scratchTensor(scratch, `padded ${name}`, [N, padded.Tmax, width]);
      // unpacking runs first: it feeds the group sums
      passes.unshift(glue.pass(scratch, "unpadRows", {
        src: rows.buffer,
        dst: target.buffer,
        n: T * width,
        width,
        g: padded.Tmax,
        offsets: padded.offsets!,
        seqs: N,
      }));
      target = rows;
    }
    view[name] = target;
  }
  return { view, passes };
}
