// Tests of the safetensors reader and writer (io/safetensors.ts): the committed fixture written by
// the reference Python package (tests/fixtures/make_fixtures.py), write→read round trips in every
// dtype, half-precision rounding, and a named error for each kind of malformed file.

import assert from "node:assert/strict";
import {
  bf16Bits,
  bf16Value,
  f16Bits,
  f16Value,
  readSafetensors,
  writeSafetensors,
} from "../io/mod.ts";

const FIXTURE = new URL("./fixtures/reference.safetensors", import.meta.url);

/** A file from a header text and the data after it, with the length prefix set. */
function craft(header: string, data: Uint8Array = new Uint8Array()): Uint8Array {
  const h = new TextEncoder().encode(header);
  const out = new Uint8Array(8 + h.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
  out.set(h, 8);
  out.set(data, 8 + h.length);
  return out;
}

/** What reading a malformed file must throw: that error, or its name and a message pattern. */
type Expected = Error | { name: string; message: RegExp };

/**
 * Asserts that reading each file, given as its header text and the data after it (the bytes, or
 * that many zero bytes), throws the error paired with it.
 */
function assertUnreadable(
  ...files: [header: string, data: Uint8Array | number, error: Expected][]
): void {
  for (const [header, data, error] of files) {
    const bytes = craft(header, typeof data === "number" ? new Uint8Array(data) : data);
    assert.throws(() => readSafetensors(bytes), error);
  }
}

Deno.test("reader round-trips the fixture written by the reference Python package exactly", () => {
  const { tensors, metadata } = readSafetensors(Deno.readFileSync(FIXTURE));
  assert.deepEqual(metadata, { format: "kda-fixture", seed: "0" });
  assert.deepEqual([...tensors.keys()].sort(), [
    "bf16",
    "cu_seqlens",
    "f16",
    "f32",
    "f64",
    "i32",
  ]);

  const f64 = tensors.get("f64")!;
  assert.equal(f64.dtype, "F64");
  assert.deepEqual(f64.shape, [2, 3]);
  assert.ok(f64.data instanceof Float64Array);
  assert.deepEqual([...f64.data], [0, 1, 2, 3, 4, 5].map((i) => (i - 2.5) / 3));

  const f32 = tensors.get("f32")!;
  assert.equal(f32.dtype, "F32");
  assert.deepEqual(f32.shape, [3, 2]);
  assert.ok(f32.data instanceof Float32Array);
  assert.deepEqual(
    [...f32.data],
    [...Float32Array.from([0, 1, 2, 3, 4, 5], (i) => (i + 1) / 8 - 0.3)],
  );

  const f16 = tensors.get("f16")!;
  assert.equal(f16.dtype, "F16");
  assert.ok(f16.data instanceof Float32Array);
  assert.deepEqual([...f16.data], [1, -2.5, 65504, 2 ** -24]);

  const bf16 = tensors.get("bf16")!;
  assert.equal(bf16.dtype, "BF16");
  assert.deepEqual(bf16.shape, [2, 2]);
  assert.deepEqual([...bf16.data], [1, -2.5, (2 - 2 ** -7) * 2 ** 127, 2 ** -133]);

  const cu = tensors.get("cu_seqlens")!;
  assert.equal(cu.dtype, "I64");
  assert.ok(cu.data instanceof Int32Array);
  assert.deepEqual([...cu.data], [0, 3, 7, 12]);
  assert.deepEqual([...tensors.get("i32")!.data], [-1, 0, 2 ** 31 - 1]);
});

Deno.test("writer output re-reads the fixture's tensors bit for bit", () => {
  const ref = readSafetensors(Deno.readFileSync(FIXTURE));
  const bytes = writeSafetensors(
    new Map(
      [...ref.tensors].filter(([, t]) => t.dtype !== "I64").map(([name, t]) => [
        name,
        { data: t.data, shape: t.shape, dtype: t.dtype as "F64" | "F32" | "F16" | "BF16" | "I32" },
      ]),
    ),
    ref.metadata,
  );
  const back = readSafetensors(bytes);
  assert.deepEqual(back.metadata, ref.metadata);
  for (const [name, t] of back.tensors) {
    const r = ref.tensors.get(name)!;
    assert.equal(t.dtype, r.dtype, name);
    assert.deepEqual(t.shape, r.shape, name);
    assert.deepEqual(t.data, r.data, name);
  }
});

Deno.test("write then read round-trips f64, f32 and i32 tensors and metadata exactly", () => {
  const a = Float64Array.from({ length: 35 }, (_, i) => Math.sin(i) * 10 ** (i % 7 - 3));
  const b = Float32Array.from({ length: 12 }, (_, i) => Math.cos(i) / 3);
  const c = Int32Array.from([0, 5, 9, 16]);
  const empty = new Float64Array(0);
  const bytes = writeSafetensors(
    {
      a: { data: a, shape: [5, 7] },
      b: { data: b, shape: [2, 2, 3] },
      "cu_seqlens": { data: c, shape: [4] },
      scalar: { data: new Float32Array([7]), shape: [] },
      empty: { data: empty, shape: [0, 3] },
    },
    { config: JSON.stringify({ dModel: 8 }) },
  );
  assert.equal(new DataView(bytes.buffer).getBigUint64(0, true) % 8n, 0n, "header padded to 8");
  const { tensors, metadata } = readSafetensors(bytes);
  assert.deepEqual(metadata, { config: '{"dModel":8}' });
  assert.deepEqual(tensors.get("a")!.data, a);
  assert.deepEqual(tensors.get("a")!.shape, [5, 7]);
  assert.deepEqual(tensors.get("b")!.data, b);
  assert.deepEqual(tensors.get("b")!.shape, [2, 2, 3]);
  assert.deepEqual(tensors.get("cu_seqlens")!.data, c);
  assert.deepEqual(tensors.get("scalar")!.shape, []);
  assert.deepEqual([...tensors.get("scalar")!.data], [7]);
  assert.equal(tensors.get("empty")!.data.length, 0);
});

Deno.test("reader copies tensors out of a buffer at an odd offset", () => {
  const bytes = writeSafetensors({ x: { data: new Float64Array([1.5, -2]), shape: [2] } });
  const shifted = new Uint8Array(bytes.length + 3);
  shifted.set(bytes, 3);
  const view = shifted.subarray(3);
  const x = readSafetensors(view).tensors.get("x")!;
  view.fill(0);
  assert.deepEqual([...x.data], [1.5, -2]);
});

Deno.test("f16 and bf16 writes round to nearest with ties to even", () => {
  // f16 near 1: the spacing is 2^-10, so 1 + 2^-11 is a tie that goes to 1 (even), and
  // 1 + 3·2^-11 a tie that goes to 1 + 2^-9 (even); just above a tie rounds up.
  assert.equal(f16Value(f16Bits(1 + 2 ** -11)), 1);
  assert.equal(f16Value(f16Bits(1 + 3 * 2 ** -11)), 1 + 2 ** -9);
  assert.equal(f16Value(f16Bits(1 + 2 ** -11 + 2 ** -30)), 1 + 2 ** -10);
  assert.equal(f16Value(f16Bits(65519.99)), 65504);
  assert.equal(f16Value(f16Bits(65520)), Infinity);
  assert.equal(f16Value(f16Bits(2 ** -25)), 0); // tie between 0 and the smallest subnormal
  assert.equal(f16Value(f16Bits(3 * 2 ** -25)), 2 ** -23);
  assert.ok(Number.isNaN(f16Value(f16Bits(NaN))));
  assert.ok(Object.is(f16Value(f16Bits(-0)), -0));
  // bf16: 8 significant bits
  assert.equal(bf16Value(bf16Bits(1 + 2 ** -8)), 1);
  assert.equal(bf16Value(bf16Bits(1 + 3 * 2 ** -8)), 1 + 2 ** -6);
  assert.equal(bf16Value(bf16Bits(-3.39e38)), -(2 - 2 ** -7) * 2 ** 127);
  assert.equal(bf16Value(bf16Bits(3.4e38)), Infinity);
  assert.equal(bf16Bits(1), 0x3f80);
  assert.equal(f16Bits(1), 0x3c00);
});

Deno.test("f16 rounding agrees with Float16Array where Deno has it", () => {
  const F16 = (globalThis as unknown as {
    Float16Array?: new (n: number) => { [i: number]: number };
  }).Float16Array;
  if (F16 === undefined) {
    console.log("no Float16Array in this runtime: the comparison is skipped");
    return;
  }
  const arr = new F16(1);
  let seed = 12345;
  for (let i = 0; i < 20000; i++) {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    const x = (seed / 2 ** 32 - 0.5) * 2 ** ((i % 44) - 26);
    arr[0] = x;
    assert.equal(f16Value(f16Bits(x)), arr[0], `x = ${x}`);
  }
  for (let bits = 0; bits < 0x10000; bits++) {
    const v = f16Value(bits);
    if (!Number.isNaN(v)) assert.equal(f16Bits(v), bits, `bits 0x${bits.toString(16)}`);
  }
});

Deno.test("f16 and bf16 tensors written from f64 data read back as the rounded f32 values", () => {
  const data = Float64Array.from({ length: 64 }, (_, i) => (i - 31.3) * 1.37 ** (i % 9));
  const { tensors } = readSafetensors(writeSafetensors({
    h: { data, shape: [8, 8], dtype: "F16" },
    b: { data, shape: [8, 8], dtype: "BF16" },
  }));
  assert.deepEqual([...tensors.get("h")!.data], [...data].map((x) => f16Value(f16Bits(x))));
  assert.deepEqual([...tensors.get("b")!.data], [...data].map((x) => bf16Value(bf16Bits(x))));
  // a bf16 value is an f32 whose low 16 bits are zero
  const bits = new Uint32Array(Float32Array.from(tensors.get("b")!.data).buffer);
  assert.ok(bits.every((u) => (u & 0xffff) === 0));
});

Deno.test("a header length beyond the file gives a named RangeError", () => {
  const good = writeSafetensors({ x: { data: new Float32Array(2), shape: [2] } });
  const bad = good.slice();
  new DataView(bad.buffer).setBigUint64(0, BigInt(good.length), true);
  assert.throws(() => readSafetensors(bad), {
    name: "RangeError",
    message: /^header length must be at most the \d+ bytes after the 8-byte prefix: got \d+$/,
  });
  assert.throws(() => readSafetensors(new Uint8Array(5)), {
    name: "RangeError",
    message: "bytes must hold at least the 8-byte header length: got 5 bytes",
  });
});

Deno.test("bad JSON and a non-object header give named TypeErrors", () => {
  assertUnreadable(
    ['{"x": {', 0, { name: "TypeError", message: /^header must be valid JSON: got / }],
    ["[1, 2]", 0, new TypeError("header must be a JSON object: got Array")],
  );
});

Deno.test("duplicate tensor names give a named RangeError", () => {
  assertUnreadable([
    '{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},' +
    '"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
    8,
    new RangeError('header names must be unique: got "x" twice'),
  ]);
});

Deno.test("duplicate keys inside a tensor entry or __metadata__ give a named RangeError, at any depth and however escaped", () => {
  const entry = '"dtype":"F32","shape":[1],"data_offsets":[0,4]';
  assertUnreadable(
    [
      `{"x":{${entry},"dtype":"F64"}}`,
      4,
      new RangeError('tensor "x" must not repeat a key: got "dtype" twice'),
    ],
    [
      `{"x":{${entry},"shape":[2]}}`,
      4,
      new RangeError('tensor "x" must not repeat a key: got "shape" twice'),
    ],
    [
      // An escaped spelling is the same key once parsed.
      `{"x":{${entry},"data_\\u006fffsets":[0,4]}}`,
      4,
      new RangeError('tensor "x" must not repeat a key: got "data_offsets" twice'),
    ],
    [
      '{"__metadata__":{"format":"pt","format":"kda.layer"}}',
      0,
      new RangeError('header.__metadata__ must not repeat a key: got "format" twice'),
    ],
    [
      `{"x":{${entry},"extra":[{"a":1,"a":2}]}}`,
      4,
      new RangeError('tensor "x".extra[] must not repeat a key: got "a" twice'),
    ],
  );
  // The same key in two different objects is no duplicate.
  const bytes = craft(`{"__metadata__":{"dtype":"x"},"y":{${entry}}}`, new Uint8Array(4));
  assert.equal(readSafetensors(bytes).metadata.dtype, "x");
});

Deno.test("a header that starts with a byte-order mark gives a named TypeError", () => {
  const good = writeSafetensors({ x: { data: new Float32Array(1), shape: [1] } });
  const n = Number(new DataView(good.buffer).getBigUint64(0, true));
  const header = good.subarray(8, 8 + n), data = good.subarray(8 + n);
  const withBom = new Uint8Array([0xef, 0xbb, 0xbf, ...header]);
  const bytes = new Uint8Array(8 + withBom.length + data.length);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(withBom.length), true);
  bytes.set(withBom, 8);
  bytes.set(data, 8 + withBom.length);
  assert.throws(() => readSafetensors(bytes), {
    name: "TypeError",
    message: "header must begin with its JSON text: got a byte-order mark (EF BB BF)",
  });
});

Deno.test("an unknown dtype gives a named TypeError", () => {
  assertUnreadable([
    '{"x":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}}',
    4,
    new TypeError('tensor "x".dtype must be one of F64, F32, F16, BF16, I32, I64: got I8'),
  ]);
});

Deno.test("a byte length not matching dtype and shape gives a named RangeError", () => {
  assertUnreadable([
    '{"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}',
    24,
    new RangeError('tensor "x" byte length must be 24 (F32 × [2, 3]): got 20'),
  ]);
});

Deno.test("out-of-range offsets give a named RangeError", () => {
  assertUnreadable(
    [
      '{"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
      8,
      new RangeError(
        'tensor "x".data_offsets must satisfy begin <= end <= 8 (the data\'s length): got [4, 12]',
      ),
    ],
    [
      '{"x":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}',
      8,
      { name: "RangeError", message: /data_offsets must satisfy begin <= end/ },
    ],
    [
      '{"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}',
      8,
      new TypeError('tensor "x".data_offsets must be two non-negative integers: got [-4,0]'),
    ],
  );
});

Deno.test("overlapping offsets give a named RangeError", () => {
  assertUnreadable([
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' +
    '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
    12,
    new RangeError('tensor "b".data_offsets must not overlap tensor "a" [0, 8]: got [4, 12]'),
  ]);
});

Deno.test("a bad shape and non-string metadata give named TypeErrors", () => {
  assertUnreadable(
    [
      '{"x":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}',
      8,
      new TypeError('tensor "x".shape must be an array of non-negative integers: got [2.5]'),
    ],
    [
      '{"__metadata__":{"seed":0}}',
      0,
      new TypeError('header.__metadata__["seed"] must be a string: got number'),
    ],
  );
});

Deno.test("I64 values outside 32 bits give a named RangeError", () => {
  const data = new Uint8Array(16);
  new DataView(data.buffer).setBigInt64(8, 2n ** 40n, true);
  assertUnreadable([
    '{"cu_seqlens":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}',
    data,
    new RangeError(
      'tensor "cu_seqlens" values must fit in 32 bits to be read as Int32Array: ' +
        "got 1099511627776 at index 1",
    ),
  ]);
});

Deno.test("writer rejects bad tensors and metadata with named errors", () => {
  assert.throws(() => writeSafetensors({ x: { data: new Float32Array(5), shape: [2, 3] } }), {
    name: "RangeError",
    message: 'tensors["x"].data length must equal the size 6 of shape [2, 3]: got 5',
  });
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => writeSafetensors({ x: { data: new Float32Array(1), shape: [1], dtype: "I8" as any } }),
    {
      name: "TypeError",
      message: 'tensors["x"].dtype must be one of F64, F32, F16, BF16, I32: got I8',
    },
  );
  assert.throws(
    () => writeSafetensors({ x: { data: new Int32Array(1), shape: [1], dtype: "F32" } }),
    { name: "TypeError", message: 'tensors["x"].dtype must be I32 for an Int32Array: got F32' },
  );
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => writeSafetensors({ x: { data: [1, 2] as any, shape: [2] } }),
    {
      name: "TypeError",
      message: 'tensors["x"].data must be a Float64Array, Float32Array or Int32Array: got Array',
    },
  );
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => writeSafetensors({}, { seed: 0 as any }),
    { name: "TypeError", message: 'metadata["seed"] must be a string: got number' },
  );
  assert.throws(
    () => writeSafetensors({ __metadata__: { data: new Float32Array(1), shape: [1] } }),
    {
      name: "TypeError",
      message: /^tensor names must be non-empty strings other than __metadata__/,
    },
  );
});

Deno.test("a deeply nested header is scanned in linear time, and its duplicate keys still found", () => {
  // 40,000 nested brackets: the duplicate-key scan once copied a path per bracket (9 s here)
  const d = 20000;
  const deep = `{"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8],"x":${"[".repeat(d)}${
    "]".repeat(d)
  }}}`;
  const t0 = performance.now();
  assert.deepEqual([...readSafetensors(craft(deep, new Uint8Array(8))).tensors.keys()], ["w"]);
  const ms = performance.now() - t0;
  assert.ok(ms < 2000, `a 40 KB header took ${ms.toFixed(0)} ms`);
  assertUnreadable([
    `{"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8],"x":[[{"a":1,"a":2}]]}}`,
    8,
    new RangeError('tensor "w".x[][] must not repeat a key: got "a" twice'),
  ]);
});

Deno.test("the writer checks and writes one snapshot of each field: getters and Proxies cannot change it", () => {
  let reads = 0;
  const flipping = {
    shape: [2],
    get data() {
      return reads++ === 0 ? Float64Array.of(1, 2) : Float64Array.of(7);
    },
  };
  const out = readSafetensors(writeSafetensors({ w: flipping }));
  assert.deepEqual([...out.tensors.get("w")!.data], [1, 2]);
  let n = 0;
  const meta = {
    get a() {
      return n++ === 0 ? "x" : 42;
    },
  } as unknown as Record<string, string>;
  assert.deepEqual(readSafetensors(writeSafetensors({}, meta)).metadata, { a: "x" });
  const shape = new Proxy([2], {
    get: (t, k) => (k === "0" && n++ > 3 ? -5 : Reflect.get(t, k)),
  });
  assert.deepEqual(
    readSafetensors(writeSafetensors({ w: { data: Float64Array.of(1, 2), shape } })).tensors
      .get("w")!.shape,
    [2],
  );
  assert.throws(
    () => writeSafetensors({ w: { data: new Proxy(Float64Array.of(1), {}), shape: [1] } }),
    {
      name: "TypeError",
      message:
        /^tensors\["w"\]\.data must be a Float64Array, .*: got an object with Float64Array's prototype that is no view of a buffer/,
    },
  );
  assert.throws(
    () =>
      writeSafetensors({
        w: { data: Float64Array.of(1), shape: [1], dtype: null as unknown as "F64" },
      }),
    {
      name: "TypeError",
      message: 'tensors["w"].dtype must be one of F64, F32, F16, BF16, I32 or left out: got null',
    },
  );
  // a subclass whose length getter answers differently each time: its own length is what counts
  class Flip extends Float64Array {
    n = 0;
    override get length() {
      return this.n++ === 0 ? 2 : 1;
    }
  }
  const flip = new Flip(2);
  flip.set([5, 6]);
  assert.deepEqual(
    [
      ...readSafetensors(writeSafetensors({ w: { data: flip, shape: [2] } })).tensors.get("w")!
        .data,
    ],
    [5, 6],
  );
  const file = writeSafetensors({ w: { data: Float64Array.of(1), shape: [1] } });
  // the reader reads the array's own bytes, whatever a subclass's getters say
  class Lying extends Uint8Array {
    override get length() {
      return 3;
    }
  }
  const lying = new Lying(file.length);
  lying.set(file);
  assert.deepEqual([...readSafetensors(lying).tensors.get("w")!.data], [1]);
  assert.throws(() => readSafetensors(new Proxy(file, {})), {
    name: "TypeError",
    message: /^bytes must be a Uint8Array: got an object with Uint8Array's prototype/,
  });
});

Deno.test("a shape entry of -0 reads as 0, as the writer writes it", () => {
  const bytes = craft(
    '{"x":{"dtype":"F32","shape":[-0,2],"data_offsets":[0,0]}}',
    new Uint8Array(0),
  );
  const shape = readSafetensors(bytes).tensors.get("x")!.shape;
  assert.ok(Object.is(shape[0], 0), `got ${Object.is(shape[0], -0) ? "-0" : shape[0]}`);
  const again = readSafetensors(writeSafetensors({ x: { data: new Float32Array(0), shape } }));
  assert.deepEqual(again.tensors.get("x")!.shape, shape);
});
