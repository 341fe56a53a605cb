"""The compute-matched comparison (base, short- and long-context fine-tune): the pairs are compare_evals'
own numbers, the roles are found from the runs, and the report gets its section only with three models."""

from __future__ import annotations

import html
import math
import re

import pytest

from genome_lm.cli import main
from genome_lm.eval import compare_evals, load_summary, write_compare
from genome_lm.report import (
    build_report,
    context_gain,
    find_roles,
    format_ablation,
    format_context_gain,
    load_compare_dir,
    load_eval,
    reading,
)
from tests.report.conftest import STEPS, TOKENS_PER_STEP
from tests.report.test_report import _images

SECTION = "Is the gain from context, or from more training?"
LN2 = math.log(2)


def test_pairs_are_compare_evals_of_each_pair(matched):
    gain = context_gain(matched.base, matched.short, matched.long, resamples=300)
    for (b, a), cmp in gain.pairs.items():
        want = compare_evals(getattr(matched, a), getattr(matched, b), resamples=300)["overall"]
        assert cmp.result["overall"] == pytest.approx(want)
    for role in ("base", "short", "long"):
        assert gain.evals[role].summary == load_summary(getattr(matched, role))
        assert gain.training[role].tokens == STEPS * TOKENS_PER_STEP
    assert (gain.training["short"].seq_len, gain.training["long"].seq_len) == (256, 1024)
    assert gain.training["base"].init is None and gain.training["long"].init.endswith("base/checkpoints/last")


def test_three_way_table(matched):
    gain = context_gain(matched.base, matched.short, matched.long, resamples=300)
    text = format_context_gain(gain)
    lines = text.splitlines()
    for role, name in (("base", "base"), ("short", "short-context fine-tune"), ("long", "long-context fine-tune")):
        row = next(line for line in lines if line.strip().startswith(name + " "))
        bits = load_summary(getattr(matched, role))["overall"]["bits_per_base"]
        assert f"{bits:.4f}" in row and f"{STEPS * TOKENS_PER_STEP:,} @ " in row
    row = next(line for line in lines if "long - short (context)" in line)
    d = gain.pairs["long", "short"].result["overall"]
    assert f"{d['diff'] / LN2:+.4f}" in row and f"[{d['rel_ci_low']:+.2f}, {d['rel_ci_high']:+.2f}]" in row
    assert f"{d['n_tokens']:,}" in row
    assert "gain attributable to context" in text.replace("\n  ", " ")
    # the reading's verdict follows the long - short CI
    verdict = ("clear of zero" if d["rel_ci_high"] < 0 or d["rel_ci_low"] > 0 else "includes zero")
    assert verdict in reading(gain)


def test_ablation_table_of_the_three(matched, evaluated):
    gain = context_gain(matched.base, matched.short, matched.long, resamples=300)
    text = format_ablation(gain)
    lines = text.splitlines()
    assert "Does the model read distant sequence?" in text
    for L in (64, 256):
        row = next(line for line in lines if line.split()[:1] == [f"{L:,}"])
        for role in ("base", "short", "long"):
            abl = load_summary(getattr(matched, role))["context_ablation"]
            e = next(e for e in abl["by_length"] if e["L"] == L)
            assert f"{e['bits_per_base']:.4f}" in row
            if L == 256:  # the step from 64, and the span (the same two lengths here) with its verdict
                d = abl["paired_differences"][0]
                assert f"{d['mean_delta_bits']:+.4f} [{d['ci_low'] / LN2:+.4f}, {d['ci_high'] / LN2:+.4f}]" in row
                assert abl["span"]["mean_delta"] == pytest.approx(d["mean_delta"])
    flat = text.replace("\n  ", " ")
    assert "From L = 64 to 256:" in flat and flat.count("CI includes zero") + flat.count("clear of zero") == 3
    # evals without an ablation: no table
    assert format_ablation(context_gain(evaluated.eval0, evaluated.eval1, evaluated.eval1, resamples=50)) is None


def test_roles_found_from_the_runs(matched, evaluated):
    evs = [load_eval(d) for d in (matched.long, matched.base, matched.short)]
    base, short, long = find_roles(evs)
    assert (base.dir, short.dir, long.dir) == (matched.base, matched.short, matched.long)
    # evals without runs (or without a common base) have no roles
    assert find_roles([load_eval(d) for d in (evaluated.eval0, evaluated.eval1, matched.long)]) is None


def test_report_has_the_section_with_three_models(matched, tmp_path):
    page = build_report([matched.base, matched.short, matched.long])  # roles found, pairs computed
    images = _images(page)
    assert "context vs more training" in images and images["context vs more training"].startswith(b"\x89PNG")
    assert SECTION in page and "gain attributable to context" in page
    assert "training tokens" in page and f"{STEPS * TOKENS_PER_STEP:,} ({STEPS} steps at context 1,024)" in page
    assert re.search(r"rests on its [\d,]+ held-out tokens in 3 of the split&#x27;s \d+ windows \(its first 3\)", page)
    for label in ("short vs base", "long vs base", "long vs short"):  # all three pairs in the tables
        assert f"{label}: A = " in page


def test_report_reuses_given_compares_and_takes_explicit_roles(matched, tmp_path, monkeypatch):
    cmp = tmp_path / "short_vs_long"
    write_compare(matched.short, matched.long, cmp, resamples=300)
    calls = []
    import genome_lm.report.matched as m

    monkeypatch.setattr(m, "compare_evals", lambda a, b, **kw: calls.append((a, b)) or compare_evals(a, b, **kw))
    page = build_report([cmp], matched=(matched.base, matched.short, matched.long))
    assert SECTION in page
    assert sorted(calls) == sorted([(matched.base, matched.short), (matched.base, matched.long)])  # not short/long


def test_reading_pools_long_vs_short_over_seeds(matched, tmp_path):
    """A replicate compare of the fine-tunes (here seeds (short, long) vs (long, short): pooled, the sides are
    the same models) adds a sentence on long vs short per seed and pooled, in the headline and the section."""
    out = tmp_path / "seeds"
    write_compare([matched.short, matched.long], [matched.long, matched.short], out, resamples=300)
    seeds = load_compare_dir(out)
    gain = context_gain(matched.base, matched.short, matched.long, resamples=300)
    text = reading(gain, seeds)
    rep = seeds.result["replicates"]
    pair = [f"{p['rel_change_pct']:+.2f}%" for p in rep["pairs"]]
    assert pair[0] == f"{gain.pairs['long', 'short'].result['overall']['rel_change_pct']:+.2f}%"  # seed 1: the pair
    assert text.startswith(reading(gain) + " Over 2 training seeds of both fine-tunes")
    assert f"long vs short is {pair[0]}, {pair[1]} seed by seed and {rep['overall']['rel_change_pct']:+.2f}% pooled" \
        in text
    assert text.endswith("its CI includes zero, so these seeds and windows cannot tell it from no effect.")
    page = build_report([matched.base, matched.short, matched.long, out])
    assert page.count(html.escape(text)) == 2  # the page's headline and the section's


def test_two_models_get_no_section(evaluated):
    page = build_report([evaluated.eval0, evaluated.eval1])
    assert SECTION not in page and "context vs more training" not in _images(page)


def test_cli_report_of_three_evals(matched, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", str(matched.base), str(matched.short), str(matched.long), "--out", str(out)]) == 0
    assert SECTION in out.read_text()


def test_one_window_evals_print_no_ci_rather_than_fail(matched, eval_inputs, tmp_path):
    """The three models scored on one window: every CI is None, and the three-way table, its reading
    and the ablation table say "no CI" instead of failing on it or calling a change clear of zero."""
    from genome_lm.eval import EvalConfig, evaluate

    one = {}
    for role in ("base", "short", "long"):
        one[role] = tmp_path / role
        evaluate(EvalConfig(checkpoint=str(matched.root / "runs" / role / "checkpoints" / "last"),
                            shards=str(eval_inputs.shards), out=str(one[role]), max_windows=1, resamples=50,
                            context=[64, 256]), show_progress=False)
    gain = context_gain(one["base"], one["short"], one["long"], resamples=50)
    assert gain.pairs["long", "short"].result["overall"]["rel_ci_low"] is None
    assert reading(gain).endswith("no CI, which needs at least 2 eval windows.")
    assert "(95% CI n/a)" in format_context_gain(gain)
    flat = format_ablation(gain).replace("\n  ", " ")
    assert flat.count("(no CI)") == 3 and "clear of zero" not in flat


def test_trained_context_is_what_the_run_trained_not_what_it_asked(tmp_path):
    """A run that asked for 4096 but trained 512-token sequences is labelled 512; a run without
    `seq_tokens` in its metrics keeps config.yaml's data.seq_len."""
    import json
    from types import SimpleNamespace

    from genome_lm.report.matched import training_of

    run = tmp_path / "run"
    (run / "checkpoints" / "last").mkdir(parents=True)
    (run / "config.yaml").write_text("data: {seq_len: 4096}\nmodel: {name: glm53-tiny}\n")
    rows = [{"step": s, "tokens": 1024, "seq_tokens": 512} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = SimpleNamespace(summary={"checkpoint": {"path": str(run / "checkpoints" / "last")}})
    assert training_of(ev).seq_len == 512
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": r["step"], "tokens": 1024}) + "\n" for r in rows))
    assert training_of(ev).seq_len == 4096
