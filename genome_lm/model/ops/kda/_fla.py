"""Access to `fla` (flash-linear-attention) without tripping over its Triton kernels.

`import fla` imports every Triton op and fails where Triton is missing; and with Triton
present but no GPU, its kernels fail on CPU tensors ("0 active drivers"). So:
- CUDA kernels are imported lazily and only used for CUDA tensors (`fla_chunk_kda`);
- pure-torch references are loaded straight from their source file (`load_fla_reference`),
  which needs only torch and einops.
"""

import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path


@functools.cache
def fla_chunk_kda() -> Callable | None:
    """`fla.ops.kda.chunk_kda` if fla and its Triton kernels import, else None."""
    try:
        from fla.ops.kda import chunk_kda
    except Exception:  # ImportError, or Triton/driver errors raised at import time
        return None
    return chunk_kda


def load_fla_reference(relpath: str, name: str) -> Callable | None:
    """Load function `name` from fla's source file `relpath` (e.g. "ops/kda/naive.py").

    The file is executed on its own, so fla's package `__init__` (and Triton) is never
    imported. Returns None when fla is not installed or the file/function is absent.
    """
    spec = importlib.util.find_spec("fla")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relpath
    if not path.is_file():
        return None
    mod_name = "_genome_lm_fla_ref_" + relpath.replace("/", "_").removesuffix(".py")
    mod_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return getattr(module, name, None)
