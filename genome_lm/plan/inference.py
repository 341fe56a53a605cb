"""Memory per GPU of a forward pass without gradients: what `genome-lm eval` and `score` need per rank.

`plan_forward` walks the forward layer by layer, as `memory.plan_memory` walks training's, keeping
nothing for backward: the FSDP2 shard of the weights, the root (embeddings, final norm, LM head)
gathered for the whole forward, the running and prefetched layers gathered, the residual streams in
and out, the largest op's tensors and transient, and at the end the LM head chunk and the gathered
per-token NLL. Layouts use `moe_recompute=True`: without autograd the MoE keeps no block's
activations beyond the block running.

`plan_score` (`genome-lm plan --score`) streams a region in chunks (`model/streaming.py`): one
chunk's forward, whose DSA layers attend to every token so far (its op counts the layer's cache once
more: `torch.cat`'s copy), plus what is carried between chunks (`carried_bytes`): the KDA state,
constant, and the DSA caches, linear in the tokens. With cp > 1 the region is one piece over the CP
ranks, as eval runs it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from genome_lm.config import MemoryConfig
from genome_lm.plan import activations as act
from genome_lm.plan.activations import F32, loss_transients, ops_by_layer
from genome_lm.plan.assumptions import Assumptions
from genome_lm.plan.layout import Layout
from genome_lm.plan.memory import _nograd_forward, shard_degree, unsharded_layer_bytes
from genome_lm.plan.shapes import ModelShape


@dataclass
class ForwardPlan:
    peak_bytes: int
    peak_where: str
    breakdown: dict[str, int]  # components of the peak, summing to peak_bytes
    weights_bytes: int  # this rank's shard of the parameters


def plan_forward(m: ModelShape, layout: Layout, assume: Assumptions | None = None, backend: str = "fla",
                 keys: int | None = None) -> ForwardPlan:
    """Peak bytes per rank of a no-grad forward of one piece of `layout.seq_len` tokens, split over
    `layout.parallel.cp` ranks, with FSDP2 over all `layout.gpus` ranks when > 1.
    `keys`: the tokens DSA attends to when more than the piece (a streaming chunk: the prefix too)."""
    assume = assume or Assumptions()
    layout.check()
    fsdp = layout.gpus > 1
    n = layout.tokens
    weights = m.param_bytes // shard_degree(layout, assume) if fsdp else m.param_bytes
    persistent = {"weights": weights}
    if fsdp:
        persistent["root_gathered"] = m.root_param_bytes
    prefetch = 1 + assume.fsdp_prefetch_layers
    ids = 2 * n * 8  # input ids and labels, int64
    phases: list[tuple[str, dict[str, int]]] = []
    for i, (lay, ops) in enumerate(zip(m.layers, ops_by_layer(m, layout, backend, assume.expert_imbalance, keys))):
        streams, op_bytes, op = _nograd_forward(ops, m, n)
        gathered = min(prefetch, m.n_layers - i) * unsharded_layer_bytes(lay, layout) if fsdp else 0
        phases.append((f"forward of layer {i} ({lay.kind}): {op}",
                       {**persistent, "layer_gathered": gathered, "streams": streams, "op": op_bytes,
                        "input_ids": ids}))
    outside = act.outside_layers(m, n)
    per_token = layout.train.micro_batch * layout.seq_len * (2 * F32 + 1)  # gathered NLL, shifted copy, mask
    phases.append(("LM head + per-token NLL", {**persistent, "final": outside["final_norm"] + outside["final_hidden"],
                                               "loss_chunk": loss_transients(m, layout)[0], "per_token_nll": per_token,
                                               "input_ids": ids}))
    where, parts = max(phases, key=lambda p: sum(p[1].values()))
    parts = {k: v for k, v in parts.items() if v}
    return ForwardPlan(sum(parts.values()), where, parts, weights)


def carried_bytes(m: ModelShape, tokens: int) -> dict[str, int]:
    """{"kda_state", "dsa_caches"}: bytes the streaming scorer carries after `tokens` tokens (batch 1)."""
    a, HK = m.act_bytes, m.kda_heads * m.kda_head_dim
    kda = HK * m.kda_head_dim * F32 + 3 * HK * m.kda_conv * a + 8
    return {"kda_state": sum(kda for lay in m.layers if lay.attn == "kda"),
            "dsa_caches": sum(tokens * a * (m.kv_lora + (2 * m.index_dim + 1 if lay.indexer == "full" else 0))
                              for lay in m.layers if lay.attn == "dsa")}


def plan_score(m: ModelShape, tokens: int, chunk: int, gpus: int = 1, cp: int = 1,
               assume: Assumptions | None = None, backend: str = "fla",
               memory: MemoryConfig | None = None) -> ForwardPlan:
    """Peak bytes per device of scoring a `tokens`-long region: streamed in chunks of `chunk` tokens
    (cp = 1; FSDP2 over `gpus` ranks when > 1), or as one piece over `cp` context-parallel ranks.
    `memory`: block sizes (default: the trainer's). Its breakdown: weights, kda_state, dsa_caches, activations."""
    base = Layout(tokens, memory.model_copy()) if memory else Layout(tokens)
    if cp > 1:
        plan = plan_forward(m, base.replace(cp=cp, dp=gpus // cp, moe_recompute=True), assume, backend)
        carried = {"kda_state": 0, "dsa_caches": 0}
    else:
        layout = base.replace(seq_len=min(chunk, tokens), dp=gpus, moe_recompute=True)
        plan = plan_forward(m, layout, assume, backend, keys=tokens)
        carried = carried_bytes(m, tokens)
    weights = sum(plan.breakdown.get(k, 0) for k in ("weights", "root_gathered", "layer_gathered"))
    parts = {"weights": weights, **carried, "activations": plan.peak_bytes - weights}
    return ForwardPlan(sum(parts.values()), plan.peak_where, parts, plan.weights_bytes)


def longest_region(m: ModelShape, chunk: int, limit: int, gpus: int = 1, cp: int = 1,
                   assume: Assumptions | None = None, backend: str = "fla", memory: MemoryConfig | None = None) -> int:
    """The most tokens (a multiple of `cp`, below 2^34) whose `plan_score` peak is at most `limit` bytes;
    0 when not even `chunk` tokens fit."""

    def too_big(k: int) -> bool:  # k: tokens in units of cp
        return plan_score(m, k * cp, chunk, gpus, cp, assume, backend, memory).peak_bytes > limit

    start = max(1, -(-min(chunk, 2**20) // cp))
    if too_big(start):
        return 0
    return (start + bisect.bisect_left(range(start + 1, 2**34 // cp), True, key=too_big)) * cp
