// Host arrays made ready off the calling thread (kda/gpu/fresh_arrays.ts) and the checked copies
// kept from call to call (kda/op/_copies.ts): what they hand out is what was asked (lengths,
// zeros, buffers of their own), each request is taken or given up once, no worker outlives its
// request (a process that used them exits by itself), and the pool hands back only what was given
// back, and lets it go when idle.

import assert from "node:assert/strict";
import { FRESH_WORKER_BYTES, freshArrays } from "../kda/gpu/fresh_arrays.ts";
import { COPY_POOL_IDLE_MS, copyArray, giveBackCopies } from "../kda/op/_copies.ts";
import { runChild } from "./_gpu.ts";

/** Every element of a fresh array is zero (checked at each page and at the ends). */
function assertZeros(a: Float32Array, label: string): void {
  const at = (i: number) => assert.equal(a[i], 0, `${label}[${i}]`);
  for (let i = 0; i < a.length; i += 1024) at(i);
  if (a.length > 0) at(a.length - 1);
}

Deno.test("freshArrays below the worker threshold makes the arrays when taken, once", async () => {
  const fresh = freshArrays([0, 7, 1024]);
  assert.equal(fresh.inWorkers, false);
  const arrays = await fresh.take();
  assert.deepEqual(arrays.map((a) => a.length), [0, 7, 1024]);
  arrays.forEach((a, i) => assertZeros(a, `array ${i}`));
  await assert.rejects(() => fresh.take(), /already taken/);
  fresh.cancel(); // after take: nothing to give up
  const given = freshArrays([4]);
  given.cancel();
  await assert.rejects(() => given.take(), /given up/);
  assert.throws(() => freshArrays([3, -1]), /lengths\[1\] must be a non-negative integer: got -1/);
  assert.throws(() => freshArrays([1.5]), /lengths\[0\] must be a non-negative integer: got 1.5/);
});

Deno.test("freshArrays from the threshold up has workers make zeroed arrays of their own", async () => {
  const big = FRESH_WORKER_BYTES / 4 / 2 + 3; // two of these pass the threshold together
  const lengths = [big, 5, big + 1024, 0];
  const fresh = freshArrays(lengths);
  assert.equal(fresh.inWorkers, true);
  const arrays = await fresh.take();
  assert.deepEqual(arrays.map((a) => a.length), lengths);
  const buffers = new Set<ArrayBufferLike>();
  arrays.forEach((a, i) => {
    assertZeros(a, `array ${i}`);
    assert.equal(a.byteOffset, 0, `array ${i} starts its buffer`);
    assert.equal(a.buffer.byteLength, a.byteLength, `array ${i} owns its buffer`);
    assert.ok(a.buffer instanceof ArrayBuffer, `array ${i} is not shared memory`);
    buffers.add(a.buffer);
  });
  assert.equal(buffers.size, arrays.length, "each array has a buffer of its own");
  // writable as any array
  arrays[0][big - 1] = 2.5;
  assert.equal(arrays[0][big - 1], 2.5);
  await assert.rejects(() => fresh.take(), /already taken/);
});

Deno.test("freshArrays given up before it is taken rejects a later take", async () => {
  const fresh = freshArrays([FRESH_WORKER_BYTES / 4]);
  assert.equal(fresh.inWorkers, true);
  fresh.cancel();
  fresh.cancel();
  await assert.rejects(() => fresh.take(), /given up/);
});

Deno.test("a process that took, and one that gave up, fresh arrays from workers exits by itself", async () => {
  const url = new URL("../kda/gpu/fresh_arrays.ts", import.meta.url).href;
  for (const how of ["take", "cancel"]) {
    const script = `
      import { FRESH_WORKER_BYTES, freshArrays } from ${JSON.stringify(url)};
      const fresh = freshArrays([FRESH_WORKER_BYTES / 4, 8]);
      if (!fresh.inWorkers) throw new Error("no workers");
      ${
      how === "take"
        ? "const [a] = await fresh.take(); console.log(a.length);"
        : "fresh.cancel(); console.log('given up');"
    }
    `;
    const child = runChild(script, "ts");
    const timeout = new Promise<"hung">((resolve) => {
      const id = setTimeout(() => resolve("hung"), 60_000);
      Deno.unrefTimer(id);
    });
    const out = await Promise.race([child, timeout]);
    assert.notEqual(out, "hung", `${how}: the process did not exit within 60 s (a worker left)`);
    const done = out as Awaited<typeof child>;
    assert.ok(done.success, `${how}: exit ${done.code}: ${done.stderr}`);
    assert.match(done.stdout, how === "take" ? /^\d+$/m : /given up/);
  }
});

Deno.test("copyArray hands back only arrays given back, of their type and length", () => {
  const a = copyArray(Float32Array, 1000);
  assert.ok(a instanceof Float32Array && a.length === 1000);
  giveBackCopies([a, undefined]);
  assert.equal(copyArray(Float64Array, 1000) === (a as unknown), false, "another type");
  assert.notEqual(copyArray(Float32Array, 999), a, "another length");
  assert.equal(copyArray(Float32Array, 1000), a, "the array given back");
  assert.notEqual(copyArray(Float32Array, 1000), a, "given back once, handed out once");
  // a view into a larger buffer is not kept (its buffer holds more than the copy)
  const view = new Float32Array(new ArrayBuffer(4096), 16, 1000);
  giveBackCopies([view]);
  assert.notEqual(copyArray(Float32Array, 1000), view);
});

Deno.test("the copies' pool lets its arrays go once idle", async () => {
  const a = copyArray(Float32Array, 4096);
  giveBackCopies([a]);
  await new Promise((resolve) => setTimeout(resolve, COPY_POOL_IDLE_MS + 200));
  assert.notEqual(copyArray(Float32Array, 4096), a, "an array kept past the idle time");
});
