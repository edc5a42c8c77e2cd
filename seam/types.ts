// What an op hands the seam (seam.ts) and what the seam tells about its calls: the arms' contract
// (a reason an arm cannot run a call, a fused arm's forward, backward and vjp, a composite arm's
// recording), the op's policy, the options of one dispatch, and the counters and decisions.

import type { Data, MaybePromise, Tensor } from "../tape/mod.ts";
import type { ComputeDType } from "../base/dtype.ts";

/** How often each path of a seam was taken since its last reset. */
export interface SeamCounts {
  /** Calls of the op. */
  asked: number;
  /** Forwards run by a fused (custom-node) arm. */
  fusedFwd: number;
  /** Backwards a fused arm completed. */
  fusedBwd: number;
  /** Calls that ran another arm than the one wanted. */
  declined: number;
  /** Calls run by a composite arm (recorded on the tape from primitive ops). */
  opsPath: number;
  /** Entries into a custom node's backward. */
  customNodeBwd: number;
  /**
   * Forwards run per arm variant, as "arm:variant" (an arm that has variants, e.g. the gpu arm's
   * kernel sets, names the one that ran).
   */
  variants: Record<string, number>;
}

/** A call that did not run as wanted, whose arm was chosen by a default rule, or that ran otherwise. */
export interface SeamDecision {
  /** The arm the call wanted. */
  wanted: string;
  /** The arm that ran. */
  ran: string;
  /** Why, in words. */
  reason: string;
  /** 1-based position of this decision among all recorded since the last reset. */
  index: number;
  /** The variant of the arm that ran (e.g. the gpu arm's kernel set), where the arm has variants. */
  variant?: string;
}

/** What every arm says before it runs: a reason it cannot run this call, or null. */
interface ArmBase<R> {
  /** The arm's name, as callers ask for it. */
  readonly name: string;
  /** The element types the arm computes in, the most precise first (the seam refuses others). */
  readonly dtypes: readonly ComputeDType[];
  /**
   * Why this arm cannot run the call, or null when it can.
   *
   * @param request The op's request (dimensions and settings).
   * @param dtype The element type of the inputs.
   * @param call Whether a backward will follow the forward.
   */
  whyNot(
    request: R,
    dtype: ComputeDType,
    call: { backward: boolean },
  ): MaybePromise<string | null>;
  /**
   * Which variant of the arm runs a call it can run (e.g. a kernel set), and the note worth
   * recording when a rule rather than the caller chose it; absent for an arm of one variant.
   *
   * @param request The op's request.
   */
  variant?(request: R): { name: string; note: string | null };
}

/** An arm that computes the op as one custom tape node with its own backward. */
export interface FusedArm<R, S = unknown> extends ArmBase<R> {
  /** Marks a fused arm. */
  readonly kind: "fused";
  /**
   * Computes the outputs; with `save`, also what `backward` needs.
   *
   * @param request The op's request.
   * @param inputs The inputs' values, in the op's order (undefined for an absent optional input).
   * @param save Whether a backward will follow (keep what it needs).
   */
  forward(
    request: R,
    inputs: readonly (Data | undefined)[],
    save: boolean,
  ): MaybePromise<{ outputs: Data[]; saved?: S }>;
  /**
   * Maps the outputs' cotangents (null where none arrived) to the inputs' (null for none). May run
   * several times, concurrently too, on one saved state.
   */
  backward(saved: S, cotangents: readonly (Data | null)[]): MaybePromise<(Data | null)[]>;
  /** Frees what `saved` holds (device buffers); called once, when the tape is disposed or the output collected. */
  release?(saved: S): void;
  /**
   * The forward and the backward of one call run as one, for a caller that wants the inputs'
   * cotangents alone (Seam.vjp): no output is handed out, nor brought back from where the arm
   * computes. Its cotangents are the ones `backward` returns after `forward`, bit for bit.
   *
   * @param request The op's request.
   * @param inputs The inputs' values, in the op's order (undefined for an absent optional input).
   * @param cotangents The outputs' cotangents (null where none).
   */
  vjp?(
    request: R,
    inputs: readonly (Data | undefined)[],
    cotangents: readonly (Data | null)[],
  ): MaybePromise<(Data | null)[]>;
}

/** An arm that records the op on the tape from primitive ops, so the tape differentiates it. */
export interface CompositeArm<R> extends ArmBase<R> {
  /** Marks a composite arm. */
  readonly kind: "composite";
  /** Records the op and returns its outputs. */
  record(request: R, inputs: readonly (Tensor | undefined)[]): Tensor[];
}

/** One implementation of an op. */
export type SeamArm<R> = FusedArm<R> | CompositeArm<R>;

/** What an op tells its seam once. */
export interface SeamPolicy<R> {
  /** The op's name, for node names and messages. */
  op: string;
  /** The arms, fastest first; a declined arm falls back to the next one in this list. */
  arms: readonly SeamArm<R>[];
  /**
   * The arm a call runs when neither the caller nor the environment names one, with the reason to
   * record when the rule itself is worth telling (e.g. a software adapter), else null.
   */
  defaultArm(request: R, dtype: ComputeDType): MaybePromise<{ arm: string; note: string | null }>;
  /** The shapes of the outputs of a call. */
  outputShapes(request: R): number[][];
  /** Names of the environment variables the seam honours. */
  env: {
    /** Forces an arm for calls that name none; recorded as a decline. */
    force: string;
    /** Requires an arm: the default for calls that name none, and strict mode for every call. */
    require: string;
    /** "1" silences the once-per-process stderr warning of each distinct decline. */
    quiet: string;
  };
}

/** Options of one dispatch. */
export interface DispatchOptions {
  /** The arm to run; default: the policy's require variable, else its default rule. */
  arm?: string;
  /** Throw instead of declining; default: on when the require variable is set. */
  strict?: boolean;
  /** No stderr warning for a decline (the decision is still recorded). */
  quiet?: boolean;
}
