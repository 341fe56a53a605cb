"""The reference sequence a score or variants run reads: the wanted contigs of one FASTA as token arrays.

    ref = Reference.load("hg38.fa.gz", ["chr17", "1"])    # one pass over the file; names matched with aliases
    ref.tokens("17")[41_196_311:41_277_500]               # uint8 [T], A=0 C=1 G=2 T=3 N=4
    ref.record("1")                                       # 'chr1': the file's own name

Names match as prepare matches them (`chrom_match_key`: 'chr1', 'Chr1' and '1' are one contig), and 'chrM'
is 'MT'. Only the named contigs are kept in memory (one byte per base).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from genome_lm.errors import GenomeLMError
from genome_lm.genome.fasta import FastaReader
from genome_lm.genome.prepare_params import chrom_match_key
from genome_lm.genome.tokenizer import TOKEN_MASK

_ALIASES = {"m": "mt"}  # chrM (UCSC) is MT (Ensembl, NCBI)


def contig_key(name: str) -> str:
    """The key a contig name matches by: 'chr1', 'Chr1', '1' -> '1'; 'chrM', 'MT' -> 'mt'."""
    key = chrom_match_key(name)
    return _ALIASES.get(key, key)


@dataclass
class Reference:
    """Contigs of one FASTA: `records` maps each match key to (the file's record name, tokens [T] uint8)."""

    path: str
    sha256: str
    records: dict[str, tuple[str, np.ndarray]]
    all_names: list[str]

    @classmethod
    def load(cls, path: str | os.PathLike, chroms: Iterable[str] | None, show_progress: bool | None = None,
             missing_ok: bool = False) -> Reference:
        """Read `path` once, keeping the contigs named in `chroms` (any alias; None: every contig). A name the
        file lacks is a one-line error listing the file's names, unless `missing_ok` (then it is not in `records`)."""
        wanted = {contig_key(c): c for c in chroms or ()}
        reader = FastaReader(path, show_progress=show_progress)
        records = {}
        for rec in reader.records(lambda name: chroms is None or contig_key(name) in wanted):
            records[contig_key(rec.name)] = (rec.name, rec.codes & TOKEN_MASK)
        missing = [c for k, c in wanted.items() if k not in records]
        if missing and not missing_ok:
            have = reader.info.records
            shown = ", ".join(have[:12]) + (f" and {len(have) - 12} more" if len(have) > 12 else "")
            raise GenomeLMError(f"{path} has no contig {', '.join(missing)} (it has {shown}); check the assembly "
                                "and the chromosome names")
        return cls(str(path), reader.info.sha256, records, list(reader.info.records))

    def record(self, chrom: str) -> str:
        """The FASTA's name for `chrom` (any alias)."""
        return self._get(chrom)[0]

    def tokens(self, chrom: str) -> np.ndarray:
        """Token ids [T] uint8 of the whole contig `chrom` (any alias)."""
        return self._get(chrom)[1]

    def _get(self, chrom: str) -> tuple[str, np.ndarray]:
        try:
            return self.records[contig_key(chrom)]
        except KeyError:
            raise GenomeLMError(f"{self.path}: contig {chrom} was not loaded; name it when the reference is "
                                "loaded") from None
