"""Strata of an eval: the leakage mask, BED annotations; in summary.json, compare.json and the text."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from genome_lm.eval import format_table, iter_windows, load_compare, load_summary
from genome_lm.eval.text import format_summary
from genome_lm.genome import load_shards
from genome_lm.genome.tokenizer import unpack_mask


def _split_adds_up(section: dict, whole: dict, labels=("unmasked", "masked")) -> None:
    """The two classes of a stratum hold every token of `whole`, overall and bucket by bucket, and
    their token-weighted means give its mean."""
    parts = [section[x] for x in labels]
    assert sum(p["overall"]["n_tokens"] for p in parts) == whole["overall"]["n_tokens"]
    for k, b in enumerate(whole["buckets"]):
        assert b["n_tokens"] == sum(p["buckets"][k]["n_tokens"] for p in parts)
    total = sum((p["overall"]["mean_nll"] or 0.0) * p["overall"]["n_tokens"] for p in parts)
    assert total / whole["overall"]["n_tokens"] == pytest.approx(whole["overall"]["mean_nll"], rel=1e-9)


def test_leakage_strata_in_summary_and_tokens(strata_evaluated):
    s = load_summary(strata_evaluated.eval0)
    assert "leakage" in s and "strata_absent" not in s
    _split_adds_up(s["leakage"], s)
    ds = load_shards(strata_evaluated.shards, "eval")
    masked = 0
    for w in iter_windows(strata_evaluated.eval0, "forward"):
        row = ds[w["window"]]
        leak = unpack_mask(row["leakage_mask"], len(row["tokens"]))
        assert np.array_equal(w["leakage"], leak)  # tokens.parquet carries the shards' mask
        masked += int((leak & ~np.isnan(w["nll"])).sum())
    assert masked > 0 and s["leakage"]["masked"]["overall"]["n_tokens"] == masked
    assert s["strata"]["leakage"]["mask_true"] == "masked"
    text = format_summary(s)
    assert "leakage masked" in text and f"{masked:,}" in text and "repeat masked" in text
    assert "leakage_mask" in pq.read_schema(strata_evaluated.eval0 / "tokens.parquet").names


def test_no_leakage_column_no_leakage_section(evaluated):
    s = load_summary(evaluated.eval0)
    assert "leakage" not in s and "leakage" in s["strata_absent"]
    assert "no leakage split" in format_summary(s)
    assert "leakage_mask" not in pq.read_schema(evaluated.eval0 / "tokens.parquet").names
    r = load_compare(evaluated.cmp01)
    assert "leakage" not in r and "no leakage split" in format_table(r)


def test_compare_pairs_leakage_classes(strata_evaluated):
    r = load_compare(strata_evaluated.cmp01)
    a, b = load_summary(strata_evaluated.eval0), load_summary(strata_evaluated.eval1)
    for c in ("masked", "unmasked"):
        o = r["leakage"][c]["overall"]
        assert o["n_tokens"] == a["leakage"][c]["overall"]["n_tokens"]
        assert abs(o["mean_nll_a"] - a["leakage"][c]["overall"]["mean_nll"]) < 1e-9
        assert abs(o["mean_nll_b"] - b["leakage"][c]["overall"]["mean_nll"]) < 1e-9
        assert o["diff_ci_low"] <= o["diff"] <= o["diff_ci_high"]
    assert "leakage masked" in format_table(r)
