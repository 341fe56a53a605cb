"""Segmental duplications for the synthetic genome (`synth`): stretches of earlier records copied
into a later one (chr1/chr2 -> chr22), so that the held-out chromosome shares exact K-mers with
the training ones, as hg38's chr22 does (~10% of it lies in segmental duplications, many in 22q11).
`prepare --leakage-k` must mark them; the sidecar TSV `F.segdups.tsv` says where they are.

A copy is its source's bases uppercased (the source's soft-masked repeats are not re-listed as
repeat copies), every other one reverse-complemented, with substitutions at `substitution_rate`
per base. Sources hold only A/C/G/T (no N, no IUPAC code); targets are free
stretches of the receiving record (`synth` reserves them before planting its repeats). Coordinates
are 0-based, half-open, forward strand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TSV_HEADER = "chrom\tstart\tend\tstrand\tsource_chrom\tsource_start\tsource_end\tsubstitutions\n"
_ACGT = np.frombuffer(b"ACGT", dtype=np.uint8)
_TO_CODE = np.full(256, 255, dtype=np.uint8)
for _i, _b in enumerate(b"ACGT"):
    _TO_CODE[_b] = _TO_CODE[_b + 32] = _i  # upper and lower case


@dataclass(frozen=True)
class SegDup:
    """chrom[start:end] is source_chrom[source_start:source_end] (reverse-complemented if strand '-')
    with `substitutions` bases changed."""

    chrom: str
    start: int
    end: int
    strand: str
    source_chrom: str
    source_start: int
    source_end: int
    substitutions: int


def plant_segdups(rng: np.random.Generator, name: str, seq: np.ndarray, occ, sources: dict[str, bytes], n: int,
                  min_len: int, max_len: int, region: tuple[float, float], substitution_rate: float) -> list[SegDup]:
    """Write up to `n` copies of stretches of `sources` into `seq` (ASCII, in place) within
    `region` (fractions of its length), where `occ` (synth's occupancy: `free(a, b)`, `add(a, b)`)
    has room; each reserves its interval in `occ`."""
    out: list[SegDup] = []
    names = list(sources)
    lo, hi = int(region[0] * len(seq)), int(region[1] * len(seq))
    for i in range(n):
        length = int(np.exp(rng.uniform(np.log(min_len), np.log(max_len))))
        src_name = names[rng.integers(len(names))]
        src = np.frombuffer(sources[src_name], dtype=np.uint8)
        if len(src) <= length or hi - lo <= length:
            continue
        for _ in range(100):  # a source stretch of A/C/G/T only
            s = int(rng.integers(0, len(src) - length))
            codes = _TO_CODE[src[s : s + length]]
            if (codes < 4).all():
                break
        else:
            continue
        for _ in range(100):
            a = int(rng.integers(lo, hi - length))
            if occ.free(a, a + length):
                break
        else:
            continue
        strand = "-" if i % 2 else "+"
        copy = (3 - codes)[::-1] if strand == "-" else codes.copy()
        hit = rng.random(length) < substitution_rate
        copy[hit] = (copy[hit] + rng.integers(1, 4, size=int(hit.sum()), dtype=np.uint8)) % 4
        seq[a : a + length] = _ACGT[copy]
        occ.add(a, a + length)
        out.append(SegDup(name, a, a + length, strand, src_name, s, s + length, int(hit.sum())))
    return sorted(out, key=lambda d: d.start)


def format_segdups(segdups: list[SegDup]) -> str:
    return TSV_HEADER + "".join(f"{d.chrom}\t{d.start}\t{d.end}\t{d.strand}\t{d.source_chrom}\t{d.source_start}\t"
                                f"{d.source_end}\t{d.substitutions}\n" for d in segdups)


def read_segdups(path: str | os.PathLike) -> list[SegDup]:
    """Read a sidecar TSV written by `synth_files.write_synthetic_fasta`."""
    rows = (row.split("\t") for row in Path(path).read_text().splitlines()[1:])
    return [SegDup(c, int(a), int(b), strand, sc, int(sa), int(sb), int(k)) for c, a, b, strand, sc, sa, sb, k in rows]
