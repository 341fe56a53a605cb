"""Strata: binary splits of the scored tokens, each summarised like the whole eval.

A stratum sorts every token of a window into class 0 or 1 by a mask bool [L] in token order:

    repeat      unmasked / masked   the soft-mask (lowercase) flag of the FASTA (always present)
    leakage     unmasked / masked   `prepare --leakage-k K`'s leakage_mask (when the shards have it)
    annotations NAME: out / in      the token's genomic coordinate lies in an interval of a BED file
                                    (`eval --annotate FILE.bed[:NAME]`, `annotate.py`)

Per-window statistics are stacked over the strata: sums / counts / context sums [S, 2, K+1]
(S strata, 2 classes, K buckets + "all"), each stratum's two classes adding up to every scored
token. `place` files the per-stratum results under `summary["repeat"]`, `summary["leakage"]`
and `summary["annotations"][NAME]`, each keyed by the class labels.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """The strata a window record carries: `repeat`, `leakage` if present, one per `annotations` name."""
    return [REPEAT] + ([LEAKAGE] if rec.get("leakage") is not None else []) + \
        [annotation(n) for n in rec.get("annotations") or {}]


def merged_strata(wa: dict, wb: dict) -> dict:
    """Window record `wa` with the strata `wb` has and `wa` lacks (two evals of the same window, so the
    same tokens): B's leakage mask when A has none, B's annotations under A's."""
    rec = dict(wa)
    if rec.get("leakage") is None:
        rec["leakage"] = wb.get("leakage")
    rec["annotations"] = {**(wb.get("annotations") or {}), **(wa.get("annotations") or {})}
    return rec


def mask_of(rec: dict, stratum: Stratum) -> np.ndarray:
    """Mask bool [L] of `stratum` in a window record ({"repeat", "leakage", "annotations": {NAME: mask}})."""
    return rec[stratum.section] if stratum.name is None else rec["annotations"][stratum.name]


def masks(rec: dict, strata: list[Stratum]) -> list[np.ndarray]:
    return [mask_of(rec, s) for s in strata]


def place(result: dict, strata: list[Stratum], per_stratum: list) -> dict:
    """Put per_stratum[s] ({label: ...}) at result[section] or result[section][name]; returns `result`."""
    for stratum, value in zip(strata, per_stratum):
        if stratum.name is None:
            result[stratum.section] = value
        else:
            result.setdefault(stratum.section, {})[stratum.name] = value
    return result


def describe(strata: list[Stratum]) -> dict:
    """What each section of the summary splits by (recorded in summary.json as `strata`)."""
    meaning = {"repeat": "soft-masked (lowercase) bases of the FASTA",
               "leakage": "tokens in a K-mer that occurs in a training chromosome (prepare --leakage-k)",
               "annotations": "tokens whose genomic coordinate lies in an interval of the BED file"}
    return {s.key: {"labels": list(s.labels), "mask_true": s.labels[1], "meaning": meaning[s.section]}
            for s in strata}
