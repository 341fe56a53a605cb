"""genome_lm: long-context fine-tuning of GLM-5.3-Flash on whole chromosomes."""

__version__ = "0.1.0"

from genome_lm.errors import GenomeLMError

__all__ = ["GenomeLMError", "__version__"]
