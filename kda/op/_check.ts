// Every argument check of the op's public boundary, in one message style:
//   "<argument> must <expectation>: got <actual>"
// One check serves both kinds of input: typed arrays (checked element by element, and copied, so
// that a pending call computes on exactly the values that passed; or, for a call sure to run on
// the gpu arm, uploaded as they are checked, kda/gpu/snapshot.ts) and GpuTensors (checked as far
// as the host can see them: shape, dtype, buffer size and usage; reading their elements would be
// the host sync those calls exist to avoid). The arms behind the seam assert their invariants but
// do not validate again.

import {
  type ChunkSize,
  type Float,
  type InKernel,
  type KdaCotangents,
  type KdaDims,
  type KdaLayout,
  type KdaProblem,
  MAX_HEAD_DIM,
} from "../_types.ts";
import { type ComputeDType, computeDtypeOf } from "../../base/dtype.ts";
import { DeviceTensor, type GpuTensor, isGpuTensor } from "../gpu/tensor.ts";
import { bytesOf } from "../gpu/layout.ts";
import { kernelSet } from "../gpu/kernel_set.ts";
import "../gpu/kernels/mod.ts";
import { checkInKernel } from "./_options.ts";
import {
  ARRAY_KEYS,
  COTANGENT_KEYS,
  FLA_NAMES,
  INPUT_KEYS,
  INPUTS_ELSEWHERE,
  OPTION_KEYS,
  OPTIONS_ELSEWHERE,
  STEP_OPTION_KEYS,
  STEP_OPTIONS_ELSEWHERE,
  TOKEN_ARRAYS,
  TOKEN_ELSEWHERE,
  TOKEN_KEYS,
} from "./_fields.ts";
import { copyArray } from "./_copies.ts";
import { type CheckedArray, ValueChecks } from "./_value_checks.ts";
import type { DeviceSnapshots } from "../gpu/snapshot.ts";
import {
  checkKnownKeys,
  checkObject,
  checkOptionalBoolean,
  checkPositiveInt,
  shown,
  typeName,
} from "../../base/check.ts";

/** Throws unless `value` is 16, 32 or 64; returns it typed. */
export function checkChunkSize(name: string, value: unknown): ChunkSize {
  if (value !== 16 && value !== 32 && value !== 64) {
    throw new RangeError(`${name} must be 16, 32 or 64: got ${shown(value)}`);
  }
  return value;
}

/**
 * Checks one array argument: its type, the call's dtype, its length, and that it holds no NaN or
 * infinity (which would poison every later token through the state).
 */
export function checkFloatArray(
  name: string,
  x: unknown,
  length: number,
  dtype: ComputeDType,
  shapeText: string,
): asserts x is Float {
  checkFloatKind(name, x, length, dtype, shapeText);
  checkFinite(name, x, new ValueChecks());
}

/** Throws unless `x` is a typed array of the dtype with `length` elements. */
function checkFloatKind(
  name: string,
  x: unknown,
  length: number,
  dtype: ComputeDType,
  shapeText: string,
): asserts x is Float {
  const want = dtype === "f64" ? Float64Array : Float32Array;
  if (!(x instanceof want)) {
    throw new TypeError(`${name} must be a ${want.name} like the other arrays: got ${typeName(x)}`);
  }
  if (x.length !== length) {
    throw new RangeError(`${name} must have ${length} elements ${shapeText}: got ${x.length}`);
  }
}

/** Checks through `checks` that every element is finite (within ±Number.MAX_VALUE, not NaN). */
function checkFinite(name: string, x: CheckedArray, checks: ValueChecks): void {
  checks.check(
    x,
    -Number.MAX_VALUE,
    Number.MAX_VALUE,
    (v, i) => new RangeError(`${name} must be finite: got ${v} at index ${i}`),
  );
}

/**
 * A copy of one array argument, checked as {@linkcode checkFloatArray} checks (the copy is what
 * is checked and what the call computes on, so that a change to the caller's array while the
 * call is pending cannot reach it): its type and length at once, its values through `checks`
 * (at once, or on the device for a large copy; _value_checks.ts). The copy goes into memory a
 * finished call may have given back (_copies.ts). A call that takes `snapshots` uploads the array
 * instead, as its copy (kda/gpu/snapshot.ts).
 */
function checkedCopy(
  name: string,
  x: unknown,
  shape: readonly number[],
  kind: HostKind,
  shapeText: string,
): CheckedArray {
  const length = shape.reduce((a, b) => a * b, 1);
  checkFloatKind(name, x, length, kind.dtype, shapeText);
  if (kind.snapshots !== undefined) {
    const snapshot = kind.snapshots.take(x as Float32Array, shape);
    checkFinite(name, snapshot, kind.checks);
    return snapshot;
  }
  const copy = copyArray(kind.dtype === "f64" ? Float64Array : Float32Array, length);
  copy.set(x);
  checkFinite(name, copy, kind.checks);
  return copy;
}

/** Checks that every entry of a checked gate array is a log decay (≤ 0). */
function checkGates(name: string, g: CheckedArray, checks: ValueChecks): void {
  checks.check(
    g,
    -Infinity,
    0,
    (v, i) => new RangeError(`${name} must be <= 0 (a log decay): got ${v} at index ${i}`),
  );
}

/**
 * Whether a call's arrays live on the device: all GpuTensors (true), all host arrays (false), or
 * a mix (a TypeError naming one of each).
 *
 * @param x The arguments object.
 * @param keys Its array fields.
 * @param what The argument's name, for messages.
 * @returns Whether the call runs on device tensors.
 * @example
 * ```ts
 * onDevice({ q: new Float32Array(4) }, ["q"], "inputs"); // false
 * ```
 */
export function onDevice(
  x: Record<string, unknown>,
  keys: readonly string[],
  what: string,
): boolean {
  const present = keys.filter((k) => x[k] !== undefined);
  const device = present.filter((k) => isGpuTensor(x[k]));
  if (device.length === 0) return false;
  const host = present.find((k) => !isGpuTensor(x[k]));
  if (host !== undefined) {
    throw new TypeError(
      `${what}.${host} must be a GpuTensor like ${what}.${device[0]} (all arrays on the device ` +
        `or none): got ${typeName(x[host])}`,
    );
  }
  return true;
}

/** Throws unless `value` is a live f32 GpuTensor of exactly `shape` whose buffer can be copied. */
function checkGpuTensor(
  name: string,
  value: unknown,
  shape: readonly number[],
  shapeText: string,
): GpuTensor {
  if (value instanceof DeviceTensor && value.released) {
    throw new RangeError(`${name} must be a live tensor: got a released DeviceTensor`);
  }
  if (!isGpuTensor(value)) {
    throw new TypeError(
      `${name} must be a GpuTensor like the other arrays: got ${typeName(value)}`,
    );
  }
  if (value.dtype !== "f32") {
    throw new TypeError(`${name}.dtype must be "f32": got ${String(value.dtype)}`);
  }
  const got = Array.isArray(value.shape) ? value.shape : [];
  if (got.length !== shape.length || got.some((n, i) => n !== shape[i])) {
    throw new RangeError(
      `${name}.shape must be ${shapeText} = [${shape.join(", ")}]: got ${
        Array.isArray(value.shape) ? `[${value.shape.join(", ")}]` : typeName(value.shape)
      }`,
    );
  }
  // read once: the buffer checked is the one computed on, whatever the tensor object does later
  // (a getter that returns another buffer, a DeviceTensor released)
  const buffer = value.buffer;
  const bytes = bytesOf(shape.reduce((a, b) => a * b, 1), "f32");
  if (buffer.size < bytes) {
    throw new RangeError(`${name}.buffer must hold at least ${bytes} bytes: got ${buffer.size}`);
  }
  if ((buffer.usage & GPUBufferUsage.COPY_SRC) === 0) {
    throw new TypeError(
      `${name}.buffer must have COPY_SRC usage (the kernels may read a copy): got usage ` +
        `${buffer.usage}`,
    );
  }
  // a mapped buffer cannot be used by a submit: WebGPU's error would name no argument
  if (buffer.mapState !== "unmapped") {
    throw new RangeError(`${name}.buffer must be unmapped: got mapState ${buffer.mapState}`);
  }
  return { buffer, shape: [...shape], dtype: "f32" };
}

/**
 * How a call's host arrays are checked: of a dtype, their values through `checks`, and copied, or
 * (f32, with `snapshots`) uploaded as they are checked.
 */
type HostKind = {
  device: false;
  dtype: ComputeDType;
  checks: ValueChecks;
  snapshots?: DeviceSnapshots;
};

/** How a call's arrays are checked: host arrays, or GpuTensors. */
type ArrayKind = HostKind | { device: true };

/** One array of a call, checked for its kind: a checked copy or snapshot, or the GpuTensor itself. */
function checkArray(
  name: string,
  x: unknown,
  shape: readonly number[],
  shapeText: string,
  kind: ArrayKind,
): CheckedArray | GpuTensor {
  if (kind.device) return checkGpuTensor(name, x, shape, shapeText);
  return checkedCopy(name, x, shape, kind, shapeText);
}

/**
 * Checks the offsets of a packed batch (docs/kda.md 2.6): an Int32Array of N + 1 ≥ 2 offsets that
 * starts at 0, never decreases and ends at T, with B = 1. Equal neighbours are a zero-length
 * sequence, whose state passes through unchanged (its ht is its h0), as in flash-linear-attention.
 *
 * @param value What the caller passed as `inputs.cuSeqlens`.
 * @param B The batch size (must be 1).
 * @param T The packed tokens.
 * @returns The offsets, typed.
 *
 * @example
 * ```ts
 * import { checkCuSeqlens } from "./_check.ts";
 * checkCuSeqlens(new Int32Array([0, 3, 3, 7]), 1, 7); // ok; [0, 5, 3, 7] throws a RangeError
 * ```
 */
export function checkCuSeqlens(value: unknown, B: number, T: number): Int32Array {
  if (!(value instanceof Int32Array)) {
    throw new TypeError(`inputs.cuSeqlens must be an Int32Array: got ${typeName(value)}`);
  }
  if (value.length < 2) {
    throw new RangeError(
      `inputs.cuSeqlens must hold at least 2 offsets (N + 1 for N sequences): got ${value.length}`,
    );
  }
  if (B !== 1) {
    throw new RangeError(
      `inputs.B must be 1 with inputs.cuSeqlens (the sequences are packed along T): got ${B}`,
    );
  }
  if (value[0] !== 0) throw new RangeError(`inputs.cuSeqlens must start at 0: got ${value[0]}`);
  for (let i = 1; i < value.length; i++) {
    if (!(value[i] >= value[i - 1])) {
      throw new RangeError(
        `inputs.cuSeqlens must not decrease: got ${value[i]} after ${value[i - 1]} at index ${i}`,
      );
    }
  }
  const last = value[value.length - 1];
  if (last !== T) {
    throw new RangeError(`inputs.cuSeqlens must end at inputs.T = ${T}: got ${last}`);
  }
  return value.slice();
}

/**
 * The head counts and widths of a call: H query/key heads, HV value heads (a multiple of H;
 * grouped value heads, docs/kda.md 2.5), K and V.
 */
function checkHeads(
  what: string,
  x: Record<string, unknown>,
): { H: number; K: number; V: number; HV: number } {
  const H = checkPositiveInt(`${what}.H`, x.H);
  const K = checkPositiveInt(`${what}.K`, x.K);
  const V = checkPositiveInt(`${what}.V`, x.V);
  const HV = x.HV === undefined ? H : checkPositiveInt(`${what}.HV`, x.HV);
  if (HV % H !== 0) {
    throw new RangeError(`${what}.HV must be a multiple of ${what}.H = ${H}: got ${HV}`);
  }
  return { H, K, V, HV };
}

/**
 * A checked call: its problem on host arrays (checked copies), on snapshots of them on the
 * device (`snapshots`, which the call seals before its first await and releases when done), or on
 * GpuTensors.
 */
export type CheckedInputs =
  | { device: false; problem: KdaProblem<Float>; dtype: ComputeDType; snapshots?: undefined }
  | { device: false; problem: KdaProblem<GpuTensor>; dtype: "f32"; snapshots: DeviceSnapshots }
  | { device: true; problem: KdaProblem<GpuTensor>; dtype: "f32"; snapshots?: undefined };

/** The dimensions of a call as checked so far, for a caller deciding where it will run. */
export interface CallDims extends KdaDims, KdaLayout {
  /** The query scale, or NaN when the call's scale is not a finite number (it will be refused). */
  scale: number;
  /** Whether the call has aLog and dtBias (their gradients come back with the gate in the kernel). */
  gateArrays: { aLog: boolean; dtBias: boolean };
}

/**
 * Validates the raw inputs of the op once, at the public boundary, for either kind of input.
 *
 * @param inputs What the caller passed.
 * @param how `gateInKernel`: g is the raw gate of the in-kernel options (docs/kda.md 2.8), any
 *   finite value, rather than a log decay (≤ 0); `checks`: where the values of host arrays are
 *   checked (default: at once, each error thrown as met); `snapshotsFor`: for f32 host arrays, once
 *   the dimensions passed, the snapshots to upload them into instead of copying them (null: copy).
 * @returns The problem the arms see (scale resolved; host arrays copied as checked) and its dtype.
 */
export function checkKdaInputs(
  inputs: unknown,
  how: {
    gateInKernel?: boolean;
    checks?: ValueChecks;
    snapshotsFor?: (dims: CallDims) => DeviceSnapshots | null;
  } = {},
): CheckedInputs {
  const x = checkObject("inputs", inputs);
  checkKnownKeys("inputs", x, INPUT_KEYS, FLA_NAMES, INPUTS_ELSEWHERE);
  const device = onDevice(x, ARRAY_KEYS, "inputs");
  const B = checkPositiveInt("inputs.B", x.B);
  const T = checkPositiveInt("inputs.T", x.T);
  const { H, K, V, HV } = checkHeads("inputs", x);
  const cuSeqlens = x.cuSeqlens === undefined ? undefined : checkCuSeqlens(x.cuSeqlens, B, T);
  const N = cuSeqlens === undefined ? B : cuSeqlens.length - 1;
  const hv = x.HV === undefined ? "H" : "HV", n = cuSeqlens === undefined ? "B" : "N";
  const dtype = device ? "f32" : computeDtypeOf(x.q, "inputs.q");
  const checks = how.checks ?? new ValueChecks();
  // resolved here, checked after the arrays (their errors come first)
  const scale = x.scale === undefined ? K ** -0.5 : x.scale;
  // snapshots only where every array has the length its dimensions claim: the job they are
  // planned for is sized by the dimensions, and a call whose arrays disagree is refused below, by
  // the array's name, before anything is planned or allocated from what it claims
  const lengths: Record<string, number> = {
    q: B * T * H * K,
    k: B * T * H * K,
    v: B * T * HV * V,
    g: B * T * HV * K,
    beta: B * T * HV,
    h0: N * HV * K * V,
    aLog: HV,
    dtBias: HV * K,
  };
  const agree = Object.entries(lengths).every(([name, n]) =>
    x[name] === undefined ||
    (ArrayBuffer.isView(x[name]) && (x[name] as { length?: unknown }).length === n)
  );
  const snapshots = device || dtype !== "f32" || !agree ? null : how.snapshotsFor?.({
    B,
    T,
    H,
    K,
    V,
    ...(HV !== H ? { HV } : {}),
    ...(cuSeqlens !== undefined ? { cuSeqlens } : {}),
    scale: typeof scale === "number" && Number.isFinite(scale) ? scale : NaN,
    gateArrays: { aLog: x.aLog !== undefined, dtBias: x.dtBias !== undefined },
  }) ?? null;
  const kind: ArrayKind = device
    ? { device: true }
    : { device: false, dtype, checks, ...(snapshots !== null ? { snapshots } : {}) };
  const array = (name: string, shape: number[], labels: string) =>
    checkArray(`inputs.${name}`, x[name], shape, labels, kind);
  const q = array("q", [B, T, H, K], "[B, T, H, K]");
  const k = array("k", [B, T, H, K], "[B, T, H, K]");
  const v = array("v", [B, T, HV, V], `[B, T, ${hv}, V]`);
  const g = array("g", [B, T, HV, K], `[B, T, ${hv}, K]`);
  if (!device && how.gateInKernel !== true) checkGates("inputs.g", g as CheckedArray, checks);
  const beta = array("beta", [B, T, HV], `[B, T, ${hv}]`);
  const h0 = x.h0 === undefined ? undefined : array("h0", [N, HV, K, V], `[${n}, ${hv}, K, V]`);
  const aLog = x.aLog === undefined ? undefined : array("aLog", [HV], `[${hv}]`);
  const dtBias = x.dtBias === undefined ? undefined : array("dtBias", [HV * K], `[${hv}·K]`);
  if (typeof scale !== "number" || !Number.isFinite(scale)) {
    throw new RangeError(`inputs.scale must be a finite number: got ${shown(scale)}`);
  }
  const problem = {
    B,
    T,
    H,
    K,
    V,
    q,
    k,
    v,
    g,
    beta,
    scale,
    ...(h0 !== undefined ? { h0 } : {}),
    ...(aLog !== undefined ? { aLog } : {}),
    ...(dtBias !== undefined ? { dtBias } : {}),
    ...(HV !== H ? { HV } : {}),
    ...(cuSeqlens !== undefined ? { cuSeqlens } : {}),
  };
  return device
    ? { device, problem: problem as KdaProblem<GpuTensor>, dtype: "f32" }
    : snapshots !== null
    ? { device, problem: problem as KdaProblem<GpuTensor>, dtype: "f32", snapshots }
    : { device, problem: problem as KdaProblem<Float>, dtype };
}

/**
 * Validates the cotangents of the op's outputs for a checked problem, of the problem's kind.
 *
 * @param cotangents What the caller passed.
 * @param checked The checked inputs, where host arrays' values are checked (`checks`, default: at
 *   once), and the snapshots a call on snapshots takes its cotangents into.
 * @returns The cotangents: checked copies or snapshots, or GpuTensors.
 */
export function checkKdaCotangents<A extends Float | GpuTensor>(
  cotangents: unknown,
  checked: {
    problem: KdaProblem<A>;
    dtype: ComputeDType;
    device: boolean;
    checks?: ValueChecks;
    snapshots?: DeviceSnapshots;
  },
): KdaCotangents<A> {
  const c = checkObject("cotangents", cotangents);
  checkKnownKeys("cotangents", c, COTANGENT_KEYS, FLA_NAMES);
  const { problem, dtype, device } = checked;
  const { B, T, K, V } = problem;
  const HV = problem.HV ?? problem.H;
  const N = problem.cuSeqlens === undefined ? B : problem.cuSeqlens.length - 1;
  const hv = problem.HV === undefined ? "H" : "HV", n = problem.cuSeqlens === undefined ? "B" : "N";
  onDevice(c, ["dout", "dht"], "cotangents");
  const kind: ArrayKind = device ? { device: true } : {
    device: false,
    dtype,
    checks: checked.checks ?? new ValueChecks(),
    ...(checked.snapshots !== undefined ? { snapshots: checked.snapshots } : {}),
  };
  const dout = checkArray("cotangents.dout", c.dout, [B, T, HV, V], `[B, T, ${hv}, V]`, kind);
  const dht = c.dht === undefined
    ? undefined
    : checkArray("cotangents.dht", c.dht, [N, HV, K, V], `[${n}, ${hv}, K, V]`, kind);
  return { dout: dout as A, ...(dht !== undefined ? { dht: dht as A } : {}) };
}

/** The validated options of one op call. */
export interface CheckedOptions {
  arm?: string;
  /** Absent: each chunked arm takes its measured default (DEFAULT_CHUNK_SIZES). */
  chunkSize?: ChunkSize;
  /** The gpu arm's kernel set (the option, else KDA_GPU_KERNELS); absent: its rule picks one. */
  kernels?: string;
  strict?: boolean;
  quiet?: boolean;
  /** The in-kernel options (docs/kda.md 2.8); absent when none applies. */
  inKernel?: InKernel;
  /** Whether beta may reach 2 (flash-linear-attention's allow_neg_eigval). */
  allowNegEigval: boolean;
}

/** The environment variable that names the gpu arm's kernel set for calls that name none. */
export const KERNELS_ENV = "KDA_GPU_KERNELS";

/**
 * The kernel set a call names: its option, else `KDA_GPU_KERNELS`, checked against the
 * registered sets; absent: the gpu arm's rule picks one.
 *
 * @param value The call's `kernels` option.
 * @returns The set's name, or undefined.
 */
export function checkKernels(value: unknown): string | undefined {
  if (value !== undefined) return kernelSet(value, "options.kernels").name;
  let state: Deno.PermissionState = "denied";
  try {
    state = Deno.permissions.querySync({ name: "env", variable: KERNELS_ENV }).state;
  } catch {
    // a runtime without permission queries: the variable cannot be read
  }
  if (state !== "granted") return undefined;
  const env = Deno.env.get(KERNELS_ENV);
  return env === undefined || env === "" ? undefined : kernelSet(env, KERNELS_ENV).name;
}

/**
 * Validates the options of `kda`/`kdaVjp` (the arm name is checked by the seam, against its arms).
 *
 * @param options What the caller passed.
 * @returns The options, checked.
 */
export function checkKdaOptions(options: unknown): CheckedOptions {
  const o = checkObject("options", options);
  checkKnownKeys("options", o, OPTION_KEYS, FLA_NAMES, OPTIONS_ELSEWHERE);
  const kernels = checkKernels(o.kernels);
  const { inKernel, allowNegEigval } = checkInKernel(o, true);
  return {
    arm: o.arm === undefined ? undefined : o.arm as string,
    chunkSize: o.chunkSize === undefined
      ? undefined
      : checkChunkSize("options.chunkSize", o.chunkSize),
    ...(kernels !== undefined ? { kernels } : {}),
    strict: checkOptionalBoolean("options.strict", o.strict),
    quiet: checkOptionalBoolean("options.quiet", o.quiet),
    ...(inKernel !== undefined ? { inKernel } : {}),
    allowNegEigval,
  };
}

/** Why the chunked arms cannot take these head dimensions, or null. */
export function headDimProblem(K: number, V: number, arm: string): string | null {
  if (K <= MAX_HEAD_DIM && V <= MAX_HEAD_DIM) return null;
  return `K = ${K} and V = ${V} must be at most ${MAX_HEAD_DIM} on the ${arm} arm`;
}

/**
 * Validates one decode call (docs/kda.md 2.7) once, at the public boundary: `T` tokens per
 * sequence (default 1), q, k [B, T, H, K], v [B, T, HV, V], g [B, T, HV, K], beta [B, T, HV]
 * (without `T`: [B, H, K] and so on), aLog [HV] and dtBias [HV·K] with the gate in the kernel, and
 * the state [B, HV, K, V]; host arrays or GpuTensors (all of one kind, the state too).
 *
 * @param state What the caller passed as the state.
 * @param token What the caller passed as the tokens.
 * @param how `gateInKernel`: g is the raw gate (any finite value) rather than a log decay.
 * @returns The problem with h0 = state (its HV set when it differs from H), its kind and dtype.
 *
 * @example
 * ```ts
 * import { checkKdaStep } from "./_check.ts";
 * const f = (n: number) => new Float64Array(n);
 * const { problem } = checkKdaStep(f(4), {
 *   B: 1, H: 1, K: 2, V: 2, q: f(2), k: f(2), v: f(2), g: f(2), beta: f(1),
 * });
 * console.log(problem.T); // 1
 * ```
 */
export function checkKdaStep(
  state: unknown,
  token: unknown,
  how: { gateInKernel?: boolean } = {},
): CheckedInputs {
  const x = checkObject("token", token);
  checkKnownKeys("token", x, TOKEN_KEYS, FLA_NAMES, TOKEN_ELSEWHERE);
  const device = onDevice(x, TOKEN_ARRAYS, "token");
  const B = checkPositiveInt("token.B", x.B);
  const T = x.T === undefined ? 1 : checkPositiveInt("token.T", x.T);
  const { H, K, V, HV } = checkHeads("token", x);
  const hv = x.HV === undefined ? "H" : "HV";
  const dtype = device ? "f32" : computeDtypeOf(x.q, "token.q");
  const checks = new ValueChecks();
  const kind: ArrayKind = device ? { device: true } : { device: false, dtype, checks };
  // Without T the token arrays are [B, ...]; with it [B, T, ...] (the same elements when T = 1).
  const rows = x.T === undefined ? [B] : [B, T];
  const lead = x.T === undefined ? "B" : "B, T";
  const array = (name: string, dims: number[], labels: string) =>
    checkArray(`token.${name}`, x[name], [...rows, ...dims], `[${lead}, ${labels}]`, kind);
  const q = array("q", [H, K], "H, K");
  const k = array("k", [H, K], "H, K");
  const v = array("v", [HV, V], `${hv}, V`);
  const g = array("g", [HV, K], `${hv}, K`);
  if (!device && how.gateInKernel !== true) checkGates("token.g", g as Float, checks);
  const beta = array("beta", [HV], hv);
  const one = (name: string, n: number, labels: string) =>
    x[name] === undefined
      ? undefined
      : checkArray(`token.${name}`, x[name], [n], `[${labels}]`, kind);
  const aLog = one("aLog", HV, hv);
  const dtBias = one("dtBias", HV * K, `${hv}·K`);
  if (device && !isGpuTensor(state)) {
    throw new TypeError(
      `state must be a GpuTensor like the token's arrays: got ${typeName(state)}`,
    );
  }
  const h0 = checkArray("state", state, [B, HV, K, V], `[B, ${hv}, K, V]`, kind);
  const scale = x.scale === undefined ? K ** -0.5 : x.scale;
  if (typeof scale !== "number" || !Number.isFinite(scale)) {
    throw new RangeError(`token.scale must be a finite number: got ${shown(scale)}`);
  }
  const problem = {
    B,
    T,
    H,
    K,
    V,
    q,
    k,
    v,
    g,
    beta,
    h0,
    scale,
    ...(aLog !== undefined ? { aLog } : {}),
    ...(dtBias !== undefined ? { dtBias } : {}),
    ...(HV !== H ? { HV } : {}),
  };
  return device
    ? { device, problem: problem as KdaProblem<GpuTensor>, dtype: "f32" }
    : { device, problem: problem as KdaProblem<Float>, dtype };
}

/**
 * Validates the options of `kdaStep`: those of `kda` without `chunkSize`, `kernels` and
 * `outputFinalState` (a decode call runs the plain recurrence and always returns its state).
 *
 * @param options What the caller passed.
 * @returns The options.
 *
 * @example
 * ```ts
 * import { checkStepOptions } from "./_check.ts";
 * checkStepOptions({ arm: "cpu" }).arm; // "cpu"
 * ```
 */
export function checkStepOptions(options: unknown): Omit<CheckedOptions, "chunkSize"> {
  const o = checkObject("options", options);
  checkKnownKeys("options", o, STEP_OPTION_KEYS, FLA_NAMES, STEP_OPTIONS_ELSEWHERE);
  const { chunkSize: _, ...rest } = checkKdaOptions(o);
  return rest;
}
