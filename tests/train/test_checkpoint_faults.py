"""Checkpoints of a long run: asynchronous and synchronous saves resume the same, a run killed during
an asynchronous save resumes from the checkpoint before it, a full filesystem is one clear line and
deletes nothing, and `keep` never removes the only complete checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from genome_lm.cli import main
from genome_lm.config import load_experiment
from genome_lm.errors import GenomeLMError
from genome_lm.parallel import callbacks
from genome_lm.parallel.launch import run_local
from genome_lm.train import checkpoint, train
from genome_lm.train.checkpoint import complete_checkpoint, list_checkpoints
from genome_lm.train.trainer import train_job
from tests.faults import KillAt, SlowWritesAfter
from tests.helpers import write_experiment


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, tiny_shards):
    root = tmp_path_factory.mktemp("ckpt_faults")
    return write_experiment(root / "e.yaml", tiny_shards, micro_batch=1, train={"steps": 4})


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_async_and_sync_resume_the_same(experiment, tmp_path, mode):
    """4 steps with checkpoints at 2 and 4, then the run cut back to checkpoint 2 and resumed: both modes
    give the same losses as the uninterrupted run, bit for bit; each checkpoint step records its stall,
    an async save its background write time once done."""
    cfg = load_experiment(experiment, [f"train.checkpoint_mode={mode}"])
    full = tmp_path / "full"
    train(cfg, out=full, show_progress=False)
    got = records(full)
    assert all("checkpoint_stall_s" in got[s - 1] for s in (2, 4))
    written = [r["checkpoint_written_step"] for r in got if "checkpoint_written_step" in r]
    assert written == [2, 4]
    cut = tmp_path / "cut"
    shutil.copytree(full, cut, symlinks=True)
    shutil.rmtree(cut / "checkpoints" / "step_00000004")
    (cut / "checkpoints" / "last").unlink()
    (cut / "checkpoints" / "last").symlink_to("step_00000002")
    train(cfg, out=cut, resume=True, show_progress=False)
    assert losses(cut) == losses(full)


def test_kill_during_an_async_save_resumes_from_the_previous_checkpoint(experiment, tmp_path, step_callbacks,
                                                                         one_thread_everywhere):
    """6 steps; kill -9 right after the save of step 4 started (the one worker of an elastic launch): checkpoint 4
    is left partial under its hidden name, `last` still points at step 2; --resume uses step 2 and
    ends with the losses of an uninterrupted run."""
    step_callbacks(KillAt(4, rank=0))
    run = tmp_path / "run"
    with pytest.raises(GenomeLMError, match="rank 0 failed: died without an error message"):
        run_local(train_job(load_experiment(experiment, ["train.steps=6"]), str(run)), 1)
    ckpts = run / "checkpoints"
    assert (ckpts / "last").resolve().name == "step_00000002"
    assert [p.name for _, p in list_checkpoints(ckpts)] == ["step_00000002"]
    assert list(ckpts.glob(".step_00000004.partial-*"))
    callbacks.clear()
    assert main(["train", experiment, "--out", str(run), "--resume", "--set", "train.steps=6"]) == 0
    assert not list(ckpts.glob(".step_*"))
    reference = tmp_path / "reference"
    train(load_experiment(experiment, ["train.steps=6"]), out=reference, show_progress=False)
    assert losses(run) == losses(reference)


def test_kill_during_the_first_async_write_resumes_from_the_start(experiment, tmp_path, step_callbacks, caplog,
                                                                  one_thread_everywhere):
    """kill -9 while the first checkpoint (step 2) is being written (its writes made slow): no checkpoint
    is complete and metrics.jsonl records step 2 without `checkpoint_written_step`; --resume starts
    afresh with a warning and ends with the losses of an uninterrupted run."""
    step_callbacks(SlowWritesAfter(1), KillAt(2, rank=0))
    run = tmp_path / "run"
    with pytest.raises(GenomeLMError, match="rank 0 failed: died without an error message"):
        run_local(train_job(load_experiment(experiment), str(run)), 1)
    assert [r["step"] for r in records(run)] == [1, 2] and "checkpoint_written_step" not in records(run)[1]
    assert not list_checkpoints(run / "checkpoints") and list((run / "checkpoints").glob(".step_00000002.partial-*"))
    callbacks.clear()
    assert main(["train", experiment, "--out", str(run), "--resume"]) == 0
    assert "no checkpoint in" in caplog.text and "starting a fresh run from step 0" in caplog.text
    reference = tmp_path / "reference"
    train(load_experiment(experiment), out=reference, show_progress=False)
    assert losses(run) == losses(reference)


@pytest.mark.parametrize("setting", ["skip", "stop"])
def test_a_full_filesystem_is_one_line_and_deletes_nothing(experiment, tmp_path, monkeypatch, capsys, caplog,
                                                           setting):
    """The filesystem has room for checkpoint 2 but not for 4 (free space faked): one line naming the
    step, the bytes needed and free, and the checkpoint kept; `skip` trains on to step 4 without that
    save, `stop` ends the run with exit code 2; checkpoint 2 stays either way."""
    run = tmp_path / "run"
    free = {"bytes": 10**15}
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: free["bytes"])

    def fill_disk(step, rank, attempt):
        if step == 2:
            free["bytes"] = 1000

    callbacks.install(fill_disk)
    try:
        code = main(["train", experiment, "--out", str(run), "--set", f"train.on_disk_full={setting}"])
    finally:
        callbacks.clear()
    said = capsys.readouterr().err + caplog.text  # the error (stop) or the warning (skip)
    [line] = [x for x in said.splitlines() if "checkpoint step 4 needs about" in x]
    assert "has 0.000 GB free; the newest complete checkpoint, step_00000002, is kept and nothing was deleted" in line
    ckpts = run / "checkpoints"
    assert [p.name for _, p in list_checkpoints(ckpts)] == ["step_00000002"]
    assert (ckpts / "last").resolve().name == "step_00000002"
    if setting == "skip":
        assert code == 0 and [r["step"] for r in records(run)] == [1, 2, 3, 4]
        assert records(run)[3]["checkpoint_skipped"] is True
    else:
        assert code == 2 and "stopped (train.on_disk_full: stop)" in line


def test_a_full_filesystem_before_the_first_checkpoint_says_the_run_has_none(experiment, tmp_path, monkeypatch,
                                                                             capsys, caplog):
    """No room for the first checkpoint under `stop`: the line says the run has no checkpoint yet (not
    that nothing was deleted), and the warning after it says the new run's folder was removed."""
    monkeypatch.setattr(checkpoint, "free_bytes", lambda path: 1000)
    run = tmp_path / "run"
    assert main(["train", experiment, "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint step 2 needs about" in err and "the run has no checkpoint yet" in err
    assert "nothing was deleted" not in err
    assert "removed what the run wrote" in caplog.text and not run.exists()


def test_keep_never_deletes_the_only_complete_checkpoint(tmp_path):
    """keep 1 removes older checkpoints, never the one just completed, also when it replaces a
    checkpoint of the same step."""
    ckpts = tmp_path / "checkpoints"
    for step in (2, 4):
        tmp = ckpts / f".step_{step:08d}.partial-x"
        (tmp / "train_state").mkdir(parents=True)
        complete_checkpoint(ckpts, tmp, ckpts / f"step_{step:08d}", step, {}, keep=1)
    assert [p.name for _, p in list_checkpoints(ckpts)] == ["step_00000004"]
    tmp = ckpts / ".step_00000004.partial-y"
    (tmp / "train_state").mkdir(parents=True)
    complete_checkpoint(ckpts, tmp, ckpts / "step_00000004", 4, {}, keep=0)
    assert [p.name for _, p in list_checkpoints(ckpts)] == ["step_00000004"]
    assert (ckpts / "last").resolve().name == "step_00000004"
