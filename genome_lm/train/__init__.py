"""Training: config -> model -> memory strategies -> loop, with checkpoints and metrics."""

from genome_lm.train.trainer import dry_run, train

__all__ = ["dry_run", "train"]
