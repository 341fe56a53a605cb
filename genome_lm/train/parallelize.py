"""One place that turns a single-device model into the one that trains, in a fixed order
(as torchtitan's `parallelize`):

  1. long-context ops with the configured block sizes (`apply_long_context`)
  2. context parallelism (`genome_lm.parallel.cp`): swaps the KDA / DSA forwards for their
     slab-wise versions and the LM forward for the slab split + group loss; it comes before
     recompute so that recomputed modules replay the CP version
  3. recompute (per decoder layer, or selected sub-modules), with layer-input offload
  4. FSDP2 sharding over the dp x cp mesh (`genome_lm.parallel.fsdp`), last, as torchtitan does
Steps 2 and 4 run only in a distributed launch (a `ParallelContext` with more than one rank).

Model code itself stays single-device and knows nothing of these.
"""

from __future__ import annotations

import logging

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


def parallelize(model: nn.Module, memory: MemoryConfig, parallel: ParallelContext | None = None) -> nn.Module:
    from genome_lm.model import apply_long_context
    from genome_lm.parallel.cp import apply_context_parallel
    from genome_lm.parallel.fsdp import apply_fsdp

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
    if parallel is not None and parallel.distributed:
        apply_fsdp(model, parallel.fsdp_mesh, parallel.device)
    model.memory_strategy = {
        "recompute": memory.recompute,
        "recompute_layers": memory.recompute_layers,
        "offload_layer_inputs": memory.offload_layer_inputs,
        "wrapped": len(wrapped),
        "block_sizes": {"moe_block_tokens": memory.moe_block_tokens, "dsa_block_queries": memory.dsa_block_queries,
                        "loss_chunk_tokens": memory.loss_chunk_tokens},
        "parallel": {"dp": parallel.dp, "cp": parallel.cp, "fsdp": parallel.distributed} if parallel else None,
    }
    log.info("memory strategy: recompute=%s%s, offload=%s, %d modules wrapped", memory.recompute,
             f" {memory.recompute_layers}" if memory.recompute == "selective" else "", memory.offload_layer_inputs,
             len(wrapped))
    return model
