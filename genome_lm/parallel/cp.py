"""Context parallelism (CP): each sequence split into contiguous slabs, one per rank of a CP group.

    cp = apply_context_parallel(model, group)   # after apply_long_context (any order with recompute)
    out = model(input_ids, labels=input_ids)    # every CP rank passes the same full [B, T] batch

`apply_context_parallel` gives the causal LM and each long-context layer the group's `CPContext`
(`genome_lm.model.cp`), and they take the CP path themselves: the causal LM scores its slab (the
loss the mean over the whole sequence, gradients reduced with SUM by FSDP over dp x cp); `LongKDA`
composes the recurrent state across slabs from all-gathered affine maps (`ops/kda/cp.py`); `LongDSA`
all-gathers latent rows and index keys; everything else is token-local. No padding: results equal
one process for any T."""

from __future__ import annotations

import torch.distributed as dist

from genome_lm.model.causal_lm import Glm5NextCausalLM
from genome_lm.model.cp import CPContext, slab_bounds
from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.upstream import Glm5NextTextAttention, Glm5NextTextLinearAttention

__all__ = ["CPContext", "apply_context_parallel", "slab_bounds"]


def apply_context_parallel(model: Glm5NextCausalLM, group=None) -> CPContext | None:
    """Split every sequence over the ranks of `group` (default: the world), in place.

    `model` is the causal LM from `genome_lm.model.build` with `apply_long_context` applied. A
    group of one rank leaves the model as it is (returns None).
    """
    if not hasattr(model, "lm_head"):
        raise TypeError("apply_context_parallel needs the causal LM from genome_lm.model.build")
    upstream = (Glm5NextTextLinearAttention, Glm5NextTextAttention)
    for m in model.modules():
        if isinstance(m, upstream) and not isinstance(m, (LongKDA, LongDSA)):
            raise RuntimeError(f"apply_context_parallel: apply_long_context first ({type(m).__name__} is upstream's)")
    size = dist.get_world_size(group)
    if size == 1:
        return None
    cp = CPContext(group=group, rank=dist.get_rank(group), size=size)
    model.cp = cp
    for m in model.modules():
        if isinstance(m, (LongKDA, LongDSA)):
            m.cp = cp
    return cp
