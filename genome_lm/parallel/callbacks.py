"""Step callbacks: functions the training loop calls after every optimizer step (and eval after every
scoring round), for code outside the package to watch or disturb a run.

    from genome_lm.parallel import callbacks
    callbacks.install(fn)          # fn(step, rank, attempt): step done (its checkpoint started), this
                                   # process's rank, the launch's attempt (0, then 1 after a restart)
    ...
    callbacks.clear()

Nothing is installed unless someone calls `install`: a production run calls no callback. A launch
(`genome_lm.parallel.launch`) hands the callbacks installed in the launching process to every
worker, pickled by reference, so a callback must be a module-level function or an instance of a
module-level class. The test suite installs its fault injectors (tests/faults.py: a worker that dies,
hangs or gets a signal at a given step) through the `step_callbacks` fixture of tests/conftest.py.
"""

from __future__ import annotations

from typing import Callable

StepCallback = Callable[[int, int, int], None]
_INSTALLED: list[StepCallback] = []
_ATTEMPT = [0, 0]  # this process's attempt of its launch and the launch's restarts (set by its worker entry)


def install(*fns: StepCallback) -> None:
    _INSTALLED.extend(fns)


def clear() -> None:
    _INSTALLED.clear()


def installed() -> tuple[StepCallback, ...]:
    return tuple(_INSTALLED)


def set_attempt(attempt: int, max_restarts: int = 0) -> None:
    _ATTEMPT[:] = [attempt, max_restarts]


def attempt() -> int:
    """The attempt of this process's launch: 0 for the first start, k after k restarts."""
    return _ATTEMPT[0]


def restarts_left() -> int:
    """How many more times the launcher will restart this worker's group after a failure."""
    return max(0, _ATTEMPT[1] - _ATTEMPT[0])


def after_step(step: int, rank: int) -> None:
    """Call every installed callback with (step, rank, attempt)."""
    for fn in _INSTALLED:
        fn(step, rank, _ATTEMPT[0])
