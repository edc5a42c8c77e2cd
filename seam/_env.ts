// The seam's reading of its environment variables: a value, or the fact that it cannot be read
// (no env permission), which the seam records rather than guessing.

/**
 * Reads an environment variable, or says why it cannot be read (an empty value reads as unset).
 *
 * @param name The variable.
 * @returns Its value, and whether the permission to read it was missing.
 * @example
 * ```ts
 * import { readEnv } from "./_env.ts";
 * console.log(readEnv("KDA_ARM")); // { value: undefined, unreadable: false } when unset
 * ```
 */
export function readEnv(name: string): { value: string | undefined; unreadable: boolean } {
  let state: Deno.PermissionState;
  try {
    state = Deno.permissions.querySync({ name: "env", variable: name }).state;
  } catch {
    state = "denied";
  }
  if (state !== "granted") return { value: undefined, unreadable: true };
  const value = Deno.env.get(name);
  return { value: value === undefined || value === "" ? undefined : value, unreadable: false };
}
