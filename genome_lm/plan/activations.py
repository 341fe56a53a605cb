"""Bytes autograd keeps for backward, per decoder layer and per part, read off the code.

Each function returns `{term: bytes}` for `n` tokens on one rank: the tensors the forward of
genome_lm's patched model saves (a the activation dtype's bytes, float32 where the code computes in
float32); `tests/plan/test_activations.py` checks every part against what autograd saves. Choices
of the code the terms follow: RMSNorm, the KDA conv and the dense MLP keep their inputs only (rstd,
conv output, clamps and silu rebuilt); the KDA gate is applied inside the op; ops/hc recomputes the
hyper-connection's float32 copies and Sinkhorn matrices that upstream's keeps; the DSA latent is kept
per *sequence* token (all-gathered under CP) and the selection by the attention's context; under CP
the torch KDA op runs twice (fla's once); with moe_recompute the MoE keeps only its input.
"""

from __future__ import annotations

from genome_lm.plan.layout import Layout
from genome_lm.plan.shapes import LayerShape, ModelShape

F32 = 4
KDA_SEGMENT_CHUNKS = 16  # ops/kda/chunk.py: chunks per checkpointed segment


def layer_input(m: ModelShape, n: int) -> int:
    """The residual streams entering a decoder layer, [n, S, D]."""
    return n * m.act_bytes * m.S * m.D


def frame(m: ModelShape, n: int, hc_recompute: bool) -> dict[str, int]:
    a, S, D = m.act_bytes, m.S, m.D
    terms = {
        "mid_stream": n * a * S * D,
        "norms": n * 2 * a * D,
        "hc_combine": n * 2 * (a * D + a * S + a * S * S),
    }
    if not hc_recompute:  # what upstream's hyper-connection keeps beyond its input and outputs, per token
        it = m.sinkhorn_iters
        floats = (2 + S) * S + 3 * S + 2 * it * S * S + (2 * it - 1) * S  # logits, pre/post, Sinkhorn
        terms["hc_weights"] = n * 2 * ((F32 * S * D if a != F32 else 0) + F32 * S * D + F32 + F32 * floats)
    return terms


def kda(m: ModelShape, n: int, backend: str, chunk: int = 64, cp: int = 1) -> dict[str, int]:
    """Under context parallelism (model/ops/kda/cp.py) the torch op runs twice per slab (ordinary run,
    and the slab's affine map with zero values of width K), and o^M is kept in float32 for the
    einsum; fla's own context parallelism (the fla backend, equal slabs) is one pass, nothing more."""
    a, D, H, K = m.act_bytes, m.D, m.kda_heads, m.kda_head_dim
    HK = H * K
    terms = {
        "kda_input": n * a * D,
        "kda_conv": n * a * 3 * HK,
        "kda_gates": n * (a * HK + a * H + 2 * a * K) + F32 * (H + HK),
        "kda_out_norm": n * 2 * a * HK,
        "kda_out_proj_in": n * a * HK,
    }
    if backend == "fla":
        terms["kda_op"] = n * (3 * a * HK + 8 * H + 2 * a * H * chunk + F32 * H)
    else:
        segments = -(-n // (KDA_SEGMENT_CHUNKS * chunk))
        terms["kda_qkv"] = n * a * 3 * HK
        terms["kda_op"] = segments * F32 * H * K * K
    if cp > 1 and backend != "fla":
        terms["kda_op"] *= 2
        terms["kda_cp_map"] = n * (a * HK + F32 * HK)  # zero values (saved by the op), o^M in float32
    return terms


def dsa(m: ModelShape, n: int, seq_tokens: int, layer: LayerShape) -> dict[str, int]:
    """`seq_tokens`: tokens of the whole sequence (the latent all-gathered over CP ranks)."""
    a, D, H, R, ql = m.act_bytes, m.D, m.dsa_heads, m.kv_lora, m.q_lora
    terms = {
        "dsa_input": n * a * D,
        "dsa_q_lora": n * 2 * a * ql,
        "dsa_kv_lora": n * a * R,
        "dsa_latent": seq_tokens * a * R,
        "dsa_queries": n * (a * H * m.qk_nope + 2 * a * H * R + F32 * H + a * H * m.v_head),
    }
    if layer.indexer == "full":  # a shared layer attends with the previous layer's selection object
        pools, _ = m.selected_per_query(seq_tokens)
        terms["dsa_selection"] = n * 4 * pools
    return terms


def dense_mlp(m: ModelShape, n: int) -> dict[str, int]:
    a = m.act_bytes
    return {"mlp_input": n * a * m.D, "mlp_act": n * 2 * a * m.dense_width}


def moe(m: ModelShape, n: int, recompute: bool, rows: int | None = None, ep: bool = False) -> dict[str, int]:
    """`rows`: token-expert pairs on this rank (n·k, times the imbalance under expert parallelism).
    `ep`: the experts run as `model/ops/moe/ep.py` runs them (expert parallelism)."""
    a, D, E, k, W = m.act_bytes, m.D, m.experts, m.top_k, m.moe_width
    terms = {"moe_input": n * a * D}
    if recompute:
        return terms
    rows = n * k if rows is None else rows
    router = (F32 * D if a != F32 else 0) + F32 * E + 16 * m.n_group + 8 * m.topk_group + E + 8 * k + F32 + F32 * k
    terms["moe_router"] = n * router
    if ep:  # per row received: the rows sorted by expert, the SwiGLU's five a·I and the down input, two
        # int64 permutations; per (token, expert) pair of the rank: the returned row, its weight, two int64 indices
        terms["moe_experts"] = rows * (a * D + 6 * a * W + 16) + n * k * (a * D + F32 + 16)
    else:
        terms["moe_experts"] = rows * (2 * a * D + 6 * a * W + 28)
    terms["moe_shared"] = n * 6 * a * m.shared_width
    return terms


def moe_rows(m: ModelShape, n: int, layout: Layout, imbalance: float) -> int:
    """Token-expert pairs the busiest rank computes: n·k, or imbalance·n·k with expert parallelism."""
    rows = n * m.top_k
    return int(rows * imbalance) if layout.parallel.ep > 1 else rows


def layer_body(m: ModelShape, layer: LayerShape, layout: Layout, backend: str, imbalance: float) -> dict[str, int]:
    """Everything one decoder layer saves without recompute, except its input streams."""
    n = layout.tokens
    terms = frame(m, n, layout.hc_recompute)
    if layer.attn == "kda":
        terms.update(kda(m, n, backend, layout.kda_chunk, layout.parallel.cp))
    else:
        terms.update(dsa(m, n, layout.train.micro_batch * layout.seq_len, layer))
    if layer.mlp == "dense":
        return terms | dense_mlp(m, n)
    return terms | moe(m, n, layout.memory.moe_recompute, moe_rows(m, n, layout, imbalance), layout.parallel.ep > 1)


def outside_layers(m: ModelShape, n: int) -> dict[str, int]:
    """Saved outside the decoder layers: input ids, final norm, final hidden, targets, log-sum-exp."""
    a, D = m.act_bytes, m.D
    return {"input_ids": n * 8, "final_norm": n * a * D, "final_hidden": n * a * D,
            "loss_targets": n * (8 + F32)}
