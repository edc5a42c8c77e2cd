// Tests of kda/chunk.ts: the chunked forward and the hand-written chunked backward against the
// hand-written recurrence and BPTT of tests/_bptt.ts (itself checked by central differences).

import assert from "node:assert/strict";
import type { ChunkSize, RawCotangents, RawGrads, RawKda } from "../kda/_types.ts";
import { chunkBackward, chunkForward } from "../kda/chunk.ts";
import {
  type KdaShape,
  mulberry32,
  randomKda,
  recurrentBackward,
  recurrentForward,
  toF64,
} from "./_bptt.ts";
import { bitsEqual, Worst } from "./_compare.ts";

const CHUNK_SIZES: ChunkSize[] = [16, 32, 64];
const LENGTHS = [1, 5, 16, 17, 33, 100];
const GATES: { name: string; gateMin: number; gateMax: number }[] = [
  { name: "g∈[−5,−4.9]", gateMin: -5, gateMax: -4.9 },
  { name: "g∈[−5,0]", gateMin: -5, gateMax: 0 },
  { name: "g=0", gateMin: 0, gateMax: 0 },
];
const GRAD_NAMES = ["dq", "dk", "dv", "dg", "dbeta", "dh0"] as const;

function randomArray(n: number, seed: number): Float64Array {
  const rand = mulberry32(seed);
  const a = new Float64Array(n);
  for (let i = 0; i < n; i++) a[i] = 2 * rand() - 1;
  return a;
}

function randomCotangents(x: RawKda, seed: number, withDht: boolean): RawCotangents {
  const { B, T, H, K, V } = x;
  const ct: RawCotangents = { dout: randomArray(B * T * H * V, seed) };
  if (withDht) ct.dht = randomArray(B * H * K * V, seed + 1);
  return ct;
}

function chunkGrads(x: RawKda, ct: RawCotangents, chunkSize: ChunkSize): RawGrads {
  const { states } = chunkForward(x, { chunkSize, saveStates: true });
  assert.ok(states !== undefined);
  return chunkBackward(x, states, ct, { chunkSize });
}

/** Every case of the main grid, with a distinct seed each. */
function* grid(): Generator<{ label: string; x: RawKda; chunkSize: ChunkSize; seed: number }> {
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
  const loss = (y: RawKda): number => {
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
    // Step that balances truncation (h²) against rounding (eps·|L|/h), DESIGN.md 4.
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
    const x32 = randomKda({ B: 2, T: 77, H: 2, K: 16, V: 12 }, 31, {
      gateMin: -5,
      withH0: true,
      dtype: "f32",
    });
    const x64 = toF64(x32);
    const ct64 = randomCotangents(x64, 32, true);
    const ct32: RawCotangents = {
      dout: Float32Array.from(ct64.dout),
      dht: Float32Array.from(ct64.dht!),
    };
    ct64.dout = Float64Array.from(ct32.dout);
    ct64.dht = Float64Array.from(ct32.dht!);
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

Deno.test("chunkForward() and chunkBackward() reject a bad chunkSize or array length with a RangeError naming it", () => {
  const x = randomKda({ B: 1, T: 40, H: 2, K: 4, V: 4 }, 41, { withH0: true });
  const ct = randomCotangents(x, 42, true);
  const { states } = chunkForward(x, { chunkSize: 16, saveStates: true });
  const bad = 20 as unknown as ChunkSize;
  assert.throws(() => chunkForward(x, { chunkSize: bad }), {
    name: "RangeError",
    message: /chunkSize.*16, 32 or 64.*20/,
  });
  assert.throws(() => chunkBackward(x, states!, ct, { chunkSize: bad }), {
    name: "RangeError",
    message: /chunkSize/,
  });
  assert.throws(() => chunkForward({ ...x, q: new Float64Array(319) }, { chunkSize: 16 }), {
    name: "RangeError",
    message: /\bq\b.*320.*319/,
  });
  assert.throws(() => chunkForward({ ...x, beta: new Float64Array(81) }, { chunkSize: 16 }), {
    name: "RangeError",
    message: /beta.*80.*81/,
  });
  assert.throws(() => chunkForward({ ...x, h0: new Float64Array(31) }, { chunkSize: 16 }), {
    name: "RangeError",
    message: /h0.*32.*31/,
  });
  assert.throws(() => chunkBackward(x, states!, ct, { chunkSize: 32 }), {
    name: "RangeError",
    message: /states/,
  });
  assert.throws(
    () => chunkBackward(x, states!, { dout: new Float64Array(3) }, { chunkSize: 16 }),
    { name: "RangeError", message: /dout/ },
  );
  assert.throws(
    () => chunkBackward(x, states!, { ...ct, dht: new Float64Array(3) }, { chunkSize: 16 }),
    { name: "RangeError", message: /dht/ },
  );
});
