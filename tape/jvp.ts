// Forward mode on the tape: run a function of tensors on a fresh tape, then push tangents through
// the recorded nodes in creation order (Tape.jvpFrom), each node applying its op's JVP rule.

import { alloc, computeDtypeOf } from "../base/dtype.ts";
import { typeName } from "../base/check.ts";
import { type Data, type MaybePromise, Tape, Tensor } from "./tape.ts";

/**
 * The Jacobian-vector product of `fn` at `primals` along `tangents`: the outputs of `fn` and their
 * exact directional derivatives J·u, by forward mode (no finite differences, so no step and no
 * resolution floor). `fn` must be built from tape ops, or custom nodes that define a `jvp`.
 *
 * @param fn A function of tensors returning one tensor or several. It runs once, on a fresh tape
 *   of the primals' dtype, with the primals as its variables.
 * @param primals Where to differentiate; their values are shared, not copied.
 * @param tangents One direction per primal, each of that primal's size and dtype.
 * @returns `outputs` (constants, detached from the internal tape) and `tangents`, one per output
 *   (zeros for an output that does not depend on the primals).
 * @throws {TypeError} When an argument has the wrong type or a tangent the wrong dtype.
 * @throws {RangeError} When the counts or sizes of primals and tangents disagree.
 * @throws {Error} When `fn` passes through a custom node that has no `jvp`, naming it.
 *
 * @example The directional derivative of Σ x² along u is 2⟨x, u⟩
 * ```ts
 * import { jvp, mul, sum, Tensor } from "@deltanet/kda/tape";
 * const x = new Tensor(Float64Array.of(1, 2, 3), [3]);
 * const u = Float64Array.of(1, 0, -1);
 * const { outputs, tangents } = await jvp((t) => sum(mul(t, t), 0), [x], [u]);
 * console.log(outputs[0].data[0], tangents[0][0]); // 14 -4
 * ```
 */
export async function jvp(
  fn: (...xs: Tensor[]) => MaybePromise<Tensor | readonly Tensor[]>,
  primals: readonly Tensor[],
  tangents: readonly Data[],
): Promise<{ outputs: Tensor[]; tangents: Data[] }> {
  if (typeof fn !== "function") {
    throw new TypeError(`jvp() fn must be a function: got ${typeName(fn)}`);
  }
  if (!Array.isArray(primals) || !Array.isArray(tangents)) {
    throw new TypeError("jvp() primals and tangents must be arrays: got something else");
  }
  if (primals.length === 0 || tangents.length !== primals.length) {
    throw new RangeError(
      `jvp() tangents must be one per primal, at least one: got ${tangents.length} for ${primals.length} primals`,
    );
  }
  primals.forEach((p, i) => {
    if (!(p instanceof Tensor)) {
      throw new TypeError(`jvp() primals[${i}] must be a Tensor: got ${typeName(p)}`);
    }
    if (computeDtypeOf(tangents[i], `jvp() tangents[${i}]`) !== primals[0].dtype) {
      throw new TypeError(
        `jvp() tangents[${i}] must have dtype ${primals[0].dtype}: got ${
          computeDtypeOf(tangents[i], `jvp() tangents[${i}]`)
        }`,
      );
    }
    if (tangents[i].length !== p.size) {
      throw new RangeError(
        `jvp() tangents[${i}] must have ${p.size} elements: got ${tangents[i].length}`,
      );
    }
  });
  const tape = new Tape(primals[0].dtype);
  try {
    const xs = primals.map((p) => tape.variable(p.data, p.shape));
    const result = await fn(...xs);
    const ys: readonly Tensor[] = result instanceof Tensor ? [result] : result;
    const reached = await tape.jvpFrom(xs.map((input, i) => ({ input, tangent: tangents[i] })));
    return {
      outputs: ys.map((y) => new Tensor(y.data, y.shape)),
      tangents: ys.map((y) => reached.get(y) ?? alloc(y.dtype, y.size)),
    };
  } finally {
    tape.dispose();
  }
}
