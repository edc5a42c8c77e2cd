// The gpu arm's device context: adapter, device, pipelines and lost state, held in one object
// instead of module globals. One context is current at a time; when its device is lost, the next
// call gets a fresh one (or, if that fails, a clear reason).

import {
  BINDINGS,
  RANGE_BYTES,
  type Stage,
  STAGES,
  STORAGE_BINDINGS,
  wgslHeader,
  WORKGROUP_BYTES,
  WORKGROUP_SIZE,
} from "./layout.ts";
import { createBuffer, destroyBuffer, dropPooled } from "./buffers.ts";
import { wgslAccessors } from "./accessors.ts";

/**
 * What the module knows about the adapter it runs on.
 *
 * @example
 * ```ts
 * import { gpuStatus } from "./mod.ts";
 * const status = await gpuStatus();
 * if (status.available) console.log(status.info.software, status.info.description);
 * ```
 */
export interface GpuInfo {
  /** The adapter's description, e.g. "NVIDIA H200" or "llvmpipe (LLVM 15.0.6, 256 bits)". */
  description: string;
  /** The adapter's vendor string (a PCI vendor id on Vulkan). */
  vendor: string;
  /** The adapter's architecture string (may be empty). */
  architecture: string;
  /** The adapter's device string (may be empty). */
  device: string;
  /** True for a software adapter (llvmpipe, lavapipe, SwiftShader, a fallback or CPU adapter). */
  software: boolean;
  /** Whether the device was created with `timestamp-query` (per-stage kernel timing). */
  timestamps: boolean;
  /** The device limits this module depends on (requested at the adapter's maximum). */
  limits: {
    maxComputeWorkgroupStorageSize: number;
    maxStorageBufferBindingSize: number;
    maxBufferSize: number;
    maxStorageBuffersPerShaderStage: number;
    maxComputeInvocationsPerWorkgroup: number;
    maxComputeWorkgroupsPerDimension: number;
  };
}

/** The kind of a GPU failure. */
export type GpuErrorKind = "validation" | "out-of-memory" | "internal" | "device-lost";

const ERROR_NAMES: Record<GpuErrorKind, string> = {
  "validation": "GpuValidationError",
  "out-of-memory": "GpuOutOfMemoryError",
  "internal": "GpuInternalError",
  "device-lost": "GpuDeviceLostError",
};

/**
 * A failure reported by the GPU (through an error scope, or a lost device); `name` says which
 * kind, e.g. "GpuOutOfMemoryError".
 *
 * @example
 * ```ts
 * const e = new GpuError("out-of-memory", "GPU out of memory in gpuForward: no room");
 * console.log(e.name); // "GpuOutOfMemoryError"
 * ```
 */
export class GpuError extends Error {
  /** What failed. */
  readonly kind: GpuErrorKind;
  /**
   * A GPU failure of the given kind.
   *
   * @param kind What failed.
   * @param message The message.
   */
  constructor(kind: GpuErrorKind, message: string) {
    super(message);
    this.kind = kind;
    this.name = ERROR_NAMES[kind];
  }
}

const SOFTWARE = /llvmpipe|lavapipe|swiftshader|software|\bcpu\b/i;

/**
 * One device and what was built on it.
 *
 * @example
 * ```ts
 * const ctx = await getContext();
 * const n = await ctx.scoped("a trivial step", () => 1 + 1); // throws a GpuError on a GPU error
 * console.log(n, ctx.info.description);
 * ```
 */
export class GpuContext {
  /** The device. */
  readonly device: GPUDevice;
  /** Adapter description and limits. */
  readonly info: GpuInfo;
  /** Group 0 layout (BINDINGS). */
  layout!: GPUBindGroupLayout;
  /** Group 1 layout (one chunk range, dynamic offset). */
  rangeLayout!: GPUBindGroupLayout;
  /** Stride of chunk ranges in their uniform buffer. */
  readonly rangeAlign: number;
  /** One pipeline per stage. */
  readonly pipelines: Map<Stage, GPUComputePipeline> = new Map();
  /** Bound where a stage uses no buffer of that slot (bind groups need every entry). */
  placeholder!: GPUBuffer;
  /** Why the device was lost, once it was. */
  lostReason: string | null = null;

  /**
   * Wraps a new device; its loss is recorded when the device reports it.
   *
   * @param device The device.
   * @param info Its adapter's description.
   */
  constructor(device: GPUDevice, info: GpuInfo) {
    this.device = device;
    this.info = info;
    this.rangeAlign = Math.max(RANGE_BYTES, device.limits.minUniformBufferOffsetAlignment);
    device.lost.then((lost) => {
      this.markLost(`${lost.reason}: ${lost.message || "no message"}`);
    });
  }

  /** Records the loss (idempotent) and frees the placeholder and the pooled buffers. */
  markLost(why: string): void {
    if (this.lostReason !== null) return;
    this.lostReason = `The GPU device was lost (${why})`;
    if (this.placeholder !== undefined) destroyBuffer(this.placeholder);
    dropPooled(this.device);
  }

  /** Throws a GpuError when the device was lost. */
  assertAlive(what: string): void {
    if (this.lostReason !== null) {
      throw new GpuError("device-lost", `${what} failed: ${this.lostReason}`);
    }
  }

  /**
   * Runs `body` inside validation, out-of-memory and internal error scopes, and throws a named
   * GpuError for the first that caught something. The scopes are pushed and popped before any
   * await, so concurrent calls cannot interleave on the device's scope stack.
   *
   * @param what What runs, for the message.
   * @param body Synchronous GPU work.
   * @returns What body returned.
   */
  async scoped<T>(what: string, body: () => T): Promise<T> {
    this.assertAlive(what);
    const device = this.device;
    device.pushErrorScope("internal");
    device.pushErrorScope("out-of-memory");
    device.pushErrorScope("validation");
    let result: T | undefined;
    let thrown: unknown = null;
    try {
      result = body();
    } catch (error) {
      thrown = error;
    }
    const popped = [device.popErrorScope(), device.popErrorScope(), device.popErrorScope()];
    const injected = testFaults.nextScopeError;
    testFaults.nextScopeError = null;
    const [validation, oom, internal] = await Promise.all(popped);
    if (validation !== null) {
      throw new GpuError("validation", `GPU validation error in ${what}: ${validation.message}`);
    }
    if (oom !== null || injected === "out-of-memory") {
      throw new GpuError(
        "out-of-memory",
        `GPU out of memory in ${what}: ${oom?.message ?? "injected by a test"}`,
      );
    }
    if (internal !== null) {
      throw new GpuError("internal", `GPU internal error in ${what}: ${internal.message}`);
    }
    if (thrown !== null) throw thrown;
    this.assertAlive(what);
    return result as T;
  }
}

/**
 * Test and bench hooks (not exported from mod.ts): a fault to inject into the next error-scope
 * check, and a transform applied to the shader text when the next device is created (the
 * ablation profile of bench/ablate.ts).
 */
export const testFaults: {
  nextScopeError: "out-of-memory" | null;
  shaderTransform: ((code: string) => string) | null;
} = { nextScopeError: null, shaderTransform: null };

let current: Promise<GpuContext> | null = null;
let ready: GpuContext | null = null;
let unavailable: string | null = null;
let lastLoss: string | null = null;

/** The WGSL files of the module, joined in this order after the generated header. */
const SHADER_FILES = ["../chunk.wgsl", "./scans.wgsl", "./intra_backward.wgsl"] as const;

/** The module's source, and where each part starts (line numbers, 1-based) for messages. */
async function loadShader(): Promise<{ code: string; parts: { name: string; line: number }[] }> {
  let code = wgslHeader() + wgslAccessors();
  const parts = [{ name: "the generated header and accessors", line: 1 }];
  for (const file of SHADER_FILES) {
    const url = new URL(file, import.meta.url);
    const response = await fetch(url);
    if (!response.ok) throw new Error(`Cannot load ${url.href}: HTTP ${response.status}`);
    const name = file.startsWith("../") ? `kda/${file.slice(3)}` : `kda/gpu/${file.slice(2)}`;
    parts.push({ name, line: code.split("\n").length });
    code += await response.text();
    if (!code.endsWith("\n")) code += "\n";
  }
  const transformed = testFaults.shaderTransform === null ? code : testFaults.shaderTransform(code);
  return { code: transformed, parts };
}

/** "file:line" of a line of the joined module. */
function sourceLine(parts: { name: string; line: number }[], line: number): string {
  const part = [...parts].reverse().find((p) => p.line <= line) ?? parts[0];
  return `${part.name}:${line - part.line + 1}`;
}

function need(have: number, want: number, what: string): void {
  if (have < want) throw new Error(`The adapter offers ${have} ${what}, the kernels need ${want}`);
}

/**
 * Without XDG_RUNTIME_DIR, Linux graphics stacks print "error: XDG_RUNTIME_DIR is invalid or not
 * set" while opening the adapter, which reads as a failure although nothing failed. When it is
 * missing and the environment may be written, point it at the system's temporary directory, so
 * that "error:" on stderr means an error.
 */
function settleRuntimeDir(): void {
  if (Deno.build.os !== "linux") return;
  try {
    if (
      Deno.permissions.querySync({ name: "env", variable: "XDG_RUNTIME_DIR" }).state !== "granted"
    ) {
      return;
    }
    if (Deno.env.get("XDG_RUNTIME_DIR") === undefined) Deno.env.set("XDG_RUNTIME_DIR", "/tmp");
  } catch {
    // A runtime without permission queries: leave the environment alone.
  }
}

async function createContext(): Promise<GpuContext> {
  if (typeof navigator === "undefined" || navigator.gpu === undefined) {
    throw new Error("WebGPU is not available in this runtime (navigator.gpu is undefined)");
  }
  settleRuntimeDir();
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (adapter === null) throw new Error("No WebGPU adapter was found");
  const a = adapter.limits;
  const limits = {
    maxComputeWorkgroupStorageSize: a.maxComputeWorkgroupStorageSize,
    maxStorageBufferBindingSize: a.maxStorageBufferBindingSize,
    maxBufferSize: a.maxBufferSize,
    maxStorageBuffersPerShaderStage: a.maxStorageBuffersPerShaderStage,
    maxComputeInvocationsPerWorkgroup: a.maxComputeInvocationsPerWorkgroup,
    maxComputeWorkgroupsPerDimension: a.maxComputeWorkgroupsPerDimension,
  };
  need(limits.maxComputeWorkgroupStorageSize, WORKGROUP_BYTES, "bytes of workgroup memory");
  need(limits.maxStorageBuffersPerShaderStage, STORAGE_BINDINGS, "storage buffers per stage");
  need(limits.maxComputeInvocationsPerWorkgroup, WORKGROUP_SIZE, "invocations per workgroup");
  const timestamps = adapter.features.has("timestamp-query");
  const device = await adapter.requestDevice({
    requiredLimits: { ...limits, maxComputeWorkgroupSizeX: WORKGROUP_SIZE },
    requiredFeatures: timestamps ? ["timestamp-query"] : [],
  });
  const ai = adapter.info as GPUAdapterInfo & { isFallbackAdapter?: boolean };
  const description = ai.description || ai.device || "unknown adapter";
  const info: GpuInfo = {
    description,
    vendor: ai.vendor,
    architecture: ai.architecture ?? "",
    device: ai.device ?? "",
    software: ai.isFallbackAdapter === true ||
      SOFTWARE.test(`${description} ${ai.device ?? ""} ${ai.architecture ?? ""}`),
    timestamps,
    limits,
  };
  device.addEventListener("uncapturederror", (event) => {
    // Every call runs inside error scopes, so this only fires for errors outside them.
    const error = (event as GPUUncapturedErrorEvent).error;
    console.error(`Uncaptured GPU error: ${error?.message ?? error}`);
  });
  const ctx = new GpuContext(device, info);
  try {
    const { code, parts } = await loadShader();
    const module = await ctx.scoped(
      "shader module creation",
      () => device.createShaderModule({ label: "kda/chunk.wgsl", code }),
    ).catch((error) => {
      // a parse error names lines of the joined module: name the file and its own line instead
      if (!(error instanceof GpuError)) throw error;
      throw new GpuError(
        error.kind,
        error.message.replace(
          /wgsl:(\d+):(\d+)/g,
          (_, line, col) => `${sourceLine(parts, Number(line))}:${col}`,
        ),
      );
    });
    const compilation = await module.getCompilationInfo();
    const errors = compilation.messages.filter((m) => m.type === "error");
    if (errors.length > 0) {
      throw new Error(
        `The gpu arm's WGSL failed to compile: ${
          errors.map((m) => `${sourceLine(parts, m.lineNum)}:${m.linePos} ${m.message}`)
            .join("; ")
        }`,
      );
    }
    await ctx.scoped("bind group layout creation", () => {
      ctx.layout = device.createBindGroupLayout({
        label: "kda",
        entries: BINDINGS.map((b, binding) => ({
          binding,
          visibility: GPUShaderStage.COMPUTE,
          buffer: { type: b.type },
        })),
      });
      ctx.rangeLayout = device.createBindGroupLayout({
        label: "kda chunk range",
        entries: [{
          binding: 0,
          visibility: GPUShaderStage.COMPUTE,
          buffer: { type: "uniform", hasDynamicOffset: true, minBindingSize: RANGE_BYTES },
        }],
      });
    });
    const pipelineLayout = device.createPipelineLayout({
      bindGroupLayouts: [ctx.layout, ctx.rangeLayout],
    });
    for (const stage of STAGES) {
      // One pipeline per entry point, whatever the shape: shapes travel as uniforms.
      const pipeline = await ctx.scoped(
        `pipeline creation for stage ${stage}`,
        () =>
          device.createComputePipeline({
            label: stage,
            layout: pipelineLayout,
            compute: { module, entryPoint: stage },
          }),
      );
      ctx.pipelines.set(stage, pipeline);
    }
    ctx.placeholder = createBuffer(device, "placeholder", 16, GPUBufferUsage.STORAGE);
  } catch (error) {
    device.destroy();
    throw error;
  }
  return ctx;
}

let exitHook = false;

/**
 * Destroys the live device when the process ends, while the runtime and the driver are still
 * whole, instead of leaving it to the process's teardown. Left to the teardown, a long test run on
 * the software adapter (llvmpipe) sometimes aborted in glibc ("double free or corruption") after
 * every test had passed: about one full `deno task test` in four here.
 */
function destroyAtExit(): void {
  if (exitHook) return;
  exitHook = true;
  globalThis.addEventListener("unload", () => {
    const ctx = ready;
    if (ctx === null || ctx.lostReason !== null) return;
    ctx.markLost("the process is exiting");
    ctx.device.destroy();
  });
}

/**
 * The current context, created on first use; after a device loss, a fresh one.
 *
 * @returns The context.
 * @throws {Error} "The gpu arm is unavailable: ..." when no device can be created.
 * @example
 * ```ts
 * const ctx = await getContext();
 * console.log(ctx.info.software);
 * ```
 */
export async function getContext(): Promise<GpuContext> {
  if (ready !== null && ready.lostReason !== null) {
    lastLoss = ready.lostReason;
    ready = null;
    current = null;
  }
  if (current === null) {
    if (unavailable !== null) throw new Error(`The gpu arm is unavailable: ${unavailable}`);
    current = createContext().then((ctx) => {
      ready = ctx;
      destroyAtExit();
      return ctx;
    }, (error) => {
      unavailable = error instanceof Error ? error.message : String(error);
      if (lastLoss !== null) unavailable = `${lastLoss}, and no new device: ${unavailable}`;
      throw error;
    });
  }
  try {
    return await current;
  } catch {
    throw new Error(`The gpu arm is unavailable: ${unavailable}`);
  }
}

/**
 * The context when one is ready and alive, else why not (synchronous).
 *
 * @returns The context or a reason.
 * @example
 * ```ts
 * await getContext();
 * const ctx = readyContext();
 * console.log(typeof ctx === "string" ? ctx : ctx.info.description);
 * ```
 */
export function readyContext(): GpuContext | string {
  if (ready !== null && ready.lostReason === null) return ready;
  if (ready !== null) return `${ready.lostReason}; await gpuStatus() for a fresh device`;
  if (unavailable !== null) return `The gpu arm is unavailable: ${unavailable}`;
  return "No GPU device yet: await gpuStatus() first";
}

/**
 * The last device loss this process saw, if any.
 *
 * @returns The reason, or null.
 * @example
 * ```ts
 * console.log(lastDeviceLoss() ?? "no device lost");
 * ```
 */
export function lastDeviceLoss(): string | null {
  return ready?.lostReason ?? lastLoss;
}

/**
 * Destroys the current device, as a driver reset would (test-only; not exported from mod.ts).
 *
 * @returns Whether there was a device to destroy.
 * @example
 * ```ts
 * await getContext();
 * destroyDeviceForTests(); // the next getContext() creates a fresh device
 * console.log((await getContext()).lostReason); // null
 * ```
 */
export function destroyDeviceForTests(): boolean {
  if (ready === null) return false;
  const ctx = ready;
  ctx.device.destroy();
  ctx.markLost("destroyed by a test");
  return true;
}
