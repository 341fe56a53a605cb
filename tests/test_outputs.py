"""Output folders a command owns: `--overwrite` never deletes an input, a run, shards or foreign files.

Each refusal is one line from the CLI with exit 2, and every input file keeps its exact bytes.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.outputs import MARKER, claim_output, read_marker, write_marker


def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every file under `roots` (or of each root that is a file)."""
    files = [p for r in roots for p in ([r] if r.is_file() else sorted(r.rglob("*"))) if p.is_file()]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def refused(capsys, argv: list[str], *expected: str) -> str:
    """Run the CLI, assert exit 2 with one stderr line containing each of `expected`; return that line."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def eval_args(ckpt: Path, shards: Path, out: Path, *more: str) -> list[str]:
    return ["eval", "--checkpoint", str(ckpt), "--shards", str(shards), "--out", str(out), "--max-windows", "1",
            "--resamples", "50", *more]


def test_eval_into_the_run_that_holds_its_checkpoint_is_refused(eval_inputs, tmp_path, capsys):
    run = tmp_path / "runs" / "X"
    shutil.copytree(eval_inputs.ckpt0, run / "checkpoints" / "last")
    (run / "config.yaml").write_text("model: {name: glm53-tiny}\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    before = snapshot(run)
    refused(capsys, eval_args(run / "checkpoints" / "last", eval_inputs.shards, run, "--overwrite"),
            f"--out {run} holds this command's input", "choose another --out")
    assert snapshot(run) == before


def test_eval_into_its_own_shards_is_refused(eval_inputs, tmp_path, capsys):
    shards = tmp_path / "S"
    shutil.copytree(eval_inputs.shards, shards)
    before = snapshot(shards)
    refused(capsys, eval_args(eval_inputs.ckpt0, shards, shards, "--overwrite"), "holds this command's input")
    assert snapshot(shards) == before


def test_compare_into_one_of_its_evals_is_refused(evaluated, tmp_path, capsys):
    a, b = tmp_path / "A", tmp_path / "B"
    shutil.copytree(evaluated.eval0, a)
    shutil.copytree(evaluated.eval1, b)
    before = snapshot(a, b)
    refused(capsys, ["compare", str(a), str(b), "--out", str(a), "--overwrite"], "holds this command's input")
    assert snapshot(a, b) == before


def prepare_args(fasta: Path, out: Path | str, *more: str) -> list[str]:
    return ["prepare", "--fasta", str(fasta), "--out", str(out), "--seq-len", "1k", "--min-len", "256",
            "--train-chroms", "chr1", *more]


def test_prepare_into_the_folder_of_its_fasta_is_refused(eval_inputs, tmp_path, capsys):
    folder = tmp_path / "in2"
    folder.mkdir()
    fasta = folder / "good.fa.gz"
    shutil.copy(eval_inputs.root / "genome.fa.gz", fasta)
    before = snapshot(folder)
    refused(capsys, prepare_args(fasta, folder, "--overwrite"), f"holds this command's input {fasta}")
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == ["good.fa.gz"]


def test_prepare_over_the_working_directory_is_refused_and_leaves_nothing(eval_inputs, tmp_path, capsys,
                                                                          monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(eval_inputs.root / "genome.fa.gz", work / "g.fa.gz")
    monkeypatch.chdir(work)
    before = snapshot(tmp_path)
    refused(capsys, prepare_args(Path("g.fa.gz"), ".", "--overwrite"), "the working directory")
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # no .partial- or .old- folder beside it


def test_report_never_replaces_a_summary(evaluated, tmp_path, capsys):
    ev = tmp_path / "E"
    shutil.copytree(evaluated.eval0, ev)
    before = snapshot(ev)
    refused(capsys, ["report", str(ev), "--out", str(ev / "summary.json")], "already exists", "--overwrite")
    refused(capsys, ["report", str(ev), "--out", str(ev / "summary.json"), "--overwrite"], "is not a report")
    refused(capsys, ["report", str(ev), "--out", str(ev)], "is a folder")
    assert snapshot(ev) == before


def test_report_replaces_a_report_with_overwrite(evaluated, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(evaluated.eval0), "--out", str(out)]) == 0
    refused(capsys, ["report", str(evaluated.eval0), "--out", str(out)], "already exists")
    assert main(["report", str(evaluated.eval0), "--out", str(out), "--overwrite"]) == 0


def test_eval_overwrites_its_own_output_and_nothing_else(eval_inputs, tmp_path, capsys):
    out = tmp_path / "ev"
    assert main(eval_args(eval_inputs.ckpt0, eval_inputs.shards, out)) == 0
    assert read_marker(out)["kind"] == "eval" and {"summary.json", "tokens.parquet"} <= set(read_marker(out)["entries"])
    refused(capsys, eval_args(eval_inputs.ckpt0, eval_inputs.shards, out), "already exists; pass --overwrite")
    assert main(eval_args(eval_inputs.ckpt1, eval_inputs.shards, out, "--overwrite")) == 0  # its own kind: replaced
    capsys.readouterr()
    (out / "notes.txt").write_text("mine")
    refused(capsys, eval_args(eval_inputs.ckpt0, eval_inputs.shards, out, "--overwrite"),
            "also holds files genome_lm did not write there (notes.txt)")
    assert (out / "notes.txt").read_text() == "mine"


def test_overwrite_refuses_other_kinds_and_unmarked_folders(evaluated, tmp_path, monkeypatch):
    with pytest.raises(GenomeLMError, match="is an eval .*not a comparison"):
        claim_output(evaluated.eval0, "compare", overwrite=True)
    with pytest.raises(GenomeLMError, match="is shards .*not an eval"):
        claim_output(evaluated.shards, "eval", overwrite=True)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    with pytest.raises(GenomeLMError, match="is not an eval .*it has no .genome_lm.json and holds other files"):
        claim_output(mine, "eval", overwrite=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    write_marker(tmp_path, "eval")
    with pytest.raises(GenomeLMError, match="your home directory"):
        claim_output(tmp_path, "eval", overwrite=True)
    (tmp_path / MARKER).unlink()


def test_train_into_shards_is_refused(tiny_shards, tmp_path, capsys):
    from tests.helpers import write_experiment

    shards = tmp_path / "S"
    shutil.copytree(tiny_shards, shards)
    before = snapshot(shards)
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards)
    refused(capsys, ["train", exp, "--out", str(shards)], f"--out {shards} is shards", "not a run directory")
    assert snapshot(shards) == before


def test_unmarked_outputs_of_the_same_kind_are_replaced_others_refused(evaluated, tmp_path):
    """An eval or comparison written before outputs carried markers holds exactly its own files: it
    counts as one; with one more file it does not."""
    old = tmp_path / "old_eval"
    shutil.copytree(evaluated.eval0, old)
    (old / MARKER).unlink()
    claim_output(old, "eval", overwrite=True)
    with pytest.raises(GenomeLMError, match="is not a comparison .*no .genome_lm.json"):
        claim_output(old, "compare", overwrite=True)
    (old / "notes.txt").write_text("x")
    with pytest.raises(GenomeLMError, match="is not an eval"):
        claim_output(old, "eval", overwrite=True)


@pytest.mark.parametrize("argv", [["synth"], ["fetch", "--chroms", "chr1"], ["prepare", "--fasta", "g.fa.gz"]])
@pytest.mark.parametrize("out,expected", [("", "--out is empty (an unset shell variable?); give the path to write"),
                                          ("~/x.fa.gz", "--out ~/x.fa.gz starts with a literal '~'")])
def test_an_empty_or_unexpanded_out_is_refused_by_every_command(tmp_path, monkeypatch, capsys, argv, out, expected):
    monkeypatch.chdir(tmp_path)
    refused(capsys, [*argv, "--out", out], expected)
    assert list(tmp_path.iterdir()) == []


def test_an_output_inside_an_input_folder_is_refused(evaluated, tmp_path, capsys):
    """eval into its own shards, compare into one of its evals: a rebuild of the input would remove it."""
    shards, ev = tmp_path / "S", tmp_path / "A"
    shutil.copytree(evaluated.shards, shards)
    shutil.copytree(evaluated.eval0, ev)
    before = snapshot(shards, ev)
    refused(capsys, eval_args(evaluated.ckpt0, shards, shards / "ev"),
            f"--out {shards / 'ev'} lies inside this command's input {shards}; write the output outside it")
    refused(capsys, ["compare", str(ev), str(evaluated.eval1), "--out", str(ev / "cmp")],
            f"--out {ev / 'cmp'} lies inside this command's input {ev}")
    refused(capsys, ["compare", f"{evaluated.eval0},{ev}", f"{evaluated.eval1},{evaluated.eval0}", "--out",
                     str(ev / "cmp")], f"--out {ev / 'cmp'} lies inside this command's input {ev}")  # a replicate
    assert snapshot(shards, ev) == before


def test_ctrl_c_while_the_command_loads_is_one_line(monkeypatch, capsys):
    import genome_lm.cli as cli

    def interrupted(*argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["plan", "glm53-tiny"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["genome-lm: interrupted"]


def test_a_literal_tilde_is_refused(tmp_path, monkeypatch):
    from genome_lm.errors import GenomeLMError
    from genome_lm.outputs import claim_output

    monkeypatch.chdir(tmp_path)
    with pytest.raises(GenomeLMError, match=r"--out ~/shards starts with a literal '~' .* write .*/shards or another"):
        claim_output("~/shards", "shards")
    assert list(tmp_path.iterdir()) == []
