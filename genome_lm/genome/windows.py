"""Contigs and windows on one chromosome (docs/prepare.md). Coordinates are 0-based, half-open."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from genome_lm.genome.tokenizer import IUPAC_CODES, IUPAC_SHIFT, N_ID, SOFTMASK_BIT, TOKEN_MASK

RUN_BLOCK = 1 << 24


@dataclass
class ChromScan:
    """What one pass over a chromosome's codes finds (see `scan`)."""

    gaps: np.ndarray  # int64 [R, 2]: N runs of at least min_gap bases (start, end)
    n_bases: int  # N tokens, IUPAC codes included
    softmasked_bases: int
    iupac: dict[str, int]  # ambiguity code -> count


def scan(codes: np.ndarray, min_gap: int = 1) -> ChromScan:
    """One blockwise pass over codes [T]: N runs of at least `min_gap`, N / soft-mask / IUPAC counts.

    Transient memory is O(block), not O(T).
    """
    edges: list[np.ndarray] = []
    prev = False
    n_bases = softmasked = 0
    iupac = np.zeros(16, dtype=np.int64)
    for b0 in range(0, len(codes), RUN_BLOCK):
        block = codes[b0 : b0 + RUN_BLOCK]
        isn = (block & TOKEN_MASK) == N_ID
        n_bases += int(np.count_nonzero(isn))
        softmasked += int(np.count_nonzero(block & SOFTMASK_BIT))
        iupac += np.bincount(block[block >= (1 << IUPAC_SHIFT)] >> IUPAC_SHIFT, minlength=16)
        if isn[0] != prev:
            edges.append(np.array([b0], dtype=np.int64))
        edges.append(np.flatnonzero(isn[1:] != isn[:-1]).astype(np.int64) + (b0 + 1))
        prev = bool(isn[-1])
    if prev:
        edges.append(np.array([len(codes)], dtype=np.int64))
    flat = np.concatenate(edges) if edges else np.zeros(0, dtype=np.int64)
    runs = flat.reshape(-1, 2)  # alternating start, end
    counts = {code: int(iupac[i]) for i, code in enumerate(IUPAC_CODES, start=1) if iupac[i]}
    return ChromScan(runs[(runs[:, 1] - runs[:, 0]) >= min_gap], n_bases, softmasked, counts)


def contigs(length: int, gaps: np.ndarray) -> list[tuple[int, int]]:
    """The spans between `gaps` [R, 2] (sorted, disjoint) on a sequence of `length` bases."""
    bounds = np.concatenate([[0], gaps.ravel(), [length]]).reshape(-1, 2).tolist()  # (end of a gap, next start)
    return [(s, e) for s, e in bounds if e > s]


@dataclass(frozen=True)
class WindowSpec:
    seq_len: int
    stride: int
    tail: str = "keep"  # keep | drop
    min_len: int = 1


def contig_windows(start: int, end: int, spec: WindowSpec) -> tuple[list[tuple[int, int]], int]:
    """Windows inside the contig [start, end) and the number of its bases no window covers
    because the tail was dropped (too short, or tail == 'drop')."""
    spans = [(s, s + spec.seq_len) for s in range(start, end - spec.seq_len + 1, spec.stride)]
    s = start + len(spans) * spec.stride  # where the tail starts
    covered = spans[-1][1] if spans else start
    if s < end and covered < end:  # the tail: [s, end), shorter than seq_len
        if spec.tail == "keep" and end - s >= spec.min_len:
            spans.append((s, end))
            covered = end
    dropped_tail = max(0, end - covered) if spec.stride <= spec.seq_len or not spans else 0
    return spans, dropped_tail
