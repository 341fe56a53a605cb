"""One place that turns a single-device model into the one that trains, in a fixed order (as torchtitan's
`parallelize`): 1. the long-context classes; 2. context parallelism (cp > 1) and 3. expert parallelism
(ep > 1); 4. recompute, with layer-input offload; 5. FSDP2 (with a mesh; a bf16 model over float32 master
weights gathered in bf16). Out of order, 1 after 4 (with offload) or after 5, 3 or 4 after 5 raise an error
naming the order; 2 or 3 before 1 too."""

from __future__ import annotations

import logging

import torch
from torch import nn

from genome_lm.config import MemoryConfig
from genome_lm.model.causal_lm import Glm5NextCausalLM
from genome_lm.parallel.mesh import ParallelContext
from genome_lm.train.recompute import recompute

log = logging.getLogger(__name__)


def apply_recompute(model: Glm5NextCausalLM, memory: MemoryConfig) -> list[str]:
    """Recompute decoder layers (per-layer) or their attention / MLP sub-modules (selective); the names wrapped."""
    from torch.distributed.fsdp import FSDPModule

    if memory.recompute == "none":
        return []
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise RuntimeError("apply_recompute: recompute before FSDP2 shards the model (see train/parallelize.py)")
    targets, layers = {}, model.model.layers
    for i, layer in enumerate(layers):
        if memory.recompute == "per-layer":
            targets[f"layers.{i}"] = (i, layer)
            continue
        kinds = {"self_attn": "kda" if layer.block_type == "linear_attention" else "dsa",
                 "mlp": "moe" if hasattr(layer.mlp, "experts") else "dense"}
        for name, kind in kinds.items():
            if kind in memory.recompute_layers:
                targets[f"layers.{i}.{name}"] = (i, layer.get_submodule(name))
    for i, module in targets.values():  # the last offload_keep_last layers keep their inputs on the device
        recompute(module, offload=memory.offload_layer_inputs and i < len(layers) - memory.offload_keep_last)
    return list(targets)


def parallelize(model: Glm5NextCausalLM, memory: MemoryConfig, parallel: ParallelContext | None = None,
                compute_dtype: torch.dtype | None = None) -> nn.Module:
    """`model` made ready to train, in place. `compute_dtype`: bf16 for a bf16 model (needs a sharded
    `parallel`), None for the parameters' own."""
    from genome_lm.model import apply_long_context
    from genome_lm.parallel import apply_context_parallel, apply_expert_parallel
    from genome_lm.parallel.fsdp import apply_fsdp, to_master_dtype_

    if compute_dtype not in (None, torch.float32) and not (parallel is not None and parallel.sharded):
        raise ValueError("parallelize: a compute dtype needs FSDP2 (a sharded ParallelContext)")

    apply_long_context(model, dsa_block_queries=memory.dsa_block_queries, moe_block_tokens=memory.moe_block_tokens,
                       loss_chunk_tokens=memory.loss_chunk_tokens, moe_recompute=memory.moe_recompute,
                       kda_head_block=memory.kda_head_block, kda_backend=memory.kda_backend)
    if parallel is not None and parallel.cp > 1:
        apply_context_parallel(model, parallel.cp_group)
    ep_mesh = getattr(parallel, "ep_mesh", None)
    if ep_mesh is not None:
        apply_expert_parallel(model, ep_mesh)
    wrapped = apply_recompute(model, memory)
    if parallel is not None and parallel.sharded:
        if compute_dtype not in (None, torch.float32):
            to_master_dtype_(model)
        apply_fsdp(model, parallel.fsdp_mesh, compute_dtype=compute_dtype,
                   expert_mesh=ep_mesh["edp"] if ep_mesh is not None else None,
                   reduce_dtype=getattr(torch, parallel.reduce_dtype), backward_prefetch=parallel.backward_prefetch)
    log.info("memory strategy: recompute=%s%s, offload=%s, %d modules wrapped", memory.recompute,
             f" {memory.recompute_layers}" if memory.recompute == "selective" else "", memory.offload_layer_inputs,
             len(wrapped))
    return model
