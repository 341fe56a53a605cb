"""DSA layers (upstream `Glm5NextTextAttention`) in blockwise latent form.

`LongDSA.install(attn, block_queries=...)` turns one upstream module into a `LongDSA` in place
(every parameter kept, names and values): the training path, a rank's slab under context
parallelism, and upstream's `Cache` for decoding.

`dsa_stream_step(attn, hidden_states, cache)` is the streaming path: it processes the next
chunk of queries against a `DSACache` (latent rows, pool keys and the incomplete pool's index
keys of the earlier tokens) and returns the chunk output, its selection and the updated cache.
Shapes: B batch, T tokens, D model dim, H heads, R kv_lora_rank, DI indexer head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genome_lm.model.cp import gather_seq
from genome_lm.model.ops.install import LongContextModule
from genome_lm.model.upstream import Glm5NextTextAttention

from .chunk import absorbed_mla_attention
from .indexer import DSASelection, chunk_kpool_indexer, index_inputs, kpool_keys

__all__ = ["LongDSA", "DSACache", "dsa_stream_step"]


def _check_supported(attn) -> None:
    cfg = attn.config
    if cfg.qk_rope_head_dim:
        raise NotImplementedError(
            f"layer {attn.layer_idx}: qk_rope_head_dim={cfg.qk_rope_head_dim}; the latent DSA path supports "
            "NoPE DSA only, as upstream's Glm5NextTextConfig does (it rejects qk_rope_head_dim > 0)."
        )
    if cfg.attention_dropout:
        raise NotImplementedError(f"attention_dropout={cfg.attention_dropout}: the latent DSA path has no dropout")


def _as_selection(prev, layer_idx: int) -> DSASelection:
    if prev is None:
        raise ValueError(
            f"layer {layer_idx}: shared DSA layers require top-k indices from a previous full indexer layer."
        )
    return prev if isinstance(prev, DSASelection) else DSASelection.from_token_indices(prev)


def _projections(attn, hidden_states: torch.Tensor):
    """-> (q_resid [B, T, q_lora], q_nope [B, T, H, DN], latent c [B, T, R])."""
    B, T, _ = hidden_states.shape
    q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden_states))
    q = attn.q_b_proj(q_resid).view(B, T, attn.num_heads, attn.qk_head_dim)  # [B, T, H, DN] (no rope part)
    c = attn.kv_a_layernorm(attn.kv_a_proj_with_mqa(hidden_states)[..., : attn.kv_lora_rank])  # [B, T, R]
    return q_resid, q, c


def _attend(attn, q_nope, kv, selection, block) -> torch.Tensor:
    o = absorbed_mla_attention(q_nope, kv, attn.kv_b_proj.weight, selection, attn.scaling, block)  # [B, T, H, DV]
    return attn.o_proj(o.flatten(-2))  # [B, T, D]


class LongDSA(LongContextModule, Glm5NextTextAttention):
    """`Glm5NextTextAttention` (a DSA layer) in blockwise latent form (parameters upstream's).

    Upstream's call: `out, None, selection_or_None = attn(hidden_states, attention_mask=mask,
    cache=cache, prev_topk_indices=sel)`. `full` layers run the blockwise k-pool indexer (no
    gradients, as upstream's `@torch.no_grad()` indexer); `shared` layers reuse
    `prev_topk_indices`, a `DSASelection` from the previous layer or upstream's raw int token
    indices [B, T, W]. As upstream, the selection is returned only when `next_skip_topk`.

    Settings: `block_queries` per indexer / attention block; `cp`, a `CPContext` once
    `apply_context_parallel` ran: this rank's queries then attend over the whole causal prefix —
    the latent rows c [B, T_r, R] are all-gathered differentiably, and for `full` layers the
    index keys and gates (no gradient) -> the pool keys of the whole sequence, exactly the row of
    T // kpool pools one process scores, so ties resolve the same way. Memory per rank: the
    gathered latent O(T·R) and index keys O(T·DI) per layer, the rest O(T_r).
    With a transformers `Cache` (decoding, `generate`): the latent rows go through
    `cache.update` and the index keys through `cache.update_indexer` as upstream stores them, and
    the new queries attend to every cached row.
    """

    upstream = Glm5NextTextAttention
    block_queries: int = 1024
    cp = None

    def configure(self, block_queries: int = 1024) -> None:
        if block_queries < 1:
            raise ValueError(f"block_queries must be >= 1, got {block_queries}")
        _check_supported(self)
        self.block_queries = int(block_queries)

    def extra_repr(self) -> str:
        return f"block_queries={self.block_queries}, cp={self.cp}"

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None,
                prev_topk_indices=None, **kwargs):
        """hidden_states [B, T, D] -> ([B, T, D], None, selection | None)."""
        cache = cache if cache is not None else kwargs.get("past_key_values")
        if attention_mask is not None and (attention_mask.dim() != 2 or not bool(attention_mask.all())):
            raise ValueError("genome_lm's DSA layers take unpadded batches only (a [B, T] attention_mask "
                             "that is all True)")
        cp, block = self.cp, self.block_queries
        if cp is not None:
            if cache is not None:
                raise NotImplementedError("context-parallel DSA is for training (no cache); score with one process")
            cp.check_local(hidden_states.shape[1])
        q_resid, q, c = _projections(self, hidden_states)  # c [B, T, R]
        kv, start = c, 0
        if cache is not None:  # upstream's layout: latent [B, 1, S, R] and an empty rope part
            kv = cache.update(c[:, None], c.new_zeros(*c.shape[:2], 0)[:, None], self.layer_idx)[0][:, 0]
            start = kv.shape[1] - c.shape[1]
        elif cp is not None:
            kv, start = gather_seq(c, cp.lengths, cp.group), cp.start  # [B, T, R]
        if self.indexer is None:
            selection = _as_selection(prev_topk_indices, self.layer_idx)
        else:
            ix = self.indexer
            q_idx, weights, keys, gate = index_inputs(ix, hidden_states, q_resid)
            with torch.no_grad():
                if cache is not None or cp is not None:  # the index keys of the whole prefix
                    both = torch.cat([keys, gate.to(keys.dtype)], dim=-1)  # [B, T, 2 DI]
                    if cache is not None:  # upstream packs [keys | gate | valid]
                        both = cache.update_indexer(torch.cat([both, both.new_ones(*both.shape[:2], 1)], -1),
                                                    self.layer_idx)[..., :-1]
                    else:
                        both = gather_seq(both, cp.lengths, cp.group)
                    keys, gate = both[..., : keys.shape[-1]], both[..., keys.shape[-1]:].to(gate.dtype)
                pools = kpool_keys(keys, gate, ix.index_kpool_compress_ape, ix.index_kpool)  # [B, S // kpool, DI]
            selection = chunk_kpool_indexer(
                q_idx, weights, pools, ix.index_topk, ix.index_kpool, ix.index_kpool_always_select_tail,
                ix.softmax_scale, start=start, block_queries=block,
            )
        out = _attend(self, q, kv, selection, block)
        return out, None, selection if self.next_skip_topk else None


@dataclass
class DSACache:
    """Streaming state of one DSA layer after `length` tokens (buffers grow by doubling).

    Attributes:
        kv: [B, capacity, R] latent rows, the first `length` valid.
        pool_keys: [B, capacity_P, DI] compressed index keys, the first `length // kpool` valid
            (None for `shared` layers).
        tail_keys, tail_gate: [B, length % kpool, DI] index keys / gate logits of the incomplete pool.
        total_len: final sequence length if known; the top-k row then has total_len // kpool pools,
            as in one pass over the whole sequence, so even exact score ties resolve the same way.
    """

    kv: torch.Tensor
    length: int = 0
    pool_keys: torch.Tensor | None = None
    tail_keys: torch.Tensor | None = None
    tail_gate: torch.Tensor | None = None
    total_len: int | None = None


def _append(buf: torch.Tensor | None, used: int, new: torch.Tensor) -> torch.Tensor:
    """Write new [B, n, X] after the first `used` rows of buf [B, cap, X], doubling cap when full."""
    need = used + new.shape[1]
    if buf is None or buf.shape[1] < need:
        cap = max(need, 2 * (0 if buf is None else buf.shape[1]))
        grown = new.new_empty(new.shape[0], cap, new.shape[2])
        if used:
            grown[:, :used] = buf[:, :used]
        buf = grown
    buf[:, used:need] = new
    return buf


def dsa_stream_step(
    attn,
    hidden_states: torch.Tensor,
    cache: DSACache | None = None,
    prev_selection: DSASelection | None = None,
    total_len: int | None = None,
    block_queries: int | None = None,
) -> tuple[torch.Tensor, DSASelection, DSACache]:
    """Process the next chunk of one DSA layer given the cache of the earlier tokens.

    Args:
        attn: an upstream `Glm5NextTextAttention` or `LongDSA` (only its parameters are used).
        hidden_states: the chunk [B, n, D] at positions cache.length .. cache.length + n - 1.
        cache: state after the earlier tokens (None for the first chunk).
        prev_selection: for `shared` layers, the previous layer's selection for this chunk.
        total_len: final sequence length, if known (first chunk only; kept in the cache).
    Returns:
        (output [B, n, D], this chunk's selection, updated cache). Chaining chunks equals one
        pass over the concatenation (up to float rounding of the per-chunk projections).
        Inference only: the cache is detached. The step writes into the cache's buffers, so
        continue from the returned cache, never twice from the same one.
    """
    _check_supported(attn)
    block = block_queries or getattr(attn, "block_queries", 128)
    B, n, _ = hidden_states.shape
    start = 0 if cache is None else cache.length
    total_len = total_len if cache is None else cache.total_len
    q_resid, q, c = _projections(attn, hidden_states)
    kv = _append(None if cache is None else cache.kv, start, c.detach())
    new = DSACache(kv=kv, length=start + n, total_len=total_len)
    if attn.indexer is None:
        selection = _as_selection(prev_selection, attn.layer_idx)
        if selection.start != start or selection.num_queries != n:
            raise ValueError(f"layer {attn.layer_idx}: "
                             f"prev_selection covers {selection.start}+{selection.num_queries}, "
                             f"this chunk is {start}+{n}")
    else:
        ix = attn.indexer
        kpool = ix.index_kpool
        q_idx, weights, keys, gate = index_inputs(ix, hidden_states, q_resid)
        with torch.no_grad():
            if cache is not None and cache.tail_keys is not None:
                keys, gate = torch.cat([cache.tail_keys, keys], 1), torch.cat([cache.tail_gate, gate], 1)
            done = keys.shape[1] // kpool * kpool  # tokens that complete pools now
            pools = _append(None if cache is None else cache.pool_keys, start // kpool,
                            kpool_keys(keys[:, :done], gate[:, :done], ix.index_kpool_compress_ape, kpool))
        new.pool_keys, new.tail_keys, new.tail_gate = pools, keys[:, done:], gate[:, done:]
        P = (start + n) // kpool
        selection = chunk_kpool_indexer(
            q_idx, weights, pools[:, :P], ix.index_topk, kpool, ix.index_kpool_always_select_tail, ix.softmax_scale,
            start=start, row_pools=None if total_len is None else max(total_len // kpool, P), block_queries=block,
        )
    out = _attend(attn, q, kv[:, : start + n], selection, block)
    return out, selection, new
