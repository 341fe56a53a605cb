"""Kimi Delta Attention: `naive.py` (token-by-token reference), `chunk.py` (chunked op),
`layer.py` (upstream `Glm5NextTextLinearAttention` forward on top of `chunk_kda`)."""

from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.naive import naive_recurrent_kda

__all__ = ["chunk_kda", "naive_recurrent_kda"]
