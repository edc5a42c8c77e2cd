// The bench scripts' one argument check (no imports, so that a script run with narrow permissions,
// bench:report, can use it).
/** What a bench script takes: flags with a value (`--name=value`) and bare ones (`--name`). */
export interface BenchFlags {
  /** Flags written `--name=value`. */
  valued?: readonly string[];
  /** Of those, the ones whose value is a comma-separated list of positive integers. */
  counts?: readonly string[];
  /** Flags written `--name`. */
  bare?: readonly string[];
  /** Whether arguments that are not flags are the script's own (a shape, say). */
  positional?: boolean;
}

/**
 * Refuses what a bench script would otherwise ignore: every argument must be one of its flags, in
 * its form, and a count a list of positive integers; else one line on stderr and exit code 2, so
 * that a misspelt flag never starts a default run of hours.
 *
 * @param script The script's name, for the message.
 * @param args Its arguments.
 * @param flags What it takes.
 * @example
 * ```ts
 * import { checkBenchArgs } from "./_args.ts";
 * checkBenchArgs("gpu", ["--runs=3", "--quick"], { valued: ["runs"], counts: ["runs"], bare: ["quick"] });
 * ```
 */
export function checkBenchArgs(script: string, args: readonly string[], flags: BenchFlags): void {
  const valued = flags.valued ?? [], bare = flags.bare ?? [], counts = flags.counts ?? [];
  const known = [...valued.map((n) => `--${n}=...`), ...bare.map((n) => `--${n}`)].join(", ");
  for (const arg of args) {
    const m = /^--([a-z][a-z-]*)(?:=(.*))?$/.exec(arg);
    if (m === null && flags.positional && !arg.startsWith("-")) continue;
    const [name, value] = m === null ? [undefined, undefined] : [m[1], m[2]];
    let why: string | null = null;
    if (name === undefined || (!valued.includes(name) && !bare.includes(name))) {
      why = `${arg} is not a flag of this script: expected ${known || "none"}`;
    } else if (valued.includes(name) && value === undefined) {
      why = `--${name} takes its value after "=": write --${name}=...`;
    } else if (bare.includes(name) && value !== undefined) {
      why = `--${name} takes no value: got ${arg}`;
    } else if (valued.includes(name) && value === "") {
      why = `--${name} needs a value: got ${arg}`;
    } else if (counts.includes(name) && !/^[1-9]\d*(,[1-9]\d*)*$/.test(value!)) {
      why = `--${name} must be positive integers (comma-separated): got ${value}`;
    }
    if (why !== null) {
      console.error(`${script}: ${why}`);
      Deno.exit(2);
    }
  }
}
