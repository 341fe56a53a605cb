"""Bytes autograd keeps for backward, per decoder layer and per part, and a decoder layer as an ordered
list of ops: what each saves and its transient peak, read off the code.

Each term function returns `{term: bytes}` for `n` tokens on one rank: the tensors the forward of
genome_lm's patched model saves (a the activation dtype's bytes, float32 where the code computes in
float32); `tests/plan/test_activations.py` checks every part against what autograd saves. Choices
of the code the terms follow: RMSNorm, the KDA conv and the dense MLP keep their inputs only (rstd,
conv output, clamps and silu rebuilt); the KDA gate is applied inside the op; ops/hc recomputes the
hyper-connection's float32 copies and Sinkhorn matrices that upstream's keeps; the DSA latent is kept
per *sequence* token (all-gathered under CP) and the selection by the attention's context; under CP
the torch KDA op runs twice (fla's once); with moe_recompute the MoE keeps only its input.

Each `Op` carries the bytes it saves for backward (those terms) and the extra bytes alive at its forward
and at its backward peak (intermediates rebuilt inside, gradients, block buffers), counted from each
op's code at its block size; `memory.py` walks the lists forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    """Under context parallelism (model/ops/kda/__init__.py) the torch op runs twice per slab (ordinary run,
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
        return terms
    terms["kda_qkv"] = n * a * 3 * HK
    terms["kda_op"] = -(-n // (KDA_SEGMENT_CHUNKS * chunk)) * F32 * H * K * K * (2 if cp > 1 else 1)
    if cp > 1:
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
    return {"mlp_input": n * m.act_bytes * m.D, "mlp_act": n * 2 * m.act_bytes * m.dense_width}


def moe(m: ModelShape, n: int, recompute: bool, rows: int, ep: bool) -> dict[str, int]:
    """`rows`: token-expert pairs on this rank (n·k, times the imbalance under expert parallelism).
    `ep`: the experts run as `model/ops/moe/ep.py` runs them (expert parallelism)."""
    a, D, E, k, W = m.act_bytes, m.D, m.experts, m.top_k, m.moe_width
    terms = {"moe_input": n * a * D}
    if recompute:
        return terms
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


@dataclass
class Op:
    name: str
    saved: dict[str, int] = field(default_factory=dict)
    fwd: int = 0  # extra bytes at the op's forward peak (beyond its saved tensors)
    bwd: int = 0  # extra bytes at the op's backward peak
    part: str = ""  # recompute unit it belongs to under selective recompute: kda | dsa | moe | dense

    @property
    def saved_bytes(self) -> int:
        return sum(self.saved.values())


HC_BLOCK, NORM_BLOCK, CONV_BLOCK, MLP_BLOCK = 4096, 8192, 2048, 8192  # tokens per block of the lean ops' temporaries


def hc_op(m: ModelShape, n: int, name: str, recompute: bool, saved: dict) -> Op:
    a, SD = m.act_bytes, m.S * m.D
    if recompute:
        blk = min(n, HC_BLOCK)
        return Op(name, saved, fwd=blk * 2 * F32 * SD, bwd=blk * 3 * F32 * SD + n * a * SD)
    return Op(name, saved, fwd=n * F32 * SD, bwd=n * (3 * F32 * SD + a * SD))


def norm_op(m: ModelShape, n: int, name: str) -> Op:
    D, blk = m.D, min(n, NORM_BLOCK)
    return Op(name, {name: n * m.act_bytes * D}, fwd=blk * 2 * F32 * D, bwd=blk * 3 * F32 * D + n * m.act_bytes * D)


def combine_op(m: ModelShape, n: int, name: str, extra: dict) -> Op:
    a, S, D = m.act_bytes, m.S, m.D
    saved = {name: n * (a * D + a * S + a * S * S)} | extra
    return Op(name, saved, fwd=n * 2 * a * S * D, bwd=n * 2 * a * S * D)


def kda_ops(m: ModelShape, layout: Layout, backend: str) -> list[Op]:
    n, a, H, K, C = layout.tokens, m.act_bytes, m.kda_heads, m.kda_head_dim, layout.kda_chunk
    t = kda(m, n, backend, C, layout.parallel.cp)
    HK = H * K
    cb, nb = min(n, CONV_BLOCK), min(n, NORM_BLOCK)
    proj = Op("kda_proj_conv", {k: t[k] for k in ("kda_input", "kda_conv", "kda_qkv", "kda_gates") if k in t},
              fwd=n * a * 3 * HK + cb * 2 * F32 * 3 * HK, bwd=cb * 2 * F32 * 3 * HK + n * (2 * a * 3 * HK + a * m.D),
              part="kda")
    if backend == "fla":
        h = H * K * K // C  # chunk states [NT, H, K, V] per token
        # per call (layout.memory.kda_head_block heads of H; calls run one after another): chunk_kda_fwd's
        # w, u, qg, kg, h, v_new, rebuilt in backward beside dh, dAqk/dAkk; the output (forward) and the
        # input gradients (backward) are whole
        hb = layout.memory.kda_head_block
        calls = H // hb if hb and hb < H else 1
        fwd = n * ((a * 4 * HK + a * h + 64 * H) // calls + a * HK)
        bwd = n * ((a * 4 * HK + 2 * a * h + 2 * F32 * H * C + a * HK) // calls + a * 3 * HK + F32 * HK)
    else:
        seg = min(n, KDA_SEGMENT_CHUNKS * C)
        floats = 14 * K + 4 * C + (4 * K + 1 if a != F32 else 0)
        fwd = seg * F32 * H * floats + n * a * HK
        bwd = 2 * seg * F32 * H * floats + 2 * n * ((3 * a + F32) * HK + a * H)
    core = Op("kda_op", {k: t[k] for k in ("kda_op", "kda_cp_map") if k in t}, fwd=fwd, bwd=bwd, part="kda")
    out = Op("kda_out", {k: t[k] for k in ("kda_out_norm", "kda_out_proj_in")}, fwd=nb * 2 * F32 * HK,
             bwd=nb * 3 * F32 * HK + n * (2 * a * HK + a * m.D), part="kda")
    return [proj, core, out]


def dsa_ops(m: ModelShape, layer: LayerShape, layout: Layout, keys: int | None = None) -> list[Op]:
    """`keys`: the tokens attended to (default: the whole sequence, all-gathered under CP; streaming:
    the cached prefix and the chunk)."""
    n, a, H, R = layout.tokens, m.act_bytes, m.dsa_heads, m.kv_lora
    T = keys or layout.train.micro_batch * layout.seq_len
    t = dsa(m, n, T, layer)
    nb = min(layout.memory.dsa_block_queries, n)
    _, W = m.selected_per_query(T)
    indexer = 0
    if layer.indexer == "full":
        HI, DI, P = m.index_heads, m.index_dim, T // m.index_kpool
        inputs = n * (a * HI * DI + F32 * HI) + T * 2 * a * DI  # queries, weights; keys, gates
        pools = T * DI * (2 * F32 + 2 * a)  # k-pool logits, softmax, weighted keys
        # one float32 [block, P] row buffer for all blocks; at the last block the float32 [block, HI, P]
        # scores (scaled and relu'd in place), the row scores before they are copied in, the mask
        scores = nb * P * (F32 * HI + 2 * F32 + 1) + (P * DI * F32 if a != F32 else 0)
        indexer = inputs + max(pools, scores)
    proj = Op("dsa_proj_indexer", {k: t[k] for k in ("dsa_input", "dsa_q_lora", "dsa_kv_lora", "dsa_latent")},
              fwd=indexer, bwd=n * a * (2 * m.q_lora + 2 * R + m.D), part="dsa")
    rows = nb * W * R
    gather = (2 * a + F32) * rows if a != F32 else 2 * F32 * rows
    before = F32 * rows + 2 * F32 * nb * H * W if n > nb else 0  # the last block's rows and scores, still bound
    fwd = max(gather + before, F32 * rows + 3 * F32 * nb * H * W)
    bwd = F32 * T * R + gather + 3 * F32 * rows + 4 * F32 * nb * H * W + 2 * n * a * H * R
    return [proj, Op("dsa_attention", {k: t[k] for k in ("dsa_queries", "dsa_selection") if k in t}, fwd=fwd, bwd=bwd,
                     part="dsa")]


def mlp_ops(m: ModelShape, layer: LayerShape, layout: Layout, imbalance: float) -> list[Op]:
    n, a, D = layout.tokens, m.act_bytes, m.D
    if layer.mlp == "dense":
        t, blk, width = dense_mlp(m, n), min(n, MLP_BLOCK), m.dense_width
        return [Op("dense_mlp", t, fwd=blk * 4 * a * width, bwd=blk * 8 * a * width + 3 * F32 * width * D + n * a * D,
                   part="dense")]
    M, ep, W = min(layout.memory.moe_block_tokens, n), layout.parallel.ep > 1, m.moe_width
    rows_n = moe_rows(m, n, layout, imbalance)
    rows = max(1, rows_n * M // n)
    again = sum(moe(m, M, False, rows, ep).values()) if layout.memory.moe_recompute else 0  # the block rebuilt
    if ep and again:  # a block's checkpointed forward keeps nothing: its largest live tensors are the sorted
        # rows and the gate_up output, made per expert and joined, beside the layer's output [n, D]
        fwd = rows * a * (D + 4 * W) + n * a * D
    else:
        fwd = 2 * rows * a * D + M * a * D + again
    if not ep:
        # each block's backward makes a new gradient of the routed-expert weights (the larger of gate_up
        # [E, 2I, D] and down [E, D, I]) before it is added to the gradient of the blocks before
        weight_grad = m.experts * 2 * W * D * a if n > M else 0
        bwd = rows * a * (2 * D + 3 * W) + 2 * M * a * D + again + weight_grad
    else:  # expert parallelism (ops/moe/ep.py): the block's rebuilt forward ends with the routed output before
        # and after un-permuting; its backward peaks in the down projection's, with the rows' output and
        # input gradients and, past the first block, the block's down-weight gradient [E/ep, D, I] beside
        # the sum of the blocks before (counted with the layer's unsharded gradients)
        local = -(-m.experts // layout.parallel.ep)
        grads = rows * a * (D + W) + (local * D * W * a if n > M else 0)
        # with one block, the layer's unsharded gradients (counted whole) hold no gate_up gradient yet
        early = local * 2 * W * D * a if n <= M else 0
        # the gradient arriving at the layer's MoE output [n, D] and the blocks' input gradients, joined once
        bwd = (max(2 * rows * a * D, grads) if again else grads) + 2 * n * a * D + again - early
    return [Op("moe", moe(m, n, layout.memory.moe_recompute, rows_n, ep), fwd=fwd, bwd=bwd, part="moe")]


def layer_ops(m: ModelShape, layer: LayerShape, layout: Layout, backend: str, imbalance: float,
              keys: int | None = None) -> list[Op]:
    """The ops of one decoder layer in forward order; their saved bytes sum to input + body."""
    n = layout.tokens
    fr = frame(m, n, layout.hc_recompute)
    hc_extra = {"hc_weights": fr["hc_weights"] // 2} if "hc_weights" in fr else {}  # half in each hyper-connection
    ops = [hc_op(m, n, "attn_hc", layout.hc_recompute, {"layer_input": layer_input(m, n)} | hc_extra),
           norm_op(m, n, "norm_attn")]
    ops += kda_ops(m, layout, backend) if layer.attn == "kda" else dsa_ops(m, layer, layout, keys)
    ops += [combine_op(m, n, "combine_attn", {"mid_stream": fr["mid_stream"]}),
            hc_op(m, n, "ffn_hc", layout.hc_recompute, hc_extra),
            norm_op(m, n, "norm_ffn")]
    ops += mlp_ops(m, layer, layout, imbalance)
    ops.append(combine_op(m, n, "combine_ffn", {}))
    return ops


def ops_by_layer(m: ModelShape, layout: Layout, backend: str, imbalance: float,
                 keys: int | None = None) -> list[list[Op]]:
    """`layer_ops` of every decoder layer (layers of one kind share one list, built once)."""
    by_kind: dict[tuple, list[Op]] = {}
    for lay in m.layers:
        if (lay.attn, lay.mlp, lay.indexer) not in by_kind:
            by_kind[lay.attn, lay.mlp, lay.indexer] = layer_ops(m, lay, layout, backend, imbalance, keys)
    return [by_kind[lay.attn, lay.mlp, lay.indexer] for lay in m.layers]


def loss_transients(m: ModelShape, layout: Layout) -> tuple[int, int]:
    """(forward, backward) extra bytes of the chunked LM head + cross-entropy."""
    n, a, V, D = layout.tokens, m.act_bytes, m.V, m.D
    C = min(layout.memory.loss_chunk_tokens, n)
    # forward: the larger of (a + F32) and 2 x F32 bytes per logit of the chunk, 2 x F32 as a <= F32
    return 2 * F32 * C * V, (F32 + (a if a != F32 else 0)) * C * V + F32 * V * D + n * a * D
