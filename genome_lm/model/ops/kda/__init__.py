"""Kimi Delta Attention: `naive.py` (token-by-token reference), `chunk.py` (chunked op),
`layer.py` (`LongKDA`: upstream's `Glm5NextTextLinearAttention` on `chunk_kda`), `cp.py` (its
context-parallel slab path)."""

from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.layer import KDAState, LongKDA, kda_layer_step
from genome_lm.model.ops.kda.naive import naive_recurrent_kda

__all__ = ["chunk_kda", "naive_recurrent_kda", "KDAState", "kda_layer_step", "LongKDA"]
