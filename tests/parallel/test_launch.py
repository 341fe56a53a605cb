"""Launch options and layouts: one-line errors for what users can get wrong, dry-run shapes, and a
crashed worker of a `--nproc` launch."""

from __future__ import annotations

from pathlib import Path

import pytest

from genome_lm.cli import build_parser, main
from genome_lm.errors import GenomeLMError
from genome_lm.parallel import callbacks
from genome_lm.parallel.mesh import resolve_layout
from tests.faults import KillAt
from tests.helpers import write_experiment

ROOT = Path(__file__).resolve().parents[2]


def run_train(argv: list[str]) -> None:
    args = build_parser().parse_args(["train", *argv])
    args.func(args)


def test_resolve_layout():
    assert resolve_layout(8, "auto", 64) == (8, 8)
    assert resolve_layout(1, "auto", 2) == (2, 1)
    assert resolve_layout(2, 2, 4) == (2, 2)
    with pytest.raises(GenomeLMError, match="parallel.cp=8 needs at least 8 processes"):
        resolve_layout(8, "auto", 4)
    with pytest.raises(GenomeLMError, match="parallel.cp=4 does not divide the 6 processes"):
        resolve_layout(4, "auto", 6)
    with pytest.raises(GenomeLMError, match=r"parallel.dp=8 x parallel.cp=8 = 64 processes, but this launch has 8"):
        resolve_layout(8, 8, 8)


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "0"], "--nproc: must be >= 1 (got '0')"),
    (["--nproc", "two"], "--nproc: expected an integer (got 'two')"),
    (["--nproc", "3", "--set", "parallel.cp=2"], "parallel.cp=2 does not divide the 3 processes"),
    (["--nproc", "4", "--set", "parallel.dp=4", "--set", "parallel.cp=2"], "parallel.dp=4 x parallel.cp=2 = 8"),
    (["--set", "parallel.cp=2"], "parallel.cp=2 needs at least 2 processes"),
    (["--ray", "127.0.0.1:1", "--nproc", "2"], "--ray 127.0.0.1:1: cannot reach a Ray cluster there"),
])
def test_user_errors_are_one_line(tmp_path, tiny_shards, argv, message):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, micro_batch=1)
    with pytest.raises(GenomeLMError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        run_train([exp, "--out", str(tmp_path / "run"), *argv])
    assert "\n" not in str(err.value)


def test_dry_run_prints_per_rank_shapes(full_shards, capsys):
    exp = str(ROOT / "experiments" / "glm53flash_1m_64xb200.yaml")
    assert main(["train", exp, "--dry-run", "--set", f"data.shards={full_shards}"]) == 0
    out = capsys.readouterr().out
    assert "layout: 64 ranks = dp 8 x cp 8; global batch 8 sequences per step" in out
    assert "CP slabs per sequence: 131,072 tokens x 8" in out
    assert "per rank: input_ids [1, 131,072]" in out
    assert "FSDP2 over 64 ranks" in out
    assert "built on the meta device, sharded, then each of the 64 ranks reads only its rows" in out
    assert "model/ (Hugging Face weights, streamed one tensor at a time) at the last checkpoint only" in out
    # the same experiment on one 8-GPU node: dp 1, and a wrong count is refused
    assert main(["train", exp, "--dry-run", "--set", f"data.shards={full_shards}", "--set", "parallel.dp=auto",
                 "--nproc", "8"]) == 0
    assert "layout: 8 ranks = dp 1 x cp 8" in capsys.readouterr().out
    assert main(["train", exp, "--dry-run", "--set", f"data.shards={full_shards}", "--nproc", "12"]) == 2


@pytest.mark.slow
def test_crashed_worker_is_one_line_error_and_run_resumes(tmp_path, tiny_shards, monkeypatch, step_callbacks):
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, micro_batch=1, train={"steps": 3, "checkpoint_every": 1,
                                                                                    "checkpoint_mode": "sync"})
    run = tmp_path / "run"
    step_callbacks(KillAt(2, rank=1))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    with pytest.raises(GenomeLMError, match=r"--nproc 2: rank 1 failed: died without an error message.*--resume"):
        run_train([exp, "--out", str(run), "--nproc", "2"])
    assert (run / "checkpoints" / "last").resolve().name == "step_00000002"
    callbacks.clear()
    assert main(["train", exp, "--out", str(run), "--nproc", "2", "--resume"]) == 0
    assert (run / "checkpoints" / "last").resolve().name == "step_00000003"


def test_dry_run_checks_the_layout_the_run_checks(tiny_shards, tmp_path, capsys):
    """ep=3 does not divide glm53-tiny's 8 routed experts: the dry run refuses it as the run does; with
    dp auto and no --nproc it says which layout it checked, and the planner line follows."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards)
    assert main(["train", exp, "--dry-run", "--nproc", "3", "--set", "parallel.ep=3"]) == 2
    assert "parallel.ep=3 does not divide the 8 routed experts" in capsys.readouterr().err
    assert main(["train", exp, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "checked on 1 process (no --nproc: dp auto taken as 1; pass --nproc N" in out
    assert "dry run OK" in out and out.strip().splitlines()[-1].startswith("planner (1 x ")
