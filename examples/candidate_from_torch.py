"""Write a candidate file for `deno task prove --candidate` from any chunk_kda-like function.

The file (safetensors) holds the inputs q, k, v, g, beta, h0, dout and dht, and the function's
results o, ht and the gradients dq, dk, dv, dg, dbeta, dh0, in flash-linear-attention's layouts
([B, T, H, K] and so on). The Deno side then runs its exact f64 reference on the same values:

    python examples/candidate_from_torch.py --impl fla.ops.kda:chunk_kda --dtype bf16 --out run.safetensors
    deno task prove --candidate run.safetensors --precision bf16 --svg run.svg

Without --impl the script uses its own plain recurrence in PyTorch (a correct, slow candidate).
Run it twice with the same --seed and compare the files (`--compare`) to test determinism.

The function is called as fn(q, k, v, g, beta, scale=K**-0.5, initial_state=h0,
output_final_state=True, cu_seqlens=...) and must return (o, final_state); g is the per-channel
log decay (<= 0), beta the write strength in (0, 1), and the output reads the state after the
update (docs/kda.md 2.1). Nothing else is passed, so fla's chunk_kda runs with its defaults: no
l2norm of q and k inside (k is drawn unit-norm here), g taken as log decays and beta as given.

What the file holds, with the dtype of each:
    q, k       [B, T, H, K]    --dtype
    v          [B, T, HV, V]   --dtype      (HV = H unless --hv)
    g          [B, T, HV, K]   --dtype
    beta       [B, T, HV]      --dtype
    h0, dht    [N, HV, K, V]   --state-dtype (f32 by default: fla's chunk_kda asserts that
                                initial_state is float32, and returns the final state in float32)
    dout       [B, T, HV, V]   --dtype
    cu_seqlens [N + 1]         --cu-seqlens-dtype (int64 by default, fla's LongTensor), only with
                                --cu-seqlens; then B = 1 and N is the number of sequences, else N = B
    o, ht, dq, dk, dv, dg, dbeta, dh0: exactly as the function returned them (fla: o and the input
    gradients in the input dtype, ht and dh0 in float32)
The checker reads every float dtype and widens it, so nothing is converted on the way out. When the
state is f32 but the inputs are bf16 or f16, h0 and dht are drawn at the input precision and then
widened: the checker's rounded reference run (checks/candidate.ts) rounds every input to the
claimed precision, and so it sees the same h0 and dht as the kernel did.

--hv HV writes grouped value heads (HV a multiple of H; value head j reads query/key head
j // (HV / H), docs/kda.md 2.5), which fla's chunk_kda supports (fla/ops/kda/chunk.py). Note that
checks/candidate.ts reads v, g and beta with q's head count, so it has to learn HV before it can
check such a file.

For an fla kernel (an --impl in the fla package) the script first calls examples/_fla_env.py:
fla's Triton autotuning is cut to one config per kernel (each first call otherwise benchmarks
every config, minutes per new shape; --full-autotune keeps it), fla's optional backends are
bypassed so its own Triton kernels run, and only the fla modules the kernel needs are imported
(--fla-import full runs fla/__init__.py instead). See that file for why each is safe.
"""

import argparse
import importlib
import json
import os
import sys

import torch

# _fla_env sits beside this file; the path line lets tests/fixtures/make_fla_fixtures.py import
# this file as a module too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fla_env  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
INDEX_DTYPES = {"int64": torch.int64, "int32": torch.int32}
INPUTS = ("q", "k", "v", "g", "beta", "h0")


def naive_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True,
              cu_seqlens=None):
    """The recurrence of docs/kda.md 2.1 (with 2.5's grouped value heads), token by token in f32,
    differentiable by autograd; like fla, it returns o in q's dtype and the state in float32."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    scale = K ** -0.5 if scale is None else scale
    starts = [0, T] if cu_seqlens is None else [int(c) for c in cu_seqlens.tolist()]
    outs = torch.zeros(B, T, HV, V, dtype=torch.float32, device=q.device)
    finals = []
    f32 = lambda x: x.float()  # noqa: E731
    heads = lambda x: f32(x).repeat_interleave(group, dim=0)  # noqa: E731  [H, K] -> [HV, K]
    for b in range(B):
        for n in range(len(starts) - 1):
            seq = n if cu_seqlens is not None else b
            S = (f32(initial_state[seq]) if initial_state is not None
                 else torch.zeros(HV, K, V, device=q.device))
            for t in range(starts[n], starts[n + 1]):
                S = S * torch.exp(f32(g[b, t]))[..., None]
                kt, vt = heads(k[b, t]), f32(v[b, t])
                pred = torch.einsum("hkv,hk->hv", S, kt)
                S = S + f32(beta[b, t])[:, None, None] * kt[..., None] * (vt - pred)[:, None, :]
                outs[b, t] = torch.einsum("hkv,hk->hv", S, heads(q[b, t]) * scale)
            finals.append(S)
    return outs.to(q.dtype), torch.stack(finals)


def make_problem(B=2, T=150, H=2, K=32, V=32, HV=None, seed=0, dtype="f32", device="cpu",
                 cu_seqlens=None, state_dtype="f32", cu_seqlens_dtype="int64"):
    """Seeded inputs and cotangents in fla's layouts (see the module docstring for shapes/dtypes).

    Returns a dict: `inputs` (leaf tensors that require grad, by name), `dout`, `dht`, `cu_seqlens`
    (a tensor on `device`, or None) and `dims` (the sizes and choices, for metadata)."""
    HV = H if HV is None else HV
    if HV < H or HV % H:
        raise SystemExit(f"--hv must be a multiple of H = {H} and at least H: got {HV}")
    if dtype not in DTYPES or state_dtype not in (*DTYPES, "input"):
        raise SystemExit(f"dtype must be one of {list(DTYPES)} and state dtype also 'input': "
                         f"got {dtype}, {state_dtype}")
    x_dtype = DTYPES[dtype]
    s_dtype = x_dtype if state_dtype == "input" else DTYPES[state_dtype]
    cu, N = None, B
    if cu_seqlens is not None:
        cu = torch.tensor([int(c) for c in cu_seqlens], dtype=INDEX_DTYPES[cu_seqlens_dtype])
        if B != 1 or cu[0] != 0 or cu[-1] != T or bool((cu[1:] <= cu[:-1]).any()):
            raise SystemExit(f"cu_seqlens must rise strictly from 0 to T = {T} with B = 1: got "
                             f"{cu.tolist()} with B = {B}")
        N = len(cu) - 1
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731

    def state(x):
        # Drawn at the input precision, then held in the state's dtype (module docstring).
        lowest = x_dtype if torch.finfo(x_dtype).bits < torch.finfo(s_dtype).bits else s_dtype
        return x.to(lowest).to(s_dtype)

    raw = {
        "q": randn(B, T, H, K),
        "k": torch.nn.functional.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, HV, V),
        "g": -torch.rand(B, T, HV, K, generator=gen) * 0.5,  # log decays in (-0.5, 0]
        "beta": torch.rand(B, T, HV, generator=gen) * 0.9 + 0.05,
        "h0": 0.5 * randn(N, HV, K, V),
    }
    inputs = {n: (state(x) if n == "h0" else x.to(x_dtype)).to(device).requires_grad_(True)
              for n, x in raw.items()}
    dout = randn(B, T, HV, V).to(x_dtype).to(device)
    dht = state(randn(N, HV, K, V)).to(device)
    dims = {"B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "N": N, "seed": seed,
            "dtype": dtype, "state_dtype": str(s_dtype).replace("torch.", ""),
            "cu_seqlens_dtype": cu_seqlens_dtype if cu is not None else None,
            "scale": K ** -0.5}
    return {"inputs": inputs, "dout": dout, "dht": dht,
            "cu_seqlens": None if cu is None else cu.to(device), "dims": dims}


def run_candidate(fn, problem):
    """Runs fn forward and backward on a problem; returns the file's tensors (on the CPU), by name.

    Fails with a message that names the problem when fn's results have the wrong form."""
    p, d = problem["inputs"], problem["dims"]
    result = fn(p["q"], p["k"], p["v"], p["g"], p["beta"], scale=d["scale"],
                initial_state=p["h0"], output_final_state=True, cu_seqlens=problem["cu_seqlens"])
    if not isinstance(result, (tuple, list)) or len(result) < 2:
        raise SystemExit(f"the impl must return (o, final_state): got {type(result).__name__}")
    o, ht = result[0], result[1]
    want_o = (d["B"], d["T"], d["HV"], d["V"])
    want_ht = (d["N"], d["HV"], d["K"], d["V"])
    if not torch.is_tensor(o) or tuple(o.shape) != want_o:
        raise SystemExit(f"o must have shape {list(want_o)}: got "
                         f"{list(o.shape) if torch.is_tensor(o) else type(o).__name__}")
    if not torch.is_tensor(ht) or tuple(ht.shape) != want_ht:
        raise SystemExit(f"the final state must have shape {list(want_ht)} (output_final_state="
                         f"True): got {list(ht.shape) if torch.is_tensor(ht) else ht!r}")
    torch.autograd.backward([o, ht], [problem["dout"], problem["dht"]])
    tensors = {n: x.detach() for n, x in p.items()}
    tensors.update(dout=problem["dout"], dht=problem["dht"], o=o.detach(), ht=ht.detach())
    for n in INPUTS:
        if p[n].grad is None:
            _fla_env.log(f"warning: the impl gave no gradient for {n}; the file holds no d{n}")
        else:
            tensors["d" + n] = p[n].grad
    if problem["cu_seqlens"] is not None:
        tensors["cu_seqlens"] = problem["cu_seqlens"]
    return {n: x.detach().contiguous().cpu() for n, x in tensors.items()}


def nonfinite(tensors):
    """Names of the float tensors holding a NaN or an infinity."""
    return [n for n, x in tensors.items() if x.is_floating_point() and not bool(torch.isfinite(x).all())]


def save_candidate(path, tensors, metadata):
    """Writes the tensors as they are, with every metadata value as a string (JSON where needed)."""
    from safetensors.torch import save_file

    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    save_file({n: x.contiguous() for n, x in tensors.items()}, path, metadata=meta)
    return os.path.getsize(path)


def describe(tensors):
    return ", ".join(f"{n} {str(x.dtype).replace('torch.', '')}{list(x.shape)}"
                     for n, x in sorted(tensors.items()))


def load_impl(spec, one_config=True, light=True):
    """The function named by 'module:function'; fla modules are prepared by _fla_env first."""
    if ":" not in spec:
        raise SystemExit(f"--impl must be module:function, e.g. fla.ops.kda:chunk_kda: got {spec}")
    module_name, name = spec.split(":", 1)
    env = {}
    if module_name.split(".")[0] == "fla":
        env = _fla_env.prepare(one_config=one_config, light=light)
    elif one_config:
        env = {"autotune": _fla_env.limit_autotuning()}
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemExit(f"cannot import {module_name} for --impl {spec}: {error!r}; modules "
                         f"found: {json.dumps(_fla_env.module_report())}") from error
    fn = getattr(module, name, None)
    if not callable(fn):
        raise SystemExit(f"{module_name} has no function {name} (--impl {spec})")
    return fn, env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", help="module:function of a chunk_kda-like kernel (default: naive)")
    p.add_argument("--out", default="candidate.safetensors")
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--T", type=int, default=150)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--hv", type=int, help="value heads HV, a multiple of H (default: H)")
    p.add_argument("--K", type=int, default=32)
    p.add_argument("--V", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=list(DTYPES), default="f32")
    p.add_argument("--state-dtype", choices=[*DTYPES, "input"], default="f32",
                   help="dtype of h0 and dht (default f32, as fla requires; 'input' = --dtype)")
    p.add_argument("--cu-seqlens", help="comma-separated offsets of a packed batch (B must be 1)")
    p.add_argument("--cu-seqlens-dtype", choices=list(INDEX_DTYPES), default="int64")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--full-autotune", action="store_true",
                   help="let Triton benchmark every config (default: the first config only)")
    p.add_argument("--fla-import", choices=["light", "full"], default="light",
                   help="import only the fla modules the kernel needs (default) or all of fla")
    a = p.parse_args(argv)

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {a.device} asked for, but torch {torch.__version__} sees no CUDA device")
    fn, env = naive_kda, {}
    if a.impl:
        fn, env = load_impl(a.impl, one_config=not a.full_autotune, light=a.fla_import == "light")
    problem = make_problem(
        B=a.B, T=a.T, H=a.H, K=a.K, V=a.V, HV=a.hv, seed=a.seed, dtype=a.dtype, device=a.device,
        cu_seqlens=a.cu_seqlens.split(",") if a.cu_seqlens else None,
        state_dtype=a.state_dtype, cu_seqlens_dtype=a.cu_seqlens_dtype)
    tensors = run_candidate(fn, problem)
    metadata = {"impl": a.impl or "naive", "dtype": a.dtype, "seed": str(a.seed),
                "dims": problem["dims"], "torch": torch.__version__, "device": a.device,
                "environment": env}
    if a.device.startswith("cuda"):
        metadata["device_name"] = torch.cuda.get_device_name()
    size = save_candidate(a.out, tensors, metadata)
    print(f"wrote {a.out} ({size} bytes): {describe(tensors)}", flush=True)
    bad = nonfinite(tensors)
    if bad:
        raise SystemExit(f"the file was written, but these hold NaN or infinity: {', '.join(bad)}")


if __name__ == "__main__":
    main()
