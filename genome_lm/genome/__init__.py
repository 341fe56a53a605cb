"""Genome access and shards: FASTA reading, single-nucleotide tokens, windows, shards. The names below are
imported on first use, so that `genome-lm CMD --help` loads neither numpy nor pyarrow."""

from importlib import import_module
from typing import Any

_HOME = {"VOCAB": "tokenizer", "decode": "tokenizer", "encode": "tokenizer", "reverse_complement": "tokenizer",
         "load_manifest": "shards", "load_shards": "shards"}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
