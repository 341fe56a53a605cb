"""Training: config -> model -> memory strategies -> loop, with checkpoints and metrics."""

from genome_lm.train.trainer import train

__all__ = ["train"]
