"""Write a candidate file for `deno task prove --candidate` from any chunk_kda-like function.

The file (safetensors) holds the inputs q, k, v, g, beta, h0, dout and dht, and the function's
results o, ht and the gradients dq, dk, dv, dg, dbeta, dh0, in flash-linear-attention's layouts
([B, T, H, K] and so on). The Deno side then runs its exact f64 reference on the same values:

    python examples/candidate_from_torch.py --impl fla.ops.kda:chunk_kda --dtype bf16 --out run.safetensors
    deno task prove --candidate run.safetensors --precision bf16 --svg run.svg

Without --impl the script uses its own plain recurrence in PyTorch (a correct, slow candidate).
Run it twice with the same --seed and compare the files (`--compare`) to test determinism.

The function is called as fn(q, k, v, g, beta, scale=..., initial_state=h0,
output_final_state=True, cu_seqlens=...) and must return (o, final_state); g is the per-channel
log decay (<= 0), beta the write strength in (0, 1), and the output reads the state after the
update (docs/kda.md 2.1).
"""

import argparse
import importlib

import torch
from safetensors.torch import save_file


def naive_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True,
              cu_seqlens=None):
    """The recurrence of docs/kda.md 2.1, token by token, differentiable by autograd."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    starts = [0, T] if cu_seqlens is None else cu_seqlens.tolist()
    batches = range(B)
    outs = torch.zeros(B, T, H, V, dtype=torch.float32, device=q.device)
    finals = []
    f32 = lambda x: x.float()
    for b in batches:
        for n in range(len(starts) - 1):
            seq = n if cu_seqlens is not None else b
            S = (f32(initial_state[seq]) if initial_state is not None
                 else torch.zeros(H, K, V, device=q.device))
            for t in range(starts[n], starts[n + 1]):
                S = S * torch.exp(f32(g[b, t]))[..., None]
                kt, vt = f32(k[b, t]), f32(v[b, t])
                pred = torch.einsum("hkv,hk->hv", S, kt)
                S = S + f32(beta[b, t])[:, None, None] * kt[..., None] * (vt - pred)[:, None, :]
                outs[b, t] = torch.einsum("hkv,hk->hv", S, f32(q[b, t]) * scale)
            finals.append(S)
    return outs.to(q.dtype), torch.stack(finals).to(q.dtype)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", help="module:function of a chunk_kda-like kernel (default: naive)")
    p.add_argument("--out", default="candidate.safetensors")
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--T", type=int, default=150)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--K", type=int, default=32)
    p.add_argument("--V", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="f32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cu-seqlens", help="comma-separated offsets of a packed batch (B must be 1)")
    a = p.parse_args()

    fn = naive_kda
    if a.impl:
        module, name = a.impl.split(":")
        fn = getattr(importlib.import_module(module), name)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    gen = torch.Generator().manual_seed(a.seed)
    randn = lambda *s: torch.randn(*s, generator=gen)
    B, T, H, K, V = a.B, a.T, a.H, a.K, a.V
    cu = None
    N = B
    if a.cu_seqlens:
        cu = torch.tensor([int(x) for x in a.cu_seqlens.split(",")], dtype=torch.int32)
        assert B == 1 and cu[0] == 0 and cu[-1] == T, "cu_seqlens must run from 0 to T with B = 1"
        N = len(cu) - 1
    k = torch.nn.functional.normalize(randn(B, T, H, K), dim=-1)
    inputs = {
        "q": randn(B, T, H, K),
        "k": k,
        "v": randn(B, T, H, V),
        "g": -torch.rand(B, T, H, K, generator=gen) * 0.5,  # log decays in (-0.5, 0]
        "beta": torch.rand(B, T, H, generator=gen) * 0.9 + 0.05,
        "h0": 0.5 * randn(N, H, K, V),
    }
    inputs = {n: x.to(dtype).to(a.device).requires_grad_(True) for n, x in inputs.items()}
    dout = randn(B, T, H, V).to(dtype).to(a.device)
    dht = randn(N, H, K, V).to(dtype).to(a.device)

    o, ht = fn(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
               scale=K ** -0.5, initial_state=inputs["h0"], output_final_state=True,
               cu_seqlens=None if cu is None else cu.to(a.device))
    torch.autograd.backward([o, ht], [dout, dht])

    tensors = {n: x.detach() for n, x in inputs.items()}
    tensors.update(dout=dout, dht=dht, o=o.detach(), ht=ht.detach())
    for n in ["q", "k", "v", "g", "beta", "h0"]:
        tensors["d" + n] = inputs[n].grad
    if cu is not None:
        tensors["cu_seqlens"] = cu
    save_file({n: x.contiguous().cpu() for n, x in tensors.items()}, a.out,
              metadata={"impl": a.impl or "naive", "dtype": a.dtype, "seed": str(a.seed)})
    print(f"wrote {a.out}: {', '.join(sorted(tensors))}")


if __name__ == "__main__":
    main()
