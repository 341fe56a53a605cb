"""`eval --annotate FILE.bed[:NAME]`: BED parsing and errors, masks by coordinate, summary and compare."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.eval import format_table, iter_windows, load_compare, load_summary
from genome_lm.eval.annotate import load_annotations, parse_spec, read_bed
from genome_lm.eval.text import format_summary
from tests.eval.data import STRIPE
from tests.eval.test_strata import _split_adds_up


def test_mask_is_half_open_merged_and_reversed_on_minus(tmp_path):
    bed = tmp_path / "a.bed"
    bed.write_text("browser position chr1\nchr1\t2\t5\nchr1\t4\t7\t.\t0\t-\nChr1 9 10\n1 10 12\nchr1 3 3\nchr2 0 4\n")
    a = read_bed(bed, "a")
    starts, ends = a.intervals["1"]
    assert starts.tolist() == [2, 9] and ends.tolist() == [7, 12]  # overlapping and abutting intervals joined
    assert a.mask("chr1", 0, 14).astype(int).tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0]
    assert a.mask("1", 5, 10).astype(int).tolist() == [1, 1, 0, 0, 1]  # base 10 is outside [5, 10)
    # a '-' row [5, 10): token j at 9 - j
    assert a.mask("chr1", 5, 10, "-").astype(int).tolist() == [1, 0, 0, 1, 1]
    assert not a.mask("chr3", 0, 5).any() and a.mask("chr2", 2, 6).tolist() == [True, True, False, False]
    assert a.record()["bases"] == 5 + 3 + 4 and a.record()["intervals"] == 6


def test_mask_matches_brute_force(tmp_path):
    rng = np.random.default_rng(0)
    starts = rng.integers(0, 5000, 300)
    ends = starts + rng.integers(0, 80, 300)
    bed = tmp_path / "r.bed.gz"
    with gzip.open(bed, "wt") as f:
        f.writelines(f"chr7\t{s}\t{e}\n" for s, e in zip(starts, ends))
    a = read_bed(bed, "r")
    truth = np.zeros(6000, bool)
    for s, e in zip(starts, ends):
        truth[s:e] = True
    for s, e in [(0, 6000), (17, 1040), (4990, 5100), (123, 124)]:
        assert np.array_equal(a.mask("chr7", s, e), truth[s:e])
        assert np.array_equal(a.mask("chr7", s, e, "-"), truth[s:e][::-1])


def test_spec_names(tmp_path):
    assert parse_spec("x/rmsk.LINE.bed") == (tmp_path.__class__("x/rmsk.LINE.bed"), "rmsk.LINE")
    assert parse_spec("x/exons.bed.gz")[1] == "exons"
    assert parse_spec("x/a.bed:Alu") == (tmp_path.__class__("x/a.bed"), "Alu")
    odd = tmp_path / "odd:name.bed"
    odd.write_text("chr1 0 1\n")
    assert parse_spec(str(odd)) == (odd, "odd:name")  # an existing path is taken whole
    with pytest.raises(GenomeLMError, match="given twice"):
        load_annotations([f"{odd}:n", f"{odd}:n"])


@pytest.mark.parametrize("text, expect", [
    ("chr1 5\n", "line 1: 2 field"),
    ("# header\nchr1 a 9\n", "line 2: start 'a'"),
    ("chr1 9 5\n", "line 1: interval [9, 5)"),
    ("chr1 -1 5\n", "0 <= start"),
])
def test_malformed_bed_names_file_and_line(tmp_path, text, expect):
    bed = tmp_path / "bad.bed"
    bed.write_text(text)
    with pytest.raises(GenomeLMError, match="--annotate") as e:
        read_bed(bed, "bad")
    assert str(bed) in str(e.value) and expect in str(e.value)


def test_annotation_strata_in_summary_tokens_and_compare(strata_evaluated):
    s = load_summary(strata_evaluated.eval0)
    assert set(s["annotations"]) == {"segdups", "stripes"}
    for name in ("segdups", "stripes"):
        _split_adds_up(s["annotations"][name], s, labels=("out", "in"))
    rec = s["strata"]["annotations:stripes"]
    assert rec["chroms"] == ["22"] and rec["intervals"] == 600 and rec["file"].endswith("stripes.bed")
    n_in = 0
    for w in iter_windows(strata_evaluated.eval0, "forward"):
        pos = w["start"] + np.arange(len(w["nll"]))
        assert np.array_equal(w["annotations"]["stripes"], (pos % 100) < STRIPE)  # '22' matched 'chr22'
        n_in += int((w["annotations"]["stripes"] & ~np.isnan(w["nll"])).sum())
    assert s["annotations"]["stripes"]["in"]["overall"]["n_tokens"] == n_in > 0
    assert s["annotations"]["segdups"]["in"]["overall"]["n_tokens"] > 0
    assert "stripes in" in format_summary(s) and "segdups out" in format_summary(s)
    r = load_compare(strata_evaluated.cmp01)
    b = load_summary(strata_evaluated.eval1)
    for c in ("in", "out"):
        o = r["annotations"]["stripes"][c]["overall"]
        assert o["n_tokens"] == s["annotations"]["stripes"][c]["overall"]["n_tokens"]
        assert o["mean_nll_b"] == pytest.approx(b["annotations"]["stripes"][c]["overall"]["mean_nll"], rel=1e-9)
    assert "stripes in" in format_table(r)


BAD_BEDS = {
    "missing": (None, "no such file"),
    "malformed": ("chr22\t10\t20\nchr22\tten\t20\n", "line 2"),
    "empty": ("", "holds no interval"),
    "comments only": ("# header\ntrack name=x\n\n", "holds no interval"),
    "zero-length only": ("chr22\t10\t10\n", "holds no interval"),
    "other chromosomes": ("chr1\t0\t100\nchrX\t5\t9\n", "no interval lies on a chromosome of the eval split (chr22)"),
}


@pytest.mark.parametrize("case", list(BAD_BEDS))
def test_cli_bad_bed_is_one_line_error_before_scoring(evaluated, tmp_path, capsys, case):
    bed = tmp_path / "x.bed"
    text, expect = BAD_BEDS[case]
    if text is not None:
        bed.write_text(text)
    argv = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards),
            "--out", str(tmp_path / "e"), "--max-windows", "1", "--annotate", f"{bed}:x"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("genome-lm eval: error: --annotate") and str(bed) in err and "Traceback" not in err
    assert expect in err
    assert not (tmp_path / "e").exists() and not list(tmp_path.glob(".e*"))


def test_bed_missing_the_scored_windows_warns_of_an_empty_stratum(evaluated, tmp_path, caplog):
    bed = tmp_path / "far.bed"
    bed.write_text("chr22\t900000000\t900000100\n")  # on chr22, beyond every window
    argv = ["eval", "--checkpoint", str(evaluated.ckpt0), "--shards", str(evaluated.shards),
            "--out", str(tmp_path / "e"), "--max-windows", "1", "--annotate", f"{bed}:far"]
    assert main(argv) == 0
    assert load_summary(tmp_path / "e")["annotations"]["far"]["in"]["overall"]["n_tokens"] == 0
    assert any("no scored token lies in its intervals" in r.getMessage() and str(bed) in r.getMessage()
               for r in caplog.records)
