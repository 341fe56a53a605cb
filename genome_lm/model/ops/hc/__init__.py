"""Hyper-connections (`hc_mult` residual streams): upstream's forward, recomputed in backward.

The plain reference is upstream's own `Glm5NextTextHyperConnection.forward` (`upstream_hc_forward`).
"""

from genome_lm.model.ops.hc.layer import RecomputedHyperConnection, upstream_hc_forward

__all__ = ["RecomputedHyperConnection", "upstream_hc_forward"]
