// Calls on GpuTensors (data that stays on the gpu arm's device): the same bits as the typed-array
// gpu arm, no host sync until the caller reads, every buffer freed, counted by the seam, and bad
// tensors refused with errors that name them.

import assert from "node:assert/strict";
import {
  BFloat16Array,
  DeviceTensor,
  gpuDevice,
  gpuPool,
  gpuSettled,
  gpuSyncs,
  isGpuTensor,
  kda,
  kdaVjp,
  releaseTensors,
  resetSeamCounts,
  seamCounts,
  seamDecisions,
  toGpu,
  toGpuInputs,
} from "../mod.ts";
import { gpuCreatedBytes, gpuLiveBuffers } from "../kda/gpu/buffers.ts";
import { gpuBackward, gpuForward } from "../kda/gpu/mod.ts";
import type { KdaDims, KdaProblem } from "../kda/_types.ts";
import { bitsEqual, randomKda } from "./_fixtures.ts";
import { withEnv } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";

reportMissingGpu("device_tensor_test.ts");

const GRADS = ["dq", "dk", "dv", "dg", "dbeta", "dh0"] as const;

/** The problem's arrays uploaded as DeviceTensors, and the typed-array problem itself. */
async function uploaded(dims: KdaDims, seed: number, withH0: boolean) {
  const x = randomKda(dims, seed, { dtype: "f32", withH0, gateMin: -3 });
  const device = await toGpuInputs(x as KdaProblem<Float32Array>);
  return { x, device, release: () => releaseTensors(device) };
}

for (
  const [dims, chunkSize, withH0] of [
    [{ B: 2, T: 70, H: 2, K: 8, V: 12 }, 16, true],
    [{ B: 1, T: 130, H: 1, K: 32, V: 20 }, 64, false],
  ] as const
) {
  gpuTest(
    `kda() and kdaVjp() on GpuTensors give the typed-array gpu arm's bits (T=${dims.T}, ` +
      `chunkSize ${chunkSize}${withH0 ? ", with h0" : ""})`,
    async () => {
      const { x, device, release } = await uploaded(dims, 11, withH0);
      const { B, T, H, V } = dims;
      const dout = Float32Array.from({ length: B * T * H * V }, (_, i) => Math.sin(0.3 * i));
      const options = { arm: "gpu", strict: true, chunkSize } as const;
      const host = await kda(x, options);
      const hostGrads = await kdaVjp(x, { dout }, options);
      const out = await kda(device, options);
      const doutOnDevice = await toGpu(dout, [B, T, H, V]);
      const grads = await kdaVjp(device, { dout: doutOnDevice }, options);
      try {
        assert.ok(out.o instanceof DeviceTensor && isGpuTensor(out.ht));
        assert.ok(bitsEqual(await out.o.read(), host.o), "o differs");
        assert.ok(bitsEqual(await out.ht.read(), host.ht), "ht differs");
        for (const name of GRADS) {
          assert.equal(grads[name].size, hostGrads[name].length, `${name} has the wrong size`);
          assert.ok(bitsEqual(await grads[name].read(), hostGrads[name]), `${name} differs`);
        }
      } finally {
        releaseTensors(out, grads, doutOnDevice);
        release();
      }
    },
  );
}

gpuTest(
  "kdaVjp() on GpuTensors leaves out the split set's output stage: the bits of a forward that " +
    "returns o and its backward, with at least o's bytes fewer created",
  async () => {
    const dims = { B: 1, T: 128, H: 2, K: 32, V: 32 };
    const { device, release } = await uploaded(dims, 23, true);
    const { B, T, H, V } = dims;
    const dout = await toGpu(
      Float32Array.from({ length: B * T * H * V }, (_, i) => Math.cos(0.7 * i)),
      [B, T, H, V],
    );
    // bytes created by a step from an empty pool (every buffer it needs, made new)
    const cold = async <R>(step: () => Promise<R>): Promise<[R, number]> => {
      gpuPool({ maxBytes: 0 });
      gpuPool({ maxBytes: null });
      const before = gpuCreatedBytes();
      const result = await step();
      return [result, gpuCreatedBytes() - before];
    };
    const options = { chunkSize: 64, kernels: "split" } as const;
    const [withO, bytesWithO] = await cold(async () => {
      const x = { ...device, scale: 1 / Math.sqrt(dims.K) };
      const { o, ht, saved } = await gpuForward(x, { ...options, saveForBackward: true });
      try {
        return { o, ht, grads: await gpuBackward(saved!, { dout }) };
      } finally {
        saved!.release();
      }
    });
    const [grads, bytes] = await cold(() =>
      kdaVjp(device, { dout }, { arm: "gpu", strict: true, ...options })
    );
    try {
      for (const name of GRADS) {
        const a = await grads[name].read();
        const b = await withO.grads[name].read();
        assert.ok(bitsEqual(a, b), `${name} differs`);
      }
      // o is not made at all (and the forward's ht, which kdaVjp does not return, may be reused)
      const oBytes = B * T * H * V * 4;
      const fewer = bytesWithO - bytes;
      if (!(fewer >= oBytes)) throw new Error(`created ${bytes} against ${bytesWithO} bytes`);
    } finally {
      releaseTensors(grads, withO.grads, withO, dout);
      release();
    }
  },
);

gpuTest("a step on GpuTensors makes no host sync until the caller reads, then one", async () => {
  const { device, release } = await uploaded({ B: 1, T: 40, H: 2, K: 8, V: 8 }, 5, true);
  const before = gpuSyncs();
  const { o, ht } = await kda(device, { arm: "gpu", chunkSize: 16 });
  // the forward's output is the backward's cotangent, as in a chained step
  const grads = await kdaVjp(device, { dout: o, dht: ht }, { arm: "gpu", chunkSize: 16 });
  try {
    assert.equal(gpuSyncs() - before, 0, "a call on GpuTensors synced with the host");
    const dbeta = await grads.dbeta.read();
    assert.equal(gpuSyncs() - before, 1);
    assert.ok(dbeta.every(Number.isFinite) && dbeta.some((v) => v !== 0));
  } finally {
    releaseTensors(o, ht, grads);
    release();
  }
});

gpuTest("concurrent calls on GpuTensors give the bits of sequential ones", async () => {
  const { device, release } = await uploaded({ B: 2, T: 50, H: 1, K: 8, V: 8 }, 21, true);
  const options = { arm: "gpu", chunkSize: 16 } as const;
  const { o, ht } = await kda(device, options);
  const step = () => kdaVjp(device, { dout: o, dht: ht }, options);
  const read = async (g: Awaited<ReturnType<typeof step>>) =>
    await Promise.all(GRADS.map((n) => g[n].read()));
  const sequential = [await step(), await step()];
  const concurrent = await Promise.all([step(), step(), step()]);
  try {
    const want = await read(sequential[0]);
    for (const g of [sequential[1], ...concurrent]) {
      const got = await read(g);
      GRADS.forEach((n, i) => assert.ok(bitsEqual(got[i], want[i]), `${n} differs`));
    }
  } finally {
    releaseTensors(o, ht, ...sequential, ...concurrent);
    release();
  }
});

gpuTest(
  "calls on GpuTensors free every buffer they allocate, and released outputs are refused",
  async () => {
    const { device, release } = await uploaded({ B: 1, T: 33, H: 1, K: 4, V: 4 }, 9, false);
    releaseTensors(await kda(device, { arm: "gpu", chunkSize: 16 })); // the device's first buffers
    await gpuSettled();
    const live = gpuLiveBuffers();
    for (let i = 0; i < 3; i++) {
      const { o, ht } = await kda(device, { arm: "gpu", chunkSize: 16 });
      await gpuSettled();
      assert.equal(gpuLiveBuffers(), live + 2, "only the two outputs stay allocated");
      const grads = await kdaVjp(device, { dout: o }, { arm: "gpu", chunkSize: 16 });
      await gpuSettled();
      assert.equal(gpuLiveBuffers(), live + 8, "only the outputs and the six gradients stay");
      releaseTensors(o, ht, grads);
      await gpuSettled();
      assert.equal(gpuLiveBuffers(), live);
    }
    const { o, ht } = await kda(device, { arm: "gpu", chunkSize: 16 });
    o.release();
    o.release(); // harmless
    assert.equal(o.released, true);
    await assert.rejects(() => o.read(), {
      name: "TypeError",
      message: "This DeviceTensor was released: its buffer is gone",
    });
    await assert.rejects(
      () => kdaVjp(device, { dout: o }, { arm: "gpu", chunkSize: 16 }),
      (e: Error) =>
        e instanceof RangeError && /cotangents\.dout must be a live tensor/.test(e.message),
    );
    ht.release();
    release();
  },
);

gpuTest(
  "calls on GpuTensors are counted by the seam, and a shape the gpu arm cannot run is a counted, named decline",
  async () => {
    const { device, release } = await uploaded({ B: 1, T: 16, H: 1, K: 4, V: 4 }, 2, false);
    try {
      resetSeamCounts();
      const { o, ht } = await kda(device, { chunkSize: 16 });
      const grads = await kdaVjp(device, { dout: o }, { chunkSize: 16 });
      releaseTensors(o, ht, grads);
      const counts = seamCounts();
      assert.equal(counts.asked, 2);
      assert.equal(counts.fusedFwd, 2);
      assert.equal(counts.fusedBwd, 1);
      assert.equal(counts.declined, 0);
      assert.equal(counts.opsPath, 0);
      // a scale that overflows f32: the gpu arm declines, and with the data on the device nothing
      // else can run it
      resetSeamCounts();
      await assert.rejects(
        () => kda({ ...device, scale: 1e39 }, { chunkSize: 16 }),
        (e: Error) =>
          e instanceof RangeError &&
          /the data lives on the gpu arm's device, but that arm cannot run this call: scale must be finite in f32/
            .test(e.message),
      );
      assert.equal(seamCounts().declined, 1);
      assert.equal(seamDecisions().at(-1)?.ran, "none");
      await assert.rejects(
        () => kda(device, { arm: "cpu" }),
        (e: Error) =>
          e instanceof RangeError &&
          e.message === "options.arm must be gpu when the data lives on " +
              "the gpu arm's device: got cpu",
      );
    } finally {
      release();
    }
  },
);

gpuTest(
  "on GpuTensors an arm the call names beats KDA_ARM and KDA_REQUIRE_ARM, as on typed arrays",
  async () => {
    const { device, release } = await uploaded({ B: 1, T: 16, H: 1, K: 4, V: 4 }, 3, false);
    const quiet = { chunkSize: 16, quiet: true } as const;
    try {
      // KDA_ARM forces calls that name no arm: only such a call's decision says it is not honoured
      await withEnv({ KDA_ARM: "cpu" }, async () => {
        const last = () => seamDecisions().at(-1)?.index ?? -1;
        const before = last();
        releaseTensors(await kda(device, { ...quiet, arm: "gpu" }));
        assert.equal(last(), before, "a named arm: no decision, nothing to honour");
        releaseTensors(await kda(device, quiet));
        assert.match(seamDecisions().at(-1)?.reason ?? "", /KDA_ARM=cpu is not honoured/);
      });
      // KDA_REQUIRE_ARM binds calls that name no arm; the named gpu arm runs
      await withEnv({ KDA_REQUIRE_ARM: "cpu" }, async () => {
        releaseTensors(await kda(device, { ...quiet, arm: "gpu" }));
        await assert.rejects(
          () => kda(device, quiet),
          /KDA_REQUIRE_ARM=cpu requires the cpu arm, but the data lives on the gpu arm's device/,
        );
      });
    } finally {
      release();
    }
  },
);

gpuTest(
  "GpuTensor inputs that are mixed, misshapen, too small or not copyable are refused by name",
  async () => {
    const { x, device, release } = await uploaded({ B: 1, T: 8, H: 1, K: 4, V: 4 }, 4, false);
    const gpu = await gpuDevice();
    const small = {
      buffer: gpu.createBuffer({
        size: 16,
        usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
      }),
      shape: [1, 8, 1, 4],
      dtype: "f32" as const,
    };
    const noCopy = {
      buffer: gpu.createBuffer({ size: 128, usage: GPUBufferUsage.STORAGE }),
      shape: [1, 8, 1, 4],
      dtype: "f32" as const,
    };
    // mapped at creation and never unmapped: WebGPU refused the submit without naming it
    const mapped = {
      buffer: gpu.createBuffer({
        size: 128,
        usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
        mappedAtCreation: true,
      }),
      shape: [1, 8, 1, 4],
      dtype: "f32" as const,
    };
    const cases: [unknown, RegExp][] = [
      [{ ...device, k: mapped }, /^inputs\.k\.buffer must be unmapped: got mapState mapped$/],
      [
        { ...device, v: x.v },
        /^inputs\.v must be a GpuTensor like inputs\.q \(all arrays on the device or none\): got Float32Array$/,
      ],
      [
        { ...device, q: { ...device.q, buffer: device.q.buffer, shape: [1, 8, 4], dtype: "f32" } },
        /^inputs\.q\.shape must be \[B, T, H, K\] = \[1, 8, 1, 4\]: got \[1, 8, 4\]$/,
      ],
      [
        { ...device, k: { buffer: device.k.buffer, shape: device.k.shape, dtype: "f16" } },
        /^inputs\.k\.dtype must be "f32": got f16$/,
      ],
      [{ ...device, g: small }, /^inputs\.g\.buffer must hold at least 128 bytes: got 16$/],
      [{ ...device, q: noCopy }, /^inputs\.q\.buffer must have COPY_SRC usage/],
      // grouped value heads and packed batches run on GpuTensors: their shapes are checked
      [
        { ...device, HV: 2 },
        /^inputs\.v\.shape must be \[B, T, HV, V\] = \[1, 8, 2, 4\]: got \[1, 8, 1, 4\]$/,
      ],
      [
        { ...device, cuSeqlens: new Int32Array([0, 3]) },
        /^inputs\.cuSeqlens must end at inputs\.T = 8: got 3$/,
      ],
    ];
    try {
      for (const [inputs, message] of cases) {
        await assert.rejects(() => kda(inputs as typeof device), (e: Error) => {
          assert.match(e.message, message);
          assert.ok(e instanceof TypeError || e instanceof RangeError);
          return true;
        });
      }
      await assert.rejects(
        () => kdaVjp(device, { dout: x.v as unknown as DeviceTensor }),
        /^TypeError: cotangents\.dout must be a GpuTensor like the other arrays: got Float32Array$/,
      );
    } finally {
      small.buffer.destroy();
      noCopy.buffer.destroy();
      mapped.buffer.destroy();
      release();
    }
  },
);

gpuTest(
  "a DeviceTensor's shape is its own and frozen: its size and reads cannot be changed through it",
  async () => {
    const shape = [4];
    const d = await toGpu(new Float32Array([1, 2, 3, 4]), shape);
    try {
      shape[0] = 2; // the caller's array is not the tensor's
      assert.throws(() => {
        (d.shape as number[])[0] = 2;
      }, TypeError);
      assert.deepEqual(d.shape, [4]);
      assert.equal(d.size, 4);
      assert.deepEqual([...await d.read()], [1, 2, 3, 4]);
    } finally {
      d.release();
    }
  },
);

Deno.test("toGpu() refuses data that does not fit its shape, by name", async () => {
  await assert.rejects(
    () => toGpu(new Float32Array(5), [2, 2]),
    (e: Error) =>
      e instanceof RangeError && e.message === "data must have 4 elements for shape [2, 2]: got 5",
  );
  await assert.rejects(
    () => toGpu(new Float64Array(4) as unknown as Float32Array, [4]),
    (e: Error) => e instanceof TypeError && /^data must be a Float32Array/.test(e.message),
  );
});

Deno.test("toGpuInputs() refuses f64 and 16-bit arrays by name, asking for f32 alone", async () => {
  const x = randomKda({ B: 1, T: 8, H: 1, K: 4, V: 4 }, 1);
  await assert.rejects(
    () => toGpuInputs(x as KdaProblem<Float32Array>),
    (e: Error) =>
      e instanceof TypeError &&
      e.message === "inputs.q must be a Float32Array for the device: got Float64Array",
  );
  // kda() takes bf16 (and widens it); the device takes f32 alone, and says so
  const f32 = Float32Array.from(x.q);
  for (const name of ["q", "g"] as const) {
    const y = { ...x, q: f32, k: Float32Array.from(x.k), v: Float32Array.from(x.v) };
    const z = { ...y, g: Float32Array.from(x.g), beta: Float32Array.from(x.beta), h0: undefined };
    delete z.h0;
    const bad = { ...z, [name]: new BFloat16Array(z[name].length) };
    await assert.rejects(
      () => toGpuInputs(bad as unknown as KdaProblem<Float32Array>),
      (e: Error) =>
        e instanceof TypeError &&
        e.message === `inputs.${name} must be a Float32Array for the device: got BFloat16Array`,
    );
  }
});

gpuTest("toGpuInputs() carries grouped value heads and packed batches to the device", async () => {
  const wide = randomKda({ B: 1, T: 8, H: 2, K: 4, V: 4 }, 1, { withH0: true, dtype: "f32" });
  const cuSeqlens = new Int32Array([0, 3, 8]);
  const grouped = {
    ...wide,
    H: 1,
    HV: 2,
    q: wide.q.slice(0, 32),
    k: wide.k.slice(0, 32),
    cuSeqlens,
    h0: new Float32Array(2 * 2 * 4 * 4).fill(0.25),
  } as KdaProblem<Float32Array>;
  const up = await toGpuInputs(grouped);
  try {
    assert.equal(up.HV, 2);
    assert.deepEqual(up.cuSeqlens, cuSeqlens);
    assert.deepEqual(up.v.shape, [1, 8, 2, 4]);
    assert.deepEqual(up.h0!.shape, [2, 2, 4, 4]);
    assert.ok(bitsEqual(await up.v.read(), grouped.v as Float32Array), "v uploads as it is");
  } finally {
    releaseTensors(up);
  }
});

gpuTest(
  "the buffer pool is on by default within four maxBufferSize; its calls give the bits of calls " +
    "without it, keep at most the bound, leak nothing, and turning it off frees it all",
  async () => {
    const { x, device, release } = await uploaded({ B: 1, T: 40, H: 2, K: 8, V: 8 }, 31, true);
    const status = gpuPool();
    const { maxBufferSize } = (await gpuDevice()).limits;
    assert.equal(status.isDefault, true, "the pool's bound is not the default");
    assert.equal(status.maxBytes, 4 * maxBufferSize);
    const options = { arm: "gpu", strict: true, chunkSize: 16 } as const;
    const dout = Float32Array.from({ length: 40 * 2 * 8 }, (_, i) => Math.cos(i));
    // the reference: the same calls with no pool at all
    assert.equal(gpuPool({ maxBytes: 0 }).pooledBuffers, 0);
    const off = { fwd: await kda(x, options), grads: await kdaVjp(x, { dout }, options) };
    const onDevice = await (async () => {
      const { o, ht } = await kda(device, options);
      const grads = await kdaVjp(device, { dout: o }, options);
      const read = { o: await o.read(), dbeta: await grads.dbeta.read() };
      releaseTensors(o, ht, grads);
      return read;
    })();
    await gpuSettled();
    const live = gpuLiveBuffers();
    try {
      assert.equal(gpuPool({ maxBytes: null }).isDefault, true);
      for (let round = 0; round < 3; round++) {
        const fwd = await kda(x, options);
        const grads = await kdaVjp(x, { dout }, options);
        assert.ok(bitsEqual(fwd.o, off.fwd.o) && bitsEqual(fwd.ht, off.fwd.ht), "outputs differ");
        for (const n of GRADS) assert.ok(bitsEqual(grads[n], off.grads[n]), `${n} differs`);
        const { o, ht } = await kda(device, options);
        const dgrads = await kdaVjp(device, { dout: o }, options);
        assert.ok(bitsEqual(await o.read(), onDevice.o), "o on the device differs");
        assert.ok(bitsEqual(await dgrads.dbeta.read(), onDevice.dbeta), "dbeta differs");
        releaseTensors(o, ht, dgrads);
        await gpuSettled();
        const pool = gpuPool();
        assert.ok(pool.pooledBuffers > 0, "nothing was pooled");
        assert.ok(pool.pooledBytes <= pool.maxBytes);
        // the pool's buffers are not live: every other one is gone, so nothing leaks
        assert.equal(gpuLiveBuffers(), live, "a buffer outside the pool outlived its call");
      }
      const small = gpuPool({ maxBytes: 4096 });
      assert.ok(
        small.pooledBytes <= 4096,
        `the pool kept ${small.pooledBytes} bytes over its 4096`,
      );
    } finally {
      gpuPool({ maxBytes: 0 });
      release();
      gpuPool({ maxBytes: null });
    }
    assert.equal(gpuPool().pooledBuffers, 0);
    await gpuSettled();
    assert.equal(
      gpuLiveBuffers(),
      live - 6,
      "the six uploaded inputs (q, k, v, g, beta, h0) are freed too",
    );
  },
);

gpuTest(
  "a DeviceTensor released while a pending call still reads it reaches no new upload before " +
    "that call has read it (released 0 to 24 microtasks after the call)",
  async () => {
    const dims = { B: 1, T: 40, H: 2, K: 8, V: 8 };
    const { x, device, release } = await uploaded(dims, 41, true);
    const options = { arm: "gpu", strict: true, chunkSize: 16 } as const;
    const qShape = [1, 40, 2, 8];
    const dout = Float32Array.from({ length: 40 * 2 * 8 }, (_, i) => Math.sin(i));
    const want = await kda(x, options);
    const wantGrads = await kdaVjp(x, { dout }, options);
    const garbage = new Float32Array(40 * 2 * 8).fill(3);
    try {
      for (let delay = 0; delay <= 24; delay++) {
        for (const vjp of [false, true]) {
          const q = await toGpu(x.q as Float32Array, qShape);
          const doutOnDevice = await toGpu(dout, qShape);
          const inputs = { ...device, q };
          const pending = vjp
            ? kdaVjp(inputs, { dout: doutOnDevice }, options)
            : kda(inputs, options);
          for (let i = 0; i < delay; i++) await Promise.resolve();
          q.release();
          doutOnDevice.release();
          // same size: with the pool on, the upload would take a buffer just released
          const other = await toGpu(garbage, qShape);
          const other2 = await toGpu(garbage, qShape);
          const out = await pending;
          try {
            if ("o" in out) {
              assert.ok(bitsEqual(await out.o.read(), want.o), `o differs (delay ${delay})`);
            } else {
              for (const n of GRADS) {
                assert.ok(
                  bitsEqual(await out[n].read(), wantGrads[n]),
                  `${n} differs (delay ${delay})`,
                );
              }
            }
          } finally {
            releaseTensors(out, other, other2);
          }
        }
      }
    } finally {
      release();
    }
  },
);

Deno.test("gpuPool() refuses a maxBytes that is not a non-negative integer, and unknown fields, by name", () => {
  for (const bad of [-1, 1.5, NaN]) {
    assert.throws(
      () => gpuPool({ maxBytes: bad }),
      (e: Error) =>
        e instanceof RangeError &&
        /^options\.maxBytes must be a non-negative integer or null: got/.test(e.message),
    );
  }
  assert.throws(
    () => gpuPool({ maxBytes: "1" as unknown as number }),
    (e: Error) =>
      e instanceof TypeError &&
      e.message === 'options.maxBytes must be a non-negative integer or null: got "1"',
  );
  // a misspelt field changed nothing and said nothing: the pool stayed on
  const before = gpuPool();
  assert.throws(
    () => gpuPool({ maxbytes: 0 } as never),
    (e: Error) =>
      e instanceof TypeError &&
      /^options\.maxbytes is not a known field: .*maxBytes/.test(e.message),
  );
  assert.equal(gpuPool().maxBytes, before.maxBytes);
  assert.throws(() => gpuPool(null as never), TypeError);
});
