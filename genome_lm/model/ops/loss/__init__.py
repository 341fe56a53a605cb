"""LM head + cross-entropy: `naive_cross_entropy` (all logits) and `chunked_cross_entropy`."""

from genome_lm.model.ops.loss.chunk import DEFAULT_CHUNK_TOKENS, chunked_cross_entropy
from genome_lm.model.ops.loss.naive import IGNORE_INDEX, naive_cross_entropy

__all__ = ["DEFAULT_CHUNK_TOKENS", "IGNORE_INDEX", "chunked_cross_entropy", "naive_cross_entropy"]
