"""DSA: blockwise latent attention (patched upstream module) vs upstream, naive and fla references.

Upstream's DSA path (`Glm5NextTextAttention`, `Glm5NextTextIndexer`) is plain torch: it calls
none of the kernels transformers binds to fla at import, so the unpatched reference needs no
fallback switch here (only KDA does). fla's `naive_dsa` is loaded from its source file since
`import fla` needs Triton. Tolerances (fp32): max |Δ| <= TOL * max(1, max |reference|).
"""

import copy
import importlib.util

import pytest
import torch
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextAttention, Glm5NextTextModel

from genome_lm.model.ops.dsa import DSASelection, LongDSA, absorbed_mla_attention
from genome_lm.model.ops.dsa.chunk import _SparseLatentAttention, sparse_latent_attention
from genome_lm.model.ops.dsa.indexer import index_inputs
from genome_lm.model.ops.dsa.naive import naive_dsa_forward
from tests.helpers import assert_close, largest_tensor

TOL = {"out": 1e-5, "grad": 2e-5}  # observed: out <= 2e-7, grads <= 2e-6


def load_fla_naive_dsa():
    spec = importlib.util.find_spec("fla")
    if spec is None or importlib.util.find_spec("einops") is None:
        return None
    path = f"{spec.submodule_search_locations[0]}/ops/dsa/naive.py"
    mod_spec = importlib.util.spec_from_file_location("_fla_dsa_naive", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def tiny_config(topk=16, kpool=4, tail=True, layers=("full", "shared"), attn="eager", **kw):
    cfg = Glm5NextTextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
        qk_nope_head_dim=8, v_head_dim=6, index_n_heads=4, index_head_dim=8, index_topk=topk,
        index_kpool=kpool, index_kpool_always_select_tail=tail, num_hidden_layers=len(layers),
        layer_types=["indexed_attention"] * len(layers), indexer_types=list(layers),
        mlp_layer_types=["dense"] * len(layers), intermediate_size=32, vocab_size=8, pad_token_id=0,
        hc_mult=2, **kw,
    )
    cfg._attn_implementation = attn
    return cfg


def make_attn(cfg, layer_idx, seed):
    """Upstream module with every parameter random (incl. pool gate/ape and norm weights)."""
    torch.manual_seed(seed)
    attn = Glm5NextTextAttention(cfg, layer_idx)
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p) if name.endswith("weight") else 0.1 * torch.randn_like(p))
            elif "compress" in name:
                p.normal_(0, 1)
    return attn


def run(attn, x, prev=None, w=None, rows=slice(None)):
    """Forward + backward of (out[:, rows] * w).sum(): returns out, selection, grads by name."""
    attn.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    out, _, sel = attn(x, attention_mask=torch.ones(x.shape[:2], dtype=torch.bool), prev_topk_indices=prev)
    w = torch.randn_like(out) if w is None else w
    (out[:, rows] * w[:, rows]).sum().backward()
    grads = {n: p.grad for n, p in attn.named_parameters()}
    grads["x"] = x.grad
    return out.detach(), sel, grads, w


def compare(up, mine, tol=TOL):
    out_u, _, g_u, _ = up
    out_m, _, g_m, _ = mine
    assert_close("out", out_m, out_u, tol["out"])
    for name, ref in g_u.items():
        if ref is None:  # upstream's indexer runs under no_grad: no gradients, ever
            assert g_m[name] is None, f"{name}: upstream has no gradient, patched has one"
        else:
            assert_close(f"grad {name}", g_m[name], ref, tol["grad"])


@pytest.mark.parametrize("T,seeds,block", [
    (1, (0, 1), 7), (5, (0, 1, 2), 2), (12, (0, 1, 2), 5), (16, (0, 1, 2), 16),
    (23, (0, 1, 2), 7), (301, (0, 1), 64), (1001, (0,), 96),
])
def test_patched_matches_upstream(T, seeds, block):
    cfg = tiny_config()
    for seed in seeds:
        up = make_attn(cfg, 0, seed)
        mine = LongDSA.install(copy.deepcopy(up), block_queries=block)
        x = torch.randn(2, T, cfg.hidden_size, generator=torch.Generator().manual_seed(seed))
        ref = run(up, x)
        got = run(mine, x, w=ref[3])
        compare(ref, got)
        # the selection itself is upstream's, token for token (same order, same -1 padding); when
        # top-k covers every pool, the same tokens in pool order (upstream orders them by score)
        sel = got[1].to_token_indices(cfg.index_topk)
        if cfg.index_topk // cfg.index_kpool >= T // cfg.index_kpool:
            sel, ref_sel = sel.sort(dim=-1).values, ref[1].sort(dim=-1).values
            assert torch.equal(sel, ref_sel)
        else:
            assert torch.equal(sel, ref[1])
        assert torch.equal(naive_dsa_forward(up, x)[1].int(), ref[1])


@pytest.mark.parametrize("T", [301, 1100])  # torch.topk: nth_element (k*64 > P) / partial_sort path
def test_exact_score_ties_resolve_as_upstream(T):
    """Every pool gets the same index score, yet pools differ in what attention sees: the indexer
    reads the first half of x (periodic with period kpool), the latent only the second half."""
    cfg = tiny_config(topk=16, kpool=4)
    up = make_attn(cfg, 0, 13)
    half = cfg.hidden_size // 2
    with torch.no_grad():
        up.indexer.wk.weight[:, half:] = 0
        up.indexer.index_kpool_compress_gate[:, half:] = 0
        up.kv_a_proj_with_mqa.weight[:, :half] = 0
    x = torch.randn(2, T, cfg.hidden_size)
    x[:, :, :half] = torch.randn(2, 4, half).repeat(1, T // 4 + 1, 1)[:, :T]
    mine = LongDSA.install(copy.deepcopy(up), block_queries=50)
    ref = run(up, x)
    got = run(mine, x, w=ref[3])
    assert torch.equal(got[1].to_token_indices(cfg.index_topk), ref[1])
    compare(ref, got)


def test_sdpa_upstream_and_patched_parameter_names():
    cfg = tiny_config(attn="sdpa")
    up = make_attn(cfg, 0, 3)
    mine = LongDSA.install(copy.deepcopy(up), block_queries=32)
    assert type(mine) is LongDSA and type(up) is not LongDSA
    assert [n for n, _ in mine.named_parameters()] == [n for n, _ in up.named_parameters()]
    x = torch.randn(1, 77, cfg.hidden_size)
    ref = run(up, x)
    compare(ref, run(mine, x, w=ref[3]))


def test_bfloat16_matches_upstream_in_bfloat16():
    cfg = tiny_config()
    up = make_attn(cfg, 0, 14).to(torch.bfloat16)
    mine = LongDSA.install(copy.deepcopy(up), block_queries=32)
    x = torch.randn(2, 90, cfg.hidden_size).bfloat16()
    ref = run(up, x)
    got = run(mine, x, w=ref[3])
    assert got[0].dtype == torch.bfloat16 and got[2]["kv_b_proj.weight"].dtype == torch.bfloat16
    assert torch.equal(got[1].to_token_indices(cfg.index_topk), ref[1])
    compare(ref, got, tol={"out": 2e-2, "grad": 3e-2})


def test_shared_layer_reuses_selection():
    cfg = tiny_config(layers=("full", "shared"))
    up0, up1 = make_attn(cfg, 0, 4), make_attn(cfg, 1, 5)
    assert up1.indexer is None and up0.next_skip_topk
    p0, p1 = (LongDSA.install(copy.deepcopy(m), block_queries=19) for m in (up0, up1))
    x = torch.randn(2, 203, cfg.hidden_size)
    ref0 = run(up0, x)
    got0 = run(p0, x, w=ref0[3])
    compare(ref0, got0)
    assert isinstance(got0[1], DSASelection)
    x1 = torch.randn_like(x)
    ref1 = run(up1, x1, prev=ref0[1])
    compare(ref1, run(p1, x1, prev=got0[1], w=ref1[3]))  # patched selection object
    compare(ref1, run(p1, x1, prev=ref0[1], w=ref1[3]))  # upstream's raw int32 indices
    with pytest.raises(ValueError, match="shared DSA"):
        p1(x1, attention_mask=None)


def test_without_tail_selection():
    """Without tail selection, queries t < kpool - 1 select nothing: zero output here, while
    upstream's eager path spreads them uniformly over all keys (future ones too). Elsewhere equal."""
    cfg = tiny_config(tail=False)
    up = make_attn(cfg, 0, 6)
    mine = LongDSA.install(copy.deepcopy(up), block_queries=10)
    x = torch.randn(2, 45, cfg.hidden_size)
    rows = slice(cfg.index_kpool - 1, None)
    ref = run(up, x, rows=rows)
    got = run(mine, x, w=ref[3], rows=rows)
    assert_close("out", got[0][:, rows], ref[0][:, rows], TOL["out"])
    for name, g in ref[2].items():
        if g is not None:
            assert_close(f"grad {name}", got[2][name], g, TOL["grad"])
    o_naive, _ = naive_dsa_forward(up, x)
    assert_close("naive", got[0], o_naive, TOL["out"])
    assert_close("empty rows", got[0][:, : cfg.index_kpool - 1], torch.zeros(()), 0.0)


def test_pool_size_one_matches_fla_naive():
    """kpool = 1 turns upstream's indexer into fla's token-level `naive_dsa_indexer`; the
    attention over given indices is fla's `naive_dsa` with per-head expanded K/V."""
    fla = load_fla_naive_dsa()
    assert fla is not None, "flash-linear-attention (with einops) is not installed: a pinned test extra (make setup)"
    cfg = tiny_config(topk=8, kpool=1)
    up = make_attn(cfg, 0, 7)
    B, T, H = 2, 64, cfg.num_attention_heads
    x = torch.randn(B, T, cfg.hidden_size)
    mine = LongDSA.install(copy.deepcopy(up), block_queries=24)
    with torch.no_grad():
        _, _, sel = mine(x, attention_mask=None)
        q_resid = up.q_a_layernorm(up.q_a_proj(x))
        q_idx, weights, keys, _ = index_inputs(up.indexer, x, q_resid)
        ref_idx = fla.naive_dsa_indexer(q_idx, keys, weights, topk=8, activation="relu")
        # same selection up to exact score ties: compare the selected scores
        score = torch.einsum("bthd,bsd->bths", q_idx, keys).mul(up.indexer.softmax_scale).relu()
        score = torch.einsum("bth,bths->bts", weights, score)
        picked = sel.to_token_indices(8).long()

        def chosen(idx):
            return score.gather(-1, idx.clamp(min=0)).masked_fill(idx < 0, float("nan")).sort(-1).values

        assert_close("selected scores", chosen(picked).nan_to_num(-9), chosen(ref_idx).nan_to_num(-9), 1e-5)
        # attention over upstream's indices: fla naive (expanded per head) vs latent form
        q = up.q_b_proj(q_resid).view(B, T, H, -1)
        c = up.kv_a_layernorm(up.kv_a_proj_with_mqa(x))
        kv = up.kv_b_proj(c).view(B, T, H, -1)
        k, v = kv[..., : cfg.qk_nope_head_dim], kv[..., cfg.qk_nope_head_dim:]
        o_fla = fla.naive_dsa(q, k, v, None, None, indices=picked, scale=up.scaling)
        o_mine = absorbed_mla_attention(q, c, up.kv_b_proj.weight, sel, up.scaling, 16)
        assert_close("fla naive_dsa", o_mine, o_fla, TOL["out"])


@pytest.mark.parametrize("T,kpool,tail", [(301, 4, True), (64, 1, False), (97, 8, True)])
def test_dense_fast_path_matches_upstream_and_sparse_path(T, kpool, tail):
    """top-k >= the sequence: every query sees its whole causal prefix, and the fused SDPA path
    replaces the gather. Same output and gradients as upstream's masked dense attention and as
    the blockwise sparse kernel fed the same selection."""
    cfg = tiny_config(topk=1024, kpool=kpool, tail=tail)
    up = make_attn(cfg, 0, 5)
    mine = LongDSA.install(copy.deepcopy(up), block_queries=40)
    x = torch.randn(2, T, cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    ref = run(up, x)
    got = run(mine, x, w=ref[3])
    assert got[1].is_dense(T)
    compare(ref, got)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, T, 3, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    kv = torch.randn(2, T, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    outs = [sparse_latent_attention(q, kv, got[1], 0.4, 32),
            _SparseLatentAttention.apply(q, kv, 0.4, got[1], 32)]
    grads = [torch.autograd.grad(o.square().sum(), (q, kv)) for o in outs]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-10)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_sparse_topk_is_not_dense():
    cfg = tiny_config(topk=16, kpool=4)
    attn = LongDSA.install(make_attn(cfg, 0, 2), block_queries=128)
    sel = attn(torch.randn(1, 100, cfg.hidden_size), attention_mask=None)[2]
    assert not sel.is_dense(100) and sel.is_dense(19)


def test_sparse_latent_attention_gradcheck():
    gen = torch.Generator().manual_seed(0)
    B, T, H, R = 2, 11, 2, 5
    q = torch.randn(B, T, H, R, dtype=torch.float64, generator=gen, requires_grad=True)
    kv = torch.randn(B, T, R, dtype=torch.float64, generator=gen, requires_grad=True)
    pools = torch.randint(-1, 2, (B, T, 2), generator=gen, dtype=torch.int32)
    pools = torch.where(pools * 3 + 2 <= torch.arange(T)[None, :, None], pools, -1)  # causal, kpool 3
    sel = DSASelection(pools=pools, kpool=3, tail=True)
    assert torch.autograd.gradcheck(lambda a, b: sparse_latent_attention(a, b, sel, 0.7, 4), (q, kv))


def test_cached_pieces_equal_one_pass():
    """Decoding through upstream's cache (as `model/streaming.py` does), pieces across k-pools."""
    from genome_lm.model.streaming import StreamingCache

    cfg = tiny_config(layers=("full", "shared"))
    up0, up1 = make_attn(cfg, 0, 8), make_attn(cfg, 1, 9)
    p0, p1 = (LongDSA.install(copy.deepcopy(m), block_queries=16) for m in (up0, up1))
    T, pieces = 150, (1, 6, 17, 40, 86)
    x0, x1 = torch.randn(2, T, cfg.hidden_size), torch.randn(2, T, cfg.hidden_size)
    with torch.no_grad():
        ref0, _, sel = p0(x0, attention_mask=None)
        ref1, _, _ = p1(x1, attention_mask=None, prev_topk_indices=sel)
        up_ref0, _, _ = up0(x0, attention_mask=torch.ones(2, T, dtype=torch.bool))
        cache = StreamingCache(cfg, total_len=T)
        outs0, outs1, pools = [], [], []
        t = 0
        for n in pieces:
            o0, _, s = p0(x0[:, t:t + n], attention_mask=None, cache=cache)
            o1, _, _ = p1(x1[:, t:t + n], attention_mask=None, cache=cache, prev_topk_indices=s)
            outs0.append(o0), outs1.append(o1), pools.append(s.pools)
            t += n
    assert cache.get_seq_length(0) == cache.get_seq_length(1) == T
    assert torch.equal(torch.cat(pools, 1), sel.pools)
    assert_close("layer 0", torch.cat(outs0, 1), ref0, TOL["out"])
    assert_close("layer 0 vs upstream", torch.cat(outs0, 1), up_ref0, TOL["out"])
    assert_close("layer 1 (shared)", torch.cat(outs1, 1), ref1, TOL["out"])


def test_patched_decoder_stack_matches_upstream_model():
    """Inside upstream's own model loop (decoder layers, hyper-connections, selection passing)."""
    cfg = tiny_config(layers=("full", "shared", "full"))
    torch.manual_seed(10)
    up = Glm5NextTextModel(cfg)
    mine = copy.deepcopy(up)
    for layer in mine.layers:
        LongDSA.install(layer.self_attn, block_queries=24)
    ids = torch.randint(0, cfg.vocab_size, (2, 70))
    outs, grads = [], []
    for model in (up, mine):
        h = model(input_ids=ids, use_cache=False).last_hidden_state
        (h * torch.linspace(-1, 1, h.shape[-1])).sum().backward()
        outs.append(h.detach())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert_close("hidden", outs[1], outs[0], TOL["out"])
    for name, g in grads[0].items():
        if g is None:
            assert grads[1][name] is None, name
        else:
            assert_close(name, grads[1][name], g, TOL["grad"])


def test_long_sequence_never_allocates_t_by_t():
    T = 16384
    cfg = tiny_config(topk=32)
    attn = LongDSA.install(make_attn(cfg, 0, 11), block_queries=512)
    x = torch.randn(1, T, cfg.hidden_size, requires_grad=True)
    with largest_tensor() as mode:
        out, _, _ = attn(x, attention_mask=None)
        out.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    # largest: a block's [1, 512, HI, P] indexer scores (2**23); T*T would be 2**28
    assert mode.largest < T * T // 16, mode.largest


def test_unsupported_inputs_raise():
    cfg = tiny_config()
    attn = LongDSA.install(make_attn(cfg, 0, 12), block_queries=128)
    x = torch.randn(1, 8, cfg.hidden_size)
    mask = torch.ones(1, 8, dtype=torch.bool)
    mask[0, 0] = False
    with pytest.raises(ValueError, match="unpadded"):
        attn(x, attention_mask=mask)
    attn.config.qk_rope_head_dim = 4  # upstream's config rejects this at construction
    with pytest.raises(NotImplementedError, match="NoPE"):
        LongDSA.install(attn)
