"""Scale-out (docs/parallel.md): context and expert parallelism (here), the process layout (`mesh`,
`layout`), FSDP2 (`fsdp`) and launching (`launch`); applied from `genome_lm.train.parallelize`.

Context parallelism: each sequence split into contiguous slabs over a CP group; every CP rank passes the
same full [B, T] batch, and the causal LM and long-context layers take the CP path once they hold the
group's `CPContext`. Expert parallelism: each stacked expert weight ([E, ...]) becomes a DTensor sharded on
dim 0 over "ep" (the global shape, so weights, DCP and `model/` see [E, ...] and a run resumes on another
ep), tokens dispatched by all-to-all (`model/ops/moe/ep.py`)."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from genome_lm.model.causal_lm import Glm5NextCausalLM
from genome_lm.model.cp import CPContext, slab_bounds
from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.ops.moe.ep import EPContext, ExpertParallelExperts
from genome_lm.model.upstream import Glm5NextTextAttention, Glm5NextTextLinearAttention
from genome_lm.parallel.mesh import check_expert_split

__all__ = ["CPContext", "apply_context_parallel", "apply_expert_parallel", "slab_bounds"]
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def apply_context_parallel(model: Glm5NextCausalLM, group=None) -> None:
    """Split every sequence over the ranks of `group` (default: the world), in place, after
    `apply_long_context`; a group of one rank leaves the model as it is."""
    if not hasattr(model, "lm_head"):
        raise TypeError("apply_context_parallel needs the causal LM from genome_lm.model.build")
    upstream = (Glm5NextTextLinearAttention, Glm5NextTextAttention)
    for m in model.modules():
        if isinstance(m, upstream) and not isinstance(m, (LongKDA, LongDSA)):
            raise RuntimeError(f"apply_context_parallel: apply_long_context first ({type(m).__name__} is upstream's)")
    size = dist.get_world_size(group)
    if size == 1:
        return
    cp = CPContext(group=group, rank=dist.get_rank(group), size=size)
    model.cp = cp
    for m in model.modules():
        if isinstance(m, (LongKDA, LongDSA)):
            m.cp = cp


def apply_expert_parallel(model: nn.Module, ep_mesh) -> None:
    """Split the routed experts of every MoE layer over `ep_mesh["ep"]`, in place (meta or materialised);
    an EP group of one rank leaves the model as it is."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    mesh = ep_mesh["ep"]
    size = mesh.size()
    if size == 1:
        return
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise RuntimeError("apply_expert_parallel: expert parallelism before FSDP2 (see train/parallelize.py)")
    ep = EPContext(group=mesh.get_group(), rank=mesh.get_local_rank(), size=size)
    layers = [m for m in model.modules() if isinstance(m, BlockedGlm5NextTextMoE)]
    if not layers and any(hasattr(m, "experts") for m in model.modules()):
        raise RuntimeError("apply_expert_parallel: apply_long_context first (the MoE layers are upstream's)")
    for moe in layers:
        experts = moe.experts
        n = experts.gate_up_proj.shape[0]
        check_expert_split(size, n)
        rows = slice(ep.rank * n // size, (ep.rank + 1) * n // size)
        for name in EXPERT_WEIGHTS:
            param = getattr(experts, name)
            local = param.detach()[rows].clone()  # a copy: the other ranks' experts are freed
            dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=param.shape,
                                    stride=param.stride())
            setattr(experts, name, nn.Parameter(dt, requires_grad=param.requires_grad))
        ExpertParallelExperts.install(experts, ep=ep)
        moe.ep = ep
