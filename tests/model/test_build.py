"""Presets, the causal LM's loss vs upstream, long-context patching (MoE + loss), CPU fallbacks."""

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from transformers.loss.loss_utils import ForCausalLMLoss

from genome_lm.errors import GenomeLMError
from genome_lm.model import (
    apply_long_context,
    build,
    count_parameters,
    expert_load,
    preset_config,
    route_cpu_to_torch,
    use_torch_fallbacks,
)
from genome_lm.model.build import BuiltModel
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE
from genome_lm.model.upstream import Glm5NextTextConfig, Glm5NextTextModel, glm
from tests.helpers import assert_close, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = {"loss": 1e-5, "per_token_nll": 1e-5, "grad": 1e-4}  # fp32, max |diff| / max |reference| (floor=0)


def config_arithmetic(c: Glm5NextTextConfig) -> int:
    """Total parameters of the causal LM, from the config fields alone."""
    d, hd = c.hidden_size, c.linear_head_dim
    q = c.linear_num_heads * hd
    kda = 3 * d * q + 3 * q * c.linear_conv_kernel_dim + (d * hd + hd * q + q + c.linear_num_heads)
    kda += d * c.linear_num_heads + d * hd + hd * q + hd + q * d
    h, qr, kvr = c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank
    mla = d * qr + qr + qr * h * c.qk_head_dim + d * (kvr + c.qk_rope_head_dim) + kvr
    mla += kvr * h * (c.qk_nope_head_dim + c.v_head_dim) + h * c.v_head_dim * d
    ih, ihd = c.index_n_heads, c.index_head_dim
    indexer = qr * ih * ihd + d * ihd + 2 * ihd + d * ih + c.index_kpool * ihd + ihd * d
    e, i = c.n_routed_experts, c.moe_intermediate_size
    moe = e * 3 * i * d + 3 * d * i * c.n_shared_experts + e * d
    dense = 3 * d * c.intermediate_size
    n = c.hc_mult
    hc = 2 * ((2 + n) * n * n * d + (2 + n) * n + 3)
    total = 2 * c.vocab_size * d + d  # embeddings, lm_head, final norm
    for layer in range(c.num_hidden_layers):
        if c.layer_types[layer] == "linear_attention":
            total += kda
        else:
            total += mla + (indexer if c.indexer_types[layer] == "full" else 0)
        total += moe if c.mlp_layer_types[layer] == "sparse" else dense
        total += hc + 2 * d
    return total


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---- presets -------------------------------------------------------------------------------


def test_tiny_preset_has_every_layer_type():
    model = tiny_model()
    c = model.config
    assert isinstance(c, Glm5NextTextConfig) and c.vocab_size == 16
    assert {"linear_attention", "indexed_attention"} == set(c.layer_types)
    dsa = [i for i, t in enumerate(c.layer_types) if t == "indexed_attention"]
    assert [c.indexer_types[i] for i in dsa] == ["full", "shared"]
    assert c.mlp_layer_types[0] == "dense" and "sparse" in c.mlp_layer_types
    assert c.hc_mult == 4 and c.num_experts_per_tok > 1 and c.index_kpool < c.index_topk
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
    assert [k.split(".")[0] for k in model.state_dict()] == ["model"] * (len(model.state_dict()) - 1) + ["lm_head"]
    counts = count_parameters(model)
    assert counts["other"] == 0 and all(counts[g] > 0 for g in ("kda", "mla", "indexer", "routed_experts"))
    assert counts["active"] == counts["total"] - counts["routed_experts"] * 6 // 8  # top-2 of 8 experts


def test_demo_preset_keeps_the_layer_kinds_and_attends_densely_up_to_8k(monkeypatch):
    from genome_lm.model.ops.dsa import chunk

    torch.manual_seed(0)
    model = apply_long_context(build("glm53-demo").model)
    c = model.config
    assert c.layer_types == ["linear_attention", "indexed_attention", "indexed_attention"]
    assert c.indexer_types[1:] == ["full", "shared"] and c.mlp_layer_types == ["dense"] * 3
    assert c.hc_mult == 4 and c.linear_conv_kernel_dim == 8 and c.index_topk >= 8192
    calls = []
    dense = chunk.dense_latent_attention
    monkeypatch.setattr(chunk, "dense_latent_attention", lambda *a: calls.append(1) or dense(*a))
    x = torch.randint(0, 4, (1, 300))
    model(x, labels=x).loss.backward()
    assert len(calls) == 2  # both DSA layers took the exact dense path


def test_build_returns_what_it_built():
    built = build("glm53-tiny", dtype="bfloat16")
    assert isinstance(built, BuiltModel) and type(built.model).__name__ == "Glm5NextCausalLM"
    assert (built.source, built.dtype, built.load_report) == ("glm53-tiny", torch.bfloat16, None)
    assert built.model.config.dtype is None  # the config as upstream built it, not rewritten
    assert not hasattr(built.model, "source") and not hasattr(built.model, "load_report")
    assert build("glm53-tiny", meta=True).dtype is None  # float32, the preset's own


def test_mini_preset_size_and_architecture():
    model = build("glm53-mini", meta=True).model
    counts = count_parameters(model)
    assert 100e6 <= counts["total"] <= 300e6
    assert all(counts[g] > 0 for g in ("kda", "mla", "indexer", "routed_experts", "dense_mlp", "hyper_connections"))
    assert model.config.hc_mult == 4 and model.config.index_kpool < model.config.index_topk


def test_flash_on_meta_matches_config_arithmetic_and_allocates_nothing():
    before = _rss_bytes()
    model = build("glm53-flash").model  # meta by default
    grown = _rss_bytes() - before
    assert all(p.is_meta for p in model.parameters()) and all(b.is_meta for b in model.buffers())
    assert grown < 256 * 2**20, f"building flash on meta grew RSS by {grown / 2**20:.0f} MiB"
    counts = count_parameters(model)
    assert counts["total"] == config_arithmetic(model.config) == sum(p.numel() for p in model.parameters())
    assert counts["total"] == 313_326_816_766
    assert model.config.to_dict() == Glm5NextTextConfig().to_dict()


def test_flash_is_never_materialised_on_cpu():
    with pytest.raises(GenomeLMError, match="meta=True"):
        build("glm53-flash", meta=False)


def test_overrides_and_errors():
    assert build("glm53-flash", vocab_size=16).model.config.pad_token_id is None  # pad id outside vocab dropped
    two = build("glm53-tiny", meta=True, num_hidden_layers=2).model
    assert len(two.config.layer_types) == 2 and len(two.model.layers) == 2
    assert config_arithmetic(two.config) == count_parameters(two)["total"]
    with pytest.raises(GenomeLMError, match="unknown preset|neither a preset"):
        build("glm53-huge")
    with pytest.raises(GenomeLMError, match="invalid config"):
        preset_config("glm53-tiny", index_topk=30)  # not a multiple of index_kpool
    with pytest.raises(GenomeLMError, match="dtype"):
        build("glm53-tiny", dtype="float7")


def test_bf16_keeps_upstream_fp32_parameters():
    model = tiny_model(dtype=torch.bfloat16)
    fp32 = {n for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert "model.layers.1.mlp.gate.weight" in fp32 and "model.layers.0.attn_hc.base" in fp32
    assert model.lm_head.weight.dtype == torch.bfloat16
    x = torch.randint(0, 5, (1, 24))
    assert torch.isfinite(model(x, labels=x).loss)


# ---- the causal LM's loss ------------------------------------------------------------------


def test_loss_and_per_token_nll_match_upstream_logits():
    model = tiny_model()
    x = torch.randint(0, 5, (2, 40))
    labels = x.clone()
    labels[0, 10:15] = -100
    out = model(x, labels=labels, return_per_token_nll=True)
    logits = model.logits(x)  # [B, T, V]
    ref = ForCausalLMLoss(logits, labels, vocab_size=16)  # upstream's loss: shift, mean over scored
    assert_close("loss", out.loss, ref, TOL["loss"], floor=0)
    ref_nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), x[:, 1:], reduction="none")  # token t+1
    mask = out.nll_mask
    assert not mask[:, 0].any() and not mask[0, 10:15].any() and mask.sum() == out.num_targets == 2 * 39 - 5
    assert out.per_token_nll.shape == (2, 40) and out.per_token_nll.dtype == torch.float32
    assert_close("nll", out.per_token_nll[:, 1:][mask[:, 1:]], ref_nll[mask[:, 1:]], TOL["per_token_nll"], floor=0)
    assert torch.all(out.per_token_nll[~mask] == 0)


def _loss_and_grads(model, x, labels):
    model.zero_grad()
    out = model(x, labels=labels, return_per_token_nll=True)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("seq_len", [20, 300])
def test_moe_and_loss_patches_equal_unpatched(seq_len):
    ref_model = tiny_model(seed=seq_len)
    patched = copy.deepcopy(ref_model)
    apply_long_context(patched, ops=("moe", "loss"), moe_block_tokens=37, loss_chunk_tokens=29, moe_recompute=True)
    assert patched.loss_chunk_tokens == 29
    assert not any(type(m).__name__.startswith(("Long", "Lean", "Recomputed")) for m in patched.modules())
    assert all(type(layer.mlp) is BlockedGlm5NextTextMoE for layer in patched.model.layers[1:])
    assert all((layer.mlp.block_tokens, layer.mlp.recompute) == (37, True) for layer in patched.model.layers[1:])
    assert "(mlp): BlockedGlm5NextTextMoE(" in repr(patched) and "block_tokens=37, recompute=True" in repr(patched)
    x = torch.randint(0, 5, (1, seq_len), generator=torch.Generator().manual_seed(seq_len))
    with use_torch_fallbacks():
        ref_out, ref_grads = _loss_and_grads(ref_model, x, x)
        out, grads = _loss_and_grads(patched, x, x)
    assert_close("loss", out.loss, ref_out.loss, TOL["loss"], floor=0)
    assert_close("nll", out.per_token_nll, ref_out.per_token_nll, TOL["per_token_nll"], floor=0)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert_close(name, grads[name], ref_grads[name], TOL["grad"], floor=0)
    stats = expert_load(patched)
    assert len(stats) == 5 and all(s["mean"] == seq_len * 2 / 8 for s in stats.values())


def test_apply_long_context_on_bare_text_model():
    model = Glm5NextTextModel(preset_config("glm53-tiny"))
    assert apply_long_context(model, ops=("moe", "loss"), moe_block_tokens=16) is model
    assert all(type(layer.mlp) is BlockedGlm5NextTextMoE and layer.mlp.block_tokens == 16 for layer in model.layers[1:])
    counts = count_parameters(model)  # bare text model: no lm_head, same grouping
    assert counts["lm_head"] == 0 and counts["other"] == 0
    assert counts["total"] == config_arithmetic(model.config) - 16 * 64
    with pytest.raises(ValueError, match="unknown ops"):
        apply_long_context(model, ops=("flash",))


def test_tiny_trains_on_cpu():
    model = apply_long_context(tiny_model(seed=3), ops=("moe", "loss"), moe_block_tokens=64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.tensor([[0, 1, 2, 3] * 16])  # a repeat the model can learn
    losses = []
    for _ in range(12):
        opt.zero_grad()
        loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


# ---- upstream CPU fallbacks ----------------------------------------------------------------


def test_cpu_tensors_never_reach_optional_kernels(monkeypatch):
    torch_chunk = glm.chunk_kimi_delta_attention
    while hasattr(torch_chunk, "__wrapped__"):
        torch_chunk = torch_chunk.__wrapped__

    def fla_like_kernel(*args, **kwargs):  # what upstream binds when fla imports: fails on CPU
        raise RuntimeError("0 active drivers")

    fla_like_kernel.__wrapped__ = torch_chunk
    monkeypatch.setattr(glm, "chunk_kimi_delta_attention", fla_like_kernel)
    x = torch.randint(0, 5, (1, 12))
    model = tiny_model()  # build() installs the CPU -> torch dispatch over whatever upstream picked
    dispatcher = glm.chunk_kimi_delta_attention
    assert dispatcher is not fla_like_kernel and dispatcher.__wrapped__ is torch_chunk
    loss = model(x, labels=x).loss  # would raise if the CPU tensors reached the kernel
    route_cpu_to_torch()  # idempotent
    assert glm.chunk_kimi_delta_attention is dispatcher
    monkeypatch.setattr(glm, "chunk_kimi_delta_attention", fla_like_kernel)
    with use_torch_fallbacks():
        assert glm.chunk_kimi_delta_attention is torch_chunk
        assert torch.equal(model(x, labels=x).loss, loss)
    assert glm.chunk_kimi_delta_attention is fla_like_kernel  # restored on exit


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_moe_block_recompute_nests_in_per_layer_recompute(use_reentrant):
    ref_model = tiny_model(seed=4).train()
    patched = apply_long_context(copy.deepcopy(ref_model), ops=("moe",), moe_block_tokens=23)
    patched.model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
    x = torch.randint(0, 5, (1, 64), generator=torch.Generator().manual_seed(4))
    ref_out, ref_grads = _loss_and_grads(ref_model, x, x)
    out, grads = _loss_and_grads(patched, x, x)
    assert_close("loss", out.loss, ref_out.loss, TOL["loss"], floor=0)
    for name in ref_grads:
        assert_close(name, grads[name], ref_grads[name], TOL["grad"], floor=0)
