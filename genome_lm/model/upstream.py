"""Access to upstream `transformers.models.glm5_next`, its CPU path kept on plain torch. Upstream binds
hub kernels to `KERNEL_FALLBACK_FUNCTIONS` at import (fla's Triton kernels cannot run on CPU), keeps its
torch code as `__wrapped__` and looks them up in its globals at call time: `route_cpu_to_torch` makes
each a dispatcher sending CPU tensors to the fallback, `use_torch_fallbacks` forces it (tests)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable
from unittest import mock

import torch

from genome_lm.model.contract import KERNEL_FALLBACK_FUNCTIONS, check_symbols

check_symbols()  # a transformers that does not match is one line, not an error inside a forward

from transformers.models.glm5_next import modeling_glm5_next as glm  # noqa: E402
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextConfig, Glm5NextTextConfig  # noqa: E402
from transformers.models.glm5_next.modeling_glm5_next import (  # noqa: E402
    Glm5NextTextAttention,
    Glm5NextTextExperts,
    Glm5NextTextLinearAttention,
    Glm5NextTextModel,
    Glm5NextTextMoE,
)

__all__ = ["glm", "Glm5NextConfig", "Glm5NextTextConfig", "Glm5NextTextModel", "Glm5NextTextAttention",
           "Glm5NextTextLinearAttention", "Glm5NextTextMoE", "Glm5NextTextExperts", "route_cpu_to_torch",
           "use_torch_fallbacks", "KEEP_IN_FP32"]

# Parameters upstream keeps in float32 even when the model is bf16/fp16 (substring match on names).
KEEP_IN_FP32 = tuple(glm.Glm5NextPreTrainedModel._keep_in_fp32_modules_strict)


def _cpu_to_torch(kernel_fn: Callable) -> Callable:
    fallback = inspect.unwrap(kernel_fn)

    @functools.wraps(fallback)
    def dispatch(*args, **kwargs):
        tensor = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
        if tensor is None or tensor.device.type == "cpu":
            return fallback(*args, **kwargs)
        return kernel_fn(*args, **kwargs)

    setattr(dispatch, "_genome_lm_dispatch", True)  # a mark on the function object
    return dispatch


def route_cpu_to_torch() -> None:
    """Install the CPU→torch dispatchers on upstream's module globals (idempotent; `build` calls it)."""
    for name in KERNEL_FALLBACK_FUNCTIONS:
        fn = getattr(glm, name)
        if not getattr(fn, "_genome_lm_dispatch", False):
            setattr(glm, name, _cpu_to_torch(fn))


def use_torch_fallbacks() -> contextlib.AbstractContextManager:
    """A context manager: upstream glm5_next runs its own torch implementations on every device."""
    return mock.patch.multiple(glm, **{name: inspect.unwrap(getattr(glm, name)) for name in KERNEL_FALLBACK_FUNCTIONS})
