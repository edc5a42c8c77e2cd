// The value checks of a call's host arrays, run on the GPU over the bytes the call uploaded
// (kda/gpu/kernels/range_flags.wgsl): one pass a check, one flag a check, read back with the call's
// results. A call from typed arrays states its checks (every element in a closed interval: finite,
// g <= 0, beta in its range) and leaves the large ones pending (kda/op/_value_checks.ts); the gpu
// arm runs those whose arrays it uploads and reports whether each passed. The caller finds the
// element and its message on the host only when a flag is set, so what was checked is what the
// kernels read, and a call whose values pass never scans them on the host.

import { type GpuContext, wgslText } from "./device.ts";
import { type BufferSet, STORAGE_USAGE, UNIFORM_USAGE } from "./buffers.ts";
import type { ExtraPass } from "./encode.ts";
import type { ReadPiece } from "./readback.ts";
import type { GpuTensor } from "./tensor.ts";
import { compilePipelines, oncePerContext, type Pipelines } from "./_pipelines.ts";

/** One check: every element of `array` lies in [lo, hi] (NaN in no interval). */
export interface RangeCheck {
  /**
   * The array checked: a host array (only Float32Arrays are checked on the device), or a call's
   * snapshot of one on the device (kda/gpu/snapshot.ts).
   */
  readonly array: Float32Array | Float64Array | (GpuTensor & { readonly length: number });
  /** Least value allowed. */
  readonly lo: number;
  /** Greatest value allowed. */
  readonly hi: number;
}

/** A call's pending checks, in order, and where an arm reports those it ran. */
export interface RangeChecks {
  /** The checks still pending (empty once the call has decided them). */
  readonly list: readonly RangeCheck[];
  /**
   * Reports the outcome of check `index` of `list`, run over the bytes the arm computes on.
   *
   * @param index The check's index in `list`.
   * @param passed Whether every element lay in its interval.
   */
  report(index: number, passed: boolean): void;
  /**
   * Decides every pending check on the host now, for an arm that computes on the host arrays
   * themselves (so that it computes nothing on a bad value).
   *
   * @throws {RangeError} The first failing check's error.
   */
  decideNow(): void;
}

const RANGE_URL = new URL("./kernels/range_flags.wgsl", import.meta.url);
const RANGE_WG = 256;

const f32 = new Float32Array(1);
const bits32 = new Uint32Array(f32.buffer);

function bitsOf(x: number): number {
  f32[0] = x;
  return bits32[0];
}

function valueOf(bits: number): number {
  bits32[0] = bits;
  return f32[0];
}

/**
 * The order key of an f32's bits, as range_flags.wgsl forms it: keys of non-NaN floats are
 * ordered as the floats are (-0 just below +0), and NaNs' lie past both infinities'.
 *
 * @param bits The f32's bits, as a u32.
 * @returns The key, as a u32.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { orderKey } from "./range_checks.ts";
 * assert.ok(orderKey(0xbf800000) < orderKey(0x80000000)); // -1 below -0
 * assert.ok(orderKey(0x80000000) < orderKey(0)); // -0 below +0
 * ```
 */
export function orderKey(bits: number): number {
  return (bits & 0x80000000) !== 0 ? ~bits >>> 0 : (bits | 0x80000000) >>> 0;
}

/** The f32 next to a non-NaN f32 towards +Infinity (up) or -Infinity (down). */
function nextF32(x: number, up: boolean): number {
  if (x === 0) return up ? valueOf(1) : valueOf(0x80000001);
  const b = bitsOf(x);
  return valueOf(up === x > 0 ? b + 1 : b - 1);
}

/**
 * The order keys that bound the f32 values in [lo, hi]: the key of the least f32 not below `lo`
 * and of the greatest not above `hi` (-0 and +0 both count as zero, as the host's comparison
 * has them). An interval that holds no f32 gets keys that every element falls outside.
 *
 * @param lo Least value allowed.
 * @param hi Greatest value allowed.
 * @returns The keys, as u32.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { intervalKeys } from "./range_checks.ts";
 * // [0, 1]: from -0's key to 1's
 * assert.deepEqual(intervalKeys(0, 1), { lo: 0x7fffffff, hi: 0xbf800000 });
 * ```
 */
export function intervalKeys(lo: number, hi: number): { lo: number; hi: number } {
  const none = { lo: 1, hi: 0 };
  if (Number.isNaN(lo) || Number.isNaN(hi)) return none;
  let least = Math.fround(lo);
  if (least < lo) least = nextF32(least, true);
  let most = Math.fround(hi);
  if (most > hi) most = nextF32(most, false);
  if (least > most) return none;
  // a zero bound lets both zeros in: from -0 up, to +0 down
  const loKey = least === 0 ? orderKey(0x80000000) : orderKey(bitsOf(least));
  const hiKey = most === 0 ? orderKey(0) : orderKey(bitsOf(most));
  return { lo: loKey, hi: hiKey };
}

const compiledRange = new WeakMap<GpuContext, Promise<Pipelines<"rangeFlags">>>();

async function compile(ctx: GpuContext): Promise<Pipelines<"rangeFlags">> {
  const buffers = ["uniform", "read-only-storage", "storage"] as const;
  const code = await wgslText(RANGE_URL);
  return await compilePipelines(ctx, "value checks", code, buffers, ["rangeFlags"]);
}

/**
 * One call's checks on the device: a flag buffer of one u32 a check (zeroed when made), the passes
 * of the checks whose arrays the call uploads, and the report of those once the flags are read.
 * A forward that reads nothing back hands it to its backward (the gradients' readback carries the
 * flags of both).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { getContext } from "./device.ts";
 * import { BufferSet, upload } from "./buffers.ts";
 * import { stageReads } from "./readback.ts";
 * import { CallChecks } from "./range_checks.ts";
 * const ctx = await getContext();
 * const set = new BufferSet(ctx.device);
 * const q = new Float32Array([0.5, Number.NaN, 2]);
 * const outcomes: [number, boolean][] = [];
 * const checks = {
 *   list: [{ array: q, lo: 0, hi: 4 }],
 *   report: (i: number, ok: boolean) => outcomes.push([i, ok]),
 *   decideNow() {},
 * };
 * const call = (await CallChecks.make(ctx, set, checks))!;
 * const buffer = set.make("q", 16);
 * upload(ctx.device.queue, buffer, 0, q);
 * const encoder = ctx.device.createCommandEncoder();
 * const pass = encoder.beginComputePass();
 * for (const p of call.passes(set, [[q, { buffer, shape: [3], dtype: "f32" }]])) p.encode(pass);
 * pass.end();
 * const staged = stageReads((l, b, u) => set.make(l, b, u), encoder, [call.read()], "flags");
 * ctx.device.queue.submit([encoder.finish()]);
 * await staged.map();
 * call.report(staged.copyOut()[0]);
 * assert.deepEqual(outcomes, [[0, false]]); // the NaN
 * set.destroyAll();
 * ```
 */
export class CallChecks {
  readonly #ctx: GpuContext;
  readonly #compiled: Pipelines<"rangeFlags">;
  readonly #checks: RangeChecks;
  readonly #list: readonly RangeCheck[];
  readonly #ran: number[] = [];
  readonly #flags: GPUBuffer;
  #reported = false;

  private constructor(
    ctx: GpuContext,
    compiled: Pipelines<"rangeFlags">,
    checks: RangeChecks,
    buffers: BufferSet,
  ) {
    this.#ctx = ctx;
    this.#compiled = compiled;
    this.#checks = checks;
    // the list as it was when the call began: indices are reported against it
    this.#list = [...checks.list];
    this.#flags = buffers.make("value check flags", 4 * this.#list.length, STORAGE_USAGE);
    ctx.device.queue.writeBuffer(this.#flags, 0, new Uint32Array(this.#list.length));
  }

  /**
   * The device checks of a call, with its flag buffer in `buffers`; undefined when no check is
   * pending.
   *
   * @param ctx The device context.
   * @param buffers Where the flag buffer lives (it must outlive the read of the flags).
   * @param checks The call's checks.
   * @returns The call's device checks, or undefined.
   */
  static async make(
    ctx: GpuContext,
    buffers: BufferSet,
    checks: RangeChecks | undefined,
  ): Promise<CallChecks | undefined> {
    if (checks === undefined || checks.list.length === 0) return undefined;
    const compiled = await oncePerContext(compiledRange, ctx, compile);
    return new CallChecks(ctx, compiled, checks, buffers);
  }

  /**
   * The passes of the pending checks on these uploaded arrays (each host array with the tensor it
   * was uploaded into), matched by identity; each check runs once. An array larger than one
   * storage binding is checked a binding-sized slice a dispatch.
   *
   * @param scratch The call's buffers (the passes' uniforms go there).
   * @param uploaded Host arrays and their uploads.
   * @returns The passes, in the checks' order.
   */
  passes(
    scratch: BufferSet,
    uploaded:
      readonly (readonly [Float32Array | Float64Array | GpuTensor | undefined, GpuTensor])[],
  ): ExtraPass[] {
    const out: ExtraPass[] = [];
    this.#list.forEach((check, index) => {
      if (check.array instanceof Float64Array || this.#ran.includes(index)) return;
      const upload = uploaded.find(([array]) => array === check.array)?.[1];
      if (upload === undefined) return;
      this.#ran.push(index);
      out.push(...this.#passesOf(scratch, check, index, upload.buffer));
    });
    return out;
  }

  #passesOf(scratch: BufferSet, check: RangeCheck, slot: number, buffer: GPUBuffer): ExtraPass[] {
    const { device } = this.#ctx;
    const { maxStorageBufferBindingSize, maxComputeWorkgroupsPerDimension } = this.#ctx.info.limits;
    const align = device.limits.minStorageBufferOffsetAlignment;
    const slice = Math.floor(maxStorageBufferBindingSize / align) * align / 4;
    const keys = intervalKeys(check.lo, check.hi);
    const n = check.array.length;
    const passes: ExtraPass[] = [];
    for (let at = 0; at < n; at += slice) {
      const count = Math.min(slice, n - at);
      const params = scratch.make("value check params", 16, UNIFORM_USAGE);
      device.queue.writeBuffer(params, 0, new Uint32Array([count, keys.lo, keys.hi, slot]));
      const bindGroup = device.createBindGroup({
        label: "value check",
        layout: this.#compiled.layout,
        entries: [
          { binding: 0, resource: { buffer: params } },
          { binding: 1, resource: { buffer, offset: 4 * at, size: 4 * count } },
          { binding: 2, resource: { buffer: this.#flags } },
        ],
      });
      const groups = Math.min(Math.ceil(count / RANGE_WG), maxComputeWorkgroupsPerDimension);
      const pipeline = this.#compiled.pipelines.get("rangeFlags")!;
      passes.push({
        label: "value check",
        encode(pass) {
          pass.setPipeline(pipeline);
          pass.setBindGroup(0, bindGroup);
          pass.dispatchWorkgroups(groups);
        },
      });
    }
    return passes;
  }

  /** Whether any check has its passes (so the flags are worth reading). */
  get ran(): boolean {
    return this.#ran.length > 0;
  }

  /**
   * The read of the flags, for the submit after the last pass.
   *
   * @returns The read.
   */
  read(): ReadPiece {
    return { buffer: this.#flags, offset: 0, bytes: 4 * this.#list.length };
  }

  /**
   * Reports each check that ran from the flags read back (their bytes as a Float32Array, as
   * readbacks return them). Once only.
   *
   * @param flags The flags read back.
   */
  report(flags: Float32Array): void {
    if (this.#reported) throw new Error("internal: the value checks were reported already");
    this.#reported = true;
    const words = new Uint32Array(flags.buffer, flags.byteOffset, this.#list.length);
    for (const index of this.#ran) this.#checks.report(index, words[index] === 0);
  }
}
