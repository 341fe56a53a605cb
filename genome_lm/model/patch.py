"""`apply_long_context(model, ...)`: swap in the long-context ops, in place, keeping parameter names.

Works on the causal LM from `build` or on a bare upstream `Glm5NextTextModel`:
    kda   every `Glm5NextTextLinearAttention` -> `ops.kda.patch_kda_module(module)`
    dsa   every `Glm5NextTextAttention` (and its indexer) -> `ops.dsa.patch_dsa_module(module,
          block_queries=...)`
    moe   every `Glm5NextTextMoE` -> `ops.moe.patch_moe_module(module, block_tokens=...)`
    hc    every `Glm5NextTextHyperConnection` -> `ops.hc.patch_hc_module(module)` (its
          intermediates are recomputed in backward instead of kept)
    loss  the causal LM's chunked LM head + loss uses `loss_chunk_tokens` tokens per chunk
An op whose package cannot be imported yet is skipped with a warning. What was applied is
recorded in `model.long_context_patches` (op -> its settings).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Callable, Iterable

from torch import nn

from genome_lm.model.ops.hc import patch_hc_module
from genome_lm.model.ops.moe import DEFAULT_BLOCK_TOKENS, patch_moe_module
from genome_lm.model.upstream import (
    Glm5NextTextAttention,
    Glm5NextTextLinearAttention,
    Glm5NextTextMoE,
    glm,
    route_cpu_to_torch,
)

log = logging.getLogger(__name__)

ALL_OPS = ("kda", "dsa", "moe", "hc", "loss")
DEFAULT_DSA_BLOCK_QUERIES = 1024
DEFAULT_LOSS_CHUNK_TOKENS = 2048


def _import_patch(module_name: str, func_name: str) -> Callable | None:
    try:
        return getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        log.warning("long context: %s.%s is not available (%s); that op stays upstream's", module_name, func_name, e)
        return None


def _call(patch: Callable, module: nn.Module, **kwargs) -> None:
    """Call `patch(module, **kwargs)` with only the keyword arguments it accepts."""
    params = inspect.signature(patch).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    patch(module, **kwargs)


def apply_long_context(
    model: nn.Module,
    *,
    dsa_block_queries: int = DEFAULT_DSA_BLOCK_QUERIES,
    moe_block_tokens: int = DEFAULT_BLOCK_TOKENS,
    loss_chunk_tokens: int = DEFAULT_LOSS_CHUNK_TOKENS,
    kda_chunk_size: int = 64,
    moe_recompute: bool = True,
    ops: Iterable[str] = ALL_OPS,
) -> nn.Module:
    """Patch `model` in place for long sequences and return it.

    Args:
        dsa_block_queries: queries per block of the DSA indexer and sparse attention.
        moe_block_tokens: tokens per MoE block.
        loss_chunk_tokens: tokens per chunk of the LM head + cross-entropy.
        kda_chunk_size: chunk length of the chunked KDA op.
        moe_recompute: rebuild each MoE block's activations in backward (see `ops/moe/chunk.py`).
        ops: which of "kda", "dsa", "moe", "hc", "loss" to apply (default all).
    """
    ops = set(ops)
    if unknown := ops - set(ALL_OPS):
        raise ValueError(f"apply_long_context: unknown ops {sorted(unknown)}; choose from {ALL_OPS}")
    route_cpu_to_torch()
    applied = dict(getattr(model, "long_context_patches", None) or {})
    modules = list(model.modules())

    if "kda" in ops and (patch := _import_patch("genome_lm.model.ops.kda", "patch_kda_module")):
        for m in modules:
            if isinstance(m, Glm5NextTextLinearAttention):
                _call(patch, m, chunk_size=kda_chunk_size)
        applied["kda"] = {"chunk_size": kda_chunk_size}
    if "dsa" in ops and (patch := _import_patch("genome_lm.model.ops.dsa", "patch_dsa_module")):
        for m in modules:
            if isinstance(m, Glm5NextTextAttention):
                _call(patch, m, block_queries=dsa_block_queries)
        applied["dsa"] = {"block_queries": dsa_block_queries}
    if "moe" in ops:
        for m in modules:
            if isinstance(m, Glm5NextTextMoE):
                patch_moe_module(m, block_tokens=moe_block_tokens, recompute=moe_recompute)
        applied["moe"] = {"block_tokens": moe_block_tokens, "recompute": moe_recompute}
    if "hc" in ops:
        for m in modules:
            if isinstance(m, glm.Glm5NextTextHyperConnection):
                patch_hc_module(m)
        applied["hc"] = {"recompute": True}
    if "loss" in ops and hasattr(model, "loss_chunk_tokens"):
        model.loss_chunk_tokens = int(loss_chunk_tokens)
        applied["loss"] = {"chunk_tokens": int(loss_chunk_tokens)}
    model.long_context_patches = applied
    log.info("long context patches: %s", applied)
    return model
