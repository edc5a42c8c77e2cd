// The bench scripts and the fuzz refuse what they would otherwise ignore: a misspelt flag, a flag
// in the space form they do not read, a count that is not one, before they start a default run of
// hours (bench/_args.ts; tests/fuzz.ts).

import assert from "node:assert/strict";

async function run(args: string[]): Promise<{ code: number; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-env", "--allow-read", ...args],
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code: out.code, stderr: new TextDecoder().decode(out.stderr) };
}

Deno.test("bench scripts and the fuzz exit 2 naming a flag they do not take, before any work", async () => {
  const cases: [string[], RegExp][] = [
    [
      ["bench/gpu.ts", "--quik"],
      /^bench:gpu: --quik is not a flag of this script: expected --runs=\.\.\./m,
    ],
    [
      ["bench/gpu.ts", "--kernels", "fused,split"],
      /^bench:gpu: --kernels takes its value after "=": write --kernels=\.\.\.$/m,
    ],
    [["bench/gpu.ts", "--runs=abc"], /^bench:gpu: --runs must be a positive integer: got abc$/m],
    [["bench/gpu.ts", "--runs=3,4"], /^bench:gpu: --runs must be a positive integer: got 3,4$/m],
    [["bench/gpu.ts", "--pool=-1"], /^bench:gpu: --pool must be a non-negative integer: got -1$/m],
    // --pool=0 (the pool off) passes the flag check: the bad --only after it is what is refused
    [
      ["bench/gpu.ts", "--pool=0", "--only=kernel"],
      /^bench:gpu: --only must be kernels or steps: got kernel$/m,
    ],
    [
      ["bench/gpu.ts", "--only=kernel"],
      /^bench:gpu: --only must be kernels or steps: got kernel$/m,
    ],
    [["bench/gpu.ts", "--quick=1"], /^bench:gpu: --quick takes no value: got --quick=1$/m],
    [
      ["bench/decode.ts", "--quick", "--batches=0"],
      /^bench:decode: --batches must be positive integers \(comma-separated\): got 0$/m,
    ],
    [
      ["bench/report.ts", "--dri=x"],
      /^bench:report: --dri=x is not a flag of this script: expected --dir=\.\.\.$/m,
    ],
    [
      ["bench/host_calls.ts", "1,2"],
      /^bench:host: Invalid shape: expected B,T,H,K,V as five positive integers, got 1,2$/m,
    ],
    [
      ["bench/host_calls.ts", "1,64,1,16,16", "nope"],
      /^bench:host: the kernel set \(second argument\) must be one of .*: got nope$/m,
    ],
    [
      ["bench/memory.ts", "--kernels=nope"],
      /^bench:memory: --kernels must be one of .*: got nope$/m,
    ],
    [["bench/memory.ts", "--kernel=split"], /^bench:memory: Unknown option '--kernel'/m],
    [["bench/ablate.ts", "--runs=0"], /^bench:ablate: --runs must be a positive integer: got 0$/m],
    [
      ["bench/ablate.ts", "1", "64", "1", "16", "48"],
      /^bench:ablate: Invalid C: expected one of 16, 32, 64, got 48$/m,
    ],
    [["tests/fuzz.ts", "--cases="], /^fuzz: --cases, .* must be non-negative integers/m],
    [["tests/fuzz.ts", "--bogus"], /^fuzz: Unknown option '--bogus'; usage: deno task fuzz/m],
  ];
  for (const [args, re] of cases) {
    const { code, stderr } = await run(args);
    assert.equal(code, 2, `${args.join(" ")}: ${stderr}`);
    assert.match(stderr, re, args.join(" "));
    // one line, no stack trace
    assert.equal(stderr.trim().split("\n").length, 1, `${args.join(" ")}: ${stderr}`);
  }
});
