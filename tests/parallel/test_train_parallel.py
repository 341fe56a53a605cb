"""`genome-lm train --nproc N`: FSDP2 data parallel equals one process; DCP checkpoints resume on
another number of processes (1, and 4 laid out as cp 2 x dp 2) with the same losses.

Global batch 2 sequences per step throughout: 2 processes x micro_batch 1 (dp 2), 1 process x
micro_batch 2, 4 processes = dp 2 x cp 2 x micro_batch 1. All pieces are 64 tokens (no padding).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from genome_lm.cli import main
from genome_lm.config import load_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.parallel import callbacks
from genome_lm.train import train
from tests.faults import KillAt
from tests.helpers import write_experiment
from tests.train.test_export import same_files

TOL = dict(rel=1e-5, abs=1e-6)


def records(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def truncate_to(src: Path, dst: Path, step: int) -> Path:
    """A copy of run `src` as if it had stopped right after checkpoint `step`."""
    shutil.copytree(src, dst, symlinks=True)
    for ckpt in (dst / "checkpoints").glob("step_*"):
        if int(ckpt.name.split("_")[1]) > step:
            shutil.rmtree(ckpt)
    (dst / "checkpoints" / "last").unlink()
    (dst / "checkpoints" / "last").symlink_to(f"step_{step:08d}")
    return dst


def assert_same_curve(got: dict[int, dict], want: dict[int, dict], steps) -> None:
    for s in steps:
        assert got[s]["loss"] == pytest.approx(want[s]["loss"], **TOL), s
        assert got[s]["grad_norm"] == pytest.approx(want[s]["grad_norm"], rel=1e-4), s


@pytest.fixture(scope="module")
def dp2_run(tmp_path_factory, tiny_shards):
    """4 steps on 2 processes (FSDP2 over dp=2), checkpoints at 2 and 4; expert-bias balancing on,
    so the step loads must be summed over the ranks for the run to equal one process."""
    root = tmp_path_factory.mktemp("dp2")
    exp = write_experiment(root / "e.yaml", tiny_shards, micro_batch=1, train={"moe_bias_update_rate": 0.05})
    os.environ.setdefault("TQDM_DISABLE", "1")
    assert main(["train", exp, "--out", str(root / "run"), "--nproc", "2"]) == 0
    return exp, root / "run"


def test_fsdp_dp2_matches_one_process(dp2_run, tmp_path):
    exp, run = dp2_run
    one = tmp_path / "one"
    train(load_experiment(exp, ["train.micro_batch=2"]), out=one)
    assert_same_curve(records(run), records(one), range(1, 5))
    got = records(run)[4]
    assert got["world_size"] == 2 and got["tokens"] == 128 and got["moe_bias_max_abs"] > 0
    # same kinds of outputs as a one-process run; the weights gathered on rank 0 load upstream
    assert (run / "config.yaml").exists()
    last = run / "checkpoints" / "last"
    assert last.resolve().name == "step_00000004"
    assert sorted(p.name for p in (last / "train_state").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    from transformers.models.glm5_next import Glm5NextTextModel

    Glm5NextTextModel.from_pretrained(str(last / "model"))
    meta = json.loads((last / "genome_lm.json").read_text())
    assert (meta["world_size"], meta["dp"], meta["cp"]) == (2, 2, 1)


def test_export_of_sharded_checkpoint_equals_its_model_dir(dp2_run, tmp_path):
    """`genome-lm export` of the 2-rank DCP train_state writes the same files the ranks streamed."""
    _, run = dp2_run
    last = run / "checkpoints" / "last"
    assert main(["export", str(last), "--out", str(tmp_path / "m")]) == 0
    same_files(tmp_path / "m", last / "model")


@pytest.mark.parametrize("ep", [1, 2])
def test_init_from_checkpoint_dp2_matches_one_process(dp2_run, tmp_path, ep):
    """model.init under --nproc 2: built on the meta device, each rank reads its rows of the
    checkpoint's safetensors (with ep 2: only its own experts); the run equals one process
    initialised from the same directory."""
    exp, run = dp2_run
    init = [f"model.init={run / 'checkpoints' / 'step_00000002'}", "train.steps=2", "train.export_model=false"]
    sets = [arg for o in [*init, f"parallel.ep={ep}"] for arg in ("--set", o)]
    assert main(["train", exp, "--out", str(tmp_path / "two"), "--nproc", "2", *sets]) == 0
    train(load_experiment(exp, ["train.micro_batch=2", *init]), out=tmp_path / "one")
    assert_same_curve(records(tmp_path / "two"), records(tmp_path / "one"), range(1, 3))
    assert records(tmp_path / "two")[1]["loss"] < records(run)[1]["loss"]  # it did start from the trained weights


def test_ep2_matches_one_process_and_resumes_on_ep1(dp2_run, tmp_path, monkeypatch):
    """parallel.ep=2 on 2 processes: the routed experts split over the ranks, tokens sent to
    them by all-to-all; the curve equals dp 2 (which equals one process). Its checkpoint holds
    the experts at their global shape, so it resumes on one process (ep 1). The launch leaves
    nothing in the temporary directory."""
    exp, run = dp2_run
    ep = tmp_path / "ep"
    (tmp := tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert main(["train", exp, "--out", str(ep), "--nproc", "2", "--set", "parallel.ep=2"]) == 0
    assert list(tmp.iterdir()) == []
    assert_same_curve(records(ep), records(run), range(1, 5))
    assert all(records(ep)[s]["ep_rank_imbalance"] >= 1 for s in range(1, 5))
    assert json.loads((ep / "checkpoints" / "last" / "genome_lm.json").read_text())["ep"] == 2
    resumed = truncate_to(ep, tmp_path / "resumed", 2)
    train(load_experiment(exp, ["train.micro_batch=2"]), out=resumed, resume=True)
    assert_same_curve(records(resumed), records(run), range(1, 5))


def test_dcp_resume_on_one_process(dp2_run, tmp_path):
    exp, run = dp2_run
    resumed = truncate_to(run, tmp_path / "resumed", 2)
    train(load_experiment(exp, ["train.micro_batch=2"]), out=resumed, resume=True)
    assert_same_curve(records(resumed), records(run), range(1, 5))


@pytest.mark.slow
def test_dcp_resume_on_four_processes_with_cp(dp2_run, tmp_path):
    exp, run = dp2_run
    resumed = truncate_to(run, tmp_path / "resumed", 2)
    assert main(["train", exp, "--out", str(resumed), "--nproc", "4", "--set", "parallel.cp=2", "--resume"]) == 0
    assert_same_curve(records(resumed), records(run), range(1, 5))
    assert records(resumed)[4]["world_size"] == 4


@pytest.mark.slow
def test_ray_train_two_cpu_workers_fail_and_resume(dp2_run, tmp_path, step_callbacks):
    """Ray Train, 2 CPU workers on a local Ray instance: a worker dies after step 3 -> one-line
    error, checkpoint 2 kept; --resume finishes with the losses of the --nproc run."""
    import ray  # a dependency of genome_lm (--ray): missing, it is a failure, not a skip
    exp, run = dp2_run
    out = tmp_path / "ray_run"
    step_callbacks(KillAt(3, rank=1))
    try:
        with pytest.raises(GenomeLMError, match=r"--ray: rank 1 failed: died without an error message.*--resume"):
            _run_cli(["train", exp, "--out", str(out), "--ray", "--nproc", "2"])
        assert (out / "checkpoints" / "last").resolve().name == "step_00000002"
        callbacks.clear()
        assert main(["train", exp, "--out", str(out), "--ray", "--nproc", "2", "--resume"]) == 0
    finally:
        ray.shutdown()
    assert_same_curve(records(out), records(run), range(1, 5))
    for path in ("config.yaml", "metrics.jsonl", "checkpoints/last/model/model.safetensors",
                 "checkpoints/last/train_state/.metadata", "checkpoints/last/genome_lm.json"):
        assert (out / path).exists(), path


def _run_cli(argv: list[str]) -> None:
    """Call the CLI's train command and let its GenomeLMError through (main() would print it)."""
    from genome_lm.cli import build_parser

    args = build_parser().parse_args(argv)
    args.func(args)


@pytest.mark.ray_faults
def test_ray_train_worker_killed_restarts_and_finishes(dp2_run, tmp_path, step_callbacks):
    """Ray Train, 2 CPU workers: kill -9 of rank 1 after step 3 with --max-restarts 1: Ray restarts the
    worker group, which resumes from checkpoint 2 and finishes with the losses of the --nproc run."""
    import ray  # a dependency of genome_lm (--ray): missing, it is a failure, not a skip
    exp, run = dp2_run
    out = tmp_path / "ray_run"
    step_callbacks(KillAt(3, rank=1))
    try:
        assert main(["train", exp, "--out", str(out), "--ray", "--nproc", "2", "--max-restarts", "1"]) == 0
    finally:
        ray.shutdown()
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert_same_curve(records(out), records(run), range(1, 5))
