"""The card's own copy and read rates through PyTorch's CUDA kernels, beside bench/bandwidth_probe.ts.

The WGSL probe measures what a kernel moves through Deno's WebGPU; this one measures what the same
card moves through CUDA (torch's copy and sum kernels over the same 1 GiB by default), so that the
two side by side say how much of the card's rate WGSL reaches (bench/results/ANALYSIS.md).

Run: python3 bench/bandwidth_torch.py [MIB] [REP]
"""

import sys

import torch


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    rep = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    if mib < 1 or rep < 2:
        raise ValueError(f"Invalid arguments: expected MIB >= 1 and REP >= 2, got {mib}, {rep}")
    if not torch.cuda.is_available():
        raise RuntimeError("No CUDA device")
    n = mib * 2**20 // 4
    src = torch.arange(n, device="cuda", dtype=torch.float32).remainder_(1024)
    dst = torch.empty_like(src)
    out = torch.empty((), device="cuda", dtype=torch.float32)
    name = torch.cuda.get_device_name()
    runs = {
        "copy": (lambda: dst.copy_(src), 2 * n * 4),
        "read": (lambda: torch.sum(src, dim=0, out=out), n * 4),
        "write": (lambda: dst.fill_(1.0), n * 4),
    }
    for label, (fn, moved) in runs.items():
        for _ in range(3):
            fn()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(rep):
            fn()
        end.record()
        torch.cuda.synchronize()
        per = start.elapsed_time(end) / rep
        print(f"{name} (CUDA, torch {torch.__version__}): {label} of {mib} MiB: "
              f"{per:.3f} ms/kernel, {moved / per / 1e9:.2f} TB/s moved")
    if not torch.equal(dst, torch.ones_like(dst)):
        raise RuntimeError("write check failed")


if __name__ == "__main__":
    main()
