"""Long runs carry on by themselves: a worker killed with kill -9, a rank that hangs, a preemption
signal to the launcher or to a worker. Every run here is compared with one uninterrupted `--nproc 2`
run of the same experiment (6 steps, a checkpoint every 2): losses within rel 1e-6 and every step in
metrics.jsonl exactly once. Faults are step callbacks (tests/faults.py) installed in this process
and handed by the launcher to its workers."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from genome_lm.cli import main
from genome_lm.errors import EXIT_PREEMPTED
from genome_lm.outputs import lock_file
from tests.faults import KillAt, SignalLauncherAt, SignalSelfAt, SleepAt, SlowWritesAfter
from tests.helpers import write_experiment

STEPS = 6


def steps_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_losses(run: Path, reference: Path) -> None:
    """Every step once, in order, with the reference run's loss (rel 1e-6)."""
    got, want = steps_of(run), steps_of(reference)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for g, w in zip(got, want):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-6, abs=0), g["step"]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, tiny_shards):
    root = tmp_path_factory.mktemp("faults")
    os.environ.setdefault("TQDM_DISABLE", "1")
    return write_experiment(root / "e.yaml", tiny_shards, micro_batch=1,
                            train={"steps": STEPS, "export_model": False},
                            parallel={"watchdog_factor": 5, "watchdog_min_s": 4})


@pytest.fixture(scope="module")
def reference(experiment, tmp_path_factory):
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert main(["train", experiment, "--out", str(out), "--nproc", "2"]) == 0
    return out


def test_killed_worker_restarts_and_finishes(experiment, reference, tmp_path, step_callbacks, capfd):
    """kill -9 of rank 1 after step 3 under --max-restarts 1: the launcher restarts both workers, which
    resume from checkpoint 2 and finish; the log says what failed where, and how many restarts are left."""
    step_callbacks(KillAt(3, rank=1))
    run = tmp_path / "run"
    assert main(["train", experiment, "--out", str(run), "--nproc", "2", "--max-restarts", "1"]) == 0
    assert_same_losses(run, reference)
    err = capfd.readouterr().err
    assert "restart 1 of 1: rank 1 on " in err and "died without an error message" in err
    assert "0 restart(s) left" in err and "resumed from" in err


def test_kill_during_the_first_async_write_restarts_from_the_start(experiment, reference, tmp_path, step_callbacks,
                                                                   capfd, caplog):
    """Rank 0 killed while the first checkpoint (step 2) is being written (every rank's writes made
    slow): no checkpoint was ever complete, so the restarted group starts afresh with a warning and
    finishes with the uninterrupted run's losses. The lock of --out, left by a process that is gone,
    is taken over by the launcher with one warning naming that process, and held for the whole launch:
    the restarted rank 0 takes over nothing."""
    run = tmp_path / "run"
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    lock_file(run).write_text(json.dumps({"command": "train", "pid": dead, "host": socket.gethostname()}))
    step_callbacks(SlowWritesAfter(1), KillAt(2, rank=0))
    assert main(["train", experiment, "--out", str(run), "--nproc", "2", "--max-restarts", "1"]) == 0
    assert_same_losses(run, reference)
    err = capfd.readouterr().err + caplog.text  # the workers' log, and the launcher's (this process)
    assert "no checkpoint in" in err and "restart 1 of 1: rank 0 on " in err
    assert [line.split("taking over the lock of ")[1] for line in err.splitlines() if "taking over the lock" in line] \
        == [f"genome-lm train (pid {dead} on {socket.gethostname()}, started ?), whose process has ended"], err[-3000:]
    assert not lock_file(run).exists()


def test_sigterm_to_the_launcher_checkpoints_and_resumes(experiment, reference, tmp_path, step_callbacks, capfd):
    """SIGTERM to the launcher after step 3: the workers agree at a step boundary, checkpoint there and
    stop; the launch exits with code 75 and one line saying how to resume; the resume has the losses
    of the uninterrupted run."""
    step_callbacks(SignalLauncherAt(3, signal.SIGTERM))
    run = tmp_path / "run"
    argv = ["train", experiment, "--out", str(run), "--nproc", "2"]
    assert main(argv) == EXIT_PREEMPTED
    err = capfd.readouterr().err
    [line] = [x for x in err.splitlines() if "preempted:" in x]
    assert "stopped on SIGTERM at step " in line and f"resume with: genome-lm train {experiment}" in line
    stopped = int(line.split(" at step ")[1].split(":")[0])
    assert 3 <= stopped < STEPS
    assert (run / "checkpoints" / "last").resolve().name == f"step_{stopped:08d}"
    assert [r["step"] for r in steps_of(run)] == list(range(1, stopped + 1))
    assert main([*argv, "--resume"]) == 0
    assert_same_losses(run, reference)


def test_preempted_worker_group_comes_back(experiment, reference, tmp_path, step_callbacks, capfd):
    """SIGUSR1 (SLURM's --signal) to one worker under --max-restarts 1: a checkpoint at the next step,
    exit 75, and the restarted group continues from it to the end."""
    step_callbacks(SignalSelfAt(2, rank=1, sig=signal.SIGUSR1))
    run = tmp_path / "run"
    assert main(["train", experiment, "--out", str(run), "--nproc", "2", "--max-restarts", "1"]) == 0
    assert_same_losses(run, reference)
    err = capfd.readouterr().err
    assert "rank1 WARNING genome_lm.train.guard: SIGUSR1 received" in err, err[-3000:]
    stopped = re.search(r"restart 1 of 1: rank \d on .*: stopped on .* at step (\d+): checkpoint \S+ is complete", err)
    assert stopped, err[-3000:]  # the preemption, not a clean first attempt, made the restart
    assert f"resumed from {run / 'checkpoints' / f'step_{int(stopped.group(1)):08d}'}" in err


def test_hung_rank_is_named_aborted_and_restarted(experiment, reference, tmp_path, step_callbacks, capfd):
    """Rank 1 sleeps for good after step 3: the watchdog (5 x the median step time, at least 4 s) aborts
    the ranks, naming rank 1 as missing from step 4, and the restart finishes the run."""
    step_callbacks(SleepAt(3, rank=1))
    run = tmp_path / "run"
    assert main(["train", experiment, "--out", str(run), "--nproc", "2", "--max-restarts", "1"]) == 0
    assert_same_losses(run, reference)
    err = capfd.readouterr().err
    assert "watchdog: step 4 has not finished" in err
    assert "missing from step 4: rank 1 on " in err and "(last finished step 3)" in err
