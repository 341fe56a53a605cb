"""Hyper-connection weights recomputed in backward. Upstream's forward (streams [B, T, S, D]) normalises
the streams in float32, projects them to (2 + S)·S logits per token and runs Sinkhorn normalisations,
autograd keeping every intermediate. `RecomputedHyperConnection` runs it under checkpointing, keeping
the input streams and outputs; its [T, S·D] steps keep compute-dtype streams, in token blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.norm import rms_backward, row_blocks, rstd_of
from genome_lm.model.upstream import glm

ROW_BLOCK = 4096  # tokens per block of the float32 [S·D] temporaries


class HCLogitsFunction(torch.autograd.Function):
    """x [N, S·D] (compute dtype), fn [L, S·D] -> linear(rmsnorm(x.float()), fn.float()) [N, L] float32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty(x.shape[0], fn.shape[0], dtype=torch.float32, device=x.device)
        w = fn.float()
        for a, b in row_blocks(x.shape[0], ROW_BLOCK):
            xf = x[a:b].float()
            out[a:b] = F.linear(xf * rstd_of(xf, eps), w)
        ctx.save_for_backward(x, fn)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, fn = ctx.saved_tensors
        w = fn.float()
        dx = torch.empty_like(x)
        dfn = torch.zeros(w.shape, dtype=torch.float32, device=x.device)
        for a, b in row_blocks(x.shape[0], ROW_BLOCK):
            xf = x[a:b].float()
            rstd = rstd_of(xf, ctx.eps)
            xhat = xf * rstd
            d = dy[a:b].float()
            dfn += d.T @ xhat
            dx[a:b] = rms_backward(d @ w, xhat, rstd).to(x.dtype)
        return dx, dfn.to(fn.dtype), None


class HCCollapseFunction(torch.autograd.Function):
    """pre [..., S] float32, streams [..., S, D] -> (pre[..., None] · streams).sum(S) [..., D] in streams' dtype."""

    @staticmethod
    def forward(ctx, pre: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
        S, D = streams.shape[-2:]
        p2, s2 = pre.reshape(-1, S), streams.reshape(-1, S, D)  # [N, S], [N, S, D]
        out = torch.empty(*streams.shape[:-2], D, dtype=streams.dtype, device=streams.device)
        o2 = out.view(-1, D)  # the output itself is no view (FSDP2 hooks a module's outputs)
        for a, b in row_blocks(s2.shape[0], ROW_BLOCK):
            o2[a:b] = (p2[a:b, :, None] * s2[a:b]).sum(dim=1).to(streams.dtype)
        ctx.save_for_backward(pre, streams)
        return out

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        pre, streams = ctx.saved_tensors
        S, D = streams.shape[-2:]
        p2, s2, d2 = pre.reshape(-1, S), streams.reshape(-1, S, D), dy.reshape(-1, D)
        dpre, dstreams = torch.empty_like(p2), torch.empty_like(s2)
        for a, b in row_blocks(s2.shape[0], ROW_BLOCK):
            d = d2[a:b, None, :].float()  # the sum's grad, [n, 1, D]
            dpre[a:b] = (d * s2[a:b]).sum(-1).to(pre.dtype)
            dstreams[a:b] = (d * p2[a:b, :, None]).to(streams.dtype)
        return dpre.view_as(pre), dstreams.view_as(streams)


def lean_hc_forward(self, hidden_streams: torch.Tensor):
    """Upstream's forward with its [T, S·D] steps as `HCLogitsFunction` and `HCCollapseFunction`: same values."""
    hc = self.hc_mult
    B, T = hidden_streams.shape[:2]
    flat = hidden_streams.reshape(B * T, -1)  # upstream's flatten
    logits = HCLogitsFunction.apply(flat, self.fn, self.input_norm.variance_epsilon).view(B, T, -1)  # [B, T, (2+S)·S]
    pre_w, post_w, comb_w = logits.split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = self.base.split([hc, hc, hc * hc])
    pre_scale, post_scale, comb_scale = self.scale.unbind(0)
    comb_w = comb_w.view(*comb_w.shape[:-1], hc, hc)
    comb_b = comb_b.view(hc, hc)

    pre = torch.sigmoid(pre_w * pre_scale + pre_b) + self.hc_eps
    post = 2 * torch.sigmoid(post_w * post_scale + post_b)
    comb = torch.softmax(comb_w * comb_scale + comb_b, dim=-1) + self.hc_eps
    comb = sinkhorn(comb, self.hc_sinkhorn_iters, self.hc_eps)
    return post, comb, HCCollapseFunction.apply(pre, hidden_streams)


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Upstream's Sinkhorn normalisation of comb [..., S, S] (columns, then `iters - 1` times rows and
    columns, each over its sum + eps), bit for bit, on an [S, S, ...] copy: a sum is then S - 1 adds
    of contiguous token vectors in upstream's order, not a strided reduction (3x faster at 8k)."""
    c = comb.movedim((-2, -1), (0, 1)).contiguous()  # [S, S, ...]
    c = c / (c.sum(dim=0, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=1, keepdim=True) + eps)
        c = c / (c.sum(dim=0, keepdim=True) + eps)
    return c.movedim((0, 1), (-2, -1)).contiguous()


class RecomputedHyperConnection(LongContextModule, glm.Glm5NextTextHyperConnection):
    """`Glm5NextTextHyperConnection` whose intermediates are rebuilt in backward; forward
    returns (post [B, T, S], comb [B, T, S, S], collapsed [B, T, D]) as upstream."""

    def forward(self, hidden_streams: torch.Tensor):
        if torch.is_grad_enabled() and (hidden_streams.requires_grad
                                        or any(p.requires_grad for p in self.parameters())):
            return checkpoint(lean_hc_forward, self, hidden_streams, use_reentrant=False)
        return lean_hc_forward(self, hidden_streams)
