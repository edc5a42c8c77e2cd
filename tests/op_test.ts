// Tests of the public raw op (kda/op.ts through the seam): the `ops` arm (the tape differentiating
// the recurrence) against the hand-written f64 recurrence and BPTT of tests/_bptt.ts, the `cpu` arm
// (chunked custom node) against the `ops` arm, dtype preservation, and input validation.

import assert from "node:assert/strict";
import { kda, type KdaCotangents, type KdaInputs, type KdaOptions, kdaVjp } from "../mod.ts";
import { resetSeamCounts, seamCounts } from "../mod.ts";
import type { ChunkSize, KdaProblem } from "../kda/_types.ts";
import { recurrentBackward, recurrentForward } from "./_bptt.ts";
import * as fixtures from "./_fixtures.ts";
import type { KdaShape } from "./_fixtures.ts";

const { f32AndF64, mulberry32, randomCotangents, randomKda, Worst } = fixtures;

import { GRAD_NAMES } from "../kda/_types.ts";

/** Gate modes: uniform in [−5, 0], exactly 0, exactly −5, and a random mix of −5 and 0. */
type GateMode = "[−5,0]" | "0" | "−5" | "{−5,0}";

function withGates(x: KdaProblem, mode: GateMode, seed: number): KdaProblem {
  if (mode === "[−5,0]") return x;
  const g = new Float64Array(x.g.length);
  const rand = mulberry32(seed);
  for (let i = 0; i < g.length; i++) {
    g[i] = mode === "0" ? 0 : mode === "−5" ? -5 : rand() < 0.5 ? -5 : 0;
  }
  return { ...x, g };
}

function draw(shape: KdaShape, seed: number, mode: GateMode, withH0: boolean): KdaProblem {
  const x = randomKda(shape, seed, { gateMin: mode === "0" ? 0 : -5, gateMax: 0, withH0 });
  return withGates(x, mode, seed + 7919);
}

Deno.test("kda() and kdaVjp() ops arm match the hand-written recurrence (1e-12) and BPTT (1e-10) for T 1/7/33, h0, dht, gates in [−5,0] and 0, K≠V", async () => {
  const worstFwd = new Worst(), worstBwd = new Worst();
  let seed = 100;
  let cases = 0;
  for (const T of [1, 7, 33]) {
    for (const mode of ["[−5,0]", "0"] as const) {
      for (const withH0 of [false, true]) {
        for (const withDht of [false, true]) {
          seed += 10;
          const shape = { B: 2, T, H: 2, K: 5, V: 3 };
          const x = draw(shape, seed, mode, withH0);
          const label = `T${T} g${mode}${withH0 ? " h0" : ""}${withDht ? " dht" : ""}`;
          const ref = recurrentForward(x);
          const out = await kda(x, { arm: "ops" });
          worstFwd.check(`o ${label}`, out.o, ref.o, 1e-12);
          worstFwd.check(`ht ${label}`, out.ht, ref.ht, 1e-12);
          const ct = randomCotangents(x, seed + 1, withDht);
          const refGrads = recurrentBackward(x, ct);
          const grads = await kdaVjp(x, ct, { arm: "ops" });
          for (const name of GRAD_NAMES) {
            assert.ok(grads[name] instanceof Float64Array, `${name} ${label} is not f64`);
            worstBwd.check(`${name} ${label}`, grads[name], refGrads[name], 1e-10);
          }
          cases++;
        }
      }
    }
  }
  assert.equal(cases, 24);
  worstFwd.report("ops forward vs recurrentForward");
  worstBwd.report("ops gradients vs recurrentBackward");
});

Deno.test("kda() and kdaVjp() cpu arm match the ops arm (outputs 1e-12, every gradient 1e-10) for ragged T 1/17/50, chunk sizes 16/32/64, gates at −5 and 0, with and without h0", async () => {
  const worstFwd = new Worst(), worstBwd = new Worst();
  let seed = 1000;
  for (const T of [1, 17, 50]) {
    for (const chunkSize of [16, 32, 64] as ChunkSize[]) {
      for (const mode of ["−5", "0", "{−5,0}", "[−5,0]"] as const) {
        for (const withH0 of [false, true]) {
          seed += 10;
          const shape = { B: 2, T, H: 2, K: 6, V: 4 };
          const x = draw(shape, seed, mode, withH0);
          const withDht = seed % 20 === 0; // alternate dht across the grid
          const label = `T${T} C${chunkSize} g${mode}${withH0 ? " h0" : ""}${
            withDht ? " dht" : ""
          }`;
          const cpuOpts: KdaOptions = { arm: "cpu", chunkSize, strict: true };
          const opsOpts: KdaOptions = { arm: "ops", chunkSize, strict: true };
          resetSeamCounts();
          const cpu = await kda(x, cpuOpts);
          const ops = await kda(x, opsOpts);
          worstFwd.check(`o ${label}`, cpu.o, ops.o, 1e-12);
          worstFwd.check(`ht ${label}`, cpu.ht, ops.ht, 1e-12);
          const ct = randomCotangents(x, seed + 1, withDht);
          const gCpu = await kdaVjp(x, ct, cpuOpts);
          const gOps = await kdaVjp(x, ct, opsOpts);
          for (const name of GRAD_NAMES) {
            worstBwd.check(`${name} ${label}`, gCpu[name], gOps[name], 1e-10);
          }
          // The comparison really pitted the chunked custom node against the tape's recurrence.
          const c = seamCounts();
          assert.equal(c.declined, 0, `${label}: a call was declined`);
          assert.equal(c.fusedFwd, 2, `${label}: fusedFwd`);
          assert.equal(c.fusedBwd, 1, `${label}: fusedBwd`);
          assert.equal(c.opsPath, 2, `${label}: opsPath`);
        }
      }
    }
  }
  worstFwd.report("cpu vs ops outputs");
  worstBwd.report("cpu vs ops gradients");
});

Deno.test("kda() and kdaVjp() on Float32Array inputs return Float32Array outputs and gradients on the cpu and ops arms, close to f64", async () => {
  const worst = new Worst();
  const { x32, x64, ct32, ct64 } = f32AndF64({ B: 2, T: 21, H: 2, K: 4, V: 3 }, 77);
  const ref = recurrentForward(x64);
  const refGrads = recurrentBackward(x64, ct64);
  for (const arm of ["cpu", "ops"] as const) {
    const out = await kda(x32, { arm, strict: true });
    assert.ok(out.o instanceof Float32Array, `${arm}: o is ${out.o.constructor.name}`);
    assert.ok(out.ht instanceof Float32Array, `${arm}: ht is ${out.ht.constructor.name}`);
    worst.check(`${arm} o`, out.o, ref.o, 1e-5);
    worst.check(`${arm} ht`, out.ht, ref.ht, 1e-5);
    const grads = await kdaVjp(x32, ct32, { arm, strict: true });
    for (const name of GRAD_NAMES) {
      assert.ok(
        grads[name] instanceof Float32Array,
        `${arm}: ${name} is ${grads[name].constructor.name}`,
      );
      worst.check(`${arm} ${name}`, grads[name], refGrads[name], 1e-4);
    }
    // Also without h0: dh0 still comes back as Float32Array.
    const noH0 = { ...x32, h0: undefined };
    const g2 = await kdaVjp(noH0, { dout: ct32.dout }, { arm, strict: true });
    for (const name of GRAD_NAMES) {
      assert.ok(g2[name] instanceof Float32Array, `${arm} no h0: ${name} is not f32`);
    }
  }
  worst.report("f32 arms vs f64 reference");
});

/** Asserts that `fn` rejects with an instance of `cls` whose message matches `re`. */
async function rejectsWith(
  fn: () => Promise<unknown>,
  cls: ErrorConstructor | RangeErrorConstructor | TypeErrorConstructor,
  re: RegExp,
): Promise<void> {
  await assert.rejects(fn, (e: unknown) => {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${String(e)}`);
    assert.match((e as Error).message, re);
    return true;
  });
}

/** How a message shows a bad value after "got": a string in quotes, so "2" is not read as 2. */
const gotText = (bad: unknown) => typeof bad === "string" ? `"${bad}"` : String(bad);
const escaped = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** A valid f64 problem: B 1, T 3, H 2, K 4, V 5. */
function valid(): KdaInputs & { q: Float64Array } {
  const x = randomKda({ B: 1, T: 3, H: 2, K: 4, V: 5 }, 5, { gateMin: -1, withH0: true });
  return x as KdaInputs & { q: Float64Array };
}

const ARRAY_LENGTHS = {
  q: [24, /\[B, T, H, K\]/],
  k: [24, /\[B, T, H, K\]/],
  v: [30, /\[B, T, H, V\]/],
  g: [24, /\[B, T, H, K\]/],
  beta: [6, /\[B, T, H\]/],
  h0: [40, /\[B, H, K, V\]/],
} as const;

Deno.test("kda() and kdaVjp() reject every kind of bad input with the named TypeError or RangeError", async () => {
  const dout = new Float64Array(30);
  type Run = (inputs: unknown, ...options: unknown[]) => Promise<unknown>;
  // Without an options argument the call gets { arm: "ops" }; with one, exactly that value.
  const opts = (o: unknown[]) => (o.length === 0 ? { arm: "ops" } : o[0]) as KdaOptions;
  const runs: [string, Run][] = [
    ["kda", (i, ...o) => kda(i as KdaInputs, opts(o))],
    ["kdaVjp", (i, ...o) => kdaVjp(i as KdaInputs, { dout }, opts(o))],
  ];
  let checked = 0;
  for (const [fnName, run] of runs) {
    const at = async (what: string, f: () => Promise<void>) => {
      try {
        await f();
        checked++;
      } catch (e) {
        throw new Error(`${fnName}: ${what}: ${(e as Error).message}`);
      }
    };
    // Sanity: the valid problem runs on both explicit arms.
    await run(valid(), { arm: "ops" });
    await run(valid(), { arm: "cpu" });

    // Non-object inputs.
    for (const bad of [null, undefined, 3, "q", true]) {
      await at(`inputs ${String(bad)}`, () => rejectsWith(() => run(bad), TypeError, /inputs/));
    }
    // Dimensions: non-positive, non-integer, non-number.
    for (const dim of ["B", "T", "H", "K", "V"]) {
      for (const bad of [0, -1, 1.5, NaN, Infinity, "2", undefined]) {
        await at(`${dim}=${String(bad)}`, () =>
          rejectsWith(
            () => run({ ...valid(), [dim]: bad }),
            RangeError,
            new RegExp(`inputs\\.${dim} must be a positive integer: got ${escaped(gotText(bad))}$`),
          ));
      }
    }
    // Wrong array type (not a float typed array).
    for (const name of ["q", "k", "v", "g", "beta", "h0"] as const) {
      const n = ARRAY_LENGTHS[name][0];
      for (const bad of [Array.from({ length: n }, () => 0), new Int32Array(n), null, "x"]) {
        await at(`${name} as ${String(bad).slice(0, 8)}`, () =>
          rejectsWith(
            () => run({ ...valid(), [name]: bad }),
            TypeError,
            new RegExp(`inputs\\.${name}\\b`),
          ));
      }
      // Missing (h0 may be absent).
      if (name !== "h0") {
        await at(`${name} missing`, () =>
          rejectsWith(
            () => run({ ...valid(), [name]: undefined }),
            TypeError,
            new RegExp(`inputs\\.${name}\\b`),
          ));
      }
    }
    // Mixed Float32Array / Float64Array: q sets the dtype, any other array of the other type fails.
    for (const name of ["k", "v", "g", "beta", "h0"] as const) {
      const x = valid();
      await at(`mixed ${name}`, () =>
        rejectsWith(
          () => run({ ...x, [name]: Float32Array.from(x[name]!) }),
          TypeError,
          new RegExp(`inputs\\.${name} must be a Float64Array`),
        ));
    }
    {
      const x = valid();
      const x32: Record<string, unknown> = { ...x };
      for (const name of ["q", "k", "v", "g", "beta", "h0"] as const) {
        x32[name] = Float32Array.from(x[name]!);
      }
      x32.k = x.k; // f32 q, f64 k
      await at(
        "mixed f32 q / f64 k",
        () => rejectsWith(() => run(x32), TypeError, /inputs\.k must be a Float32Array/),
      );
    }
    // Wrong lengths, naming the array and the expected length.
    for (const name of ["q", "k", "v", "g", "beta", "h0"] as const) {
      const [n, shapeRe] = ARRAY_LENGTHS[name];
      for (const len of [n - 1, n + 1, 0]) {
        await at(`${name} length ${len}`, () =>
          rejectsWith(
            () => run({ ...valid(), [name]: new Float64Array(len).fill(-0.1) }),
            RangeError,
            new RegExp(`inputs\\.${name} must have ${n} elements ${shapeRe.source}: got ${len}`),
          ));
      }
    }
    // NaN or ±Infinity anywhere in any input.
    for (const name of ["q", "k", "v", "g", "beta", "h0"] as const) {
      for (const bad of [NaN, Infinity, -Infinity]) {
        const x = valid();
        const a = Float64Array.from(x[name]!);
        a[a.length - 1] = bad;
        await at(`${name} with ${bad}`, () =>
          rejectsWith(
            () => run({ ...x, [name]: a }),
            RangeError,
            new RegExp(`inputs\\.${name} must be finite: got ${bad} at index ${a.length - 1}`),
          ));
      }
    }
    // A positive log decay.
    for (const bad of [1e-300, 0.5, 3]) {
      const x = valid();
      const g = Float64Array.from(x.g);
      g[7] = bad;
      await at(
        `g=${bad}`,
        () => rejectsWith(() => run({ ...x, g }), RangeError, /inputs\.g must be <= 0.*at index 7/),
      );
    }
    // Bad scale (null, like undefined, selects the default K^(-1/2) through `??`).
    for (const bad of [NaN, Infinity, -Infinity, "1", {}, 1n]) {
      await at(
        `scale ${String(bad)}`,
        () => rejectsWith(() => run({ ...valid(), scale: bad }), RangeError, /inputs\.scale/),
      );
    }
    // Bad options.
    for (const bad of [8, 0, 24, 128, "16", NaN, null]) {
      await at(`chunkSize ${String(bad)}`, () =>
        rejectsWith(
          () => run(valid(), { arm: "cpu", chunkSize: bad }),
          RangeError,
          new RegExp(`options\\.chunkSize must be 16, 32 or 64: got ${escaped(gotText(bad))}$`),
        ));
    }
    for (const bad of ["GPU", "tape", "", 0, null]) {
      await at(
        `arm ${String(bad)}`,
        () => rejectsWith(() => run(valid(), { arm: bad }), RangeError, /options\.arm/),
      );
    }
    for (const bad of [null, 3, "cpu"]) {
      await at(
        `options ${String(bad)}`,
        () => rejectsWith(() => run(valid(), bad), TypeError, /options must be an object/),
      );
    }
  }

  // Cotangents of kdaVjp.
  const x = valid();
  const ops: KdaOptions = { arm: "ops" };
  const vjpAt = async (what: string, f: () => Promise<void>) => {
    try {
      await f();
      checked++;
    } catch (e) {
      throw new Error(`kdaVjp cotangents: ${what}: ${(e as Error).message}`);
    }
  };
  for (const bad of [null, undefined, 3, "dout"]) {
    await vjpAt(`cotangents ${String(bad)}`, () =>
      rejectsWith(
        () => kdaVjp(x, bad as unknown as KdaCotangents, ops),
        TypeError,
        /cotangents must be an object/,
      ));
  }
  await vjpAt("missing dout", () =>
    rejectsWith(
      () => kdaVjp(x, {} as unknown as KdaCotangents, ops),
      TypeError,
      /cotangents\.dout/,
    ));
  await vjpAt("missing dout with dht", () =>
    rejectsWith(
      () => kdaVjp(x, { dht: new Float64Array(40) } as unknown as KdaCotangents, ops),
      TypeError,
      /cotangents\.dout/,
    ));
  for (const len of [29, 31, 0]) {
    await vjpAt(`dout length ${len}`, () =>
      rejectsWith(
        () => kdaVjp(x, { dout: new Float64Array(len) }, ops),
        RangeError,
        new RegExp(`cotangents\\.dout must have 30 elements \\[B, T, H, V\\]: got ${len}`),
      ));
  }
  for (const len of [39, 41, 0]) {
    await vjpAt(`dht length ${len}`, () =>
      rejectsWith(
        () => kdaVjp(x, { dout, dht: new Float64Array(len) }, ops),
        RangeError,
        new RegExp(`cotangents\\.dht must have 40 elements \\[B, H, K, V\\]: got ${len}`),
      ));
  }
  await vjpAt("f32 dout on f64 inputs", () =>
    rejectsWith(
      () => kdaVjp(x, { dout: new Float32Array(30) }, ops),
      TypeError,
      /cotangents\.dout must be a Float64Array/,
    ));
  await vjpAt("f32 dht on f64 inputs", () =>
    rejectsWith(
      () => kdaVjp(x, { dout, dht: new Float32Array(40) }, ops),
      TypeError,
      /cotangents\.dht must be a Float64Array/,
    ));
  for (const bad of [NaN, Infinity]) {
    const d = new Float64Array(30);
    d[4] = bad;
    await vjpAt(
      `dout with ${bad}`,
      () =>
        rejectsWith(
          () => kdaVjp(x, { dout: d }, ops),
          RangeError,
          /cotangents\.dout must be finite/,
        ),
    );
    const h = new Float64Array(40);
    h[9] = bad;
    await vjpAt(`dht with ${bad}`, () =>
      rejectsWith(
        () => kdaVjp(x, { dout, dht: h }, ops),
        RangeError,
        /cotangents\.dht must be finite/,
      ));
  }
  console.log(`  ${checked} rejections checked`);
});
