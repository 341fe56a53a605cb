"""First-order step time per GPU: FLOPs at a stated efficiency, HBM traffic, link traffic.

    compute   GEMMs: 2 x active parameters per token forward, 4x backward, one more forward per
              recompute pass; KDA chunked core H·(4CK + C(K+V) + 2CV + 6KV) per token forward, 2x
              backward (twice under CP on torch); DSA indexer 2·HI·DI per query and visible pool (the
              last CP rank sets the pace); DSA sparse attention 4·W·R per query and head forward,
              10·W·R backward; LM head 8·D·V per token (logits rebuilt in backward)
    memory    DSA row gathers W·R·(2a + 8) bytes per query forward, + 24·W·R backward; every saved
              byte `elementwise_passes` times (+1 under per-layer recompute); hyper-connection and
              AdamW passes
    links     FSDP2 traffic hidden up to `fsdp_overlap`; CP all-gathers, the expert all-to-all and
              offload copies exposed
The busiest rank sets the pace: with ep > 1 its expert work is `expert_imbalance` x the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from genome_lm.plan import activations as act
from genome_lm.plan.hardware import Assumptions, Cluster
from genome_lm.plan.layout import Layout
from genome_lm.plan.memory import MASTER_BYTES, shard_degree, unsharded_layer_bytes
from genome_lm.plan.shapes import ModelShape


@dataclass
class TimePlan:
    step_time_s: float
    tokens_per_s: float
    parts_s: dict[str, float]  # what the step time is made of
    flops_per_step: float  # per GPU
    model_flops_per_token: float  # 6 x active parameters (the usual MFU yardstick)


def _link(cluster: Cluster, group: int, assume: Assumptions) -> float:
    """Per-GPU bandwidth of a collective over `group` ranks (NVLink inside a node, NICs across)."""
    if group <= cluster.gpus_per_node:
        return cluster.gpu.nvlink_bytes_per_s * assume.nvlink_efficiency
    return cluster.gpu.network_bytes_per_s * assume.network_efficiency


def _compute_parts(m: ModelShape, layout: Layout, assume: Assumptions, gpu, backend: str) -> tuple[dict, float]:
    """Seconds per micro-batch of each compute part (GEMMs, KDA core, DSA, memory-bound passes, loss,
    optimizer; the communication parts at 0.0) and the FLOPs counted."""
    n, a, T = layout.tokens, m.act_bytes, layout.train.micro_batch * layout.seq_len
    gemm = gpu.bf16_flops * assume.matmul_efficiency
    attn = gpu.bf16_flops * assume.attention_efficiency
    hbm = gpu.hbm_bytes_per_s * assume.hbm_efficiency
    layer_recompute = 1 if layout.memory.recompute == "per-layer" else 0
    parts = dict.fromkeys(("gemm", "kda_core", "dsa_indexer", "dsa_attention", "memory_bound", "loss",
                           "optimizer", "fsdp_exposed", "cp_comm", "expert_all_to_all", "offload_exposed"), 0.0)
    flops = 0.0
    for layer in m.layers:
        # non-expert and routed-expert parameters one token multiplies with in this layer (busiest rank)
        dense_p = layer.param_count - layer.expert_count
        expert_p = layer.expert_count * m.top_k / max(m.experts, 1) * (
            assume.expert_imbalance if layout.parallel.ep > 1 else 1)
        attn_wrapped = layout.wraps(layer.attn) or layer_recompute
        mlp_wrapped = layout.wraps(layer.mlp) or layer_recompute
        moe_passes = 3 + mlp_wrapped + (1 if layer.mlp == "moe" and layout.memory.moe_recompute else 0)
        f = 2 * n * (dense_p * (3 + attn_wrapped) + expert_p * moe_passes)
        parts["gemm"] += f / gemm
        flops += f
        if layer.attn == "kda":
            H, K, C = m.kda_heads, m.kda_head_dim, layout.kda_chunk
            runs = 2 if layout.parallel.cp > 1 and backend != "fla" else 1  # torch CP: the affine map is a second pass
            f = runs * n * H * (4 * C * K + 2 * C * K + 2 * C * K + 6 * K * K) * (3 + attn_wrapped)
            parts["kda_core"] += f / attn
        else:
            _, W = m.selected_per_query(T)
            R, H = m.kv_lora, m.dsa_heads
            if layer.indexer == "full":
                # blocks score the pools complete before them: on the last CP rank (the slowest)
                # on average a fraction 1 - 1/(2 cp) of the P = T/kpool pools
                P = T // m.index_kpool * (1 - 1 / (2 * layout.parallel.cp))
                f_idx = 2 * n * m.index_heads * (m.index_dim + 1) * P * (1 + attn_wrapped)
                parts["dsa_indexer"] += f_idx / attn
                flops += f_idx
            f = n * H * W * R * (4 * (1 + attn_wrapped) + 10)
            gather = n * W * R * ((2 * a + 8) * (1 + attn_wrapped) + (2 * a + 8 + 24))
            parts["dsa_attention"] += max(f / attn, gather / hbm)
        flops += f
        saved = sum(act.layer_body(m, layer, layout, backend, assume.expert_imbalance).values())
        hc = 2 * n * 6 * 4 * m.S * m.D * (3 + layer_recompute)
        # recompute: +1 write
        parts["memory_bound"] += ((assume.elementwise_passes + layer_recompute) * saved + hc) / hbm
    parts["loss"] = max(8 * n * m.D * m.V / gemm, n * m.V * (3 * a + 24) / hbm)
    flops += 8 * n * m.D * m.V
    F = shard_degree(layout, assume)
    # read and write the float32 master weights and the moments, read the gradient, a temporary
    parts["optimizer"] = (6 * MASTER_BYTES + 4 * layout.state_bytes + 2 * MASTER_BYTES) * m.param_count / F / hbm
    return parts, flops


def plan_time(m: ModelShape, layout: Layout, assume: Assumptions, cluster: Cluster, backend: str) -> TimePlan:
    """The step time: the compute parts per micro-batch, then what communication adds beyond what overlaps
    them (FSDP2, CP, EP all-to-all, offload copies)."""
    parts, flops = _compute_parts(m, layout, assume, cluster.gpu, backend)
    compute = sum(parts.values())
    gpu, n, a, T = cluster.gpu, layout.tokens, m.act_bytes, layout.train.micro_batch * layout.seq_len
    layer_recompute = 1 if layout.memory.recompute == "per-layer" else 0
    F, accum = shard_degree(layout, assume), layout.train.grad_accum
    # FSDP2's all-gathers and reduce-scatters (none on one GPU: F - 1 = 0)
    per_layer = sum(unsharded_layer_bytes(lay, layout) for lay in m.layers) + m.root_param_bytes
    fsdp = per_layer * (2 + layout.reduce_bytes / a) * (F - 1) / F * accum / _link(cluster, F, assume)
    parts["fsdp_exposed"] = max(0.0, fsdp - assume.fsdp_overlap * compute * accum) / accum
    if layout.parallel.cp > 1:
        bw = _link(cluster, layout.parallel.cp, assume)
        frac = (layout.parallel.cp - 1) / layout.parallel.cp
        n_dsa = sum(lay.attn == "dsa" for lay in m.layers)
        n_kda = m.n_layers - n_dsa
        # latent + index keys/gates gathered per forward pass; float32 latent gradients reduce-scattered
        dsa_bytes = T * (m.kv_lora + 2 * m.index_dim) * a * (1 + layer_recompute) + T * m.kv_lora * 4
        kda_bytes = layout.parallel.cp * m.kda_heads * m.kda_head_dim * 2 * m.kda_head_dim * 4 * (3 + layer_recompute)
        parts["cp_comm"] = (n_dsa * dsa_bytes * frac + n_kda * kda_bytes) / bw
    if layout.parallel.ep > 1:
        bw = _link(cluster, layout.parallel.ep, assume)
        rows = n * m.top_k * assume.expert_imbalance
        n_moe = sum(lay.mlp == "moe" for lay in m.layers)
        # dispatch + combine per forward pass (recomputes included), their gradients in backward
        transfers = 2 * (1 + layer_recompute + (1 if layout.memory.moe_recompute else 0)) + 2
        parts["expert_all_to_all"] = n_moe * rows * m.D * a * transfers / bw
    if layout.memory.offload_layer_inputs:
        link = gpu.host_link_bytes_per_s * assume.host_link_efficiency
        per_layer = act.layer_input(m, n) if layout.wraps("layer") else n * a * m.D
        offloaded = m.layers[:max(0, m.n_layers - layout.memory.offload_keep_last)]  # the last ones stay on the device
        wrapped = len(offloaded) if layout.wraps("layer") else sum(
            layout.wraps(lay.attn) + layout.wraps(lay.mlp) for lay in offloaded)
        copy = per_layer * wrapped / link
        forward_compute = compute / 3  # the forward is about a third of the work (backward = 2x forward)
        back = 0.0 if assume.offload_prefetch else copy
        parts["offload_exposed"] = back + max(0.0, copy - forward_compute)
    step = sum(parts.values()) * accum
    tokens = layout.dp * layout.train.micro_batch * layout.seq_len * accum
    active = m.counts.get("active", 0) - m.counts.get("embeddings", 0)
    return TimePlan(step_time_s=step, tokens_per_s=tokens / step,
                    parts_s={k: v * accum for k, v in parts.items()}, flops_per_step=flops * accum,
                    model_flops_per_token=6 * active)
