"""Blockwise k-pool DSA indexer of GLM-5.3-Flash and its selection (rules: `naive.py`). Shapes: B batch,
T queries, HI indexer heads, DI indexer head dim, P complete k-pools, S = min(index_topk // kpool, P)
pools picked per query. Memory: keys O(T·DI), the selection O(T·S) int32, [B, block, HI, P] scores
per query block. `torch.topk` sees the whole row (future pools at finfo.min, as upstream), so equal
scores tie the same way."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DSASelection:
    """Tokens each query of a DSA layer attends to (`shared` layers reuse it): `pools` int32 [B, T, S]
    pool ids (-1 = empty; pool p holds tokens p*kpool ..), `tail`: the query's incomplete pool too,
    `start`: position of query 0; or, `pools` None, upstream's `token_indices` [B, T, W]."""

    pools: torch.Tensor | None
    kpool: int
    tail: bool
    start: int = 0
    token_indices: torch.Tensor | None = None

    def is_dense(self, length: int) -> bool:
        """Every query of a `length`-token sequence sees itself and every earlier token (dense causal)."""
        return (self.pools is not None and self.start == 0 and (self.tail or self.kpool == 1)
                and self.pools.shape[-1] >= length // self.kpool)

    @property
    def num_queries(self) -> int:
        return (self.pools if self.pools is not None else self._raw).shape[1]

    @property
    def _raw(self) -> torch.Tensor:
        assert self.token_indices is not None
        return self.token_indices

    def block(self, t0: int, t1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries t0..t1-1 -> (pool ids int64 [B, n, S], single tokens int64 [B, n, WT]: the tail, or
        raw token indices), -1 = empty."""
        if self.pools is None:
            tok = self._raw[:, t0:t1].long()
            return tok.new_empty(*tok.shape[:2], 0), tok
        pools = self.pools[:, t0:t1].long()  # [B, n, S]
        if not self.tail or self.kpool == 1:
            return pools, pools.new_empty(*pools.shape[:2], 0)
        pos = self.start + torch.arange(t0, t1, device=pools.device)  # [n]
        count = (pos + 1) % self.kpool  # tokens in the query's own incomplete pool
        offs = torch.arange(self.kpool - 1, device=pools.device)
        tail = (pos + 1 - count)[:, None] + offs  # [n, kpool - 1]
        tail = tail.masked_fill(offs >= count[:, None], -1)
        return pools, tail.expand(pools.shape[0], -1, -1)

    def to_token_indices(self, topk: int) -> torch.Tensor:
        """Upstream's format: int32 [B, T, topk (+ kpool - 1 with tail)] absolute key positions, -1 = empty slot."""
        if self.pools is None:
            return self._raw
        pools, single = self.block(0, self.num_queries)
        tok = pools[..., None] * self.kpool + torch.arange(self.kpool, device=pools.device)
        tok = tok.masked_fill(pools[..., None] < 0, -1).flatten(-2)  # [B, T, S * kpool]
        tok = torch.cat([tok, single], dim=-1)  # [pool tokens, tail], then -1 padding
        width = topk + (self.kpool - 1 if self.tail else 0)
        return F.pad(tok, (0, width - tok.shape[-1]), value=-1).to(torch.int32)


def kpool_keys(keys: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor, kpool: int) -> torch.Tensor:
    """Upstream's `get_pooled_states`: keys k_norm(wk(x)) and gate x @ compress_gate.T [B, T, DI], ape
    [kpool, DI] -> pool keys [B, P = T // kpool, DI], per channel softmax(gate + ape)-weighted keys."""
    B, T, DI = keys.shape
    P = T // kpool
    logits = gate[:, : P * kpool].reshape(B, P, kpool, DI).float() + ape.float()[None, None]  # [B, P, kpool, DI]
    probs = logits.softmax(dim=2).to(keys.dtype)
    return (probs * keys[:, : P * kpool].reshape(B, P, kpool, DI)).sum(dim=2)  # [B, P, DI]


@torch.no_grad()
def chunk_kpool_indexer(q: torch.Tensor, weights: torch.Tensor, pool_keys: torch.Tensor, topk: int, kpool: int,
                        select_tail: bool, scale: float, start: int = 0, row_pools: int | None = None,
                        block_queries: int = 128) -> DSASelection:
    """Causal top-k pool selection per query block: q [B, T, HI, DI] (positions start..), head weights
    [B, T, HI] (`index_inputs`), `pool_keys` [B, P, DI] -> pools [B, T, min(topk // kpool, row)].
    `row_pools` (>= P): the row `torch.topk` sees, extra pools at finfo.min (streaming passes final
    length // kpool, so ties resolve as one pass). A top-k covering the row scores nothing.
    """
    B, T, HI, DI = q.shape
    P = pool_keys.shape[1]
    row = P if row_pools is None else row_pools
    select_k = min(topk // kpool, row)
    neg = torch.finfo(torch.float32).min
    pool_end = torch.arange(row, device=q.device) * kpool + kpool - 1  # last token of each pool
    if select_k == row:  # every pool: the visible ones, in order
        pos = start + torch.arange(T, device=q.device)  # [T]
        pools = torch.arange(row, dtype=torch.int32, device=q.device).expand(T, row)
        pools = pools.masked_fill(pool_end[None] > pos[:, None], -1)  # [T, row]
        return DSASelection(pools=pools.expand(B, T, row), kpool=kpool, tail=select_tail, start=start)
    pools = torch.empty(B, T, select_k, dtype=torch.int32, device=q.device)
    keys_t = pool_keys.float().transpose(1, 2)  # [B, DI, P]
    # One score row buffer for all blocks, [B, block, row]. A block scores only the pv pools
    # complete before its last query; later pools are future for the whole block and keep
    # finfo.min. pv never decreases from block to block, so columns >= pv were never written.
    row_buf = torch.full((B, min(block_queries, T), row), neg, dtype=torch.float32, device=q.device)
    for t0 in range(0, T, block_queries):
        t1 = min(t0 + block_queries, T)
        n = t1 - t0
        pv = min(P, (start + t1) // kpool)
        s = torch.bmm(q[:, t0:t1].float().reshape(B, n * HI, DI), keys_t[:, :, :pv]).view(B, n, HI, pv)
        s = s.mul_(scale).relu_()  # = relu(s * scale), in place
        scores = row_buf[:, :n]  # [B, n, row]
        scores[:, :, :pv] = torch.matmul(weights[:, t0:t1].float().unsqueeze(-2), s).squeeze(-2)
        pos = start + torch.arange(t0, t1, device=q.device)
        scores[:, :, :pv].masked_fill_(pool_end[None, :pv] > pos[:, None], neg)  # [n, pv] not yet visible
        picked = scores.topk(select_k, dim=-1).indices  # [B, n, S]
        pools[:, t0:t1] = picked.masked_fill(pool_end[picked] > pos[None, :, None], -1).to(torch.int32)
    return DSASelection(pools=pools, kpool=kpool, tail=select_tail, start=start)


@torch.no_grad()
def index_inputs(indexer, hidden_states: torch.Tensor, q_resid: torch.Tensor):
    """Upstream `Glm5NextTextIndexer`'s projections of hidden_states [B, T, D] and q_resid (no gradients)
    -> (q [B, T, HI, DI], weights [B, T, HI] float32 times HI^-0.5, keys [B, T, DI], gate [B, T, DI])."""
    B, T, _ = hidden_states.shape
    q = indexer.wq_b(q_resid).view(B, T, indexer.n_heads, indexer.head_dim)  # [B, T, HI, DI]
    keys = indexer.k_norm(indexer.wk(hidden_states))  # [B, T, DI]
    gate = F.linear(hidden_states, indexer.index_kpool_compress_gate)  # [B, T, DI]
    weights = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float()
    return q, weights * indexer.n_heads**-0.5, keys, gate
