"""The dense SwiGLU MLP that keeps only x and its two projections for backward (`swiglu.py`)."""

from genome_lm.model.ops.mlp.swiglu import LeanMLP, swiglu_mlp, upstream_mlp

__all__ = ["LeanMLP", "swiglu_mlp", "upstream_mlp"]
