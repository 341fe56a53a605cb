"""`compare` on two evals of the same windows, and the one-line CLI errors of eval/compare."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.eval import compare_evals, format_table, load_compare, load_summary


def test_compare_two_evals(evaluated):
    r = load_compare(evaluated.cmp01)
    a, b = load_summary(evaluated.eval0), load_summary(evaluated.eval1)
    o = r["overall"]
    assert o["n_tokens"] == a["overall"]["n_tokens"] == b["overall"]["n_tokens"]  # same tokens scored
    assert (o["mean_nll_a"] == pytest.approx(a["overall"]["mean_nll"])
            and o["mean_nll_b"] == pytest.approx(b["overall"]["mean_nll"]))
    assert o["diff"] == pytest.approx(b["overall"]["mean_nll"] - a["overall"]["mean_nll"])
    assert o["rel_change_pct"] == pytest.approx(100 * (b["overall"]["mean_nll"] / a["overall"]["mean_nll"] - 1))
    assert o["diff_ci_low"] <= o["diff"] <= o["diff_ci_high"]
    assert o["rel_ci_low"] <= o["rel_change_pct"] <= o["rel_ci_high"]
    assert ([(x["lo"], x["hi"], x["n_tokens"]) for x in r["buckets"]]
            == [(x["lo"], x["hi"], x["n_tokens"]) for x in a["buckets"]])
    shares = [x["gain_share"] for x in r["buckets"] if x["n_tokens"]]
    assert sum(shares) == pytest.approx(1.0)
    assert r["concentration"]["largest_relative_gain"]["lo"] in {x["lo"] for x in r["buckets"]}
    table = format_table(r)
    assert "repeat masked" in table and "[512, 1,024)" in table


def test_compare_with_itself_is_zero(evaluated):
    r = compare_evals(evaluated.eval0, evaluated.eval0, resamples=200)
    o = r["overall"]
    assert o["diff"] == 0 and o["diff_ci_low"] == 0 and o["diff_ci_high"] == 0 and o["rel_change_pct"] == 0


def test_cli_compare_of_an_eval_with_itself_warns(evaluated, tmp_path, caplog):
    assert main(["compare", str(evaluated.eval0), str(evaluated.eval0) + "/", "--out", str(tmp_path / "c")]) == 0
    assert f"A and B are the same eval ({evaluated.eval0}); every difference is 0" in caplog.text
    caplog.clear()
    assert main(["compare", str(evaluated.eval0), str(evaluated.eval1), "--out", str(tmp_path / "d")]) == 0
    assert "same eval" not in caplog.text


def test_cli_compare_prints_table(evaluated, tmp_path, capsys):
    assert main(["compare", str(evaluated.eval0), str(evaluated.eval1), "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "B-A" in out and "largest relative change" in out
    assert json.loads((tmp_path / "c" / "compare.json").read_text())["n_windows"] == 3


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"genome-lm {command}: error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def test_cli_compare_mismatched_evals(evaluated, tmp_path, capsys):
    short = tmp_path / "short"
    shutil.copytree(evaluated.eval1, short)
    table = pq.read_table(short / "tokens.parquet")
    pq.write_table(table.slice(0, 2), short / "tokens.parquet")
    assert main(["compare", str(evaluated.eval0), str(short), "--out", str(tmp_path / "c")]) == 2
    line = _one_line_error(capsys, "compare")
    assert "scored different windows (3 vs 2; window 2: " in line and " vs none)" in line, line
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("case", ["missing_checkpoint", "missing_shards", "bad_buckets", "out_exists", "bad_split",
                                  "compare_missing"])
def test_cli_user_errors_are_one_line(evaluated, tmp_path, capsys, case):
    base = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards),
            "--out", str(tmp_path / "e")]
    argv, command, expect = {
        "missing_checkpoint": (["eval", "--checkpoint", str(tmp_path / "nope"), "--shards", str(evaluated.shards),
                                "--out", str(tmp_path / "e")], "eval", "does not exist"),
        "missing_shards": (["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(tmp_path / "nope"),
                            "--out", str(tmp_path / "e")], "eval", "manifest.json"),
        "bad_buckets": (base + ["--buckets", "0,8,4"], "eval", "--buckets"),
        "out_exists": (base[:-1] + [str(evaluated.eval0)], "eval", "already exists"),
        "bad_split": (base + ["--split", "test"], "eval", "split"),
        "compare_missing": (["compare", str(evaluated.eval0), str(tmp_path / "nope"), "--out", str(tmp_path / "c")],
                            "compare", "does not exist"),
    }[case]
    assert main(argv) == 2
    assert expect in _one_line_error(capsys, command)


def test_cli_eval_explicit_buckets(evaluated, tmp_path, capsys):
    argv = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards),
            "--out", str(tmp_path / "e"),
            "--max-windows", "1", "--buckets", "0,16,256,1k"]
    assert main(argv) == 0
    assert "bits/base" in capsys.readouterr().out
    s = load_summary(tmp_path / "e")
    assert [(b["lo"], b["hi"]) for b in s["buckets"]] == [(0, 16), (16, 256), (256, 1024)]


def test_an_empty_name_between_commas_or_a_file_is_refused(tmp_path):
    from genome_lm.eval.compare import eval_dirs

    a, f = tmp_path / "a", tmp_path / "f"
    a.mkdir()
    f.write_text("x")
    assert eval_dirs(f"{a} , {a}", "A") == [a, a]
    for spec in (f"{a},", f"{a},,{a}", f",{a}"):
        with pytest.raises(GenomeLMError, match=r"eval A .*: an empty name between its commas"):
            eval_dirs(spec, "A")
    with pytest.raises(GenomeLMError, match=r"/f is a file, not a directory; give --out directories"):
        eval_dirs(str(f), "A")
