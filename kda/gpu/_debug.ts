// The gpu arm's test and bench switches, in one object outside every production signature: the
// tests set them (NaN prefill, an injected fault) and the benchmark's ablation profile sets the
// shader transform; production code only reads them.

/**
 * Switches for tests and benchmarks (not exported from mod.ts).
 *
 * @example
 * ```ts
 * import { gpuDebug } from "./_debug.ts";
 * gpuDebug.prefillNaN = true; // every buffer a call makes starts as NaN
 * gpuDebug.prefillNaN = false;
 * ```
 */
export const gpuDebug: {
  /** Fill every buffer a call creates with NaN first, so that a missing write cannot pass as 0. */
  prefillNaN: boolean;
  /** A fault to inject into the next error-scope check. */
  nextScopeError: "out-of-memory" | null;
  /** A transform of each kernel set's WGSL, applied when its pipelines are next compiled. */
  shaderTransform: ((code: string, set: string) => string) | null;
  /** Bytes of scratch a slice of the split set's sliced stages may hold (null: its own). */
  sliceBytes: number | null;
  /** Chunks of a sequence one dispatch of the split set's scans may take (null: its own). */
  scanChunks: number | null;
} = {
  prefillNaN: false,
  nextScopeError: null,
  shaderTransform: null,
  sliceBytes: null,
  scanChunks: null,
};
