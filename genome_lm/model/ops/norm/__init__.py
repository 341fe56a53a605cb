"""RMSNorms that keep only their input for backward (`rms.py`); upstream's forwards are the references."""

from genome_lm.model.ops.norm.rms import (
    LeanRMSNorm,
    gated_rms_norm,
    rms_norm,
    upstream_gated_rms_norm,
    upstream_rms_norm,
)

__all__ = ["LeanRMSNorm", "gated_rms_norm", "rms_norm", "upstream_gated_rms_norm", "upstream_rms_norm"]
