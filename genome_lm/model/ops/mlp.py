"""The dense SwiGLU MLP as one autograd function. Upstream's `Glm5NextTextMLP` (the reference) keeps six
[T, I] tensors for backward; `swiglu_mlp` computes the same with the same ops, order and dtypes,
saving only `x`, `gate`, `up` (2·I + D values per token, not 6·I + D) and rebuilding the rest in
backward in row blocks of `ROW_BLOCK`, weight gradients summed in float32.

    gate = x @ w_gate.T, up = x @ w_up.T                       [T, I] (saved)
    h    = silu(min(gate, limit)) * clamp(up, -limit, limit)   [T, I] (per block, not saved)
    y    = h @ w_down.T                                        [T, D]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.norm import row_blocks
from genome_lm.model.upstream import glm

ROW_BLOCK = 8192  # rows per block of the [rows, I] temporaries


def _hidden(gate: torch.Tensor, up: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upstream's activation on one block: (h, silu(clamped gate), clamped up), all [R, I]."""
    gc, uc = gate.clamp(min=None, max=limit), up.clamp(min=-limit, max=limit)
    s = F.silu(gc)
    return s * uc, s, uc


class SwiGLUFunction(torch.autograd.Function):
    """`Glm5NextTextMLP.forward` as one function: x [..., D], w_gate / w_up [I, D], w_down [D, I] -> [..., D];
    saves x, gate, up and the weights, backward recomputes the rest."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, limit: float):
        x2 = x.reshape(-1, x.shape[-1])  # [R, D]
        gate, up = F.linear(x2, w_gate), F.linear(x2, w_up)  # [R, I]
        out = x2.new_empty(x2.shape[0], w_down.shape[0], dtype=torch.result_type(gate, w_down))
        for a, b in row_blocks(x2.shape[0], ROW_BLOCK):
            out[a:b] = F.linear(_hidden(gate[a:b], up[a:b], limit)[0], w_down)
        ctx.save_for_backward(x, gate, up, w_gate, w_up, w_down)
        ctx.limit = limit
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x, gate, up, w_gate, w_up, w_down = ctx.saved_tensors
        limit = ctx.limit
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        dx = torch.empty_like(x2)
        dws = [torch.zeros(w.shape, dtype=torch.float32, device=w.device) for w in (w_gate, w_up, w_down)]
        for a, b in row_blocks(x2.shape[0], ROW_BLOCK):
            g, u, dyb, xb = gate[a:b], up[a:b], dy2[a:b], x2[a:b]
            h, s, uc = _hidden(g, u, limit)
            dws[2] += (dyb.t() @ h).float()
            dh = dyb @ w_down  # [R, I]
            sig = torch.sigmoid(g.clamp(max=limit))
            # silu'(z) = sigmoid(z)(1 + z(1 - sigmoid(z))); clamp passes the gradient where it did not clip
            d_gate = (dh * uc * sig * (1 + g.clamp(max=limit) * (1 - sig))) * (g <= limit)
            d_up = (dh * s) * ((u >= -limit) & (u <= limit))
            dws[0] += (d_gate.t() @ xb).float()
            dws[1] += (d_up.t() @ xb).float()
            dx[a:b] = d_gate @ w_gate + d_up @ w_up
        dw_gate, dw_up, dw_down = (d.to(w.dtype) for d, w in zip(dws, (w_gate, w_up, w_down)))
        return dx.view_as(x), dw_gate, dw_up, dw_down, None


swiglu_mlp = SwiGLUFunction.apply


class LeanMLP(LongContextModule, glm.Glm5NextTextMLP):
    """`Glm5NextTextMLP` computed by `swiglu_mlp`: upstream's values, x and its two projections kept."""

    def configure(self) -> None:
        if self.config.hidden_act != "silu":
            raise ValueError(f"LeanMLP computes SiLU; this MLP's config has hidden_act={self.config.hidden_act!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, self.swiglu_limit)
