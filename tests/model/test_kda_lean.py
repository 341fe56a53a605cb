"""The ops that keep only their compute-dtype inputs for backward, against their references.

KDA's short conv + SiLU (`conv.short_conv` vs `conv.naive_short_conv`, the layer's former code
path), forget gate (`gate.kda_gate` vs upstream's `Glm5NextTextForgetGate.forward`), gated output
norm and the RMSNorm (`ops.norm` vs upstream's forwards), and the hyper-connection's logits and
collapse (`ops.hc` vs upstream's forward): outputs and gradients equal in float32, close in bf16,
and what autograd keeps for each is its inputs (saved-tensor hooks). Blocks are made small here so
that several blocks (and a token block shorter than the conv's width) are exercised.

Tolerances (float32) are max |Δ| / max(1, max |reference|); observed <= 3e-7 for every tensor.
"""

import copy
import math

import pytest
import torch

from genome_lm.model.ops import hc as hc_layer
from genome_lm.model.ops import norm as rms_mod
from genome_lm.model.ops.hc import RecomputedHyperConnection, lean_hc_forward, sinkhorn
from genome_lm.model.ops.kda import KDAForgetGate, LongKDA
from genome_lm.model.ops.kda import chunk as gate_mod
from genome_lm.model.ops.kda.chunk import kda_gate
from genome_lm.model.ops.kda.conv import ShortConvFunction, conv_tail, naive_short_conv, short_conv
from genome_lm.model.ops.norm import gated_rms_norm, rms_norm
from genome_lm.model.upstream import glm
from tests.helpers import assert_close

TOL = 2e-6  # float32
BF16_TOL = 2e-2


def grads_of(fn, inputs: list[torch.Tensor], seed: int):
    """(output, gradients of every input) of a random linear function of fn(*inputs)."""
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*xs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    grads = torch.autograd.grad((out.float() * w.float()).sum(), xs)
    return out.detach(), grads


def assert_same(fn, ref, inputs, names, seed=0, tol=TOL):
    out, grads = grads_of(fn, inputs, seed)
    out_ref, grads_ref = grads_of(ref, inputs, seed)
    assert out.dtype == out_ref.dtype and out.shape == out_ref.shape
    assert_close("out", out, out_ref, tol)
    for name, g, g_ref in zip(names, grads, grads_ref):
        assert g.dtype == g_ref.dtype, name
        assert_close(name, g, g_ref, tol)


def saved_storages(fn, inputs: list[torch.Tensor]) -> list[tuple[tuple, torch.dtype]]:
    """(shape, dtype) of each storage autograd keeps for fn(*inputs), each storage once."""
    seen, keep = {}, []

    def pack(t):
        keep.append(t)
        seen.setdefault(t.untyped_storage().data_ptr(), (tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sorted(seen.values(), key=str)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(rms_mod, "ROW_BLOCK", 5)
    monkeypatch.setattr(gate_mod, "ROW_BLOCK", 7)
    monkeypatch.setattr(hc_layer, "ROW_BLOCK", 6)


# --- short conv + SiLU -----------------------------------------------------------------------


def conv_inputs(seed, B=2, T=23, C=12, W=4, dtype=torch.float32, prev=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=gen).to(dtype)
    weight = torch.randn(C, 1, W, generator=gen) / W  # float32, as upstream keeps conv1d
    p = torch.randn(B, C, W - 1, generator=gen).to(dtype) if prev else None
    return x, weight, p


@pytest.mark.parametrize("T, block, W, prev", [(23, 5, 4, True), (23, 5, 4, False), (2, 5, 4, True), (1, 1, 4, True),
                                               (9, 2, 4, True), (30, 2048, 8, True), (6, 4, 1, False)])
def test_short_conv_matches_reference(T, block, W, prev):
    x, weight, p = conv_inputs(T + W, T=T, W=W, prev=prev)
    inputs, names = ([x, weight, p], ["dx", "dweight", "dprev"]) if prev else ([x, weight], ["dx", "dweight"])
    assert_same(lambda *a: ShortConvFunction.apply(*a[:2], a[2] if prev else None, block),
                lambda *a: naive_short_conv(*a[:2], a[2] if prev else None), inputs, names)


def test_short_conv_bf16_input_float32_weight():
    x, weight, p = conv_inputs(3, dtype=torch.bfloat16)
    assert_same(lambda *a: short_conv(*a, block_tokens=7), naive_short_conv, [x, weight, p],
                ["dx", "dweight", "dprev"], tol=BF16_TOL)


def test_short_conv_keeps_only_its_inputs():
    x, weight, p = (t.requires_grad_() for t in conv_inputs(4, dtype=torch.bfloat16))
    assert saved_storages(short_conv, [x, weight, p]) == sorted(
        [((2, 23, 12), torch.bfloat16), ((12, 1, 4), torch.float32), ((2, 12, 3), torch.bfloat16)], key=str)


def test_conv_pieces_equal_one_pass():
    # prev = the tail of the previous piece (conv_tail): pieces in order give the one-pass output
    x, weight, _ = conv_inputs(5, T=20)
    full = naive_short_conv(x, weight)
    prev, outs = None, []
    for a, b in [(0, 2), (2, 3), (3, 11), (11, 20)]:
        outs.append(short_conv(x[:, a:b], weight, prev, block_tokens=3))
        prev = conv_tail(x[:, a:b], prev, weight.shape[-1])
    assert_close("out", torch.cat(outs, dim=1), full, TOL)


def test_short_conv_refuses_other_activations():
    x, weight, p = conv_inputs(6)
    with pytest.raises(NotImplementedError, match="only silu"):
        short_conv(x, weight, p, activation="gelu")


# --- forget gate ----------------------------------------------------------------------------


def gate_module(seed, H=3, K=8, D=16, lower_bound=-5.0):
    config = glm.Glm5NextTextConfig(hidden_size=D, linear_num_heads=H, linear_head_dim=K, num_hidden_layers=1,
                                    layer_types=["linear_attention"], vocab_size=8, pad_token_id=0,
                                    linear_lower_bound=lower_bound)
    torch.manual_seed(seed)
    gate = glm.Glm5NextTextForgetGate(config)
    with torch.no_grad():
        gate.dt_bias.normal_()
        gate.A_log.uniform_(-1.0, 1.5)
    return gate


@pytest.mark.parametrize("lower_bound", [-5.0, None])
def test_kda_gate_matches_upstream(small_blocks, lower_bound):
    gate = gate_module(0, lower_bound=lower_bound)
    x = torch.randn(2, 19, 16, generator=torch.Generator().manual_seed(1))
    x[0, 3] *= 30  # softplus beyond its threshold of 20 for some channels
    raw = gate.f_b_proj(gate.f_a_proj(x)).detach()  # [B, T, H·K]

    def ref(raw, A_log, dt_bias):
        return glm.Glm5NextTextForgetGate.forward(_Params(gate, A_log, dt_bias, raw), x)

    assert_same(lambda r, a, d: kda_gate(r.view(2, 19, 3, 8), a, d, lower_bound), ref,
                [raw, gate.A_log, gate.dt_bias], ["draw", "dA_log", "ddt_bias"])


class _Params:
    """Upstream's forget gate with its projection output and parameters taken from tensors."""

    def __init__(self, gate, A_log, dt_bias, raw):
        self.head_dim, self.num_heads, self.A_log, self.dt_bias = gate.head_dim, gate.num_heads, A_log, dt_bias
        self.safe_gate_lower_bound = gate.safe_gate_lower_bound
        self.f_a_proj, self.f_b_proj = (lambda x: x), (lambda x: raw)


def test_forget_gate_module_gives_the_gates_inputs():
    upstream = gate_module(2)
    x = torch.randn(1, 9, 16, generator=torch.Generator().manual_seed(2))
    ref = upstream(x)
    lean = KDAForgetGate.install(upstream)
    raw, A_log, dt_bias = lean(x)
    assert A_log.data_ptr() != lean.A_log.data_ptr() and dt_bias.data_ptr() != lean.dt_bias.data_ptr()
    assert_close("g", kda_gate(raw.view(1, 9, 3, 8), A_log, dt_bias, lean.safe_gate_lower_bound), ref, TOL)
    assert [n for n, _ in lean.named_parameters()] == ["dt_bias", "A_log", "f_a_proj.weight", "f_b_proj.weight"]


def test_kda_gate_keeps_only_its_inputs():
    gate = gate_module(3)
    raw = torch.randn(2, 5, 3, 8, dtype=torch.bfloat16, requires_grad=True)
    assert saved_storages(lambda r: kda_gate(r, gate.A_log, gate.dt_bias, -5.0), [raw]) == sorted(
        [((10, 3, 8), torch.bfloat16), ((3,), torch.float32), ((24,), torch.float32)], key=str)


# --- RMSNorm and the gated output norm ------------------------------------------------------


class _Norm:
    def __init__(self, weight, eps):
        self.weight, self.variance_epsilon, self.activation = weight, eps, "sigmoid"


@pytest.mark.parametrize("dtype, tol", [(torch.float32, TOL), (torch.bfloat16, BF16_TOL)])
def test_rms_norm_matches_upstream(small_blocks, dtype, tol):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 13, 32, generator=gen).to(dtype)
    weight = (1 + 0.3 * torch.randn(32, generator=gen)).to(dtype)
    assert_same(lambda x, w: rms_norm(x, w, 1e-5), lambda x, w: glm.Glm5NextTextRMSNorm.forward(_Norm(w, 1e-5), x),
                [x, weight], ["dx", "dweight"], tol=tol)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, TOL), (torch.bfloat16, BF16_TOL)])
def test_gated_rms_norm_matches_upstream(small_blocks, dtype, tol):
    gen = torch.Generator().manual_seed(5)
    x, gate = (torch.randn(2, 11, 3, 16, generator=gen).to(dtype) for _ in range(2))
    weight = (1 + 0.3 * torch.randn(16, generator=gen)).to(dtype)
    assert_same(lambda x, g, w: gated_rms_norm(x, g, w, 1e-6),
                lambda x, g, w: glm.Glm5NextTextRMSNormGated.forward(_Norm(w, 1e-6), x, g), [x, gate, weight],
                ["dx", "dgate", "dweight"], tol=tol)


def test_norms_keep_only_their_inputs():
    x, gate = (torch.randn(3, 7, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    weight = torch.ones(16, dtype=torch.bfloat16, requires_grad=True)
    assert saved_storages(lambda x: rms_norm(x, weight, 1e-5), [x]) == sorted(
        [((3, 7, 16), torch.bfloat16), ((16,), torch.bfloat16)], key=str)
    assert saved_storages(lambda x, g: gated_rms_norm(x, g, weight, 1e-5), [x, gate]) == sorted(
        [((3, 7, 16), torch.bfloat16), ((3, 7, 16), torch.bfloat16), ((16,), torch.bfloat16)], key=str)


# --- hyper-connections -----------------------------------------------------------------------


def hc_module(seed, D=16, S=4):
    config = glm.Glm5NextTextConfig(hidden_size=D, hc_mult=S, num_hidden_layers=1, vocab_size=8, pad_token_id=0)
    torch.manual_seed(seed)
    hc = glm.Glm5NextTextHyperConnection(config)
    with torch.no_grad():
        hc.fn.normal_(std=0.3)
        hc.base.normal_(std=0.3)
        hc.scale.uniform_(0.5, 1.5)
    return hc


@pytest.mark.parametrize("dtype, tol", [(torch.float32, TOL), (torch.bfloat16, BF16_TOL)])
def test_recomputed_hyper_connection_matches_upstream(small_blocks, dtype, tol):
    upstream = hc_module(6).to(dtype)
    upstream.base.data, upstream.scale.data = upstream.base.data.float(), upstream.scale.data.float()  # as upstream
    lean = RecomputedHyperConnection.install(copy.deepcopy(upstream))
    streams = torch.randn(2, 17, 4, 16, generator=torch.Generator().manual_seed(7)).to(dtype)
    gen = torch.Generator().manual_seed(8)
    ws = [torch.randn(s, generator=gen) for s in [(2, 17, 4), (2, 17, 4, 4), (2, 17, 16)]]

    def run(module, forward):
        x = streams.clone().requires_grad_()
        outs = forward(module, x)
        sum((o.float() * w).sum() for o, w in zip(outs, ws)).backward()
        return outs, x.grad, {n: p.grad for n, p in module.named_parameters()}

    outs, dx, grads = run(lean, lambda m, x: m(x))
    outs_ref, dx_ref, grads_ref = run(upstream, glm.Glm5NextTextHyperConnection.forward)
    for name, o, o_ref in zip(["post", "comb", "collapsed"], outs, outs_ref):
        assert o.dtype == o_ref.dtype
        assert_close(name, o.detach(), o_ref.detach(), tol)
    assert_close("dstreams", dx, dx_ref, tol)
    for name in grads_ref:
        assert grads[name].dtype == grads_ref[name].dtype
        assert_close(name, grads[name], grads_ref[name], tol)


def upstream_sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """The loop of `Glm5NextTextHyperConnection.forward`, as upstream writes it."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


@pytest.mark.parametrize("shape", [(1, 8192, 4, 4), (8, 256, 4, 4), (2, 77, 4, 4), (3, 5, 2, 2)])
def test_sinkhorn_is_upstreams_bit_for_bit(shape):
    gen = torch.Generator().manual_seed(shape[1])
    w, dy = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
    results = []
    for fn in (sinkhorn, upstream_sinkhorn):
        x = w.clone().requires_grad_()
        y = fn(torch.softmax(x, dim=-1) + 1e-6, 20, 1e-6)
        y.backward(dy)
        assert y.is_contiguous()
        results.append((y.detach(), x.grad))
    (y, dx), (y_ref, dx_ref) = results
    assert torch.equal(y, y_ref)
    assert torch.equal(dx, dx_ref)


def test_hc_recompute_keeps_no_float32_stream_copy():
    # what the recompute in backward runs with autograd on: lean_hc_forward
    hc = RecomputedHyperConnection.install(hc_module(9, D=32).to(torch.bfloat16))
    streams = torch.randn(1, 33, 4, 32, dtype=torch.bfloat16, requires_grad=True)
    saved = saved_storages(lambda x: lean_hc_forward(hc, x), [streams])
    big = [s for s in saved if s[1] == torch.float32 and torch.Size(s[0]).numel() >= 33 * 32]  # [T, D] or more
    assert not big, big
    assert any(d == torch.bfloat16 and torch.Size(shape).numel() == 33 * 4 * 32 for shape, d in saved)  # the input


# --- the KDA layer ---------------------------------------------------------------------------


def test_kda_layer_keeps_no_float32_tensor_per_token():
    from tests.model.test_kda import tiny_layer

    layer = LongKDA.install(tiny_layer(10)[1]).to(torch.bfloat16)
    for p in (layer.conv1d.weight, layer.forget_gate.A_log, layer.forget_gate.dt_bias):
        p.data = p.data.float()  # upstream's float32 exceptions
    T = 300
    x = torch.randn(1, T, 64, dtype=torch.bfloat16, requires_grad=True)
    saved = saved_storages(layer, [x])
    H, K = layer.num_heads, layer.head_dim
    # empty tensors hold no bytes (torch 2.11's non-reentrant checkpoint saves a [0] placeholder)
    fp32 = [s for s in saved if s[1] == torch.float32 and math.prod(s[0]) > 0]
    # per 16-chunk segment one [B, H, K, V] state; the gate's A_log and dt_bias copies; the conv weight
    allowed = {(1, H, K, K), (H,), (H * K,), tuple(layer.conv1d.weight.shape)}
    assert {shape for shape, _ in fp32} <= allowed, fp32


def test_conv_module_keeps_its_parameter():
    from genome_lm.model.ops.kda.conv import KDAShortConv

    conv = KDAShortConv.install(torch.nn.Conv1d(12, 12, 4, groups=12, bias=False, padding=3))
    x, _, p = conv_inputs(10)
    assert_close("out", conv(x, p), naive_short_conv(x, conv.weight, p), TOL)
    assert [n for n, _ in conv.named_parameters()] == ["weight"]
    assert "activation=silu" in repr(conv)


def test_forget_gate_parameters_get_their_gradients_under_fsdp():
    # A_log / dt_bias leave their module (a float32 FSDP2 group of its own in training) as copies
    # used by the KDA op, whose backward runs before the gradient reaches the gate module: their
    # gradients must still land. float32, FSDP2's bf16-training groups on a 1-rank group, vs plain.
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from genome_lm.model import apply_long_context
    from genome_lm.parallel import _shard_fp32_modules
    from tests.helpers import tiny_model

    plain = apply_long_context(tiny_model())
    model = copy.deepcopy(plain)
    ids = torch.randint(0, 8, (1, 80), generator=torch.Generator().manual_seed(0))
    plain(input_ids=ids, labels=ids).loss.backward()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            _shard_fp32_modules(layer, mesh, None)  # conv1d, forget_gate (+ its projections), hcs, router
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert type(model.model.layers[0].self_attn.forget_gate).__name__.startswith("FSDP")
        model(input_ids=ids, labels=ids).loss.backward()
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
    finally:
        dist.destroy_process_group()
    ref = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
    assert grads.keys() == ref.keys() and any(n.endswith("forget_gate.A_log") for n in ref)
    for name, g in ref.items():
        assert_close(name, grads[name], g, 1e-5)
