"""Bytes autograd keeps for backward, per decoder layer and per part, read off the code.

Each function returns `{term: bytes}` for `n` tokens on one rank. The terms are the tensors the
forward of genome_lm's patched model saves (upstream decoder layer and hyper-connections,
`ops/kda`, `ops/dsa`, `ops/moe`), with `a` the activation dtype's bytes and float32 where the
code computes in float32. `tests/plan/test_activations.py` checks every part against the
storages autograd actually saves (saved-tensor hooks) on glm53-tiny in float32 and bfloat16.

Per token (S streams of width D):
- layer input   a·S·D (the residual streams; what per-layer recompute keeps or offloads)
- frame         mid stream a·S·D; two RMSNorm inputs 2·a·D (ops/norm: the input only, rstd
                recomputed); two hc combines (block output a·D, post a·S, comb a·S²); unpatched
                hyper-connections also keep a float32 copy and normalised copy of the streams and
                ~2·iters Sinkhorn [S, S] matrices (ops/hc recomputes them instead)
- KDA           masked input a·D, conv input a·3HK (ops/kda/conv.py: the input only), raw gate
                a·HK (ops/kda/gate.py: the gate applied inside the op), beta a·H, two low-rank gate
                projections 2·a·K, gated output norm input and gate 2·a·HK (ops/kda/norm.py),
                o_proj input a·HK, float32 copies of A_log and dt_bias per layer; torch op: q, k, v
                (the conv output) a·3HK and one [H, K, K] float32 state per 16-chunk segment; fla
                op: l2-normed q, k and a contiguous v 3·a·HK, their rstd 8·H, Aqk/Akk 2·a·H·C,
                the norm's rstd 4·H; under CP the torch op runs twice (+ zero values a·HK and o^M
                in float32 4·HK), fla's CP once
- DSA           input a·D; q LoRA norm input + normalised 2·a·ql; kv LoRA norm input a·R; latent
                a·R per *sequence* token (all-gathered under CP); q_nope copy a·H·DN; absorbed
                query and output 2·a·H·R; row LSE 4·H; o_proj input a·H·DV; selection int32 per
                query (kept by the attention's context, not by autograd)
- dense MLP     input a·D, gate and up projections 2·a·I (ops/mlp: clamps, silu and product rebuilt)
- MoE           input a·D; with moe_recompute nothing else (blocks rebuilt in backward); otherwise
                router (float32 input copy, sigmoid scores 4·E, group/top-k indices and masks),
                routed rows k·(2·a·D + 6·a·I + 28) and the shared expert 6·a·I
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
    if not hc_recompute:
        terms["hc_weights"] = n * 2 * hc_intermediates(m)
    return terms


def hc_intermediates(m: ModelShape) -> int:
    """Bytes per token upstream's hyper-connection keeps beyond its input and outputs."""
    a, S, D, it = m.act_bytes, m.S, m.D, m.sinkhorn_iters
    floats = (2 + S) * S + 3 * S + 2 * it * S * S + (2 * it - 1) * S  # logits, pre/post, Sinkhorn
    return (F32 * S * D if a != F32 else 0) + F32 * S * D + F32 + F32 * floats


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


def attention(m: ModelShape, layer: LayerShape, layout: Layout, backend: str) -> dict[str, int]:
    n = layout.tokens
    if layer.attn == "kda":
        return kda(m, n, backend, layout.kda_chunk, layout.parallel.cp)
    return dsa(m, n, layout.train.micro_batch * layout.seq_len, layer)


def mlp(m: ModelShape, layer: LayerShape, layout: Layout, imbalance: float) -> dict[str, int]:
    n = layout.tokens
    if layer.mlp == "dense":
        return dense_mlp(m, n)
    return moe(m, n, layout.memory.moe_recompute, moe_rows(m, n, layout, imbalance), layout.parallel.ep > 1)


def layer_body(m: ModelShape, layer: LayerShape, layout: Layout, backend: str, imbalance: float) -> dict[str, int]:
    """Everything one decoder layer saves without recompute, except its input streams."""
    terms = frame(m, layout.tokens, layout.hc_recompute)
    terms.update(attention(m, layer, layout, backend))
    terms.update(mlp(m, layer, layout, imbalance))
    return terms


def outside_layers(m: ModelShape, n: int) -> dict[str, int]:
    """Saved outside the decoder layers: input ids, final norm, final hidden, targets, log-sum-exp."""
    a, D = m.act_bytes, m.D
    return {"input_ids": n * 8, "final_norm": n * a * D, "final_hidden": n * a * D,
            "loss_targets": n * (8 + F32)}
