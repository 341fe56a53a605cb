"""`eval --context L1,L2,...`: the same targets given exactly L preceding tokens; summary, compare, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.eval import format_table, load_compare, load_summary
from genome_lm.eval.ablation import iter_ablation, plan, score_ablation
from genome_lm.eval.text import format_summary
from genome_lm.genome import load_shards
from genome_lm.genome.tokenizer import IGNORE_INDEX, N_ID
from tests.eval.data import ABLATION


@pytest.fixture(scope="module")
def model_and_window(eval_inputs):
    from genome_lm.model import apply_long_context, build

    model = build(eval_inputs.ckpt0, dtype="float32").model
    apply_long_context(model)
    tokens = load_shards(eval_inputs.shards, "eval")[0]["tokens"]
    return model.eval(), tokens


def _truncated_reference(model, tokens: np.ndarray, L: int, n: int) -> np.ndarray:
    """The window cut to its last L + n tokens, scored directly by the parallel forward; the last n NLLs."""
    piece = torch.from_numpy(tokens[len(tokens) - n - L:].astype(np.int64))[None]
    with torch.no_grad():
        out = model(piece, labels=torch.where(piece == N_ID, IGNORE_INDEX, piece), return_per_token_nll=True)
    return np.where(out.nll_mask[0].numpy(), out.per_token_nll[0].numpy(), np.nan)[L:]


@pytest.mark.parametrize("engine", ["parallel", "streaming"])
def test_targets_given_L_equal_the_truncated_window(model_and_window, engine):
    """The ablation's bar: <= 1e-5 nats against the truncated window, parallel engine as reference
    (float32; observed max |delta|: parallel 0, the same forward on the same tokens; streaming 4.8e-7
    with 96-token chunks)."""
    model, tokens = model_and_window
    lut = np.arange(256, dtype=np.int64)
    n, lengths = 128, [1, 37, 300, len(tokens) - 128]
    got = score_ablation(model, tokens, lut, 5, lengths, n, engine, chunk_tokens=96)
    assert got.shape == (len(lengths), n)
    for j, L in enumerate(lengths):
        ref = _truncated_reference(model, tokens, L, n)
        assert np.array_equal(np.isnan(got[j]), np.isnan(ref))
        err = np.nanmax(np.abs(got[j].astype(np.float64) - ref))
        assert err <= 1e-5, (engine, L)


def test_L_equal_t0_reuses_the_main_pass(model_and_window):
    model, tokens = model_and_window
    lut, n = np.arange(256, dtype=np.int64), 100
    main = np.full(len(tokens), 7.0, dtype=np.float32)  # a stand-in: only the reuse can produce 7
    got = score_ablation(model, tokens, lut, 5, [50, len(tokens) - n], n, main_nll=main)
    assert (got[1] == 7.0).all() and not (got[0] == 7.0).any()


def test_plan_windows_and_errors():
    lengths = np.array([1024, 1024, 600, 1024])
    assert plan(lengths, [64, 512], None, None).tolist() == [128, 128, 75, 128]
    assert plan(lengths, [64, 800], None, None).tolist() == [128, 128, 0, 128]  # 600 - 75 < 800: left out
    assert plan(lengths, [64, 900], 100, None).tolist() == [100, 100, 0, 100]
    with pytest.raises(GenomeLMError, match="--context 1,000: too long.*at most 896"):
        plan(lengths, [64, 1000], None, None)
    with pytest.raises(GenomeLMError, match="--ablation-targets 1024"):
        plan(lengths, [64], 1024, None)
    with pytest.raises(GenomeLMError, match="more than --seq-len 512"):
        plan(lengths, [64, 512], None, 512)


def test_ablation_in_summary_file_and_compare(strata_evaluated):
    s = load_summary(strata_evaluated.eval0)
    abl = s["context_ablation"]
    assert abl["lengths"] == ABLATION and [e["L"] for e in abl["by_length"]] == ABLATION
    assert [(d["from"], d["to"]) for d in abl["paired_differences"]] == list(zip(ABLATION, ABLATION[1:]))
    rows = list(iter_ablation(strata_evaluated.eval0))
    assert len(rows) == abl["n_windows"] == 5 and abl["windows_left_out"] == 0
    assert all(r["nll"].shape == (3, (r["end"] - r["start"]) // 8) for r in rows)
    assert all(r["target_start"] == r["end"] - r["start"] - r["nll"].shape[1] for r in rows)
    nll = np.concatenate([r["nll"] for r in rows], axis=1).astype(np.float64)  # [3, targets]
    nll = nll[:, ~np.isnan(nll).any(axis=0)]
    assert abl["target_tokens"] == nll.shape[1] == abl["by_length"][0]["tokens"]
    for j, e in enumerate(abl["by_length"]):
        assert e["mean_nll"] == pytest.approx(nll[j].mean(), rel=1e-9)
        assert e["ci_low"] <= e["ci_high"] and e["bits_per_base"] == pytest.approx(e["mean_nll"] / np.log(2))
    for j, d in enumerate(abl["paired_differences"]):
        assert d["mean_delta"] == pytest.approx((nll[j + 1] - nll[j]).mean(), abs=1e-12)
    span = abl["span"]
    assert (span["from"], span["to"]) == (ABLATION[0], ABLATION[-1])
    assert span["mean_delta"] == pytest.approx((nll[-1] - nll[0]).mean(), abs=1e-12)
    assert span["ci_low"] <= span["mean_delta"] <= span["ci_high"]
    r = abl["repeat"]
    assert r["masked"]["by_length"][0]["tokens"] + r["unmasked"]["by_length"][0]["tokens"] == abl["target_tokens"]
    assert "annotations" in abl and "leakage" in abl
    text = format_summary(s)
    assert "context ablation" in text and f"{abl['target_tokens']:,} target tokens" in text

    c = load_compare(strata_evaluated.cmp01)["context_ablation"]
    b = load_summary(strata_evaluated.eval1)["context_ablation"]
    assert c["lengths"] == ABLATION and c["target_tokens"] == abl["target_tokens"]
    for j, d in enumerate(c["difference"]):
        assert d["mean_nll_a"] == pytest.approx(abl["by_length"][j]["mean_nll"], rel=1e-9)
        assert d["mean_nll_b"] == pytest.approx(b["by_length"][j]["mean_nll"], rel=1e-9)
        assert d["diff"] == pytest.approx(d["mean_nll_b"] - d["mean_nll_a"], abs=1e-12)
        assert d["diff_ci_low"] <= d["diff"] <= d["diff_ci_high"] or abl["n_windows"] < 3
    g = c["gain_difference"][0]
    assert g["diff"] == pytest.approx(g["delta_b"] - g["delta_a"], abs=1e-12)
    # per stratum class: the same targets as each eval's own table of that class, and the classes add up
    for section in ("repeat", "leakage"):
        for label, part in c[section].items():
            mine, theirs = abl[section][label], b[section][label]
            assert part["a"]["by_length"] == mine["by_length"] and part["b"]["by_length"] == theirs["by_length"]
            assert part["difference"][0]["tokens"] == mine["by_length"][0]["tokens"]
        assert sum(p["difference"][0]["tokens"] for p in c[section].values()) == c["target_tokens"]
    assert set(c["annotations"]) == set(abl["annotations"])
    for name, part in c["annotations"].items():
        assert part["in"]["a"]["by_length"] == abl["annotations"][name]["in"]["by_length"]
    assert "B-A step" in format_table(load_compare(strata_evaluated.cmp01))


def test_cli_too_large_context_is_one_line_error(evaluated, tmp_path, capsys):
    argv = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards),
            "--out", str(tmp_path / "e"), "--max-windows", "1", "--context", "256,1k"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("genome-lm eval: error: --context 1,024: too long") and "at most 896" in err
    assert not (tmp_path / "e").exists()
