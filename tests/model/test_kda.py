"""KDA: chunked op vs fla's naive reference, and the patched upstream layer vs upstream.

fla's `naive_recurrent_kda` is loaded from its source file (`load_fla_reference`): `import fla`
pulls in Triton. Unpatched upstream runs inside `use_torch_fallbacks()`, which swaps
transformers' kernel wrappers (they bind fla's Triton kernels at import whenever fla imports,
even for CPU tensors) for the torch functions they wrap.
"""

import copy

import pytest
import torch

from genome_lm.model.ops.kda import LongKDA, chunk_kda, kda_layer_step
from genome_lm.model.ops.kda import chunk as chunk_mod
from genome_lm.model.ops.kda._fla import load_fla_reference
from genome_lm.model.ops.kda.chunk import l2norm
from genome_lm.model.upstream import use_torch_fallbacks
from tests.helpers import assert_close

# fp32 tolerances, as max |Δ| / max(1, max |reference|), per tensor
TOL = {"o": 2e-5, "state": 2e-5, "dq": 5e-5, "dk": 5e-5, "dv": 5e-5, "dg": 5e-5, "dbeta": 5e-5, "dh0": 5e-5}
LAYER_TOL = {"out": 2e-5, "grad": 5e-5}
NAMES = ["dq", "dk", "dv", "dg", "dbeta", "dh0"]


def make_inputs(seed, B=2, T=64, H=2, HV=None, K=16, V=8, gate="random"):
    """Random KDA inputs as upstream makes them: l2-normalised q/k, g in [-5, 0), beta in (0, 1)."""
    HV = HV or H
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(B, T, H, K, generator=gen))
    k = l2norm(torch.randn(B, T, H, K, generator=gen))
    v = torch.randn(B, T, HV, V, generator=gen)
    noise = torch.randn(B, T, HV, K, generator=gen)
    g = {
        "random": -5 * torch.sigmoid(2 * noise),  # upstream's safe gate, lower bound -5
        "strong": -5 + 0.01 * torch.sigmoid(noise),  # at the bound: Γ reaches -320 per 64-chunk
        "zero": torch.zeros_like(noise),  # no decay
        "unbounded": -30 * torch.sigmoid(noise) - 1,  # beyond the bound (softplus gate)
    }[gate]
    beta = torch.rand(B, T, HV, generator=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen)
    return q, k, v, g, beta, h0


def run_with_grads(fn, inputs, use_h0, seed, **kw):
    q, k, v, g, beta, h0 = (x.clone().requires_grad_() for x in inputs)
    o, S = fn(q, k, v, g, beta, initial_state=h0 if use_h0 else None, output_final_state=True, **kw)
    gen = torch.Generator().manual_seed(seed + 1)
    loss = (o * torch.randn(o.shape, generator=gen)).sum() + (S * torch.randn(S.shape, generator=gen)).sum()
    grads = torch.autograd.grad(loss, [q, k, v, g, beta, h0], allow_unused=True)
    return o.detach(), S.detach(), [torch.zeros_like(h0) if gr is None else gr for gr in grads]


@pytest.fixture(scope="module")
def fla_naive():
    """fla's `naive_recurrent_kda`. flash-linear-attention is a pinned test extra: without it the tests
    that compare with fla's reference fail (they never skip)."""
    reference = load_fla_reference("ops/kda/naive.py", "naive_recurrent_kda")
    assert reference is not None, "flash-linear-attention is not installed; it is a pinned test extra (make setup)"
    return reference


def assert_matches_naive(fla_naive, inputs, use_h0, seed, fn=chunk_kda, **kw):
    o, S, grads = run_with_grads(fn, inputs, use_h0, seed, **kw)
    o_ref, S_ref, grads_ref = run_with_grads(fla_naive, inputs, use_h0, seed)
    assert_close("o", o, o_ref, TOL["o"])
    assert_close("state", S, S_ref, TOL["state"])
    for name, got, ref in zip(NAMES, grads, grads_ref):
        assert_close(name, got, ref, TOL[name])


# --- chunk_kda vs fla's naive: outputs, final state, gradients ------------------------------


@pytest.mark.parametrize("use_h0", [False, True])
@pytest.mark.parametrize("T", [1, 7, 64, 100, 257])
def test_chunk_matches_naive(fla_naive, T, use_h0):
    seed = T + 1000 * use_h0
    assert_matches_naive(fla_naive, make_inputs(seed, T=T), use_h0, seed)


@pytest.mark.parametrize("gate", ["strong", "zero", "unbounded"])
@pytest.mark.parametrize("T", [100, 257])
def test_chunk_matches_naive_extreme_gates(fla_naive, gate, T):
    assert_matches_naive(fla_naive, make_inputs(T, T=T, gate=gate), True, T)


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("H,HV,T", [(1, 2, 64), (2, 4, 100), (2, 6, 33)])
def test_chunk_matches_naive_gva(fla_naive, H, HV, T, seed):
    assert_matches_naive(fla_naive, make_inputs(seed, T=T, H=H, HV=HV, K=8, V=16), True, seed)


@pytest.mark.parametrize("chunk_size", [1, 8, 32, 128])
def test_chunk_size_does_not_change_result(fla_naive, chunk_size):
    assert_matches_naive(fla_naive, make_inputs(5, T=45, gate="strong"), True, 5, chunk_size=chunk_size)


def test_chunk_segments_recomputed_in_backward(fla_naive):
    # 100 tokens in segments of 2 x 16: four checkpointed segments, the last one padded
    fn = chunk_mod.chunk_kda_torch
    assert_matches_naive(fla_naive, make_inputs(11, T=100), True, 11, fn=fn, chunk_size=16, segment_chunks=2)


def test_chunk_under_outer_activation_checkpointing():
    # the trainer recomputes whole layers; the op's own per-segment recompute nests inside
    from torch.utils.checkpoint import checkpoint

    inputs = make_inputs(12, T=70)[:5]

    def grads(wrap):
        xs = [x.clone().requires_grad_() for x in inputs]
        o = wrap(xs)
        (o * o).sum().backward()
        return [x.grad for x in xs]

    def op(*xs):
        return chunk_mod.chunk_kda_torch(*xs, chunk_size=16, segment_chunks=2)[0]

    ref = grads(lambda xs: op(*xs))
    for reentrant in (False, True):
        got = grads(lambda xs: checkpoint(op, *xs, use_reentrant=reentrant))
        for name, a, b in zip(NAMES, got, ref):
            assert_close(name, a, b, 1e-6)


def test_chunk_extreme_decay_is_finite(fla_naive):
    # gates far below any bound: exp() is only taken of non-positive numbers, so no inf/nan
    q, k, v, g, beta, h0 = make_inputs(6, T=70, gate="zero")
    g = torch.full_like(g, -200.0)
    o, S = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_ref, S_ref = fla_naive(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert_close("o", o, o_ref, TOL["o"])
    assert_close("state", S, S_ref, TOL["state"])


def test_chunk_l2norm_flag_scale_and_no_state(fla_naive):
    q, k, v, g, beta, _ = make_inputs(7, T=40)
    q, k = 3 * q, 2 * k
    o, S = chunk_kda(q, k, v, g, beta, scale=0.5, use_qk_l2norm_in_kernel=True)
    o_ref, _ = fla_naive(l2norm(q), l2norm(k), v, g, beta, scale=0.5)
    assert S is None
    assert_close("o", o, o_ref, TOL["o"])


def test_chunk_bf16_in_bf16_out():
    q, k, v, g, beta, h0 = make_inputs(8, T=50)
    o32, S32 = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o16, S16 = chunk_kda(*(x.bfloat16() for x in (q, k, v, g, beta)), initial_state=h0, output_final_state=True)
    assert o16.dtype == torch.bfloat16 and S16.dtype == torch.float32
    assert_close("o", o16, o32, 5e-2)
    assert_close("state", S16, S32, 5e-2)


def test_cpu_tensors_never_reach_fla(monkeypatch):
    def boom(*_):
        raise AssertionError("fla must not be looked up for CPU tensors")

    monkeypatch.setattr(chunk_mod, "fla_chunk_kda", boom)
    q, k, v, g, beta, _ = make_inputs(9, T=5)
    chunk_kda(q, k, v, g, beta)


def test_fla_options_leave_their_arguments_alone():
    gate = {"use_gate_in_kernel": True, "lower_bound": -5.0, "A_log": None, "dt_bias": None}
    before = dict(gate)
    fla_gate, kw = chunk_mod.fla_options(gate, 16, scale=None)
    assert gate == before
    assert fla_gate == {**before, "safe_gate": True} and kw == {"scale": None, "chunk_size": 64}
    assert chunk_mod.fla_options({"use_gate_in_kernel": True, "lower_bound": -8.0}, 32)[0]["safe_gate"] is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_dispatch_matches_torch_path():
    # on CUDA fla is required: without the gpu extra this fails with the GenomeLMError naming it
    q, k, v, g, beta, h0 = (x.cuda() for x in make_inputs(13, T=300, K=64, V=64))
    o, S = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_ref, S_ref = chunk_mod.chunk_kda_torch(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert_close("o", o, o_ref, 1e-3)  # fla computes the in-chunk products in tf32/bf16
    assert_close("state", S, S_ref, 1e-3)


# --- the upstream layer, patched vs unpatched --------------------------------------------------


def tiny_layer(seed: int, num_heads: int = 2):
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextLinearAttention

    config = Glm5NextTextConfig(
        hidden_size=64,
        linear_num_heads=num_heads,
        linear_head_dim=16,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        vocab_size=8,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    layer = Glm5NextTextLinearAttention(config, layer_idx=0)
    with torch.no_grad():  # upstream leaves these uninitialised (torch.empty)
        layer.forget_gate.dt_bias.normal_()
        layer.forget_gate.A_log.uniform_(0.0, 2.0)
        layer.o_norm.weight.uniform_(0.5, 1.5)
    return config, layer


def forward_backward(layer, x, seed, **kw):
    x = x.clone().requires_grad_()
    out = layer(x, **kw)
    gen = torch.Generator().manual_seed(seed)
    (out * torch.randn(out.shape, generator=gen)).sum().backward()
    grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    return out.detach(), x.grad, grads


@pytest.mark.parametrize("seed,T,num_heads", [(0, 1, 2), (1, 7, 4), (2, 100, 2)])
def test_patched_layer_matches_upstream(seed, T, num_heads):
    _, upstream = tiny_layer(seed, num_heads)
    patched = LongKDA.install(copy.deepcopy(upstream), chunk_size=32)
    x = torch.randn(2, T, 64, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, : T // 3] = False  # left padding on the second row
    with use_torch_fallbacks():
        out_ref, dx_ref, grads_ref = forward_backward(upstream, x, seed, attention_mask=mask)
    out, dx, grads = forward_backward(patched, x, seed, attention_mask=mask)
    assert_close("out", out, out_ref, LAYER_TOL["out"])
    assert_close("dx", dx, dx_ref, LAYER_TOL["grad"])
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        assert_close(name, grads[name], grads_ref[name], LAYER_TOL["grad"])


def test_install_keeps_parameters_and_survives_deepcopy():
    _, layer = tiny_layer(3)
    keys = list(layer.state_dict())
    params = [p.data_ptr() for p in layer.parameters()]
    assert LongKDA.install(layer, chunk_size=16) is layer
    assert type(layer) is LongKDA and list(layer.state_dict()) == keys
    assert [p.data_ptr() for p in layer.parameters()] == params  # the same tensors, nothing copied
    assert repr(layer).startswith("LongKDA(\n  chunk_size=16, head_block=0, cp=None\n")
    twin = copy.deepcopy(layer)
    assert type(twin) is LongKDA and twin.chunk_size == 16
    with pytest.raises(TypeError, match="expects a Glm5NextTextLinearAttention"):
        LongKDA.install(torch.nn.Linear(2, 2))


def test_upstream_fallbacks_context_restores():
    from transformers.models.glm5_next import modeling_glm5_next as upstream

    before = upstream.chunk_kimi_delta_attention
    with use_torch_fallbacks():
        assert not hasattr(upstream.chunk_kimi_delta_attention, "__wrapped__")  # the plain torch function
    assert upstream.chunk_kimi_delta_attention is before


# --- streaming ------------------------------------------------------------------------------


def test_streaming_steps_equal_one_pass():
    layer = LongKDA.install(tiny_layer(4)[1])
    x = torch.randn(2, 90, 64, generator=torch.Generator().manual_seed(4), requires_grad=True)
    full, _ = kda_layer_step(layer, x)
    (full * full).sum().backward()
    dx_full = x.grad.clone()
    x.grad = None

    state, pieces = None, []
    for a, b in [(0, 1), (1, 3), (3, 40), (40, 41), (41, 90)]:
        out, state = kda_layer_step(layer, x[:, a:b], state)
        pieces.append(out)
    streamed = torch.cat(pieces, dim=1)
    (streamed * streamed).sum().backward()  # gradients flow through the carried state
    assert_close("out", streamed.detach(), full.detach(), LAYER_TOL["out"])
    assert_close("dx", x.grad, dx_full, LAYER_TOL["grad"])


def cached_outputs(seed: int, T: int, bounds) -> dict[str, torch.Tensor]:
    """Outputs [1, T, 64] of upstream and the patched layer fed in pieces `bounds` through a cache."""
    from transformers import DynamicCache

    config, upstream = tiny_layer(seed)
    patched = LongKDA.install(copy.deepcopy(upstream))
    x = torch.randn(1, T, 64, generator=torch.Generator().manual_seed(seed))
    outs = {}
    for name, layer in [("upstream", upstream), ("patched", patched)]:
        cache, pieces = DynamicCache(config=config), []
        with torch.no_grad(), use_torch_fallbacks():
            for a, b in bounds:
                pieces.append(layer(x[:, a:b], cache=cache))
        outs[name] = torch.cat(pieces, dim=1)
    return outs


def test_patched_layer_with_upstream_cache_matches_upstream():
    outs = cached_outputs(5, 30, [(0, 2), (2, 3), (3, 20), (20, 21), (21, 30)])  # prefill, decode, prefill, ...
    assert_close("out", outs["patched"], outs["upstream"], LAYER_TOL["out"])


def test_patched_layer_counts_tokens_in_the_cache_as_upstream():
    """The cache's token count (what `generate` reads as the position) after prefill and decodes."""
    from transformers import DynamicCache

    config, upstream = tiny_layer(6)
    patched = LongKDA.install(copy.deepcopy(upstream))
    x = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(6))
    counts = {}
    for name, layer in [("upstream", upstream), ("patched", patched)]:
        cache, seen = DynamicCache(config=config), []
        with torch.no_grad(), use_torch_fallbacks():
            for a, b in [(0, 9), (9, 10), (10, 11), (11, 12)]:
                layer(x[:, a:b], cache=cache)
                seen.append(int(cache.get_seq_length(0)))
        counts[name] = seen
    assert counts["patched"] == counts["upstream"] == [9, 10, 11, 12]


def test_patched_layer_keeps_recurrent_states_and_crops_as_upstream():
    """Assisted decoding: the cache records the past, keeps the states after the last N tokens, and
    `crop` rolls back to one of them; the next tokens then see the same state as upstream's."""
    from transformers import DynamicCache

    config, upstream = tiny_layer(7)
    patched = LongKDA.install(copy.deepcopy(upstream))
    x = torch.randn(1, 20, 64, generator=torch.Generator().manual_seed(7))
    outs, states = {}, {}
    for name, layer in [("upstream", upstream), ("patched", patched)]:
        cache, pieces = DynamicCache(config=config), []
        with torch.no_grad(), use_torch_fallbacks():
            pieces.append(layer(x[:, :10], cache=cache))
            cache.activate_past_recording(recurrent_states_to_keep=4)
            pieces.append(layer(x[:, 10:15], cache=cache))  # 5 drafted tokens, the last 4 states kept
            cache.crop(-2)  # 2 drafts rejected
            pieces.append(layer(x[:, 13:20], cache=cache))
        outs[name] = torch.cat(pieces, dim=1)
        states[name] = cache.get_recurrent_state(0).clone()
    assert_close("out", outs["patched"], outs["upstream"], LAYER_TOL["out"])
    assert_close("state", states["patched"], states["upstream"], LAYER_TOL["out"])
