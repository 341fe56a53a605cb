"""The one error type for problems a user can cause: the CLI prints it on one line and exits non-zero.
Also `lazy_names`, the packages' names imported on first use (errors is below every layer)."""

import errno
from collections.abc import Callable
from importlib import import_module
from typing import Any


class GenomeLMError(Exception):
    """A user-facing error: `str(err)` is a complete, one-line explanation with a fix."""


EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on a preemption signal after a checkpoint; --resume continues


class Preempted(Exception):
    """Not an error: a run stopped on a preemption signal after a checkpoint (the CLI prints how to resume it)."""


def first_line(e: BaseException) -> str:
    """The first line of `e`'s message (at most 200 characters; its type when it has none)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]

# storage failures the CLI reports in one line (cli.storage_message); outputs re-raise them as they are
STORAGE_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                  errno.EPERM: "operation not permitted"}


def lazy_names(package: str, homes: dict[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """`__all__` and `__getattr__` of `package`, whose names (module -> "name name ...") are imported on first use."""
    home = {name: module for module, names in homes.items() for name in names.split()}

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{home[name]}"), name)

    return sorted(home), __getattr__
