"""Variants to score: a VCF (plain or gzip) read into one `Variant` per ALT allele, labelled and checked
against the reference (no pysam). Records of one contig must be contiguous and sorted by POS; ALT alleles
that are not bases (`<DEL>`, `*`, `.`, breakends) are skipped. Labels: 1 (`POSITIVE`), 0 (`NEGATIVE`) or None
(unlabelled); a value of several terms ('Pathogenic/Likely_pathogenic') is labelled when all agree."""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from genome_lm.errors import GenomeLMError, first_line
from genome_lm.genome.fasta import Reference, contig_key

POSITIVE = {"pathogenic", "likely_pathogenic", "lof", "1", "true"}
NEGATIVE = {"benign", "likely_benign", "func", "int", "0", "false"}
_BASES = re.compile(r"^[ACGTN]+$")
MOSTLY_MISMATCHED = 0.5  # more than this share of REF alleles differing from the FASTA: the wrong assembly


@dataclass(frozen=True)
class Variant:
    """One ALT allele: `pos` 1-based as in the VCF, `ref` / `alt` upper-case bases, `label` 1/0/None."""

    chrom: str
    pos: int
    id: str
    ref: str
    alt: str
    label: float | None = None

    @property
    def start(self) -> int:
        """0-based position of the first REF base."""
        return self.pos - 1

    @property
    def kind(self) -> str:
        """'snv', 'mnv', 'ins', 'del' or 'complex', judged after trimming the bases REF and ALT share."""
        ref, alt = self.ref, self.alt
        while len(ref) > 1 and len(alt) > 1 and ref[-1] == alt[-1]:
            ref, alt = ref[:-1], alt[:-1]
        while len(ref) > 1 and len(alt) > 1 and ref[0] == alt[0]:
            ref, alt = ref[1:], alt[1:]
        if len(ref) == len(alt):
            return "snv" if len(ref) == 1 else "mnv"
        if ref[0] == alt[0] and min(len(ref), len(alt)) == 1:
            return "ins" if len(alt) > len(ref) else "del"
        return "complex"


def label_of(value: str | None) -> float | None:
    """1.0, 0.0 or None (unlabelled) for a label value."""
    terms = {t.strip().lower() for t in re.split(r"[/|,;]", value or "") if t.strip()}
    if terms and terms <= POSITIVE:
        return 1.0
    if terms and terms <= NEGATIVE:
        return 0.0
    return None


def _lines(path: Path) -> Iterator[str]:
    """The text lines of a plain or gzip file; a truncated or corrupt gzip is one line of error."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rt") if gz else open(path)) as f:
            yield from f
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise GenomeLMError(f"--vcf {path}: the gzip stream is cut short or corrupt ({first_line(e)}); download "
                            "or copy the file again") from None
    except UnicodeDecodeError:
        raise GenomeLMError(f"--vcf {path} is not a text VCF (plain or gzip)") from None


def _info(field: str, key: str, allele: int, n_alleles: int) -> str | None:
    """INFO `key`'s value for ALT allele `allele` (a per-allele list is split), or None."""
    v = next((v for k, _, v in (item.partition("=") for item in field.split(";")) if k == key), None)
    parts = (v or "").split(",")
    return parts[allele] if v is not None and len(parts) == n_alleles > 1 else v


def read_vcf(path: str | Path, labels: str | None = None) -> tuple[list[Variant], int]:
    """The base-allele variants of `path`, one per ALT allele, labelled from INFO key `labels`, and the
    number of ALT alleles skipped as symbolic; a malformed or unsorted VCF is a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise GenomeLMError(f"--vcf {path} does not exist")
    out, symbolic, header = [], 0, False
    seen: dict[str, int] = {}  # contig key -> last POS; a key met again after another contig is unsorted
    last = ""
    for n, line in enumerate(_lines(path), 1):
        if line.startswith("##") or not line.strip():
            continue
        if line.startswith("#"):
            header = line.startswith("#CHROM")
            continue
        if not header:
            raise GenomeLMError(f"--vcf {path}: line {n} is a record before the #CHROM header line; a VCF starts "
                                "with ## meta lines and '#CHROM POS ID REF ALT QUAL FILTER INFO' (is it a VCF?)")
        cols = line.rstrip("\r\n").split("\t")
        if len(cols) < 8 or not cols[1].isdigit():
            raise GenomeLMError(f"--vcf {path}: line {n} is not a VCF record (tab-separated CHROM POS ID REF ALT "
                                f"QUAL FILTER INFO): {line.strip()[:80]!r}")
        chrom, pos, key = cols[0], int(cols[1]), contig_key(cols[0])
        if key != last and key in seen or pos < seen.get(key, 0):
            where = f"{chrom}:{seen[key]}" if key == last else f"other contigs, yet {chrom} came before them"
            raise GenomeLMError(f"--vcf {path} is not sorted: line {n} ({chrom}:{pos}) comes after {where}; sort it "
                                "first (bcftools sort)")
        seen[key], last = pos, key
        ref, alts = cols[3].upper(), cols[4].upper().split(",")
        for i, alt in enumerate(alts):
            if not (_BASES.match(ref) and _BASES.match(alt)) or alt == ref:
                symbolic += 1
                continue
            value = _info(cols[7], labels, i, len(alts)) if labels else None
            out.append(Variant(chrom, pos, cols[2], ref, alt, label_of(value)))
    if not header:
        raise GenomeLMError(f"--vcf {path} has no #CHROM header line (is it a VCF?)")
    return out, symbolic


def read_labels_tsv(path: str | Path) -> dict[tuple[str, int, str, str], float | None]:
    """Labels from a TSV of `chrom pos ref alt label` (pos 1-based; a first line whose pos is not a
    number is a header), keyed by (contig key, pos, REF, ALT)."""
    path = Path(path)
    if not path.is_file():
        raise GenomeLMError(f"--labels-tsv {path} does not exist")
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        cols = line.split("\t")
        if not line.strip() or line.startswith("#") or n == 1 and len(cols) > 1 and not cols[1].isdigit():
            continue
        if len(cols) < 5 or not cols[1].isdigit():
            raise GenomeLMError(f"--labels-tsv {path}: line {n} is not 'chrom<TAB>pos<TAB>ref<TAB>alt<TAB>label': "
                                f"{line[:80]!r}")
        out[contig_key(cols[0]), int(cols[1]), cols[2].upper(), cols[3].upper()] = label_of(cols[4])
    return out


def with_labels(variants: list[Variant], labels: dict[tuple[str, int, str, str], float | None]) -> list[Variant]:
    """`variants` labelled from a `read_labels_tsv` table (a variant it lacks is unlabelled)."""
    return [replace(v, label=labels.get((contig_key(v.chrom), v.pos, v.ref, v.alt))) for v in variants]


def check_against(variants: list[Variant], ref: Reference) -> tuple[list[Variant], dict[str, int], list[str]]:
    """(the variants whose contig is loaded and whose REF matches the FASTA, skipped counts by reason, the
    first 20 mismatches as 'chrom:pos ref>alt (fasta: X)'); refused as the wrong assembly when most REFs differ."""
    kept, listed = [], []  # type: list[Variant], list[str]
    skipped = {"ref_mismatch": 0, "not_in_reference": 0}
    for v in variants:
        if contig_key(v.chrom) not in ref.records:
            skipped["not_in_reference"] += 1
            continue
        tokens = ref.tokens(v.chrom)[v.start:v.start + len(v.ref)]
        fasta = "".join("ACGTN"[t] for t in tokens)
        if fasta != v.ref:
            skipped["ref_mismatch"] += 1
            if len(listed) < 20:
                listed.append(f"{v.chrom}:{v.pos} {v.ref}>{v.alt} (fasta: {fasta or 'beyond the contig end'})")
            continue
        kept.append(v)
    checked = len(kept) + skipped["ref_mismatch"]
    if checked and skipped["ref_mismatch"] > MOSTLY_MISMATCHED * checked:
        raise GenomeLMError(f"{skipped['ref_mismatch']} of {checked} REF alleles differ from the FASTA {ref.path} "
                            f"(e.g. {listed[0]}): the VCF is for another assembly; lift it over (CrossMap, UCSC "
                            "liftOver) or give the matching FASTA")
    return kept, skipped, listed
