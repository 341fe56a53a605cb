"""`eval --strands both`: reverse-complement rows, per-strand and pooled tables, agreement, compare."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from genome_lm.eval import compare_evals, format_table, iter_windows, load_compare, load_summary
from genome_lm.eval.text import format_summary
from genome_lm.genome import load_shards
from genome_lm.genome.tokenizer import IGNORE_INDEX, N_ID, reverse_complement
from tests.eval.data import STRATA_WINDOWS
from tests.eval.test_strata import _split_adds_up


def test_reverse_rows_follow_forward_rows(strata_evaluated):
    from genome_lm.model import apply_long_context, build

    rows = list(iter_windows(strata_evaluated.eval0))
    assert len(rows) == 2 * STRATA_WINDOWS
    assert [(r["window"], r["rc"]) for r in rows] == [(i, rc) for i in range(STRATA_WINDOWS) for rc in (False, True)]
    ds = load_shards(strata_evaluated.shards, "eval")
    model = build(strata_evaluated.ckpt0).model
    apply_long_context(model)
    for f, r in zip(rows[::2], rows[1::2]):
        assert (f["strand"], r["strand"]) == ("+", "-") and (f["start"], f["end"]) == (r["start"], r["end"])
        for key in ("repeat", "leakage"):
            assert np.array_equal(r[key], f[key][::-1])
        assert np.array_equal(r["annotations"]["stripes"], f["annotations"]["stripes"][::-1])
        if f["window"] == 0:  # the reverse row is the reverse complement scored as one sequence
            ids = torch.from_numpy(reverse_complement(ds[0]["tokens"]).astype(np.int64))[None]
            with torch.no_grad():
                out = model.eval()(ids, labels=torch.where(ids == N_ID, IGNORE_INDEX, ids), return_per_token_nll=True)
            ref = np.where(out.nll_mask[0].numpy(), out.per_token_nll[0].numpy(), np.nan)
            np.testing.assert_allclose(r["nll"], ref, rtol=0, atol=1e-5)
    assert pq.read_schema(strata_evaluated.eval0 / "tokens.parquet").field("reverse_complement").type == "bool"


def test_strand_tables_and_agreement(strata_evaluated):
    s = load_summary(strata_evaluated.eval0)
    st = s["strands"]
    assert st["forward"]["overall"] == s["overall"] and st["forward"]["buckets"] == s["buckets"]
    f, r, avg = (st[k]["overall"] for k in ("forward", "reverse", "average"))
    assert f["n_tokens"] == r["n_tokens"] and avg["n_tokens"] == 2 * f["n_tokens"]
    assert avg["mean_nll"] == pytest.approx((f["mean_nll"] + r["mean_nll"]) / 2, rel=1e-9)
    for key in ("reverse", "average"):
        _split_adds_up(st[key]["leakage"], st[key])
        _split_adds_up(st[key]["annotations"]["stripes"], st[key], labels=("out", "in"))
    rows = list(iter_windows(strata_evaluated.eval0))
    fr = [(a["nll"].astype(np.float64), b["nll"][::-1].astype(np.float64)) for a, b in zip(rows[::2], rows[1::2])]
    x = np.concatenate([a for a, _ in fr])
    y = np.concatenate([b for _, b in fr])
    ok = ~(np.isnan(x) | np.isnan(y))
    g = st["agreement"]["overall"]
    assert g["n_tokens"] == int(ok.sum())
    assert g["pearson_r"] == pytest.approx(np.corrcoef(x[ok], y[ok])[0, 1], abs=1e-9)
    assert g["mean_abs_diff"] == pytest.approx(np.abs(x[ok] - y[ok]).mean(), rel=1e-9)
    assert g["mean_diff"] == pytest.approx((x[ok] - y[ok]).mean(), abs=1e-12)
    assert g["abs_diff_ci_low"] <= g["mean_abs_diff"] <= g["abs_diff_ci_high"]
    assert sum(b["n_tokens"] for b in st["agreement"]["buckets"]) == g["n_tokens"]
    # a base at position j of a 1024-token window: contexts j and 1023 - j, shorter one <= 511
    assert all(b["n_tokens"] == 0 for b in st["agreement"]["buckets"] if b["lo"] >= 512)
    text = format_summary(s)
    assert "reverse complement" in text and "strand agreement over" in text and f"{g['n_tokens']:,}" in text


def test_compare_per_strand_and_pooled(strata_evaluated, tmp_path):
    c = load_compare(strata_evaluated.cmp01)
    a, b = load_summary(strata_evaluated.eval0), load_summary(strata_evaluated.eval1)
    assert c["strands"]["forward"]["overall"] == c["overall"]
    for key in ("reverse", "average"):
        o = c["strands"][key]["overall"]
        assert o["n_tokens"] == a["strands"][key]["overall"]["n_tokens"]
        assert o["mean_nll_a"] == pytest.approx(a["strands"][key]["overall"]["mean_nll"], rel=1e-9)
        assert o["mean_nll_b"] == pytest.approx(b["strands"][key]["overall"]["mean_nll"], rel=1e-9)
        assert o["diff_ci_low"] <= o["diff"] <= o["diff_ci_high"]
        assert "masked" in c["strands"][key]["leakage"]
    for side, summary in (("a", a), ("b", b)):
        assert c["strands"]["agreement"][side] == summary["strands"]["agreement"]["overall"]
    assert "both strands" in format_table(c) and "strand agreement (per-base Pearson r): A " in format_table(c)
    # against an eval of the forward strand only: the top level still pairs, the strands say why not
    one = tmp_path / "one"
    shutil.copytree(strata_evaluated.eval1, one)
    table = pq.read_table(one / "tokens.parquet")
    keep = table.filter(table.column("reverse_complement").to_numpy(zero_copy_only=False) == False)  # noqa: E712
    pq.write_table(keep.drop_columns(["reverse_complement"]), one / "tokens.parquet")
    s = json.loads((one / "summary.json").read_text())
    del s["strands"]
    (one / "summary.json").write_text(json.dumps(s))
    r = compare_evals(strata_evaluated.eval0, one, resamples=100)
    assert r["overall"]["n_tokens"] == c["overall"]["n_tokens"] and "only" in r["strands"]["absent"]
    assert "no strand comparison" in format_table(r)
