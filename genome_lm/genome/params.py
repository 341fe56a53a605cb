"""The parameters of `genome-lm prepare`, `synth` and `fetch`, light to import (pydantic only: `genome-lm CMD
--help` builds its flags from this module). `SynthParams` lengths are bases at scale 1.0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from genome_lm.options import Names, Params, validate
from genome_lm.sizes import Size

DEFAULT_BASE_URL = "https://hgdownload.soe.ucsc.edu/goldenPath/hg38/chromosomes"
MAX_K = 32  # the longest --leakage-k: 2 bits per base in a uint64


def chrom_match_key(name: str) -> str:
    """The key chromosome names are matched by: no 'chr' prefix, lowercase ('chr22', 'Chr22', '22' -> '22')."""
    n = name.strip()
    return (n[3:] if n.lower().startswith("chr") else n).lower()


class PrepareParams(Params):
    """The parameters of `genome-lm prepare` (flags, a --config YAML file or --set; docs/config.md)."""

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
        if self.leakage_k and not 1 <= self.leakage_k <= MAX_K:
            raise ValueError(f"--leakage-k must lie in 1..{MAX_K} (K-mers are packed 2 bits per base into 64 "
                             f"bits; 32 is the usual choice), or 0 for off (got {self.leakage_k})")
        if self.leakage_k and (not self.train_chroms or not self.eval_chroms):
            raise ValueError("--leakage-k marks eval tokens found in the training chromosomes: it needs both "
                             "--train-chroms and --eval-chroms")
        self.stride = self.seq_len if self.stride is None else self.stride
        self.min_len = max(1, self.seq_len // 8) if self.min_len is None else self.min_len
        if not self.min_len <= self.seq_len:
            raise ValueError(f"--min-len must lie in [1, --seq-len={self.seq_len}] (got {self.min_len})")
        if not self.train_chroms and not self.eval_chroms:
            raise ValueError("no chromosomes requested: set --train-chroms and/or --eval-chroms")
        for flag, chroms in (("--train-chroms", self.train_chroms), ("--eval-chroms", self.eval_chroms)):
            if len({chrom_match_key(c) for c in chroms}) != len(chroms):
                raise ValueError(f"{flag} names a chromosome twice: {','.join(chroms)}")
        if both := [c for c in self.train_chroms if chrom_match_key(c) in map(chrom_match_key, self.eval_chroms)]:
            raise ValueError(f"chromosome {', '.join(both)} is in both --train-chroms and --eval-chroms; "
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


SPACER = 20  # at least this many bases between two repeat copies, or a copy and an N run


@dataclass(frozen=True)
class ChromSpec:
    """One record of the synthetic genome."""

    name: str
    length: int  #: bases at scale 1.0
    centromere: float  #: centre of the centromere N run, as a fraction of the length
    short_arm: float = 0.0  #: leading fraction that is one N block (acrocentric short arm)


class SynthParams(BaseModel):
    """Everything that shapes the synthetic genome (`genome-lm synth --set NAME=VALUE`, docs/config.md)."""

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
    markov_order: int = 0  #: >0: each isochore's background is an order-K Markov chain of its own (synth.py)
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


def make_params(**overrides) -> SynthParams:
    """SynthParams with some fields replaced; an unknown name or a bad value is a GenomeLMError."""
    return validate(SynthParams, overrides, "synthetic genome parameters", unknown="unknown")


class FetchParams(Params):
    """The parameters of `genome-lm fetch`."""

    chroms: Names = Field(default=["chr1", "chr2", "chr22"], description="comma-separated chromosome names")
    out: str = Field(default="data/hg38", description="directory for the .fa.gz files")
    base_url: str = Field(default=DEFAULT_BASE_URL, description="server holding chrN.fa.gz and md5sum.txt")
