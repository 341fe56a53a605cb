"""A deterministic SYNTHETIC genome for demos and tests (`genome-lm synth`; what it plants: data/README.md).
Per record, in this order: N runs; an isochore background, or a Markov chain per isochore; segmental
duplications of earlier records; repeat clusters and tandem arrays; IUPAC codes. Same parameters and seed ->
the same genome (PCG64 per record). Base codes 0..3 = A, C, G, T; coordinates 0-based, half-open.
Its files: gzip FASTA (60 columns, mtime 0, no file name: same parameters and seed -> the same bytes), and
sidecar TSVs of the planted repeat copies and segmental duplications."""

from __future__ import annotations

import bisect
import gzip
import logging
import os
import time
from dataclasses import astuple, dataclass, fields
from functools import partial
from pathlib import Path

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import check_writable
from genome_lm.genome.params import SPACER, ChromSpec, SynthParams, make_params
from genome_lm.genome.tokenizer import CODE_LUT, ID_TO_BASE, TOKEN_MASK
from genome_lm.outputs import atomic_file, holding

log = logging.getLogger(__name__)

LOWER = np.frombuffer(b"acgt", dtype=np.uint8)  # code 0..3 -> ASCII (ID_TO_BASE: uppercase); complement is 3 - code
N = ord("N")
IUPAC = np.frombuffer(b"RYKMSWBDHV", dtype=np.uint8)


@dataclass(frozen=True)
class RepeatCopy:
    """genome[start:end] (reverse-complemented if strand '-') is a copy of `family`, mutated from the copy at
    `source_start` (-1: a cluster founder, mutated from the family consensus)."""

    chrom: str
    start: int
    end: int
    strand: str
    family: str
    source_start: int


def random_bases(rng: np.random.Generator, gc: np.ndarray | float, n: int) -> np.ndarray:
    """n independent bases, position i with GC fraction gc[i] (C and G equally likely)."""
    r = rng.random(n)
    at_cut = gc + (1.0 - gc) / 2
    idx = (r >= gc / 2).astype(np.uint8) + (r >= gc) + (r >= at_cut)  # 0 C, 1 G, 2 A, 3 T
    return np.array([1, 2, 0, 3], dtype=np.uint8)[idx]


def substitute(rng: np.random.Generator, seq: np.ndarray, rate: float) -> np.ndarray:
    """Each base changes to one of the three others with probability `rate`."""
    hit = rng.random(len(seq)) < rate
    out = seq.copy()
    out[hit] = (out[hit] + rng.integers(1, 4, size=int(hit.sum()), dtype=np.uint8)) % 4
    return out


def indels(rng: np.random.Generator, seq: np.ndarray, rate: float) -> np.ndarray:
    """Small insertions and deletions (1-3 bp each), about `rate` events per base."""
    n_events = rng.poisson(rate * len(seq))
    pos = rng.integers(0, len(seq), size=n_events)
    size = rng.integers(1, 4, size=n_events)
    is_del = rng.random(n_events) < 0.5
    keep = np.ones(len(seq), dtype=bool)
    for p, s in zip(pos[is_del], size[is_del]):
        keep[p : p + s] = False
    ins_at = np.repeat(pos[~is_del], size[~is_del])
    out = np.insert(seq, ins_at, rng.integers(0, 4, size=len(ins_at), dtype=np.uint8))
    return out[np.insert(keep, ins_at, True)]


def first(tries: int, draw, ok):
    """The first of up to `tries` values `draw()` for which `ok(value)` holds, else None."""
    for _ in range(tries):
        if ok(x := draw()):
            return x
    return None


def make_families(rng: np.random.Generator, p: SynthParams) -> dict[str, np.ndarray]:
    lo, hi = np.log(p.family_min_len), np.log(p.family_max_len)
    lengths = np.exp(rng.uniform(lo, hi, size=p.n_families)).astype(int)
    gcs = rng.uniform(0.38, 0.55, size=p.n_families)
    return {f"fam{i:02d}": random_bases(rng, g, n) for i, (n, g) in enumerate(zip(lengths, gcs))}


def n_runs(rng: np.random.Generator, spec: ChromSpec, length: int, scale: float,
            p: SynthParams) -> list[tuple[int, int]]:
    """Sorted, disjoint N runs [start, end): telomeres, short arm, centromere, inner gaps."""
    tel = max(50, min(round(p.telomere * scale), length // 20))
    half_cen = max(25, round(p.centromere_frac * length / 2))
    mid = round(spec.centromere * length)
    runs = [(0, max(tel, round(spec.short_arm * length))), (length - tel, length), (mid - half_cen, mid + half_cen)]
    def draw():
        gap = int(rng.integers(p.inner_gap_min, p.inner_gap_max + 1))
        a = int(rng.integers(0, length - gap))
        return a, a + gap

    for _ in range(max(1, round(length / p.inner_gap_every))):
        if gap := first(100, draw, lambda g: all(g[1] + 1000 <= s or e + 1000 <= g[0] for s, e in runs)):
            runs.append(gap)
    return sorted(runs)


class Occupancy:
    """Disjoint intervals already used (N runs, placed copies), for O(log n) overlap tests."""

    def __init__(self, length: int, runs: list[tuple[int, int]]):
        self.length = length
        self.starts, self.ends = map(list, zip(*runs))

    def room(self, a: int) -> int:
        """The largest b such that [a, b) is free (a itself when a is not free)."""
        i = bisect.bisect_right(self.starts, a) - 1
        if a < 0 or (i >= 0 and self.ends[i] + SPACER > a):
            return a
        nxt = self.starts[i + 1] - SPACER if i + 1 < len(self.starts) else self.length
        return max(a, nxt)

    def add(self, a: int, b: int) -> None:
        i = bisect.bisect_left(self.starts, a)
        self.starts.insert(i, a)
        self.ends.insert(i, b)


def plant_repeats(rng, name, seq, occ, families, p: SynthParams) -> list[RepeatCopy]:
    """Place clusters of copies into `seq` (ASCII, modified in place) until the target share."""
    names = list(families)
    target = p.repeat_fraction * int((seq != N).sum())
    copies: list[RepeatCopy] = []
    covered, failures = 0, 0
    log_max = np.log(p.max_distance)
    while covered < target and failures < 200:
        fam = names[rng.integers(len(names))]
        oriented = substitute(rng, families[fam], p.founder_divergence)
        start = first(50, lambda: int(rng.integers(0, len(seq) - len(oriented))),
                       lambda a: occ.room(a) >= a + len(oriented))
        if start is None:
            failures += 1
            continue
        source_start = -1
        for k in range(1 + int(rng.geometric(1.0 / (p.mean_copies - 1)))):
            strand = "-" if rng.random() < p.reverse_fraction else "+"
            end = start + len(oriented)
            seq[start:end] = LOWER[(3 - oriented)[::-1] if strand == "-" else oriented]  # '-': reverse complement
            occ.add(start, end)
            copies.append(RepeatCopy(name, start, end, strand, fam, source_start))
            covered += end - start
            # The next copy: this one mutated, d bases downstream (start to start).
            child = indels(rng, substitute(rng, oriented, p.substitution_rate), p.indel_rate)
            lo = np.log(max(p.min_distance, end - start + SPACER))
            nxt = first(8, lambda: start + int(np.exp(rng.uniform(lo, log_max))),
                         lambda a: occ.room(a) >= a + len(child))
            if nxt is None or covered >= target:
                break
            source_start, start, oriented = start, nxt, child
    return copies


def plant_tandems(rng, name, seq, occ, p: SynthParams) -> list[RepeatCopy]:
    """Tandem arrays (lowercase): a random unit repeated head to tail, each unit the one before it with
    `tandem_divergence` substitutions; one RepeatCopy per unit (family 'tandem', source the unit before it)."""
    target = p.tandem_fraction * int((seq != N).sum())
    copies: list[RepeatCopy] = []
    covered, failures = 0, 0
    lo, hi = np.log(p.tandem_unit_min), np.log(p.tandem_unit_max)
    while covered < target and failures < 200:
        u = int(np.exp(rng.uniform(lo, hi)))
        n = int(rng.integers(p.tandem_copies_min, p.tandem_copies_max + 1))
        a = int(rng.integers(0, len(seq) - u * n))
        n = min(n, (occ.room(a) - a) // u)  # shorten the array to the free stretch at a
        if n < p.tandem_copies_min:
            failures += 1
            continue
        failures = 0  # give up after 200 misses in a row, not in total
        unit = random_bases(rng, rng.uniform(p.gc_min, p.gc_max), u)
        pos, source = a, -1
        for _ in range(n):
            seq[pos : pos + u] = LOWER[unit]
            copies.append(RepeatCopy(name, pos, pos + u, "+", "tandem", source))
            source, pos = pos, pos + u
            unit = substitute(rng, unit, p.tandem_divergence)
        occ.add(a, pos)
        covered += pos - a
    return copies


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


def plant_segdups(rng: np.random.Generator, name: str, seq: np.ndarray, occ: Occupancy, sources: dict[str, bytes],
                  n: int, p: SynthParams) -> list[SegDup]:
    """Write up to `n` copies of A/C/G/T-only stretches of `sources` into `seq` (ASCII, in place) within
    `p.segdup_region`, where `occ` has room; uppercase, every other one reverse-complemented."""
    out: list[SegDup] = []
    names = list(sources)
    lo, hi = int(p.segdup_region[0] * len(seq)), int(p.segdup_region[1] * len(seq))
    for i in range(n):
        length = int(np.exp(rng.uniform(np.log(p.segdup_min_len), np.log(p.segdup_max_len))))
        src_name = names[rng.integers(len(names))]
        src = np.frombuffer(sources[src_name], dtype=np.uint8)
        if len(src) <= length or hi - lo <= length:
            continue
        s = first(100, lambda: int(rng.integers(0, len(src) - length)),  # a source stretch of A/C/G/T only
                  lambda s: ((CODE_LUT[src[s : s + length]] & TOKEN_MASK) < 4).all())
        if s is None or (a := first(100, lambda: int(rng.integers(lo, hi - length)),
                                    lambda a: occ.room(a) >= a + length)) is None:
            continue
        codes = CODE_LUT[src[s : s + length]] & TOKEN_MASK
        strand = "-" if i % 2 else "+"
        oriented = (3 - codes)[::-1] if strand == "-" else codes
        copy = substitute(rng, oriented, p.segdup_substitution_rate)  # a substitution always changes the base
        seq[a : a + length] = ID_TO_BASE[copy]
        occ.add(a, a + length)
        out.append(SegDup(name, a, a + length, strand, src_name, s, s + length, int((copy != oriented).sum())))
    return sorted(out, key=lambda d: d.start)


# Markov backgrounds (`--set markov_order=K`): each isochore draws its own order-K transition table, written
# nowhere: a model can only estimate it from the sequence before the token it predicts. Two kinds (`markov_rows`):
# - "dirichlet": every row (the next base given the K bases before it) from a symmetric Dirichlet(alpha):
#   4^K * 3 free parameters; a Bayes-optimal reader's excess loss falls about as 4^K * 3 / (2 L) nats per base
#   after L bases of the isochore.
# - "additive": log P(next = b | x_{t-K}..x_{t-1}) = sum_i A[i, x_{t-i}, b] + const, A ~ N(0, scale^2) per
#   isochore: K * 4 * 3 free parameters, each a linear function of the one-hot preceding bases, the regression
#   that a linear-attention (delta rule) layer estimates in context. This is the demo genome's background
#   (docs/findings.md, "What an ideal reader gains").

def dirichlet_rows(rng: np.random.Generator, order: int, alpha: float) -> np.ndarray:
    """float64 [4^order, 4]: each row a Dirichlet(alpha) draw."""
    return rng.dirichlet(np.full(4, alpha), size=4**order)


def additive_rows(rng: np.random.Generator, order: int, scale: float) -> np.ndarray:
    """float64 [4^order, 4]: row c (base at t - 1 - i = bits 2i..2i+1 of c) = softmax over b of
    sum_i A[i, base_i(c), b], A float64 [order, 4, 4] ~ N(0, scale^2)."""
    a = rng.normal(0.0, scale, size=(order, 4, 4))
    ctx = np.arange(4**order)
    logits = sum(a[i][(ctx >> (2 * i)) & 3] for i in range(order))
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def markov_bases(rng: np.random.Generator, seg_len: np.ndarray, order: int, n: int, rows) -> np.ndarray:
    """n base codes uint8: segments of `seg_len` bases, each an order-`order` Markov chain with its own table
    `rows(rng)` (float [4^order, 4]; row c = the K preceding bases, the base at t - 1 in c's lowest two bits),
    continuing from the bases before it."""
    out = np.empty(n, dtype=np.uint8)
    mask = 4**order - 1
    state, pos = 0, 0
    for length in np.ceil(seg_len).astype(int):
        if pos >= n:
            break
        m = min(int(length), n - pos)
        cum = np.cumsum(rows(rng), axis=1)
        cum[:, 3] = 1.0  # no draw falls past the last base through rounding
        table = cum.tolist()
        seg = [0] * m
        for i, u in enumerate(rng.random(m).tolist()):
            seg[i] = b = bisect.bisect_right(table[state], u)
            state = ((state << 2) | b) & mask
        out[pos : pos + m] = seg
        pos += m
    return out


@dataclass
class SynthGenome:
    """Sequences (ASCII bytes), family consensus sequences, repeat copies and segmental duplications."""

    sequences: dict[str, bytes]
    families: dict[str, bytes]
    copies: list[RepeatCopy]
    segdups: list[SegDup]

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
    seq = ID_TO_BASE[codes]
    for a, b in runs:
        seq[a:b] = N

    occ = Occupancy(length, runs)
    segdups = []
    if p.segdup_count and spec.name == p.segdup_into:  # own stream, before the repeats: they plant around them
        segdups = plant_segdups(np.random.default_rng([seed, 3, index]), spec.name, seq, occ, earlier,
                                max(1, round(p.segdup_count * scale)), p)
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
    genome = SynthGenome({}, {k: ID_TO_BASE[v].tobytes() for k, v in families.items()}, [], [])
    for i, spec in enumerate(params.chroms):
        seq, copies, segdups = _chromosome(seed, i, spec, scale, params, families, dict(genome.sequences))
        genome.sequences[spec.name] = seq.tobytes()
        genome.copies += copies
        genome.segdups += segdups
    return genome


def synthesize(scale: float = 1.0, seed: int = 0, **params) -> dict[str, bytes]:
    """Sequence bytes per record name (chr1, chr2, chr22); `params` override SynthParams fields."""
    return synthesize_genome(scale, seed, make_params(**params)).sequences


GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no name, no extra field, mtime 0: as synth writes


def _tsv(cls: type, rows: list) -> str:
    """A header of the dataclass `cls`'s field names, then one line per row."""
    lines = [[f.name for f in fields(cls)], *map(astuple, rows)]
    return "".join("\t".join(map(str, line)) + "\n" for line in lines)


def _read_tsv(cls: type, path: str | os.PathLike) -> list:
    rows = (row.split("\t") for row in Path(path).read_text().splitlines()[1:])
    return [cls(*(int(v) if f.type == "int" else v for f, v in zip(fields(cls), row))) for row in rows]


def written_by_synth(fasta: Path) -> bool:
    """Whether `fasta` is a synth output: its gzip header is synth's and its repeats sidecar is beside it."""
    try:
        with open(fasta, "rb") as f, open(repeats_path(fasta)) as tsv:
            return f.read(len(GZIP_HEADER)) == GZIP_HEADER and tsv.readline() == _tsv(RepeatCopy, [])
    except (OSError, UnicodeDecodeError):
        return False


def fasta_lines(name: str, seq: bytes) -> bytes:
    """'>name\\n' then the sequence in lines of 60 characters, each ending in '\\n'."""
    return b">" + name.encode() + b"\n" + b"".join(seq[i : i + 60] + b"\n" for i in range(0, len(seq), 60))


def _sidecar(fasta: str | os.PathLike, suffix: str) -> Path:
    stem = Path(fasta).name
    for ext in (".gz", ".fa", ".fasta", ".fna"):
        stem = stem.removesuffix(ext)
    return Path(fasta).with_name(stem + suffix)


repeats_path = partial(_sidecar, suffix=".repeats.tsv")  # genome.fa.gz -> genome.repeats.tsv
segdups_path = partial(_sidecar, suffix=".segdups.tsv")  # genome.fa.gz -> genome.segdups.tsv
read_repeats = partial(_read_tsv, RepeatCopy)  # the sidecars `write_synthetic_fasta` writes
read_segdups = partial(_read_tsv, SegDup)


@dataclass(frozen=True)
class WrittenGenome:
    fasta: Path
    repeats: Path
    lengths: dict[str, int]
    segdups: Path | None = None  #: the segdups sidecar, when the genome has any


def write_synthetic_fasta(out, scale: float = 1.0, seed: int = 0, overwrite: bool = False,
                          params: SynthParams | None = None) -> WrittenGenome:
    """Write the synthetic genome made with `params` to `out` (gzip FASTA) and its sidecar TSVs beside it."""
    out = Path(out)
    if out.is_dir() or not out.name:
        raise GenomeLMError(f"--out {out} is a folder; give the FASTA file to write, e.g. {out / 'genome.fa.gz'}")
    if not out.name.endswith(".gz"):
        raise GenomeLMError(f"{out} is written gzip-compressed; give --out a name ending in .fa.gz")
    with holding(out, "synth"):
        tsv, sd_tsv = repeats_path(out), segdups_path(out)
        for path in (out, tsv, sd_tsv):
            if path.exists() and not overwrite:
                raise GenomeLMError(f"{path} already exists; pass --overwrite to replace it")
        if out.exists() and not written_by_synth(out):
            raise GenomeLMError(f"--out {out} was not written by genome-lm synth (its gzip header, or the {tsv.name} "
                                "beside it, is not synth's); --overwrite replaces only a synth output: choose another "
                                "--out")
        check_writable(out.parent)

        t0 = time.perf_counter()
        genome = synthesize_genome(scale, seed, params)

        try:  # the FASTA last: a failure (a full disk) removes the sidecars written before it
            with atomic_file(tsv, "w") as f:
                f.write(_tsv(RepeatCopy, genome.copies))
            if genome.segdups:
                with atomic_file(sd_tsv, "w") as f:
                    f.write(_tsv(SegDup, genome.segdups))
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
        n_tandem = sum(c.family == "tandem" for c in genome.copies)
        tandem = f" and {n_tandem} tandem units" if n_tandem else ""
        sd_bases = sum(d.end - d.start for d in genome.segdups)
        segdups = (f", {len(genome.segdups)} segmental duplications ({sd_bases:,} bp) in "
                   f"{', '.join(sorted({d.chrom for d in genome.segdups}))}" if genome.segdups else "")
        log.info(
            "wrote synthetic genome %s (%s; %.2f Mbp, %.1f%% of non-N bases in %d repeat copies of %d families%s%s) "
            "and %s in %.1f s",
            out, ", ".join(f"{k} {v:,} bp" for k, v in lengths.items()), sum(lengths.values()) / 1e6,
            100 * genome.repeat_fraction(), len(genome.copies) - n_tandem, len(genome.families), tandem, segdups, tsv,
            time.perf_counter() - t0,
        )
        return WrittenGenome(out, tsv, lengths, sd_tsv if genome.segdups else None)


def synth_command(out, params: SynthParams) -> None:
    """`genome-lm synth`: `out` its SynthOutput (out, scale, seed, overwrite)."""
    write_synthetic_fasta(out.out, scale=out.scale, seed=out.seed, overwrite=out.overwrite, params=params)
