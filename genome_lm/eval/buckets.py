"""Context buckets: the tokens before a token that the model saw (its position in the scored piece,
`scoring.py`), grouped into ranges: bucket k is [edges[k], edges[k+1])."""

from __future__ import annotations

import numpy as np

from genome_lm.errors import GenomeLMError


def log2_edges(max_context: int) -> np.ndarray:
    """[0, 1, 2, 4, ..., 2^k] with 2^k > max_context: every context 0..max_context has a bucket."""
    return np.concatenate([[0], 2 ** np.arange(max(max_context, 0).bit_length() + 1)]).astype(np.int64)


def parse_edges(spec: str) -> np.ndarray:
    """'0,16,256,4096' -> int64 [K+1]; strictly increasing, non-negative integers (k/M allowed)."""
    from genome_lm.sizes import parse_size

    parts = [p.strip() for p in spec.split(",") if p.strip()]
    try:
        edges = np.asarray([parse_size(p, "--buckets") for p in parts], dtype=np.int64)
    except GenomeLMError:
        raise GenomeLMError(f"--buckets {spec!r}: use 'log2' or comma-separated integer edges, "
                            "e.g. 0,16,256,4k") from None
    if len(edges) < 2 or np.any(np.diff(edges) <= 0):
        raise GenomeLMError(f"--buckets {spec!r}: give at least two strictly increasing edges, e.g. 0,16,256,4k")
    return edges


def bucket_edges(spec: str, max_context: int) -> np.ndarray:
    """Edges int64 [K+1] for a `--buckets` value: 'log2' (default) or explicit edges."""
    spec = (spec or "log2").strip()
    return log2_edges(max_context) if spec == "log2" else parse_edges(spec)


def assign(contexts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bucket index int64 [N] of each context in `contexts` [N]; -1 where outside [edges[0], edges[-1])."""
    idx = np.searchsorted(edges, contexts, side="right") - 1
    idx[(contexts < edges[0]) | (contexts >= edges[-1])] = -1
    return idx


def contexts_of(length: int, seq_len: int) -> np.ndarray:
    """Preceding context int64 [length] of each token of a window scored in pieces of `seq_len`."""
    return np.arange(length, dtype=np.int64) % seq_len
