// The KDA op's three arms, handed to one generic seam: `ops` records the plain recurrence on the
// tape, `cpu` and `gpu` are fused custom nodes with hand-written chunked backwards. Every input
// reaching here has been checked once at the public boundary (kda/_check.ts).

import { alloc, type Data, type DType, type Tensor } from "../tape/mod.ts";
import {
  type CompositeArm,
  type DispatchOptions,
  type FusedArm,
  Seam,
  type SeamPolicy,
} from "../seam/seam.ts";
import type { Arm, ChunkSize, Float, KdaDims, KdaProblem } from "./_types.ts";
import { headDimProblem } from "./_check.ts";
import { recurrentKda } from "./recurrent.ts";
import { chunkBackward, chunkForward } from "./chunk.ts";
import { gpuBackward, gpuForward, type GpuSaved, gpuStatus, gpuUnsupportedReason } from "./gpu.ts";

/** What the seam is told about one KDA call. */
export interface KdaRequest extends KdaDims {
  /** The resolved query scale. */
  scale: number;
  /** Chunk size of the chunked arms. */
  chunkSize: ChunkSize;
}

/** The op's inputs in the order the arms take them. */
export type KdaInputList<A> = [A, A, A, A, A, A | undefined];

function problemOf(request: KdaRequest, inputs: readonly (Data | undefined)[]): KdaProblem {
  const [q, k, v, g, beta, h0] = inputs as (Float | undefined)[];
  const { B, T, H, K, V, scale } = request;
  return { B, T, H, K, V, scale, q: q!, k: k!, v: v!, g: g!, beta: beta!, ...(h0 ? { h0 } : {}) };
}

/** dq..dbeta, and dh0 only where h0 was an input. */
function gradList(
  grads: { dq: Data; dk: Data; dv: Data; dg: Data; dbeta: Data; dh0: Data },
  hasH0: boolean,
): (Data | null)[] {
  return [grads.dq, grads.dk, grads.dv, grads.dg, grads.dbeta, hasH0 ? grads.dh0 : null];
}

const opsArm: CompositeArm<KdaRequest> = {
  name: "ops",
  kind: "composite",
  whyNot: () => null,
  record(request, [q, k, v, g, beta, h0]) {
    const { o, ht } = recurrentKda(
      { q: q!, k: k!, v: v!, g: g!, beta: beta!, h0 },
      request,
      request.scale,
    );
    return [o, ht];
  },
};

interface CpuSaved {
  problem: KdaProblem;
  states: Float;
  chunkSize: ChunkSize;
}

const cpuArm: FusedArm<KdaRequest, CpuSaved> = {
  name: "cpu",
  kind: "fused",
  whyNot: (request) => headDimProblem(request.K, request.V, "cpu"),
  forward(request, inputs, save) {
    const problem = problemOf(request, inputs);
    const { chunkSize } = request;
    const { o, ht, states } = chunkForward(problem, { chunkSize, saveStates: save });
    return { outputs: [o, ht], saved: save ? { problem, states: states!, chunkSize } : undefined };
  },
  backward({ problem, states, chunkSize }, [dout, dht]) {
    const { B, T, H, V } = problem;
    const grads = chunkBackward(problem, states, {
      dout: (dout ?? alloc(dtypeOf(problem.q), B * T * H * V)) as Float,
      ...(dht ? { dht: dht as Float } : {}),
    }, { chunkSize });
    return gradList(grads, problem.h0 !== undefined);
  },
};

function dtypeOf(a: Float): DType {
  return a instanceof Float64Array ? "f64" : "f32";
}

/** Whether an adapter is a software (CPU) implementation, where the gpu arm is slow. */
export function isSoftwareAdapter(info: { description: string; software?: boolean }): boolean {
  return info.software ?? /llvmpipe|lavapipe|swiftshader|software|cpu/i.test(info.description);
}

interface GpuNodeSaved {
  handle: GpuSaved;
  outputLength: number;
  hasH0: boolean;
}

const gpuArm: FusedArm<KdaRequest, GpuNodeSaved> = {
  name: "gpu",
  kind: "fused",
  async whyNot(request, dtype) {
    const dims = headDimProblem(request.K, request.V, "gpu");
    if (dims !== null) return dims;
    if (dtype !== "f32") return "the gpu arm runs f32 only: got an f64 tape";
    const status = await gpuStatus();
    if (!status.available) return `the gpu arm is unavailable: ${status.reason}`;
    return gpuUnsupportedReason(request, request.chunkSize);
  },
  async forward(request, inputs, save) {
    const problem = problemOf(request, inputs) as KdaProblem<Float32Array>;
    const { o, ht, saved } = await gpuForward(problem, {
      chunkSize: request.chunkSize,
      saveForBackward: save,
    });
    return {
      outputs: [o, ht],
      saved: saved === undefined
        ? undefined
        : { handle: saved, outputLength: o.length, hasH0: problem.h0 !== undefined },
    };
  },
  async backward({ handle, outputLength, hasH0 }, [dout, dht]) {
    const grads = await gpuBackward(handle, {
      dout: (dout ?? new Float32Array(outputLength)) as Float32Array,
      ...(dht ? { dht: dht as Float32Array } : {}),
    });
    return gradList(grads, hasH0);
  },
  release({ handle }) {
    if (!handle.released) handle.release();
  },
};

const policy: SeamPolicy<KdaRequest> = {
  op: "KDA",
  arms: [gpuArm, cpuArm, opsArm] as SeamPolicy<KdaRequest>["arms"],
  async defaultArm(_request, dtype) {
    if (dtype === "f64") return { arm: "cpu", note: null };
    const status = await gpuStatus();
    if (status.available && isSoftwareAdapter(status.info)) {
      return {
        arm: "cpu",
        note: `default arm for f32 work is cpu: the WebGPU adapter "${status.info.description}" ` +
          `is a software adapter, where the gpu arm is slower than the cpu arm (ask for arm "gpu" ` +
          `to run it there)`,
      };
    }
    return { arm: "gpu", note: null };
  },
  outputShapes: ({ B, T, H, K, V }) => [[B, T, H, V], [B, H, K, V]],
  env: { force: "KDA_ARM", require: "KDA_REQUIRE_ARM", quiet: "KDA_QUIET" },
};

/** The one seam of the KDA op: its counters and decision log are the package's. */
export const kdaSeam: Seam<KdaRequest> = new Seam(policy);

/**
 * Runs the op through the seam on tape tensors.
 *
 * @param x The inputs as tensors of one dtype (h0 optional).
 * @param request Dimensions, resolved scale and chunk size (already validated).
 * @param options Arm, strictness, quietness, falsification switch and test hooks.
 * @returns `o` [B,T,H,V], `ht` [B,H,K,V] and the arm that ran.
 */
export async function runKda(
  x: { q: Tensor; k: Tensor; v: Tensor; g: Tensor; beta: Tensor; h0?: Tensor },
  request: KdaRequest,
  options: DispatchOptions,
): Promise<{ o: Tensor; ht: Tensor; arm: Arm }> {
  const { outputs: [o, ht], arm } = await kdaSeam.dispatch(
    [x.q, x.k, x.v, x.g, x.beta, x.h0],
    request,
    options,
  );
  return { o, ht, arm: arm as Arm };
}
