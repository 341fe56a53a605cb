"""Kimi Delta Attention: `naive.py` (token-by-token reference, the short conv's reference),
`chunk.py` (chunked op), `conv.py` / `gate.py` / `norm.py` (the short conv + SiLU, forget gate and
gated output norm, each keeping only its compute-dtype inputs), `layer.py` (`LongKDA`: upstream's
`Glm5NextTextLinearAttention` on them), `step.py` (`kda_layer_step`: one piece given the
`KDAState` before it), `cp.py` (the context-parallel slab path)."""

from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.conv import KDAShortConv, short_conv
from genome_lm.model.ops.kda.gate import KDAForgetGate, kda_gate
from genome_lm.model.ops.kda.layer import LongKDA
from genome_lm.model.ops.kda.naive import naive_recurrent_kda, naive_short_conv
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.ops.kda.step import KDAState, kda_layer_step

__all__ = ["chunk_kda", "naive_recurrent_kda", "naive_short_conv", "short_conv", "kda_gate", "KDAShortConv",
           "KDAForgetGate", "KDAOutputNorm", "KDAState", "kda_layer_step", "LongKDA"]
