"""Files written whole or not at all, and their hashes: `atomic_file` (a temporary name beside the
target, renamed when complete), `write_json_atomic`, `atomic_directory` (an output folder built
under a temporary name, marked with its kind, renamed into place), `make_temp_dir`, `umask`,
`sha256_file`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterable, Iterator

from genome_lm.errors import GenomeLMError
from genome_lm.outputs import COMMANDS, claim_output, holding, write_marker


def umask() -> int:
    """The process's file-mode creation mask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: str | os.PathLike, bufsize: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        buf = bytearray(bufsize)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", **open_kwargs) -> Iterator[IO]:
    """Open a temporary file `.NAME.*.tmp` beside `path` for writing; when the block ends without
    an error, give it the permissions a plain open would and rename it to `path` (readers never
    see half a file). On any exception the temporary file is removed and `path` is untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, obj, indent: int = 2) -> None:
    """Write JSON to a temporary name beside `path`, then rename: readers never see half a file."""
    with atomic_file(path) as f:
        json.dump(obj, f, indent=indent, sort_keys=False)
        f.write("\n")


def make_temp_dir(parent: str | os.PathLike, prefix: str) -> Path:
    """A new hidden work directory in `parent`, with the permissions a plain mkdir would give
    (mkdtemp makes 0700), so that renaming it into place yields a normal directory."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, kind: str, inputs: Iterable[str | os.PathLike] = (),
                     overwrite: bool = False) -> Iterator[Path]:
    """Build output folder `final` of `kind` (`outputs.KINDS`) under a temporary name beside it;
    mark it as that kind's output and rename it into place on success. The output's lock is held
    throughout (`outputs.holding`), and the work folders of a writer that is gone are removed first.

    `outputs.claim_output` checks `final` first (an existing one needs `overwrite` and must be an
    output of the same kind that holds none of `inputs`) and again before the rename. On any
    exception (or KeyboardInterrupt) the temporary directory is removed, so nothing that looks
    complete is ever left at `final`; an existing `final` is replaced only after the new one is
    complete.
    """
    inputs = [Path(i) for i in inputs]
    final = Path(final)
    with holding(final, COMMANDS[kind]):
        claim_output(final, kind, inputs, overwrite)
        final = final.resolve() if final.is_symlink() else final  # a symlinked --out: its target is written
        parent = final.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            for stale in [*parent.glob(f".{final.name}.partial-*"), *parent.glob(f".{final.name}.old-*")]:
                shutil.rmtree(stale, ignore_errors=True)  # a killed writer's: the lock says none is running
            tmp = make_temp_dir(parent, f".{final.name}.partial-")
        except OSError as e:
            raise GenomeLMError(f"cannot create output directory {final}: {e.strerror}; "
                                "choose a writable location with --out") from None
        try:
            yield tmp
            write_marker(tmp, kind, inputs)
            claim_output(final, kind, inputs, overwrite)
            if final.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=parent))
                os.replace(final, old / "x")
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
