"""A stand-in for `einops`, used only when the real package is not installed.

flash-linear-attention imports `rearrange` and `repeat` at module level in the files that
`fla.ops.kda` and `fla.layers.kda` pull in, so a machine without einops cannot even import them.
`examples/_fla_env.py` puts this folder on `sys.path` only after checking that no real `einops`
can be found, so an installed einops always wins.

Only what those files call is here: `rearrange(x, pattern, **sizes)` and `repeat(x, pattern,
**sizes)` on torch tensors, with patterns made of named axes, parenthesised groups, `...` (bare
on the left, bare or inside a group on the right) and numeric axes (`1` anywhere, larger numbers
as new axes of `repeat`). Anything else raises NotImplementedError rather than guessing.
"""

import math
import re

__version__ = "0.0-kda-shim"
__all__ = ["rearrange", "repeat"]

_TOKEN = re.compile(r"\.\.\.|\(|\)|[A-Za-z_][A-Za-z0-9_]*|\d+")


def _groups(side, pattern):
    """One side of a pattern as a list of groups; a bare axis (or bare '...') is a group of one."""
    groups, current = [], None
    rest = _TOKEN.sub("", side).strip()
    if rest:
        raise NotImplementedError(f"einops shim: cannot read {rest!r} in pattern {pattern!r}")
    for token in _TOKEN.findall(side):
        if token == "(":
            if current is not None:
                raise NotImplementedError(f"einops shim: nested groups in {pattern!r}")
            current = []
        elif token == ")":
            if current is None:
                raise ValueError(f"einops shim: unbalanced ')' in {pattern!r}")
            groups.append(("(", current))
            current = None
        elif current is not None:
            current.append(token)
        else:
            groups.append(("", [token]))
    if current is not None:
        raise ValueError(f"einops shim: unbalanced '(' in {pattern!r}")
    return groups


def _transform(x, pattern, sizes, allow_new):
    if "->" not in pattern:
        raise ValueError(f"einops shim: pattern needs '->': {pattern!r}")
    left_side, right_side = pattern.split("->")
    left_groups, right = _groups(left_side, pattern), _groups(right_side, pattern)
    for kind, g in left_groups:
        if "..." in g and kind == "(":
            raise NotImplementedError(f"einops shim: '...' inside a group on the left of {pattern!r}")
    left = [g for _, g in left_groups]
    n_ellipsis = sum(g == ["..."] for g in left)
    if n_ellipsis > 1 or sum(a == "..." for _, g in right for a in g) != n_ellipsis:
        raise ValueError(f"einops shim: '...' must appear once on each side or not at all: {pattern!r}")
    named = len(left) - n_ellipsis
    if x.dim() < named or (n_ellipsis == 0 and x.dim() != named):
        raise ValueError(f"einops shim: pattern {pattern!r} does not fit a tensor of shape {tuple(x.shape)}")
    ellipsis_dims = x.dim() - named

    # Bind every elementary axis of the left side to a size, solving at most one unknown per group.
    known = dict(sizes)
    elementary, elementary_sizes, dim = [], [], 0
    anonymous = 0
    for g in left:
        if g == ["..."]:
            for i in range(ellipsis_dims):
                elementary.append(f"...{i}")
                elementary_sizes.append(x.shape[dim])
                dim += 1
            continue
        size = x.shape[dim]
        dim += 1
        names = []
        for a in g:
            if a.isdigit():
                names.append((f"#{anonymous}", int(a)))
                anonymous += 1
            else:
                names.append((a, known.get(a)))
        unknown = [n for n, s in names if s is None]
        if len(unknown) > 1:
            raise ValueError(f"einops shim: cannot split {size} into {g} without sizes in {pattern!r}")
        product = math.prod(s for _, s in names if s is not None)
        if unknown:
            if product == 0 or size % product:
                raise ValueError(f"einops shim: {size} is not divisible by {product} in {pattern!r}")
            known[unknown[0]] = size // product
        elif product != size:
            raise ValueError(f"einops shim: axis of size {size} is not {g} = {product} in {pattern!r}")
        for n, s in names:
            elementary.append(n)
            elementary_sizes.append(known.get(n, s))
    y = x.reshape(elementary_sizes) if elementary_sizes else x.reshape(())

    # Right side, with the ellipsis expanded into the axes it stood for: a bare '...' keeps them
    # as separate axes, '(...)' merges them into one.
    out_groups = []
    for kind, g in right:
        if kind == "" and g == ["..."]:
            out_groups.extend([f"...{i}"] for i in range(ellipsis_dims))
            continue
        atoms = []
        for a in g:
            if a == "...":
                atoms.extend(f"...{i}" for i in range(ellipsis_dims))
            else:
                atoms.append(a)
        out_groups.append(atoms)
    out_atoms = [a for g in out_groups for a in g]
    present = {a for a in out_atoms if not a.isdigit()}
    if len(present) != len([a for a in out_atoms if not a.isdigit()]):
        raise ValueError(f"einops shim: an axis repeats on the right of {pattern!r}")

    # Left axes that vanish must have size 1 (e.g. 'd 1 w -> d w').
    keep = []
    for n, s in zip(elementary, elementary_sizes):
        if n in present:
            keep.append((n, s))
        elif s != 1:
            raise ValueError(f"einops shim: axis {n!r} of size {s} is dropped in {pattern!r}")
    y = y.reshape([s for _, s in keep]) if keep else y.reshape(())
    kept_sizes = dict(keep)
    kept_names = [n for n, _ in keep]
    order = [a for a in out_atoms if a in kept_sizes]
    y = y.permute([kept_names.index(a) for a in order]) if order else y

    # New axes: size 1 for rearrange, any size for repeat.
    final_sizes = []
    position = 0
    for a in out_atoms:
        if a in kept_sizes:
            final_sizes.append(kept_sizes[a])
            position += 1
            continue
        size = int(a) if a.isdigit() else known.get(a)
        if size is None:
            raise ValueError(f"einops shim: size of new axis {a!r} not given in {pattern!r}")
        if size != 1 and not allow_new:
            raise ValueError(f"einops shim: rearrange cannot create axis {a!r} of size {size}")
        if not a.isdigit() and not allow_new:
            raise ValueError(f"einops shim: rearrange cannot create named axis {a!r}")
        y = y.unsqueeze(position)
        final_sizes.append(size)
        position += 1
    if final_sizes and any(s != y.shape[i] for i, s in enumerate(final_sizes)):
        y = y.expand(final_sizes)
    out_sizes = dict(zip(out_atoms, final_sizes))
    return y.reshape([math.prod(out_sizes[a] for a in g) for g in out_groups])


def rearrange(tensor, pattern, **axes_lengths):
    """Reorders and regroups axes by an einops pattern, as einops.rearrange does for these cases."""
    return _transform(tensor, pattern, axes_lengths, allow_new=False)


def repeat(tensor, pattern, **axes_lengths):
    """Like rearrange, and may add new axes whose sizes come from the keywords or the pattern."""
    return _transform(tensor, pattern, axes_lengths, allow_new=True)
