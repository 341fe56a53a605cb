"""Plain references for KDA: `naive_recurrent_kda`, as `fla.ops.kda.naive.naive_recurrent_kda`, one
token at a time. Per value head, with state S in R^{K x V}:

    S_t = diag(exp(g_t)) S_{t-1}                      (per-channel decay, g in log space)
    S_t = S_t + beta_t k_t (v_t - S_t^T k_t)^T        (delta rule)
    o_t = S_t^T (scale * q_t)

GVA: q and k have H heads, v / g / beta have HV = G * H heads; value head h reads q/k head h // G.
"""

import torch
import torch.nn.functional as F


def naive_recurrent_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        scale: float | None = None, initial_state: torch.Tensor | None = None,
                        output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token KDA, shapes as `chunk.chunk_kda` (q, k not normalised here) -> (o in v's dtype,
    final state float32 or None)."""
    dtype = v.dtype
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    if scale is None:
        scale = K**-0.5

    q, k, v, g, beta = (x.to(torch.float) for x in (q, k, v, g, beta))
    q = q.repeat_interleave(G, dim=2) * scale  # [B, T, HV, K]
    k = k.repeat_interleave(G, dim=2)  # [B, T, HV, K]

    S = q.new_zeros(B, HV, K, V)
    if initial_state is not None:
        S += initial_state
    o = torch.zeros_like(v)  # [B, T, HV, V]
    for t in range(T):
        q_t, k_t, v_t, g_t, b_t = q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t]
        S = S * g_t[..., None].exp()  # decay, [B, HV, K, V]
        v_old = (k_t[..., None] * S).sum(-2)  # what S recalls for k_t, [B, HV, V]
        S = S + torch.einsum("b h k, b h v -> b h k v", b_t[..., None] * k_t, v_t - v_old)
        o[:, t] = torch.einsum("b h k, b h k v -> b h v", q_t, S)
    return o.to(dtype), (S if output_final_state else None)


def naive_short_conv(x: torch.Tensor, weight: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
    """silu(causal depthwise conv), the plain way: x `[B, T, C]`, weight `[C, 1, W]`, prev `[B, C, W-1]`
    (None: zeros) -> `[B, T, C]` in x's dtype, computed in the weight's dtype."""
    B, T, C = x.shape
    W = weight.shape[-1]
    prev = x.new_zeros(B, C, W - 1) if prev is None else prev.to(x.dtype)
    full = torch.cat([prev, x.transpose(1, 2)], dim=-1)  # [B, C, W-1+T]
    out = F.silu(F.conv1d(full.to(weight.dtype), weight, groups=C))  # [B, C, T]
    return out.to(x.dtype).transpose(1, 2)
