"""`PrepareParams`, the parameters of `genome-lm prepare`, and `chrom_match_key`, how chromosome names
match. Light to import (pydantic only): `genome-lm prepare --help` builds its flags from this module."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from genome_lm.options import Names, validate
from genome_lm.sizes import Size


def chrom_match_key(name: str) -> str:
    """The key chromosome names are matched by: no 'chr' prefix, lowercase ('chr22', 'Chr22', '22' -> '22')."""
    n = name.strip()
    return (n[3:] if n.lower().startswith("chr") else n).lower()


class PrepareParams(BaseModel):
    """The parameters of `genome-lm prepare` (flags, a --config YAML file or --set; docs/config.md)."""

    model_config = ConfigDict(extra="forbid")

    fasta: Annotated[list[str], BeforeValidator(lambda v: [str(f) for f in v])] = Field(
        min_length=1, json_schema_extra={"repeat": True}, description="FASTA file (plain, gzip or bgzip); repeatable")
    train_chroms: Names = Field(default=["chr1", "chr2"], description="comma-separated chromosomes to train on")
    eval_chroms: Names = Field(default=["chr22"], description="comma-separated held-out chromosomes")
    seq_len: Size = Field(default=2**20, description="tokens per window: integer or 512k / 1M (powers of two)")
    stride: Size | None = Field(default=None, description="start-to-start distance of windows (default: --seq-len)")
    min_gap: Size = Field(default=1000, description="N runs at least this long split a chromosome into contigs")
    max_n_frac: float = Field(default=0.05, ge=0, le=1, description="drop windows with a larger fraction of N")
    tail: Literal["keep", "drop"] = Field(default="keep", description="the short last window of a contig")
    min_len: Size | None = Field(default=None, description="shortest tail window kept (default: seq-len / 8)")
    reverse_complement: bool = Field(default=False, description="add reverse-complement copies to train")
    format: Literal["hf", "megatron"] = "hf"
    leakage_k: int = Field(default=0, json_schema_extra={"metavar": "K"},
                           description="mark eval tokens covered by a K-mer (either strand) that occurs in a train "
                           "chromosome: the eval rows' leakage_mask column; K in 1..32, usually 32; 0: off")

    @model_validator(mode="after")
    def _check(self):
        if self.leakage_k:
            from genome_lm.genome.leakage import MAX_K  # numpy: imported when the K is checked

            if not 1 <= self.leakage_k <= MAX_K:
                raise ValueError(f"--leakage-k must lie in 1..{MAX_K} (K-mers are packed 2 bits per base into 64 "
                                 f"bits; 32 is the usual choice), or 0 for off (got {self.leakage_k})")
            if not self.train_chroms or not self.eval_chroms:
                raise ValueError("--leakage-k marks eval tokens found in the training chromosomes: it needs both "
                                 "--train-chroms and --eval-chroms")
        self.stride = self.seq_len if self.stride is None else self.stride
        self.min_len = max(1, self.seq_len // 8) if self.min_len is None else self.min_len
        if not self.min_len <= self.seq_len:
            raise ValueError(f"--min-len must lie in [1, --seq-len={self.seq_len}] (got {self.min_len})")
        if not self.train_chroms and not self.eval_chroms:
            raise ValueError("no chromosomes requested: set --train-chroms and/or --eval-chroms")
        for flag, chroms in (("--train-chroms", self.train_chroms), ("--eval-chroms", self.eval_chroms)):
            norms = [chrom_match_key(c) for c in chroms]
            if len(set(norms)) != len(norms):
                raise ValueError(f"{flag} names a chromosome twice: {','.join(chroms)}")
        both = {chrom_match_key(c) for c in self.train_chroms} & {chrom_match_key(c) for c in self.eval_chroms}
        if both:
            names = ", ".join(c for c in self.train_chroms if chrom_match_key(c) in both)
            raise ValueError(f"chromosome {names} is in both --train-chroms and --eval-chroms; "
                             "held-out data must not be trained on")
        return self

    @classmethod
    def from_cli(cls, **params) -> "PrepareParams":
        """The parameters from keyword arguments as the command line gives them ('chr1,chr2', '1M', None)."""
        return validate(cls, {k: v for k, v in params.items() if v is not None}, "prepare")

    def recorded(self) -> dict:
        """The parameters as the manifest records them: no input files; `leakage_k` only when on, so shards
        made before it existed still match."""
        return self.model_dump(exclude={"fasta"} | ({"leakage_k"} if not self.leakage_k else set()))

    def split_of(self, record_name: str) -> str | None:
        key = chrom_match_key(record_name)
        return next((split for split, chroms in (("train", self.train_chroms), ("eval", self.eval_chroms))
                     if key in map(chrom_match_key, chroms)), None)
