"""Kimi Delta Attention: `naive` (references), `chunk` (chunked op), `conv` / `gate` / `norm` (lean
short conv, forget gate and output norm), `layer` (`LongKDA`), `step` (one piece given the state
before it), `cp` (the context-parallel slab path)."""

from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.conv import KDAShortConv, short_conv
from genome_lm.model.ops.kda.gate import KDAForgetGate, kda_gate
from genome_lm.model.ops.kda.layer import LongKDA
from genome_lm.model.ops.kda.naive import naive_recurrent_kda, naive_short_conv
from genome_lm.model.ops.kda.norm import KDAOutputNorm
from genome_lm.model.ops.kda.step import KDAState, kda_layer_step

__all__ = ["chunk_kda", "naive_recurrent_kda", "naive_short_conv", "short_conv", "kda_gate", "KDAShortConv",
           "KDAForgetGate", "KDAOutputNorm", "KDAState", "kda_layer_step", "LongKDA"]
