"""Blockwise sparse attention of DSA in latent (absorbed-MLA) form.

Upstream expands the MLA latent c [B, T, R] into per-head keys/values with `kv_b_proj` under a dense
[B, T, T] mask. Here the key half of `kv_b_proj` is absorbed into the query (q_lat = q_nope · W_uk)
and the value half into the output (o = o_lat · W_uv): every head attends to the shared latent c,
only over its W selected tokens:

    o_lat[t, h] = softmax_w(scale · q_lat[t, h] · c[idx[t, w]]) · c[idx[t, w]]

c is gathered one query block at a time ([B, block, W, R]) in forward and again in backward
(flash-attention style: q_lat, c, the output and the row log-sum-exp are saved): O(T·(H·R + W)).
Shapes: B batch, T queries, L keys (L >= start + T), H heads, R latent dim, W selected tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from genome_lm.model.ops.dsa.indexer import DSASelection
from genome_lm.model.ops.norm import row_blocks


def _acc(t: torch.Tensor) -> torch.Tensor:  # float32, or float64 for float64 inputs (gradcheck)
    return t if t.dtype == torch.float64 else t.float()


class _Block:
    """The latent rows one query block attends to: S pools of kpool tokens, then WT single (tail)
    tokens. A pool is copied (its gradient added back) as one [kpool * R] row: several times faster."""

    def __init__(self, kv: torch.Tensor, selection: DSASelection, t0: int, t1: int):
        B, L, R = kv.shape
        kp = selection.kpool
        pools, single = selection.block(t0, t1)  # [B, n, S], [B, n, WT]
        self.B, self.L, self.R, self.kp, self.n = B, L, R, kp, t1 - t0
        self.n_pool_tok = pools.shape[-1] * kp
        self.L_pad = -(-L // kp) * kp  # key axis padded to whole pools (gradient buffer)
        b = torch.arange(B, device=kv.device)[:, None, None]
        self.pools = (b, pools.clamp(min=0))  # index into the [B, L // kp, kp * R] view
        self.pool_flat = (pools.clamp(min=0) + b * (self.L_pad // kp)).flatten()  # into dkv [B * L_pad / kp, kp * R]
        self.tok = single.clamp(min=0)
        self.tok_flat = (self.tok + b * self.L_pad).flatten()  # into dkv [B * L_pad, R]
        self.invalid = torch.cat([(pools < 0).repeat_interleave(kp, dim=-1), single < 0], dim=-1)  # [B, n, W]

    def gather(self, kv: torch.Tensor) -> torch.Tensor:
        """kv [B, L, R] -> rows [B, n, W, R] in accumulation precision."""
        B, L, R, kp, n = self.B, self.L, self.R, self.kp, self.n
        if kv.stride(2) != 1 or kv.stride(1) != R:
            kv = kv.contiguous()
        if L // kp:
            # complete pools as rows: [B, L // kp, kp * R] (a view; selected pools are always complete)
            by_pool = kv.as_strided((B, L // kp, kp * R), (kv.stride(0), kp * R, 1))
            pool_rows = by_pool[self.pools].view(B, n, self.n_pool_tok, R)
        else:  # no complete pool yet: every pool slot is empty
            pool_rows = kv.new_zeros(B, n, self.n_pool_tok, R)
        tok_rows = kv[self.pools[0], self.tok]  # [B, n, WT, R]
        return _acc(torch.cat([pool_rows, tok_rows], dim=2))

    def add_grad(self, dkv: torch.Tensor, drows: torch.Tensor) -> None:
        """dkv [B, L_pad, R] += drows [B, n, W, R] scattered back to the keys."""
        P, kp, R = self.n_pool_tok, self.kp, self.R
        dkv.view(-1, kp * R).index_add_(0, self.pool_flat, drows[:, :, :P].reshape(-1, kp * R))
        dkv.view(-1, R).index_add_(0, self.tok_flat, drows[:, :, P:].reshape(-1, R))


def _scores(q: torch.Tensor, rows: torch.Tensor, invalid: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, n, H, R], rows [B, n, W, R] -> masked scaled scores [B, n, H, W] (fp32+)."""
    s = torch.matmul(_acc(q), rows.transpose(-1, -2)) * scale
    return s.masked_fill(invalid[:, :, None, :], float("-inf"))


class _SparseLatentAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, scale, selection, block):
        B, T, H, R = q.shape
        o = torch.empty_like(q)
        lse = torch.empty(B, T, H, dtype=_acc(q[:0]).dtype, device=q.device)
        for t0, t1 in row_blocks(T, block):
            blk = _Block(kv, selection, t0, t1)
            rows = blk.gather(kv)  # [B, n, W, R]
            s = _scores(q[:, t0:t1], rows, blk.invalid, scale)  # [B, n, H, W]
            m = s.logsumexp(dim=-1)  # [B, n, H]; -inf for a query without any token
            m = m.masked_fill(torch.isinf(m), float("inf"))  # -> p = 0, o = 0 for such rows
            p = torch.exp(s - m[..., None])
            o[:, t0:t1] = torch.matmul(p, rows).to(q.dtype)  # [B, n, H, R]
            lse[:, t0:t1] = m
        ctx.save_for_backward(q, kv, o, lse)
        ctx.scale, ctx.selection, ctx.block = scale, selection, block
        return o

    @staticmethod
    def backward(ctx, do):
        q, kv, o, lse = ctx.saved_tensors
        scale, selection, block = ctx.scale, ctx.selection, ctx.block
        B, T, H, R = q.shape
        dq = torch.empty_like(q) if ctx.needs_input_grad[0] else None
        dkv = None
        for t0, t1 in row_blocks(T, block):
            blk = _Block(kv, selection, t0, t1)
            rows = blk.gather(kv)  # [B, n, W, R]
            qb, dob = _acc(q[:, t0:t1]), _acc(do[:, t0:t1])  # [B, n, H, R]
            p = torch.exp(_scores(qb, rows, blk.invalid, scale) - lse[:, t0:t1, :, None])  # [B, n, H, W]
            dp = torch.matmul(dob, rows.transpose(-1, -2))  # [B, n, H, W]
            delta = (dob * _acc(o[:, t0:t1])).sum(-1, keepdim=True)  # [B, n, H, 1]
            ds = p * (dp - delta) * scale
            if dq is not None:
                dq[:, t0:t1] = torch.matmul(ds, rows).to(q.dtype)
            if ctx.needs_input_grad[1]:
                if dkv is None:  # [B, L_pad, R], the key axis padded to whole pools
                    dkv = torch.zeros(B, blk.L_pad, R, dtype=_acc(kv[:0]).dtype, device=kv.device)
                # keys and values are the same latent rows: both contributions land on them
                drows = torch.matmul(ds.transpose(-1, -2), qb) + torch.matmul(p.transpose(-1, -2), dob)  # [B, n, W, R]
                blk.add_grad(dkv, drows)
        if ctx.needs_input_grad[1]:
            dkv = torch.zeros_like(kv) if dkv is None else dkv[:, : kv.shape[1]].to(kv.dtype)
        return dq, dkv, None, None, None


def sparse_latent_attention(q: torch.Tensor, kv: torch.Tensor, selection: DSASelection, scale: float,
                            block_queries: int = 128) -> torch.Tensor:
    """Every head over its query's selected latent rows (keys = values): absorbed queries q [B, T, H, R]
    of positions selection.start.., latent kv [B, L, R] -> o_lat [B, T, H, R] (zeros: nothing selected)."""
    if selection.num_queries != q.shape[1]:
        raise ValueError(f"selection covers {selection.num_queries} queries, got {q.shape[1]}")
    if kv.shape[1] == q.shape[1] and selection.is_dense(q.shape[1]):
        return dense_latent_attention(q, kv, scale)
    return _SparseLatentAttention.apply(q, kv, scale, selection, block_queries)


def dense_latent_attention(q: torch.Tensor, kv: torch.Tensor, scale: float) -> torch.Tensor:
    """`sparse_latent_attention` when the selection is the whole causal prefix: fused causal SDPA over
    the shared latent, no gather. q [B, T, H, R], kv [B, T, R] -> [B, T, H, R]."""
    B, T, H, R = q.shape
    k = _acc(kv)[:, None].expand(B, H, T, R)
    o = F.scaled_dot_product_attention(_acc(q).transpose(1, 2), k, k, is_causal=True, scale=scale)
    return o.transpose(1, 2).to(q.dtype)


def absorbed_mla_attention(q_nope: torch.Tensor, kv: torch.Tensor, kv_b_weight: torch.Tensor, selection: DSASelection,
                           scale: float, block_queries: int = 128) -> torch.Tensor:
    """MLA sparse attention through the latent, as expanding kv_b_proj per head: q_nope [B, T, H, DN],
    kv [B, L, R], kv_b_weight [H * (DN + DV), R] (key then value rows per head) -> [B, T, H, DV]."""
    H, DN = q_nope.shape[2], q_nope.shape[3]
    w = kv_b_weight.view(H, -1, kv_b_weight.shape[-1])  # [H, DN + DV, R]
    q_lat = torch.einsum("bthd,hdr->bthr", q_nope, w[:, :DN])  # [B, T, H, R]
    o_lat = sparse_latent_attention(q_lat, kv, selection, scale, block_queries)  # [B, T, H, R]
    return torch.einsum("bthr,hvr->bthv", o_lat, w[:, DN:])  # [B, T, H, DV]
