// The `gpu` arm of the KDA op: device, pipelines, buffers and dispatch for kda/chunk.wgsl.
//
// Host round trips dominate small calls (Deno polls the device: each mapAsync costs about 10 ms),
// so a forward is one submit and one readback (o and ht share a staging buffer), and a backward
// likewise (all six gradients share one). What the backward needs (the packed inputs, the per-chunk
// work and the chunk-start states) stays on the GPU inside a GpuSaved handle.

import type { ChunkSize, RawGrads, RawKda } from "./_types.ts";
import { MAX_HEAD_DIM } from "./_types.ts";

/**
 * What the module knows about the adapter it runs on.
 *
 * @example
 * ```ts
 * const status = await gpuStatus();
 * if (status.available) console.log(status.info.limits.maxComputeWorkgroupStorageSize);
 * ```
 */
export interface GpuInfo {
  /** The adapter's description, e.g. "NVIDIA H200" or "llvmpipe (LLVM 15.0.6, 256 bits)". */
  description: string;
  /** The adapter's vendor string (a PCI vendor id on Vulkan). */
  vendor: string;
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

/**
 * What the backward needs, kept on the GPU (the packed inputs, the per-chunk work of intraChunk and
 * the chunk-start states): nothing is read back until gpuBackward. gpuBackward releases it; call
 * release() yourself when the backward will not run.
 *
 * @example
 * ```ts
 * const B = 1, T = 8, H = 1, K = 4, V = 4;
 * const { saved } = await gpuForward({
 *   B, T, H, K, V, scale: 0.5,
 *   q: new Float32Array(B * T * H * K).fill(0.1),
 *   k: new Float32Array(B * T * H * K).fill(0.5),
 *   v: new Float32Array(B * T * H * V).fill(1),
 *   g: new Float32Array(B * T * H * K).fill(-0.1),
 *   beta: new Float32Array(B * T * H).fill(0.5),
 * }, { chunkSize: 16, saveForBackward: true });
 * saved!.release(); // no backward after all
 * ```
 */
export interface GpuSaved {
  /** Frees the GPU buffers; calling it twice is harmless. */
  release(): void;
  /** Whether {@linkcode GpuSaved.release} has run (gpuBackward releases the handle it consumes). */
  readonly released: boolean;
}

// Must match chunk.wgsl.
const WORKGROUP_SIZE = 256;
const TILE_FLOATS = 2048;
// Every kernel declares the same 4096 floats of workgroup memory (WebGPU's default 16 KiB).
const WORKGROUP_BYTES = 2 * TILE_FLOATS * 4;
const STORAGE_BINDINGS = 6;
const HAS_H0 = 1, HAS_DHT = 2, SAVE_STATES = 4;
const PARAM_WORDS = 20;
const RANGE_BYTES = 16;
const SCAN_TARGET_GROUPS = 512;
const MIN_SCAN_TILE = 4;
// llvmpipe ends an invocation, silently, after 65535 loop iterations counted over all its loops;
// each scan dispatch covers only as many chunks as keep the busiest invocation under this. The
// chunk-parallel kernels stay under it by construction: their busiest invocation runs about 36,000
// iterations at K = V = 256, C = 64 (intraChunkBackward), and the tests run that shape.
const LOOP_BUDGET = 60000;

const STAGES = ["intraChunk", "stateScan", "stateScanBackward", "intraChunkBackward"] as const;
type Stage = typeof STAGES[number];

interface DeviceState {
  device: GPUDevice;
  info: GpuInfo;
  layout: GPUBindGroupLayout;
  rangeLayout: GPUBindGroupLayout;
  rangeAlign: number;
  pipelines: Map<Stage, GPUComputePipeline>;
  // Binds where a stage uses no buffer of that slot (bind groups need every entry).
  placeholder: GPUBuffer;
}

let devicePromise: Promise<DeviceState> | null = null;
let readyDevice: DeviceState | null = null;
let unavailableReason: string | null = null;
let lostReason: string | null = null;
let liveBuffers = 0;

async function loadShader(): Promise<string> {
  const url = new URL("./chunk.wgsl", import.meta.url);
  const response = await fetch(url);
  if (!response.ok) throw new Error(`Cannot load ${url.href}: HTTP ${response.status}`);
  return await response.text();
}

async function withErrorScopes<T>(what: string, body: () => T): Promise<T> {
  const device = readyDevice?.device;
  if (device === undefined) throw new Error("No GPU device");
  // A shader the driver fails to compile surfaces as an internal error, not a validation error.
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
  // Pop every scope whatever happened, so that a throw cannot leave them on the device's stack, and
  // pop them before awaiting anything: the scope stack is per device, and a concurrent call must
  // not push its own scopes between ours.
  const [validation, oom, internal] = await Promise.all([
    device.popErrorScope(),
    device.popErrorScope(),
    device.popErrorScope(),
  ]);
  if (validation !== null) {
    throw new Error(`GPU validation error in ${what}: ${validation.message}`);
  }
  if (oom !== null) throw new Error(`GPU out of memory in ${what}: ${oom.message}`);
  if (internal !== null) throw new Error(`GPU internal error in ${what}: ${internal.message}`);
  if (thrown !== null) throw thrown;
  return result as T;
}

async function createDevice(): Promise<DeviceState> {
  if (typeof navigator === "undefined" || navigator.gpu === undefined) {
    throw new Error("WebGPU is not available in this runtime (navigator.gpu is undefined)");
  }
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
  if (limits.maxComputeWorkgroupStorageSize < WORKGROUP_BYTES) {
    throw new Error(
      `The adapter offers ${limits.maxComputeWorkgroupStorageSize} bytes of workgroup memory, ` +
        `the kernels need ${WORKGROUP_BYTES}`,
    );
  }
  if (limits.maxStorageBuffersPerShaderStage < STORAGE_BINDINGS) {
    throw new Error(
      `The adapter offers ${limits.maxStorageBuffersPerShaderStage} storage buffers per stage, ` +
        `the kernels need ${STORAGE_BINDINGS}`,
    );
  }
  if (limits.maxComputeInvocationsPerWorkgroup < WORKGROUP_SIZE) {
    throw new Error(
      `The adapter offers ${limits.maxComputeInvocationsPerWorkgroup} invocations per ` +
        `workgroup, the kernels need ${WORKGROUP_SIZE}`,
    );
  }
  const device = await adapter.requestDevice({
    requiredLimits: { ...limits, maxComputeWorkgroupSizeX: WORKGROUP_SIZE },
  });
  const info: GpuInfo = {
    description: adapter.info.description || adapter.info.device || "unknown adapter",
    vendor: adapter.info.vendor,
    limits,
  };
  device.lost.then((lost) => {
    lostReason = `The GPU device was lost (${lost.reason}): ${lost.message || "no message"}`;
  });
  device.addEventListener("uncapturederror", (event) => {
    // Every call runs inside error scopes, so this only fires for errors outside them.
    const error = (event as GPUUncapturedErrorEvent).error;
    console.error(`Uncaptured GPU error: ${error?.message ?? error}`);
  });

  const state: DeviceState = {
    device,
    info,
    layout: null as unknown as GPUBindGroupLayout,
    rangeLayout: null as unknown as GPUBindGroupLayout,
    rangeAlign: Math.max(RANGE_BYTES, device.limits.minUniformBufferOffsetAlignment),
    pipelines: new Map(),
    placeholder: null as unknown as GPUBuffer,
  };
  readyDevice = state;
  try {
    const code = await loadShader();
    const module = await withErrorScopes(
      "shader module creation",
      () => device.createShaderModule({ label: "kda/chunk.wgsl", code }),
    );
    const compilation = await module.getCompilationInfo();
    const errors = compilation.messages.filter((m) => m.type === "error");
    if (errors.length > 0) {
      throw new Error(
        `kda/chunk.wgsl failed to compile: ${
          errors.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join("; ")
        }`,
      );
    }
    state.layout = await withErrorScopes(
      "bind group layout creation",
      () =>
        device.createBindGroupLayout({
          label: "kda",
          entries: [
            { binding: 0, visibility: GPUShaderStage.COMPUTE, buffer: { type: "uniform" } },
            {
              binding: 1,
              visibility: GPUShaderStage.COMPUTE,
              buffer: { type: "read-only-storage" },
            },
            ...[2, 3, 4, 5, 6].map((binding) => ({
              binding,
              visibility: GPUShaderStage.COMPUTE,
              buffer: { type: "storage" as const },
            })),
          ],
        }),
    );
    state.rangeLayout = await withErrorScopes(
      "bind group layout creation",
      () =>
        device.createBindGroupLayout({
          label: "kda chunk range",
          entries: [{
            binding: 0,
            visibility: GPUShaderStage.COMPUTE,
            buffer: { type: "uniform", hasDynamicOffset: true, minBindingSize: RANGE_BYTES },
          }],
        }),
    );
    const pipelineLayout = device.createPipelineLayout({
      bindGroupLayouts: [state.layout, state.rangeLayout],
    });
    for (const stage of STAGES) {
      // One pipeline per entry point, whatever the shape: shapes travel as uniforms.
      const pipeline = await withErrorScopes(
        `pipeline creation for stage ${stage}`,
        () =>
          device.createComputePipeline({
            label: stage,
            layout: pipelineLayout,
            compute: { module, entryPoint: stage },
          }),
      );
      state.pipelines.set(stage, pipeline);
    }
    state.placeholder = createBuffer(device, "placeholder", 16, GPUBufferUsage.STORAGE);
  } catch (error) {
    readyDevice = null;
    device.destroy();
    throw error;
  }
  return state;
}

function initDevice(): Promise<DeviceState> {
  if (devicePromise === null) {
    devicePromise = createDevice().catch((error) => {
      unavailableReason = error instanceof Error ? error.message : String(error);
      throw error;
    });
  }
  return devicePromise;
}

async function getDevice(): Promise<DeviceState> {
  let state: DeviceState;
  try {
    state = await initDevice();
  } catch {
    throw new Error(`The GPU arm is unavailable: ${unavailableReason}`);
  }
  if (lostReason !== null) throw new Error(lostReason);
  return state;
}

/**
 * Whether the GPU arm can run here. The first call creates the one device of this process (lazily,
 * requesting the adapter's own limits); later calls return the cached answer, or the reason the
 * device was lost.
 *
 * @returns `{ available: true, info }` with the adapter's description and limits, or
 *   `{ available: false, reason }` with a readable reason (no adapter, device lost, ...).
 *
 * @example
 * ```ts
 * const status = await gpuStatus();
 * console.log(status.available ? status.info.description : status.reason);
 * ```
 */
export async function gpuStatus(): Promise<
  { available: true; info: GpuInfo } | { available: false; reason: string }
> {
  try {
    const state = await initDevice();
    if (lostReason !== null) return { available: false, reason: lostReason };
    return { available: true, info: state.info };
  } catch {
    return { available: false, reason: unavailableReason ?? "unknown error" };
  }
}

interface Plan {
  B: number;
  T: number;
  H: number;
  K: number;
  V: number;
  C: number;
  NC: number;
  VT: number;
  nVT: number;
  nQK: number;
  nV: number;
  nB: number;
  nS: number;
  workFloats: number;
  bwFloats: number;
  gsFloats: number;
  statesFloats: number;
}

function makePlan(
  shape: { B: number; T: number; H: number; K: number; V: number },
  C: number,
): Plan {
  const { B, T, H, K, V } = shape;
  const NC = Math.ceil(T / C);
  // The scans are sequential over chunks and parallel over (b, h, V tile) only: when B·H is small,
  // narrower tiles give more workgroups and shorter per-invocation loops (same bits: the tiles
  // never share a sum).
  let VT = Math.min(V, Math.floor(TILE_FLOATS / Math.max(K, C)));
  while (VT > MIN_SCAN_TILE && B * H * Math.ceil(V / VT) < SCAN_TARGET_GROUPS) {
    VT = Math.max(MIN_SCAN_TILE, Math.ceil(VT / 2));
  }
  const chunks = B * H * NC;
  return {
    B,
    T,
    H,
    K,
    V,
    C,
    NC,
    VT,
    nVT: Math.ceil(V / VT),
    nQK: B * T * H * K,
    nV: B * T * H * V,
    nB: B * T * H,
    nS: B * H * K * V,
    workFloats: chunks * (5 * C * K + C * V + 3 * C * C + K),
    bwFloats: chunks * (2 * C * V + K * V),
    gsFloats: chunks * (5 * C * K + 5 * C * C + K + C),
    statesFloats: chunks * K * V,
  };
}

function inputFloats(plan: Plan, withH0: boolean, withCotangents: boolean): number {
  return 3 * plan.nQK + plan.nV + plan.nB + (withH0 ? plan.nS : 0) +
    (withCotangents ? plan.nV + plan.nS : 0);
}

function shapeProblem(
  shape: { B: number; T: number; H: number; K: number; V: number },
  chunkSize: number,
): string | null {
  for (const name of ["B", "T", "H", "K", "V"] as const) {
    const value = shape[name];
    if (!Number.isInteger(value) || value < 1) {
      return `Argument ${name} must be a positive integer, got ${value}`;
    }
  }
  if (chunkSize !== 16 && chunkSize !== 32 && chunkSize !== 64) {
    return `Argument chunkSize must be 16, 32 or 64, got ${chunkSize}`;
  }
  if (shape.K > MAX_HEAD_DIM) return `K must be at most ${MAX_HEAD_DIM}, got ${shape.K}`;
  if (shape.V > MAX_HEAD_DIM) return `V must be at most ${MAX_HEAD_DIM}, got ${shape.V}`;
  return null;
}

function limitProblem(plan: Plan, info: GpuInfo): string | null {
  const maxBinding = Math.min(info.limits.maxStorageBufferBindingSize, info.limits.maxBufferSize);
  const buffers: [string, number][] = [
    ["packed inputs", inputFloats(plan, true, true)],
    ["per-chunk work", plan.workFloats],
    ["chunk-start states", plan.statesFloats],
    ["outputs", plan.nV + plan.nS],
    ["backward scratch", plan.bwFloats],
    ["gradient scratch", plan.gsFloats],
    ["gradients", 3 * plan.nQK + plan.nV + plan.nB + plan.nS],
  ];
  for (const [name, floats] of buffers) {
    const bytes = floats * 4;
    if (bytes > maxBinding) {
      return `The ${name} buffer needs ${bytes} bytes, over the device's storage binding limit ` +
        `of ${maxBinding} bytes (B=${plan.B}, T=${plan.T}, H=${plan.H}, K=${plan.K}, ` +
        `V=${plan.V}, chunkSize=${plan.C}); use a smaller batch or a larger chunk size`;
    }
  }
  const perDim = info.limits.maxComputeWorkgroupsPerDimension;
  const groups = Math.max(plan.B * plan.H * plan.NC, plan.B * plan.H * plan.nVT);
  if (groups > perDim * perDim) {
    return `The shape needs ${groups} workgroups, over the device's ${perDim}² limit`;
  }
  return null;
}

/**
 * Why the GPU arm cannot run a shape, or null when it can. Call after {@linkcode gpuStatus} has
 * reported the device available: the answer depends on its limits.
 *
 * @param shape B, T, H, K, V of the problem.
 * @param chunkSize The chunk size the forward and backward would use.
 * @returns null when the shape runs, else a readable reason (no device, K or V over 256, a buffer
 *   over the device's storage binding limit, ...).
 *
 * @example
 * ```ts
 * if ((await gpuStatus()).available) {
 *   console.log(gpuUnsupportedReason({ B: 1, T: 64, H: 1, K: 512, V: 64 }, 16)); // K too large
 * }
 * ```
 */
export function gpuUnsupportedReason(
  shape: { B: number; T: number; H: number; K: number; V: number },
  chunkSize: ChunkSize,
): string | null {
  if (lostReason !== null) return lostReason;
  if (readyDevice === null) {
    return unavailableReason !== null
      ? `The GPU arm is unavailable: ${unavailableReason}`
      : "No GPU device yet: await gpuStatus() first";
  }
  const problem = shapeProblem(shape, chunkSize);
  if (problem !== null) return problem;
  return limitProblem(makePlan(shape, chunkSize), readyDevice.info);
}

/**
 * The number of GPU buffers this module has created and not yet destroyed (for leak tests).
 *
 * @returns The live buffer count, including the device's one long-lived placeholder buffer.
 *
 * @example
 * ```ts
 * const before = gpuLiveBuffers();
 * // ... forward and backward calls, each saved handle consumed or released ...
 * console.log(gpuLiveBuffers() === before);
 * ```
 */
export function gpuLiveBuffers(): number {
  return liveBuffers;
}

function createBuffer(
  device: GPUDevice,
  label: string,
  bytes: number,
  usage: number,
): GPUBuffer {
  const buffer = device.createBuffer({
    label,
    size: Math.max(16, Math.ceil(bytes / 4) * 4),
    usage,
  });
  liveBuffers++;
  return buffer;
}

function destroyBuffer(buffer: GPUBuffer): void {
  buffer.destroy();
  liveBuffers--;
}

// Typed arrays over a SharedArrayBuffer upload as well; the DOM typings only name ArrayBuffer.
function upload(queue: GPUQueue, buffer: GPUBuffer, byteOffset: number, data: Float32Array): void {
  queue.writeBuffer(buffer, byteOffset, data as Float32Array<ArrayBuffer>);
}

const NAN_BLOCK = new Float32Array(1 << 20).fill(NaN);

function fillNaN(device: GPUDevice, buffer: GPUBuffer, floats: number): void {
  for (let at = 0; at < floats; at += NAN_BLOCK.length) {
    const n = Math.min(NAN_BLOCK.length, floats - at);
    device.queue.writeBuffer(buffer, at * 4, NAN_BLOCK, 0, n);
  }
}

function checkArray(name: string, value: unknown, expected: number, formula: string): Float32Array {
  if (!(value instanceof Float32Array)) {
    const actual = value === undefined
      ? "undefined"
      : (value as object)?.constructor?.name ?? typeof value;
    throw new TypeError(`Argument ${name} must be a Float32Array, got ${actual}`);
  }
  if (value.length !== expected) {
    throw new RangeError(
      `Argument ${name} must have length ${formula} = ${expected}, got ${value.length}`,
    );
  }
  return value;
}

function paramsBytes(
  plan: Plan,
  flags: number,
  scale: number,
  offsets: {
    q: number;
    k: number;
    v: number;
    g: number;
    beta: number;
    h0: number;
    dout: number;
    dht: number;
  },
): ArrayBuffer {
  const bytes = new ArrayBuffer(PARAM_WORDS * 4);
  const u = new Uint32Array(bytes);
  const f = new Float32Array(bytes);
  u.set([plan.B, plan.T, plan.H, plan.K, plan.V, plan.C, plan.NC, plan.VT, plan.nVT, flags]);
  f[10] = scale;
  u.set(
    [
      offsets.q,
      offsets.k,
      offsets.v,
      offsets.g,
      offsets.beta,
      offsets.h0,
      offsets.dout,
      offsets.dht,
    ],
    12,
  );
  return bytes;
}

/** Splits the NC chunks into the ranges of successive scan dispatches (see LOOP_BUDGET). */
function scanRanges(plan: Plan): [number, number][] {
  const perThread = (n: number) => Math.ceil(n / WORKGROUP_SIZE);
  const stateLoops = perThread(plan.K * plan.VT);
  const rowLoops = perThread(plan.C * plan.VT);
  // iterations of the busiest invocation per chunk: the larger of the two scans (chunk.wgsl)
  const perChunk = stateLoops * (plan.C + 3) + rowLoops * (2 * plan.K + plan.C + 3);
  const chunksPer = Math.max(1, Math.floor((LOOP_BUDGET - 4 * stateLoops) / perChunk));
  const ranges: [number, number][] = [];
  for (let n0 = 0; n0 < plan.NC; n0 += chunksPer) {
    ranges.push([n0, Math.min(plan.NC, n0 + chunksPer)]);
  }
  return ranges;
}

function dispatchGrid(groups: number, perDim: number): [number, number] {
  const x = Math.min(groups, perDim);
  return [x, Math.ceil(groups / x)];
}

interface Offsets {
  q: number;
  k: number;
  v: number;
  g: number;
  beta: number;
  h0: number;
  dout: number;
  dht: number;
}

class SavedState implements GpuSaved {
  #buffers: GPUBuffer[];
  #released = false;
  constructor(
    readonly plan: Plan,
    readonly scale: number,
    readonly flags: number,
    readonly offsets: Offsets,
    readonly inputs: GPUBuffer,
    readonly work: GPUBuffer,
    readonly states: GPUBuffer,
  ) {
    this.#buffers = [inputs, work, states];
  }
  get released(): boolean {
    return this.#released;
  }
  release(): void {
    if (this.#released) return;
    this.#released = true;
    for (const buffer of this.#buffers) destroyBuffer(buffer);
    this.#buffers = [];
  }
}

async function readBack(
  state: DeviceState,
  what: string,
  encoder: GPUCommandEncoder,
  source: GPUBuffer,
  floats: number,
): Promise<Float32Array> {
  const { device } = state;
  const staging = createBuffer(
    device,
    `${what} staging`,
    floats * 4,
    GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  );
  try {
    await withErrorScopes(`${what} (submit)`, () => {
      encoder.copyBufferToBuffer(source, 0, staging, 0, floats * 4);
      device.queue.submit([encoder.finish()]);
    });
    try {
      await staging.mapAsync(GPUMapMode.READ, 0, floats * 4);
    } catch (error) {
      const why = lostReason ?? (error instanceof Error ? error.message : String(error));
      throw new Error(`${what} failed while reading back its results: ${why}`);
    }
    if (lostReason !== null) throw new Error(`${what} failed: ${lostReason}`);
    const result = new Float32Array(staging.getMappedRange(0, floats * 4).slice(0));
    staging.unmap();
    return result;
  } finally {
    destroyBuffer(staging);
  }
}

interface Ranges {
  bindGroup: GPUBindGroup;
  count: number;
}

function makeRanges(
  state: DeviceState,
  plan: Plan,
  make: (label: string, floats: number, usage: number) => GPUBuffer,
  reverse: boolean,
): Ranges {
  const ranges = scanRanges(plan);
  if (reverse) ranges.reverse();
  const stride = state.rangeAlign;
  const buffer = make(
    "chunk ranges",
    (ranges.length * stride) / 4,
    GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  );
  const words = new Uint32Array((ranges.length * stride) / 4);
  ranges.forEach(([n0, n1], i) => words.set([n0, n1], (i * stride) / 4));
  state.device.queue.writeBuffer(buffer, 0, words);
  const bindGroup = state.device.createBindGroup({
    label: "kda chunk ranges",
    layout: state.rangeLayout,
    entries: [{ binding: 0, resource: { buffer, size: RANGE_BYTES } }],
  });
  return { bindGroup, count: ranges.length };
}

/** Encodes the stages in order into one pass; a scan stage runs once per chunk range. */
function encodePass(
  state: DeviceState,
  encoder: GPUCommandEncoder,
  bindGroup: GPUBindGroup,
  ranges: Ranges,
  stages: [Stage, number, "chunks" | "scan"][],
): void {
  const pass = encoder.beginComputePass({ label: stages.map(([s]) => s).join(" -> ") });
  pass.setBindGroup(0, bindGroup);
  const perDim = state.info.limits.maxComputeWorkgroupsPerDimension;
  for (const [stage, groups, kind] of stages) {
    pass.setPipeline(state.pipelines.get(stage)!);
    const [x, y] = dispatchGrid(groups, perDim);
    const count = kind === "scan" ? ranges.count : 1;
    for (let i = 0; i < count; i++) {
      pass.setBindGroup(1, ranges.bindGroup, [i * state.rangeAlign]);
      pass.dispatchWorkgroups(x, y);
    }
  }
  pass.end();
}

/**
 * The chunked KDA forward (DESIGN.md 2.2) on the GPU, in f32: one submit, one readback.
 *
 * @param x Raw inputs with Float32Array fields (q, k, g [B,T,H,K]; v [B,T,H,V]; beta [B,T,H];
 *   optional h0 [B,H,K,V]) and the resolved scale.
 * @param options `chunkSize` (16, 32 or 64); `saveForBackward` keeps what
 *   {@linkcode gpuBackward} needs on the GPU; `prefillNaN` fills every output and scratch buffer
 *   with NaN first, so that a missing write cannot pass as a zero (for tests).
 * @returns `o` [B,T,H,V], `ht` [B,H,K,V], and `saved` when `saveForBackward` was set (consume it
 *   with gpuBackward or call its release()).
 * @throws {TypeError} When an array is not a Float32Array.
 * @throws {RangeError} When a length or the shape is wrong, or the shape exceeds a device limit.
 * @throws {Error} When no GPU is available, the device was lost, or a GPU error occurred.
 *
 * @example
 * ```ts
 * const B = 1, T = 20, H = 1, K = 4, V = 4;
 * const { o, ht } = await gpuForward({
 *   B, T, H, K, V, scale: 0.5,
 *   q: new Float32Array(B * T * H * K).fill(0.1),
 *   k: new Float32Array(B * T * H * K).fill(0.5),
 *   v: new Float32Array(B * T * H * V).fill(1),
 *   g: new Float32Array(B * T * H * K).fill(-0.1),
 *   beta: new Float32Array(B * T * H).fill(0.5),
 * }, { chunkSize: 16 });
 * ```
 */
export async function gpuForward(
  x: RawKda,
  options: { chunkSize: ChunkSize; saveForBackward?: boolean; prefillNaN?: boolean },
): Promise<{ o: Float32Array; ht: Float32Array; saved?: GpuSaved }> {
  const shapeError = shapeProblem(x, options?.chunkSize);
  if (shapeError !== null) throw new RangeError(shapeError);
  const state = await getDevice();
  const plan = makePlan(x, options.chunkSize);
  const limitError = limitProblem(plan, state.info);
  if (limitError !== null) throw new RangeError(limitError);
  const { B, T, H, K, V } = x;
  const q = checkArray("q", x.q, B * T * H * K, "B·T·H·K");
  const k = checkArray("k", x.k, B * T * H * K, "B·T·H·K");
  const v = checkArray("v", x.v, B * T * H * V, "B·T·H·V");
  const g = checkArray("g", x.g, B * T * H * K, "B·T·H·K");
  const beta = checkArray("beta", x.beta, B * T * H, "B·T·H");
  const h0 = x.h0 === undefined ? undefined : checkArray("h0", x.h0, B * H * K * V, "B·H·K·V");
  if (!Number.isFinite(x.scale)) {
    throw new RangeError(`Argument scale must be a finite number, got ${x.scale}`);
  }
  const { device } = state;
  const save = options.saveForBackward === true;
  const prefill = options.prefillNaN === true;

  let at = 0;
  const place = (n: number) => {
    const offset = at;
    at += n;
    return offset;
  };
  const offsets: Offsets = {
    q: place(plan.nQK),
    k: place(plan.nQK),
    v: place(plan.nV),
    g: place(plan.nQK),
    beta: place(plan.nB),
    h0: h0 !== undefined ? place(plan.nS) : 0,
    dout: save ? place(plan.nV) : 0,
    dht: save ? place(plan.nS) : 0,
  };
  const flags = (h0 !== undefined ? HAS_H0 : 0) | (save ? SAVE_STATES : 0);
  const outFloats = plan.nV + plan.nS;

  const owned: GPUBuffer[] = [];
  const make = (label: string, floats: number, usage: number) => {
    const buffer = createBuffer(device, label, floats * 4, usage);
    owned.push(buffer);
    return buffer;
  };
  const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
  let saved: SavedState | undefined;
  try {
    const { inputs, work, states, out, bindGroup, ranges } = await withErrorScopes(
      "gpuForward (allocation and upload)",
      () => {
        const inputs = make("inputs", at, STORAGE);
        const work = make("work", plan.workFloats, STORAGE);
        const states = save ? make("states", plan.statesFloats, STORAGE) : state.placeholder;
        const out = make("o | ht", outFloats, STORAGE | GPUBufferUsage.COPY_SRC);
        const params = make(
          "params",
          PARAM_WORDS,
          GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
        );
        const queue = device.queue;
        queue.writeBuffer(params, 0, paramsBytes(plan, flags, x.scale, offsets));
        if (prefill) {
          fillNaN(device, inputs, at);
          fillNaN(device, work, plan.workFloats);
          if (save) fillNaN(device, states, plan.statesFloats);
          fillNaN(device, out, outFloats);
        }
        upload(queue, inputs, offsets.q * 4, q);
        upload(queue, inputs, offsets.k * 4, k);
        upload(queue, inputs, offsets.v * 4, v);
        upload(queue, inputs, offsets.g * 4, g);
        upload(queue, inputs, offsets.beta * 4, beta);
        if (h0 !== undefined) upload(queue, inputs, offsets.h0 * 4, h0);
        const ranges = makeRanges(state, plan, make, false);
        const bindGroup = device.createBindGroup({
          label: "kda forward",
          layout: state.layout,
          entries: [params, inputs, work, states, out, state.placeholder, state.placeholder].map(
            (buffer, binding) => ({ binding, resource: { buffer } }),
          ),
        });
        return { inputs, work, states, out, params, bindGroup, ranges };
      },
    );
    const encoder = device.createCommandEncoder({ label: "kda forward" });
    await withErrorScopes(
      "gpuForward (encoding intraChunk -> stateScan)",
      () =>
        encodePass(state, encoder, bindGroup, ranges, [
          ["intraChunk", plan.B * plan.H * plan.NC, "chunks"],
          ["stateScan", plan.B * plan.H * plan.nVT, "scan"],
        ]),
    );
    const result = await readBack(state, "gpuForward", encoder, out, outFloats);
    if (save) {
      // The saved handle now owns these three; the rest are freed below.
      for (const buffer of [inputs, work, states]) owned.splice(owned.indexOf(buffer), 1);
      saved = new SavedState(plan, x.scale, flags, offsets, inputs, work, states);
    }
    return {
      o: result.subarray(0, plan.nV),
      ht: result.subarray(plan.nV),
      ...(saved !== undefined ? { saved } : {}),
    };
  } finally {
    for (const buffer of owned) destroyBuffer(buffer);
  }
}

/**
 * The chunked KDA backward (DESIGN.md 2.3) on the GPU, in f32: one submit, one readback. Consumes
 * (releases) `saved`, also when it throws.
 *
 * @param saved The handle returned by {@linkcode gpuForward} with `saveForBackward: true`.
 * @param cotangents `dout` [B,T,H,V] and optional `dht` [B,H,K,V] (absent means zero), Float32Array.
 * @param options `prefillNaN` fills every output and scratch buffer with NaN first (for tests).
 * @returns `dq, dk, dv, dg, dbeta, dh0` as Float32Array, in the layouts of the inputs (`dh0`
 *   always present).
 * @throws {TypeError} When `saved` is not a handle from gpuForward or a cotangent is not a
 *   Float32Array.
 * @throws {RangeError} When a cotangent has the wrong length.
 * @throws {Error} When `saved` was already released, the device was lost, or a GPU error occurred.
 *
 * @example
 * ```ts
 * const B = 1, T = 20, H = 1, K = 4, V = 4;
 * const { saved } = await gpuForward({
 *   B, T, H, K, V, scale: 0.5,
 *   q: new Float32Array(B * T * H * K).fill(0.1),
 *   k: new Float32Array(B * T * H * K).fill(0.5),
 *   v: new Float32Array(B * T * H * V).fill(1),
 *   g: new Float32Array(B * T * H * K).fill(-0.1),
 *   beta: new Float32Array(B * T * H).fill(0.5),
 * }, { chunkSize: 16, saveForBackward: true });
 * const grads = await gpuBackward(saved!, { dout: new Float32Array(B * T * H * V).fill(1) });
 * console.log(grads.dq.length); // 80
 * ```
 */
export async function gpuBackward(
  saved: GpuSaved,
  cotangents: { dout: Float32Array; dht?: Float32Array },
  options: { prefillNaN?: boolean } = {},
): Promise<RawGrads> {
  if (!(saved instanceof SavedState)) {
    throw new TypeError("Argument saved must be the handle returned by gpuForward");
  }
  if (saved.released) throw new Error("Argument saved was already released");
  const owned: GPUBuffer[] = [];
  try {
    const { plan } = saved;
    const dout = checkArray("dout", cotangents?.dout, plan.nV, "B·T·H·V");
    const dht = cotangents.dht === undefined
      ? undefined
      : checkArray("dht", cotangents.dht, plan.nS, "B·H·K·V");
    const state = await getDevice();
    const { device } = state;
    const prefill = options.prefillNaN === true;
    const flags = saved.flags | (dht !== undefined ? HAS_DHT : 0);
    const gradFloats = 3 * plan.nQK + plan.nV + plan.nB + plan.nS;
    const make = (label: string, floats: number, usage: number) => {
      const buffer = createBuffer(device, label, floats * 4, usage);
      owned.push(buffer);
      return buffer;
    };
    const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
    const { grads, bindGroup, ranges } = await withErrorScopes(
      "gpuBackward (allocation and upload)",
      () => {
        const bw = make("backward scratch", plan.bwFloats, STORAGE);
        const gs = make("gradient scratch", plan.gsFloats, STORAGE);
        const grads = make("gradients", gradFloats, STORAGE | GPUBufferUsage.COPY_SRC);
        const params = make(
          "params",
          PARAM_WORDS,
          GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
        );
        const queue = device.queue;
        queue.writeBuffer(params, 0, paramsBytes(plan, flags, saved.scale, saved.offsets));
        if (prefill) {
          fillNaN(device, bw, plan.bwFloats);
          fillNaN(device, gs, plan.gsFloats);
          fillNaN(device, grads, gradFloats);
        }
        upload(queue, saved.inputs, saved.offsets.dout * 4, dout);
        if (dht !== undefined) upload(queue, saved.inputs, saved.offsets.dht * 4, dht);
        const ranges = makeRanges(state, plan, make, true);
        const bindGroup = device.createBindGroup({
          label: "kda backward",
          layout: state.layout,
          entries: [params, saved.inputs, saved.work, saved.states, grads, bw, gs].map(
            (buffer, binding) => ({ binding, resource: { buffer } }),
          ),
        });
        return { grads, bindGroup, ranges };
      },
    );
    const encoder = device.createCommandEncoder({ label: "kda backward" });
    await withErrorScopes(
      "gpuBackward (encoding stateScanBackward -> intraChunkBackward)",
      () =>
        encodePass(state, encoder, bindGroup, ranges, [
          ["stateScanBackward", plan.B * plan.H * plan.nVT, "scan"],
          ["intraChunkBackward", plan.B * plan.H * plan.NC, "chunks"],
        ]),
    );
    const all = await readBack(state, "gpuBackward", encoder, grads, gradFloats);
    let at = 0;
    const take = (n: number) => all.subarray(at, at += n);
    return {
      dq: take(plan.nQK),
      dk: take(plan.nQK),
      dv: take(plan.nV),
      dg: take(plan.nQK),
      dbeta: take(plan.nB),
      dh0: take(plan.nS),
    };
  } finally {
    for (const buffer of owned) destroyBuffer(buffer);
    saved.release();
  }
}
