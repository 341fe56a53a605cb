"""Plain reference of upstream's DeepSeek Sparse Attention (`Glm5NextTextIndexer`, `Glm5NextTextAttention`;
tests only, O(T²), unpadded, no cache). Shapes: B batch, T tokens, H heads, HI indexer heads, DI
indexer head dim, DN/DV key/value head dims, R = kv_lora_rank, P complete k-pools.

Selection (upstream, no padding, query t sees tokens 0..t):
1. index keys k = k_norm(wk(x)) [B, T, DI]; pool p holds tokens p*kpool .. p*kpool+kpool-1;
   only complete pools exist (P = T // kpool). A pool key is the softmax-weighted mean of its
   token keys, weights softmax_over_pool(x @ compress_gate.T + compress_ape) per channel.
2. score[t, p] = sum_j w[t, j] * relu(DI^-0.5 * q[t, j] . poolkey[p]),
   q = wq_b(q_resid) [B, T, HI, DI], w = weights_proj(x) * HI^-0.5 (all float32).
3. pools whose last token is > t get score finfo(float32).min; the top
   select_k = min(index_topk // kpool, P) pools are taken with `torch.topk` over the whole row
   of P pools (ties: whatever torch.topk does on that row); picked pools that were masked are
   dropped. Each kept pool contributes its kpool tokens.
4. with `index_kpool_always_select_tail`, the tokens of the query's own incomplete pool,
   (t+1)//kpool*kpool .. t, are added (none when t+1 is a multiple of kpool).
The indexer runs under `torch.no_grad()`: its parameters never receive gradients.

Attention: MLA, per-head keys/values kv_b_proj(c), c = kv_a_layernorm(kv_a_proj_with_mqa(x)[..., :R]),
restricted to the selected tokens. A query with no selected token (only without tail selection) gets
zeros here; upstream's eager path spreads it uniformly over all T keys (every score is finfo.min).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .indexer import DSASelection, index_inputs, kpool_keys


def naive_kpool_indexer(q: torch.Tensor, k: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor, weights: torch.Tensor,
                        topk: int, kpool: int, select_tail: bool, scale: float) -> torch.Tensor:
    """Upstream k-pool indexer selection (steps 1-4 above), inputs as `indexer.index_inputs` returns
    them -> int64 token indices [B, T, topk (+ kpool - 1 with the tail)], -1 = empty slot."""
    B, T, HI, DI = q.shape
    P = T // kpool
    pos = torch.arange(T, device=q.device)
    pool_keys = kpool_keys(k, gate, ape, kpool)  # [B, P, DI]
    # the same torch ops as upstream, so that scores (and topk ties) are bitwise upstream's
    scores = torch.matmul(q.float(), pool_keys.transpose(-1, -2).float().unsqueeze(1))  # [B, T, HI, P]
    scores = F.relu(scores * scale)
    index_scores = torch.matmul(weights.float().unsqueeze(-2), scores).squeeze(-2)  # [B, T, P]
    pool_end = torch.arange(P, device=q.device) * kpool + kpool - 1
    visible = pool_end[None, :] <= pos[:, None]  # [T, P]
    index_scores = index_scores.masked_fill(~visible, torch.finfo(index_scores.dtype).min)
    picked = index_scores.topk(min(topk // kpool, P), dim=-1).indices  # [B, T, S]
    picked = picked.masked_fill(~visible.expand(B, T, P).gather(-1, picked), -1)
    return DSASelection(picked, kpool, select_tail).to_token_indices(topk).long()  # [pool tokens, tail, -1 ...]


def naive_mla_attention(q_nope: torch.Tensor, kv_latent: torch.Tensor, kv_b_weight: torch.Tensor,
                        indices: torch.Tensor, scale: float) -> torch.Tensor:
    """Dense MLA attention with keys/values expanded per head (upstream's form) over the selected keys
    `indices` [B, T, W] (-1 = empty) -> [B, T, H, DV]; rows without any selected key are zero."""
    B, T, H, DN = q_nope.shape
    S = kv_latent.shape[1]
    mask = torch.zeros(B, T, S + 1, dtype=torch.bool, device=indices.device)
    mask = mask.scatter_(-1, indices.long().masked_fill(indices < 0, S), True)[..., :S]  # [B, T, S]
    kv = F.linear(kv_latent, kv_b_weight).view(B, S, H, -1)  # [B, S, H, DN + DV]
    k, v = kv[..., :DN], kv[..., DN:]
    s = torch.einsum("bthd,bshd->bhts", q_nope, k) * scale
    s = s.float().masked_fill(~mask[:, None], float("-inf"))
    p = torch.nan_to_num(s.softmax(dim=-1)).to(v.dtype)  # empty rows -> 0
    return torch.einsum("bhts,bshd->bthd", p, v)


def naive_dsa_forward(attn, hidden_states: torch.Tensor):
    """Reference forward of an upstream `Glm5NextTextAttention` with an indexer (its parameters, not its
    forward; no cache, padding or RoPE) -> (output [B, T, D], token indices [B, T, W] it used)."""
    B, T, _ = hidden_states.shape
    q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden_states))  # [B, T, q_lora]
    q = attn.q_b_proj(q_resid).view(B, T, attn.num_heads, attn.qk_head_dim)  # [B, T, H, DN]
    c = attn.kv_a_layernorm(attn.kv_a_proj_with_mqa(hidden_states)[..., : attn.kv_lora_rank])  # [B, T, R]
    ix = attn.indexer
    q_idx, weights, keys, gate = index_inputs(ix, hidden_states, q_resid)
    with torch.no_grad():
        indices = naive_kpool_indexer(q_idx, keys, gate, ix.index_kpool_compress_ape, weights, ix.index_topk,
                                      ix.index_kpool, ix.index_kpool_always_select_tail, ix.softmax_scale)
    o = naive_mla_attention(q, c, attn.kv_b_proj.weight, indices, attn.scaling)
    return attn.o_proj(o.reshape(B, T, -1)), indices
