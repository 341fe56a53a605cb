"""`ValueSource`: where model code gets what it would read from tensor values.

Fake tensors (the rehearsal's, `genome_lm.plan.rehearse`) have shapes but no data, so what the
model reads from data becomes a stated assumption, set by `use_value_source(model, source)` as
typed settings on the modules: MoE / EP `routing` (the router's choice, or an `AssumedRouting`),
DSA's `read_values` (its padding check) and KDA's `fla` kernels (fla's own, or the stand-ins of
`ops/kda/fake_fla.py` on the fla backend). `FROM_DATA` is every module's default.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.ops.kda._fla import FlaKernels
from genome_lm.model.ops.kda.conv import KDAShortConv
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.ops.moe.assumed import AssumedRouting
from genome_lm.model.ops.moe.ep import ExpertParallelExperts


@dataclass(frozen=True)
class ValueSource:
    routing: AssumedRouting | None = None  # None: the router's choice
    read: bool = True  # run the checks that read data
    fla: FlaKernels | None = None  # None: KDA's kernels as configured; else the fla backend on these


FROM_DATA = ValueSource()


def fake_values(imbalance: float = 1.0) -> ValueSource:
    """For fake tensors: this rank receives `imbalance` x the mean expert rows, no data checks, and
    KDA on fla's call contract with the fake stand-ins (`fake_fla.FAKE_FLA`)."""
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
    """False for a fake tensor (shape, dtype and device but no data to read), True otherwise: the
    trainer's step reads losses, norms and expert counts only where this holds."""
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(t)
