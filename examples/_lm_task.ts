// The task of examples/lm.ts: multi-query associative recall whose keys are longer than the short
// convolution. Each sequence holds P pairs `k s1 s2 : v` and then the P queries `k s1 s2 ?` in a
// shuffled order; the target at each `?` is the value of its key. The key's last two tokens
// (s1 s2) are the same for every pair of a sequence, so only its first token k tells the pairs
// apart, and k lies four tokens before its value: beyond the width-4 short convolution (a token
// and the three before it), which is how one KDA layer binds a key to the value after it. One
// layer can therefore only guess among the values it saw; a second layer, whose convolution reads
// the first layer's outputs, reaches seven tokens back (the receptive fields add).

/** The task's sizes and token ids. */
export interface LmTask {
  /** Distinct first key tokens (ids 0 … keys − 1). */
  keys: number;
  /** Distinct suffix tokens (ids after the keys). */
  suffixes: number;
  /** Distinct values (ids after the suffixes). */
  values: number;
  /** Pairs (and queries) per sequence. */
  pairs: number;
}

/** The task of the example: 16 keys, 8 suffix tokens, 16 values, 4 pairs (T = 36). */
export const TASK: LmTask = { keys: 16, suffixes: 8, values: 16, pairs: 4 };

/** The id of `:`, which ends a key before its value. */
export const colonOf = (t: LmTask): number => t.keys + t.suffixes + t.values;
/** The id of `?`, which ends a query. */
export const questionOf = (t: LmTask): number => colonOf(t) + 1;
/** Tokens in the vocabulary. */
export const vocabOf = (t: LmTask): number => questionOf(t) + 1;
/** Tokens per sequence: 5 per pair, 4 per query. */
export const lengthOf = (t: LmTask): number => 9 * t.pairs;

/** A batch: token ids [B, T] and each position's target (-1 where nothing is predicted). */
export interface TaskBatch {
  /** Sequences. */
  B: number;
  /** Tokens per sequence. */
  T: number;
  /** Token ids, [B, T]. */
  tokens: Int32Array;
  /** The value each `?` must predict, -1 elsewhere, [B, T]. */
  targets: Int32Array;
}

function shuffle(a: number[], rand: () => number): number[] {
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

/**
 * A batch of the task: per sequence, P distinct first key tokens, one shared suffix, values drawn
 * with repeats, then the queries in a shuffled order.
 *
 * @param t The task.
 * @param B Sequences.
 * @param rand A uniform generator in [0, 1).
 * @returns The batch.
 */
export function makeBatch(t: LmTask, B: number, rand: () => number): TaskBatch {
  const T = lengthOf(t), P = t.pairs;
  const tokens = new Int32Array(B * T), targets = new Int32Array(B * T).fill(-1);
  const pick = (n: number) => Math.floor(rand() * n);
  const colon = colonOf(t), question = questionOf(t);
  for (let b = 0; b < B; b++) {
    const keys = shuffle(Array.from({ length: t.keys }, (_, i) => i), rand).slice(0, P);
    const s1 = t.keys + pick(t.suffixes), s2 = t.keys + pick(t.suffixes);
    const value = new Map<number, number>();
    let at = b * T;
    for (const k of keys) {
      const v = t.keys + t.suffixes + pick(t.values);
      value.set(k, v);
      tokens.set([k, s1, s2, colon, v], at);
      at += 5;
    }
    for (const k of shuffle(keys.slice(), rand)) {
      tokens.set([k, s1, s2, question], at);
      targets[at + 3] = value.get(k)!;
      at += 4;
    }
  }
  return { B, T, tokens, targets };
}
