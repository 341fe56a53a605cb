"""A deterministic synthetic genome for demos and tests: `genome-lm synth`.

This genome is SYNTHETIC. No base of it comes from a real organism. It imitates the large-
scale structure of hg38 (records chr1, chr2, chr22; soft-masked repeats; N gaps) at a few
Mbp so that the whole pipeline runs in seconds, and it plants information that only long
context can use, so that a model trained with longer context must reach a lower loss on
tokens that have long preceding context. What it plants, in the order it is built:

1. N runs (uppercase N): telomeres at both ends, a centromere in the middle, an acrocentric
   short arm on chr22 (its first ~17%), and a few short runs (100-500 bp) inside the arms.
2. Background (uppercase): isochore-like segments of 20-300 kbp, each with its own GC
   content in 35-60%, bases drawn independently, then CpG depleted (most CG -> TG or CA).
   Optionally (`markov_order` K > 0), each segment is instead an order-K Markov chain with a
   transition table of its own (`markov.py`), which only the segment's preceding sequence reveals.
3. Repeat copies (lowercase, i.e. soft-masked): `n_families` consensus sequences of 200 bp
   to 6 kbp. A copy *cluster* starts with a founder that diverges ~10% from its family's
   consensus; each later copy is the previous one mutated ~3% (substitutions plus small
   indels), possibly reverse-complemented, and starts `d` bases after it, with `d` log-
   uniform between max(`min_distance`, source length) and `max_distance` (default 64 kbp).
   A model that sees the source copy in its context can predict ~97% of the copy; a model
   that does not, cannot. About 40% of the non-N bases are repeat copies.
   Optionally (`tandem_fraction` > 0), tandem arrays (`tandem_*` fields; family 'tandem' in
   the sidecar TSV) put copies within a short context. The demo genome (`genome_lm/demo.py`
   `DEMO_GENOME`) has none: they reward a model state that adapts within a few hundred bases
   (docs/findings.md).
4. A few IUPAC ambiguity codes (R, Y, K, M, S, W, B, D, H, V; uppercase, in the background).
5. Optionally (`segdup_count` > 0), segmental duplications (`segdups.py`): stretches of the
   earlier records copied, nearly exactly, into `segdup_into` (chr22) before its repeats are
   planted, so that the held-out record shares exact K-mers with the training ones (what
   `prepare --leakage-k` marks); sidecar `F.segdups.tsv`. Off by default.

Same parameters and seed -> the same bytes: numpy's PCG64 seeded per record, and gzip with
mtime 0 and no file name. Coordinates are 0-based, half-open, on the forward strand.
"""

from __future__ import annotations

import gzip
import logging
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from genome_lm.errors import GenomeLMError
from genome_lm.files import atomic_file
from genome_lm.genome.fasta import check_writable
from genome_lm.genome.markov import additive_rows, dirichlet_rows, markov_bases
from genome_lm.genome.planting import (
    SPACER,
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
from genome_lm.genome.segdups import SegDup, format_segdups, plant_segdups
from genome_lm.options import validate

log = logging.getLogger(__name__)

LINE_WIDTH = 60
IUPAC = np.frombuffer(b"RYKMSWBDHV", dtype=np.uint8)
TSV_HEADER = "chrom\tstart\tend\tstrand\tfamily\tsource_start\n"


@dataclass(frozen=True)
class ChromSpec:
    """One record of the synthetic genome."""

    name: str
    length: int  #: bases at scale 1.0
    centromere: float  #: centre of the centromere N run, as a fraction of the length
    short_arm: float = 0.0  #: leading fraction that is one N block (acrocentric short arm)


class SynthParams(BaseModel):
    """Everything that shapes the synthetic genome; `synthesize(**overrides)` replaces fields, and
    `genome-lm synth --config FILE.yaml --set NAME=VALUE` (docs/config.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chroms: tuple[ChromSpec, ...] = (
        ChromSpec("chr1", 1_800_000, centromere=0.45),
        ChromSpec("chr2", 1_500_000, centromere=0.38),
        ChromSpec("chr22", 700_000, centromere=0.27, short_arm=0.17),
    )
    gc_min: float = 0.35  #: lowest GC fraction of an isochore
    gc_max: float = 0.60  #: highest GC fraction of an isochore
    isochore_min: int = 20_000  #: shortest isochore (bases; log-uniform lengths)
    isochore_max: int = 300_000  #: longest isochore
    cpg_depletion: float = 0.75  #: probability that a background CG is mutated to TG or CA
    markov_order: int = 0  #: >0: each isochore's background is an order-K Markov chain of its own (markov.py)
    markov_rows: Literal["dirichlet", "additive"] = "additive"  #: how each isochore draws its chain's table
    markov_alpha: float = 0.5  #: "dirichlet": concentration of each row (smaller: more predictable)
    markov_scale: float = 0.6  #: "additive": standard deviation of the per-position log-odds A[i, a, b]
    n_families: int = 40  #: number of repeat families (consensus sequences)
    family_min_len: int = 200  #: shortest consensus (log-uniform lengths)
    family_max_len: int = 6_000  #: longest consensus
    founder_divergence: float = 0.10  #: substitution rate of a cluster's founder vs consensus
    substitution_rate: float = 0.03  #: per-base substitution rate of a copy vs its source
    indel_rate: float = 0.002  #: per-base rate of 1-3 bp insertions or deletions, copy vs source
    reverse_fraction: float = 0.3  #: probability that a copy lies on the minus strand
    mean_copies: float = 4.0  #: mean copies per cluster, founder included (at least 2 planned)
    repeat_fraction: float = 0.40  #: target share of non-N bases that are repeat copies
    min_distance: int = 1_000  #: shortest start-to-start distance from a copy to its source
    max_distance: int = 65_536  #: longest start-to-start distance from a copy to its source
    telomere: int = 10_000  #: N run at each end (bases at scale 1.0)
    centromere_frac: float = 0.03  #: centromere N run as a fraction of the length
    inner_gap_every: int = 400_000  #: one short inner N run per this many bases (at least one)
    inner_gap_min: int = 100  #: shortest inner N run
    inner_gap_max: int = 500  #: longest inner N run
    iupac_every: int = 200_000  #: one IUPAC code per this many bases (at least one)
    tandem_fraction: float = 0.0  #: target share of non-N bases in tandem arrays (0: none)
    tandem_unit_min: int = 20  #: shortest tandem repeat unit (log-uniform lengths)
    tandem_unit_max: int = 200  #: longest tandem repeat unit
    tandem_copies_min: int = 4  #: fewest units in one array
    tandem_copies_max: int = 16  #: most units in one array
    tandem_divergence: float = 0.01  #: per-base substitution rate of a unit vs the one before it
    segdup_count: int = 0  #: segmental duplications copied into `segdup_into` (at scale 1.0; 0: none)
    segdup_into: str = "chr22"  #: the record that receives them (from the records before it)
    segdup_min_len: int = 1_000  #: shortest segmental duplication (log-uniform lengths)
    segdup_max_len: int = 8_000  #: longest
    segdup_region: tuple[float, float] = (0.0, 1.0)  #: where in `segdup_into`, as fractions of its length
    segdup_substitution_rate: float = 0.002  #: per-base substitution rate of a copy vs its source

    @model_validator(mode="after")
    def _check(self):
        checks = [
            (0 <= self.gc_min <= self.gc_max <= 1, "gc_min <= gc_max within [0, 1]"),
            (0 < self.isochore_min <= self.isochore_max, "0 < isochore_min <= isochore_max"),
            (0 <= self.markov_order <= 6, "0 <= markov_order <= 6"),
            (self.markov_alpha > 0 and self.markov_scale >= 0, "markov_alpha > 0 and markov_scale >= 0"),
            (0 < self.family_min_len <= self.family_max_len, "0 < family_min_len <= family_max_len"),
            (0 < self.min_distance <= self.max_distance, "0 < min_distance <= max_distance"),
            (self.family_max_len + SPACER <= self.max_distance, "family_max_len + 20 <= max_distance"),
            (0 <= self.repeat_fraction < 0.9, "0 <= repeat_fraction < 0.9"),
            (0 <= self.tandem_fraction and self.repeat_fraction + self.tandem_fraction < 0.9,
             "tandem_fraction >= 0 and repeat_fraction + tandem_fraction < 0.9"),
            (0 < self.tandem_unit_min <= self.tandem_unit_max, "0 < tandem_unit_min <= tandem_unit_max"),
            (2 <= self.tandem_copies_min <= self.tandem_copies_max, "2 <= tandem_copies_min <= tandem_copies_max"),
            (0 <= self.tandem_divergence <= 1, "0 <= tandem_divergence <= 1"),
            (self.mean_copies >= 2, "mean_copies >= 2"),
            (self.n_families >= 1, "n_families >= 1"),
            (0 < self.inner_gap_min <= self.inner_gap_max, "0 < inner_gap_min <= inner_gap_max"),
            (self.segdup_count >= 0, "segdup_count >= 0"),
            (0 < self.segdup_min_len <= self.segdup_max_len, "0 < segdup_min_len <= segdup_max_len"),
            (0 <= self.segdup_region[0] < self.segdup_region[1] <= 1, "0 <= segdup_region[0] < segdup_region[1] <= 1"),
            (0 <= self.segdup_substitution_rate <= 1, "0 <= segdup_substitution_rate <= 1"),
            (not self.segdup_count or self.segdup_into in [c.name for c in self.chroms[1:]],
             "segdup_into to name a record after the first (segmental duplications copy the records before it)"),
        ]
        for ok, what in checks:
            if not ok:
                raise ValueError(f"need {what}; change the --set (or keyword) that sets it")
        return self


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


# --- public API ------------------------------------------------------------------------

def make_params(**overrides) -> SynthParams:
    """SynthParams with some fields replaced; an unknown name or a bad value is a GenomeLMError."""
    return validate(SynthParams, overrides, "synthetic genome parameters", unknown="unknown")


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
    sequences, copies, segdups = {}, [], []
    for i, spec in enumerate(params.chroms):
        seq, chrom_copies, chrom_segdups = _chromosome(seed, i, spec, scale, params, families, dict(sequences))
        sequences[spec.name] = seq.tobytes()
        copies += chrom_copies
        segdups += chrom_segdups
    return SynthGenome(sequences, {k: UPPER[v].tobytes() for k, v in families.items()}, copies, segdups)


def synthesize(scale: float = 1.0, seed: int = 0, **params) -> dict[str, bytes]:
    """Sequence bytes per record name (chr1, chr2, chr22); `params` override SynthParams fields."""
    return synthesize_genome(scale, seed, make_params(**params)).sequences


def fasta_lines(name: str, seq: bytes, width: int = LINE_WIDTH) -> bytes:
    """'>name\\n' then the sequence in lines of `width` characters, each ending in '\\n'."""
    return b">" + name.encode() + b"\n" + b"".join(seq[i : i + width] + b"\n" for i in range(0, len(seq), width))


def _sidecar(fasta: str | os.PathLike, suffix: str) -> Path:
    fasta = Path(fasta)
    stem = fasta.name
    for ext in (".gz", ".fa", ".fasta", ".fna"):
        stem = stem.removesuffix(ext)
    return fasta.with_name(stem + suffix)


def repeats_path(fasta: str | os.PathLike) -> Path:
    """The sidecar TSV beside a FASTA: genome.fa.gz -> genome.repeats.tsv."""
    return _sidecar(fasta, ".repeats.tsv")


def segdups_path(fasta: str | os.PathLike) -> Path:
    """The segmental duplications' sidecar TSV (`segdups.read_segdups`): genome.fa.gz -> genome.segdups.tsv."""
    return _sidecar(fasta, ".segdups.tsv")


def read_repeats(path: str | os.PathLike) -> list[RepeatCopy]:
    """Read a sidecar TSV written by `write_synthetic_fasta`."""
    rows = (row.split("\t") for row in Path(path).read_text().splitlines()[1:])
    return [RepeatCopy(chrom, int(a), int(b), strand, fam, int(src)) for chrom, a, b, strand, fam, src in rows]


@dataclass(frozen=True)
class WrittenGenome:
    fasta: Path
    repeats: Path
    lengths: dict[str, int]
    repeat_fraction: float
    segdups: Path | None = None  #: the segdups sidecar, when the genome has any


def write_synthetic_fasta(out, scale: float = 1.0, seed: int = 0, overwrite: bool = False,
                          params: SynthParams | None = None) -> WrittenGenome:
    """Write the synthetic genome to `out` (gzip FASTA, 60 columns) and a sidecar TSV of the
    planted copies (chrom, start, end, strand, family, source_start) beside it, and one of the
    segmental duplications when there are any (`segdups_path`). `params` (see `make_params`)
    replaces the default SynthParams."""
    out = Path(out)
    if out.is_dir() or not out.name:
        raise GenomeLMError(f"--out {out} is a folder; give the FASTA file to write, e.g. {out / 'genome.fa.gz'}")
    if not out.name.endswith(".gz"):
        raise GenomeLMError(f"{out} is written gzip-compressed; give --out a name ending in .fa.gz")
    tsv, sd_tsv = repeats_path(out), segdups_path(out)
    for path in (out, tsv, sd_tsv):
        if path.exists() and not overwrite:
            raise GenomeLMError(f"{path} already exists; pass --overwrite to replace it")
    check_writable(out.parent)

    t0 = time.perf_counter()
    genome = synthesize_genome(scale, seed, params)

    try:  # the FASTA last: a failure (a full disk) removes the sidecars written before it
        with atomic_file(tsv, "w") as f:
            f.write(TSV_HEADER + "".join(f"{c.chrom}\t{c.start}\t{c.end}\t{c.strand}\t{c.family}\t{c.source_start}\n"
                                         for c in genome.copies))
        if genome.segdups:
            with atomic_file(sd_tsv, "w") as f:
                f.write(format_segdups(genome.segdups))
        else:
            sd_tsv.unlink(missing_ok=True)  # an earlier genome's (--overwrite)
        with atomic_file(out, "wb") as f, \
                gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=6) as gz:
            for name, seq in genome.sequences.items():
                gz.write(fasta_lines(name, seq))
    except BaseException:
        tsv.unlink(missing_ok=True)
        sd_tsv.unlink(missing_ok=True)
        raise
    lengths = {k: len(v) for k, v in genome.sequences.items()}
    frac = genome.repeat_fraction()
    n_tandem = sum(c.family == "tandem" for c in genome.copies)
    tandem = f" and {n_tandem} tandem units" if n_tandem else ""
    sd_bases = sum(d.end - d.start for d in genome.segdups)
    segdups = (f", {len(genome.segdups)} segmental duplications ({sd_bases:,} bp) in "
               f"{', '.join(sorted({d.chrom for d in genome.segdups}))}" if genome.segdups else "")
    log.info(
        "wrote synthetic genome %s (%s; %.2f Mbp, %.1f%% of non-N bases in %d repeat copies of %d families%s%s) "
        "and %s in %.1f s",
        out, ", ".join(f"{k} {v:,} bp" for k, v in lengths.items()), sum(lengths.values()) / 1e6,
        100 * frac, len(genome.copies) - n_tandem, len(genome.families), tandem, segdups, tsv,
        time.perf_counter() - t0,
    )
    return WrittenGenome(out, tsv, lengths, frac, sd_tsv if genome.segdups else None)
