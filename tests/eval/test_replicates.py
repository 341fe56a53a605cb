"""`compare A1,A2,... B1,B2,...`: replicate evals (training seeds) pooled, with CIs over seeds."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from genome_lm.cli import main
from genome_lm.eval import compare_evals, format_table, load_summary


def _pick(t: dict, keys=("n_tokens", "mean_nll_a", "mean_nll_b", "diff", "diff_ci_low", "diff_ci_high",
                         "rel_change_pct", "rel_ci_low", "rel_ci_high")) -> dict:
    return {k: t[k] for k in keys}


def test_identical_replicates_pool_to_the_two_eval_compare(evaluated):
    """Two copies of the same pair: every pooled table is the pair's own compare, and the seeds spread nothing."""
    one = compare_evals(evaluated.eval0, evaluated.eval1, resamples=300)
    two = compare_evals([evaluated.eval0, evaluated.eval0], [evaluated.eval1, evaluated.eval1], resamples=300)
    assert _pick(two["overall"]) == _pick(one["overall"])
    assert [_pick(b) for b in two["buckets"]] == [_pick(b) for b in one["buckets"]]
    assert _pick(two["repeat"]["masked"]["overall"]) == _pick(one["repeat"]["masked"]["overall"])
    rep = two["replicates"]
    assert rep["n"] == 2 and all(_pick(p) == _pick(one["overall"]) for p in rep["pairs"])  # each pair: its own compare
    assert rep["spread"]["rel_change_pct"]["sd"] == 0
    assert rep["overall"]["diff"] == pytest.approx(one["overall"]["diff"])
    assert "replicates" not in one


def test_swapped_replicates_pool_to_zero_with_a_ci_that_sees_the_seeds(evaluated):
    """A = (m0, m1), B = (m1, m0): the pooled sides are the same model, so every pooled difference is 0
    with a zero-width window CI, while the pairs differ by +d and -d and the CI over seeds covers them."""
    r = compare_evals([evaluated.eval0, evaluated.eval1], [evaluated.eval1, evaluated.eval0], resamples=300)
    o = r["overall"]
    assert o["diff"] == pytest.approx(0, abs=1e-12)
    assert o["diff_ci_high"] - o["diff_ci_low"] == pytest.approx(0, abs=1e-9)
    d = load_summary(evaluated.eval1)["overall"]["mean_nll"] - load_summary(evaluated.eval0)["overall"]["mean_nll"]
    rep = r["replicates"]
    assert [p["diff"] for p in rep["pairs"]] == [pytest.approx(d, abs=1e-6), pytest.approx(-d, abs=1e-6)]
    assert rep["spread"]["diff"]["sd"] == pytest.approx(abs(d) * 2 ** 0.5, rel=1e-4)
    lo, hi = rep["overall"]["diff_ci_low"], rep["overall"]["diff_ci_high"]
    assert lo < -0.5 * abs(d) and hi > 0.5 * abs(d)  # resampling the pairs reaches toward -d and +d
    text = format_table(r)
    assert "replicates: 2 pairs" in text and "1 of 2 negative" in text and "over pairs and then windows" in text


def test_one_eval_against_replicates_is_paired_with_each(evaluated):
    """A base against fine-tune seeds: `compare BASE FT1,FT2` is `compare BASE,BASE FT1,FT2`."""
    one = compare_evals(evaluated.eval0, [evaluated.eval1, evaluated.eval0], resamples=200)
    both = compare_evals([evaluated.eval0, evaluated.eval0], [evaluated.eval1, evaluated.eval0], resamples=200)
    assert one["a"]["dirs"] == [str(evaluated.eval0)] * 2
    assert one["replicates"] == both["replicates"] and _pick(one["overall"]) == _pick(both["overall"])
    assert one["replicates"]["pairs"][1]["diff"] == 0  # eval0 against itself


def test_replicate_ablation_spans(strata_evaluated):
    """With --context: each pair's ablation span is its evals' own, and swapped replicates pool to no difference."""
    e0, e1 = strata_evaluated.eval0, strata_evaluated.eval1
    r = compare_evals([e0, e1], [e1, e0], resamples=200)
    span = {e: load_summary(e)["context_ablation"]["span"]["mean_delta"] for e in (e0, e1)}
    p0 = r["replicates"]["pairs"][0]["ablation_span"]
    assert p0["a"]["mean_delta"] == pytest.approx(span[e0], abs=1e-6)
    assert p0["b"]["mean_delta"] == pytest.approx(span[e1], abs=1e-6)
    abl = r["replicates"]["context_ablation"]
    assert abl["gain_difference"]["diff"] == pytest.approx(0, abs=1e-9)
    assert abl["a"]["mean_delta"] == pytest.approx((span[e0] + span[e1]) / 2, abs=1e-6)
    assert r["context_ablation"]["difference"][0]["diff"] == pytest.approx(0, abs=1e-9)  # pooled table
    assert "ablation span L" in format_table(r)


def test_cli_replicates_and_their_errors(evaluated, tmp_path, capsys):
    pair = f"{evaluated.eval0},{evaluated.eval1}"
    assert main(["compare", pair, f"{evaluated.eval1},{evaluated.eval0}", "--out", str(tmp_path / "c")]) == 0
    assert "replicates: 2 pairs" in capsys.readouterr().out

    def error(a: str, b: str) -> str:
        assert main(["compare", a, b, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err and "Traceback" not in "\n".join(err) and not (tmp_path / "bad").exists()
        return err[-1]

    copy = tmp_path / "copy"
    shutil.copytree(evaluated.eval0, copy)
    assert "3 replicate evals for A and 2 for B" in error(f"{evaluated.eval0},{evaluated.eval1},{copy}", pair)
    assert error(f"{evaluated.eval0},{evaluated.eval1}", f"{evaluated.eval1},{evaluated.eval1}/.") == (
        f"genome-lm compare: error: eval B lists {evaluated.eval1} twice ({evaluated.eval1}); replicates are evals of "
        "models trained with different seeds: give each once")
    assert "nowhere does not exist" in error(f"{evaluated.eval0},{tmp_path / 'nowhere'}", pair)
    short = tmp_path / "short"
    shutil.copytree(evaluated.eval1, short)
    pq.write_table(pq.read_table(short / "tokens.parquet").slice(0, 2), short / "tokens.parquet")
    assert "scored different windows" in error(f"{evaluated.eval0},{short}", pair)
