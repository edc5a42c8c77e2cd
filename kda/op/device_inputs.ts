// Uploading a problem's typed arrays to the gpu arm's device, as the GpuTensors that kda and
// kdaVjp take: the arrays are checked as those calls check typed arrays, then uploaded once.

import { typeName } from "../../base/check.ts";
import type { KdaProblem } from "../_types.ts";
import { checkKdaInputs, checkKdaOptions } from "./_check.ts";
import { ARRAY_KEYS } from "./_fields.ts";
import { checkInKernelArrays } from "./_options.ts";
import { type DeviceTensor, toGpu } from "../gpu/tensor.ts";
import type { KdaInputs, KdaOptions } from "./op.ts";

/**
 * Uploads the f32 typed arrays of a problem to the gpu arm's device, as the GpuTensors that
 * {@linkcode kda} and {@linkcode kdaVjp} take (checked as those calls check typed arrays);
 * grouped value heads (`HV`) and packed batches (`cuSeqlens`) carry over.
 *
 * @param inputs q, k, v, g, beta (and optionally h0, scale, HV, cuSeqlens, aLog, dtBias) as
 *   Float32Arrays with their dimensions.
 * @param options The options the calls will run with, so that the arrays are checked as they will
 *   read them (a raw gate with `useGateInKernel`, logits with `useBetaSigmoidInKernel`).
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
  options: KdaOptions = {},
): Promise<KdaInputs<DeviceTensor>> {
  const opts = checkKdaOptions(options);
  // the device takes f32 alone: say so before the shared check lists the host's other types
  for (const name of ARRAY_KEYS) {
    const a: unknown = (inputs as unknown as Record<string, unknown> | null)?.[name];
    if (a !== undefined && ArrayBuffer.isView(a) && !(a instanceof Float32Array)) {
      throw new TypeError(
        `inputs.${name} must be a Float32Array for the device: got ${typeName(a)}`,
      );
    }
  }
  const checked = checkKdaInputs(inputs, { gateInKernel: (opts.inKernel?.gate ?? null) !== null });
  if (checked.device || checked.dtype !== "f32") {
    throw new TypeError(
      `inputs.q must be a Float32Array for the device: got ${
        checked.device ? "a GpuTensor" : "Float64Array"
      }`,
    );
  }
  checkInKernelArrays(checked.problem, opts.inKernel, opts.allowNegEigval, "inputs", "f32");
  const problem = checked.problem as KdaProblem<Float32Array>;
  const { B, T, H, K, V, scale } = problem;
  const HV = problem.HV ?? H;
  const N = problem.cuSeqlens === undefined ? B : problem.cuSeqlens.length - 1;
  const uploaded: DeviceTensor[] = [];
  const keep = async (a: Float32Array, shape: number[]) => {
    const t = await toGpu(a, shape);
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
      ...(problem.HV !== undefined ? { HV } : {}),
      ...(problem.cuSeqlens !== undefined ? { cuSeqlens: problem.cuSeqlens } : {}),
      q: await keep(problem.q, [B, T, H, K]),
      k: await keep(problem.k, [B, T, H, K]),
      v: await keep(problem.v, [B, T, HV, V]),
      g: await keep(problem.g, [B, T, HV, K]),
      beta: await keep(problem.beta, [B, T, HV]),
      ...(problem.h0 !== undefined ? { h0: await keep(problem.h0, [N, HV, K, V]) } : {}),
      ...(problem.aLog !== undefined ? { aLog: await keep(problem.aLog, [HV]) } : {}),
      ...(problem.dtBias !== undefined ? { dtBias: await keep(problem.dtBias, [HV * K]) } : {}),
    };
  } catch (error) {
    for (const t of uploaded) t.release();
    throw error;
  }
}
