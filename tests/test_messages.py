"""Refusals and warnings that say what is actually wrong: each case once gave a misleading message,
or none."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError


def one_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_eval_refuses_token_ids_outside_the_vocabulary(eval_inputs, tmp_path, capsys):
    import datasets

    shards = tmp_path / "S"
    shutil.copytree(eval_inputs.shards, shards)
    tokens = datasets.load_from_disk(str(shards / "eval")).with_format("numpy")[0]["tokens"]
    for arrow in (shards / "eval").glob("*.arrow"):
        data = bytearray(arrow.read_bytes())
        if (k := data.find(tokens[:256].astype("uint8").tobytes())) >= 0:
            data[k + 100] = 9  # a byte changed in place: the file keeps its size
            arrow.write_bytes(data)
    line = one_error(capsys, ["eval", "--checkpoint", str(eval_inputs.ckpt0), "--shards", str(shards), "--out",
                              str(tmp_path / "ev"), "--max-windows", "1"])
    assert "window 0 holds token id 9, outside the manifest's vocabulary (ids 0..4)" in line


def test_overwrite_through_a_symlinked_out_keeps_the_link(evaluated, tmp_path):
    target, link = tmp_path / "target", tmp_path / "link"
    argv = ["compare", str(evaluated.eval0), str(evaluated.eval1)]
    assert main([*argv, "--out", str(target)]) == 0
    link.symlink_to(target)
    assert main([*argv, "--out", str(link), "--overwrite"]) == 0
    assert link.is_symlink() and (target / "compare.json").is_file()


def test_demo_root_inside_shards_is_refused(tmp_path, capsys):
    (tmp_path / "S").mkdir()
    (tmp_path / "S" / "manifest.json").write_text("{}")
    line = one_error(capsys, ["demo", "--root", str(tmp_path / "S" / "demo")])
    assert f"lies inside shards (genome-lm prepare) ({tmp_path / 'S'})" in line


def test_layout_advice_leads_to_a_layout_that_fits():
    from genome_lm.config import ParallelConfig
    from genome_lm.parallel.mesh import check_layout, resolve_layout

    with pytest.raises(GenomeLMError, match=r"parallel.dp=2 x parallel.cp=3 = 6 processes, but this launch has 4"):
        resolve_layout(3, 2, 4)
    with pytest.raises(GenomeLMError, match="a multiple of 6 "):
        check_layout(ParallelConfig(cp=2, ep=3), 4)
    assert check_layout(ParallelConfig(cp=2, ep=3), 6) == (3, 2)


def _fasta(path: Path, records: dict[str, bytes]) -> Path:
    path.write_bytes(b"".join(b">" + n.encode() + b"\n" + b"".join(s[i:i + 60] + b"\n" for i in range(0, len(s), 60))
                              for n, s in records.items()))
    return path


def _prepare(fasta: Path, out: Path, **kw):
    from genome_lm.genome.prepare import PrepareParams, prepare

    params = PrepareParams.from_cli(fasta=[str(fasta)], train_chroms="chr1", eval_chroms="chr22", seq_len="256",
                                    min_len="64", **kw)
    return prepare(params, out, show_progress=False)


def test_an_all_n_eval_chromosome_is_named_not_told_to_lower_seq_len(tmp_path):
    fasta = _fasta(tmp_path / "g.fa", {"chr1": b"ACGT" * 300, "chr22": b"N" * 2000})
    with pytest.raises(GenomeLMError) as err:
        _prepare(fasta, tmp_path / "S")
    assert "chr22: all of its 2,000 bases are N" in str(err.value)
    assert "choose --eval-chroms that hold sequence" in str(err.value) and "--seq-len" not in str(err.value)


def test_a_stale_fai_index_is_named(tmp_path):
    fasta = _fasta(tmp_path / "g.fa", {"chr1": b"ACGT" * 150, "chr22": b"GATTACA" * 100})
    (tmp_path / "g.fa.fai").write_text("chr1\t1000\t6\t60\t61\nchr22\t700\t1030\t60\t61\n")  # of a longer chr1
    with pytest.raises(GenomeLMError, match=r"g.fa.fai does not match .*delete the .fai so it is rebuilt"):
        _prepare(fasta, tmp_path / "S")


def test_a_config_json_that_is_not_json_is_named(tmp_path):
    from genome_lm.model.presets import token_map

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(GenomeLMError, match=r"config.json is not JSON"):
        token_map({"A": 0, "C": 1, "G": 2, "T": 3, "N": 4}, tmp_path)


def test_annotation_chromosomes_are_echoed_as_written(tmp_path):
    from genome_lm.eval.annotate import read_bed
    from genome_lm.eval.run import check_annotations

    bed = tmp_path / "a.bed"
    bed.write_text("chrUn\t0\t10\nchrX\t5\t20\n")
    with pytest.raises(GenomeLMError, match=r"the file names chrUn, chrX"):
        check_annotations([read_bed(bed, "a")], ["chr22"], "eval")


def test_a_report_inside_an_eval_is_refused(evaluated, tmp_path, capsys):
    ev = tmp_path / "E"
    shutil.copytree(evaluated.eval0, ev)
    line = one_error(capsys, ["report", str(ev), "--out", str(ev / "report.html")])
    assert "lies inside an eval (genome-lm eval), which its command's --overwrite replaces whole" in line
    assert not (ev / "report.html").exists() and os.listdir(ev)
