// Seeded random numbers for reproducible initialisation and draws. mulberry32 is small, fast and
// has a full 2^32 period, which is plenty for weights and test inputs.

/** A generator of uniform numbers in [0, 1). */
export type Uniform = () => number;

/** Mulberry32: a 32-bit seeded uniform generator. */
export function mulberry32(seed: number): Uniform {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Standard normal draws by Box–Muller over a uniform generator. */
export function normal(uniform: Uniform): () => number {
  return () => {
    const u = 1 - uniform(); // (0, 1]: keeps log finite
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * uniform());
  };
}

/** A sub-seed derived from a seed and a stream name, so each draw has its own stream. */
export function subSeed(seed: number, stream: string): number {
  let h = (seed ^ 0x9e3779b9) >>> 0;
  for (let i = 0; i < stream.length; i++) {
    h = Math.imul(h ^ stream.charCodeAt(i), 0x01000193) >>> 0;
  }
  return h;
}
