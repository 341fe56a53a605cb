"""Stand-ins for the fla functions genome_lm's CUDA path calls, for the rehearsal (fla's Triton kernels
cannot run on fake tensors): fla's arguments as genome_lm passes them, shapes and dtypes checked,
allocating (and saving for backward) what fla-core 0.6's functions do, as the planner counts it; no
values, time or Triton scratch. Shapes: B batch, T slab tokens, H heads, K = V head dim, C chunk."""

from __future__ import annotations

import torch

from genome_lm.model.ops.kda._fla import FlaKernels

F32 = torch.float32


def _check(name: str, cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(f"fla {name}: {what}")


class _FakeKernel(torch.autograd.Function):
    """`forward(*inputs)` -> (output, tensors kept for backward); `backward(grad, *kept)` -> the inputs'
    gradients. Both only allocate, and see shapes, not the inputs themselves."""

    @staticmethod
    def forward(ctx, forward, backward, *inputs):
        out, saved = forward(*inputs)
        ctx.save_for_backward(*saved)
        ctx.backward = backward
        return out

    @staticmethod
    def backward(ctx, grad):
        return None, None, *ctx.backward(grad, *ctx.saved_tensors)


def chunk_kda(q, k, v, g, beta, *, initial_state=None, output_final_state=False, use_gate_in_kernel=False,
              A_log=None, dt_bias=None, chunk_size=64, **kwargs):
    """`fla.ops.kda.chunk_kda`'s contract, by keyword (the arguments it does not check pass as `kwargs`)."""
    B, T, H, K = q.shape
    _check("chunk_kda", k.shape == q.shape and v.shape[:3] == (B, T, H) and g.shape == (B, T, H, K)
           and beta.shape == (B, T, H), f"shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} "
           f"g {tuple(g.shape)} beta {tuple(beta.shape)}")
    _check("chunk_kda", chunk_size in (32, 64), f"chunk_size {chunk_size}")
    _check("chunk_kda", initial_state is None or initial_state.dtype == F32, "initial_state must be float32")
    if use_gate_in_kernel:
        _check("chunk_kda", A_log is not None and A_log.numel() == H and dt_bias is not None
               and dt_bias.numel() == H * K, "use_gate_in_kernel needs A_log [H] and dt_bias [H*K]")
    C, NT = chunk_size, -(-T // chunk_size)
    qs, vs, gs, gdtype, bs, bdtype = q.shape, v.shape, g.shape, g.dtype, beta.shape, beta.dtype

    def forward(q, k, v, g, beta):
        intermediates = [q.new_empty(B, T, H, K) for _ in range(4)]  # w, u, qg, kg
        h = q.new_empty(B, NT, H, K, v.shape[-1])  # chunk states
        o = v.new_empty(v.shape)
        saved = [q.new_empty(B, T, H, K), k.new_empty(B, T, H, K), v.new_empty(v.shape),  # l2-normed q, k; v
                 q.new_empty(B, T, H, dtype=F32), q.new_empty(B, T, H, dtype=F32),  # q, k rstd
                 q.new_empty(B, T, H, C), q.new_empty(B, T, H, C),  # Aqk, Akk
                 q.new_empty(B, T, H, dtype=F32)]
        del intermediates, h
        return o, saved

    def backward(do, *saved):
        rebuilt = [do.new_empty(B, T, H, K) for _ in range(4)]  # w, u, qg, kg
        h = do.new_empty(B, NT, H, K, vs[-1])
        dh = do.new_empty(B, NT, H, K, vs[-1])
        dA = [do.new_empty(B, T, H, C, dtype=F32) for _ in range(2)]
        dv_new = do.new_empty(vs)
        dq, dk, dv = do.new_empty(qs), do.new_empty(qs), do.new_empty(vs)
        dg = do.new_empty(gs, dtype=F32)
        del rebuilt, h, dh, dA, dv_new
        return dq, dk, dv, dg.to(gdtype), do.new_empty(bs, dtype=bdtype)

    o = _FakeKernel.apply(forward, backward, q, k, v, g, beta)
    final = q.new_empty(B, H, K, v.shape[-1], dtype=F32) if output_final_state else None
    return o, final


def causal_conv1d(x, weight, *, initial_state=None, **kwargs):
    """`fla.modules.causal_conv1d.causal_conv1d`'s contract."""
    _check("causal_conv1d", x.dim() == 3 and weight.dim() == 2 and weight.shape[0] == x.shape[-1],
           f"x {tuple(x.shape)} weight {tuple(weight.shape)}")
    _check("causal_conv1d", initial_state is None or initial_state.shape == (x.shape[0], x.shape[-1], weight.shape[1]),
           f"initial_state {None if initial_state is None else tuple(initial_state.shape)}")
    return _FakeKernel.apply(lambda x, w: (x.new_empty(x.shape), [x, w]),
                             lambda dy, x, w: (dy.new_empty(x.shape), dy.new_empty(w.shape, dtype=F32).to(w.dtype)),
                             x, weight), None


def rms_norm_gated(x, g, weight, **kwargs):
    """`fla.modules.norm.fused_norm_gate.rms_norm_gated`'s contract."""
    _check("rms_norm_gated", x.shape == g.shape and weight.shape == x.shape[-1:],
           f"x {tuple(x.shape)} g {tuple(g.shape)} weight {tuple(weight.shape)}")
    return _FakeKernel.apply(lambda x, g, w: (x.new_empty(x.shape), [x, g, w, x.new_empty(x.shape[:-1], dtype=F32)]),
                             lambda dy, x, g, w, rstd: (dy.new_empty(x.shape), dy.new_empty(g.shape),
                                                        dy.new_empty(w.shape, dtype=w.dtype)),
                             x, g, weight)


def build_cp_context(cu_seqlens, group=None, cu_seqlens_cpu=None, **kwargs):
    """`fla.ops.cp.build_cp_context`'s contract (a placeholder context)."""
    return {"cu_seqlens": cu_seqlens_cpu, "group": group}


FAKE_FLA: FlaKernels = (  # the KDA modules' `fla` setting for fake tensors (`model/patch.py`)
    ("fla.ops.kda.chunk_kda", chunk_kda),
    ("fla.modules.causal_conv1d.causal_conv1d", causal_conv1d),
    ("fla.modules.norm.fused_norm_gate.rms_norm_gated", rms_norm_gated),
    ("fla.ops.cp.build_cp_context", build_cp_context),
)
