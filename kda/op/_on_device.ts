// kda and kdaVjp on GpuTensors: checked at the boundary (kda/_check_device.ts), counted by the
// seam like every call, and run by the gpu arm on the device with no host sync (kda/gpu/resident.ts).
// There is no tape here: a call on device tensors is one fused forward, or one fused forward and
// backward, with its outputs or gradients handed back as DeviceTensors.

import type { ChunkSize, KdaGrads, KdaOutputs, KdaProblem } from "../_types.ts";
import { checkKdaInputs, checkKdaOptions } from "./_check.ts";
import { checkDeviceCotangents, checkDeviceInputs, checkDeviceLayout } from "./_check_device.ts";
import { DEFAULT_CHUNK_SIZES, kdaSeam } from "./arms.ts";
import { gpuForwardOnDevice, gpuVjpOnDevice } from "../gpu/resident.ts";
import { type DeviceTensor, type GpuTensor, toGpu } from "../gpu/tensor.ts";
import type { KdaInputs } from "./op.ts";

/** Runs a checked call on the gpu arm through the seam, which counts it (and any decline). */
function onGpu<T>(
  problem: KdaProblem<GpuTensor>,
  options: unknown,
  backward: boolean,
  run: (chunkSize: ChunkSize) => Promise<T>,
): Promise<T> {
  const { chunkSize, ...seamOptions } = checkKdaOptions(options);
  const { B, T, H, K, V, scale } = problem;
  const C = chunkSize ?? DEFAULT_CHUNK_SIZES.gpu;
  return kdaSeam.runOnDevice(
    { B, T, H, K, V, scale, chunkSize: C },
    { arm: "gpu", dtype: "f32", backward, run: () => run(C) },
    seamOptions,
  );
}

/**
 * The forward of {@linkcode kda} when its inputs are GpuTensors.
 *
 * @param inputs The caller's inputs (all arrays GpuTensors).
 * @param options The caller's options.
 * @returns `o` and `ht` on the device.
 * @example
 * ```ts
 * // kda() calls this when onDevice(inputs) holds
 * ```
 */
export function kdaOnDevice(inputs: unknown, options: unknown): Promise<KdaOutputs<DeviceTensor>> {
  const problem = checkDeviceInputs(inputs);
  return onGpu(problem, options, false, (C) => gpuForwardOnDevice(problem, C));
}

/**
 * The vector-Jacobian product of {@linkcode kdaVjp} when its inputs are GpuTensors.
 *
 * @param inputs The caller's inputs (all arrays GpuTensors).
 * @param cotangents `dout` and optional `dht`, GpuTensors.
 * @param options The caller's options.
 * @returns dq, dk, dv, dg, dbeta and dh0 on the device.
 * @example
 * ```ts
 * // kdaVjp() calls this when onDevice(inputs) holds
 * ```
 */
export function kdaVjpOnDevice(
  inputs: unknown,
  cotangents: unknown,
  options: unknown,
): Promise<KdaGrads<DeviceTensor>> {
  const problem = checkDeviceInputs(inputs);
  const checked = checkDeviceCotangents(cotangents, problem);
  return onGpu(problem, options, true, (C) => gpuVjpOnDevice(problem, checked, C));
}

/**
 * Uploads the f32 typed arrays of a problem to the gpu arm's device, as the GpuTensors that
 * {@linkcode kda} and {@linkcode kdaVjp} take (checked as those calls check typed arrays).
 *
 * @param inputs q, k, v, g, beta (and optionally h0, scale) as Float32Arrays with their
 *   dimensions; `HV` and `cuSeqlens` are not available on the device.
 * @returns The same problem with DeviceTensors (release them, e.g. with `releaseTensors`).
 * @example
 * ```ts
 * import { gpuStatus, kda, releaseTensors, toGpuInputs } from "@deltanet/kda";
 * if ((await gpuStatus()).available) {
 *   const [B, T, H, K, V] = [1, 8, 1, 4, 4];
 *   const fill = (n: number, v: number) => new Float32Array(n).fill(v);
 *   const x = await toGpuInputs({
 *     B, T, H, K, V,
 *     q: fill(32, 0.1), k: fill(32, 0.5), v: fill(32, 1), g: fill(32, -0.1), beta: fill(8, 0.5),
 *   });
 *   const out = await kda(x);
 *   releaseTensors(out, x);
 * }
 * ```
 */
export async function toGpuInputs(
  inputs: KdaInputs<Float32Array>,
): Promise<KdaInputs<DeviceTensor>> {
  const { problem, dtype } = checkKdaInputs(inputs);
  if (dtype !== "f32") {
    throw new TypeError("inputs.q must be a Float32Array for the device: got Float64Array");
  }
  const { B, T, H, K, V, scale } = problem;
  checkDeviceLayout(inputs as unknown as Record<string, unknown>, H);
  const uploaded: DeviceTensor[] = [];
  const keep = async (a: unknown, shape: number[]) => {
    const t = await toGpu(a as Float32Array, shape);
    uploaded.push(t);
    return t;
  };
  try {
    return {
      B,
      T,
      H,
      K,
      V,
      scale,
      q: await keep(problem.q, [B, T, H, K]),
      k: await keep(problem.k, [B, T, H, K]),
      v: await keep(problem.v, [B, T, H, V]),
      g: await keep(problem.g, [B, T, H, K]),
      beta: await keep(problem.beta, [B, T, H]),
      ...(problem.h0 !== undefined ? { h0: await keep(problem.h0, [B, H, K, V]) } : {}),
    };
  } catch (error) {
    for (const t of uploaded) t.release();
    throw error;
  }
}
