"""The one error type for problems a user can cause: the CLI prints it on one line and exits non-zero."""

import errno


class GenomeLMError(Exception):
    """A user-facing error: `str(err)` is a complete, one-line explanation with a fix."""


EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on a preemption signal after a checkpoint; --resume continues


class Preempted(Exception):
    """Not an error: a run stopped on a preemption signal after saving a checkpoint. `str` says where
    it stopped; the CLI adds the command that resumes it and exits with EXIT_PREEMPTED."""


def first_line(e: BaseException) -> str:
    """The first line of `e`'s message (at most 200 characters; its type when it has none)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]

# storage failures the CLI reports in one line (cli.storage_message); outputs re-raise them as they are
STORAGE_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                  errno.EPERM: "operation not permitted"}
