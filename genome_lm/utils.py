"""Small shared helpers: size parsing, atomic writes, hashing, float32 matmul precision."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

from genome_lm.errors import GenomeLMError

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgG]?)\s*$")
_SIZE_MULT = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def parse_size(value: str | int, what: str = "size") -> int:
    """Parse a token count: '512k' -> 524288 (2^19), '1M' -> 1048576 (2^20), '4096' -> 4096."""
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise GenomeLMError(f"{what}: cannot read {value!r} as a size; "
                            "use an integer or a suffix k/M/G (e.g. 512k, 1M)")
    return int(m.group(1)) * _SIZE_MULT[m.group(2).lower()]


def format_size(n: int) -> str:
    """Inverse of parse_size for exact powers: 524288 -> '512k'."""
    for suffix, mult in (("G", 2**30), ("M", 2**20), ("k", 2**10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def _umask() -> int:
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
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
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
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary name beside `final`; rename it into place on success.

    On any exception (or KeyboardInterrupt) the temporary directory is removed, so nothing that
    looks complete is ever left at `final`. With `overwrite`, an existing `final` is replaced only
    after the new one is complete.
    """
    final = Path(final)
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = make_temp_dir(parent, f".{final.name}.partial-")
    except OSError as e:
        raise GenomeLMError(f"cannot create output directory {final}: {e.strerror}; "
                            "choose a writable location with --out") from None
    try:
        yield tmp
        if final.exists():
            if not overwrite:
                raise GenomeLMError(f"{final} already exists; pass --overwrite to replace it")
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=parent))
            os.replace(final, old / "x")
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def set_tf32(enabled: bool) -> None:
    """TF32 tensor cores for float32 matmuls and convolutions on CUDA (torch's float32 matmul
    precision 'high'), or full float32 ('highest'). No effect on CPU arithmetic."""
    import torch

    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
