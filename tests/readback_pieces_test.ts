// Readbacks in staging pieces (kda/gpu/readback.ts): the reads laid end to end and cut every
// READ_PIECE_BYTES cover each read exactly once, in order, and what comes back is what the
// buffers hold, for reads that span pieces, share them, start at an offset or are empty; a
// DeviceTensor larger than several pieces reads back its exact elements.

import assert from "node:assert/strict";
import { ownStaging, pieceLayout, READ_PIECE_BYTES, stageReads } from "../kda/gpu/readback.ts";
import { getContext } from "../kda/gpu/device.ts";
import { toGpu } from "../kda/gpu/tensor.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("readback_pieces_test.ts");

const P = READ_PIECE_BYTES;

Deno.test("pieceLayout covers each read once, in order, in pieces of at most READ_PIECE_BYTES", () => {
  const cases = [
    [],
    [0],
    [4],
    [P],
    [P + 4],
    [P - 8, 16, 2 * P + 4, 0, 4],
    [3 * P, P, 12],
  ];
  for (const sizes of cases) {
    const pieces = pieceLayout(sizes);
    const total = sizes.reduce((a, b) => a + b, 0);
    assert.equal(pieces.length, Math.ceil(total / P), `pieces for [${sizes}]`);
    const next = sizes.map(() => 0);
    let stream = 0;
    pieces.forEach((parts, i) => {
      let at = 0;
      for (const part of parts) {
        assert.equal(part.at, at, `piece ${i} of [${sizes}]: parts are contiguous`);
        assert.equal(part.from, next[part.read], `read ${part.read} of [${sizes}]: in order`);
        assert.ok(part.bytes > 0, `piece ${i} of [${sizes}]: no empty part`);
        next[part.read] += part.bytes;
        at += part.bytes;
        stream += part.bytes;
      }
      assert.ok(at <= P, `piece ${i} of [${sizes}] holds ${at} bytes`);
      if (i < pieces.length - 1) assert.equal(at, P, `piece ${i} of [${sizes}] is full`);
    });
    assert.deepEqual(next, sizes, `every read of [${sizes}] covered exactly`);
    assert.equal(stream, total);
  }
});

gpuTest("stageReads returns what the buffers hold, across and within pieces", async () => {
  const { device } = await getContext();
  // three buffers of distinct words; reads that start at offsets, span pieces, share one, or are
  // empty
  const words = [P / 4 + 1000, 40, (2 * P) / 4 + 7];
  const buffers = words.map((n, b) => {
    const data = new Uint32Array(n).map((_, i) => b * 0x10000000 + i);
    const buffer = device.createBuffer({
      size: n * 4,
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    });
    device.queue.writeBuffer(buffer, 0, data);
    return { buffer, data };
  });
  const reads = [
    { b: 0, offset: 8, bytes: P - 12 },
    { b: 1, offset: 0, bytes: 160 },
    { b: 2, offset: 4, bytes: 2 * P + 20 },
    { b: 1, offset: 40, bytes: 0 },
    { b: 0, offset: P, bytes: 4000 },
  ];
  const made: GPUBuffer[] = [];
  const staging = ownStaging(device);
  const make = (label: string, size: number, usage: number) => {
    made.push(staging.make(label, size, usage));
    return made[made.length - 1];
  };
  try {
    const encoder = device.createCommandEncoder();
    const staged = stageReads(
      make,
      encoder,
      reads.map((r) => ({ buffer: buffers[r.b].buffer, offset: r.offset, bytes: r.bytes })),
      "test",
    );
    device.queue.submit([encoder.finish()]);
    const total = reads.reduce((n, r) => n + r.bytes, 0);
    assert.equal(staged.pieces, Math.ceil(total / P));
    assert.equal(made.length, staged.pieces);
    await staged.map();
    const out = staged.copyOut();
    assert.equal(out.length, reads.length);
    reads.forEach((r, i) => {
      const want = buffers[r.b].data.subarray(r.offset / 4, (r.offset + r.bytes) / 4);
      const got = new Uint32Array(out[i].buffer, out[i].byteOffset, out[i].length);
      assert.equal(got.length, want.length, `read ${i}: length`);
      const bad = got.findIndex((w, j) => w !== want[j]);
      assert.equal(bad, -1, `read ${i}: word ${bad} is ${got[bad]}, expected ${want[bad]}`);
    });
    // every piece is unmapped once copied out (a staging buffer goes back to the pool unmapped)
    assert.deepEqual(made.map((b) => b.mapState), made.map(() => "unmapped"));
    // and unmapAll leaves none mapped when the copy-out never ran (a failure after the map)
    made.length = 0;
    const again = device.createCommandEncoder();
    const left = stageReads(
      make,
      again,
      [{ buffer: buffers[2].buffer, offset: 0, bytes: P + 8 }],
      "test",
    );
    device.queue.submit([again.finish()]);
    await left.map();
    assert.deepEqual(made.map((b) => b.mapState), ["mapped", "mapped"]);
    left.unmapAll();
    assert.deepEqual(made.map((b) => b.mapState), ["unmapped", "unmapped"]);
  } finally {
    staging.destroy();
    for (const b of buffers) b.buffer.destroy();
  }
});

gpuTest("DeviceTensor.read of several pieces returns its exact elements", async () => {
  const n = Math.floor((2.5 * P) / 4);
  const data = new Float32Array(n).map((_, i) => Math.sin(i) * 1e3 + i);
  const t = await toGpu(data, [n]);
  try {
    const back = await t.read();
    assert.equal(back.length, n);
    const bad = back.findIndex((v, i) => !Object.is(v, data[i]));
    assert.equal(bad, -1, `element ${bad} is ${back[bad]}, expected ${data[bad]}`);
  } finally {
    t.release();
  }
  const empty = await toGpu(new Float32Array(0), [0, 3]);
  try {
    assert.equal((await empty.read()).length, 0);
  } finally {
    empty.release();
  }
});

gpuTest(
  "reads that fill a piece alone return the tensor's exact elements in arrays of their own, read after read",
  async () => {
    // such a read takes the mapped range itself where the runtime moves it out (Deno's is a copy
    // of its own): each array must still hold the buffer's words, in a buffer of exactly them,
    // independent of every other read's
    const sizes = [5, P / 4, 17];
    const tensors = await Promise.all(
      sizes.map((n, k) => toGpu(new Float32Array(n).map((_, i) => k * 1e4 + i * 0.5), [n])),
    );
    try {
      const got: Float32Array[] = [];
      for (let rep = 0; rep < 3; rep++) {
        for (const [k, t] of tensors.entries()) {
          const back = await t.read();
          assert.equal(back.length, sizes[k]);
          assert.equal(back.byteOffset, 0);
          assert.equal(
            back.buffer.byteLength,
            sizes[k] * 4,
            `read ${rep}.${k}: a buffer of its own`,
          );
          const bad = back.findIndex((v, i) => v !== k * 1e4 + i * 0.5);
          assert.equal(bad, -1, `read ${rep}.${k}: element ${bad} is ${back[bad]}`);
          got.push(back);
        }
      }
      got[0][0] = -1; // the caller owns each array
      assert.equal((await tensors[0].read())[0], 0);
      assert.equal(new Set(got.map((a) => a.buffer)).size, got.length, "no two share a buffer");
    } finally {
      for (const t of tensors) t.release();
    }
  },
);
