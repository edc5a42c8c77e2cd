// The "recurrent" kernel set: decoding, the plain recurrence of docs/kda.md 2.1 over T ≥ 1
// tokens from a state, with no chunking (flash-linear-attention's fused_recurrent_kda is the same
// algorithm). One workgroup per (batch entry, head, tile of V columns); each column's K × 1 slice
// of the state is split over NS lanes that hold it in registers (16 channels each), and the
// tokens run in sequence inside the kernel, one reduction over the lanes per token. Forward only:
// fla's fused_recurrent_kda has no backward either. It takes grouped value heads through the glue
// passes (kda/gpu/glue.ts); decoding calls carry no packed batch.

import type { ChunkSize, KdaDims } from "../../../_types.ts";
import type { RegionTable, Size } from "../../layout.ts";
import type { KernelSet, Plan } from "../../kernel_set.ts";
// each dispatch covers as many tokens as keep an invocation under llvmpipe's loop budget
import { LOOP_BUDGET, WORKGROUP_SIZE } from "../_plan.ts";

/** State channels each lane holds in registers (four vec4s). */
export const CHANNELS_PER_LANE = 16;

const TOKQK: Size = [[1, "B", "T", "H", "K"]];
const TOKV: Size = [[1, "B", "T", "H", "V"]];
const STATE: Size = [[1, "B", "H", "K", "V"]];

/** One buffer of one array: a table of one region. */
const whole = (region: string, size: Size): RegionTable => ({
  prefix: "r",
  regions: [{ name: region, size }],
});

/** The lanes that share one state column: the power of two that covers K at 16 channels each. */
function lanesPerColumn(K: number): number {
  let NS = 1;
  while (NS * CHANNELS_PER_LANE < K) NS *= 2;
  return NS;
}

/** Loop iterations one invocation runs per token: the token loop and the reduction over lanes. */
function loopsPerToken(plan: Plan): number {
  return plan.extra.NS + 2;
}

const ARRAYS = [
  ["q", "Q", TOKQK],
  ["k", "K", TOKQK],
  ["v", "V", TOKV],
  ["g", "G", TOKQK],
  ["beta", "Beta", [[1, "B", "T", "H"]] as Size],
  ["h0", "H0", STATE],
  ["o", "O", TOKV],
  ["ht", "Ht", STATE],
] as const;

/**
 * The decode kernel set (see the module comment).
 *
 * @example
 * ```ts
 * console.log(RECURRENT.forward.stages.map((s) => s.entry)); // ["recurrentScan"]
 * ```
 */
export const RECURRENT: KernelSet = {
  name: "recurrent",
  description: "the plain recurrence for decoding (T >= 1 tokens from a state): one workgroup " +
    "per (batch entry, head, V tile), the state in registers; forward only",
  files: [new URL("./recurrent.wgsl", import.meta.url)],
  include: ["shared"],
  features: [],
  native: { groupedHeads: false, packed: false },
  workgroupSize: WORKGROUP_SIZE,
  workgroupBytes: WORKGROUP_SIZE * 8,
  constants: {},
  flags: { HAS_H0: 1, HAS_DHT: 2, SAVE_STATES: 4 },
  params: ["B", "T", "H", "K", "V", "C", "NC", "NS", "BV", "nVT", "flags", "scale"],
  buffers: ARRAYS.map(([array, region, size]) => ({
    name: array,
    table: whole(region, size),
    perChunk: false,
    dtype: "f32" as const,
    lifetime: "forward" as const,
    arrays: { [region]: array },
  })),
  bindings: ARRAYS.map(([name]) => ({
    name,
    type: name === "o" || name === "ht" ? "storage" as const : "read-only-storage" as const,
    wgsl: "array<f32>",
    doc: name,
  })),
  accessors: [],
  forward: {
    stages: [{
      entry: "recurrentScan",
      grid: (plan) => [plan.extra.nVT, plan.H, plan.B],
      scan: true,
    }],
    bind: Object.fromEntries(ARRAYS.map(([name]) => [name, name])),
  },
  backward: null,
  extra(dims: KdaDims, _C: ChunkSize) {
    const NS = lanesPerColumn(dims.K);
    const BV = WORKGROUP_SIZE / NS;
    return { NS, BV, nVT: Math.ceil(dims.V / BV) };
  },
  scanRanges(plan: Plan) {
    // The state passes from one dispatch to the next through ht.
    const tokens = Math.max(1, Math.floor((LOOP_BUDGET - 64) / loopsPerToken(plan)));
    const chunksPer = Math.max(1, Math.floor(tokens / plan.C));
    const ranges: [number, number][] = [];
    for (let n0 = 0; n0 < plan.NC; n0 += chunksPer) {
      ranges.push([n0, Math.min(plan.NC, n0 + chunksPer)]);
    }
    return ranges;
  },
  whyNot: () => null,
};
