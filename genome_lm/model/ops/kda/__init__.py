"""Kimi Delta Attention: `naive` (references), `chunk` (chunked op), `conv` / `gate` / `norm` (lean
short conv, forget gate, output norm), `layer` (`LongKDA`), `cp` (the context-parallel core)."""

from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.layer import LongKDA
from genome_lm.model.ops.kda.naive import naive_recurrent_kda

__all__ = ["chunk_kda", "naive_recurrent_kda", "LongKDA"]
