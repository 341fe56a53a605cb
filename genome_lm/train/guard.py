"""What keeps a long run going (docs/long-runs.md): a checkpoint on a preemption signal (exit EXIT_PREEMPTED, 75),
and a watchdog that aborts a step that hangs (exit EXIT_HUNG, 76) so that the launcher's restarts take over."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import statistics
import sys
import threading
import time
from typing import Sequence

import torch.distributed as dist

from genome_lm.parallel.launch import WorkerContext

log = logging.getLogger(__name__)

EXIT_HUNG = 76  # the watchdog aborted a step that did not finish in time


class Preemption:
    """A flag set on `signals` ("SIGTERM", ...), or the launcher's stop file: `requested`. Handlers only in the
    main thread (Ray Train's workers read the stop file)."""

    def __init__(self, signals: Sequence[str], worker: WorkerContext):
        self.received: str | None = None
        self.worker = worker
        self._old: dict = {}  # signal -> the handler it had
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._on_signal) for sig in (getattr(signal, n) for n in signals)}

    def _on_signal(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        log.warning("%s received: checkpoint at the end of this step, then stop", self.received)

    def requested(self) -> str | None:
        """Why this rank wants to stop: a signal's name, "the launcher", or None."""
        launcher = self.worker.stop_file is not None and self.worker.stop_file.exists()
        return self.received or ("a stop request of the launcher" if launcher else None)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


class Watchdog:
    """Aborts this process (exit EXIT_HUNG) when a step has not finished within `factor` x the median step
    time (at least `min_s`) after the previous one, naming the ranks that have not begun it and those inside
    it (from the process group's store). Armed after two steps; `paused()` while a checkpoint is written."""

    def __init__(self, par, factor: float, min_s: float, worker: WorkerContext):
        self.par, self.factor, self.min_s, self.worker = par, factor, min_s, worker
        self.prefix = f"genome_lm/watchdog/{worker.attempt}"
        self.times: list[float] = []
        self.step, self.last_end, self.pause_depth = 0, time.monotonic(), 0
        self._stop = threading.Event()
        self.watching = par.distributed and factor > 0  # idle: one process, or parallel.watchdog_factor 0
        if self.watching:
            self.store = dist.distributed_c10d._get_default_store()
            for what, value in (("host", socket.gethostname()), ("begun", "0"), ("done", "0")):
                self._set(what, value)
            threading.Thread(target=self._run, name="genome_lm-watchdog", daemon=True).start()

    def _set(self, what: str, value: str) -> None:
        if self.watching:
            self.store.set(f"{self.prefix}/{what}/{self.par.rank}", value)

    def _get(self, what: str, rank: int) -> str | None:
        key = f"{self.prefix}/{what}/{rank}"
        return self.store.get(key).decode() if self.store.check([key]) else None

    def begin(self, step: int) -> None:
        self.step = step
        self._set("begun", str(step))

    def end(self, step: int, seconds: float) -> None:
        self._set("done", str(step))
        self.times.append(seconds)
        self.last_end = time.monotonic()

    @contextlib.contextmanager
    def paused(self):
        self.pause_depth += 1
        try:
            yield
        finally:
            self.pause_depth -= 1
            self.last_end = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            waited = time.monotonic() - self.last_end
            if len(self.times) < 2 or self.pause_depth:
                continue
            limit = max(self.min_s, self.factor * statistics.median(self.times))
            if waited > limit:
                log.error("%s", message := self.describe(waited, limit))
                self.worker.record_failure(message)
                sys.stderr.flush()
                sys.stdout.flush()
                os._exit(EXIT_HUNG)

    def describe(self, waited: float, limit: float) -> str:
        step = max(self.step, int(self._get("done", self.par.rank) or 0) + 1)
        head = (f"watchdog: step {step} has not finished on rank {self.par.rank} after {waited:.1f} s "
                f"(limit {limit:.1f} s = max({self.min_s:g} s, {self.factor:g} x the median step time "
                f"{statistics.median(self.times):.2f} s))")
        missing, inside = [], []
        for r in range(self.par.world):
            begun, done = int(self._get("begun", r) or 0), int(self._get("done", r) or 0)
            where = f"rank {r} on {self._get('host', r) or '?'} (last finished step {done})"
            if begun < step:
                missing.append(where)
            elif done < step:
                inside.append(where)
        parts = [f"missing from step {step}: {', '.join(missing)}"] if missing else []
        if inside:
            parts.append(f"inside step {step} (waiting, or stuck in a collective or device): {', '.join(inside)}")
        return f"{head}; {'; '.join(parts)}; aborting so the launcher restarts the run from its newest checkpoint"

    def close(self) -> None:
        self._stop.set()

