"""fla's kernels for KDA's short conv, gated output norm and in-kernel forget gate (interpreted on CPU)
against genome_lm's references, in float32.

- `conv.short_conv` on fla's `causal_conv1d` (the kernel of `ShortConvolution`, `prev` as its initial
  state) vs `conv.naive_short_conv` (the layer's former code path);
- `KDAOutputNorm` on fla's `rms_norm_gated` (the function of `FusedRMSNormGated`, sigmoid gate) vs
  upstream's `Glm5NextTextRMSNormGated.forward`;
- `chunk_kda(..., use_gate_in_kernel=True)` on fla (`safe_gate` with GLM-5.3-Flash's bound -5;
  the softplus gate without a bound) vs the torch path, which applies `gate.kda_gate` per segment.
Outputs and the gradients of every input (weights, A_log, dt_bias, the conv's prev included).
"""

from tests.interpret import _interpreter  # noqa: F401, I001  (before anything imports triton)

import pytest
import torch

from genome_lm.model.ops.kda.chunk import chunk_kda, chunk_kda_torch
from genome_lm.model.ops.kda.conv import short_conv
from genome_lm.model.ops.kda.conv import naive_short_conv
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.upstream import glm
from tests.helpers import assert_close
from tests.model.test_kda import make_inputs
from tests.model.test_kda_lean import assert_same, conv_inputs, grads_of

# max |Δ| / max(1, max |reference|); measured (fp32, this machine) <= 1e-6 for every tensor
TOL = 1e-5


@pytest.mark.parametrize("T, prev", [(70, True), (70, False), (3, True), (1, True)])
def test_fla_short_conv_matches_reference(T, prev, fla_lean_calls):
    x, weight, p = conv_inputs(T, B=2, T=T, C=48, W=4, prev=prev)
    if prev:
        assert_same(short_conv, naive_short_conv, [x, weight, p], ["dx", "dweight", "dprev"], tol=TOL)
    else:
        assert_same(short_conv, naive_short_conv, [x, weight], ["dx", "dweight"], tol=TOL)
    assert fla_lean_calls == ["conv"]


def test_fla_gated_output_norm_matches_upstream(fla_lean_calls):
    gen = torch.Generator().manual_seed(3)
    norm = KDAOutputNorm.install(glm.Glm5NextTextRMSNormGated(32, eps=1e-6))
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(32, generator=gen))
    x, gate, w = (torch.randn(1, 37, 2, 32, generator=gen) for _ in range(3))

    def run(forward):
        norm.weight.grad = None
        xs = [t.clone().requires_grad_() for t in (x, gate)]
        out = forward(*xs)
        (out * w).sum().backward()
        return out.detach(), [t.grad for t in xs] + [norm.weight.grad]

    out, grads = run(norm)
    assert fla_lean_calls == ["norm"]
    out_ref, grads_ref = run(lambda x, g: glm.Glm5NextTextRMSNormGated.forward(norm, x, g))
    assert_close("out", out, out_ref, TOL)
    for name, g, g_ref in zip(["dx", "dgate", "dweight"], grads, grads_ref):
        assert_close(name, g, g_ref, TOL)


@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["safe_gate", "softplus"])
def test_fla_gate_in_kernel_matches_torch(lower_bound, fla_calls):
    q, k, v, _, beta, h0 = make_inputs(41, B=1, T=70, H=2, K=32, V=32)
    gen = torch.Generator().manual_seed(42)
    raw = 2 * torch.randn(1, 70, 2, 32, generator=gen)
    A_log = torch.empty(2).uniform_(-1.0, 1.0, generator=gen)
    dt_bias = torch.randn(64, generator=gen)

    def run(fn):
        def call(q, k, v, g, beta, h0, A_log, dt_bias):
            o, S = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                      use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)
            return torch.cat([o.flatten(), S.flatten()])
        return call

    out, grads = grads_of(run(chunk_kda), [q, k, v, raw, beta, h0, A_log, dt_bias], 43)
    assert len(fla_calls) == 1 and fla_calls[0]["use_gate_in_kernel"]
    assert fla_calls[0]["safe_gate"] is (lower_bound is not None)
    out_ref, grads_ref = grads_of(run(chunk_kda_torch), [q, k, v, raw, beta, h0, A_log, dt_bias], 43)
    assert_close("o, S", out, out_ref, TOL)
    for name, g, g_ref in zip(["dq", "dk", "dv", "draw", "dbeta", "dh0", "dA_log", "ddt_bias"], grads, grads_ref):
        assert_close(name, g, g_ref, 2e-5)
