/**
 * Kimi Delta Attention (KDA) for Deno: a gated delta-rule linear attention with chunked kernels in
 * WGSL on WebGPU, a chunked CPU twin, an exact f64 reference built on a reverse-mode autodiff tape,
 * and one seam that picks the arm and counts what ran.
 *
 * @example Usage
 * ```ts
 * import { kda, kdaVjp } from "@deltanet/kda";
 * const [B, T, H, K, V] = [1, 8, 1, 4, 4];
 * const inputs = {
 *   B, T, H, K, V,
 *   q: new Float64Array(B * T * H * K).fill(0.5),
 *   k: new Float64Array(B * T * H * K).fill(0.5),
 *   v: new Float64Array(B * T * H * V).fill(1),
 *   g: new Float64Array(B * T * H * K).fill(-0.1),
 *   beta: new Float64Array(B * T * H).fill(0.5),
 * };
 * const { o, ht } = await kda(inputs, { arm: "cpu" });
 * const { dq, dk, dv, dg, dbeta, dh0 } = await kdaVjp(inputs, { dout: o }, { arm: "cpu" });
 * ```
 *
 * @module
 */

export type * from "./kda/_types.ts";
export {
  type AgreementBars,
  type ArrayConstructorOf,
  BFloat16Array,
  type ComputeArray,
  type ComputeDType,
  type DType,
  type DTypeInfo,
  dtypeOf,
  DTYPES,
  MEASURED_BAR_FACTOR,
  type StorageArray,
  type StorageDType,
} from "./base/dtype.ts";
export {
  DEFAULT_CONFIG,
  DEFAULT_KIMI_CONFIG,
  type KdaConfig,
  type KimiConfig,
  type KimiConfigInput,
  type LayerConfig,
} from "./kda/layer/config.ts";
export {
  DEFAULT_CHUNK_SIZES,
  kda,
  type KdaInputs,
  type KdaOptions,
  type KdaResult,
  kdaVjp,
  type KdaVjpResult,
  resetSeamCounts,
  type ResultArray,
  seamCounts,
  seamDecisions,
} from "./kda/op/op.ts";
export {
  KdaModule,
  type KdaModuleRunOptions,
  type KdaModuleState,
  type KdaModuleTapeResult,
  KIMI_PARAMETER_TABLE,
  type LayerGroup,
  layerGroups,
  PARAMETER_TABLE,
  type ParameterInit,
  parameterNames,
  type ParameterSpec,
} from "./kda/module.ts";
export {
  type FlaKimiConfig,
  fromFla,
  type FromFlaOptions,
  kimiConfigFromFla,
  loadLayer,
} from "./kda/load.ts";
export {
  fromTritonNames,
  type LayerParameters,
  loadStateDict,
  type LoadStateDictOptions,
  type LoadStateDictResult,
  saveLayer,
  type ShapedArray,
  type StateDict,
  stateDict,
  type TensorDict,
  TRITON_NAME_MAP,
  type TritonNameMapping,
} from "./kda/layer/state_dict.ts";
export {
  kdaStep,
  type KdaStepOptions,
  type KdaStepResult,
  type KdaStepToken,
  type StepResultArray,
} from "./kda/op/step.ts";
export {
  gpuDiagnostics,
  GpuError,
  type GpuErrorKind,
  type GpuInfo,
  gpuPool,
  type GpuPoolStatus,
  gpuSettled,
  type GpuStatus,
  gpuStatus,
} from "./kda/gpu/mod.ts";
export {
  DeviceTensor,
  gpuDevice,
  gpuSyncs,
  type GpuTensor,
  isGpuTensor,
  releaseTensors,
  toGpu,
} from "./kda/gpu/tensor.ts";
export { toGpuInputs } from "./kda/op/device_inputs.ts";
export type { SeamCounts, SeamDecision } from "./seam/seam.ts";
// the tape a layer can record on (KdaModule.forwardOnTape); the tape itself is at "@deltanet/kda/tape"
export type { Data, Gradients, MaybePromise, Tape, TapeNode, Tensor } from "./tape/mod.ts";
