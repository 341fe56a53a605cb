"""Hyper-connections (`hc_mult` residual streams): upstream's forward, recomputed in backward.

The plain reference is upstream's own `Glm5NextTextHyperConnection.forward` (`upstream_hc_forward`).
"""

from genome_lm.model.ops.hc.layer import is_hc_patched, patch_hc_module, upstream_hc_forward

__all__ = ["patch_hc_module", "is_hc_patched", "upstream_hc_forward"]
