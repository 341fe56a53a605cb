"""Faults the tests inject into training and eval workers, as step callbacks
(`genome_lm.parallel.callbacks`, installed through the `step_callbacks` fixture of tests/conftest.py; a
launch hands them to its workers). Each acts in the first attempt of a launch only, so a restarted
worker group runs clean."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class KillAt:
    """Rank `rank` kills itself with SIGKILL (kill -9) right after step `step` (its checkpoint, if
    any, started)."""

    step: int
    rank: int = 1

    def __call__(self, step: int, rank: int, attempt: int) -> None:
        if attempt == 0 and step == self.step and rank == self.rank:
            sys.stderr.write(f"tests.faults: rank {rank} kills itself after step {step}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class SleepAt:
    """Rank `rank` sleeps for good after step `step`, as a rank stuck in I/O or on a dead link would."""

    step: int
    rank: int = 1

    def __call__(self, step: int, rank: int, attempt: int) -> None:
        if attempt == 0 and step == self.step and rank == self.rank:
            while True:
                time.sleep(60)


@dataclass(frozen=True)
class SignalLauncherAt:
    """Rank 0 sends `sig` to the launcher (its parent process) after step `step`, as a scheduler's
    preemption would."""

    step: int
    sig: int = signal.SIGTERM

    def __call__(self, step: int, rank: int, attempt: int) -> None:
        if attempt == 0 and step == self.step and rank == 0:
            os.kill(os.getppid(), self.sig)


@dataclass(frozen=True)
class SignalSelfAt:
    """Rank `rank` gets `sig` after step `step`, as a worker a scheduler preempts directly would."""

    step: int
    rank: int = 1
    sig: int = signal.SIGTERM

    def __call__(self, step: int, rank: int, attempt: int) -> None:
        if attempt == 0 and step == self.step and rank == self.rank:
            os.kill(os.getpid(), self.sig)


@dataclass(frozen=True)
class SlowWritesAfter:
    """After step `step`, every checkpoint write of this process sleeps `seconds` before it writes a
    byte (DCP's `FileSystemWriter.write_data`, which an asynchronous save runs in its background
    thread), as a slow filesystem would: a kill right after the next save started lands inside its write."""

    step: int
    seconds: float = 120

    def __call__(self, step: int, rank: int, attempt: int) -> None:
        if attempt == 0 and step == self.step:
            from torch.distributed.checkpoint import FileSystemWriter

            write, seconds = FileSystemWriter.write_data, self.seconds

            def slow(writer, plan, planner):
                time.sleep(seconds)
                return write(writer, plan, planner)

            FileSystemWriter.write_data = slow  # type: ignore[method-assign]
