// Tests of kda/chunk.ts: the chunked forward and the hand-written chunked backward against the
// hand-written recurrence and BPTT of tests/_bptt.ts (itself checked by central differences).

import assert from "node:assert/strict";
import type { ChunkSize, KdaCotangents, KdaGrads, KdaProblem } from "../kda/_types.ts";
import { chunkBackward, chunkForward } from "../kda/chunk.ts";
import { recurrentBackward, recurrentForward } from "./_bptt.ts";
import {
  bitsEqual,
  f32AndF64,
  type KdaShape,
  mulberry32,
  randomCotangents,
  randomKda,
  Worst,
} from "./_fixtures.ts";
import { recurrentKda } from "../kda/cpu/recurrent.ts";
import { Tape, type Tensor } from "../tape/mod.ts";

const CHUNK_SIZES: ChunkSize[] = [16, 32, 64];
const LENGTHS = [1, 5, 16, 17, 33, 100];
const GATES: { name: string; gateMin: number; gateMax: number }[] = [
  { name: "g∈[−5,−4.9]", gateMin: -5, gateMax: -4.9 },
  { name: "g∈[−5,0]", gateMin: -5, gateMax: 0 },
  { name: "g=0", gateMin: 0, gateMax: 0 },
];
const GRAD_NAMES = ["dq", "dk", "dv", "dg", "dbeta", "dh0"] as const;

function chunkGrads(x: KdaProblem, ct: KdaCotangents, chunkSize: ChunkSize): KdaGrads {
  const { states } = chunkForward(x, { chunkSize, saveStates: true });
  assert.ok(states !== undefined);
  return chunkBackward(x, states, ct, { chunkSize });
}

/** Every case of the main grid, with a distinct seed each. */
function* grid(): Generator<{ label: string; x: KdaProblem; chunkSize: ChunkSize; seed: number }> {
  let seed = 1;
  const cases: { shape: KdaShape; lengths: number[]; gates: typeof GATES }[] = [
    { shape: { B: 2, T: 0, H: 2, K: 8, V: 8 }, lengths: LENGTHS, gates: GATES },
    { shape: { B: 2, T: 0, H: 2, K: 12, V: 8 }, lengths: [17, 100], gates: [GATES[1]] },
    { shape: { B: 1, T: 0, H: 2, K: 8, V: 12 }, lengths: [5, 33], gates: [GATES[0], GATES[2]] },
    { shape: { B: 1, T: 0, H: 1, K: 64, V: 64 }, lengths: [100], gates: [GATES[0], GATES[1]] },
  ];
  for (const { shape, lengths, gates } of cases) {
    for (const T of lengths) {
      for (const gate of gates) {
        for (const withH0 of [false, true]) {
          for (const chunkSize of CHUNK_SIZES) {
            const s = { ...shape, T };
            const x = randomKda(s, seed, { ...gate, withH0 });
            const label = `B${s.B} T${T} H${s.H} K${s.K} V${s.V} C${chunkSize} ${gate.name}` +
              (withH0 ? " h0" : "");
            yield { label, x, chunkSize, seed: seed++ };
          }
        }
      }
    }
  }
}

Deno.test("recurrentBackward() in _bptt.ts agrees with central differences of recurrentForward()", () => {
  const x = randomKda({ B: 1, T: 5, H: 2, K: 3, V: 4 }, 7, { gateMin: -1, withH0: true });
  const ct = randomCotangents(x, 8, true);
  const loss = (y: KdaProblem): number => {
    const { o, ht } = recurrentForward(y);
    let acc = 0;
    for (let i = 0; i < o.length; i++) acc += ct.dout[i] * o[i];
    for (let i = 0; i < ht.length; i++) acc += ct.dht![i] * ht[i];
    return acc;
  };
  const grads = recurrentBackward(x, ct);
  const L = Math.abs(loss(x));
  const worst = new Worst();
  const inputs = { dq: "q", dk: "k", dv: "v", dg: "g", dbeta: "beta", dh0: "h0" } as const;
  for (const name of GRAD_NAMES) {
    const param = x[inputs[name]] as Float64Array;
    const analytic = grads[name];
    let gmax = 0;
    for (const v of analytic) gmax = Math.max(gmax, Math.abs(v));
    // Step that balances truncation (h²) against rounding (eps·|L|/h), docs/kda.md 4.
    const step = Math.cbrt((3 * Number.EPSILON * Math.max(L, 1e-3)) / Math.max(gmax, 1e-3));
    const numeric = new Float64Array(param.length);
    for (let i = 0; i < param.length; i++) {
      const saved = param[i];
      param[i] = saved + step;
      const up = loss(x);
      param[i] = saved - step;
      const down = loss(x);
      param[i] = saved;
      numeric[i] = (up - down) / (2 * step);
    }
    worst.check(`${name} (h=${step.toExponential(1)})`, analytic, numeric, 1e-7);
  }
  worst.report("BPTT vs central differences");
});

Deno.test("chunkForward() matches the recurrence for ragged T, every chunk size, gates at −5 and 0", () => {
  const worstO = new Worst(), worstHt = new Worst();
  for (const { label, x, chunkSize } of grid()) {
    const ref = recurrentForward(x);
    const { o, ht, states } = chunkForward(x, { chunkSize });
    assert.equal(states, undefined);
    assert.ok(o instanceof Float64Array && ht instanceof Float64Array);
    worstO.check(`o ${label}`, o, ref.o, 1e-12);
    worstHt.check(`ht ${label}`, ht, ref.ht, 1e-12);
  }
  worstO.report("o");
  worstHt.report("ht");
});

Deno.test("chunkForward() saves exactly the recurrence's state at every chunk start", () => {
  const worst = new Worst();
  for (const chunkSize of CHUNK_SIZES) {
    const x = randomKda({ B: 2, T: 70, H: 2, K: 8, V: 12 }, 11, { gateMin: -5, withH0: true });
    const { states } = chunkForward(x, { chunkSize, saveStates: true });
    assert.ok(states !== undefined);
    const { B, T, H, K, V } = x;
    const NC = Math.ceil(T / chunkSize), KV = K * V;
    assert.equal(states.length, B * H * NC * KV);
    const ref = recurrentForward(x).states; // [B,H,T,K,V], the state before token t
    const expected = new Float64Array(states.length);
    for (let bh = 0; bh < B * H; bh++) {
      for (let c = 0; c < NC; c++) {
        const t = c * chunkSize;
        expected.set(ref.subarray((bh * T + t) * KV, (bh * T + t + 1) * KV), (bh * NC + c) * KV);
      }
    }
    worst.check(`states C${chunkSize}`, states, expected, 1e-12);
  }
  worst.report("states");
});

Deno.test("chunkBackward() matches hand-written BPTT for ragged T at every chunk size, with and without dht", () => {
  const worst = new Worst();
  for (const { label, x, chunkSize, seed } of grid()) {
    for (const withDht of [true, false]) {
      const ct = randomCotangents(x, 1000 + seed, withDht);
      const ref = recurrentBackward(x, ct);
      const grads = chunkGrads(x, ct, chunkSize);
      for (const name of GRAD_NAMES) {
        assert.ok(grads[name] instanceof Float64Array);
        worst.check(`${name} ${label}${withDht ? " dht" : ""}`, grads[name], ref[name], 1e-10);
      }
    }
  }
  worst.report("gradients");
});

Deno.test("chunkForward() and chunkBackward() are bit-identical from call to call", () => {
  const x = randomKda({ B: 2, T: 75, H: 2, K: 16, V: 8 }, 21, { gateMin: -5, withH0: true });
  const ct = randomCotangents(x, 22, true);
  for (const chunkSize of CHUNK_SIZES) {
    const first = chunkForward(x, { chunkSize, saveStates: true });
    const second = chunkForward(x, { chunkSize, saveStates: true });
    assert.ok(bitsEqual(first.o, second.o), `o differs at C${chunkSize}`);
    assert.ok(bitsEqual(first.ht, second.ht), `ht differs at C${chunkSize}`);
    assert.ok(bitsEqual(first.states!, second.states!), `states differ at C${chunkSize}`);
    const g1 = chunkBackward(x, first.states!, ct, { chunkSize });
    const g2 = chunkBackward(x, second.states!, ct, { chunkSize });
    for (const name of GRAD_NAMES) {
      assert.ok(bitsEqual(g1[name], g2[name]), `${name} differs at C${chunkSize}`);
    }
  }
});

Deno.test("Float32Array inputs give Float32Array outputs that match f64 on the same values", () => {
  const worst = new Worst();
  for (const chunkSize of CHUNK_SIZES) {
    const { x32, x64, ct32, ct64 } = f32AndF64({ B: 2, T: 77, H: 2, K: 16, V: 12 }, 31);
    const f32 = chunkForward(x32, { chunkSize, saveStates: true });
    const f64 = chunkForward(x64, { chunkSize, saveStates: true });
    assert.ok(f32.o instanceof Float32Array && f32.ht instanceof Float32Array);
    assert.ok(f32.states instanceof Float32Array);
    worst.check(`o C${chunkSize}`, f32.o, f64.o, 1e-6);
    worst.check(`ht C${chunkSize}`, f32.ht, f64.ht, 1e-6);
    const g32 = chunkBackward(x32, f32.states, ct32, { chunkSize });
    const g64 = chunkBackward(x64, f64.states!, ct64, { chunkSize });
    for (const name of GRAD_NAMES) {
      assert.ok(g32[name] instanceof Float32Array, `${name} is not a Float32Array`);
      worst.check(`${name} C${chunkSize}`, g32[name], g64[name], 1e-6);
    }
  }
  worst.report("f32 vs f64");
});

Deno.test("chunkForward() and chunkBackward() assert their contract with an internal error, since callers validate", () => {
  const x = randomKda({ B: 1, T: 40, H: 2, K: 4, V: 4 }, 41, { withH0: true });
  const ct = randomCotangents(x, 42, true);
  const { states } = chunkForward(x, { chunkSize: 16, saveStates: true });
  const bad = 20 as unknown as ChunkSize;
  const internal = { name: "Error", message: /^internal: / };
  assert.throws(() => chunkForward(x, { chunkSize: bad }), internal);
  assert.throws(() => chunkBackward(x, states!, ct, { chunkSize: bad }), internal);
  assert.throws(
    () => chunkForward({ ...x, q: new Float64Array(319) }, { chunkSize: 16 }),
    internal,
  );
  assert.throws(
    () => chunkForward({ ...x, h0: new Float64Array(31) }, { chunkSize: 16 }),
    internal,
  );
  assert.throws(() => chunkBackward(x, states!, ct, { chunkSize: 32 }), internal);
  assert.throws(
    () => chunkBackward(x, states!, { dout: new Float64Array(3) }, { chunkSize: 16 }),
    internal,
  );
});

// Extreme gates (issue 8, defects 3 and 4): a gate sum formed once and then differenced,
// G_r − G_s, loses every small gate after a huge one and gives −Inf − (−Inf) = NaN once it
// overflows. The recurrence multiplies e^{g_t} token by token and has neither problem.

/** A problem with every field filled from explicit per-token gates (K channels share a gate row). */
function withGates(x: KdaProblem, gate: (t: number, d: number) => number): KdaProblem {
  const { B, T, H, K } = x;
  const g = new Float64Array(B * T * H * K);
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      for (let h = 0; h < H; h++) {
        for (let d = 0; d < K; d++) g[((b * T + t) * H + h) * K + d] = gate(t, d + h * K + b * 7);
      }
    }
  }
  return { ...x, g };
}

Deno.test("chunkForward() agrees with the recurrence when one gate is −1e20 among small ones", () => {
  // The case: T = 3, K = V = 1, g = [−1e20, −0.5, −0.5]; ops gives o ≈ [0.5, 1.1516, 1.8493].
  const tiny: KdaProblem = {
    B: 1,
    T: 3,
    H: 1,
    K: 1,
    V: 1,
    scale: 1,
    q: Float64Array.of(1, 1, 1),
    k: Float64Array.of(1, 1, 1),
    v: Float64Array.of(1, 2, 3),
    g: Float64Array.of(-1e20, -0.5, -0.5),
    beta: Float64Array.of(0.5, 0.5, 0.5),
  };
  const worst = new Worst();
  for (const chunkSize of CHUNK_SIZES) {
    for (const x of [tiny, { ...tiny, g: Float64Array.of(-1e12, -0.5, -0.5) }]) {
      const ref = recurrentForward(x);
      const got = chunkForward(x, { chunkSize });
      worst.check(`o g0=${x.g[0]} C${chunkSize}`, got.o, ref.o, 1e-12);
      worst.check(`ht g0=${x.g[0]} C${chunkSize}`, got.ht, ref.ht, 1e-12);
      // The same in f32: the defect lived in the f64 arithmetic, so f32 inputs had it too.
      const x32 = { ...x, g: Float32Array.from(x.g), q: Float32Array.from(x.q) };
      const x32all = { ...x32, k: Float32Array.from(x.k), v: Float32Array.from(x.v) };
      const got32 = chunkForward({ ...x32all, beta: Float32Array.from(x.beta) }, { chunkSize });
      worst.check(`o f32 g0=${x.g[0]} C${chunkSize}`, got32.o, ref.o, 1e-6);
    }
  }
  worst.report("one huge gate");
  const { o } = chunkForward(tiny, { chunkSize: 16 });
  const expected = [0.5, 1.1516, 1.8493];
  for (let t = 0; t < 3; t++) assert.ok(Math.abs(o[t] - expected[t]) < 1e-4, `o[${t}] = ${o[t]}`);
});

/** Checks the chunked forward (to `tolForward`) and gradients (to 1e-10) against _bptt.ts. */
function checkAgainstRecurrence(
  worst: Worst,
  label: string,
  x: KdaProblem,
  ct: KdaCotangents,
  chunkSize: ChunkSize,
  tolForward: number,
): void {
  const ref = recurrentForward(x);
  const got = chunkForward(x, { chunkSize });
  worst.check(`o ${label}`, got.o, ref.o, tolForward);
  worst.check(`ht ${label}`, got.ht, ref.ht, tolForward);
  const refGrads = recurrentBackward(x, ct);
  const grads = chunkGrads(x, ct, chunkSize);
  for (const name of GRAD_NAMES) {
    worst.check(`${name} ${label}`, grads[name], refGrads[name], 1e-10);
  }
}

Deno.test("chunkForward() and chunkBackward() stay finite at g = −1e308 and −1.2e307 in f64", () => {
  const worst = new Worst();
  for (const huge of [-1e308, -1.2e307]) {
    for (const chunkSize of CHUNK_SIZES) {
      const base = randomKda({ B: 1, T: 40, H: 1, K: 3, V: 2 }, 51, { withH0: true });
      const x = withGates(base, (t) => (t % 3 === 0 ? huge : -0.25));
      const ct = randomCotangents(x, 52, true);
      checkAgainstRecurrence(worst, `g=${huge} C${chunkSize}`, x, ct, chunkSize, 1e-12);
    }
  }
  worst.report("huge gates");
});

Deno.test("chunkForward() and chunkBackward() agree with the recurrence in f64 for gates mixed per token from {0, −1e-30, −5, −1e4, −1e20, −1e308}", () => {
  const GATE_SET = [0, -1e-30, -5, -1e4, -1e20, -1e308];
  const worst = new Worst();
  let seed = 600;
  for (const T of [1, 15, 16, 17, 67]) {
    for (const chunkSize of CHUNK_SIZES) {
      for (const mix of ["per token", "per channel"] as const) {
        seed++;
        const rand = mulberry32(seed);
        // Mostly small gates, so that state survives across a huge one and the test has signal.
        const weights = [0.3, 0.2, 0.3, 0.08, 0.07, 0.05];
        const draw = () => {
          let u = rand(), i = 0;
          while (i < weights.length - 1 && u >= weights[i]) u -= weights[i++];
          return GATE_SET[i];
        };
        const rows = Array.from({ length: 2 * T }, () => draw());
        const cells = new Map<string, number>();
        const base = randomKda({ B: 2, T, H: 2, K: 4, V: 3 }, seed, { withH0: seed % 2 === 0 });
        const x = withGates(base, (t, d) => {
          if (mix === "per token") return rows[t];
          const key = `${t},${d}`;
          if (!cells.has(key)) cells.set(key, draw());
          return cells.get(key)!;
        });
        const ct = randomCotangents(x, seed + 5000, seed % 3 !== 0);
        checkAgainstRecurrence(worst, `T${T} C${chunkSize} ${mix}`, x, ct, chunkSize, 1e-10);
      }
    }
  }
  worst.report("mixed extreme gates");
});

Deno.test("chunkForward() and chunkBackward() agree with the ops arm's tape recurrence for extreme gates, forward and gradients", async () => {
  const GATE_SET = [0, -1e-30, -5, -1e4, -1e20, -1e308];
  const worst = new Worst();
  for (const chunkSize of CHUNK_SIZES) {
    const rand = mulberry32(chunkSize);
    const base = randomKda({ B: 1, T: 37, H: 2, K: 3, V: 2 }, 700 + chunkSize, { withH0: true });
    const x = withGates(base, () => GATE_SET[Math.floor(rand() * rand() * GATE_SET.length)]);
    const ct = randomCotangents(x, 800 + chunkSize, true);
    const tape = new Tape("f64");
    const { B, T, H, K, V } = x;
    const t: Record<string, Tensor> = {
      q: tape.variable(x.q, [B, T, H, K]),
      k: tape.variable(x.k, [B, T, H, K]),
      v: tape.variable(x.v, [B, T, H, V]),
      g: tape.variable(x.g, [B, T, H, K]),
      beta: tape.variable(x.beta, [B, T, H]),
      h0: tape.variable(x.h0!, [B, H, K, V]),
    };
    const ops = recurrentKda(
      { q: t.q, k: t.k, v: t.v, g: t.g, beta: t.beta, h0: t.h0 },
      x,
      x.scale,
    );
    const opsGrads = await tape.backwardFrom([
      { output: ops.o, cotangent: ct.dout },
      { output: ops.ht, cotangent: ct.dht! },
    ]);
    const got = chunkForward(x, { chunkSize });
    worst.check(`o C${chunkSize}`, got.o, ops.o.data, 1e-10);
    worst.check(`ht C${chunkSize}`, got.ht, ops.ht.data, 1e-10);
    const grads = chunkGrads(x, ct, chunkSize);
    const inputOf = { dq: "q", dk: "k", dv: "v", dg: "g", dbeta: "beta", dh0: "h0" } as const;
    for (const name of GRAD_NAMES) {
      worst.check(`${name} C${chunkSize}`, grads[name], opsGrads.get(t[inputOf[name]])!, 1e-10);
    }
  }
  worst.report("cpu vs ops, extreme gates");
});
