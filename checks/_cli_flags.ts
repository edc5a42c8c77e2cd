// The flags of `deno task prove` (checks/cli.ts) checked before any work: each refusal is one
// UsageError line naming the flag, the value expected and the value given, which the CLI prints
// with exit code 2. Kept apart from cli.ts so that the program reads as what it runs.

import { resolve } from "node:path";
import { listNames } from "./_candidate_file.ts";

/** A refusal of the command line: the CLI prints its message in one line and exits 2. */
export class UsageError extends Error {}

/**
 * A flag's number written in decimal digits, else NaN (Number() would take "0x1", "1e1", " 8").
 *
 * @param text The flag's value.
 * @returns Its number, or NaN.
 */
export function decimal(text: string): number {
  return /^\d+$/.test(text) ? Number(text) : NaN;
}

/**
 * `--shape B,T`, checked.
 *
 * @param text The flag's value, if given.
 * @returns [B, T], or undefined without the flag.
 */
export function parseShape(text: string | undefined): [number, number] | undefined {
  if (text === undefined) return undefined;
  const parts = text.split(",").map(decimal);
  if (parts.length !== 2 || !parts.every((n) => Number.isSafeInteger(n) && n > 0)) {
    throw new UsageError(`--shape must be two positive integers B,T, in decimal: got ${text}`);
  }
  // with one token the gates scale only the initial state, which is zero: their groups' gradients
  // are exactly zero for any layer, and nothing can prove them
  if (parts[1] < 2) {
    throw new UsageError(
      `--shape T must be at least 2 (with one token the decay groups get no gradient to prove): got ${text}`,
    );
  }
  return [parts[0], parts[1]];
}

/** The flags of each mode: a flag of the other mode is refused, not ignored. */
const PROOF_ONLY = [
  "arm",
  "kernels",
  "conv",
  "shape",
  "config",
  "repeat",
  "mutants",
  "wide",
] as const;
const CANDIDATE_ONLY = ["precision", "chunk-size", "svg", "map", "compare"] as const;

/**
 * Throws at a flag of the other mode (the proof's with --candidate, or the candidate's without).
 *
 * @param values parseArgs's values.
 */
export function checkModeFlags(values: Record<string, unknown>): void {
  const given = (name: string) => values[name] !== undefined && values[name] !== false;
  const candidate = values.candidate !== undefined;
  const stray = (candidate ? PROOF_ONLY : CANDIDATE_ONLY).filter(given);
  if (stray.length > 0) {
    throw new UsageError(
      candidate
        ? `--${stray[0]} belongs to the proof and has no effect with --candidate: got both`
        : `--${stray[0]} belongs to --candidate and has no effect on the proof: got no --candidate`,
    );
  }
}

/**
 * The file at `path`, or undefined where there is none. Any other failure (no permission, as Deno
 * gives for /dev/stdout without --allow-all; a loop of links) is said as it is, with the flag:
 * taken as "no such file" it was misreported as a missing directory.
 */
function statOrNone(path: string, flag: string, what: string): Deno.FileInfo | undefined {
  try {
    return Deno.statSync(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory) {
      return undefined;
    }
    throw new UsageError(
      `${flag} ${what} could not be checked: ${(error as Error).message}`,
    );
  }
}

/**
 * Throws unless the directory a result is to be written into exists, before any work is done.
 *
 * @param path The flag's path, if given.
 * @param flag The flag, for the message.
 */
export function checkWritable(path: string | undefined, flag: string): void {
  if (path === undefined) return;
  // refused before the run, not after its minutes: an empty path, a directory, a trailing slash
  const existing = path === "" ? undefined : statOrNone(path, flag, path);
  if (path === "" || path.endsWith("/") || existing?.isDirectory) {
    const what = path === ""
      ? "an empty path"
      : existing?.isDirectory
      ? `${path}, a directory`
      : `${path}, which ends with /`;
    throw new UsageError(`${flag} must name a file in an existing directory: got ${what}`);
  }
  const slash = path.lastIndexOf("/");
  const dir = slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
  if (!statOrNone(dir, flag, `${path} (its directory ${dir})`)?.isDirectory) {
    throw new UsageError(`${flag} must name a file in an existing directory: got ${path}`);
  }
}

/** Every flag, for parseArgs (`child` is internal: the second process of `--repeat`). */
export const OPTIONS = {
  arm: { type: "string" },
  kernels: { type: "string" },
  conv: { type: "boolean", default: false },
  shape: { type: "string" },
  config: { type: "string" },
  repeat: { type: "string" },
  mutants: { type: "boolean", default: false },
  json: { type: "string" },
  format: { type: "string", default: "text" },
  wide: { type: "boolean", default: false },
  help: { type: "boolean", default: false },
  child: { type: "boolean", default: false },
  candidate: { type: "string" },
  precision: { type: "string" },
  "chunk-size": { type: "string" },
  svg: { type: "string" },
  map: { type: "string" },
  compare: { type: "string" },
} as const;

/**
 * The most reruns `--repeat` takes. Each is a full run of the layer with its backward, so a
 * thousand is already hours at the trainer shape; a larger count is a typo, and one past 2^53
 * (10^20) was taken as a number and ran without end.
 */
export const MAX_REPEAT = 1000;

/**
 * A parseArgs refusal in one line, naming the flag: node:util says a value that starts with a
 * dash is "ambiguous" in three lines, since it cannot tell a forgotten value from a negative one.
 *
 * @param error What parseArgs threw.
 * @param args The command line.
 * @returns The refusal to throw.
 */
export function parseError(error: Error, args: readonly string[]): UsageError {
  const ambiguous = /^Option '(--[\w-]+)[^']*' argument is ambiguous/.exec(error.message);
  if (ambiguous !== null) {
    const flag = ambiguous[1];
    const at = args.findIndex((a, i) => a === flag && /^-./.test(args[i + 1] ?? ""));
    const value = args[at + 1];
    const name = /^--([\w-]+)/.exec(value)?.[1];
    if (name !== undefined && Object.hasOwn(OPTIONS, name)) {
      return new UsageError(`${flag} must have a value: got the flag --${name} after it`);
    }
    return new UsageError(
      `${flag} must have a value; one that starts with a dash is written ${flag}=${value}: got ${flag} ${value}`,
    );
  }
  const line = error.message.replace(/\.?\s*\n\s*/g, "; ").replace(/\.$/, "");
  return new UsageError(`${line} (see --help)`);
}

/**
 * Throws at a flag given more than once: parseArgs keeps the last, and the others went unread.
 *
 * @param tokens parseArgs's tokens.
 */
export function checkOnce(
  tokens: readonly { kind: string; name?: string; value?: string }[],
): void {
  const given = new Map<string, (string | undefined)[]>();
  for (const t of tokens) {
    if (t.kind === "option") given.set(t.name!, [...(given.get(t.name!) ?? []), t.value]);
  }
  for (const [name, values] of given) {
    if (values.length < 2) continue;
    const times = values.length === 2 ? "twice" : `${values.length} times`;
    const shown = values.every((v) => v !== undefined)
      ? ` (${values.slice(0, -1).join(", ")}, then ${values[values.length - 1]})`
      : "";
    throw new UsageError(`--${name} must be given once: got it ${times}${shown}`);
  }
}

/** `dev:ino` of an existing file, which tells two names of one file (a link) from two files. */
function fileIdentity(path: string): string | undefined {
  try {
    const info = Deno.statSync(path);
    return info.ino === null ? undefined : `${info.dev}:${info.ino}`;
  } catch {
    // no identity to compare: an input that cannot be read is refused where it is read, an
    // output that cannot be checked by checkWritable
    return undefined;
  }
}

/**
 * Throws where an output (--json, --svg) is the file of another output or of an input (--candidate,
 * --compare, --map, --config): the write would replace what was read, or the other result.
 *
 * @param values parseArgs's values.
 */
export function checkFilesApart(values: Record<string, string | boolean | undefined>): void {
  const named = (flags: readonly string[]) =>
    flags.flatMap((flag) => {
      const path = values[flag];
      // "-" is standard input for the candidate's files, no file to overwrite; for --json, --svg
      // and --config it is a file named "-"
      const stdin = path === "-" && ["candidate", "compare", "map"].includes(flag);
      return typeof path === "string" && !stdin ? [[flag, path]] : [];
    });
  const outputs = named(["json", "svg"]);
  const inputs = named(["candidate", "compare", "map", "config"]);
  const [candidate, compare] = [named(["candidate"]), named(["compare"])];
  const pairs = [
    ...outputs.slice(1).map((b) => [outputs[0], b, "output"] as const),
    ...outputs.flatMap((a) => inputs.map((b) => [a, b, "input"] as const)),
    // a file compared with itself is bit-identical whatever the kernel did
    ...candidate.flatMap((a) => compare.map((b) => [a, b, "self"] as const)),
  ];
  for (const [[fa, a], [fb, b], kind] of pairs) {
    const ia = fileIdentity(a), ib = fileIdentity(b);
    if (resolve(a) !== resolve(b) && (ia === undefined || ia !== ib)) continue;
    const both = a === b ? `${a} for both` : `${a} and ${b}, one file`;
    const why = kind === "input"
      ? ` (--${fa} would overwrite its input)`
      : kind === "self"
      ? " (a file compared with itself agrees whatever the kernel did)"
      : "";
    throw new UsageError(`--${fa} and --${fb} must name two files${why}: got ${both}`);
  }
}

/**
 * Throws where more than one of --candidate, --compare and --map is "-": the first read takes
 * standard input, and the second found the stream "locked or disturbed".
 *
 * @param values parseArgs's values.
 */
export function checkStdinOnce(values: Record<string, string | boolean | undefined>): void {
  const stdin = ["candidate", "compare", "map"].filter((n) => values[n] === "-");
  if (stdin.length > 1) {
    throw new UsageError(
      `only one of --candidate, --compare and --map may read standard input (-): got - for ${
        listNames(stdin.map((n) => `--${n}`))
      }`,
    );
  }
}
