// The public boundary's checks for calls on GpuTensors (data on the gpu arm's device), in the
// message style of kda/_check.ts. Only what the host can see is checked: shapes, dtype, buffer
// sizes and usage. The elements are not read (that would be the host sync these calls exist to
// avoid), so, unlike typed arrays, non-finite values or positive gates are not refused here.

import type { GpuTensor } from "../gpu/tensor.ts";
import { DeviceTensor, isGpuTensor } from "../gpu/tensor.ts";
import type { KdaCotangents, KdaDims, KdaProblem } from "../_types.ts";
import { checkKnownKeys, checkObject, checkPositiveInt, typeName } from "../../base/check.ts";

const ARRAY_KEYS = ["q", "k", "v", "g", "beta", "h0"] as const;

/**
 * Whether a call's inputs live on the device: all arrays GpuTensors (true), all typed arrays
 * (false), or a mix (a TypeError naming one of each).
 *
 * @param inputs What the caller passed (an object, checked further elsewhere).
 * @returns Whether the call runs on device tensors.
 * @example
 * ```ts
 * onDevice({ q: new Float32Array(4) }); // false
 * ```
 */
export function onDevice(inputs: unknown): boolean {
  if (typeof inputs !== "object" || inputs === null) return false;
  const x = inputs as Record<string, unknown>;
  const present = ARRAY_KEYS.filter((k) => x[k] !== undefined);
  const device = present.filter((k) => isGpuTensor(x[k]));
  if (device.length === 0) return false;
  const host = present.find((k) => !isGpuTensor(x[k]));
  if (host !== undefined) {
    throw new TypeError(
      `inputs.${host} must be a GpuTensor like inputs.${device[0]} (all arrays on the device or ` +
        `none): got ${typeName(x[host])}`,
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
  const bytes = shape.reduce((a, b) => a * b, 1) * 4;
  if (value.buffer.size < bytes) {
    throw new RangeError(
      `${name}.buffer must hold at least ${bytes} bytes: got ${value.buffer.size}`,
    );
  }
  if ((value.buffer.usage & GPUBufferUsage.COPY_SRC) === 0) {
    throw new TypeError(
      `${name}.buffer must have COPY_SRC usage (the kernels read a packed copy): got usage ` +
        `${value.buffer.usage}`,
    );
  }
  return value;
}

/**
 * Throws unless a problem's layout is one the device path runs: no grouped value heads (HV = H)
 * and no packed batch.
 *
 * @param x The caller's inputs.
 * @param H The checked query/key heads.
 * @example
 * ```ts
 * checkDeviceLayout({ HV: 1 }, 1); // passes; { HV: 2 } or a cuSeqlens throws a RangeError
 * ```
 */
export function checkDeviceLayout(x: Record<string, unknown>, H: number): void {
  if (x.HV !== undefined && x.HV !== H) {
    throw new RangeError(
      `inputs.HV must equal inputs.H = ${H} with GpuTensor inputs (grouped value heads run from ` +
        `typed arrays): got ${String(x.HV)}`,
    );
  }
  if (x.cuSeqlens !== undefined) {
    throw new RangeError(
      "inputs.cuSeqlens must be absent with GpuTensor inputs (a packed batch runs from typed " +
        `arrays): got ${typeName(x.cuSeqlens)}`,
    );
  }
}

/**
 * Validates the inputs of a call on device tensors once, at the public boundary.
 *
 * @param inputs What the caller passed (onDevice said true).
 * @returns The problem the gpu arm sees, scale resolved.
 * @example
 * ```ts
 * // checkDeviceInputs({ B: 1, T: 8, H: 1, K: 4, V: 4, q, k, v, g, beta }) with GpuTensors
 * ```
 */
export function checkDeviceInputs(inputs: unknown): KdaProblem<GpuTensor> {
  const x = checkObject("inputs", inputs);
  checkKnownKeys("inputs", x, ["B", "T", "H", "K", "V", "HV", "cuSeqlens", ...ARRAY_KEYS, "scale"]);
  const B = checkPositiveInt("inputs.B", x.B);
  const T = checkPositiveInt("inputs.T", x.T);
  const H = checkPositiveInt("inputs.H", x.H);
  const K = checkPositiveInt("inputs.K", x.K);
  const V = checkPositiveInt("inputs.V", x.V);
  checkDeviceLayout(x, H);
  const dims: KdaDims = { B, T, H, K, V };
  const scale = x.scale === undefined ? K ** -0.5 : x.scale;
  if (typeof scale !== "number" || !Number.isFinite(scale)) {
    throw new RangeError(`inputs.scale must be a finite number: got ${String(scale)}`);
  }
  return {
    ...dims,
    scale,
    q: checkGpuTensor("inputs.q", x.q, [B, T, H, K], "[B, T, H, K]"),
    k: checkGpuTensor("inputs.k", x.k, [B, T, H, K], "[B, T, H, K]"),
    v: checkGpuTensor("inputs.v", x.v, [B, T, H, V], "[B, T, H, V]"),
    g: checkGpuTensor("inputs.g", x.g, [B, T, H, K], "[B, T, H, K]"),
    beta: checkGpuTensor("inputs.beta", x.beta, [B, T, H], "[B, T, H]"),
    ...(x.h0 !== undefined
      ? { h0: checkGpuTensor("inputs.h0", x.h0, [B, H, K, V], "[B, H, K, V]") }
      : {}),
  };
}

/**
 * Validates the cotangents of a call on device tensors.
 *
 * @param cotangents What the caller passed.
 * @param dims The checked problem's dimensions.
 * @returns `dout` and optional `dht`, as GpuTensors.
 * @example
 * ```ts
 * // checkDeviceCotangents({ dout }, problem) with dout a GpuTensor of shape [B, T, H, V]
 * ```
 */
export function checkDeviceCotangents(
  cotangents: unknown,
  dims: KdaDims,
): KdaCotangents<GpuTensor> {
  const c = checkObject("cotangents", cotangents);
  checkKnownKeys("cotangents", c, ["dout", "dht"]);
  const { B, T, H, K, V } = dims;
  return {
    dout: checkGpuTensor("cotangents.dout", c.dout, [B, T, H, V], "[B, T, H, V]"),
    ...(c.dht !== undefined
      ? { dht: checkGpuTensor("cotangents.dht", c.dht, [B, H, K, V], "[B, H, K, V]") }
      : {}),
  };
}
