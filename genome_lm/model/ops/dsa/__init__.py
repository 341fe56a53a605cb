"""DeepSeek Sparse Attention at long T: `naive` (O(T²) reference), `indexer` (blockwise k-pool
selection), `chunk` (sparse attention in absorbed-MLA latent form), and here `LongDSA`, the layer (upstream
`Glm5NextTextAttention`). Shapes: B batch, T tokens, D model dim, H heads, R kv_lora_rank, DI indexer head dim."""

from __future__ import annotations

import torch

from genome_lm.model.cp import CPContext, gather_seq
from genome_lm.model.ops import LongContextModule
from genome_lm.model.upstream import Glm5NextTextAttention
from genome_lm.settings import DEFAULTS

from .chunk import absorbed_mla_attention
from .indexer import DSASelection, chunk_kpool_indexer, index_inputs, kpool_keys


class LongDSA(LongContextModule, Glm5NextTextAttention):
    """`Glm5NextTextAttention` in blockwise latent form, upstream's call and returns. `full` layers run
    the indexer (no gradients), `shared` ones reuse `prev_topk_indices` (a `DSASelection` or raw
    indices). Under `cp` the latent rows (differentiably) and index keys are all-gathered, so each
    rank scores one process's row; a `Cache` stores them as upstream does (with a `total_len`: top-k
    rows of total_len // kpool pools, as one pass)."""

    block_queries: int = DEFAULTS.dsa_block_queries
    cp: CPContext | None = None
    read_values: bool = True  # False for tensors without values (fake): the padding check is skipped

    def configure(self, block_queries: int = DEFAULTS.dsa_block_queries) -> None:
        if block_queries < 1:
            raise ValueError(f"block_queries must be >= 1, got {block_queries}")
        if self.config.qk_rope_head_dim:
            raise NotImplementedError(
                f"layer {self.layer_idx}: qk_rope_head_dim={self.config.qk_rope_head_dim}; the latent DSA path "
                "supports NoPE DSA only, as upstream's Glm5NextTextConfig does (it rejects qk_rope_head_dim > 0)."
            )
        if self.config.attention_dropout:
            raise NotImplementedError(f"attention_dropout={self.config.attention_dropout}: the latent DSA path has no "
                                      "dropout")
        self.block_queries = int(block_queries)

    def extra_repr(self) -> str:
        return f"block_queries={self.block_queries}, cp={self.cp}"

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None,
                prev_topk_indices=None, **kwargs):
        """hidden_states [B, T, D] -> ([B, T, D], None, selection | None)."""
        cache = cache if cache is not None else kwargs.get("past_key_values")
        if attention_mask is not None and (attention_mask.dim() != 2 or self.read_values
                                           and not bool(attention_mask.all())):
            raise ValueError("genome_lm's DSA layers take unpadded batches only (a [B, T] attention_mask "
                             "that is all True)")
        cp, block = self.cp, self.block_queries
        if cp is not None:
            if cache is not None:
                raise NotImplementedError("context-parallel DSA is for training (no cache); score with one process")
            cp.check_local(hidden_states.shape[1])
        B, T, _ = hidden_states.shape
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))  # [B, T, q_lora]
        q = self.q_b_proj(q_resid).view(B, T, self.num_heads, self.qk_head_dim)  # [B, T, H, DN] (no rope part)
        c = self.kv_a_layernorm(self.kv_a_proj_with_mqa(hidden_states)[..., : self.kv_lora_rank])  # [B, T, R]
        kv, start = c, 0
        if cache is not None:  # upstream's layout: latent [B, 1, S, R] and an empty rope part
            kv = cache.update(c[:, None], c.new_zeros(*c.shape[:2], 0)[:, None], self.layer_idx)[0][:, 0]
            start = kv.shape[1] - c.shape[1]
        elif cp is not None:
            kv, start = gather_seq(c, cp.lengths, cp.group), cp.start  # [B, T, R]
        if self.indexer is None:
            if prev_topk_indices is None:
                raise ValueError(f"layer {self.layer_idx}: shared DSA layers require top-k indices from a previous "
                                 "full indexer layer.")
            selection = prev_topk_indices if isinstance(prev_topk_indices, DSASelection) else DSASelection(
                None, kpool=1, tail=False, token_indices=prev_topk_indices)
        else:
            ix = self.indexer
            q_idx, weights, keys, gate = index_inputs(ix, hidden_states, q_resid)
            with torch.no_grad():
                if cache is not None or cp is not None:  # the index keys of the whole prefix
                    both = torch.cat([keys, gate.to(keys.dtype)], dim=-1)  # [B, T, 2 DI]
                    if cache is not None:  # upstream packs [keys | gate | valid]
                        both = cache.update_indexer(torch.cat([both, both.new_ones(*both.shape[:2], 1)], -1),
                                                    self.layer_idx)[..., :-1]
                    elif cp is not None:
                        both = gather_seq(both, cp.lengths, cp.group)
                    keys, gate = both[..., : keys.shape[-1]], both[..., keys.shape[-1]:].to(gate.dtype)
                pools = kpool_keys(keys, gate, ix.index_kpool_compress_ape, ix.index_kpool)  # [B, S // kpool, DI]
            total = getattr(cache, "total_len", None)  # known final length (`StreamingCache`)
            selection = chunk_kpool_indexer(
                q_idx, weights, pools, ix.index_topk, ix.index_kpool, ix.index_kpool_always_select_tail,
                ix.softmax_scale, start=start, block_queries=block,
                row_pools=None if total is None else max(total // ix.index_kpool, pools.shape[1]),
            )
        o = absorbed_mla_attention(q, kv, self.kv_b_proj.weight, selection, self.scaling, block)  # [B, T, H, DV]
        return self.o_proj(o.flatten(-2)), None, selection if self.next_skip_topk else None
