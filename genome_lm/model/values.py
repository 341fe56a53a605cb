"""`ValueSource`: where model code gets what it would read from tensor values. Fake tensors (the
rehearsal's) have none, so that becomes a stated assumption, set on the modules by `use_value_source`:
MoE / EP `routing`, DSA's `read_values` (its padding check) and KDA's `fla` kernels (`fake_fla.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.ops.kda._fla import FlaKernels
from genome_lm.model.ops.kda.conv import KDAShortConv
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.ops.moe.ep import AssumedRouting, ExpertParallelExperts


@dataclass(frozen=True)
class ValueSource:
    routing: AssumedRouting | None = None  # None: the router's choice
    read: bool = True  # run the checks that read data
    fla: FlaKernels | None = None  # None: KDA's kernels as configured; else the fla backend on these


def fake_values(imbalance: float = 1.0) -> ValueSource:
    """For fake tensors: `imbalance` x the mean expert rows here, no data checks, fla's fake stand-ins."""
    from genome_lm.model.ops.kda.fake_fla import FAKE_FLA

    return ValueSource(AssumedRouting(float(imbalance)), read=False, fla=FAKE_FLA)


def use_value_source(model: nn.Module, source: ValueSource) -> nn.Module:
    """Set `source` on every long-context module of `model` (in place, also after FSDP2); returns it."""
    for m in model.modules():
        if isinstance(m, (BlockedGlm5NextTextMoE, ExpertParallelExperts)):
            m.routing = source.routing
        elif isinstance(m, LongDSA):
            m.read_values = source.read
        elif isinstance(m, (LongKDA, KDAShortConv, KDAOutputNorm)) and source.fla is not None:
            m.backend, m.fla = "fla", source.fla
    return model


def has_values(t) -> bool:
    """False for a fake tensor (no data to read): the trainer reads losses, norms and counts where True."""
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(t)
