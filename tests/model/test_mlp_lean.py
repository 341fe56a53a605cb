"""`LeanMLP` / `swiglu_mlp` against upstream's `Glm5NextTextMLP.forward` (the reference beside it).

Forward values equal upstream's (same ops, same order); gradients of the input and the three
weights equal autograd through upstream's forward, with the clamps active on both sides (inputs
scaled so some gate and up values pass `swiglu_limit`) and row blocks smaller than T; what
autograd keeps is x and the two projections only.
"""

from __future__ import annotations

import pytest
import torch

from genome_lm.model import build
from genome_lm.model.ops import mlp as swiglu
from genome_lm.model.ops.mlp import LeanMLP
from genome_lm.model.upstream import glm
from tests.helpers import assert_close


def _mlp(dtype, D=64, width=96, limit=1.5):
    cfg = build("glm53-tiny").model.config
    cfg = type(cfg)(**{**cfg.to_dict(), "hidden_size": D, "swiglu_limit": limit})
    torch.manual_seed(0)
    m = glm.Glm5NextTextMLP(cfg, intermediate_size=width).to(dtype)
    return m


def _run(module, x, dy):
    x = x.detach().clone().requires_grad_()
    y = module(x)
    y.backward(dy)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_lean_mlp_matches_upstream(monkeypatch, dtype, rtol):
    monkeypatch.setattr(swiglu, "ROW_BLOCK", 7)  # several blocks, the last one short
    ref_mod = _mlp(dtype)
    x = (3 * torch.randn(2, 25, 64)).to(dtype)
    dy = torch.randn(2, 25, 64).to(dtype)
    gate = torch.nn.functional.linear(x, ref_mod.gate_proj.weight)
    up = torch.nn.functional.linear(x, ref_mod.up_proj.weight)
    assert (gate > 1.5).any() and (up.abs() > 1.5).any() and (up.abs() < 1.5).any()  # clamps bite
    y_ref, dx_ref, g_ref = _run(ref_mod, x, dy)
    lean = LeanMLP.install(_mlp(dtype))
    y, dx, g = _run(lean, x, dy)
    torch.testing.assert_close(y, y_ref, rtol=rtol, atol=rtol * y_ref.abs().max().item())
    assert_close("dx", dx, dx_ref, rtol)
    for name in g_ref:
        assert_close(name, g[name], g_ref[name], rtol)


def test_lean_mlp_keeps_x_and_two_projections():
    lean = LeanMLP.install(_mlp(torch.bfloat16))
    x = torch.randn(1, 40, 64, dtype=torch.bfloat16, requires_grad=True)
    params = {p.untyped_storage().data_ptr() for p in lean.parameters()}
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lean(x)
    assert sum(saved.values()) == 40 * 2 * (64 + 2 * 96)


def test_lean_mlp_refuses_another_activation():
    m = _mlp(torch.float32)
    m.config = type(m.config)(**{**m.config.to_dict(), "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="SiLU"):
        LeanMLP.install(m)
