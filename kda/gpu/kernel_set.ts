// What a kernel set is: one value that declares everything the encode path needs to run it, so
// that a set can be added, proved and timed beside the others without touching the rest of the
// gpu arm. A set names its WGSL files and the shared WGSL it includes, the adapter features and
// limits it needs, its buffers (their region tables, what call arrays they hold, how long they
// live), its bindings, and the stages of each direction (entry point, grid, whether it is a scan
// dispatched once per chunk range, or a stage run slice by slice with its neighbours). The layout
// module (layout.ts) generates each set's WGSL header from this value; device.ts compiles and
// caches each set's pipelines; job.ts and encode.ts run any set without knowing its stages.
// docs/kda.md 3.2 says how to add one.

import type { ChunkSize, KdaDims } from "../_types.ts";
import type { AccessorDecl } from "./accessors.ts";

// ---- symbolic sizes: what a buffer's layout is written in (layout.ts evaluates them) ----

/** A dimension a size may depend on: B, T, H, K, V, C, or a set's own (a `Params` field). */
export type Sym = string;
/** coefficient · product of dims */
export type Term = readonly [number, ...Sym[]];
/** A sum of terms. */
export type Size = readonly Term[];
/** Dimension values to evaluate a size at. */
export type DimValues = Readonly<Record<Sym, number>>;

/** One named region of a buffer (or of its per-chunk block). */
export interface Region {
  /** The region's name; the WGSL function is `prefix + name`. */
  name: string;
  /** Its length in elements. */
  size: Size;
}

/** A buffer layout: regions in order, packed without gaps. */
export interface RegionTable {
  /** Prefix of the generated WGSL offset functions. */
  prefix: string;
  /** Name of the generated WGSL function returning the total size, if any. */
  sizeFn?: string;
  /** The regions, in order. */
  regions: readonly Region[];
}

/** The arrays a call moves in and out, by the op's names. */
export type ArrayName =
  | "q"
  | "k"
  | "v"
  | "g"
  | "beta"
  | "h0"
  | "o"
  | "ht"
  | "dout"
  | "dht"
  | "dq"
  | "dk"
  | "dv"
  | "dg"
  | "dbeta"
  | "dh0";

/** The call arrays that flow into the kernels (inputs and cotangents). */
export const IN_ARRAYS: ReadonlySet<ArrayName> = new Set([
  "q",
  "k",
  "v",
  "g",
  "beta",
  "h0",
  "dout",
  "dht",
]);

/**
 * The flags the encode path sets on every set: an initial state is given, a final-state cotangent
 * is given, the forward saves what a backward needs.
 */
export type StandardFlag = "HAS_H0" | "HAS_DHT" | "SAVE_STATES";

/** One binding of group 0, as the WGSL declares it. */
export interface BindingDecl {
  /** The WGSL variable's name. */
  readonly name: string;
  /** Its binding type. */
  readonly type: "uniform" | "read-only-storage" | "storage";
  /** Its WGSL type, e.g. `array<f32>`. */
  readonly wgsl: string;
  /** What it holds, for the generated comment. */
  readonly doc: string;
}

/** How long a buffer lives. */
export type Lifetime =
  /** Made by a forward and freed after it. */
  | "forward"
  /** Made by a forward and kept, when a backward will follow, for every backward on it. */
  | "saved"
  /** Made by a backward and freed after it. */
  | "backward";

/** One buffer of a set. */
export interface BufferDecl {
  /** The buffer's name (labels, messages). */
  readonly name: string;
  /** Its layout; for a per-chunk buffer, the layout of one (b, h, chunk) block. */
  readonly table: RegionTable;
  /** Whether the table is repeated once per (b, h, chunk) block. */
  readonly perChunk: boolean;
  /** Element type (its bytes are applied once, where the buffer is made: bytesOf). */
  readonly dtype: "f32" | "u32";
  /** How long it lives. */
  readonly lifetime: Lifetime;
  /**
   * The call arrays it holds, by region name: inputs and cotangents are placed there before the
   * passes, outputs and gradients are taken from there after them.
   */
  readonly arrays?: Readonly<Partial<Record<string, ArrayName>>>;
  /** A forward buffer needed only when a backward will follow (a placeholder is bound otherwise). */
  readonly onlyWhenSaving?: boolean;
  /**
   * A forward buffer needed only when the forward returns its outputs (a placeholder is bound
   * otherwise): one that only {@linkcode StageDecl.onlyOutputs} stages use.
   */
  readonly onlyForOutputs?: boolean;
  /** Contents the buffer starts with, made from the plan (a chunk table, say). */
  readonly init?: (plan: Plan) => Uint32Array;
  /** Whether a call needs the buffer at all (default: always; else a placeholder is bound). */
  readonly when?: (plan: Plan) => boolean;
  /**
   * For a per-chunk buffer: whether it holds the blocks of one slice of the chunks only (the
   * sliced stages' scratch, {@linkcode StageDecl.sliced}), not of every chunk.
   */
  readonly perSlice?: boolean;
}

/** One compute stage: an entry point and how it is dispatched. */
export interface StageDecl {
  /** The WGSL entry point, named like the stage of kda/chunk.ts it computes. */
  readonly entry: string;
  /** The workgroup grid [x, y, z] for a call's plan. */
  grid(plan: Plan): [number, number, number];
  /**
   * What each dimension of the grid counts, for the reason a shape over the device's limit on
   * workgroups per dimension gets (default: chunks (or V tiles) per sequence, heads, batch entries).
   */
  readonly axes?: readonly [string, string, string];
  /**
   * A sequential scan, dispatched once per chunk range of {@linkcode KernelSet.scanRanges} (in
   * reverse order in the backward); the range arrives in group 1. A scan that is also
   * {@linkcode StageDecl.sliced} is dispatched once per slice instead (a slice spans no more of a
   * sequence's chunks than the longest scan range), and each sequence takes its own chunks in it.
   */
  readonly scan?: boolean;
  /**
   * A stage dispatched once per slice of the chunks ({@linkcode Plan.slices}: the slice's run
   * of positions [n0, n1) in slice order arrives in group 1). The sliced stages
   * next to each other run slice by slice, all of them on one slice before the next (from the
   * last slice in the backward), so that a per-slice buffer holds one slice's blocks at a time.
   */
  readonly sliced?: boolean;
  /** Marked sections of the stage, for the profile by subtraction (bench/ablate.ts). */
  readonly sections?: readonly string[];
  /**
   * The bindings the stage uses, when it uses only some of the set's (its layout then holds those
   * alone, so that a set may declare more bindings than one stage may have); default all.
   */
  readonly uses?: readonly string[];
  /** Whether a call runs the stage at all (default: always). */
  readonly when?: (plan: Plan) => boolean;
  /**
   * Whether the stage computes nothing but the call's outputs, which a forward run only for its
   * backward (a `kdaVjp` on device tensors, which returns no outputs) leaves out: nothing after
   * it may read what it writes.
   */
  readonly onlyOutputs?: boolean;
}

/** One direction (forward or backward): its stages in order and which buffer each binding gets. */
export interface DirectionDecl {
  /** The stages, in order. */
  readonly stages: readonly StageDecl[];
  /** Buffer names by binding name; a binding not listed gets a placeholder buffer. */
  readonly bind: Readonly<Record<string, string>>;
}

/** The shape of one call as the kernels see it. */
export interface Plan extends KdaDims {
  /** Chunk size. */
  readonly C: ChunkSize;
  /** Query/key heads (H is the value heads the kernels run; HQ = H unless they are grouped). */
  readonly HQ: number;
  /** Sequences: B, or the packed batch's count. */
  readonly N: number;
  /** Chunks of all sequences together (B · NC, or Σ ⌈len / C⌉ of a packed batch). */
  readonly NCT: number;
  /** The packed offsets, for a set that takes packed batches natively. */
  readonly cuSeqlens?: Int32Array;
  /** Chunks per sequence (the longest sequence's, for a packed batch). */
  readonly NC: number;
  /** (b, h, chunk) blocks. */
  readonly chunks: number;
  /** Chunk blocks a per-slice buffer holds: the longest slice's (NCT where the set does not slice). */
  readonly sliceChunks: number;
  /**
   * The slices of the sliced stages, as runs [p0, p1) of positions of the call's chunks in slice
   * order (by index within their sequence, then by sequence: `sliceOrder` in layout.ts).
   */
  readonly slices: readonly (readonly [number, number])[];
  /** Symbol values for the region tables' sizes (B, T, H, K, V, C and the set's own). */
  readonly dims: DimValues;
  /** The set's own derived values (e.g. a scan tile), which also become `Params` fields. */
  readonly extra: Readonly<Record<string, number>>;
}

/** The limits of a device that a set's plan is checked against. */
export interface SetLimits {
  /** Bytes of one storage binding. */
  maxStorageBufferBindingSize: number;
  /** Bytes of one buffer. */
  maxBufferSize: number;
  /** Workgroups per dispatch dimension. */
  maxComputeWorkgroupsPerDimension: number;
}

/** What a kernel set declares. */
export interface KernelSet {
  /** Its name, as callers ask for it (`kernels` option, `KDA_GPU_KERNELS`). */
  readonly name: string;
  /** One line for people: what the set is and when it is the one to pick. */
  readonly description: string;
  /** Its WGSL files, in the order their text is joined (any order compiles: WGSL needs none). */
  readonly files: readonly URL[];
  /** Shared WGSL it includes, by name (see SHARED_WGSL in device.ts). */
  readonly include: readonly string[];
  /** Adapter features it needs. */
  readonly features: readonly GPUFeatureName[];
  /**
   * What its kernels take natively: grouped value heads (q, k read at head j / (HV / H), dq, dk
   * summed per group) and packed batches (chunks walked per sequence). What a set does not take
   * natively the gpu arm's glue passes provide (kda/gpu/glue.ts).
   */
  readonly native: { readonly groupedHeads: boolean; readonly packed: boolean };
  /** Invocations per workgroup of its kernels (`WG` in the WGSL header). */
  readonly workgroupSize: number;
  /** Invocations of its largest workgroup, where a stage declares more than workgroupSize. */
  readonly largestWorkgroup?: number;
  /** Bytes of workgroup memory its hungriest kernel declares. */
  readonly workgroupBytes: number;
  /** Constants of its WGSL header, by name (u32). */
  readonly constants: Readonly<Record<string, number>>;
  /**
   * Flag bits of the `flags` parameter, by name: at least the three the encode path sets
   * (STANDARD_FLAGS), and any the set uses itself.
   */
  readonly flags: Readonly<Record<StandardFlag, number>> & Readonly<Record<string, number>>;
  /** Flag bits of the set's own that a call's plan sets (beyond the standard ones). */
  planFlags?(plan: Plan): number;
  /** The `Params` uniform's fields, in order: dims and extras (u32), `flags` (u32), `scale` (f32). */
  readonly params: readonly string[];
  /** Its buffers. */
  readonly buffers: readonly BufferDecl[];
  /** Its group-0 bindings, in binding order. */
  readonly bindings: readonly BindingDecl[];
  /** The vec4 accessors its WGSL uses, generated per buffer (accessors.ts). */
  readonly accessors: readonly AccessorDecl[];
  /** The forward. */
  readonly forward: DirectionDecl;
  /** The backward, or null for a forward-only set. */
  readonly backward: DirectionDecl | null;
  /** The set's own plan values (tiles and the like) for a call's dims. */
  extra(dims: KdaDims, C: ChunkSize): Record<string, number>;
  /** The chunk ranges of successive scan dispatches (half-open, ascending, covering 0..NC). */
  scanRanges(plan: Plan): [number, number][];
  /**
   * The most chunks a slice of the sliced stages may hold for a call (at least 1; NCT or more is
   * one slice, unless a sliced scan's span cuts it); absent where the set has no sliced stage.
   */
  sliceChunks?(plan: Omit<Plan, "sliceChunks" | "slices">): number;
  /** Why the set cannot run this call's shape, or null (limits are checked apart, generically). */
  whyNot(dims: KdaDims, C: ChunkSize): string | null;
}

const SETS = new Map<string, KernelSet>();

/**
 * Adds a kernel set to the ones callers can name. Sets of the package register themselves when
 * their module loads; a test registers its own to show that sets are pluggable.
 *
 * @param set The set.
 * @example
 * ```ts
 * import { kernelSetNames } from "./kernel_set.ts";
 * import "./kernels/mod.ts";
 * console.log(kernelSetNames()); // ["fused", ...]
 * ```
 */
export function registerKernelSet(set: KernelSet): void {
  if (!/^[a-z][a-z0-9-]*$/.test(set.name)) {
    throw new RangeError(`set.name must be lower-case letters, digits and dashes: got ${set.name}`);
  }
  if (SETS.has(set.name) && SETS.get(set.name) !== set) {
    throw new RangeError(`set.name must be new: a kernel set named ${set.name} exists`);
  }
  SETS.set(set.name, set);
}

/**
 * The registered kernel sets' names, in registration order.
 *
 * @returns The names.
 * @example
 * ```ts
 * import "./kernels/mod.ts";
 * console.log(kernelSetNames().includes("fused")); // true
 * ```
 */
export function kernelSetNames(): string[] {
  return [...SETS.keys()];
}

/**
 * A registered kernel set by name, or a RangeError naming the known ones.
 *
 * @param name The set's name.
 * @param what The argument's name, for the message.
 * @returns The set.
 * @example
 * ```ts
 * import "./kernels/mod.ts";
 * console.log(kernelSet("fused").forward.stages.length); // 2
 * ```
 */
export function kernelSet(name: unknown, what = "options.kernels"): KernelSet {
  const set = typeof name === "string" ? SETS.get(name) : undefined;
  if (set === undefined) {
    throw new RangeError(
      `${what} must be one of ${kernelSetNames().join(", ")}: got ${String(name)}`,
    );
  }
  return set;
}
