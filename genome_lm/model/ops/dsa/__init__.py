"""DeepSeek Sparse Attention at long T: `naive` (O(T²) reference), `indexer` (blockwise k-pool
selection), `chunk` (sparse attention in absorbed-MLA latent form), `layer` (`LongDSA`)."""

from .chunk import absorbed_mla_attention, sparse_latent_attention
from .indexer import DSASelection
from .layer import LongDSA
from .naive import naive_dsa_forward

__all__ = ["DSASelection", "LongDSA", "absorbed_mla_attention", "naive_dsa_forward", "sparse_latent_attention"]
