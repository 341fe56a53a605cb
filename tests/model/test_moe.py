"""Blocked MoE vs upstream `Glm5NextTextMoE` (outputs, gradients, expert counts)."""

import copy

import pytest
import torch
import torch.nn.functional as F

from genome_lm.model import preset_config
from genome_lm.model.ops.moe import BlockedGlm5NextTextMoE, expert_load, naive_moe_forward
from genome_lm.model.upstream import Glm5NextTextMoE, glm
from tests.helpers import assert_close, load_benchmark

install = BlockedGlm5NextTextMoE.install

pytestmark = pytest.mark.usefixtures("one_thread")

# fp32, outputs and every gradient: max |diff| <= TOL * max |reference| (floor=0); blocks change float32
# summation order, not the math
TOL = 1e-5


def _moe(seed=0, **overrides):
    config = preset_config("glm53-tiny", **overrides)
    torch.manual_seed(seed)
    module = Glm5NextTextMoE(config)
    for p in module.parameters():  # upstream leaves these uninitialised (torch.empty) outside a model
        torch.nn.init.normal_(p, std=0.1)
    module.gate.e_score_correction_bias.normal_(std=0.05)
    return module


def _grads(module, x):
    x = x.clone().requires_grad_()
    out = module(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("block", [7, 16, 50, 64])
@pytest.mark.parametrize("recompute", [True, False])
def test_blocked_equals_upstream(block, recompute):
    ref_module = _moe()
    patched = install(copy.deepcopy(ref_module), block_tokens=block, recompute=recompute)
    x = torch.randn(2, 25, 64, generator=torch.Generator().manual_seed(1))  # N=50 tokens
    ref_out, ref_dx, ref_dp = _grads(ref_module, x)
    out, dx, dp = _grads(patched, x)
    assert_close("out", out, ref_out, TOL, floor=0)
    assert_close("d_input", dx, ref_dx, TOL, floor=0)
    for name in ref_dp:
        assert_close(name, dp[name], ref_dp[name], TOL, floor=0)
    _, ref_counts = naive_moe_forward(ref_module, x)
    assert torch.equal(patched.last_expert_counts, ref_counts)
    assert patched.last_expert_counts.sum().item() == 50 * 2  # N * top-k


def test_grouped_routing_equals_upstream():
    ref_module = _moe(n_group=2, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.5)
    patched = install(copy.deepcopy(ref_module), block_tokens=9, recompute=True)
    x = torch.randn(1, 40, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close("out", patched(x), ref_module(x), TOL, floor=0)
        _, counts = naive_moe_forward(ref_module, x)
    assert torch.equal(patched.last_expert_counts, counts)


def test_install_keeps_names_type_and_reconfigures():
    module = _moe()
    keys = list(module.state_dict())
    install(module, block_tokens=8, recompute=True)
    install(module, block_tokens=5, recompute=False)
    assert isinstance(module, Glm5NextTextMoE) and type(module) is BlockedGlm5NextTextMoE
    assert list(module.state_dict()) == keys
    assert module.block_tokens == 5 and module.recompute is False
    with pytest.raises(TypeError):
        install(torch.nn.Linear(2, 2), block_tokens=4)


def test_blocks_bound_the_dispatch_size(monkeypatch):
    sizes = []
    experts_forward = glm.Glm5NextTextExperts.forward

    def spy(self, hidden, top_k_index, top_k_weights):
        sizes.append(hidden.shape[0])
        return experts_forward(self, hidden, top_k_index, top_k_weights)

    monkeypatch.setattr(glm.Glm5NextTextExperts, "forward", spy)
    module = install(_moe(), block_tokens=16, recompute=True)
    with torch.no_grad():
        module(torch.randn(1, 50, 64))
    assert sizes == [16, 16, 16, 2]


def test_expert_load_stats():
    model = torch.nn.ModuleDict({"a": install(_moe(), block_tokens=8, recompute=True), "b": _moe()})
    with torch.no_grad():
        model["a"](torch.randn(1, 30, 64))
    stats = expert_load(model)
    assert list(stats) == ["a"]  # unpatched layers record nothing
    counts = model["a"].last_expert_counts.float()
    assert stats["a"]["mean"] == pytest.approx(30 * 2 / 8)
    assert stats["a"]["max"] == counts.max().item()
    assert stats["a"]["imbalance"] == pytest.approx(counts.max().item() / counts.mean().item())


def test_eager_experts_equal_grouped_mm():
    """The eager loop `_experts` takes for float32 on CUDA computes what grouped_mm does."""
    from genome_lm.model.ops.moe import _experts

    module = _moe()
    module.config._experts_implementation = "grouped_mm"  # what a built model's config says
    x = torch.randn(40, module.config.hidden_size)
    _, weights, indices = module.gate(x)
    eager = type(module.experts).forward.__wrapped__(module.experts, x, indices, weights)
    assert_close("experts", eager, _experts(module.experts, x, indices, weights), TOL, floor=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_linear_is_per_expert_linear_with_one_weight_gradient(dtype):
    """Expert parallelism's matmuls: `F.linear` per expert, bit for bit, forward and backward (an
    expert with no rows included), and the backward makes one weight-sized tensor where autograd
    through `weight[e]` makes one per expert plus the sums (`benchmarks/bench_expert_grad.py` times both)."""
    from genome_lm.model.ops.moe.ep import expert_linear

    WeightSized = load_benchmark("bench_expert_grad").WeightSized  # counts tensors of the weight's size
    torch.manual_seed(0)
    counts = [3, 0, 5, 1, 7, 2]
    w = torch.randn(len(counts), 12, 8, dtype=dtype, requires_grad=True)
    x = torch.randn(sum(counts), 8, dtype=dtype, requires_grad=True)
    g = torch.randn(sum(counts), 12, dtype=dtype)
    ref = torch.cat([F.linear(part, w[e]) for e, part in enumerate(torch.split(x, counts))])
    with WeightSized(w.numel()) as upstream:
        ref_gx, ref_gw = torch.autograd.grad(ref, (x, w), g)
    out = expert_linear(x, w, counts)
    with WeightSized(w.numel()) as ours:
        gx, gw = torch.autograd.grad(out, (x, w), g)
    assert torch.equal(out, ref) and torch.equal(gx, ref_gx) and torch.equal(gw, ref_gw)
    assert (ours.made, upstream.made) == (1, 2 * len(counts) - 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_rows_and_add_rows_are_indexing_bit_for_bit(dtype):
    """Expert parallelism's reorderings: `permute_rows` is x[index] and `add_rows` is `index_add`, in
    forward and backward bit for bit; neither keeps its input for backward."""
    from genome_lm.model.ops.moe.ep import add_rows, permute_rows

    torch.manual_seed(0)
    x = torch.randn(10, 6, dtype=dtype, requires_grad=True)
    index = torch.randperm(10)
    inverse = torch.empty_like(index).index_copy_(0, index, torch.arange(10))
    g = torch.randn(10, 6, dtype=dtype)
    out = permute_rows(x, index, inverse)
    assert torch.equal(out, x[index]) and out.grad_fn.saved_tensors == (inverse,)
    assert torch.equal(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(x[index], x, g)[0])
    token = torch.tensor([3, 0, 3, 1, 2, 0, 3, 1, 2, 2])  # rows added into 4 tokens, several per token
    like = torch.zeros(4, 6, dtype=dtype)
    out = add_rows(like, token, x)
    ref = torch.zeros_like(like).index_add(0, token, x)
    assert torch.equal(out, ref) and out.grad_fn.saved_tensors == (token,)
    h = torch.randn(4, 6, dtype=dtype)
    assert torch.equal(torch.autograd.grad(out, x, h)[0], torch.autograd.grad(ref, x, h)[0])
