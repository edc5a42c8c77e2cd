// The GPU span of a run of compute passes by two timestamps (the first pass's start, the last
// one's end), shared by the synthetic probes (bench/occupancy.ts, bench/bandwidth_probe.ts).

/** Two timestamps around a run of passes, and their readback. */
export interface SpanTimer {
  /**
   * The descriptor of pass `i` of `n`: timestampWrites on the first and the last (WebGPU rejects
   * timestampWrites that name no index, and then nothing of the submit runs), none between.
   */
  pass(i: number, n: number): GPUComputePassDescriptor;
  /** Encodes the copy of the two timestamps to the readback buffer, after the last pass. */
  resolve(encoder: GPUCommandEncoder): void;
  /** After the submit: the span in milliseconds. */
  read(): Promise<number>;
}

/**
 * A span timer on a device created with timestamp-query.
 *
 * @param device The device.
 * @returns The timer (one run at a time).
 */
export function spanTimer(device: GPUDevice): SpanTimer {
  const querySet = device.createQuerySet({ type: "timestamp", count: 2 });
  const resolved = device.createBuffer({
    size: 16,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
  });
  const readback = device.createBuffer({
    size: 16,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  return {
    pass(i, n) {
      if (i !== 0 && i !== n - 1) return {};
      const timestampWrites: GPUComputePassTimestampWrites = { querySet };
      if (i === 0) timestampWrites.beginningOfPassWriteIndex = 0;
      if (i === n - 1) timestampWrites.endOfPassWriteIndex = 1;
      return { timestampWrites };
    },
    resolve(encoder) {
      encoder.resolveQuerySet(querySet, 0, 2, resolved, 0);
      encoder.copyBufferToBuffer(resolved, 0, readback, 0, 16);
    },
    async read() {
      await readback.mapAsync(GPUMapMode.READ);
      const [t0, t1] = new BigUint64Array(readback.getMappedRange().slice(0));
      readback.unmap();
      return Number(t1 - t0) / 1e6;
    },
  };
}
