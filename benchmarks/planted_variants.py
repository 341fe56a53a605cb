"""Planted variants whose effect depends on distant context, with their truth as labels (a VCF with INFO
LABEL=1/0, for `genome-lm variants --labels LABEL`).

Two plantings:

- `copy_contigs`: contigs of 2·H random bases whose second half repeats the first (label 1) or is
  fresh (label 0), and one SNV late in the second half of each. A model that copies predicts the REF
  base of a copy from its source H bases back, so the ALT is unlikely (score << 0) when the context
  reaches the source (L >= H + offset), and no more than at random when it does not. The copy task
  of `probe_copy_learning.py` trains such a model (the second half of T = 2·H copies the first).
- `repeat_variants`: SNVs on a synthetic genome (`genome-lm synth`, its REPEATS.tsv of planted copies):
  label 1 inside a copy whose source copy lies earlier on the same chromosome (INFO DIST: bases from
  the source's start), label 0 at positions outside every copy, as many; the ALT is a random other base.

    python benchmarks/planted_variants.py repeats FASTA REPEATS_TSV --chrom chr22 --n 200 --out v.vcf
    python benchmarks/planted_variants.py copies --half 64 --n 40 --out-fasta c.fa --out v.vcf
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np

HEADER = ("##fileformat=VCFv4.2\n##INFO=<ID=LABEL,Number=1,Type=Integer,Description=\"1: breaks a copy\">\n"
          "##INFO=<ID=DIST,Number=1,Type=Integer,Description=\"bases from the source copy's start\">\n"
          "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n")


def _other(rng, base: str) -> str:
    return rng.choice([b for b in "ACGT" if b != base])


def copy_contigs(n: int, half: int, seed: int = 0, tail: int = 8) -> tuple[str, str]:
    """(FASTA text, VCF text): n contigs `c0..` of 2·half + tail bases, the even ones with a copy (label 1),
    one SNV each at a position in the last quarter of the second half; on a fresh contig (label 0) its REF
    differs from the base `half` before it, so a model that copies predicts REF only in a copy."""
    rng = np.random.default_rng(seed)
    fasta, vcf = [], [HEADER]
    for i in range(n):
        first = "".join(rng.choice(list("ACGT"), half))
        second = first if i % 2 == 0 else "".join(rng.choice(list("ACGT"), half))
        seq = first + second + "".join(rng.choice(list("ACGT"), tail))
        pos = int(rng.integers(2 * half - half // 4, 2 * half))  # 0-based, inside the second half
        if i % 2 and second[pos - half] == first[pos - half]:  # no chance match: only a copy makes REF predictable
            second = second[:pos - half] + _other(rng, first[pos - half]) + second[pos - half + 1:]
        seq = first + second + seq[2 * half:]
        fasta.append(f">c{i}\n{seq}\n")
        vcf.append(f"c{i}\t{pos + 1}\tc{i}_{pos + 1}\t{seq[pos]}\t{_other(rng, seq[pos])}\t.\t.\t"
                   f"LABEL={int(i % 2 == 0)};DIST={half}\n")
    return "".join(fasta), "".join(vcf)


def _read_fasta(path: Path, chrom: str) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    seq, keep = [], False
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith(">"):
                keep = line[1:].split()[0] == chrom
            elif keep:
                seq.append(line.strip())
    return "".join(seq).upper()


def repeat_variants(fasta: Path, repeats_tsv: Path, chrom: str, n: int, seed: int = 0,
                    min_context: int = 0) -> str:
    """VCF text: n SNVs inside copies with an earlier source on `chrom` (label 1) and n outside every
    copy (label 0), at least `min_context` bases from the chromosome start, sorted by position."""
    rng = np.random.default_rng(seed)
    seq = _read_fasta(fasta, chrom)
    rows = [line.split("\t") for line in Path(repeats_tsv).read_text().splitlines()[1:]]
    copies = [(int(r[1]), int(r[2]), int(r[5])) for r in rows if r[0] == chrom]
    inside = np.zeros(len(seq), dtype=bool)
    for start, end, _ in copies:
        inside[start:end] = True
    sourced = [c for c in copies if 0 <= c[2] < c[0] and c[0] >= min_context]
    picks = {}
    for k in rng.permutation(len(sourced))[:n]:
        start, end, source = sourced[k]
        pos = int(rng.integers(start, end))
        if seq[pos] in "ACGT":
            picks[pos] = (1, pos - source)
    outside = np.flatnonzero(~inside & (np.frombuffer(seq.encode(), np.uint8) != ord("N")))
    for pos in rng.choice(outside[outside >= min_context], size=len(picks), replace=False):
        picks.setdefault(int(pos), (0, 0))
    return HEADER + "".join(f"{chrom}\t{p + 1}\t{chrom}_{p + 1}\t{seq[p]}\t{_other(rng, seq[p])}\t.\t.\t"
                            f"LABEL={label};DIST={dist}\n" for p, (label, dist) in sorted(picks.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("repeats")
    r.add_argument("fasta", type=Path)
    r.add_argument("repeats_tsv", type=Path)
    r.add_argument("--chrom", default="chr22")
    r.add_argument("--min-context", type=int, default=0)
    c = sub.add_parser("copies")
    c.add_argument("--half", type=int, default=64)
    c.add_argument("--out-fasta", type=Path, required=True)
    for p in (r, c):
        p.add_argument("--n", type=int, default=100)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.what == "repeats":
        args.out.write_text(repeat_variants(args.fasta, args.repeats_tsv, args.chrom, args.n, args.seed,
                                            args.min_context))
    else:
        fasta, vcf = copy_contigs(args.n, args.half, args.seed)
        args.out_fasta.write_text(fasta)
        args.out.write_text(vcf)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
