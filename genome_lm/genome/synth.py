"""A deterministic SYNTHETIC genome for demos and tests (`genome-lm synth`): no base comes from a real
organism. It imitates hg38's large-scale structure (chr1, chr2, chr22; soft-masked repeats; N gaps)
at a few Mbp and plants information only long context can use. In the order it is built:

1. N runs: telomeres, a centromere, chr22's acrocentric short arm (~17%), short runs in the arms.
2. Background: isochore-like segments of 20-300 kbp with their own GC content (35-60%), CpG
   depleted; or (`markov_order` K > 0) an order-K Markov chain per segment (`markov.py`).
3. Repeat copies (lowercase): clusters of copies of `n_families` consensus sequences, each copy the
   previous one mutated ~3%, `d` bases after it (log-uniform up to `max_distance`); optionally
   tandem arrays (`tandem_*`; none in the demo genome).
4. A few IUPAC ambiguity codes.
5. Optionally (`segdup_count` > 0) segmental duplications of earlier records into chr22
   (`segdups.py`), so the held-out record shares K-mers with the training ones.

Same parameters and seed -> the same genome (PCG64 per record). Parameters: `synth_params.py`;
planting: `planting.py`; files: `synth_files.py`. Coordinates 0-based, half-open, forward strand."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.genome.markov import additive_rows, dirichlet_rows, markov_bases
from genome_lm.genome.planting import (
    UPPER,
    N,
    Occupancy,
    RepeatCopy,
    first,
    make_families,
    n_runs,
    plant_repeats,
    plant_tandems,
    random_bases,
)
from genome_lm.genome.segdups import SegDup, plant_segdups
from genome_lm.genome.synth_params import ChromSpec, SynthParams, make_params

IUPAC = np.frombuffer(b"RYKMSWBDHV", dtype=np.uint8)


@dataclass
class SynthGenome:
    """The generated genome: sequences (ASCII bytes), family consensus sequences, copies, and the
    segmental duplications (not among the repeat copies: they are uppercase)."""

    sequences: dict[str, bytes]
    families: dict[str, bytes]
    copies: list[RepeatCopy]
    segdups: list[SegDup] = field(default_factory=list)

    def repeat_fraction(self) -> float:
        """Share of non-N bases that lie in planted copies."""
        non_n = sum(len(s) - s.count(b"N") for s in self.sequences.values())
        return sum(c.end - c.start for c in self.copies) / max(non_n, 1)


def _chromosome(seed: int, index: int, spec: ChromSpec, scale: float, p: SynthParams, families,
                earlier: dict[str, bytes]) -> tuple[np.ndarray, list[RepeatCopy], list[SegDup]]:
    rng = np.random.default_rng([seed, 1, index])
    length = round(spec.length * scale)
    runs = n_runs(rng, spec, length, scale, p)

    # Background: isochores with their own GC, then CpG depletion.
    seg_len = np.exp(rng.uniform(np.log(p.isochore_min), np.log(p.isochore_max), size=length // p.isochore_min + 2))
    seg_gc = rng.uniform(p.gc_min, p.gc_max, size=len(seg_len))
    gc = np.repeat(seg_gc, np.ceil(seg_len).astype(int))[:length]
    if p.markov_order:  # own stream: the default genome is unchanged
        rows = (partial(dirichlet_rows, order=p.markov_order, alpha=p.markov_alpha) if p.markov_rows == "dirichlet"
                else partial(additive_rows, order=p.markov_order, scale=p.markov_scale))
        codes = markov_bases(np.random.default_rng([seed, 4, index]), seg_len, p.markov_order, length, rows)
    else:
        codes = random_bases(rng, gc, length)
    cg = np.flatnonzero((codes[:-1] == 1) & (codes[1:] == 2) & (rng.random(length - 1) < p.cpg_depletion))
    to_tg = rng.random(len(cg)) < 0.5
    codes[cg[to_tg]] = 3  # C -> T
    codes[cg[~to_tg] + 1] = 0  # G -> A
    seq = UPPER[codes]
    for a, b in runs:
        seq[a:b] = N

    occ = Occupancy(length, runs)
    segdups = []
    if p.segdup_count and spec.name == p.segdup_into:  # own stream, before the repeats: they plant around them
        segdups = plant_segdups(np.random.default_rng([seed, 3, index]), spec.name, seq, occ, earlier,
                                max(1, round(p.segdup_count * scale)), p.segdup_min_len, p.segdup_max_len,
                                p.segdup_region, p.segdup_substitution_rate)
    copies = plant_repeats(rng, spec.name, seq, occ, families, p)
    if p.tandem_fraction:  # in the space the interspersed copies left; own random stream: nothing else depends on it
        copies += plant_tandems(np.random.default_rng([seed, 2, index]), spec.name, seq, occ, p)

    # IUPAC codes: uppercase, in the background (neither N nor a copy).
    for _ in range(max(1, round(length / p.iupac_every))):
        i = first(100, lambda: int(rng.integers(0, length)), lambda i: 65 <= seq[i] <= 90 and seq[i] != N)
        if i is not None:  # an uppercase base, not N
            seq[i] = IUPAC[rng.integers(len(IUPAC))]
    return seq, copies, segdups


MAX_BASES = 1_000_000_000  # a whole synthetic genome in memory, ~10 bytes per base while it is built


def synthesize_genome(scale: float = 1.0, seed: int = 0, params: SynthParams | None = None) -> SynthGenome:
    """Generate the genome in memory, with its families and planted copies."""
    params = params or SynthParams()
    if seed < 0:
        raise GenomeLMError(f"--seed {seed}: give a whole number >= 0")
    bases = sum(c.length for c in params.chroms)  # at scale 1
    total = bases * scale if scale > 0 else 0
    if total > MAX_BASES:  # inf too
        raise GenomeLMError(f"--scale {scale} asks for {total:,.0f} bases; the genome is built in memory, up to "
                            f"{MAX_BASES:,} bases (--scale {MAX_BASES / bases:g})")
    if not total or min(round(c.length * scale) for c in params.chroms) < 5_000:
        raise GenomeLMError(f"--scale {scale} is too small (every record needs >= 5 kbp); use a scale of at least 0.01")
    families = make_families(np.random.default_rng([seed, 0]), params)
    sequences: dict[str, bytes] = {}
    copies: list[RepeatCopy] = []
    segdups: list[SegDup] = []
    for i, spec in enumerate(params.chroms):
        seq, chrom_copies, chrom_segdups = _chromosome(seed, i, spec, scale, params, families, dict(sequences))
        sequences[spec.name] = seq.tobytes()
        copies += chrom_copies
        segdups += chrom_segdups
    return SynthGenome(sequences, {k: UPPER[v].tobytes() for k, v in families.items()}, copies, segdups)


def synthesize(scale: float = 1.0, seed: int = 0, **params) -> dict[str, bytes]:
    """Sequence bytes per record name (chr1, chr2, chr22); `params` override SynthParams fields."""
    return synthesize_genome(scale, seed, make_params(**params)).sequences
