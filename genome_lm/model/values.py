"""Where model code gets what it would read from tensor values. Fake tensors (the rehearsal's) have
none, so that becomes a stated assumption, set on the modules by `use_fake_values`: MoE / EP
`routing`, DSA's `read_values` (its padding check) and KDA's `fla` kernels (`fake_fla.py`)."""

from __future__ import annotations

from torch import nn

from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.ops.kda.conv import KDAShortConv
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.ops.moe.ep import AssumedRouting, ExpertParallelExperts


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
