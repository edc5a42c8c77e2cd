// `deno run --allow-env --allow-read bench/fingerprint.ts`: a fingerprint of the gpu arm's bits,
// the first 8 bytes of the SHA-256 of o, ht and every gradient over six shapes (chunk sizes 16 to
// 64, h0 and dht, K = V = 128, grouped value heads, a packed batch) and of the layer's output and
// gradients. Run it in two checkouts to show that a change of the kernels keeps every bit (the
// kernel set is the default, or KDA_GPU_KERNELS). Prints JSON.

import { kda, KdaModule, kdaVjp } from "../mod.ts";
import type { ChunkSize, KdaProblem } from "../kda/_types.ts";
import { randomKda } from "../tests/_fixtures.ts";

async function hash(a: ArrayLike<number>): Promise<string> {
  const bytes = new Uint8Array(Float32Array.from(a).buffer);
  const d = await crypto.subtle.digest("SHA-256", bytes);
  return Array.from(new Uint8Array(d).slice(0, 8), (b) => b.toString(16).padStart(2, "0")).join("");
}
const out: Record<string, string> = {};
type Case = {
  B: number;
  T: number;
  H: number;
  K: number;
  V: number;
  HV?: number;
  h0?: boolean;
  cu?: number[];
};
const cases: [string, Case, { chunkSize: ChunkSize }][] = [
  ["plain C64", { B: 2, T: 100, H: 2, K: 32, V: 16 }, { chunkSize: 64 }],
  ["h0 dht C16", { B: 1, T: 70, H: 3, K: 16, V: 32, h0: true }, { chunkSize: 16 }],
  ["C32 K=V=64", { B: 1, T: 90, H: 1, K: 64, V: 64, h0: true }, { chunkSize: 32 }],
  ["big C64", { B: 2, T: 300, H: 4, K: 128, V: 128, h0: true }, { chunkSize: 64 }],
  ["HV", { B: 1, T: 40, H: 1, HV: 2, K: 16, V: 16, h0: true }, { chunkSize: 16 }],
  ["packed", { B: 1, T: 60, H: 2, K: 16, V: 16, h0: true, cu: [0, 13, 47, 60] }, { chunkSize: 16 }],
];
for (const [name, s, opt] of cases) {
  const x = randomKda(s, 7, { withH0: s.h0, dtype: "f32" }) as KdaProblem<Float32Array>;
  if (s.HV) {
    const y = randomKda({ ...s, H: s.HV }, 8, { withH0: s.h0, dtype: "f32" });
    Object.assign(x, { HV: s.HV, v: y.v, g: y.g, beta: y.beta, h0: y.h0 });
  }
  if (s.cu) {
    x.cuSeqlens = new Int32Array(s.cu);
    const seqs = { ...s, B: s.cu.length - 1, T: 1 };
    x.h0 = randomKda(seqs, 9, { withH0: true, dtype: "f32" }).h0 as Float32Array;
  }
  const { o, ht } = await kda(x, { arm: "gpu", quiet: true, ...opt }) as {
    o: Float32Array;
    ht: Float32Array;
  };
  out[`${name} o`] = await hash(o);
  out[`${name} ht`] = await hash(ht);
  const dout = o.map((v: number, i: number) => Math.sin(i + v));
  const dht = ht.map((_: number, i: number) => Math.cos(i * 0.3));
  const g = await kdaVjp(x, { dout, dht }, { arm: "gpu", quiet: true, ...opt });
  for (const [k, v] of Object.entries(g)) out[`${name} ${k}`] = await hash(v as Float32Array);
}
const layer = new KdaModule({ shortConv: true }, { dtype: "f32" });
const xl = new Float32Array(2 * 64 * 64).map((_, i) => Math.sin(i * 0.37));
const { y, grads } = await layer.vjp(xl, [2, 64], xl, { arm: "gpu", quiet: true });
out["layer y"] = await hash(y);
for (const [k, v] of grads) out[`layer ${k}`] = await hash(v as Float32Array);
console.log(JSON.stringify(out, null, 1));
