// Grouped value heads (inputs.HV, docs/kda.md 2.5): on every arm, HV value heads sharing H
// query/key heads equal the op run with q and k repeated by hand, dq and dk are the sums over each
// group, and bad head counts get named errors.

import assert from "node:assert/strict";
import { type Float, kda, type KdaCotangents, type KdaInputs, kdaVjp } from "../mod.ts";
import type { Arm } from "../kda/_types.ts";
import { bitsEqual, randomKda } from "./_fixtures.ts";
import { gpuTest, reportMissingGpu } from "./_gpu.ts";
import type { ComputeDType } from "../base/dtype.ts";
import { gpuDiagnostics } from "../mod.ts";
import { gpuStatus, gpuUnsupportedReason } from "../kda/gpu/mod.ts";

reportMissingGpu("gva_test");

const K = 5, V = 4;

/** Grouped inputs (q, k with H heads; the rest with HV), optionally packed, and cotangents. */
function grouped(H: number, HV: number, seed: number, dtype: ComputeDType, cu?: Int32Array) {
  const B = cu === undefined ? 2 : 1, T = cu === undefined ? 19 : cu[cu.length - 1];
  const N = cu === undefined ? B : cu.length - 1;
  const qk = randomKda({ B, T, H, K, V }, seed, { dtype });
  const rest = randomKda({ B, T, H: HV, K, V }, seed + 1, { gateMin: -2, dtype });
  const h0 = randomKda({ B: N, T: 1, H: HV, K, V }, seed + 2, { withH0: true, dtype }).h0!;
  const inputs: KdaInputs = {
    B,
    T,
    H,
    HV,
    K,
    V,
    q: qk.q,
    k: qk.k,
    v: rest.v,
    g: rest.g,
    beta: rest.beta,
    h0,
    ...(cu === undefined ? {} : { cuSeqlens: cu }),
  };
  const wave = (n: number, phase: number): Float => {
    const a = dtype === "f32" ? new Float32Array(n) : new Float64Array(n);
    for (let i = 0; i < n; i++) a[i] = Math.sin(0.23 * i + phase);
    return a;
  };
  const ct: KdaCotangents = { dout: wave(B * T * HV * V, seed), dht: wave(N * HV * K * V, 1) };
  return { inputs, ct };
}

/** The same call with q and k repeated by hand to HV heads (head j reads head floor(j / G)). */
function repeatedByHand(x: KdaInputs): KdaInputs {
  const { B, T, H, K } = x;
  const HV = x.HV!, G = HV / H;
  const rep = (a: Float) => {
    const out = a instanceof Float32Array ? new Float32Array(B * T * HV * K) : new Float64Array(
      B * T * HV * K,
    );
    for (let bt = 0; bt < B * T; bt++) {
      for (let j = 0; j < HV; j++) {
        const h = Math.floor(j / G);
        out.set(a.subarray((bt * H + h) * K, (bt * H + h + 1) * K), (bt * HV + j) * K);
      }
    }
    return out;
  };
  const { HV: _, ...rest } = x;
  return { ...rest, H: HV, q: rep(x.q as Float), k: rep(x.k as Float) };
}

/**
 * Sums the gradient of each group of G repeated heads back to H heads, in ascending order and in
 * the array's precision: the tape's fixed-order reduction, so the result must match bit for bit.
 */
function groupSum(d: Float, B: number, T: number, H: number, G: number): Float {
  const out = d instanceof Float32Array ? new Float32Array(B * T * H * K) : new Float64Array(
    B * T * H * K,
  );
  for (let bt = 0; bt < B * T; bt++) {
    for (let h = 0; h < H; h++) {
      for (let c = 0; c < K; c++) {
        let acc = 0;
        for (let i = 0; i < G; i++) {
          acc += d[(bt * H * G + h * G + i) * K + c];
          if (d instanceof Float32Array) acc = Math.fround(acc); // the f32 tape rounds each sum
        }
        out[(bt * H + h) * K + c] = acc;
      }
    }
  }
  return out;
}

async function checkArm(arm: Arm, dtype: ComputeDType, cu?: Int32Array) {
  for (const [H, HV] of [[2, 4], [1, 3], [2, 2]]) {
    const { inputs, ct } = grouped(H, HV, 10 * H + HV, dtype, cu);
    const label = `${arm} ${dtype} H${H} HV${HV}${cu ? " packed" : ""}`;
    const byHand = repeatedByHand(inputs);
    const options = { arm, strict: true };
    const out = await kda(inputs, options), ref = await kda(byHand, options);
    assert.ok(bitsEqual(out.o, ref.o), `o ${label}`);
    assert.ok(bitsEqual(out.ht, ref.ht), `ht ${label}`);
    const g = await kdaVjp(inputs, ct, options), gRef = await kdaVjp(byHand, ct, options);
    for (const name of ["dv", "dg", "dbeta", "dh0"] as const) {
      assert.ok(bitsEqual(g[name], gRef[name]), `${name} ${label}`);
    }
    const { B, T } = inputs, G = HV / H;
    for (const name of ["dq", "dk"] as const) {
      assert.equal(g[name].length, B * T * H * K, `${name} ${label} length`);
      assert.ok(bitsEqual(g[name], groupSum(gRef[name], B, T, H, G)), `${name} ${label} group sum`);
    }
  }
}

Deno.test("kda() and kdaVjp() with HV value heads equal q and k repeated by hand, with dq, dk the group sums, on the ops and cpu arms in f64 and f32", async () => {
  for (const arm of ["ops", "cpu"] as const) {
    for (const dtype of ["f64", "f32"] as const) await checkArm(arm, dtype);
  }
});

Deno.test("grouped value heads combine with a packed batch on the ops and cpu arms", async () => {
  const cu = new Int32Array([0, 5, 22]);
  for (const arm of ["ops", "cpu"] as const) await checkArm(arm, "f64", cu);
});

gpuTest(
  "kda() and kdaVjp() gpu arm with HV value heads equal q and k repeated by hand, with dq, dk the group sums, also packed",
  async () => {
    await checkArm("gpu", "f32");
    await checkArm("gpu", "f32", new Int32Array([0, 5, 22]));
  },
);

Deno.test("kda() and kdaVjp() reject bad grouped head counts and lengths with named errors", async () => {
  const { inputs } = grouped(2, 4, 3, "f64");
  const bad = async (patch: Partial<KdaInputs>, cls: ErrorConstructor, re: RegExp) => {
    await assert.rejects(
      () => kda({ ...inputs, ...patch } as KdaInputs, { arm: "cpu" }),
      (e: unknown) => e instanceof cls && re.test((e as Error).message),
      `${re}`,
    );
  };
  await bad({ HV: 3 }, RangeError, /^inputs\.HV must be a multiple of inputs\.H = 2: got 3$/);
  await bad({ HV: 0 }, RangeError, /^inputs\.HV must be a positive integer: got 0$/);
  await bad({ HV: 2.5 }, RangeError, /^inputs\.HV must be a positive integer: got 2\.5$/);
  await bad(
    { v: new Float64Array(2 * 19 * 2 * V) },
    RangeError,
    /^inputs\.v must have 608 elements \[B, T, HV, V\]: got 304$/,
  );
  await bad(
    { g: new Float64Array(2 * 19 * 2 * K) },
    RangeError,
    /^inputs\.g must have 760 elements \[B, T, HV, K\]: got 380$/,
  );
  await bad(
    { beta: new Float64Array(2 * 19 * 2) },
    RangeError,
    /^inputs\.beta must have 152 elements \[B, T, HV\]: got 76$/,
  );
  await bad(
    { q: new Float64Array(2 * 19 * 4 * K) },
    RangeError,
    /^inputs\.q must have 380 elements \[B, T, H, K\]: got 760$/,
  );
  await bad(
    { h0: new Float64Array(2 * 2 * K * V) },
    RangeError,
    /^inputs\.h0 must have 160 elements \[B, HV, K, V\]: got 80$/,
  );
  await assert.rejects(
    () => kdaVjp(inputs, { dout: new Float64Array(2 * 19 * 2 * V) }, { arm: "cpu" }),
    (e: unknown) =>
      e instanceof RangeError &&
      /^cotangents\.dout must have 608 elements \[B, T, HV, V\]: got 304$/.test(e.message),
  );
});

gpuTest(
  "a grouped call too large for a binding is refused with the caller's heads, before any upload",
  async () => {
    const limits = (await gpuDiagnostics()).adapter!.limits;
    const maxBinding = Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
    // one query/key head and 16 value heads: g ([B, T, HV, K]) passes the binding limit while q and k
    // are a sixteenth of it; the split set takes grouped heads itself, and its limit check once
    // sized the call by the query heads and let it through to a WebGPU validation error
    const H = 1, HV = 16, K = 64, V = 1;
    const T = Math.ceil(maxBinding / (HV * K * 4)) + 64;
    const dims = { B: 1, T, H, HV, K, V };
    const reason = gpuUnsupportedReason(dims, 64, "split") ?? "";
    assert.match(reason, /over the device's storage binding limit/, reason);
    assert.match(reason, new RegExp(`\\(B=1, T=${T}, H=1, HV=16, K=64, V=1, chunkSize=64`), reason);
    // the same for a packed batch of that length: the check sees the offsets the set walks itself
    const cuSeqlens = Int32Array.of(0, 100, T);
    const packed = gpuUnsupportedReason({ ...dims, cuSeqlens }, 64, "split") ?? "";
    assert.match(packed, /\(a packed batch of 2 sequences, T=\d+ in all, H=1, HV=16/, packed);
    if (maxBinding > 256 * 2 ** 20) return; // a card: the arrays below would take gigabytes
    const z = (n: number) => new Float32Array(n);
    const x = { ...dims, q: z(T * H * K), k: z(T * H * K), v: z(T * HV * V), g: z(T * HV * K) };
    await assert.rejects(
      () => kda({ ...x, beta: z(T * HV) }, { arm: "gpu", kernels: "split", strict: true }),
      (e: unknown) => e instanceof Error && e.message.includes(reason),
    );
  },
);

gpuTest(
  "a refusal of a packed batch with grouped heads on a set that pads and expands names both, in the caller's terms",
  async () => {
    await gpuStatus(); // gpuUnsupportedReason reads a ready device
    const N = 1000;
    const cuSeqlens = Int32Array.from({ length: N + 1 }, (_, i) => i);
    const dims = { B: 1, T: N, H: 1, HV: 2, K: 4, V: 4, cuSeqlens };
    const reason = gpuUnsupportedReason(dims, 64, "fused") ?? "";
    if (reason === "") return; // a card's bindings hold it: nothing to word
    assert.match(
      reason,
      /^the packed batch of 1000 sequences \(T=1000\) runs padded to B=1000, T=1 and the grouped value heads \(H=1, HV=2\) run expanded to H=2 on the kernel set fused, and there /,
      reason,
    );
  },
);
