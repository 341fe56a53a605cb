"""The HTML report (plots embedded as PNG data URIs, tables) and its CLI errors."""

from __future__ import annotations

import base64
import re

from genome_lm.cli import main
from genome_lm.report import build_report, load_eval, load_run, plot_loss_by_context, write_report

IMG = re.compile(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


def _images(page: str) -> dict[str, bytes]:
    return {alt: base64.b64decode(data) for alt, data in IMG.findall(page)}


def test_report_contains_every_plot_and_table(evaluated, tmp_path):
    out = write_report([evaluated.eval0, evaluated.eval1, evaluated.cmp01], tmp_path / "r" / "report.html",
                       runs=[evaluated.run])
    page = out.read_text()
    images = _images(page)
    assert set(images) == {"loss vs preceding context", "relative change vs context", "repeat vs non-repeat",
                           "training curves"}
    assert all(png.startswith(b"\x89PNG") and len(png) > 10_000 for png in images.values())
    assert page.count('<table class="glm">') == 5  # repeat, runs, compare, 2 x buckets
    assert "bits per base" in page and "largest relative change" in page
    n_split = load_eval(evaluated.eval0).summary["shards"]["n_windows_in_split"]
    assert n_split > 3 and f"in 3 of the split's {n_split} windows (its first 3)" in page  # which windows
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched


def test_two_evals_imply_a_comparison(evaluated):
    page = build_report([evaluated.eval0, evaluated.eval1])
    assert "relative change vs context" in _images(page)
    assert "eval1 vs eval0" in page


def test_figures_have_labelled_axes(evaluated):
    fig = plot_loss_by_context([load_eval(evaluated.eval0)])
    ax = fig.axes[0]
    assert "bits per base" in ax.get_ylabel() and "preceding context" in ax.get_xlabel() and ax.get_xscale() == "log"
    assert any("nats per token" in a.get_ylabel() for a in ax.child_axes)  # right-hand axis
    assert load_run(evaluated.run).columns["loss"].shape == (30,)


def test_cli_report(evaluated, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", str(evaluated.eval0), str(evaluated.eval1), "--run", str(evaluated.run),
                 "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert len(_images(out.read_text())) == 4


def test_cli_report_errors_are_one_line(evaluated, tmp_path, capsys):
    for argv, expect in (
        ([str(tmp_path / "missing")], "does not exist"),
        ([str(evaluated.shards)], "neither summary.json nor compare.json"),
        (["--run", str(evaluated.eval0)], "no metrics.jsonl"),
        ([], "nothing to report"),
    ):
        assert main(["report", *argv, "--out", str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("genome-lm report: error: ") and expect in err[-1]
    assert not (tmp_path / "r.html").exists()


def test_windows_text_names_the_sample():
    from genome_lm.report.data import windows_text

    shards = {"n_windows": 12, "n_windows_in_split": 66}
    assert windows_text({"shards": shards}) == "12 of the split's 66 windows (its first 12)"  # older evals: first
    assert windows_text({"shards": dict(shards, window_pick="spread")}) == \
        "12 of the split's 66 windows (spread evenly over it)"
    assert windows_text({"shards": dict(shards, n_windows=66)}) == "66 windows"
