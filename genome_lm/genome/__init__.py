"""Genome access and shards: FASTA reading, single-nucleotide tokens, windows, shards. The names below are
imported on first use, so that `genome-lm CMD --help` loads neither numpy nor pyarrow."""

from genome_lm.errors import lazy_names

__all__, __getattr__ = lazy_names(__name__, {"tokenizer": "VOCAB decode encode reverse_complement",
                                             "shards": "load_manifest load_shards"})
