"""Step callbacks `fn(step, rank, attempt)`, called after every optimizer step (and eval's scoring
round) for code outside the package to watch or disturb a run (tests/faults.py's fault injectors).
A launch hands the installed ones to every worker, pickled by reference: module-level functions or
instances of module-level classes. Nothing is installed unless someone calls `install`."""

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
    for fn in _INSTALLED:
        fn(step, rank, attempt)
