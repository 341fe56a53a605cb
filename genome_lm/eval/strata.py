"""Strata: binary splits of the scored tokens by a mask bool [L] in token order, each summarised like
the whole eval: repeat (soft-mask), leakage (`prepare --leakage-k`), one per `--annotate` BED file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Stratum:
    section: str  # key in summary.json / compare.json: "repeat", "leakage" or "annotations"
    name: str | None  # the annotation's NAME (its key under "annotations"); None for repeat, leakage
    labels: tuple[str, str]  # names of class 0 (mask False) and class 1 (mask True)

    @property
    def key(self) -> str:
        return self.section if self.name is None else f"{self.section}:{self.name}"


REPEAT = Stratum("repeat", None, ("unmasked", "masked"))
LEAKAGE = Stratum("leakage", None, ("unmasked", "masked"))


def annotation(name: str) -> Stratum:
    return Stratum("annotations", name, ("out", "in"))


def strata_of(rec: dict) -> list[Stratum]:
    """The strata a window record carries."""
    return [REPEAT] + ([LEAKAGE] if rec.get("leakage") is not None else []) + \
        [annotation(n) for n in rec.get("annotations") or {}]


def merged_strata(wa: dict, wb: dict) -> dict:
    """Window record `wa` with the strata that `wb` (the same window, another eval) has and `wa` lacks."""
    rec = dict(wa)
    if rec.get("leakage") is None:
        rec["leakage"] = wb.get("leakage")
    rec["annotations"] = {**(wb.get("annotations") or {}), **(wa.get("annotations") or {})}
    return rec


def masks(rec: dict, strata: list[Stratum]) -> list[np.ndarray]:
    """Mask bool [L] of each stratum in a window record."""
    return [rec[s.section] if s.name is None else rec["annotations"][s.name] for s in strata]


def place(result: dict, strata: list[Stratum], table: Callable[[int, int], dict]) -> dict:
    """File {label: table(s, c)} of each class c of stratum s at result[section] (or [section][name])."""
    for i, stratum in enumerate(strata):
        value = {label: table(i, c) for c, label in enumerate(stratum.labels)}
        if stratum.name is None:
            result[stratum.section] = value
        else:
            result.setdefault(stratum.section, {})[stratum.name] = value
    return result


def describe(strata: list[Stratum]) -> dict:
    """summary.json's `strata`: what each section splits by."""
    meaning = {"repeat": "soft-masked (lowercase) bases of the FASTA",
               "leakage": "tokens in a K-mer that occurs in a training chromosome (prepare --leakage-k)",
               "annotations": "tokens whose genomic coordinate lies in an interval of the BED file"}
    return {s.key: {"labels": list(s.labels), "mask_true": s.labels[1], "meaning": meaning[s.section]}
            for s in strata}
