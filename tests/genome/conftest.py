"""FASTA fixtures made in code: known sequences written with any line width, line end and compression."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest


def random_chrom(rng: np.random.Generator, length: int, n_runs=(), lower_frac=0.3, iupac: int = 0) -> str:
    """A chromosome string with soft-masked stretches, N runs [(start, end)] and a few IUPAC codes."""
    seq = np.frombuffer(b"ACGT", np.uint8)[rng.integers(0, 4, length)].copy()
    lower = np.zeros(length, dtype=bool)
    for _ in range(max(1, int(length * lower_frac / 50))):
        s = int(rng.integers(0, length))
        lower[s : s + int(rng.integers(1, 100))] = True
    seq[lower] += 32
    for _ in range(iupac):
        seq[int(rng.integers(0, length))] = ord(rng.choice(list("RYKMSWBDHVryk")))
    for s, e in n_runs:
        seq[s:e] = ord("N")
    return seq.tobytes().decode()


def write_fasta(path: Path, records: dict[str, str], width: int = 60, crlf: bool = False,
                compression: str = "none", header_extra: str = " some description") -> Path:
    nl = "\r\n" if crlf else "\n"
    parts = []
    for name, seq in records.items():
        parts.append(f">{name}{header_extra}{nl}")
        parts.extend(seq[i : i + width] + nl for i in range(0, len(seq), width))
    data = "".join(parts).encode()
    if compression == "gzip":
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(data)
    elif compression == "bgzip":
        from Bio import bgzf

        with bgzf.BgzfWriter(str(path), "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


@pytest.fixture
def genome():
    """Three chromosomes with gaps, soft-masking and IUPAC codes (sizes chosen to exercise tails)."""
    rng = np.random.default_rng(7)
    return {
        "chr1": random_chrom(rng, 5000, n_runs=[(0, 120), (2000, 2300), (4990, 5000)], iupac=3),
        "chr2": random_chrom(rng, 3333, n_runs=[(1000, 1010)], iupac=2),
        "chr22": random_chrom(rng, 2100, n_runs=[(0, 700)]),
    }
