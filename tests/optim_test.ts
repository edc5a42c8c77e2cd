// Tests of the optimizers (optim/mod.ts) against steps worked out by hand with PyTorch's update
// equations (torch.optim.SGD with dampening 0, nesterov false; torch.optim.AdamW, amsgrad false),
// and of their named errors for bad hyper-parameters and gradients.

import assert from "node:assert/strict";
import { AdamW, Sgd } from "../optim/mod.ts";
import { Tensor } from "../tape/mod.ts";
import { KdaModule } from "../mod.ts";

function close(actual: ArrayLike<number>, expected: number[], tol: number, what: string): void {
  assert.equal(actual.length, expected.length, what);
  for (let i = 0; i < expected.length; i++) {
    assert.ok(
      Math.abs(actual[i] - expected[i]) <= tol * Math.max(1, Math.abs(expected[i])),
      `${what}[${i}]: ${actual[i]} vs ${expected[i]}`,
    );
  }
}

function twoParams(dtype: "f64" | "f32" = "f64") {
  const A = dtype === "f64" ? Float64Array : Float32Array;
  const w = new Tensor(new A([1, -2]), [2]);
  const b = new Tensor(new A([0.5]), [1]);
  return { w, b, params: new Map([["w", w], ["b", b]]) };
}

Deno.test("sgd with momentum and weight decay matches three hand-computed PyTorch steps", () => {
  const { w, b, params } = twoParams();
  const opt = new Sgd(params, { lr: 0.1, momentum: 0.9, weightDecay: 0.01 });
  const grads = [
    [[0.5, 0.25], [1]],
    [[-1, 0.5], [-2]],
    [[0.2, 0.2], [0]],
  ];
  // w[0]: g = grad + 0.01 p; buf = g (step 1), 0.9 buf + g (after); p -= 0.1 buf
  //   step 1: g = 0.5 + 0.01 = 0.51;                 buf = 0.51;        p = 1 - 0.051 = 0.949
  //   step 2: g = -1 + 0.00949 = -0.99051;           buf = 0.459 - 0.99051 = -0.53151;
  //           p = 0.949 + 0.053151 = 1.002151
  //   step 3: g = 0.2 + 0.01002151 = 0.21002151;    buf = -0.478359 + 0.21002151 = -0.26833749;
  //           p = 1.002151 + 0.026833749 = 1.028984749
  // w[1]:
  //   step 1: g = 0.25 - 0.02 = 0.23;                buf = 0.23;        p = -2.023
  //   step 2: g = 0.5 - 0.02023 = 0.47977;           buf = 0.207 + 0.47977 = 0.68677;
  //           p = -2.023 - 0.068677 = -2.091677
  //   step 3: g = 0.2 - 0.02091677 = 0.17908323;    buf = 0.618093 + 0.17908323 = 0.79717623;
  //           p = -2.091677 - 0.079717623 = -2.171394623
  // b: step 1: g = 1.005, buf = 1.005, p = 0.3995
  //    step 2: g = -2 + 0.003995 = -1.996005, buf = 0.9045 - 1.996005 = -1.091505, p = 0.5086505
  //    step 3: g = 0.005086505, buf = -0.9823545 + 0.005086505 = -0.977267995, p = 0.6063772995
  const expected = [
    [[0.949, -2.023], [0.3995]],
    [[1.002151, -2.091677], [0.5086505]],
    [[1.028984749, -2.171394623], [0.6063772995]],
  ];
  for (let s = 0; s < 3; s++) {
    opt.step(
      new Map([["w", new Float64Array(grads[s][0])], ["b", new Float64Array(grads[s][1])]]),
    );
    close(w.data, expected[s][0], 1e-14, `step ${s + 1} w`);
    close(b.data, expected[s][1], 1e-14, `step ${s + 1} b`);
  }
  assert.equal(opt.steps, 3);
});

Deno.test("sgd without momentum is plain gradient descent and updates f32 parameters", () => {
  const { w, params } = twoParams("f32");
  const opt = new Sgd(params, { lr: 0.5 });
  opt.step(new Map([["w", new Float32Array([1, 1])], ["b", new Float32Array([0])]]));
  // p = p − 0.5 g
  assert.deepEqual([...w.data], [0.5, -2.5]);
  assert.ok(w.data instanceof Float32Array);
});

Deno.test("adamw matches three hand-computed PyTorch steps with bias correction", () => {
  const { w, b, params } = twoParams();
  const [lr, b1, b2, eps, wd] = [0.1, 0.9, 0.999, 1e-8, 0.1];
  const opt = new AdamW(params, { lr, betas: [b1, b2], eps, weightDecay: wd });
  const grads = [[0.5, -0.25, 1], [-1, 0.5, 0], [0.3, 0.3, -3]];
  // Step 1 of w[0] by hand: p = 1·(1 − 0.01) = 0.99; m = 0.1·0.5 = 0.05; v = 0.001·0.25 = 2.5e-4;
  // step size lr/(1 − 0.9) = 1; denom = √2.5e-4/√0.001 + 1e-8 = 0.5 + 1e-8;
  // p = 0.99 − 0.05/0.50000001 = 0.890000002 (to 1e-15). Likewise w[1]: −1.98 + 0.025/0.25000001
  // = −1.880000004, and b: 0.495 − 0.1/1.00000001 = 0.395000001.
  const p = [1, -2, 0.5], m = [0, 0, 0], v = [0, 0, 0];
  for (let t = 1; t <= 3; t++) {
    const g = grads[t - 1];
    opt.step(new Map([["w", new Float64Array(g.slice(0, 2))], ["b", new Float64Array([g[2]])]]));
    // the equations of torch.optim.AdamW, one scalar at a time
    for (let i = 0; i < 3; i++) {
      p[i] = p[i] * (1 - lr * wd);
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const stepSize = lr / (1 - b1 ** t);
      const denom = Math.sqrt(v[i]) / Math.sqrt(1 - b2 ** t) + eps;
      p[i] = p[i] - stepSize * m[i] / denom;
    }
    if (t === 1) close(p, [0.890000002, -1.880000004, 0.395000001], 1e-15, "hand step 1");
    close(w.data, p.slice(0, 2), 1e-15, `step ${t} w`);
    close(b.data, p.slice(2), 1e-15, `step ${t} b`);
  }
  assert.equal(opt.steps, 3);
});

Deno.test("adamw's first step moves every entry by lr whatever the gradient's scale", () => {
  const w = new Tensor(new Float64Array([0, 0, 0]), [3]);
  const opt = new AdamW(new Map([["w", w]]), { lr: 0.01, weightDecay: 0, eps: 1e-12 });
  opt.step(new Map([["w", new Float64Array([1e-6, -3, 1e4])]]));
  close(w.data, [-0.01, 0.01, -0.01], 1e-6, "w");
});

Deno.test("the learning rate can change between steps and is validated", () => {
  const { w, params } = twoParams();
  const opt = new Sgd(params, { lr: 1 });
  opt.lr = 0.25;
  opt.step(new Map([["w", new Float64Array([4, 4])], ["b", new Float64Array([0])]]));
  assert.deepEqual([...w.data], [0, -3]);
  assert.throws(() => (opt.lr = -1), {
    name: "RangeError",
    message: "lr must be a finite number in [0, ∞): got -1",
  });
});

Deno.test("bad hyper-parameters give named errors", () => {
  const { params } = twoParams();
  assert.throws(() => new Sgd(params, { lr: NaN }), {
    name: "RangeError",
    message: "options.lr must be a finite number in [0, ∞): got NaN",
  });
  assert.throws(() => new Sgd(params, { lr: 0.1, momentum: 1 }), {
    name: "RangeError",
    message: "options.momentum must be a finite number in [0, 1): got 1",
  });
  assert.throws(() => new Sgd(params, { lr: 0.1, weightDecay: -0.1 }), {
    name: "RangeError",
    message: "options.weightDecay must be a finite number in [0, ∞): got -0.1",
  });
  assert.throws(() => new AdamW(params, { betas: [0.9, 1] }), {
    name: "RangeError",
    message: "options.betas[1] must be a finite number in [0, 1): got 1",
  });
  // deno-lint-ignore no-explicit-any
  assert.throws(() => new AdamW(params, { betas: [0.9] as any }), {
    name: "TypeError",
    message: "options.betas must be a pair [beta1, beta2]: got 1 numbers",
  });
  assert.throws(() => new AdamW(params, { eps: 0 }), {
    name: "RangeError",
    message: "options.eps must be a finite number in (0, ∞): got 0",
  });
  // deno-lint-ignore no-explicit-any
  assert.throws(() => new AdamW(params, { learningRate: 1 } as any), {
    name: "TypeError",
    message:
      "options.learningRate is not a known field: expected one of lr, betas, eps, weightDecay (did you mean lr?)",
  });
  // deno-lint-ignore no-explicit-any
  assert.throws(() => new AdamW({} as any), {
    name: "TypeError",
    message: "params must be a Map of name to Tensor: got Object",
  });
  // deno-lint-ignore no-explicit-any
  assert.throws(() => new AdamW(new Map([["w", [1, 2]]]) as any), {
    name: "TypeError",
    message: 'params "w" must be a Tensor over a Float64Array or Float32Array: got Array',
  });
});

Deno.test("unknown, missing, wrong-length and non-finite gradients give named errors", () => {
  for (const opt of [new Sgd(twoParams().params, { lr: 0.1 }), new AdamW(twoParams().params)]) {
    const b = new Float64Array(1);
    assert.throws(
      () => opt.step(new Map([["w", new Float64Array(2)], ["b", b], ["c", b]])),
      {
        name: "RangeError",
        message: 'grads has a gradient for an unknown parameter: expected one of w, b; got "c"',
      },
    );
    assert.throws(() => opt.step(new Map([["w", new Float64Array(2)]])), {
      name: "RangeError",
      message: 'grads must hold a gradient for every parameter: got none for "b"',
    });
    assert.throws(() => opt.step(new Map([["w", new Float64Array(3)], ["b", b]])), {
      name: "RangeError",
      message: 'grads "w" must have 2 elements like its parameter: got 3',
    });
    assert.throws(() => opt.step(new Map([["w", new Float64Array([0, NaN])], ["b", b]])), {
      name: "RangeError",
      message: 'grads "w" must be finite: got NaN at index 1',
    });
    // deno-lint-ignore no-explicit-any
    assert.throws(() => opt.step(new Map([["w", [0, 0] as any], ["b", b]])), {
      name: "TypeError",
      message: 'grads "w" must be a Float64Array or Float32Array: got Array',
    });
    assert.equal(opt.steps, 0, "a rejected step changes nothing");
  }
});

Deno.test("adamw over a KdaModule's groups lowers a quadratic loss of its output", async () => {
  const layer = new KdaModule({ dModel: 8, heads: 1, keyDim: 4, valueDim: 4, decayRank: 2 });
  const x = Float64Array.from({ length: 2 * 6 * 8 }, (_, i) => Math.sin(0.7 * i));
  const target = Float64Array.from({ length: x.length }, (_, i) => 0.1 * Math.cos(1.3 * i));
  const opt = new AdamW(layer.parameters(), { lr: 1e-2, weightDecay: 0 });
  let first = 0, last = 0;
  for (let s = 0; s < 20; s++) {
    const y = await layer.forward(x, [2, 6], { arm: "cpu" });
    const dy = y.map((yi, i) => yi - target[i]); // L = ½ Σ (y − target)²
    last = dy.reduce((a, d) => a + 0.5 * d * d, 0);
    if (s === 0) first = last;
    const { grads } = await layer.vjp(x, [2, 6], dy, { arm: "cpu" });
    opt.step(grads);
  }
  assert.ok(last < 0.75 * first, `loss ${first} → ${last}`);
});

/** Every parameter's values, copied, to compare after a refused step. */
function snapshot(params: Map<string, Tensor>): Map<string, number[]> {
  return new Map([...params].map(([n, p]) => [n, [...p.data]]));
}

Deno.test("an Sgd step that would write a non-finite parameter throws, naming the group, index and value, and changes nothing", () => {
  const { w, b, params } = twoParams();
  const opt = new Sgd(params, { lr: 1e10, momentum: 0.9 });
  const before = snapshot(params);
  // b's update is finite; w[1]'s is 1 − 1e10 · 1e300 = −Infinity, so neither may be written.
  assert.throws(
    () => opt.step(new Map([["b", new Float64Array([1])], ["w", new Float64Array([0, 1e300])]])),
    {
      name: "RangeError",
      message: 'params "w" must stay finite after step 1: got -Infinity at index 1 ' +
        "(nothing was updated)",
    },
  );
  assert.deepEqual(snapshot(params), before, "no parameter changed");
  assert.equal(opt.steps, 0);
  // The momentum buffer was not started by the refused step: the next step is a first step.
  opt.lr = 0.1;
  opt.step(new Map([["w", new Float64Array([1, 1])], ["b", new Float64Array([1])]]));
  close(w.data, [0.9, -2.1], 1e-15, "w after a first step");
  close(b.data, [0.4], 1e-15, "b after a first step");
});

Deno.test("an f32 Sgd step whose value overflows f32 (but not f64) throws and changes nothing", () => {
  const { params } = twoParams("f32");
  const opt = new Sgd(params, { lr: 1 });
  const before = snapshot(params);
  assert.throws(
    () => opt.step(new Map([["w", new Float64Array([1e39, 0])], ["b", new Float64Array([0])]])),
    {
      name: "RangeError",
      message: 'params "w" must stay finite in f32 after step 1: got -1e+39 at index 0, ' +
        "which rounds to -Infinity (nothing was updated)",
    },
  );
  assert.deepEqual(snapshot(params), before);
});

Deno.test("an AdamW step that would write a non-finite parameter or moment throws, naming the group, index and value, and changes nothing", () => {
  // lr 1e300: the decoupled decay 1 − lr · 0.01 and the step lr / (1 − β1) overflow the update.
  const { params } = twoParams("f32");
  const opt = new AdamW(params, { lr: 1e300 });
  const before = snapshot(params);
  assert.throws(
    () => opt.step(new Map([["w", new Float64Array([1, 1])], ["b", new Float64Array([1])]])),
    (e: Error) =>
      e instanceof RangeError &&
      /^params "w" must stay finite in f32 after step 1: got -?[\d.e+]+ at index 0, which rounds to -?Infinity \(nothing was updated\)$/
        .test(e.message),
  );
  assert.deepEqual(snapshot(params), before);
  // A gradient of 1e300 squares to Infinity in the second moment: refused, not a silent zero step.
  const f64 = twoParams();
  const adam = new AdamW(f64.params, { lr: 0.1 });
  assert.throws(
    () => adam.step(new Map([["w", new Float64Array([0, 1e300])], ["b", new Float64Array([0])]])),
    {
      name: "RangeError",
      message: 'the second moment of params "w" must stay finite after step 1: got Infinity ' +
        "at index 1 (nothing was updated)",
    },
  );
  assert.equal(adam.steps, 0);
  // The moments were not touched: a good step now is AdamW's first step (each entry moves by lr).
  adam.step(new Map([["w", new Float64Array([1, -1])], ["b", new Float64Array([1])]]));
  close(f64.w.data, [1 * (1 - 0.1 * 0.01) - 0.1, -2 * (1 - 0.1 * 0.01) + 0.1], 1e-7, "w");
});

Deno.test("a parameter given under two names, or two views of one memory, is refused by name", () => {
  const t = new Tensor(Float64Array.from([1, 2]), [2]);
  const tied = new Map([["a", t], ["b", t]]);
  const buf = new Float64Array(4);
  const halves = new Map([
    ["lo", new Tensor(buf.subarray(0, 2), [2])],
    ["mid", new Tensor(buf.subarray(1, 3), [2])],
  ]);
  for (
    const make of [
      (p: Map<string, Tensor>) => new Sgd(p, { lr: 0.1 }),
      (p: Map<string, Tensor>) => new AdamW(p),
    ]
  ) {
    assert.throws(
      () => make(tied),
      /^RangeError: params "b" must not share memory with another parameter: got the memory of "a"/,
    );
    assert.throws(() => make(halves), /^RangeError: params "mid" must not share memory .* of "lo"/);
  }
  assert.deepEqual(Array.from(t.data), [1, 2], "nothing was updated");
  // neighbouring views of one buffer are separate parameters
  const split = new Map([
    ["lo", new Tensor(buf.subarray(0, 2), [2])],
    ["hi", new Tensor(buf.subarray(2, 4), [2])],
  ]);
  new Sgd(split, { lr: 1 }).step(
    new Map([["lo", new Float64Array([1, 1])], ["hi", new Float64Array([2, 2])]]),
  );
  assert.deepEqual(Array.from(buf), [-1, -1, -2, -2]);
});
