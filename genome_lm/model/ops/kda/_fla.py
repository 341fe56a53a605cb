"""Access to `fla` (flash-linear-attention): which KDA backend a call uses, fla's kernels, its references.
A KDA kernel's `backend` (as fla's `mode`): `auto` (CUDA -> fla's Triton kernels, else the torch op),
`fla` (CPU needs TRITON_INTERPRET=1), `torch`. On CUDA fla is not optional: a missing or broken fla,
or one older than `MIN_FLA_CORE` (int64 offsets past 262,144 tokens at 64 x 128 heads, B200-safe
autotune), raises `GenomeLMError` naming the fix. fla is imported lazily (it needs Triton); its
torch references load from their source file; a module's `fla` (`FlaKernels`) names its functions."""

import functools
import importlib.metadata
import importlib.util
import os
import runpy
from collections.abc import Callable
from pathlib import Path

from packaging.version import Version

from genome_lm.errors import GenomeLMError
from genome_lm.settings import KDA_BACKENDS, KDABackend

GPU_EXTRA_FIX = "pip install -e '.[gpu]'"
TORCH_FIX = "memory.kda_backend: torch (eval: --kda-backend torch; any command: GENOME_LM_KDA_BACKEND=torch)"
MIN_FLA_CORE = "0.6.0"
# Triton reads TRITON_INTERPRET when it is imported, and so does this module, once
TRITON_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


# The functions a KDA call on the fla backend runs: fla's own (FLA, no pairs), or ("module.name", stand-in)
# pairs taking fla's arguments (the rehearsal's fakes, `fake_fla.FAKE_FLA`); immutable, so copies share it.
FlaKernels = tuple[tuple[str, Callable], ...]
FLA: FlaKernels = ()


def use_fla(device_type: str, backend: KDABackend, kernels: FlaKernels = FLA) -> bool:
    """Whether a KDA call with `backend` on tensors of `device_type` goes to fla (to `kernels`);
    `GenomeLMError` for fla's own kernels on CPU outside Triton's interpreter ("0 active drivers")."""
    if backend not in KDA_BACKENDS:
        raise ValueError(f"kda backend {backend!r}: use one of {', '.join(KDA_BACKENDS)}")
    if backend == "torch":
        return False
    if backend == "auto":
        return device_type == "cuda"
    if device_type == "cpu" and not TRITON_INTERPRETING and not kernels:
        raise GenomeLMError(
            "kda_backend fla with CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 before "
            "triton is imported (as `make test-interpret` does), or use kda_backend auto"
        )
    return True


@functools.cache
def _import_fla(module: str, name: str) -> tuple[Callable | None, str]:
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as exc:  # ImportError, or Triton/driver errors raised at import time
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return None, (f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__)
    return fn, ""


def fla_function(module: str, name: str, kernels: FlaKernels = FLA) -> Callable:
    """`module.name`: its stand-in in `kernels`, else fla's; `GenomeLMError` naming the fix when fla or its
    kernels do not import."""
    if stand_in := dict(kernels).get(f"{module}.{name}"):
        return stand_in
    fn, error = _import_fla(module, name)
    if fn is None:
        raise GenomeLMError(f"fla's kernels (flash-linear-attention) do not import ({error}); install them with "
                            f"`{GPU_EXTRA_FIX}`, or set {TORCH_FIX} for genome_lm's slower torch ops")
    try:
        version = importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:
        return fn  # fla from a source tree: nothing to compare
    if Version(version) < Version(MIN_FLA_CORE):
        raise GenomeLMError(
            f"fla-core {version} is installed; genome_lm's KDA on CUDA needs fla-core >= {MIN_FLA_CORE} "
            f"(int64 offsets past 262,144 tokens, the B200 backward fix; docs/parallel.md): `{GPU_EXTRA_FIX}`"
        )
    return fn


fla_chunk_kda = functools.partial(fla_function, "fla.ops.kda", "chunk_kda")
fla_causal_conv1d = functools.partial(fla_function, "fla.modules.causal_conv1d", "causal_conv1d")
fla_rms_norm_gated = functools.partial(fla_function, "fla.modules.norm.fused_norm_gate", "rms_norm_gated")


def load_fla_reference(relpath: str, name: str) -> Callable | None:
    """Function `name` of fla's source file `relpath` ("ops/kda/naive.py"), run alone so fla's `__init__`
    (and Triton) is never imported; None when fla, the file or `name` is absent."""
    spec = importlib.util.find_spec("fla")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relpath
    if not path.is_file():
        return None
    return runpy.run_path(str(path)).get(name)
