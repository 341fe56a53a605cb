"""Plain reference of KDA's short conv (`conv.short_conv`); the recurrence's reference is fla's
`naive_recurrent_kda` (`_fla.load_fla_reference`)."""

import torch
import torch.nn.functional as F


def naive_short_conv(x: torch.Tensor, weight: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
    """silu(causal depthwise conv), the plain way: x `[B, T, C]`, weight `[C, 1, W]`, prev `[B, C, W-1]`
    (None: zeros) -> `[B, T, C]` in x's dtype, computed in the weight's dtype."""
    B, T, C = x.shape
    W = weight.shape[-1]
    prev = x.new_zeros(B, C, W - 1) if prev is None else prev.to(x.dtype)
    full = torch.cat([prev, x.transpose(1, 2)], dim=-1)  # [B, C, W-1+T]
    out = F.silu(F.conv1d(full.to(weight.dtype), weight, groups=C))  # [B, C, T]
    return out.to(x.dtype).transpose(1, 2)
