"""Context-parallel DSA layer: this rank's queries over the whole causal prefix.

Per layer, each rank projects its own slab and all-gathers
  - the latent rows c [B, T_r, R] -> [B, T, R], differentiably (queries of later ranks attend to
    earlier ranks' rows; their gradients flow back to the rank that made them);
  - for `full` indexer layers, the index keys and compression gates [B, T_r, DI] (no gradient,
    as upstream's indexer) -> the pool keys of the whole sequence, exactly the row of
    T // kpool pools a single process scores, so `torch.topk` sees the same row and ties
    resolve the same way.
Top-k selection for its own queries uses the indexer's `start` offset (absolute positions);
`shared` layers reuse that selection as upstream does; attention runs in latent form over the
gathered rows. Memory per rank: the gathered latent O(T·R) and index keys O(T·DI) per layer,
the rest O(T_r).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from genome_lm.model.ops.dsa import chunk_kpool_indexer, index_inputs, kpool_keys
from genome_lm.model.ops.dsa.layer import _as_selection, _attend, _projections
from genome_lm.parallel.collectives import gather_seq


def cp_dsa_forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None,
                   prev_topk_indices=None, **kwargs):
    """Patched DSA forward for this rank's slab [B, T_r, D] -> ([B, T_r, D], None, selection|None)."""
    if cache is not None or kwargs.get("past_key_values") is not None:
        raise NotImplementedError("context-parallel DSA is for training (no cache); score with one process")
    if attention_mask is not None and (attention_mask.dim() != 2 or not bool(attention_mask.all())):
        raise ValueError("context-parallel DSA takes unpadded batches only (an all-True [B, T] attention_mask)")
    cp = self._genome_lm_cp
    cp.check_local(hidden_states.shape[1])
    block = self._dsa_block_queries
    q_resid, q, c = _projections(self, hidden_states)  # c [B, T_r, R]
    if self.indexer is None:
        selection = _as_selection(prev_topk_indices, self.layer_idx)
    else:
        ix = self.indexer
        q_idx, weights, keys, gate = index_inputs(ix, hidden_states, q_resid)
        with torch.no_grad():
            both = gather_seq(torch.cat([keys, gate.to(keys.dtype)], dim=-1), cp.lengths, cp.group)  # [B, T, 2 DI]
            keys_all, gate_all = both.split([keys.shape[-1], gate.shape[-1]], dim=-1)
            pools = kpool_keys(keys_all, gate_all.to(gate.dtype), ix.index_kpool_compress_ape, ix.index_kpool)
        selection = chunk_kpool_indexer(
            q_idx, weights, pools, ix.index_topk, ix.index_kpool, ix.index_kpool_always_select_tail,
            ix.softmax_scale, start=cp.start, block_queries=block,
        )
    kv = gather_seq(c, cp.lengths, cp.group)  # [B, T, R]
    out = _attend(self, q, kv, selection, block)
    return out, None, selection if self.next_skip_topk else None


def patch_cp_dsa(module: nn.Module, cp) -> nn.Module:
    """Make one (long-context patched) DSA module run its slab's queries under context parallelism."""
    module._genome_lm_cp = cp
    module.forward = types.MethodType(cp_dsa_forward, module)
    return module
