"""Progress of long work: a tqdm bar on a terminal; elsewhere (a log file, SLURM's output) a log line a minute and at
the end, its estimate the rate so far in this process (work resumed from a cache or checkpoint is not time spent),
e.g. `train demo_base: 120/600 step (20%), 1.5 min so far, about 6.0 min left; loss 1.2748`."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import TypeAlias

from tqdm import tqdm

log = logging.getLogger("genome_lm.progress")


def minutes(seconds: float) -> str:
    """'42 s', '3.2 min' or '1.4 h'."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class ProgressLog(contextlib.AbstractContextManager):
    """tqdm's `update` / `set_postfix` / `close` as log lines, at most one per `every_s` seconds."""

    def __init__(self, total: int, initial: int = 0, desc: str = "", unit: str = "it", every_s: float = 60.0,
                 clock=time.monotonic):
        self.total, self.n, self.start_n, self.desc, self.unit = total, initial, initial, desc, unit
        self.every_s, self.clock = every_s, clock
        self.t0 = self.last = clock()
        self.postfix, self.closed = "", False

    def line(self) -> str:
        elapsed = self.clock() - self.t0
        done = self.n - self.start_n
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        ahead = done > 0 and self.total and self.n < self.total
        left = f", about {minutes(elapsed / done * (self.total - self.n))} left" if ahead else ""
        post = f"; {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {self.n:,}/{self.total:,} {self.unit}{pct}, {minutes(elapsed)} so far{left}{post}"

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n < self.total and self.clock() - self.last >= self.every_s:  # the last line: at close
            self.last = self.clock()
            log.info(self.line())

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def close(self) -> None:
        if not self.closed and self.n > self.start_n:
            log.info(self.line())
        self.closed = True

    def __exit__(self, *exc) -> None:
        self.close()


Bar: TypeAlias = "tqdm | ProgressLog"


def progress(total: int, initial: int = 0, desc: str = "", unit: str = "it", disable: bool = False, **kwargs) -> Bar:
    """A tqdm bar (with tqdm's `kwargs`) when stderr is a terminal, else a `ProgressLog`; nothing when `disable`."""
    if disable or sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, **kwargs)
    return ProgressLog(total, initial, desc, unit)
