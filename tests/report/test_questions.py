"""The report's sections for the three questions of report/questions.py on evals that ran with
--context, --strands both, a leakage mask and --annotate; absent sections give None."""

from __future__ import annotations

from genome_lm.report import load_eval
from genome_lm.report import questions as q
from genome_lm.report.plots import _tokens, figure_png


def test_sections_from_evals_with_every_flag(strata_evaluated):
    evals = [load_eval(strata_evaluated.eval0), load_eval(strata_evaluated.eval1)]
    for plot in (q.plot_context_ablation, q.plot_strands, q.plot_leakage):
        assert figure_png(plot(evals)).startswith(b"\x89PNG")
    ab = evals[0].summary["context_ablation"]
    table = q.context_ablation_table(evals)
    assert table.count("<tr>") == 1 + 2 * len(ab["by_length"])  # header + one row per eval and L
    reading = q.context_ablation_reading(evals)
    assert f"{ab['target_tokens']:,} target tokens" in reading
    span = ab["span"]  # the reading is the change over the whole span of L
    assert f"{_tokens(span['from'])} → {_tokens(span['to'])} changes" in reading
    assert f"{span['mean_delta_bits']:+.4f}" in reading
    st = evals[0].summary["strands"]
    assert f"{st['average']['overall']['n_tokens']:,} tokens" in q.strands_reading(evals)
    assert "per-base agreement r" in q.strands_table(evals)
    lk = evals[0].summary["leakage"]
    masked = lk["masked"]["overall"]["n_tokens"]
    assert masked > 0 and f"{masked:,} of" in q.leakage_reading(evals)
    strata = q.strata_table(evals)
    assert "shared with training" in strata and "stripes" in strata and "segdups" in strata


def test_sections_absent_without_the_flags(evaluated):
    evals = [load_eval(evaluated.eval0), load_eval(evaluated.eval1)]
    for fn in (q.plot_context_ablation, q.context_ablation_table, q.context_ablation_reading, q.plot_strands,
               q.strands_table, q.strands_reading, q.plot_leakage, q.leakage_reading, q.strata_table):
        assert fn(evals) is None, fn.__name__


def test_report_page_has_a_section_per_question(strata_evaluated, tmp_path):
    from genome_lm.report import write_report

    page = write_report([strata_evaluated.eval0, strata_evaluated.eval1], out=tmp_path / "r.html").read_text()
    for title in ("Does the model read distant sequence?", "Does it hold on the other strand?",
                  "Is the held-out chromosome really held out?"):
        assert title in page
    assert page.count("data:image/png;base64,") >= 5


def test_one_window_has_no_ci_and_every_section_still_renders(eval_inputs, strata_inputs, tmp_path):
    """One eval window gives a window bootstrap nothing to resample: the summaries carry no CI (None),
    the text says so, and the report and its plots render without them."""
    from genome_lm.eval import EvalConfig, evaluate, write_compare
    from genome_lm.eval.text import format_summary
    from genome_lm.report import write_report
    from tests.eval.data import ABLATION

    flags = {"annotate": [str(strata_inputs.segdups_bed)], "context": ABLATION, "strands": "both"}
    for i, ckpt in enumerate((eval_inputs.ckpt0, eval_inputs.ckpt1)):
        evaluate(EvalConfig(checkpoint=str(ckpt), shards=str(strata_inputs.shards), out=str(tmp_path / f"e{i}"),
                            max_windows=1, resamples=100, **flags), show_progress=False)
    write_compare(tmp_path / "e0", tmp_path / "e1", tmp_path / "cmp", resamples=100)
    summary = load_eval(tmp_path / "e0").summary
    assert summary["overall"]["ci_low"] is None and summary["overall"]["mean_nll"] is not None
    assert all(r["ci_low"] is None for r in summary["context_ablation"]["by_length"])
    assert "no 95% CI: it needs at least 2 windows" in format_summary(summary)
    page = write_report([tmp_path / "e0", tmp_path / "e1", tmp_path / "cmp"], out=tmp_path / "r.html").read_text()
    assert "Does it hold on the other strand?" in page and "n/a" in page
