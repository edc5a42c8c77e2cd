// Workers that answer one message: started from source text (a blob URL, so that they need no
// module graph and no permission), terminated once they answer, fail or are told to stop, so that
// none outlives the request it served (a live worker keeps a process from exiting).

const urls = new Map<string, string>();

/**
 * Starts a worker on `source` (plain JavaScript that answers each message with one postMessage),
 * sends it `message`, and settles with its answer; the worker is terminated once it answers or
 * fails, or when `stop` is called (the answer then never settles).
 *
 * @param source The worker's code.
 * @param message What to send it (SharedArrayBuffers in it are shared, not copied).
 * @param name The worker's name, for messages and debuggers.
 * @returns The answer to come, and the stop.
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { askWorker } from "./_workers.ts";
 * const { answer } = askWorker<number>("self.onmessage = (e) => self.postMessage(e.data + 1);", 41, "example");
 * assert.equal(await answer, 42);
 * ```
 */
export function askWorker<T>(
  source: string,
  message: unknown,
  name: string,
): { answer: Promise<T>; stop(): void } {
  let url = urls.get(source);
  if (url === undefined) {
    url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
    urls.set(source, url);
  }
  const worker = new Worker(url, { type: "module", name });
  const answer = new Promise<T>((resolve, reject) => {
    worker.onmessage = (event: MessageEvent<T>) => {
      worker.terminate();
      resolve(event.data);
    };
    worker.onerror = (event: ErrorEvent) => {
      event.preventDefault();
      worker.terminate();
      reject(new Error(`${name}: a worker failed: ${event.message}`));
    };
  });
  worker.postMessage(message);
  return { answer, stop: () => worker.terminate() };
}
