// The checks' public helpers fail on what they cannot judge, instead of passing it: a NaN central
// difference, arrays without bytes of their own, a direction shorter than the gradient, a dtype or a
// step they do not know, an option they do not take.

import assert from "node:assert/strict";
import {
  derivedStep,
  direction,
  directionalRow,
  epsilonOf,
  fdRow,
  probeIndices,
  proveGradients,
  sameBits,
} from "../checks/mod.ts";
import { add, constant, sum, type Tensor } from "../tape/mod.ts";

Deno.test("a central difference that is NaN at one step fails the row, whichever step it is", async () => {
  // the loss is exact (2·d) at one step and NaN at the other: the agreeing step must not hide it
  for (const nanAtH of [true, false]) {
    const row = await fdRow("w", [1, 1], [2, 2], (_i, d) => {
      const big = Math.abs(d) > 1e-6;
      return Promise.resolve(big === nanAtH ? NaN : 2 * d);
    }, { dtype: "f64", lossScale: 1, tol: 1e-6 });
    assert.equal(row.ok, false, `NaN at ${nanAtH ? "h" : "h/10"}`);
    assert.ok(Number.isNaN(row.rel), `NaN at ${nanAtH ? "h" : "h/10"}: rel ${row.rel}`);
  }
  // NaN at the step that is not judged (the derivative is below its floor there) fails as well
  const calls: number[] = [];
  const unjudged = await fdRow("w", [10, 10], [2, 2], (_i, d) => {
    calls.push(d);
    return Promise.resolve(calls.length <= 2 ? 2 * d : NaN);
  }, { dtype: "f64", lossScale: 2.4e13, tol: 1e-6, probes: 1 });
  assert.equal(unjudged.ok, false);
  assert.ok(Number.isNaN(unjudged.probes[0].rel), JSON.stringify(unjudged.probes[0]));
  // and the same loss without NaN passes: the row can hold
  const good = await fdRow("w", [1, 1], [2, 2], (_i, d) => Promise.resolve(2 * d), {
    dtype: "f64",
    lossScale: 1,
    tol: 1e-6,
  });
  assert.equal(good.ok, true);
});

Deno.test("sameBits() compares typed arrays' bytes and refuses anything else", () => {
  assert.equal(sameBits(Float64Array.of(1, 2), Float64Array.of(1, 2)), true);
  assert.equal(sameBits(Float64Array.of(1, 2), Float64Array.of(1, 3)), false);
  assert.equal(sameBits(Float64Array.of(0), Float64Array.of(-0)), false);
  assert.equal(sameBits(Float32Array.of(1), Float64Array.of(1)), false);
  assert.throws(
    () => sameBits([1, 2] as unknown as Float64Array, [3, 4] as unknown as Float64Array),
    { name: "TypeError", message: "a must be a Float64Array or Float32Array: got Array" },
  );
  assert.throws(
    () => sameBits(Float64Array.of(1), { length: 1 } as unknown as Float64Array),
    { name: "TypeError", message: "b must be a Float64Array or Float32Array: got Object" },
  );
});

Deno.test("directionalRow() refuses a direction of another length than the gradient", () => {
  assert.throws(() => directionalRow("x", 1, [1, 2, 3], [1], 1e-10), {
    name: "RangeError",
    message: "grad and u must have equal lengths: got 3 and 1",
  });
  assert.equal(directionalRow("x", 14, [1, 2, 3], [1, 2, 3], 1e-10).ok, true);
  assert.equal(directionalRow("x", NaN, [1, 2, 3], [1, 2, 3], 1e-10).ok, false);
});

Deno.test("epsilonOf(), probeIndices(), derivedStep() and direction() name a bad argument", () => {
  assert.equal(epsilonOf("f32"), 2 ** -23);
  assert.throws(() => epsilonOf("F64" as "f64"), {
    name: "TypeError",
    message: 'dtype must be "f64" or "f32": got "F64"',
  });
  assert.throws(() => probeIndices([]), {
    name: "RangeError",
    message: "grad must hold at least one entry: got length 0",
  });
  assert.throws(() => derivedStep(Number.EPSILON, 1, 1, NaN), {
    name: "RangeError",
    message: "paramRms must be a finite number ≥ 0: got NaN",
  });
  assert.throws(() => derivedStep(Number.EPSILON, 1, -1, 1), {
    name: "RangeError",
    message: "gradMax must be a positive finite number: got -1",
  });
  assert.throws(() => direction(-1, 0), {
    name: "RangeError",
    message: "n must be a non-negative integer: got -1",
  });
  assert.throws(() => direction(2.5, 0), RangeError);
  assert.throws(() => direction(3, 0.5), {
    name: "RangeError",
    message: "seed must be an integer: got 0.5",
  });
  assert.equal(direction(3, 7).length, 3);
});

Deno.test("proveGradients() refuses an option it does not take and names a missing subject", async () => {
  const subject = {
    parameters: new Map([["w", { data: Float64Array.of(1), shape: [1] }]]),
    loss: () => {
      throw new Error("not reached");
    },
  };
  await assert.rejects(
    () => proveGradients(subject, { fdtol: 1e9 } as unknown as { fdTol: number }),
    { name: "TypeError", message: /^options\.fdtol is not a known field: .*did you mean fdTol\?/ },
  );
  const nanLoss = {
    parameters: new Map([["w", { data: Float64Array.of(1, 2), shape: [2] }]]),
    loss: (p: Map<string, Tensor>) => add(sum(p.get("w")!, 0), constant("f64", [NaN], [])),
  };
  await assert.rejects(() => proveGradients(nanLoss), {
    name: "RangeError",
    message: "subject.loss must return a finite value: got NaN",
  });
  await assert.rejects(() => proveGradients(subject, { seed: 0.5 }), {
    name: "RangeError",
    message: "options.seed must be an integer: got 0.5",
  });
  await assert.rejects(
    () => proveGradients(null as unknown as typeof subject),
    {
      name: "TypeError",
      message: "subject must have parameters (a Map) and loss (a function): got null",
    },
  );
});
