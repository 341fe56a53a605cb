"""fla's `chunk_kda` (Triton kernels, interpreted on CPU) through genome_lm's `chunk_kda` vs its torch path.

What breaks here if genome_lm's call into fla does: argument names, the [B, T, H, K] layouts, the
[B, HV, K, V] state, dtypes, chunk sizes, the gradients fla returns (initial state included).
Shapes are the real model's head width (K = V = 128) with T not a multiple of the chunk (64).
fp16 stands in for bf16 (the interpreter computes bf16 on raw bits).
"""

from tests.interpret import _interpreter  # noqa: F401, I001  (before anything imports triton)

import pytest
import torch

from genome_lm.model.ops.kda.chunk import chunk_kda, chunk_kda_torch
from tests.helpers import assert_close
from tests.model.test_kda import NAMES, make_inputs, run_with_grads

# max |Δ| / max(1, max |reference|) per tensor. Measured (interpreter vs torch path, this machine):
# fp32 <= 3e-7 for o and the state, <= 2.3e-6 for gradients; fp16 o 3e-5, state 2e-4, gradients
# <= 1.2e-3 (dbeta; fla returns it in fp16)
TOL = {
    torch.float32: {"o": 1e-5, "state": 1e-5, **dict.fromkeys(NAMES, 2e-5)},
    torch.float16: {"o": 2e-3, "state": 2e-3, **dict.fromkeys(NAMES, 5e-3)},
}


def as_dtype(inputs, dtype):
    """q, k, v, beta in `dtype` as the model passes them; g and the state stay fp32 (upstream keeps them)."""
    q, k, v, g, beta, h0 = inputs
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype), h0


def assert_fla_matches_torch(inputs, seed, fla_calls, dtype=torch.float32, use_h0=True, **kw):
    o, S, grads = run_with_grads(chunk_kda, inputs, use_h0, seed, **kw)
    assert len(fla_calls) == 1
    # reference: the torch path on the same (rounded) values, in fp32
    o_ref, S_ref, grads_ref = run_with_grads(chunk_kda_torch, [x.float() for x in inputs], use_h0, seed, **kw)
    assert o.dtype == dtype and S.dtype == torch.float32
    tol = TOL[dtype]
    assert_close("o", o, o_ref, tol["o"])
    assert_close("state", S, S_ref, tol["state"])
    for name, got, ref in zip(NAMES, grads, grads_ref):
        assert got.dtype == (torch.float32 if name in ("dg", "dh0") else dtype), name
        assert_close(name, got, ref, tol[name])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_fla_forward_backward_with_initial_state(dtype, fla_calls):
    inputs = as_dtype(make_inputs(21, B=1, T=100, H=1, K=128, V=128), dtype)
    assert_fla_matches_torch(inputs, 21, fla_calls, dtype)


def test_fla_gva_l2norm_scale_chunk32(fla_calls):
    # what upstream's layer and GVA pass: l2norm in the kernel, 2 value heads per q/k head
    q, k, v, g, beta, h0 = make_inputs(22, B=1, T=40, H=1, HV=2, K=32, V=32)
    inputs = (3 * q, 2 * k, v, g, beta, h0)
    assert_fla_matches_torch(inputs, 22, fla_calls, use_h0=False, scale=0.3, use_qk_l2norm_in_kernel=True,
                             chunk_size=32)
    assert fla_calls[0]["chunk_size"] == 32


def test_fla_cp_second_pass(fla_calls):
    # context parallelism's second pass (`cp_kda_core`): values of width K all zero, the identity
    # (an expanded, non-contiguous view) as initial state; the final state is the slab's map M
    B, T, H, K = 1, 70, 1, 128
    q, k, _, g, beta, _ = make_inputs(23, B=B, T=T, H=H, K=K, V=K)
    eye = torch.eye(K).expand(B, H, K, K)

    def second_pass(fn):
        xs = [x.clone().requires_grad_() for x in (q, k, g, beta)]
        o, M = fn(xs[0], xs[1], q.new_zeros(B, T, H, K), xs[2], xs[3], initial_state=eye, output_final_state=True,
                  use_qk_l2norm_in_kernel=True)
        gen = torch.Generator().manual_seed(24)
        loss = (o * torch.randn(o.shape, generator=gen)).sum() + (M * torch.randn(M.shape, generator=gen)).sum()
        return o.detach(), M.detach(), torch.autograd.grad(loss, xs)

    o, M, grads = second_pass(chunk_kda)
    assert len(fla_calls) == 1
    o_ref, M_ref, grads_ref = second_pass(chunk_kda_torch)
    tol = TOL[torch.float32]
    assert_close("o^M", o, o_ref, tol["o"])
    assert_close("M", M, M_ref, tol["state"])
    for name, got, ref in zip(["dq", "dk", "dg", "dbeta"], grads, grads_ref):
        assert_close(name, got, ref, tol[name])


def test_fla_in_head_blocks_matches_one_call(fla_calls):
    # memory.kda_head_block: fla gets the value heads in calls of `head_block` (GVA: each call with
    # the q/k heads of its values; the gate's A_log / dt_bias rows of its heads); outputs, final
    # state and every gradient (the gate's parameters included) as the torch path over all heads
    H, HV, K, T = 2, 4, 32, 40
    q, k, v, g, beta, h0 = make_inputs(25, B=1, T=T, H=H, HV=HV, K=K, V=K)
    gen = torch.Generator().manual_seed(26)
    A_log, dt_bias = 0.3 * torch.randn(HV, generator=gen), 0.3 * torch.randn(HV * K, generator=gen)

    def run(fn, **kw):
        xs = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0, A_log, dt_bias)]
        o, S = fn(*xs[:5], initial_state=xs[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
                  use_gate_in_kernel=True, A_log=xs[6], dt_bias=xs[7], lower_bound=-5.0, **kw)
        g2 = torch.Generator().manual_seed(27)
        loss = (o * torch.randn(o.shape, generator=g2)).sum() + (S * torch.randn(S.shape, generator=g2)).sum()
        return o.detach(), S.detach(), torch.autograd.grad(loss, xs)

    o, S, grads = run(chunk_kda, head_block=2)
    assert [c["v"].shape[2] for c in fla_calls] == [2, 2] and [c["q"].shape[2] for c in fla_calls] == [1, 1]
    o_ref, S_ref, grads_ref = run(chunk_kda_torch)
    tol = TOL[torch.float32]
    assert_close("o", o, o_ref, tol["o"])
    assert_close("state", S, S_ref, tol["state"])
    for name, got, ref in zip([*NAMES, "dA_log", "ddt_bias"], grads, grads_ref):
        assert_close(name, got, ref, 2e-5)
    with pytest.raises(ValueError, match="head_block=3"):
        chunk_kda(q, k, v, g, beta, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, lower_bound=-5.0,
                  head_block=3)
