"""Genome access and shards: FASTA reading, single-nucleotide tokens, windows, shards."""

from genome_lm.genome.shards import load_manifest, load_shards
from genome_lm.genome.tokenizer import VOCAB, decode, encode, reverse_complement

__all__ = ["VOCAB", "decode", "encode", "load_manifest", "load_shards", "reverse_complement"]
