"""Scale-out (docs/parallel.md): context and expert parallelism and FSDP2 (here), the process layout (`mesh`)
and launching (`launch`); applied from `genome_lm.train.parallelize`. CP: contiguous slabs of each sequence
over a CP group, every CP rank passing the same full [B, T] batch. EP: each stacked expert weight [E, ...]
a DTensor sharded on dim 0 over "ep" with the global shape (so DCP and `model/` see [E, ...] and a run
resumes on another ep). FSDP2 (docs/precision.md) reduces gradients by a plain SUM of a loss normalised by
the global count of scored tokens, and needs one original dtype per parameter group: each module owning one
of upstream's float32 exceptions is a float32 group of its own."""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from genome_lm.model.causal_lm import Glm5NextCausalLM
from genome_lm.model.cp import CPContext, slab_bounds
from genome_lm.model.ops.dsa import LongDSA
from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.ops.moe.ep import EPContext, ExpertParallelExperts
from genome_lm.model.upstream import Glm5NextTextAttention, Glm5NextTextLinearAttention
from genome_lm.model.weights.layout import keep_fp32
from genome_lm.parallel.mesh import check_expert_split

__all__ = ["CPContext", "apply_context_parallel", "apply_expert_parallel", "slab_bounds"]


def apply_context_parallel(model: Glm5NextCausalLM, group=None) -> None:
    """Split every sequence over the ranks of `group` (default: the world; 2 or more), in place, after
    `apply_long_context`."""
    upstream = (Glm5NextTextLinearAttention, Glm5NextTextAttention)
    for m in model.modules():
        if isinstance(m, upstream) and not isinstance(m, (LongKDA, LongDSA)):
            raise RuntimeError(f"apply_context_parallel: apply_long_context first ({type(m).__name__} is upstream's)")
    cp = CPContext(group=group, rank=dist.get_rank(group), size=dist.get_world_size(group))
    model.cp = cp
    for m in model.modules():
        if isinstance(m, (LongKDA, LongDSA)):
            m.cp = cp


def apply_expert_parallel(model: nn.Module, ep_mesh) -> None:
    """Split the routed experts of every MoE layer over `ep_mesh["ep"]` (2 or more ranks), in place (meta or
    materialised)."""
    mesh = ep_mesh["ep"]
    size = mesh.size()
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
        for name in ("gate_up_proj", "down_proj"):
            param = getattr(experts, name)
            local = param.detach()[rows].clone()  # a copy: the other ranks' experts are freed
            dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=param.shape,
                                    stride=param.stride())
            setattr(experts, name, nn.Parameter(dt, requires_grad=param.requires_grad))
        ExpertParallelExperts.install(experts, ep=ep)
        moe.ep = ep


def fp32_modules(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each module under `root` that directly owns a parameter upstream keeps in float32."""
    return [(name, module) for name, module in root.named_modules()
            if any(keep_fp32(f"{name}.{p}") for p, _ in module.named_parameters(recurse=False))]


def to_master_dtype_(model: nn.Module) -> nn.Module:
    """Every floating parameter cast to float32 in place (the master weights). A DTensor parameter (EP experts)
    is replaced: assigning to its `.data` keeps its dtype."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if not param.is_floating_point() or param.dtype == torch.float32:
                continue
            if isinstance(param, DTensor):
                setattr(module, name, nn.Parameter(param.detach().to(torch.float32), requires_grad=param.requires_grad))
            else:
                param.data = param.data.to(torch.float32)
    return model


def _shard_fp32_modules(layer: nn.Module, mesh, param_dtype: torch.dtype | None, reduce_dtype=torch.float32) -> None:
    """`fully_shard` the float32-owning modules of a decoder layer as float32 groups; their other
    sub-modules first, as one group gathered in `param_dtype`."""
    for _, module in fp32_modules(layer):
        inner = [child for _, child in module.named_children()
                 if any(True for _ in child.parameters()) and not fp32_modules(child)]
        if inner:
            fully_shard(inner, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype, reduce_dtype))
        for param in module.parameters(recurse=False):  # e.g. a hyper-connection's bf16 `fn`
            if param.is_floating_point():
                param.data = param.data.to(torch.float32)
        # float32 as stored; inputs not cast: upstream's forward casts what it needs itself
        fully_shard(module, mesh=mesh,
                    mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32, cast_forward_inputs=False))


def apply_fsdp(model: Glm5NextCausalLM, mesh, compute_dtype: torch.dtype | None = None,
               expert_mesh=None, reduce_dtype: torch.dtype = torch.float32, backward_prefetch: int = 1) -> None:
    """Shard `model` (after long-context ops, CP, EP and recompute) in place: every decoder layer, then the
    root. `compute_dtype`: what parameters are gathered in (None: as they are); `expert_mesh`: the "edp" mesh
    of the EP experts; `backward_prefetch`: layers each backward all-gathers ahead (0: none)."""
    param_dtype = None if compute_dtype in (None, torch.float32) else compute_dtype
    grouped = param_dtype is not None or len({p.dtype for p in model.parameters() if p.is_floating_point()}) > 1
    policy = MixedPrecisionPolicy(param_dtype, reduce_dtype)
    layers = []  # the decoder layers, now FSDP modules
    for layer in model.model.layers:
        if expert_mesh is not None and getattr(layer.mlp, "ep", None) is not None:
            fully_shard(layer.get_submodule("mlp.experts"), mesh=expert_mesh, mp_policy=policy)
        if grouped:
            _shard_fp32_modules(layer, mesh, param_dtype, reduce_dtype)
        layers.append(fully_shard(layer, mesh=mesh, mp_policy=policy))
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if backward_prefetch != 1:  # backward runs the layers in reverse: layer i prefetches i-1, i-2, ...
        for i, sharded in enumerate(layers):
            sharded.set_modules_to_backward_prefetch(layers[max(0, i - backward_prefetch):i][::-1] or [sharded])
    for m in model.modules():
        if isinstance(m, FSDPModule):  # plain SUM (gloo has no PREMUL_SUM / AVG)
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def clip_grad_norm_(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip gradients to `max_norm` (inf: measure only); the global norm before clipping (DTensors too), 0-dim."""
    by_mesh: dict[object, list[torch.Tensor]] = {}  # EP experts live on another mesh than the rest
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    if not by_mesh:
        return torch.zeros(())
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None])  # all of them
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else norms[0]
    if math.isfinite(max_norm):
        for group in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def sharded_numel(shape: torch.Size | tuple[int, ...], world: int) -> int:
    """Elements one rank holds of a parameter FSDP2 shards on dim 0 over `world` ranks (padded)."""
    return -(-shape[0] // world) * math.prod(shape[1:]) if shape else 1
