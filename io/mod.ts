/**
 * Reading and writing the safetensors format (a JSON header plus raw little-endian tensors, the
 * format the ML ecosystem shares for checkpoints): F64, F32, F16, BF16, I32 and I64 in, F64, F32,
 * F16, BF16 and I32 out, with every malformed file rejected by a named error.
 *
 * @example Usage
 * ```ts
 * import { readSafetensors, writeSafetensors } from "@deltanet/kda/io";
 * const bytes = writeSafetensors(
 *   { "q_proj.weight": { data: new Float64Array([1, 2, 3, 4, 5, 6]), shape: [2, 3] } },
 *   { format: "kda" },
 * );
 * const { tensors, metadata } = readSafetensors(bytes);
 * tensors.get("q_proj.weight")?.shape; // [2, 3]
 * metadata.format; // "kda"
 * ```
 *
 * @module
 */

export { bf16Bits, bf16Value, f16Bits, f16Value } from "../base/dtype.ts";
export {
  readSafetensors,
  type SafetensorsDType,
  type SafetensorsFile,
  type SafetensorsInput,
  type SafetensorsTensor,
  type SafetensorsWriteDType,
  writeSafetensors,
} from "./safetensors.ts";
