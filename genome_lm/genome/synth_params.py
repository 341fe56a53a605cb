"""What shapes the synthetic genome (`synth.py`): `SynthParams`, its records (`ChromSpec`), and `make_params`,
the checked way to override its fields. Lengths are bases at scale 1.0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from genome_lm.options import validate

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
