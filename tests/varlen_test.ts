// Packed variable-length batches (inputs.cuSeqlens, docs/kda.md 2.6): a packed batch equals its
// sequences run one by one (bit for bit on the cpu arm), the ops arm agrees with the cpu arm in
// f64, the gpu arm (whose default set walks the packed batch by sequence, unpadded) with the cpu
// arm in f32, and every bad offset table gets its named error.

import assert from "node:assert/strict";
import {
  type Float,
  kda,
  type KdaCotangents,
  type KdaInputs,
  kdaVjp,
  releaseTensors,
  toGpuInputs,
} from "../mod.ts";
import type { Arm, ChunkSize } from "../kda/_types.ts";
import { GRAD_NAMES } from "../kda/_types.ts";
import { bitsEqual, randomKda, Worst } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";
import type { ComputeDType } from "../base/dtype.ts";

reportMissingGpu("varlen_test");

const H = 2, K = 6, V = 5;

/** A packed batch of sequences of the given lengths, with h0 [N, H, K, V], and its cotangents. */
function packed(lengths: number[], seed: number, dtype: ComputeDType = "f64") {
  const T = lengths.reduce((a, b) => a + b, 0);
  const N = lengths.length;
  const x = randomKda({ B: 1, T, H, K, V }, seed, { gateMin: -3, dtype });
  const extra = randomKda({ B: N, T: 1, H, K, V }, seed + 1, { withH0: true, dtype });
  const cu = new Int32Array(N + 1);
  for (let i = 0; i < N; i++) cu[i + 1] = cu[i] + lengths[i];
  const inputs: KdaInputs = { ...x, h0: extra.h0!, cuSeqlens: cu };
  const like = (n: number, f: (i: number) => number): Float => {
    const a = dtype === "f32" ? new Float32Array(n) : new Float64Array(n);
    for (let i = 0; i < n; i++) a[i] = f(i);
    return a;
  };
  const ct: KdaCotangents = {
    dout: like(T * H * V, (i) => Math.sin(0.31 * i + seed)),
    dht: like(N * H * K * V, (i) => Math.cos(0.17 * i + seed)),
  };
  return { inputs, ct, cu, N };
}

/** Sequence i of a packed batch as a batch of its own, with its slice of the cotangents. */
function sequence(x: KdaInputs, ct: KdaCotangents, i: number) {
  const cu = x.cuSeqlens!;
  const [t0, t1] = [cu[i], cu[i + 1]];
  const rows = (a: Float, width: number) => a.slice(t0 * width, t1 * width);
  const state = (a: Float) => a.slice(i * H * K * V, (i + 1) * H * K * V);
  const { cuSeqlens: _, ...rest } = x;
  const inputs: KdaInputs = {
    ...rest,
    T: t1 - t0,
    q: rows(x.q, H * K),
    k: rows(x.k, H * K),
    v: rows(x.v, H * V),
    g: rows(x.g, H * K),
    beta: rows(x.beta, H),
    h0: state(x.h0!),
  };
  return { inputs, ct: { dout: rows(ct.dout, H * V), dht: state(ct.dht!) } };
}

/** Concatenates typed arrays of one type. */
function join(parts: Float[]): Float {
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = parts[0] instanceof Float32Array ? new Float32Array(n) : new Float64Array(n);
  let at = 0;
  for (const p of parts) out.set(p, at), at += p.length;
  return out;
}

/** Runs every sequence alone and joins the outputs and gradients in the packed layout. */
async function oneByOne(x: KdaInputs, ct: KdaCotangents, N: number, arm: Arm, C: ChunkSize) {
  const os: Float[] = [], hts: Float[] = [];
  const grads: Record<string, Float[]> = Object.fromEntries(GRAD_NAMES.map((n) => [n, []]));
  for (let i = 0; i < N; i++) {
    const s = sequence(x, ct, i);
    const out = await kda(s.inputs, { arm, chunkSize: C, strict: true });
    os.push(out.o), hts.push(out.ht);
    const g = await kdaVjp(s.inputs, s.ct, { arm, chunkSize: C, strict: true });
    for (const name of GRAD_NAMES) grads[name].push(g[name]);
  }
  return {
    o: join(os),
    ht: join(hts),
    grads: Object.fromEntries(GRAD_NAMES.map((n) => [n, join(grads[n])])),
  };
}

const LENGTHS = [[1, 17, 33, 5], [40], [16, 16, 3]];

Deno.test("kda() and kdaVjp() cpu arm: a packed batch equals its sequences run one by one, bit for bit, in f64 and f32 at chunk sizes 16 and 32", async () => {
  let seed = 10;
  for (const dtype of ["f64", "f32"] as const) {
    for (const lengths of LENGTHS) {
      for (const C of [16, 32] as ChunkSize[]) {
        const { inputs, ct, N } = packed(lengths, seed++, dtype);
        const label = `${dtype} lengths ${lengths} C${C}`;
        const out = await kda(inputs, { arm: "cpu", chunkSize: C, strict: true });
        const grads = await kdaVjp(inputs, ct, { arm: "cpu", chunkSize: C, strict: true });
        const ref = await oneByOne(inputs, ct, N, "cpu", C);
        assert.ok(bitsEqual(out.o, ref.o), `o ${label}`);
        assert.ok(bitsEqual(out.ht, ref.ht), `ht ${label}`);
        assert.equal(out.ht.length, N * H * K * V);
        for (const name of GRAD_NAMES) {
          assert.ok(bitsEqual(grads[name], ref.grads[name]), `${name} ${label}`);
        }
      }
    }
  }
});

Deno.test("kda() and kdaVjp() ops arm agree with the cpu arm on a packed batch in f64 (1e-10), and equal the ops arm one by one", async () => {
  const worst = new Worst();
  let seed = 50;
  for (const lengths of LENGTHS) {
    const { inputs, ct, N } = packed(lengths, seed++);
    const label = `lengths ${lengths}`;
    const ops = await kda(inputs, { arm: "ops", strict: true });
    const cpu = await kda(inputs, { arm: "cpu", strict: true });
    worst.check(`o ${label}`, ops.o, cpu.o, 1e-10);
    worst.check(`ht ${label}`, ops.ht, cpu.ht, 1e-10);
    const gOps = await kdaVjp(inputs, ct, { arm: "ops", strict: true });
    const gCpu = await kdaVjp(inputs, ct, { arm: "cpu", strict: true });
    for (const name of GRAD_NAMES) worst.check(`${name} ${label}`, gOps[name], gCpu[name], 1e-10);
    const alone = await oneByOne(inputs, ct, N, "ops", 16);
    worst.check(`ops o one by one ${label}`, ops.o, alone.o, 1e-14);
    for (const name of GRAD_NAMES) {
      worst.check(`ops ${name} one by one ${label}`, gOps[name], alone.grads[name], 1e-14);
    }
  }
  // Without h0 and dht: zero initial states, and dh0 still [N, H, K, V].
  const { inputs, ct } = packed([9, 2, 20], seed);
  const { h0: _, ...bare } = inputs;
  const gOps = await kdaVjp(bare, { dout: ct.dout }, { arm: "ops", strict: true });
  const gCpu = await kdaVjp(bare, { dout: ct.dout }, { arm: "cpu", strict: true });
  assert.equal(gCpu.dh0.length, 3 * H * K * V);
  for (const name of GRAD_NAMES) worst.check(`${name} no h0`, gOps[name], gCpu[name], 1e-10);
  worst.report("ops vs cpu, packed");
});

gpuTest(
  "kda() and kdaVjp() gpu arm on a packed batch agree with the cpu arm in f32 (o 2e-6, gradients 2e-5)",
  async () => {
    const worst = new Worst();
    let seed = 90;
    for (const lengths of LENGTHS) {
      for (const C of [16, 32] as ChunkSize[]) {
        const { inputs, ct } = packed(lengths, seed++, "f32");
        const label = `lengths ${lengths} C${C}`;
        const gpu = await kda(inputs, { arm: "gpu", chunkSize: C, strict: true });
        const cpu = await kda(inputs, { arm: "cpu", chunkSize: C, strict: true });
        worst.check(`o ${label}`, gpu.o, cpu.o, 2e-6);
        worst.check(`ht ${label}`, gpu.ht, cpu.ht, 2e-6);
        const gGpu = await kdaVjp(inputs, ct, { arm: "gpu", chunkSize: C, strict: true });
        const gCpu = await kdaVjp(inputs, ct, { arm: "cpu", chunkSize: C, strict: true });
        for (const name of GRAD_NAMES) {
          assert.ok(gGpu[name] instanceof Float32Array, `${name} is not f32`);
          worst.check(`${name} ${label}`, gGpu[name], gCpu[name], 2e-5);
        }
      }
    }
    worst.report("gpu vs cpu, packed");
  },
);

/**
 * The per-sequence reference of a packed batch that may hold empty sequences: a non-empty one run
 * alone; an empty one passes its state through, so its ht is its h0 (zeros without) and its dh0 is
 * its dht, and it has no rows.
 */
async function perSequence(x: KdaInputs, ct: KdaCotangents, N: number, arm: Arm) {
  const os: Float[] = [], hts: Float[] = [];
  const grads: Record<string, Float[]> = Object.fromEntries(GRAD_NAMES.map((n) => [n, []]));
  const cu = x.cuSeqlens!;
  for (let i = 0; i < N; i++) {
    const s = sequence(x, ct, i);
    if (cu[i + 1] === cu[i]) {
      hts.push(s.inputs.h0 ?? new Float64Array(H * K * V));
      grads.dh0.push(s.ct.dht!);
      continue;
    }
    const out = await kda(s.inputs, { arm, strict: true });
    os.push(out.o), hts.push(out.ht);
    const g = await kdaVjp(s.inputs, s.ct, { arm, strict: true });
    for (const name of GRAD_NAMES) grads[name].push(g[name]);
  }
  return {
    o: join(os),
    ht: join(hts),
    grads: Object.fromEntries(GRAD_NAMES.map((n) => [n, join(grads[n])])),
  };
}

/** Packed batches with empty sequences first, in the middle, in a run and last. */
const WITH_EMPTY = [[0, 5, 17], [3, 0, 0, 20, 1], [16, 0], [0, 0, 7, 0]];

Deno.test("kda() and kdaVjp() on the cpu and ops arms run zero-length sequences in a packed batch: the state passes through (ht = h0, dh0 = dht), the others equal their sequences run alone (f64)", async () => {
  const worst = new Worst();
  let seed = 300;
  for (const arm of ["cpu", "ops"] as const) {
    for (const lengths of WITH_EMPTY) {
      const { inputs, ct, N } = packed(lengths, seed++);
      const label = `${arm} lengths ${lengths}`;
      const out = await kda(inputs, { arm, strict: true });
      const grads = await kdaVjp(inputs, ct, { arm, strict: true });
      const ref = await perSequence(inputs, ct, N, arm);
      worst.check(`o ${label}`, out.o, ref.o, 1e-14);
      worst.check(`ht ${label}`, out.ht, ref.ht, 1e-14);
      for (const name of GRAD_NAMES) {
        worst.check(`${name} ${label}`, grads[name], ref.grads[name], 1e-14);
      }
      // Without h0 an empty sequence's final state is zeros, and dh0 is still its dht.
      const { h0: _, ...bare } = inputs;
      const zero = await kda(bare, { arm, strict: true });
      const gz = await kdaVjp(bare, ct, { arm, strict: true });
      const cu = inputs.cuSeqlens!;
      const KV = H * K * V;
      for (let i = 0; i < N; i++) {
        if (cu[i + 1] !== cu[i]) continue;
        assert.ok(zero.ht.subarray(i * KV, (i + 1) * KV).every((v) => v === 0), `${label} ht`);
        assert.deepEqual(
          gz.dh0.subarray(i * KV, (i + 1) * KV),
          ct.dht!.subarray(i * KV, (i + 1) * KV),
        );
      }
    }
  }
  worst.report("packed batches with empty sequences vs per sequence");
});

gpuTest(
  "kda() and kdaVjp() gpu arm (each kernel set, host and device inputs) run zero-length sequences in a packed batch, agreeing with the cpu arm in f32",
  async () => {
    const worst = new Worst();
    for (const kernels of ["fused", "split"]) {
      let seed = 400;
      for (const lengths of WITH_EMPTY) {
        const { inputs, ct } = packed(lengths, seed++, "f32");
        const label = `${kernels} lengths ${lengths}`;
        const options = { arm: "gpu" as const, kernels, strict: true };
        const gpu = await kda(inputs, options);
        const cpu = await kda(inputs, { arm: "cpu", strict: true });
        worst.check(`o ${label}`, gpu.o, cpu.o, 2e-6);
        worst.check(`ht ${label}`, gpu.ht, cpu.ht, 2e-6);
        const gGpu = await kdaVjp(inputs, ct, options);
        const gCpu = await kdaVjp(inputs, ct, { arm: "cpu", strict: true });
        for (const name of GRAD_NAMES) {
          worst.check(`${name} ${label}`, gGpu[name], gCpu[name], 2e-5);
        }
        // The same batch from tensors that stay on the device (GpuTensor inputs).
        const up = await toGpuInputs(inputs as KdaInputs<Float32Array>);
        try {
          const resident = await kda(up, options);
          try {
            worst.check(`device o ${label}`, await resident.o.read(), cpu.o, 2e-6);
            worst.check(`device ht ${label}`, await resident.ht.read(), cpu.ht, 2e-6);
          } finally {
            releaseTensors(resident);
          }
        } finally {
          releaseTensors(up);
        }
      }
    }
    worst.report("gpu vs cpu, packed with empty sequences");
  },
);

Deno.test("kda() rejects every bad cuSeqlens, and h0/dht of the wrong sequence count, with named errors", async () => {
  const { inputs, ct } = packed([3, 4], 7);
  const bad = async (patch: Partial<KdaInputs>, cls: ErrorConstructor, re: RegExp) => {
    await assert.rejects(
      () => kda({ ...inputs, ...patch } as KdaInputs, { arm: "cpu" }),
      (e: unknown) => e instanceof cls && re.test((e as Error).message),
      `${re}`,
    );
  };
  const cu = (...a: number[]) => new Int32Array(a);
  await bad(
    { cuSeqlens: [0, 3, 7] as unknown as Int32Array },
    TypeError,
    /^inputs\.cuSeqlens must be an Int32Array: got Array$/,
  );
  await bad(
    { cuSeqlens: new Uint32Array([0, 7]) as unknown as Int32Array },
    TypeError,
    /^inputs\.cuSeqlens must be an Int32Array: got Uint32Array$/,
  );
  await bad({ cuSeqlens: cu(0) }, RangeError, /^inputs\.cuSeqlens must hold at least 2 offsets/);
  await bad({ cuSeqlens: cu(1, 3, 7) }, RangeError, /^inputs\.cuSeqlens must start at 0: got 1$/);
  await bad(
    { cuSeqlens: cu(0, 5, 3, 7) },
    RangeError,
    /^inputs\.cuSeqlens must not decrease: got 3 after 5 at index 2$/,
  );
  await bad(
    { cuSeqlens: cu(0, 3, 6) },
    RangeError,
    /^inputs\.cuSeqlens must end at inputs\.T = 7: got 6$/,
  );
  const twoRows = { B: 2, T: 7, q: new Float64Array(2 * 7 * H * K) };
  await bad(
    { ...twoRows, cuSeqlens: cu(0, 3, 7) },
    RangeError,
    /^inputs\.B must be 1 with inputs\.cuSeqlens \(the sequences are packed along T\): got 2$/,
  );
  await bad(
    { h0: new Float64Array(H * K * V) },
    RangeError,
    /^inputs\.h0 must have 120 elements \[N, H, K, V\]: got 60$/,
  );
  await assert.rejects(
    () => kdaVjp(inputs, { ...ct, dht: new Float64Array(3 * H * K * V) }, { arm: "cpu" }),
    (e: unknown) =>
      e instanceof RangeError &&
      /^cotangents\.dht must have 120 elements \[N, H, K, V\]: got 180$/.test(e.message),
  );
});

gpuTest(
  "fla's own varlen case (H = 4, K = V = 256, cu_seqlens [0, 100, 300, 1200, 3000, 4096]) fits " +
    "the default set unpadded; the fused set's refusal names the caller's packed batch first",
  async () => {
    const { gpuUnsupportedReason, gpuStatus } = await import("../kda/gpu/mod.ts");
    const status = await gpuStatus();
    assert.ok(status.available);
    const dims = {
      B: 1,
      T: 4096,
      H: 4,
      K: 256,
      V: 256,
      cuSeqlens: new Int32Array([0, 100, 300, 1200, 3000, 4096]),
    };
    // Σ⌈len/64⌉ chunks, no padding: within the software adapter's 128 MiB bindings too
    assert.equal(gpuUnsupportedReason(dims, 64), null);
    assert.equal(gpuUnsupportedReason(dims, 64, "split"), null);
    const fused = gpuUnsupportedReason(dims, 64, "fused");
    if (status.info.limits.maxStorageBufferBindingSize < 152842880) {
      // the padded batch [5, 1800] needs more than one binding there
      assert.match(
        fused ?? "",
        /^the packed batch of 5 sequences \(T=4096\) runs padded to B=5, T=1800 on the kernel set fused, and there the inputs buffer needs \d+ bytes/,
      );
    } else assert.equal(fused, null);
  },
);
