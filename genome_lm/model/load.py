"""Moved to `genome_lm.model.weights`; kept only for `genome_lm.parallel.fsdp`'s import of `keep_fp32`."""

from genome_lm.model.weights import keep_fp32  # noqa: F401
