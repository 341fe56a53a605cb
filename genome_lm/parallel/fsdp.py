"""FSDP2 sharding of the causal LM over the dp x cp mesh (docs/parallel.md, docs/precision.md). Gradients
are reduced with a plain SUM of a loss the trainer normalises by the global number of scored tokens: the
gradient of the global mean whatever the split. FSDP2 needs one original dtype per parameter group, so each
module owning one of upstream's float32 exceptions becomes its own float32 group, and its other children one
compute-dtype group (only with a `compute_dtype`, or a model of mixed dtypes)."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from genome_lm.model.causal_lm import Glm5NextCausalLM
from genome_lm.model.weights.layout import keep_fp32


def fp32_modules(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each module under `root` that directly owns a parameter upstream keeps in float32."""
    found = []
    for name, module in root.named_modules():
        if any(keep_fp32(f"{name}.{p}") for p, _ in module.named_parameters(recurse=False)):
            found.append((name, module))
    return found


def to_master_dtype_(model: nn.Module) -> nn.Module:
    """Every floating parameter cast to float32 in place (the master weights). A DTensor parameter (EP experts)
    is replaced: assigning to its `.data` keeps its dtype."""
    from torch.distributed.tensor import DTensor

    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if not param.is_floating_point() or param.dtype == torch.float32:
                continue
            if isinstance(param, DTensor):
                setattr(module, name, nn.Parameter(param.detach().to(torch.float32), requires_grad=param.requires_grad))
            else:
                param.data = param.data.to(torch.float32)
    return model


def _policy(param_dtype: torch.dtype | None, cast_forward_inputs: bool = True, reduce_dtype=torch.float32):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                cast_forward_inputs=cast_forward_inputs)


def _shard_fp32_modules(layer: nn.Module, mesh, param_dtype: torch.dtype | None, reduce_dtype=torch.float32) -> None:
    """`fully_shard` the float32-owning modules of a decoder layer as float32 groups; their other
    sub-modules first, as one group gathered in `param_dtype`."""
    from torch.distributed.fsdp import fully_shard

    for _, module in fp32_modules(layer):
        inner = [child for _, child in module.named_children()
                 if any(True for _ in child.parameters()) and not fp32_modules(child)]
        if inner:
            fully_shard(inner, mesh=mesh, mp_policy=_policy(param_dtype, reduce_dtype=reduce_dtype))
        for param in module.parameters(recurse=False):  # e.g. a hyper-connection's bf16 `fn`
            if param.is_floating_point():
                param.data = param.data.to(torch.float32)
        # float32 as stored; inputs not cast: upstream's forward casts what it needs itself
        fully_shard(module, mesh=mesh, mp_policy=_policy(None, cast_forward_inputs=False))


def apply_fsdp(model: Glm5NextCausalLM, mesh, compute_dtype: torch.dtype | None = None,
               expert_mesh=None, reduce_dtype: torch.dtype = torch.float32, backward_prefetch: int = 1) -> None:
    """Shard `model` (after long-context ops, CP, EP and recompute) in place: every decoder layer, then the
    root. `compute_dtype`: what parameters are gathered in (None: as they are); `expert_mesh`: the "edp" mesh
    of the EP experts; `backward_prefetch`: layers each backward all-gathers ahead (0: none)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    param_dtype = None if compute_dtype in (None, torch.float32) else compute_dtype
    grouped = param_dtype is not None or len({p.dtype for p in model.parameters() if p.is_floating_point()}) > 1
    policy = _policy(param_dtype, reduce_dtype=reduce_dtype)
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
    from torch.distributed.tensor import DTensor

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
    if not shape:
        return 1
    rows = -(-shape[0] // world)
    return rows * math.prod(shape[1:])
