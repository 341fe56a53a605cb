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


def install(*fns: StepCallback) -> None:
    _INSTALLED.extend(fns)


def clear() -> None:
    _INSTALLED.clear()


def installed() -> tuple[StepCallback, ...]:
    return tuple(_INSTALLED)


def after_step(step: int, rank: int, attempt: int) -> None:
    """Call every installed callback with (step, rank, attempt): the attempt of the worker's launch
    (its `launch.WorkerContext`)."""
    for fn in _INSTALLED:
        fn(step, rank, attempt)
