"""The synthetic genome's files (`genome-lm synth`): gzip FASTA (60 columns, mtime 0, no file name: same
parameters and seed -> the same bytes), and sidecar TSVs of the planted repeat copies and segmental duplications."""

from __future__ import annotations

import gzip
import logging
import os
import time
from dataclasses import astuple, dataclass, fields
from functools import partial
from pathlib import Path

from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import check_writable
from genome_lm.genome.synth import RepeatCopy, SegDup, synthesize_genome
from genome_lm.genome.synth_params import SynthParams
from genome_lm.outputs import atomic_file, holding

log = logging.getLogger(__name__)

LINE_WIDTH = 60
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # no name, no extra field, mtime 0: as synth writes


def _tsv(cls: type, rows: list) -> str:
    """A header of the dataclass `cls`'s field names, then one line per row."""
    lines = [[f.name for f in fields(cls)], *map(astuple, rows)]
    return "".join("\t".join(map(str, line)) + "\n" for line in lines)


def _read_tsv(cls: type, path: str | os.PathLike) -> list:
    rows = (row.split("\t") for row in Path(path).read_text().splitlines()[1:])
    return [cls(*(int(v) if f.type == "int" else v for f, v in zip(fields(cls), row))) for row in rows]


TSV_HEADER = _tsv(RepeatCopy, [])


def written_by_synth(fasta: Path) -> bool:
    """Whether `fasta` is a synth output: its gzip header is synth's and its repeats sidecar is beside it."""
    try:
        with open(fasta, "rb") as f, open(repeats_path(fasta)) as tsv:
            return f.read(len(GZIP_HEADER)) == GZIP_HEADER and tsv.readline() == TSV_HEADER
    except (OSError, UnicodeDecodeError):
        return False


def fasta_lines(name: str, seq: bytes, width: int = LINE_WIDTH) -> bytes:
    """'>name\\n' then the sequence in lines of `width` characters, each ending in '\\n'."""
    return b">" + name.encode() + b"\n" + b"".join(seq[i : i + width] + b"\n" for i in range(0, len(seq), width))


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
    repeat_fraction: float
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


def synth_command(out, params: SynthParams) -> None:
    """`genome-lm synth`: `out` its SynthOutput (out, scale, seed, overwrite)."""
    write_synthetic_fasta(out.out, scale=out.scale, seed=out.seed, overwrite=out.overwrite, params=params)
