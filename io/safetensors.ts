// A reader and writer of the safetensors format: an 8-byte little-endian u64 header length N, N
// bytes of JSON header, then the raw little-endian tensor bytes, each tensor at
// `data_offsets: [begin, end]` relative to the end of the header. Half-precision values (F16, BF16)
// are widened to f32 exactly on read and rounded to nearest, ties to even, on write.

import { typeName } from "../base/check.ts";
import { bf16Bits, bf16Value, f16Bits, f16Value } from "../base/dtype.ts";

/** A tensor element type this module reads. */
export type SafetensorsDType = "F64" | "F32" | "F16" | "BF16" | "I32" | "I64";

/** A tensor element type this module writes. */
export type SafetensorsWriteDType = "F64" | "F32" | "F16" | "BF16" | "I32";

/** The element types read, in the order error messages list them. */
const READ_DTYPES: readonly SafetensorsDType[] = ["F64", "F32", "F16", "BF16", "I32", "I64"];
const WRITE_DTYPES: readonly SafetensorsWriteDType[] = ["F64", "F32", "F16", "BF16", "I32"];
const BYTES: Record<SafetensorsDType, number> = { F64: 8, F32: 4, F16: 2, BF16: 2, I32: 4, I64: 8 };

/** The key of the header's optional string-to-string metadata. */
const METADATA_KEY = "__metadata__";

/** One tensor read from a safetensors file. */
export interface SafetensorsTensor {
  /** The element type stored in the file. */
  readonly dtype: SafetensorsDType;
  /** The shape, row-major. */
  readonly shape: readonly number[];
  /**
   * The values: Float64Array for F64, Float32Array for F32, F16 and BF16 (widened exactly),
   * Int32Array for I32 and I64 (I64 values must fit in 32 bits).
   */
  readonly data: Float64Array | Float32Array | Int32Array;
}

/** The contents of a safetensors file. */
export interface SafetensorsFile {
  /** The tensors by name, in the order of their data offsets. */
  readonly tensors: Map<string, SafetensorsTensor>;
  /** The header's `__metadata__` (empty when the file has none). */
  readonly metadata: Record<string, string>;
}

/** One tensor to write. */
export interface SafetensorsInput {
  /** The values, row-major. */
  readonly data: Float64Array | Float32Array | Int32Array;
  /** The shape; its product must equal `data.length`. */
  readonly shape: readonly number[];
  /**
   * The element type to store: by default F64 for a Float64Array, F32 for a Float32Array and I32
   * for an Int32Array. F16 and BF16 round to nearest, ties to even.
   */
  readonly dtype?: SafetensorsWriteDType;
}

// ---------------------------------------------------------------------------------------------
// Reading

/**
 * The first key that appears twice in one object of the header, at any depth, with where that
 * object sits: JSON.parse keeps only the last of a duplicated key, so they are found by a scan of
 * the text (which JSON.parse has accepted, so its strings and nesting are well formed). Keys are
 * compared as parsed, so two spellings of one name ("a" and "\u0061") are the same key.
 */
function duplicateKey(text: string): { path: string[]; key: string } | undefined {
  // One frame per open container: its keys (null for an array), and its parent and the segment
  // that names it there; a path is built only for the message, so a deep header scans in linear
  // time (copying each frame's path made it quadratic: a 40 KB header of nested arrays took 9 s)
  type Frame = { keys: Set<string> | null; parent: Frame | undefined; segment: string };
  const pathOf = (frame: Frame): string[] => {
    const path: string[] = [];
    for (let f: Frame | undefined = frame; f?.parent !== undefined; f = f.parent) {
      path.push(f.segment);
    }
    return path.reverse();
  };
  let top: Frame | undefined;
  let lastKey: string | undefined;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      const start = i;
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === "\\") i++;
      if (top === undefined || top.keys === null) continue;
      let j = i + 1;
      while (j < text.length && /\s/.test(text[j])) j++;
      if (text[j] !== ":") continue;
      const key: string = JSON.parse(text.slice(start, i + 1));
      if (top.keys.has(key)) return { path: pathOf(top), key };
      top.keys.add(key);
      lastKey = key;
    } else if (c === "{" || c === "[") {
      const segment = top === undefined ? "" : top.keys === null ? "[]" : lastKey!;
      top = { keys: c === "{" ? new Set() : null, parent: top, segment };
    } else if (c === "}" || c === "]") top = top?.parent;
  }
  return undefined;
}

/** Names where a header object sits, for messages: `tensor "x"`, `header.__metadata__`, … */
function objectName(path: string[]): string {
  if (path.length === 0) return "header";
  const [first, ...rest] = path;
  const head = first === METADATA_KEY ? `header.${METADATA_KEY}` : `tensor "${first}"`;
  return head + rest.map((p) => (p === "[]" ? "[]" : `.${p}`)).join("");
}

const HALF_TABLES: Partial<Record<"F16" | "BF16", Float32Array>> = {};

/** The f32 value of every 16-bit pattern, built on first use (exact: every half value is an f32 value). */
function halfTable(dtype: "F16" | "BF16"): Float32Array {
  let t = HALF_TABLES[dtype];
  if (t === undefined) {
    const value = dtype === "F16" ? f16Value : bf16Value;
    t = HALF_TABLES[dtype] = new Float32Array(65536);
    for (let bits = 0; bits < 65536; bits++) t[bits] = value(bits);
  }
  return t;
}

function checkShape(where: string, shape: unknown): number[] {
  if (
    !Array.isArray(shape) ||
    !shape.every((d) => typeof d === "number" && Number.isSafeInteger(d) && d >= 0)
  ) {
    throw new TypeError(
      `${where}.shape must be an array of non-negative integers: got ${JSON.stringify(shape)}`,
    );
  }
  // -0 passes as 0 and is kept as 0, so that a shape reads back as it was written
  return shape.map((d) => d + 0);
}

/** Fills `out` with `at(i)` for every index; the dtypes differ only in how one element is read. */
function fill<A extends Float64Array | Float32Array | Int32Array>(
  out: A,
  at: (i: number) => number,
): A {
  for (let i = 0; i < out.length; i++) out[i] = at(i);
  return out;
}

function decode(
  dtype: SafetensorsDType,
  bytes: Uint8Array,
  count: number,
  where: string,
): Float64Array | Float32Array | Int32Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  switch (dtype) {
    case "F64":
      return fill(new Float64Array(count), (i) => view.getFloat64(8 * i, true));
    case "F32":
      return fill(new Float32Array(count), (i) => view.getFloat32(4 * i, true));
    case "F16":
    case "BF16": {
      const table = halfTable(dtype);
      return fill(new Float32Array(count), (i) => table[view.getUint16(2 * i, true)]);
    }
    case "I32":
      return fill(new Int32Array(count), (i) => view.getInt32(4 * i, true));
    case "I64":
      return fill(new Int32Array(count), (i) => {
        const v = view.getBigInt64(8 * i, true);
        if (v < -2147483648n || v > 2147483647n) {
          throw new RangeError(
            `${where} values must fit in 32 bits to be read as Int32Array: got ${v} at index ${i}`,
          );
        }
        return Number(v);
      });
  }
}

/**
 * Reads a safetensors file from its bytes. Every tensor is copied out of `bytes`; F16 and BF16 are
 * widened to f32 exactly, I64 is narrowed to Int32Array with a range check. Malformed files throw a
 * RangeError or TypeError naming the field: a header length beyond the file, a byte-order mark
 * before the header, bad JSON, a duplicate name or a key repeated in any object of the header
 * (a tensor entry, `__metadata__`), an unknown dtype, a byte length that does not match dtype × shape, out-of-range or
 * overlapping offsets, non-string metadata. Gaps between tensors' bytes and trailing bytes are
 * tolerated (the reference writer makes neither).
 *
 * @param bytes The whole file.
 * @returns The tensors by name and the metadata.
 *
 * @example Usage
 * ```ts
 * import { readSafetensors, writeSafetensors } from "@deltanet/kda/io";
 * const bytes = writeSafetensors({ w: { data: new Float32Array([1, 2]), shape: [2] } });
 * readSafetensors(bytes).tensors.get("w")?.data; // Float32Array [1, 2]
 * ```
 */
export function readSafetensors(bytes: Uint8Array): SafetensorsFile {
  // a Proxy passes instanceof but is no view of a buffer (its reads would throw an engine error)
  if (!(bytes instanceof Uint8Array) || !ArrayBuffer.isView(bytes)) {
    throw new TypeError(`bytes must be a Uint8Array: got ${viewName(bytes)}`);
  }
  // a plain view of the bytes, by the array's own offset and length: a subclass may define getters
  // of its own for them, and what is checked below must be what is read
  const file = new Uint8Array(bytes.buffer, typedOffset.call(bytes), typedLength.call(bytes));
  if (file.length < 8) {
    throw new RangeError(
      `bytes must hold at least the 8-byte header length: got ${file.length} bytes`,
    );
  }
  const lenView = new DataView(file.buffer, file.byteOffset, 8);
  const n = lenView.getBigUint64(0, true);
  if (n > BigInt(file.length - 8)) {
    throw new RangeError(
      `header length must be at most the ${
        file.length - 8
      } bytes after the 8-byte prefix: got ${n}`,
    );
  }
  const headerEnd = 8 + Number(n);
  let text: string;
  try {
    // ignoreBOM keeps a leading byte-order mark in the text (the default drops it in silence),
    // so that it is refused below, as the format's reference reader refuses it.
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(
      file.subarray(8, headerEnd),
    );
  } catch {
    throw new TypeError(`header must be UTF-8 text: got invalid bytes`);
  }
  if (text.startsWith("\uFEFF")) {
    throw new TypeError("header must begin with its JSON text: got a byte-order mark (EF BB BF)");
  }
  let header: unknown;
  try {
    header = JSON.parse(text);
  } catch (e) {
    throw new TypeError(`header must be valid JSON: got ${(e as Error).message}`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    throw new TypeError(`header must be a JSON object: got ${typeName(header)}`);
  }
  const dup = duplicateKey(text);
  if (dup !== undefined) {
    throw new RangeError(
      dup.path.length === 0
        ? `header names must be unique: got "${dup.key}" twice`
        : `${objectName(dup.path)} must not repeat a key: got "${dup.key}" twice`,
    );
  }

  const metadata: Record<string, string> = {};
  const entries: {
    name: string;
    dtype: SafetensorsDType;
    shape: number[];
    b: number;
    e: number;
  }[] = [];
  const dataLength = file.length - headerEnd;
  for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
    if (name === METADATA_KEY) {
      if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
        throw new TypeError(`header.__metadata__ must be an object: got ${typeName(raw)}`);
      }
      for (const [k, v] of Object.entries(raw)) {
        if (typeof v !== "string") {
          throw new TypeError(`header.__metadata__["${k}"] must be a string: got ${typeName(v)}`);
        }
        metadata[k] = v;
      }
      continue;
    }
    const where = `tensor "${name}"`;
    if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
      throw new TypeError(`${where} must be an object: got ${typeName(raw)}`);
    }
    const info = raw as Record<string, unknown>;
    if (!READ_DTYPES.includes(info.dtype as SafetensorsDType)) {
      throw new TypeError(
        `${where}.dtype must be one of ${READ_DTYPES.join(", ")}: got ${String(info.dtype)}`,
      );
    }
    const dtype = info.dtype as SafetensorsDType;
    const shape = checkShape(where, info.shape);
    const off = info.data_offsets;
    if (
      !Array.isArray(off) || off.length !== 2 ||
      !off.every((x) => typeof x === "number" && Number.isSafeInteger(x) && x >= 0)
    ) {
      throw new TypeError(
        `${where}.data_offsets must be two non-negative integers: got ${JSON.stringify(off)}`,
      );
    }
    const [b, e] = off as number[];
    if (b > e || e > dataLength) {
      throw new RangeError(
        `${where}.data_offsets must satisfy begin <= end <= ${dataLength} (the data's length): ` +
          `got [${b}, ${e}]`,
      );
    }
    const want = shape.reduce((a, d) => a * d, 1) * BYTES[dtype];
    if (e - b !== want) {
      throw new RangeError(
        `${where} byte length must be ${want} (${dtype} × [${shape.join(", ")}]): got ${e - b}`,
      );
    }
    entries.push({ name, dtype, shape, b, e });
  }
  entries.sort((x, y) => x.b - y.b || x.e - y.e);
  for (let i = 1; i < entries.length; i++) {
    const p = entries[i - 1], c = entries[i];
    if (c.b < p.e) {
      throw new RangeError(
        `tensor "${c.name}".data_offsets must not overlap tensor "${p.name}" ` +
          `[${p.b}, ${p.e}]: got [${c.b}, ${c.e}]`,
      );
    }
  }
  const tensors = new Map<string, SafetensorsTensor>();
  for (const { name, dtype, shape, b, e } of entries) {
    const count = shape.reduce((a, d) => a * d, 1);
    const data = decode(
      dtype,
      file.subarray(headerEnd + b, headerEnd + e),
      count,
      `tensor "${name}"`,
    );
    tensors.set(name, Object.freeze({ dtype, shape: Object.freeze([...shape]), data }));
  }
  return { tensors, metadata };
}

// ---------------------------------------------------------------------------------------------
// Writing

/**
 * What a value that should be a typed array is, for messages: a Proxy of one (or an object made
 * from its prototype) passes instanceof but is no view of a buffer, and its reads throw.
 */
function viewName(x: unknown): string {
  const kind = typeName(x);
  return ArrayBuffer.isView(x) || typeof x !== "object" || x === null
    ? kind
    : x instanceof Object && Object.getPrototypeOf(x) !== Object.prototype && kind !== "Array"
    ? `an object with ${kind}'s prototype that is no view of a buffer (a Proxy?)`
    : kind;
}

function defaultDType(data: unknown, where: string): SafetensorsWriteDType {
  if (!ArrayBuffer.isView(data)) {
    throw new TypeError(
      `${where}.data must be a Float64Array, Float32Array or Int32Array: got ${viewName(data)}`,
    );
  }
  if (data instanceof Float64Array) return "F64";
  if (data instanceof Float32Array) return "F32";
  if (data instanceof Int32Array) return "I32";
  throw new TypeError(
    `${where}.data must be a Float64Array, Float32Array or Int32Array: got ${typeName(data)}`,
  );
}

/** A typed array's own length and byte offset: a subclass may define getters of its own. */
const [typedLength, typedOffset] = ["length", "byteOffset"].map((name) =>
  Object.getOwnPropertyDescriptor(Object.getPrototypeOf(Int8Array.prototype), name)!.get!
);

function encode(
  dtype: SafetensorsWriteDType,
  data: Float64Array | Float32Array | Int32Array,
  n: number,
  out: DataView,
): void {
  switch (dtype) {
    case "F64":
      for (let i = 0; i < n; i++) out.setFloat64(8 * i, data[i], true);
      return;
    case "F32":
      for (let i = 0; i < n; i++) out.setFloat32(4 * i, data[i], true);
      return;
    case "F16":
      for (let i = 0; i < n; i++) out.setUint16(2 * i, f16Bits(data[i]), true);
      return;
    case "BF16":
      for (let i = 0; i < n; i++) out.setUint16(2 * i, bf16Bits(data[i]), true);
      return;
    case "I32":
      for (let i = 0; i < n; i++) out.setInt32(4 * i, data[i], true);
      return;
  }
}

/**
 * Writes tensors (and optional string metadata) as safetensors bytes. Tensors are laid out in the
 * order given; the header is padded with spaces to a multiple of 8 bytes, as the reference
 * implementation does, so every tensor's bytes start 8-aligned when the tensors before it are.
 *
 * @param tensors The tensors by name: a Map or a plain object of {@linkcode SafetensorsInput}.
 * @param metadata String-to-string metadata, stored under `__metadata__`.
 * @returns The file's bytes.
 *
 * @example Usage
 * ```ts
 * import { writeSafetensors } from "@deltanet/kda/io";
 * const bytes = writeSafetensors(
 *   { w: { data: new Float64Array([1, 2, 3, 4]), shape: [2, 2], dtype: "BF16" } },
 *   { format: "pt" },
 * );
 * ```
 */
export function writeSafetensors(
  tensors: Map<string, SafetensorsInput> | Record<string, SafetensorsInput>,
  metadata: Record<string, string> = {},
): Uint8Array {
  const list: [string, SafetensorsInput][] = tensors instanceof Map
    ? [...tensors]
    : typeof tensors === "object" && tensors !== null && !Array.isArray(tensors)
    ? Object.entries(tensors)
    : (() => {
      throw new TypeError(`tensors must be a Map or an object: got ${typeName(tensors)}`);
    })();
  if (typeof metadata !== "object" || metadata === null || Array.isArray(metadata)) {
    throw new TypeError(`metadata must be an object: got ${typeName(metadata)}`);
  }
  // every field is read once, into a snapshot that is checked and then written: a getter or a
  // Proxy that answers differently the second time cannot get past the checks
  const meta = Object.entries(metadata);
  for (const [k, v] of meta) {
    if (typeof v !== "string") {
      throw new TypeError(`metadata["${k}"] must be a string: got ${typeName(v)}`);
    }
  }
  const header: Record<string, unknown> = {};
  if (meta.length > 0) header[METADATA_KEY] = Object.fromEntries(meta);
  const plan: {
    data: Float64Array | Float32Array | Int32Array;
    length: number;
    dtype: SafetensorsWriteDType;
    b: number;
  }[] = [];
  let offset = 0;
  for (const [name, t] of list) {
    if (typeof name !== "string" || name.length === 0 || name === METADATA_KEY) {
      throw new TypeError(
        `tensor names must be non-empty strings other than ${METADATA_KEY}: got ${
          JSON.stringify(name)
        }`,
      );
    }
    const where = `tensors["${name}"]`;
    if (typeof t !== "object" || t === null) {
      throw new TypeError(`${where} must be an object: got ${typeName(t)}`);
    }
    const { data, dtype: given, shape: givenShape } = t;
    const natural = defaultDType(data, where);
    if (given === null) {
      throw new TypeError(
        `${where}.dtype must be one of ${WRITE_DTYPES.join(", ")} or left out: got null`,
      );
    }
    const dtype = given ?? natural;
    if (!WRITE_DTYPES.includes(dtype)) {
      throw new TypeError(
        `${where}.dtype must be one of ${WRITE_DTYPES.join(", ")}: got ${String(dtype)}`,
      );
    }
    const isInt = data instanceof Int32Array;
    if (isInt !== (dtype === "I32")) {
      throw new TypeError(
        `${where}.dtype must be ${
          isInt ? "I32 for an Int32Array" : "a float type for float data"
        }: ` +
          `got ${dtype}`,
      );
    }
    // a copy of the shape's entries, checked as they are kept
    const shape = checkShape(where, Array.isArray(givenShape) ? [...givenShape] : givenShape);
    const size = shape.reduce((a, d) => a * d, 1);
    const length: number = typedLength.call(data);
    if (size !== length) {
      throw new RangeError(
        `${where}.data length must equal the size ${size} of shape [${
          shape.join(", ")
        }]: got ${length}`,
      );
    }
    const bytes = size * BYTES[dtype];
    header[name] = { dtype, shape, data_offsets: [offset, offset + bytes] };
    plan.push({ data, length, dtype, b: offset });
    offset += bytes;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(0x20);
    p.set(json);
    json = p;
  }
  const out = new Uint8Array(8 + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  const base = 8 + json.length;
  for (const { data, length, dtype, b } of plan) {
    encode(dtype, data, length, new DataView(out.buffer, base + b, length * BYTES[dtype]));
  }
  return out;
}
