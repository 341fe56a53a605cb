"""FSDP2 sharding of the causal LM over the dp x cp mesh, and what training needs around it.

`apply_fsdp(model, mesh, device)`: `fully_shard` every decoder layer, then the root (embeddings,
final norm, LM head). Parameters, gradients and optimizer state are sharded over all ranks of
the mesh; CP ranks hold the same parameters, so their gradients are reduced together with the
data-parallel ones. Reduction is a SUM (gradient divide factor 1): the trainer normalises the
loss by the global number of scored tokens, so the sum over ranks is the gradient of the global
mean, whatever the split over dp and cp.

Mixed precision: on GPU parameters are gathered in bf16 for compute, gradients reduced in fp32
(sharded master weights stay in the model's dtype); on CPU everything stays fp32.

`clip_grad_norm` handles sharded (DTensor) gradients. Sharded models are built on the meta device
and filled shard by shard (`parallel.materialize`); their Hugging Face-style weights directory is
written one gathered tensor at a time (`model.save_pretrained`), never as one full state dict.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def mixed_precision(device: torch.device):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: nn.Module, mesh, device: torch.device) -> nn.Module:
    """Shard `model` (the causal LM, after long-context ops, CP and recompute) in place."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mp = mixed_precision(device)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):  # plain SUM (gloo has no PREMUL_SUM / AVG)
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clip gradients to `max_norm` (inf: measure only); return the total norm before clipping.
    Works for plain and sharded (DTensor) parameters alike: the norm is the global one."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def sharded_numel(shape: torch.Size | tuple[int, ...], world: int) -> int:
    """Elements one rank holds of a parameter FSDP2 shards on dim 0 over `world` ranks (padded)."""
    if not shape:
        return 1
    rows = -(-shape[0] // world)
    return rows * math.prod(shape[1:])
