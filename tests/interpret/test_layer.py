"""The patched upstream KDA layer with its kernels on fla (interpreted) vs unpatched upstream in torch.

The layer passes fla what the real model does: l2norm and the forget gate (raw input, A_log,
dt_bias, GLM-5.3-Flash's bound -5 as `safe_gate`) in the KDA kernel, the short conv on
`causal_conv1d` (the cache's conv state as its initial state), the gated output norm on
`rms_norm_gated`, the carried state of a cache between prefill and decode steps.
"""

from tests.interpret import _interpreter  # noqa: F401, I001  (before anything imports triton)

import copy

import torch

from genome_lm.model.ops.kda import LongKDA
from genome_lm.model.upstream import use_torch_fallbacks
from tests.helpers import assert_close
from tests.model.test_kda import cached_outputs, forward_backward, tiny_layer

# max |Δ| / max(1, max |reference|); measured (fp32): out 1.5e-6, dx 1e-6, parameter gradients <= 6.5e-6
TOL = {"out": 1e-5, "grad": 5e-5}


def test_patched_layer_on_fla_matches_upstream(fla_calls, fla_lean_calls):
    _, upstream = tiny_layer(31, num_heads=2)
    patched = LongKDA.install(copy.deepcopy(upstream))
    T = 70
    x = torch.randn(1, T, 64, generator=torch.Generator().manual_seed(31))
    mask = torch.ones(1, T, dtype=torch.bool)
    mask[0, :9] = False  # left padding
    with use_torch_fallbacks():
        out_ref, dx_ref, grads_ref = forward_backward(upstream, x, 31, attention_mask=mask)
    out, dx, grads = forward_backward(patched, x, 31, attention_mask=mask)
    assert len(fla_calls) == 1 and fla_calls[0]["use_qk_l2norm_in_kernel"]
    assert fla_calls[0]["use_gate_in_kernel"] and fla_calls[0]["safe_gate"] and fla_calls[0]["lower_bound"] == -5
    assert sorted(fla_lean_calls) == ["conv", "norm"]
    assert_close("out", out, out_ref, TOL["out"])
    assert_close("dx", dx, dx_ref, TOL["grad"])
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        assert_close(name, grads[name], grads_ref[name], TOL["grad"])


def test_patched_layer_on_fla_with_cache_matches_upstream(fla_calls, fla_lean_calls):
    outs = cached_outputs(32, 30, [(0, 17), (17, 18), (18, 30)])  # prefill, decode, prefill from the cache
    assert len(fla_calls) == 3 and fla_calls[1]["initial_state"] is not None
    assert sorted(fla_lean_calls) == ["conv"] * 3 + ["norm"] * 3
    assert_close("out", outs["patched"], outs["upstream"], TOL["out"])
