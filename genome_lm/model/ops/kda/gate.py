"""KDA's forget gate keeping only its compute-dtype input. Upstream's `Glm5NextTextForgetGate.forward(x)`
(the reference), raw = f_b_proj(f_a_proj(x)) [B, T, H·K], computes in float32 [B, T, H, K]:

    g = lower_bound · sigmoid(exp(A_log) · (raw + dt_bias))      (GLM-5.3-Flash: lower_bound -5)
    g = -exp(A_log) · softplus(raw + dt_bias)                   (lower_bound None)

keeping three float32 tensors. Here it is split as fla's `use_gate_in_kernel` splits it:
`KDAForgetGate` returns (raw, A_log, dt_bias) and the KDA op applies `kda_gate` (token blocks), so
only raw stays for backward. A_log and dt_bias leave as copies: their backward runs after FSDP2 has
freed the module's gathered parameters."""

from __future__ import annotations

import torch

from genome_lm.model.ops import LongContextModule
from genome_lm.model.ops.norm import row_blocks
from genome_lm.model.upstream import glm

upstream_forget_gate = glm.Glm5NextTextForgetGate.forward
ROW_BLOCK = 4096  # tokens per block of the float32 temporaries


def _softplus(g: torch.Tensor) -> torch.Tensor:
    return torch.where(g > 20.0, g, torch.log(1.0 + torch.exp(g)))  # upstream's, exactly


class KDAGateFunction(torch.autograd.Function):
    """raw [N, H, K] (any float dtype), A_log [H], dt_bias [H·K] -> g [N, H, K] float32."""

    @staticmethod
    def forward(ctx, raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None):
        H, K = raw.shape[-2:]
        rate, bias = A_log.float().exp().view(H, 1), dt_bias.float().view(H, K)
        out = torch.empty(raw.shape, dtype=torch.float32, device=raw.device)
        for a, b in row_blocks(raw.shape[0], ROW_BLOCK):
            g = raw[a:b].float() + bias
            out[a:b] = lower_bound * torch.sigmoid(rate * g) if lower_bound is not None else -rate * _softplus(g)
        ctx.save_for_backward(raw, A_log, dt_bias)
        ctx.lower_bound = lower_bound
        return out

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        raw, A_log, dt_bias = ctx.saved_tensors
        H, K = raw.shape[-2:]
        lb = ctx.lower_bound
        rate, bias = A_log.float().exp().view(H, 1), dt_bias.float().view(H, K)
        draw = torch.empty(raw.shape, dtype=raw.dtype, device=raw.device)
        d_rate = torch.zeros(H, 1, dtype=torch.float32, device=raw.device)
        d_bias = torch.zeros(H, K, dtype=torch.float32, device=raw.device)
        for a, b in row_blocks(raw.shape[0], ROW_BLOCK):
            g, d = raw[a:b].float() + bias, dy[a:b].float()
            if lb is not None:
                s = torch.sigmoid(rate * g)
                dz = d * (lb * s * (1 - s))  # d (rate · g)
                d_rate += (dz * g).sum((0, 2))[:, None]
                dg = dz * rate
            else:
                d_rate -= (d * _softplus(g)).sum((0, 2))[:, None]
                dg = -rate * d * torch.where(g > 20.0, torch.ones_like(g), torch.sigmoid(g))
            d_bias += dg.sum(0)
            draw[a:b] = dg.to(raw.dtype)
        d_A = (d_rate[:, 0] * rate[:, 0]).to(A_log.dtype)  # d exp(A_log) / d A_log = exp(A_log)
        return draw, d_A, d_bias.view_as(dt_bias).to(dt_bias.dtype), None


def kda_gate(raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
             lower_bound: float | None = None) -> torch.Tensor:
    """raw `[..., H, K]`, A_log `[H]`, dt_bias `[H·K]` -> `upstream_forget_gate`'s `[..., H, K]` float32."""
    shape = raw.shape
    return KDAGateFunction.apply(raw.reshape(-1, *shape[-2:]), A_log, dt_bias, lower_bound).view(shape)


class KDAForgetGate(LongContextModule, glm.Glm5NextTextForgetGate):
    """`Glm5NextTextForgetGate` whose forward(x [B, T, D]) returns the gate's inputs (raw [B, T, H·K],
    A_log [H], dt_bias [H·K]); the gate is `kda_gate(raw.view(B, T, H, K), A_log, dt_bias, lower_bound)`."""

    # upstream's gate returns one tensor; this one returns its parts, which LongKDA (its only caller) combines
    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        raw = self.f_b_proj(self.f_a_proj(hidden_states))  # [B, T, H·K]
        # copies made last: their backward runs first, before FSDP2's post-backward of this module
        return raw, self.A_log.float().clone(), self.dt_bias.float().clone()
