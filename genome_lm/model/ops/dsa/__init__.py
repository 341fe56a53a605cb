"""DeepSeek Sparse Attention at long T: `naive` (O(T²) reference), `indexer` (blockwise k-pool
selection), `chunk` (sparse attention in absorbed-MLA latent form), `layer` (`LongDSA`)."""

from .chunk import absorbed_mla_attention, sparse_latent_attention
from .indexer import DSASelection, chunk_kpool_indexer, index_inputs, kpool_keys
from .layer import LongDSA
from .naive import naive_dsa_forward, naive_kpool_indexer, naive_mla_attention, naive_selection_mask

__all__ = ["DSASelection", "LongDSA", "absorbed_mla_attention", "chunk_kpool_indexer", "index_inputs", "kpool_keys",
           "naive_dsa_forward", "naive_kpool_indexer", "naive_mla_attention", "naive_selection_mask",
           "sparse_latent_attention"]
