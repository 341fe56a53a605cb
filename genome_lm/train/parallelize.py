"""One place that turns a single-device model into the one that trains, in a fixed order
(as torchtitan's `parallelize`):

  1. long-context ops with the configured block sizes (`apply_long_context`)
  2. context parallelism (`genome_lm.parallel.cp`): swaps the KDA / DSA forwards for their
     slab-wise versions and the LM forward for the slab split + group loss; it comes before
     recompute so that recomputed modules replay the CP version
  3. recompute (per decoder layer, or selected sub-modules), with layer-input offload
  4. FSDP2 sharding over the dp x cp mesh (`genome_lm.parallel.fsdp`), last, as torchtitan does;
     with `compute_dtype` (a bf16 model) the parameters are first made float32 master weights
     and FSDP2 gathers them in bf16 for compute (upstream's float32 exceptions in float32)
Step 2 runs only with cp > 1; step 4 with a mesh (`ParallelContext.sharded`: several ranks, or
one process training a bf16 model).

Model code itself stays single-device and knows nothing of these.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from genome_lm.config import MemoryConfig
from genome_lm.parallel.mesh import ParallelContext
from genome_lm.train.memory import checkpoint_module

log = logging.getLogger(__name__)


def _layer_kind(layer: nn.Module) -> tuple[str, str]:
    attn = "kda" if getattr(layer, "block_type", "") == "linear_attention" else "dsa"
    mlp = "moe" if type(layer.mlp).__name__.endswith("MoE") or hasattr(layer.mlp, "experts") else "dense"
    return attn, mlp


def apply_recompute(model: nn.Module, memory: MemoryConfig) -> list[str]:
    """Wrap decoder layers (per-layer) or their attention / MLP sub-modules (selective)."""
    wrapped = []
    if memory.recompute == "none":
        return wrapped
    for i, layer in enumerate(model.model.layers):
        if memory.recompute == "per-layer":
            checkpoint_module(layer, offload=memory.offload_layer_inputs)
            wrapped.append(f"layers.{i}")
            continue
        attn, mlp = _layer_kind(layer)
        if attn in memory.recompute_layers:
            checkpoint_module(layer.self_attn, offload=memory.offload_layer_inputs)
            wrapped.append(f"layers.{i}.self_attn")
        if mlp in memory.recompute_layers:
            checkpoint_module(layer.mlp, offload=memory.offload_layer_inputs)
            wrapped.append(f"layers.{i}.mlp")
    return wrapped


def parallelize(model: nn.Module, memory: MemoryConfig, parallel: ParallelContext | None = None,
                compute_dtype: torch.dtype | None = None) -> nn.Module:
    """`model` made ready to train, in place (see the module docstring for the order).
    `compute_dtype`: bf16 for a bf16 model (needs a sharded `parallel`), None to compute in the
    parameters' own dtype."""
    from genome_lm.model import apply_long_context
    from genome_lm.parallel.cp import apply_context_parallel
    from genome_lm.parallel.fsdp import apply_fsdp, to_master_dtype_

    if compute_dtype not in (None, torch.float32) and not (parallel is not None and parallel.sharded):
        raise ValueError("parallelize: a compute dtype needs FSDP2 (a sharded ParallelContext)")

    apply_long_context(
        model,
        dsa_block_queries=memory.dsa_block_queries,
        moe_block_tokens=memory.moe_block_tokens,
        loss_chunk_tokens=memory.loss_chunk_tokens,
        moe_recompute=memory.moe_recompute,
    )
    if parallel is not None and parallel.cp > 1:
        apply_context_parallel(model, parallel.cp_group)
    wrapped = apply_recompute(model, memory)
    if parallel is not None and parallel.sharded:
        if compute_dtype not in (None, torch.float32):
            to_master_dtype_(model)
        apply_fsdp(model, parallel.fsdp_mesh, parallel.device, compute_dtype=compute_dtype)
    log.info("memory strategy: recompute=%s%s, offload=%s, %d modules wrapped", memory.recompute,
             f" {memory.recompute_layers}" if memory.recompute == "selective" else "", memory.offload_layer_inputs,
             len(wrapped))
    return model
