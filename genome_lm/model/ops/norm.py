"""RMSNorms keeping only their compute-dtype input for backward. Upstream's `Glm5NextTextRMSNorm` and
`Glm5NextTextRMSNormGated` (the references) compute in float32 and autograd keeps the float32 copies
(8-20 bytes per element beside a bf16 input's 2). `rms_norm` and `gated_rms_norm` are one autograd
function each with upstream's forward arithmetic (same ops, order, dtypes), saving `x` (and `gate`)
and recomputing the float32 row statistics in backward, in row blocks of `ROW_BLOCK`:

    norm(x)[r]        = weight * (x_r · rsqrt(mean x_r² + eps)).to(x.dtype)
    gated(x, z)[r]    = (weight · x_r · rsqrt(mean x_r² + eps) · sigmoid(z_r)).to(x.dtype)   (float32 inside)
"""

from __future__ import annotations

import torch

from genome_lm.model.ops import LongContextModule
from genome_lm.model.upstream import glm

ROW_BLOCK = 8192  # rows per block of the float32 temporaries


def row_blocks(n: int, block: int):  # (start, stop) of blocks covering n rows
    return ((a, min(a + block, n)) for a in range(0, n, block))


def rstd_of(xf: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # [R, 1]


def rms_backward(dn: torch.Tensor, xhat: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """d x (float32) of `xhat = x · rstd` given d xhat = dn (all [R, D] float32)."""
    return rstd * (dn - xhat * (dn * xhat).mean(-1, keepdim=True))


class RMSNormFunction(torch.autograd.Function):
    """`Glm5NextTextRMSNorm.forward` as one function: x [..., D], weight [D] -> [..., D] in `weight * x.dtype`'s
    dtype; saves x and weight, backward recomputes rstd per block."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # [R, D]
        out = torch.empty(x2.shape, dtype=torch.result_type(weight, x), device=x.device)
        for a, b in row_blocks(x2.shape[0], ROW_BLOCK):
            xf = x2[a:b].float()
            out[a:b] = weight * (xf * rstd_of(xf, eps)).to(x.dtype)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight = ctx.saved_tensors
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        dx = torch.empty_like(x2) if ctx.needs_input_grad[0] else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if ctx.needs_input_grad[1] else None
        for a, b in row_blocks(x2.shape[0], ROW_BLOCK):
            xf = x2[a:b].float()
            rstd = rstd_of(xf, ctx.eps)
            xhat = xf * rstd
            if dw is not None:
                dw += (dy2[a:b].float() * xhat.to(x.dtype).float()).sum(0)
            if dx is not None:
                dn = (dy2[a:b] * weight).float()  # upstream: the product's grad in its dtype, then to float32
                dx[a:b] = rms_backward(dn, xhat, rstd).to(x.dtype)
        return (None if dx is None else dx.view_as(x)), (None if dw is None else dw.to(weight.dtype)), None


class GatedRMSNormFunction(torch.autograd.Function):
    """`Glm5NextTextRMSNormGated.forward` as one function: x, gate [..., V], weight [V] -> [..., V] in x.dtype;
    saves x, gate and weight, backward recomputes."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2, g2 = x.reshape(-1, x.shape[-1]), gate.reshape(-1, gate.shape[-1])  # [R, V]
        out = torch.empty_like(x2)
        w = weight.float()
        for a, b in row_blocks(x2.shape[0], ROW_BLOCK):
            xf = x2[a:b].float()
            out[a:b] = (w * (xf * rstd_of(xf, eps)) * torch.sigmoid(g2[a:b].float())).to(x.dtype)
        ctx.save_for_backward(x, gate, weight)
        ctx.eps = eps
        return out.view_as(x)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, gate, weight = ctx.saved_tensors
        x2, g2, dy2 = (t.reshape(-1, t.shape[-1]) for t in (x, gate, dy))
        dx, dg = torch.empty_like(x2), torch.empty_like(g2)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device)
        w = weight.float()
        for a, b in row_blocks(x2.shape[0], ROW_BLOCK):
            xf, dyf = x2[a:b].float(), dy2[a:b].float()
            rstd = rstd_of(xf, ctx.eps)
            xhat = xf * rstd
            s = torch.sigmoid(g2[a:b].float())
            dh = dyf * s  # d (weight · xhat)
            dg[a:b] = (dyf * (w * xhat) * s * (1 - s)).to(gate.dtype)
            dw += (dh * xhat).sum(0)
            dx[a:b] = rms_backward(dh * w, xhat, rstd).to(x.dtype)
        return dx.view_as(x), dg.view_as(gate), dw.to(weight.dtype), None


rms_norm = RMSNormFunction.apply
gated_rms_norm = GatedRMSNormFunction.apply


class LeanRMSNorm(LongContextModule, glm.Glm5NextTextRMSNorm):
    """`Glm5NextTextRMSNorm` computed by `rms_norm`: upstream's values, only the input kept for backward."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)
