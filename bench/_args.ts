// The bench scripts' one argument check (no imports, so that a script run with narrow permissions,
// bench:report, can use it).

/** What a bench script takes: flags with a value (`--name=value`) and bare ones (`--name`). */
export interface BenchFlags {
  /** Flags written `--name=value`. */
  valued?: readonly string[];
  /**
   * Of those, the ones whose value is an integer of at least `min` (a comma-separated list of them
   * where `list`).
   */
  integers?: Readonly<Record<string, { min: number; list?: boolean }>>;
  /** Flags written `--name`. */
  bare?: readonly string[];
}

/**
 * Refuses what a bench script would otherwise ignore: every argument must be one of its flags, in
 * its form, and an integer flag's value an integer in its range; else one line on stderr and exit
 * code 2, so that a misspelt flag never starts a default run of hours.
 *
 * @param script The script's name, for the message.
 * @param args Its arguments.
 * @param flags What it takes.
 * @example
 * ```ts
 * import { checkBenchArgs } from "./_args.ts";
 * checkBenchArgs("gpu", ["--runs=3", "--quick"], {
 *   valued: ["runs"],
 *   integers: { runs: { min: 1 } },
 *   bare: ["quick"],
 * });
 * ```
 */
export function checkBenchArgs(script: string, args: readonly string[], flags: BenchFlags): void {
  const valued = flags.valued ?? [], bare = flags.bare ?? [], integers = flags.integers ?? {};
  const known = [...valued.map((n) => `--${n}=...`), ...bare.map((n) => `--${n}`)].join(", ");
  for (const arg of args) {
    const m = /^--([a-z][a-z-]*)(?:=(.*))?$/.exec(arg);
    const [name, value] = m === null ? [undefined, undefined] : [m[1], m[2]];
    const int = name === undefined ? undefined : integers[name];
    let why: string | null = null;
    if (name === undefined || (!valued.includes(name) && !bare.includes(name))) {
      why = `${arg} is not a flag of this script: expected ${known || "none"}`;
    } else if (valued.includes(name) && value === undefined) {
      why = `--${name} takes its value after "=": write --${name}=...`;
    } else if (bare.includes(name) && value !== undefined) {
      why = `--${name} takes no value: got ${arg}`;
    } else if (valued.includes(name) && value === "") {
      why = `--${name} needs a value: got ${arg}`;
    } else if (
      int !== undefined &&
      !(int.list ? value!.split(",") : [value!]).every((v) =>
        /^\d+$/.test(v) && Number(v) >= int.min
      )
    ) {
      const what = int.min === 0 ? "non-negative" : "positive";
      why = int.list
        ? `--${name} must be ${what} integers (comma-separated): got ${value}`
        : `--${name} must be a ${what} integer: got ${value}`;
    }
    if (why !== null) {
      console.error(`${script}: ${why}`);
      Deno.exit(2);
    }
  }
}

/**
 * A script's arguments, parsed by `parse`; a bad one prints one line naming it on stderr and exits
 * with code 2 (no stack trace: the mistake is the caller's, not the script's). The bench scripts
 * and the training examples use it for what checkBenchArgs does not cover (positional shapes,
 * kernel-set names, node:util's parseArgs).
 *
 * @param script The script's or task's name, for the message.
 * @param parse Parses and checks the arguments; throws a TypeError or RangeError for a bad one.
 * @returns What `parse` returns.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { argsOrExit } from "./_args.ts";
 * assert.equal(argsOrExit("gpu", () => Number("3")), 3);
 * ```
 */
export function argsOrExit<T>(script: string, parse: () => T): T {
  try {
    return parse();
  } catch (error) {
    if (!(error instanceof TypeError || error instanceof RangeError)) throw error;
    console.error(`${script}: ${error.message}`);
    Deno.exit(2);
  }
}
