"""Kimi Delta Attention: `naive` (references), `chunk` (chunked op), `conv` / `gate` / `norm` (lean
short conv, forget gate and output norm), `layer` (`LongKDA`, `kda_layer_step`: one piece given the
state before it), `cp` (the context-parallel core)."""

from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.layer import LongKDA
from genome_lm.model.ops.kda.naive import naive_recurrent_kda

__all__ = ["chunk_kda", "naive_recurrent_kda", "LongKDA"]
