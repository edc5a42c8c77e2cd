// The seeded state-dict sweep shared by tests/adversarial_test.ts (a small slice) and
// tests/fuzz.ts: random small layers of either form (KDA, Kimi Linear), random valid dicts (bare or shaped, f64 or f32 values) that
// must load exactly and round-trip through a checkpoint, random invalid dicts and checkpoint files
// (a missing, extra, misshapen, non-finite or f32-overflowing tensor; a config claiming another or a
// huge layer; a repeated header key; a byte-order mark) that must be refused by name with nothing
// loaded and no random weights drawn, and optimizer steps that must be all or nothing.

import { type KdaConfig, KdaModule, loadLayer, loadStateDict, saveLayer } from "../mod.ts";
import { AdamW, Sgd } from "../optim/mod.ts";
import type { KimiConfigInput } from "../kda/layer/config.ts";
import { readSafetensors, writeSafetensors } from "../io/mod.ts";
import { mulberry32, normal } from "./_fixtures.ts";

/** What a case does to a valid dict, or to the checkpoint file made from it. */
export const MUTATIONS = [
  "valid",
  "missing",
  "unexpected",
  "shape",
  "length",
  "nan",
  "infinity",
  "f32 overflow",
  "not an array",
  "file: other config",
  "file: huge config",
  "file: repeated metadata key",
  "file: byte-order mark",
  "sgd step",
  "adamw step",
] as const;

/** One drawn case. */
export interface StateCase {
  label: string;
  config: Partial<KdaConfig> | KimiConfigInput;
  dtype: "f64" | "f32";
  mutation: (typeof MUTATIONS)[number];
  seed: number;
}

/** Draws state-dict case `index`: the mutation by index (each in turn), the layer from the seed. */
export function stateCase(seed: number, index: number): StateCase {
  const rand = mulberry32((seed * 2654435761 + index * 40503) >>> 0);
  const int = (lo: number, hi: number) => lo + Math.floor(rand() * (hi - lo + 1));
  const kimi = rand() < 1 / 3;
  const heads = int(1, 3);
  const common = {
    dModel: int(1, 8),
    heads,
    keyDim: int(1, 4),
    valueDim: int(1, 4),
    shortConv: rand() < 0.5,
    seed: int(0, 1000),
  };
  // Either form of the layer: the KDA form (docs/kda.md 2.4) or Kimi Linear with fla's groups.
  const config: Partial<KdaConfig> | KimiConfigInput = kimi
    ? {
      form: "kimi",
      ...common,
      numVHeads: heads * int(1, 2),
      convBias: rand() < 0.5,
      lowerBound: rand() < 0.5 ? null : -5,
    }
    : { ...common, decayRank: int(1, 3) };
  const dtype = rand() < 0.5 ? "f64" : "f32";
  const mutation = MUTATIONS[index % MUTATIONS.length];
  const label = `state #${index} ${mutation} ${dtype} ${JSON.stringify(config)}`;
  return { label, config, dtype, mutation, seed: int(0, 2 ** 30) };
}

type Tensors = Map<
  string,
  Float64Array | Float32Array | { data: Float64Array | Float32Array; shape: number[] }
>;

/** How often `fn` calls Math.expm1, which only the random initialiser calls (for b_alpha). */
function expm1Calls<T>(fn: () => T): { value?: T; error?: unknown; calls: number } {
  const original = Math.expm1;
  let calls = 0;
  Math.expm1 = (x: number) => (calls++, original(x));
  try {
    return { value: fn(), calls };
  } catch (error) {
    return { error, calls };
  } finally {
    Math.expm1 = original;
  }
}

/** Every group's values, copied. */
function snapshot(layer: KdaModule): number[][] {
  return [...layer.parameters().values()].map((p) => [...p.data]);
}

function same(a: number[][], b: number[][]): boolean {
  return a.length === b.length &&
    a.every((x, i) => x.length === b[i].length && x.every((v, j) => Object.is(v, b[i][j])));
}

/** A file with its header text changed by `edit` (the data offsets are unchanged). */
function editHeader(bytes: Uint8Array, edit: (header: Uint8Array) => Uint8Array): Uint8Array {
  const n = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
  const header = edit(bytes.subarray(8, 8 + n)), data = bytes.subarray(8 + n);
  const out = new Uint8Array(8 + header.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(header.length), true);
  out.set(header, 8);
  out.set(data, 8 + header.length);
  return out;
}

/**
 * Runs one case and returns what went wrong (empty when all is as it must be).
 *
 * A valid dict loads into a layer of another seed, giving exactly its values in the layer's dtype,
 * and the layer round-trips through saveLayer/loadLayer bit for bit. An invalid dict or file is
 * refused by loadStateDict, fromStateDict and loadLayer with a TypeError or RangeError whose
 * message names the tensor or field at fault, leaves the layer unchanged, and draws no random
 * weights. An optimizer step with a huge learning rate or gradient either writes only finite
 * values or throws a RangeError naming the group and changes nothing.
 */
export function checkStateCase(c: StateCase): string[] {
  const fail: string[] = [];
  const rand = mulberry32(c.seed);
  const gauss = normal(rand);
  const target = new KdaModule(c.config, { dtype: c.dtype });
  const dict: Tensors = new Map();
  for (const [name, p] of target.parameters()) {
    const values = Float64Array.from({ length: p.size }, () => gauss());
    const data = rand() < 0.5 ? Float32Array.from(values) : values;
    dict.set(name, rand() < 0.5 ? data : { data, shape: [...p.shape] });
  }
  const names = [...dict.keys()];
  const victim = names[Math.floor(rand() * names.length)];
  const dataOf = (name: string) => {
    const v = dict.get(name)!;
    return v instanceof Float64Array || v instanceof Float32Array ? v : v.data;
  };
  const before = snapshot(target);

  // Mutations a checkpoint file cannot carry as they are (the writer takes no plain array, and a
  // file stores every tensor's shape, so a wrong length is a wrong shape there): dicts only.
  const dictOnly = new Set(["not an array", "length", "shape"]);

  /** Expects a refusal naming `what`, with nothing loaded and no random draw. */
  const refused = (how: string, run: () => unknown, what: RegExp) => {
    const { error, calls } = expm1Calls(run);
    if (!(error instanceof RangeError || error instanceof TypeError)) {
      fail.push(`${c.label}: ${how} was not refused with a named error (got ${String(error)})`);
    } else if (!what.test(error.message)) {
      fail.push(`${c.label}: ${how} refused with "${error.message}", which does not name ${what}`);
    }
    if (calls !== 0) fail.push(`${c.label}: ${how} drew ${calls} random weights`);
    if (!same(snapshot(target), before)) fail.push(`${c.label}: ${how} changed the layer`);
  };
  const dictRefused = (what: RegExp) => {
    refused("loadStateDict", () => loadStateDict(target, dict), what);
    refused(
      "fromStateDict",
      () => KdaModule.fromStateDict(dict, c.config, { dtype: c.dtype }),
      what,
    );
    // The same dict in a checkpoint file (the mutations that a file can hold).
    if (!dictOnly.has(c.mutation)) {
      const file = new Map<string, { data: Float64Array | Float32Array; shape: number[] }>();
      const shapes = new Map([...target.parameters()].map(([n, p]) => [n, [...p.shape]]));
      for (const [name, v] of dict) {
        const data = v instanceof Float64Array || v instanceof Float32Array ? v : v.data;
        const shape = v instanceof Float64Array || v instanceof Float32Array
          ? shapes.get(name) ?? [data.length]
          : v.shape;
        file.set(name, {
          data,
          shape: shape.reduce((a, d) => a * d, 1) === data.length ? shape : [data.length],
        });
      }
      const meta = { format: "kda.layer", config: JSON.stringify(target.config), dtype: c.dtype };
      refused("loadLayer", () => loadLayer(writeSafetensors(file, meta)), what);
    }
  };

  switch (c.mutation) {
    case "valid": {
      const { calls } = expm1Calls(() => loadStateDict(target, dict));
      if (calls !== 0) fail.push(`${c.label}: loadStateDict drew random weights`);
      const round = c.dtype === "f32" ? Math.fround : (v: number) => v;
      for (const [name, p] of target.parameters()) {
        const want = [...dataOf(name)].map(round);
        if (!want.every((v, i) => Object.is(v, p.data[i]))) {
          fail.push(`${c.label}: "${name}" did not load exactly`);
        }
      }
      const back = expm1Calls(() => loadLayer(saveLayer(target)));
      if (back.calls !== 0 || back.value === undefined) {
        fail.push(
          `${c.label}: loadLayer drew ${back.calls} weights or failed: ${String(back.error)}`,
        );
      } else if (!same(snapshot(back.value), snapshot(target))) {
        fail.push(`${c.label}: the checkpoint did not round-trip bit for bit`);
      }
      const built = expm1Calls(() => KdaModule.fromStateDict(dict, c.config, { dtype: c.dtype }));
      if (
        built.calls !== 0 || built.value === undefined ||
        !same(snapshot(built.value), snapshot(target))
      ) {
        fail.push(`${c.label}: fromStateDict drew weights or built other values`);
      }
      break;
    }
    case "missing":
      dict.delete(victim);
      dictRefused(new RegExp(`got none for .*"${escape(victim)}"`));
      break;
    case "unexpected":
      dict.set(`${victim}.extra`, new Float64Array(1));
      dictRefused(new RegExp(`got "${escape(victim)}\\.extra"`));
      break;
    case "shape": {
      const d = dataOf(victim);
      dict.set(victim, { data: d, shape: [1, d.length, 1] });
      dictRefused(new RegExp(`dict "${escape(victim)}" must have shape`));
      break;
    }
    case "length":
      dict.set(victim, new Float64Array(dataOf(victim).length + 1));
      dictRefused(new RegExp(`dict "${escape(victim)}" must have \\d+ elements`));
      break;
    case "nan":
    case "infinity": {
      const d = Float64Array.from(dataOf(victim));
      const at = Math.floor(rand() * d.length);
      d[at] = c.mutation === "nan" ? NaN : -Infinity;
      dict.set(victim, d);
      dictRefused(new RegExp(`dict "${escape(victim)}" must be finite: got .* at index ${at}`));
      break;
    }
    case "f32 overflow": {
      const d = Float64Array.from(dataOf(victim));
      const at = Math.floor(rand() * d.length);
      d[at] = (rand() < 0.5 ? -1 : 1) * 10 ** (39 + Math.floor(rand() * 269));
      dict.set(victim, d);
      if (c.dtype === "f32") {
        dictRefused(
          new RegExp(`dict "${escape(victim)}" must be finite in the layer's f32.* at index ${at}`),
        );
      } else {
        loadStateDict(target, dict);
        if (target.parameters().get(victim)!.data[at] !== d[at]) {
          fail.push(`${c.label}: an f64 layer did not load ${d[at]} exactly`);
        }
      }
      break;
    }
    case "not an array":
      dict.set(victim, [...dataOf(victim)] as unknown as Float64Array);
      dictRefused(new RegExp(`dict "${escape(victim)}" must be a Float64Array`));
      break;
    case "file: other config":
    case "file: huge config": {
      const claim = c.mutation === "file: huge config"
        ? {
          ...target.config,
          dModel: target.config.dModel * 4096,
          heads: 16,
          keyDim: 256,
          ...("numVHeads" in target.config ? { numVHeads: 16 } : {}),
        }
        : { ...target.config, keyDim: target.config.keyDim + 1 };
      const bytes = saveLayer(target);
      const { metadata } = readSafetensors(bytes);
      const lie = editHeader(bytes, (h) => {
        const text = new TextDecoder().decode(h);
        const json = JSON.parse(text);
        json.__metadata__ = { ...metadata, config: JSON.stringify(claim) };
        return new TextEncoder().encode(JSON.stringify(json));
      });
      refused("loadLayer", () => loadLayer(lie), /dict "[^"]+" must have shape|got none for/);
      break;
    }
    case "file: repeated metadata key": {
      const bytes = editHeader(saveLayer(target), (h) => {
        const text = new TextDecoder().decode(h).replace(
          '"__metadata__":{',
          '"__metadata__":{"dtype":"f16",',
        );
        return new TextEncoder().encode(text);
      });
      refused(
        "loadLayer",
        () => loadLayer(bytes),
        /header\.__metadata__ must not repeat a key: got "dtype" twice/,
      );
      break;
    }
    case "file: byte-order mark": {
      const bytes = editHeader(saveLayer(target), (h) => new Uint8Array([0xef, 0xbb, 0xbf, ...h]));
      refused("loadLayer", () => loadLayer(bytes), /byte-order mark/);
      break;
    }
    case "sgd step":
    case "adamw step": {
      const params = target.parameters();
      const lr = 10 ** (-3 + Math.floor(rand() * 310));
      // Up to 1e300, so that scale · N(0, 1) stays finite (the gradient must be a valid one).
      const scale = 10 ** Math.floor(rand() * 301);
      const grads = new Map(
        [...params].map((
          [n, p],
        ) => [n, Float64Array.from({ length: p.size }, () => scale * gauss())]),
      );
      const opt = c.mutation === "sgd step"
        ? new Sgd(params, { lr, momentum: 0.9 })
        : new AdamW(params, { lr });
      try {
        opt.step(grads);
        for (const [name, p] of params) {
          if (!p.data.every(Number.isFinite)) {
            fail.push(`${c.label}: a step wrote a non-finite value into "${name}"`);
          }
        }
      } catch (e) {
        if (
          !(e instanceof RangeError) ||
          !/params "[^"]+" must stay finite|moment of params "[^"]+" must stay finite|momentum buffer/
            .test(e.message)
        ) {
          fail.push(`${c.label}: the step threw ${String(e)}`);
        }
        if (!same(snapshot(target), before)) {
          fail.push(`${c.label}: a refused step changed the layer`);
        }
        if (opt.steps !== 0) fail.push(`${c.label}: a refused step was counted`);
      }
      break;
    }
  }
  return fail;
}

/** A string as a literal inside a RegExp. */
function escape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
