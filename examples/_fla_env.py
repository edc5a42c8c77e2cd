"""Makes flash-linear-attention (fla) importable and cheap to run once, before anything imports it.

Used by examples/candidate_from_torch.py and tests/fixtures/make_fla_fixtures.py. `prepare()` does
four things, each optional, and returns what it did (for a file's metadata):

1. einops. fla imports `einops` at module level in files that the KDA op and layer pull in. When no
   real einops can be found, `_shims/` (beside this file) goes on sys.path; its einops holds the two
   functions those files call. An installed einops is never shadowed.
2. Backend dispatch. Every `@dispatch`-decorated fla function first looks for an optional backend
   (flash_kda, tilelang, Ascend). With FLA_DISABLE_BACKEND_DISPATCH=1, read once when
   fla/ops/backends/__init__.py is imported, the decorator returns fla's own Triton function
   unchanged, so what runs is fla's reference kernels and nothing else is imported.
3. Autotuning. fla decorates its kernels with `triton.autotune` and with its own
   `fla_cache_autotune` (fla/ops/utils/cache.py), which builds a `CachedAutotuner` subclass of
   Triton's `Autotuner` directly, so replacing `triton.autotune` would miss those (the KDA gate,
   intra-chunk, WY, backward, l2norm and short-convolution kernels among them). Both kinds are
   `triton.runtime.autotuner.Autotuner` instances, so the cut is made on that class:
   `prune_configs` keeps whatever the kernel's own pruning keeps (key-dependent pruning stays) and
   then only its first config, so each kernel compiles once instead of once per config and is not
   benchmarked. `@triton.heuristics` are separate decorators and still run. If the kept config
   cannot compile on this GPU (out of shared memory or registers), `run` moves on to the next one.
   fla's other cache (FLA_CACHE_MODE with JSON configs per GPU) needs tuned files that fla does not
   ship, and Triton's on-disk autotune cache only helps a second run on the same machine.
4. Light import. fla/__init__.py imports fla.layers and fla.models (every layer, every model and
   the transformers integration), fla/ops/__init__.py every op and fla/layers/__init__.py every
   layer. The KDA files need none of that, and each extra module is one more chance to fail on a
   missing or newer package. So `fla`, `fla.ops` and `fla.layers` are registered as empty packages
   with fla's real folders as their search path; Python then runs only the modules that are asked
   for and what they import. fla.utils reads `fla.__version__` (fla/utils/_decorators.py), so the
   stand-in carries the version written in fla/__init__.py.

With that, `import fla.ops.kda` and `import fla.layers.kda` need only torch, triton, packaging and
einops (or the shim); causal_conv1d is tried and optional, and transformers is imported only
under TYPE_CHECKING.
"""

import importlib.machinery
import importlib.util
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIR = os.path.join(HERE, "_shims")

# The packages whose __init__ imports far more than the KDA files need (see 4. above).
HEAVY_PACKAGES = ("fla", "fla.ops", "fla.layers")

_autotune_choices = {}


def log(message):
    """One progress line with a timestamp, flushed at once so a remote runner's log shows it."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def available(name):
    """Whether a top-level module can be imported, without importing it."""
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def module_report(names=("torch", "triton", "numpy", "safetensors", "transformers", "einops",
                         "packaging", "fla", "causal_conv1d", "flash_kda", "tilelang")):
    """Which of the modules this work may touch can be found, and from where."""
    report = {}
    for name in names:
        spec = None
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            pass
        report[name] = None if spec is None else (spec.origin or "namespace package")
    return report


def use_einops_shim_if_missing():
    """Puts the einops stand-in on sys.path when no real einops exists; returns which one is used."""
    if available("einops"):
        return "installed"
    if SHIM_DIR not in sys.path:
        sys.path.append(SHIM_DIR)
    if not available("einops"):
        raise SystemExit(f"einops is missing and its stand-in was not found in {SHIM_DIR}")
    return "shim (examples/_shims/einops.py)"


def limit_autotuning(report=log):
    """Cuts every Triton autotuner to one config (see 3. in this module's docstring)."""
    try:
        from triton.runtime import autotuner
    except ImportError:
        return "triton is not installed: nothing to cut"
    Autotuner = autotuner.Autotuner
    if getattr(Autotuner, "_kda_one_config", False):
        return "first config (already in place)"

    # Errors that mean "this config cannot be built here" rather than "the kernel is wrong"; the
    # names moved between Triton versions, so each is looked up and skipped when absent.
    build_errors = []
    for module_name, names in (("triton.runtime.errors", ("OutOfResources", "PTXASError")),
                               ("triton.compiler.errors", ("CompileTimeAssertionFailure",))):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        build_errors.extend(getattr(module, n) for n in names if hasattr(module, n))
    build_errors = tuple(build_errors) or (RuntimeError,)

    original_prune = Autotuner.prune_configs
    original_run = Autotuner.run

    def kernel_name(tuner):
        fn = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
        return getattr(fn, "__name__", repr(fn))

    def prune_to_one(self, *args, **kwargs):
        configs = list(original_prune(self, *args, **kwargs))
        index = getattr(self, "_kda_skip", 0)
        if index >= len(configs):
            raise RuntimeError(f"autotune cut: every config of {kernel_name(self)} failed to build")
        chosen = configs[index]
        _autotune_choices[kernel_name(self)] = {
            "configs": len(self.configs),
            "after_pruning": len(configs),
            "index": index,
            "chosen": str(chosen),
        }
        return [chosen]

    def run_next_on_build_error(self, *args, **kwargs):
        while True:
            try:
                return original_run(self, *args, **kwargs)
            except build_errors as error:
                index = getattr(self, "_kda_skip", 0) + 1
                if len(self.configs) <= 1 or index >= len(self.configs):
                    raise
                report(f"autotune cut: {kernel_name(self)} config #{index - 1} failed to build "
                       f"({type(error).__name__}: {str(error)[:120]}); trying #{index}")
                self._kda_skip = index
                self.cache.clear()

    Autotuner.prune_configs = prune_to_one
    Autotuner.run = run_next_on_build_error
    Autotuner._kda_one_config = True
    return "first config"


def autotune_choices():
    """The config each cut autotuner ran with, by kernel name."""
    return dict(_autotune_choices)


def _fla_version(init_path):
    with open(init_path, encoding="utf-8") as f:
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    if found is None:
        raise SystemExit(f"cannot find __version__ in {init_path}: is this flash-linear-attention?")
    return found.group(1)


def light_import():
    """Registers stand-ins for fla's heavy package modules (see 4. in this module's docstring)."""
    if "fla" in sys.modules:
        return "skipped: fla was already imported"
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "cannot find the fla package (flash-linear-attention): put the folder that holds fla/ "
            "on PYTHONPATH (e.g. PYTHONPATH=.fla) or pip install flash-linear-attention")
    root = list(spec.submodule_search_locations)[0]
    for name in HEAVY_PACKAGES:
        folder = os.path.join(root, *name.split(".")[1:])
        if not os.path.isfile(os.path.join(folder, "__init__.py")):
            raise SystemExit(f"fla at {root} has no {name} package ({folder}/__init__.py)")
        stub_spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        stub_spec.submodule_search_locations = [folder]
        module = importlib.util.module_from_spec(stub_spec)
        module.__file__ = os.path.join(folder, "__init__.py")
        if name == "fla":
            module.__version__ = _fla_version(module.__file__)
        else:
            setattr(sys.modules[name.rsplit(".", 1)[0]], name.rsplit(".", 1)[1], module)
        sys.modules[name] = module
    return f"light (stand-ins for {', '.join(HEAVY_PACKAGES)}; fla {sys.modules['fla'].__version__} at {root})"


def prepare(one_config=True, light=True, disable_dispatch=True, report=log):
    """Everything above, in the order it must happen; call before importing fla."""
    done = {"einops": use_einops_shim_if_missing()}
    if disable_dispatch:
        os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    done["FLA_DISABLE_BACKEND_DISPATCH"] = os.environ.get("FLA_DISABLE_BACKEND_DISPATCH", "unset")
    done["autotune"] = limit_autotuning(report) if one_config else "full (Triton's own autotuning)"
    if light:
        done["fla_import"] = light_import()
    else:
        done["fla_import"] = "full (fla/__init__.py runs)"
        if done["einops"].startswith("shim"):
            report("warning: a full fla import with the einops stand-in will fail: modules outside "
                   "the KDA path import einops.reduce and einops.einsum, which it does not have")
    return done
