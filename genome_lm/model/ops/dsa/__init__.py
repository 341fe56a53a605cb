"""DeepSeek Sparse Attention (GLM-5.3-Flash DSA layers) at long T.

- `naive`: plain O(T²) reference of upstream's semantics (tests only).
- `indexer`: blockwise k-pool indexer -> `DSASelection` (pool ids per query + tail rule).
- `chunk`: blockwise sparse attention in absorbed-MLA (latent) form, custom autograd.
- `layer`: `LongDSA` (training, context parallel, transformers Cache for decoding and streaming).
"""

from .chunk import absorbed_mla_attention, sparse_latent_attention
from .indexer import DSASelection, chunk_kpool_indexer, index_inputs, kpool_keys
from .layer import LongDSA
from .naive import naive_dsa_forward, naive_kpool_indexer, naive_mla_attention, naive_selection_mask

__all__ = ["DSASelection", "LongDSA", "absorbed_mla_attention", "chunk_kpool_indexer", "index_inputs", "kpool_keys",
           "naive_dsa_forward", "naive_kpool_indexer", "naive_mla_attention", "naive_selection_mask",
           "sparse_latent_attention"]
