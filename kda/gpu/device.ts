// The gpu arm's device context: adapter, device, each kernel set's compiled pipelines and the lost
// state, held in one object instead of module globals. One context is current at a time; when its
// device is lost, the next call gets a fresh one (or, if that fails, a clear reason). A kernel set
// is compiled on its first use on a device and cached there.

import { RANGE_BYTES, wgslHeader } from "./layout.ts";
import { createBuffer, destroyBuffer, dropPooled, setPoolDefault } from "./buffers.ts";
import { wgslAccessors } from "./accessors.ts";
import type { KernelSet, StageDecl } from "./kernel_set.ts";
import { gpuDebug } from "./_debug.ts";

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
    maxComputeWorkgroupSizeX: number;
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

/** A kernel set compiled on one device: its bind group layout and one pipeline per entry point. */
export interface CompiledSet {
  /** The set. */
  readonly set: KernelSet;
  /** Group 0's layout of each stage: the params uniform, then the bindings it uses. */
  readonly layouts: ReadonlyMap<StageDecl, GPUBindGroupLayout>;
  /** One pipeline per entry point. */
  readonly pipelines: ReadonlyMap<string, GPUComputePipeline>;
}

/**
 * The shared WGSL files a kernel set may include, by name: the one place a set's dependencies on
 * code outside its own files are resolved (never by the order files are joined).
 */
export const SHARED_WGSL: Readonly<Record<string, URL>> = Object.freeze({
  shared: new URL("./kernels/shared.wgsl", import.meta.url),
});

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
  /** The features the device was created with. */
  readonly features: ReadonlySet<string>;
  /** Group 1 layout (one chunk range, dynamic offset), shared by every set's scans. */
  readonly rangeLayout: GPUBindGroupLayout;
  /** Stride of chunk ranges in their uniform buffer. */
  readonly rangeAlign: number;
  /** Bound where a stage uses no buffer of a writable slot (bind groups need every entry). */
  readonly placeholder: GPUBuffer;
  /** Bound where a stage uses no buffer of a read-only slot (it may not alias a writable one). */
  readonly readPlaceholder: GPUBuffer;
  /** Why the device was lost, once it was. */
  lostReason: string | null = null;
  readonly #compiled = new Map<string, Promise<CompiledSet>>();

  /**
   * Wraps a new device; its loss is recorded when the device reports it.
   *
   * @param device The device.
   * @param info Its adapter's description.
   * @param features The features the device was created with.
   */
  constructor(device: GPUDevice, info: GpuInfo, features: ReadonlySet<string>) {
    this.device = device;
    this.info = info;
    this.features = features;
    this.rangeAlign = Math.max(RANGE_BYTES, device.limits.minUniformBufferOffsetAlignment);
    this.rangeLayout = device.createBindGroupLayout({
      label: "kda chunk range",
      entries: [{
        binding: 0,
        visibility: GPUShaderStage.COMPUTE,
        buffer: { type: "uniform", hasDynamicOffset: true, minBindingSize: RANGE_BYTES },
      }],
    });
    setPoolDefault(device.limits);
    this.placeholder = createBuffer(device, "placeholder", 16, GPUBufferUsage.STORAGE);
    this.readPlaceholder = createBuffer(device, "read placeholder", 16, GPUBufferUsage.STORAGE);
    device.lost.then((lost) => {
      this.markLost(`${lost.reason}: ${lost.message || "no message"}`);
    });
  }

  /** Records the loss (idempotent) and frees the placeholders and the pooled buffers. */
  markLost(why: string): void {
    if (this.lostReason !== null) return;
    this.lostReason = `The GPU device was lost (${why})`;
    destroyBuffer(this.placeholder);
    destroyBuffer(this.readPlaceholder);
    dropPooled(this.device);
  }

  /** Throws a GpuError when the device was lost. */
  assertAlive(what: string): void {
    if (this.lostReason !== null) {
      throw new GpuError("device-lost", `${what} failed: ${this.lostReason}`);
    }
  }

  /**
   * Why this device cannot run a kernel set (a missing feature, too little workgroup memory, too
   * few storage bindings or invocations), or null.
   *
   * @param set The kernel set.
   * @returns A reason, or null.
   */
  setProblem(set: KernelSet): string | null {
    const missing = set.features.filter((f) => !this.features.has(f));
    if (missing.length > 0) {
      const lacking = missing.join(", ");
      return `the kernel set ${set.name} needs the feature ${lacking}, which the device on ` +
        `"${this.info.description}" lacks (it is created with ${WANTED_FEATURES.join(", ")} ` +
        `where the adapter offers them)`;
    }
    const { limits } = this.info;
    const storage = Math.max(
      ...[...set.forward.stages, ...(set.backward?.stages ?? [])].map((st) =>
        set.bindings.filter((b) => b.type !== "uniform" && (st.uses ?? [b.name]).includes(b.name))
          .length
      ),
    );
    const widest = Math.max(set.workgroupSize, set.largestWorkgroup ?? 0);
    const needs: [number, number, string][] = [
      [limits.maxComputeWorkgroupStorageSize, set.workgroupBytes, "bytes of workgroup memory"],
      [limits.maxStorageBuffersPerShaderStage, storage, "storage buffers per stage"],
      [limits.maxComputeInvocationsPerWorkgroup, widest, "invocations per workgroup"],
      [limits.maxComputeWorkgroupSizeX, widest, "invocations along x per workgroup"],
    ];
    for (const [have, want, what] of needs) {
      if (have < want) {
        return `the kernel set ${set.name} needs ${want} ${what}, and "${this.info.description}" ` +
          `offers ${have}`;
      }
    }
    return null;
  }

  /**
   * A kernel set's pipelines on this device, compiled on first use and cached.
   *
   * @param set The kernel set (setProblem must be null for it).
   * @returns The compiled set.
   */
  compiled(set: KernelSet): Promise<CompiledSet> {
    let compiled = this.#compiled.get(set.name);
    if (compiled === undefined) {
      compiled = compileSet(this, set);
      this.#compiled.set(set.name, compiled);
      // a failed compilation is not cached: the next call reports it again
      compiled.catch(() => this.#compiled.delete(set.name));
    }
    return compiled;
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
    const injected = gpuDebug.nextScopeError;
    gpuDebug.nextScopeError = null;
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

let current: Promise<GpuContext> | null = null;
let ready: GpuContext | null = null;
let unavailable: string | null = null;
let lastLoss: string | null = null;

/** A repository-relative name of a WGSL file, for messages ("kda/chunk.wgsl"). */
function fileName(url: URL): string {
  const at = url.pathname.lastIndexOf("/kda/");
  return at >= 0 ? url.pathname.slice(at + 1) : url.pathname;
}

/**
 * A kernel set's WGSL module: the header generated from the set, its accessors, the shared files
 * it includes by name, then its own files; and where each part starts (1-based lines) for
 * messages.
 */
async function setSource(
  set: KernelSet,
): Promise<{ code: string; parts: { name: string; line: number }[] }> {
  let code = wgslHeader(set) + wgslAccessors(set.accessors);
  const parts = [{ name: `the generated header and accessors of ${set.name}`, line: 1 }];
  const includes = set.include.map((name) => {
    const url = SHARED_WGSL[name];
    if (url === undefined) {
      throw new Error(
        `The kernel set ${set.name} includes ${name}, which is not shared WGSL: expected one of ` +
          Object.keys(SHARED_WGSL).join(", "),
      );
    }
    return url;
  });
  for (const url of [...includes, ...set.files]) {
    const text = await wgslText(url);
    parts.push({ name: fileName(url), line: code.split("\n").length });
    code += text;
    if (!code.endsWith("\n")) code += "\n";
  }
  const transform = gpuDebug.shaderTransform;
  return { code: transform === null ? code : transform(code, set.name), parts };
}

/**
 * The text of a WGSL file.
 *
 * @param url Where it is.
 * @returns Its text.
 * @throws {Error} When it cannot be loaded.
 * @example
 * ```ts
 * import { wgslText } from "./device.ts";
 * const code = await wgslText(new URL("./kernels/glue.wgsl", import.meta.url));
 * console.log(code.includes("fn padRows")); // true
 * ```
 */
export async function wgslText(url: URL): Promise<string> {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`Cannot load ${url.href}: HTTP ${response.status}`);
  return await response.text();
}

/** "file:line" of a line of the joined module. */
function sourceLine(parts: { name: string; line: number }[], line: number): string {
  const part = [...parts].reverse().find((p) => p.line <= line) ?? parts[0];
  return `${part.name}:${line - part.line + 1}`;
}

async function compileSet(ctx: GpuContext, set: KernelSet): Promise<CompiledSet> {
  const { device } = ctx;
  const { code, parts } = await setSource(set);
  const module = await ctx.scoped(
    `shader module creation for the kernel set ${set.name}`,
    () => device.createShaderModule({ label: `kda kernels ${set.name}`, code }),
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
      `The kernel set ${set.name}'s WGSL failed to compile: ${
        errors.map((m) => `${sourceLine(parts, m.lineNum)}:${m.linePos} ${m.message}`).join("; ")
      }`,
    );
  }
  const layouts = new Map<StageDecl, GPUBindGroupLayout>();
  const pipelines = new Map<string, GPUComputePipeline>();
  for (const stage of [...set.forward.stages, ...(set.backward?.stages ?? [])]) {
    const uses = stage.uses;
    const layout = await ctx.scoped(
      `bind group layout of ${set.name}.${stage.entry}`,
      () =>
        device.createBindGroupLayout({
          label: `kda ${set.name}.${stage.entry}`,
          entries: [
            { binding: 0, visibility: GPUShaderStage.COMPUTE, buffer: { type: "uniform" } },
            ...set.bindings.flatMap((b, i) =>
              uses === undefined || uses.includes(b.name)
                ? [{ binding: i + 1, visibility: GPUShaderStage.COMPUTE, buffer: { type: b.type } }]
                : []
            ),
          ],
        }),
    );
    layouts.set(stage, layout);
    const pipelineLayout = device.createPipelineLayout({
      bindGroupLayouts: [layout, ctx.rangeLayout],
    });
    // One pipeline per entry point, whatever the shape: shapes travel as uniforms.
    pipelines.set(
      stage.entry,
      await ctx.scoped(
        `pipeline creation for ${set.name}.${stage.entry}`,
        () =>
          device.createComputePipeline({
            label: `${set.name}.${stage.entry}`,
            layout: pipelineLayout,
            compute: { module, entryPoint: stage.entry },
          }),
      ),
    );
  }
  return { set, layouts, pipelines };
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

/** Features worth asking for when the adapter has them: timing, and f16 for sets that use it. */
const WANTED_FEATURES: readonly GPUFeatureName[] = ["timestamp-query", "shader-f16"];

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
    maxComputeWorkgroupSizeX: a.maxComputeWorkgroupSizeX,
    maxComputeWorkgroupsPerDimension: a.maxComputeWorkgroupsPerDimension,
  };
  const features = WANTED_FEATURES.filter((f) => adapter.features.has(f));
  const device = await adapter.requestDevice({
    requiredLimits: limits,
    requiredFeatures: features,
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
    timestamps: features.includes("timestamp-query"),
    limits,
  };
  device.addEventListener("uncapturederror", (event) => {
    // Every call runs inside error scopes, so this only fires for errors outside them.
    const error = (event as GPUUncapturedErrorEvent).error;
    console.error(`Uncaptured GPU error: ${error?.message ?? error}`);
  });
  return new GpuContext(device, info, new Set(features));
}

let exitHook = false;

/**
 * Destroys the live device when the process ends, while the runtime and the driver are still
 * whole, instead of leaving it to the process's teardown. Left to the teardown, a long test run on
 * the software adapter (llvmpipe) sometimes aborted in glibc ("double free or corruption") after
 * every test had passed: about one full `deno task test` in four here. What remains (about one
 * run in eight of many GPU test modules) is libEGL's destructor, which wgpu's GL backend loads,
 * racing an exiting thread's cleanup; CI selects Vulkan alone (README.md, GPUs).
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
