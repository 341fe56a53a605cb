"""Expert parallelism (EP): the routed experts of every MoE layer split over the ranks of an EP
group, tokens dispatched to their experts' ranks and combined back (`model/ops/moe/ep.py`).

    apply_expert_parallel(model, ep_mesh)   # after apply_long_context and CP, before recompute, FSDP2

`ep_mesh` is the 2-D ("edp", "ep") mesh of `ParallelContext.ep_mesh`: the EP groups are ranks
that are consecutive in the world (one node's GPUs when ep = GPUs per node). Each stacked expert
weight (`experts.gate_up_proj` [E, 2I, D], `experts.down_proj` [E, D, I]) becomes a DTensor
sharded on dim 0 over "ep" (global shape unchanged, so weight reading, DCP checkpoints and
`model/` export see [E, ...] and a run resumes on another ep), and FSDP2 shards each rank's
experts further over "edp" (`parallel.fsdp.apply_fsdp`, `expert_mesh`), whose ranks hold the
same experts and sum their gradients. The router, its bias and the shared experts stay as they
are: replicated by the EP wrapper, sharded by FSDP2 with the rest of the layer.
"""

from __future__ import annotations

from torch import nn

from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.ops.moe.ep import EPContext, ExpertParallelExperts
from genome_lm.parallel.mesh import check_expert_split

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def apply_expert_parallel(model: nn.Module, ep_mesh) -> EPContext | None:
    """Split the routed experts of every MoE layer of `model` over `ep_mesh["ep"]`, in place
    (meta or materialised). An EP group of one rank leaves the model as it is (returns None)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    mesh = ep_mesh["ep"]
    size = mesh.size()
    if size == 1:
        return None
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
    return ep
