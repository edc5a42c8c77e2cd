// Reading GPU buffers back to the host in staging pieces of at most READ_PIECE_BYTES each.
//
// Why pieces: Deno's getMappedRange copies the mapped range into a new host allocation that lives
// until the buffer is unmapped. One staging buffer as large as the whole read therefore gets one
// fresh allocation of that size, and every page of it faults on first touch. When the pieces are
// small enough for the allocator to reuse its memory, the allocation freed by one piece's unmap is
// reused by the next piece. On the H200's host a 1 GiB readback took 1.86 s in one piece and 0.93 s
// in pieces of 8 MiB (bench/results/ANALYSIS.md, thirteenth pass). Every piece is mapped at once,
// so the pieces pay one of Deno's map waits, not one each. A read that fills a piece alone keeps
// that allocation as its result instead of copying it again (ownedRange, below).

import { createBuffer, destroyBuffer } from "./buffers.ts";

/** A piece of a buffer to read back to the host as f32 elements. */
export interface ReadPiece {
  /** The buffer. */
  buffer: GPUBuffer;
  /** Byte offset in it. */
  offset: number;
  /** Bytes (a multiple of 4). */
  bytes: number;
}

/**
 * Bytes of one staging piece. On the H200's host, pieces of 2 to 16 MiB read at the same rate and
 * pieces of 32 MiB or more at half of it (bench/readback_pieces.ts), which fits glibc's allocator:
 * once an allocation of a size has been freed it serves that size from its heap, up to 32 MiB.
 */
export const READ_PIECE_BYTES = 8 * 2 ** 20;

/** Makes a staging buffer (a BufferSet's `make`, or one the caller destroys itself). */
export type MakeStaging = (label: string, bytes: number, usage: number) => GPUBuffer;

/**
 * Staging buffers for a readback whose caller destroys them itself: `make` for stageReads and
 * `destroy` once the read is done (both counted, as every buffer of the package).
 *
 * @param device The device.
 * @returns The maker and the destroyer of its buffers.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { getContext } from "./device.ts";
 * import { gpuLiveBuffers } from "./buffers.ts";
 * import { ownStaging } from "./readback.ts";
 * const { device } = await getContext();
 * const before = gpuLiveBuffers();
 * const staging = ownStaging(device);
 * staging.make("example", 64, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST);
 * staging.destroy();
 * assert.equal(gpuLiveBuffers(), before);
 * ```
 */
export function ownStaging(device: GPUDevice): { make: MakeStaging; destroy(): void } {
  const made: GPUBuffer[] = [];
  return {
    make: (label, bytes, usage) => {
      const buffer = createBuffer(device, label, bytes, usage);
      made.push(buffer);
      return buffer;
    },
    destroy: () => {
      for (const buffer of made.splice(0)) destroyBuffer(buffer);
    },
  };
}

/** One part of a read in a staging piece, in bytes. */
export interface ReadPart {
  /** The read's index. */
  read: number;
  /** Where the part starts in the piece. */
  at: number;
  /** Where it starts in the read. */
  from: number;
  /** Its length. */
  bytes: number;
}

/** One staging piece and the parts of the reads it holds. */
interface Piece {
  buffer: GPUBuffer;
  bytes: number;
  parts: ReadPart[];
}

/**
 * The parts of each staging piece for reads of these sizes: the reads laid end to end and cut
 * every READ_PIECE_BYTES (a read may span pieces, a piece may hold parts of several reads).
 *
 * @param sizes The reads' sizes in bytes, in order.
 * @returns Each piece's parts.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { pieceLayout, READ_PIECE_BYTES } from "./readback.ts";
 * const pieces = pieceLayout([READ_PIECE_BYTES + 8, 4]);
 * assert.equal(pieces.length, 2);
 * assert.deepEqual(pieces[1], [
 *   { read: 0, at: 0, from: READ_PIECE_BYTES, bytes: 8 },
 *   { read: 1, at: 8, from: 0, bytes: 4 },
 * ]);
 * ```
 */
export function pieceLayout(sizes: readonly number[]): ReadPart[][] {
  const pieces: ReadPart[][] = [];
  let filled = READ_PIECE_BYTES;
  sizes.forEach((size, read) => {
    for (let from = 0; from < size;) {
      if (filled === READ_PIECE_BYTES) {
        pieces.push([]);
        filled = 0;
      }
      const bytes = Math.min(size - from, READ_PIECE_BYTES - filled);
      pieces[pieces.length - 1].push({ read, at: filled, from, bytes });
      filled += bytes;
      from += bytes;
    }
  });
  return pieces;
}

/** Reads staged for one submit: the copies into the pieces are encoded, the maps not yet asked. */
export interface StagedReads {
  /** Staging pieces. */
  readonly pieces: number;
  /** Maps every piece at once (after the submit that holds the copies). */
  map(): Promise<void>;
  /**
   * Copies the mapped pieces into one Float32Array per read, piece by piece, unmapping each as
   * soon as it is copied out (which frees Deno's copy of it for the next).
   *
   * @param into Arrays to copy into, for the first reads (each of its read's length; fresh_arrays.ts
   *   makes them with their pages already faulted in); the other reads get new arrays.
   */
  copyOut(into?: readonly Float32Array[]): Float32Array[];
  /**
   * Unmaps every piece still mapped or being mapped (after a failure), so that no staging buffer
   * goes back to the pool mapped.
   */
  unmapAll(): void;
}

/**
 * Encodes the copies of `reads` into staging pieces of at most READ_PIECE_BYTES (pieceLayout);
 * map them after the submit.
 *
 * @param make Makes each staging buffer (the caller destroys them).
 * @param encoder The encoder of the submit whose results are read.
 * @param reads What to read, in order.
 * @param label A label for the staging buffers.
 * @returns The staged reads.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { getContext } from "./device.ts";
 * import { ownStaging, stageReads } from "./readback.ts";
 * const { device } = await getContext();
 * const usage = GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
 * const source = device.createBuffer({ size: 16, usage });
 * device.queue.writeBuffer(source, 0, new Float32Array([1, 2, 3, 4]));
 * const staging = ownStaging(device);
 * const encoder = device.createCommandEncoder();
 * const read = { buffer: source, offset: 4, bytes: 8 };
 * const staged = stageReads(staging.make, encoder, [read], "example");
 * device.queue.submit([encoder.finish()]);
 * await staged.map();
 * assert.deepEqual([...staged.copyOut()[0]], [2, 3]);
 * staging.destroy();
 * source.destroy();
 * ```
 */
export function stageReads(
  make: MakeStaging,
  encoder: GPUCommandEncoder,
  reads: readonly ReadPiece[],
  label: string,
): StagedReads {
  const pieces: Piece[] = pieceLayout(reads.map((r) => r.bytes)).map((parts) => {
    const bytes = parts.reduce((n, p) => n + p.bytes, 0);
    const buffer = make(
      `${label} staging`,
      bytes,
      GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    );
    for (const { read, at, from, bytes } of parts) {
      encoder.copyBufferToBuffer(reads[read].buffer, reads[read].offset + from, buffer, at, bytes);
    }
    return { buffer, bytes, parts };
  });
  return {
    pieces: pieces.length,
    async map() {
      await Promise.all(pieces.map((p) => p.buffer.mapAsync(GPUMapMode.READ, 0, p.bytes)));
    },
    copyOut(into = []) {
      into.forEach((a, i) => {
        const n = reads[i].bytes / Float32Array.BYTES_PER_ELEMENT;
        if (a.length !== n) {
          throw new Error(`internal: read ${i} of ${n} floats was given an array of ${a.length}`);
        }
      });
      const out: (Float32Array | undefined)[] = reads.map((_, i) => into[i]);
      for (const p of pieces) {
        const mapped = p.buffer.getMappedRange(0, p.bytes);
        const [first] = p.parts;
        // a read that fills a piece alone, with no array given for it, takes the range itself
        const whole = p.parts.length === 1 && first.at === 0 && first.from === 0 &&
          first.bytes === reads[first.read].bytes && out[first.read] === undefined;
        const taken = whole ? ownedRange(mapped) : null;
        if (taken !== null) {
          out[first.read] = new Float32Array(taken);
        } else {
          for (const { read, at, from, bytes } of p.parts) {
            out[read] ??= new Float32Array(reads[read].bytes / Float32Array.BYTES_PER_ELEMENT);
            out[read].set(new Float32Array(mapped, at, bytes / 4), from / 4);
          }
        }
        p.buffer.unmap();
      }
      // a read of no bytes has no piece
      return out.map((a) => a ?? new Float32Array(0));
    },
    unmapAll() {
      unmapStaging(pieces.map((p) => p.buffer));
    },
  };
}

/**
 * The mapped range moved into an ArrayBuffer of the caller's, or null where the runtime will not
 * move it (then it is copied). Deno 2.9.6's getMappedRange already copies the mapped bytes into a
 * buffer of the JavaScript engine's own (so that no range points at mapped memory after an unmap
 * or a destroy), which its unmap detaches; transfer() moves that copy out without a second one.
 * The second copy, into a new array, took 5.5 of the 18.8 ms an 8 MiB read took on an H100's host
 * (bench/read_cost.ts, bench/results/ANALYSIS.md, twenty-third pass).
 */
function ownedRange(range: ArrayBuffer): ArrayBuffer | null {
  try {
    const moved = range.transfer();
    return range.byteLength === 0 ? moved : null;
  } catch {
    return null;
  }
}

// Unmaps the buffers that are mapped or being mapped (a pending map is then rejected).
function unmapStaging(buffers: readonly GPUBuffer[]): void {
  for (const buffer of buffers) {
    if (buffer.mapState === "unmapped") continue;
    try {
      buffer.unmap();
    } catch {
      // a cleanup after a failure (a lost device's buffer may refuse): the caller's error is the
      // one that reports it, and a lost device's buffers leave the pool anyway
    }
  }
}
