"""Kimi Delta Attention: `naive.py` (token-by-token reference), `chunk.py` (chunked op),
`layer.py` (upstream `Glm5NextTextLinearAttention` forward on top of `chunk_kda`)."""

from genome_lm.model.ops.kda.chunk import chunk_kda
from genome_lm.model.ops.kda.layer import (
    KDAState,
    is_kda_patched,
    kda_layer_forward,
    kda_layer_step,
    patch_kda_module,
)
from genome_lm.model.ops.kda.naive import naive_recurrent_kda

__all__ = [
    "chunk_kda",
    "naive_recurrent_kda",
    "KDAState",
    "kda_layer_step",
    "kda_layer_forward",
    "patch_kda_module",
    "is_kda_patched",
]
