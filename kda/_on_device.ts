// kda and kdaVjp on GpuTensors: checked at the boundary (kda/_check_device.ts), counted by the
// seam like every call, and run by the gpu arm on the device with no host sync (kda/gpu/resident.ts).
// There is no tape here: a call on device tensors is one fused forward, or one fused forward and
// backward, with its outputs or gradients handed back as DeviceTensors.

import type { ChunkSize, KdaGrads, KdaOutputs, KdaProblem } from "./_types.ts";
import { checkKdaOptions } from "./_check.ts";
import { checkDeviceCotangents, checkDeviceInputs } from "./_check_device.ts";
import { DEFAULT_CHUNK_SIZES, kdaSeam } from "./arms.ts";
import { gpuForwardOnDevice, gpuVjpOnDevice } from "./gpu/resident.ts";
import type { DeviceTensor, GpuTensor } from "./gpu/tensor.ts";

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
