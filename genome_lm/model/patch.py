"""`apply_long_context`: install the long-context classes in place (parameter names kept), on the causal
LM or a bare `Glm5NextTextModel`. Each op of `settings.ops` swaps its upstream modules for a subclass;
`mlp` only dense layers' MLPs; `loss` sets `loss_chunk_tokens`. Applying again reconfigures them.
Fake tensors (the rehearsal's) have no values to read, so `use_fake_values` sets on those classes what is
assumed instead: MoE / EP `routing`, DSA's `read_values` (its padding check), KDA's `fla` (`fake_fla.py`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule

from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.hc import RecomputedHyperConnection
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.ops.kda.conv import KDAShortConv
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.ops.mlp import LeanMLP
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.ops.moe.ep import AssumedRouting, ExpertParallelExperts
from genome_lm.model.ops.norm import LeanRMSNorm
from genome_lm.model.upstream import glm, route_cpu_to_torch
from genome_lm.settings import DEFAULTS, LongContextSettings

log = logging.getLogger(__name__)


def apply_long_context(model: nn.Module, settings: LongContextSettings | None = None, **overrides) -> nn.Module:
    """Install the long-context classes in `model` (in place), return it; keywords override `settings` fields."""
    settings = dataclasses.replace(settings or DEFAULTS, **overrides)
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise TypeError("apply_long_context: install the long-context classes before recompute and FSDP2 "
                        "(genome_lm.train.parallelize applies them in order)")
    route_cpu_to_torch()
    classes: dict[str, tuple[type[LongContextModule], dict[str, Any]]] = {
        "kda": (LongKDA, {"chunk_size": settings.kda_chunk_size, "head_block": settings.kda_head_block,
                          "backend": settings.kda_backend}),
        "dsa": (LongDSA, {"block_queries": settings.dsa_block_queries}),
        "moe": (BlockedGlm5NextTextMoE, {"block_tokens": settings.moe_block_tokens,
                                         "recompute": settings.moe_recompute}),
        "hc": (RecomputedHyperConnection, {}),
        "norm": (LeanRMSNorm, {}),
    }
    if "mlp" in settings.ops:
        for m in model.modules():
            if isinstance(m, glm.Glm5NextTextDecoderLayer) and isinstance(m.mlp, LeanMLP.upstream):
                LeanMLP.install(m.mlp)
    for op in settings.ops:
        if op in classes:
            cls, kwargs = classes[op]
            for m in model.modules():
                if isinstance(m, cls.upstream):
                    cls.install(m, **kwargs)
    if "loss" in settings.ops and hasattr(model, "loss_chunk_tokens"):
        setattr(model, "loss_chunk_tokens", int(settings.loss_chunk_tokens))  # the causal LM's, not a submodule
    log.info("long context: %s", settings)
    return model


def use_fake_values(model: nn.Module, imbalance: float = 1.0) -> nn.Module:
    """For fake tensors, set on `model`'s long-context modules (in place, also after FSDP2): `imbalance` x
    the mean expert rows here, no data checks, fla's stand-ins."""
    from genome_lm.model.ops.kda.fake_fla import FAKE_FLA

    routing = AssumedRouting(float(imbalance))
    for m in model.modules():
        if isinstance(m, (BlockedGlm5NextTextMoE, ExpertParallelExperts)):
            m.routing = routing
        elif isinstance(m, LongDSA):
            m.read_values = False
        elif isinstance(m, (LongKDA, KDAShortConv, KDAOutputNorm)):
            m.backend, m.fla = "fla", FAKE_FLA
    return model


def has_values(t) -> bool:
    """False for a fake tensor (no data to read): the trainer reads losses, norms and counts where True."""
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(t)
