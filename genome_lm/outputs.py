"""Output folders a command owns (docs/refusals.md): it writes only into an output it made, and
`--overwrite` replaces only such an output, made by the same kind of command. Each holds a marker,
`.genome_lm.json`: `{"kind": "eval", "entries": [...], "inputs": ["/abs/ckpt", ...]}`. One writer per
output: an `fcntl.flock` on `PARENT/.NAME.lock`, held until the command ends (a launch's workers work
under their launcher's, `HOLDER_ENV`). Files and folders are written under a temporary name beside the
target and renamed when complete (`atomic_file`, `atomic_directory`)."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from genome_lm.errors import STORAGE_ERRORS, GenomeLMError

log = logging.getLogger(__name__)
MARKER = ".genome_lm.json"
HOLDER_ENV = "GENOME_LM_OUTPUT_HOLDER"  # "host:pid" of the process holding the locks a launch's workers use
COMMANDS = {"shards": "prepare", "eval": "eval", "compare": "compare", "model": "export", "run": "train",
            "score": "score", "variants": "variants"}
_HELD: dict[Path, int] = {}  # lock file -> its open descriptor, for the outputs this process holds
os.register_at_fork(after_in_child=_HELD.clear)  # a forked child holds none of its parent's locks
KINDS = {kind: f"{what} (genome-lm {COMMANDS[kind]}{more})" for kind, what, more in [  # for refusals
    ("shards", "shards", ""), ("eval", "an eval", ""), ("compare", "a comparison", ""),
    ("model", "a model directory", ", or a run's checkpoint"), ("run", "a run directory", ""),
    ("score", "a score", ""), ("variants", "variant scores", "")]}


# The files that identify an unmarked output of each kind, and the names such an output may hold.
SIGNATURES = {
    "shards": ({"manifest.json"}, {"manifest.json", "train", "eval", "megatron"}),
    "eval": ({"summary.json", "tokens.parquet"}, {"summary.json", "tokens.parquet", "context_ablation.parquet",
                                                  "parity.json"}),
    "compare": ({"compare.json"}, {"compare.json"}),
}


def read_marker(folder: Path) -> dict | None:
    """The marker of `folder`, or None when it has none (or an unreadable one)."""
    try:
        marker = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("kind") in KINDS else None


def write_marker(folder: Path, kind: str, inputs: Iterable[str | os.PathLike] = (), **extra) -> None:
    """Mark `folder` as an output of `kind` holding what is in it now, with `extra` fields."""
    entries = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    marker = {"kind": kind, "entries": entries, "inputs": [str(Path(i).resolve()) for i in inputs], **extra}
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n")


def what_it_is(path: Path) -> str:
    """A few words for what `path` holds, for refusals."""
    if not path.is_dir():
        return "a file"
    if (marker := read_marker(path)) is not None:
        return KINDS[marker["kind"]]
    if (path / "manifest.json").is_file():
        return KINDS["shards"]
    if (path / "checkpoints").is_dir() or (path / "config.yaml").is_file():
        return KINDS["run"]
    if (path / "summary.json").is_file():
        return "an eval or comparison"
    return "a folder genome_lm did not make"


def check_out_path(out: str | os.PathLike, option: str = "--out") -> Path:
    """`out` as a Path; GenomeLMError for an empty path (an unset shell variable) or a literal '~'."""
    if not str(out).strip():
        raise GenomeLMError(f"{option} is empty (an unset shell variable?); give the path to write")
    out = Path(out)
    if out.parts and out.parts[0] == "~":
        raise GenomeLMError(f"{option} {out} starts with a literal '~' (the shell expands ~ only when it is not "
                            f"quoted): write {Path.home() / Path(*out.parts[1:])} or another path")
    return out


def lock_file(out: str | os.PathLike, inside: bool = False) -> Path:
    """`.NAME.lock` beside output `out` (its symlink's target), or `.genome_lm.lock` inside it (`inside`:
    a folder that is written into, never replaced)."""
    target = Path(out).resolve()
    return target / ".genome_lm.lock" if inside else target.parent / f".{target.name}.lock"


def _holder_text(holder: dict) -> str:
    return (f"genome-lm {holder.get('command', '?')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            f"started {holder.get('started', '?')})")


def _read_holder(fd: int) -> dict | None:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"null")
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError):
        return True
    return True


def lock_output(out: str | os.PathLike, command: str, option: str = "--out", inside: bool = False) -> None:
    """Hold the lock of output `out` for `command` until the command ends (again: a no-op)."""
    path = lock_file(out, inside)
    if path in _HELD:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = _read_holder(fd) or {}
                os.close(fd)
                if "RANK" in os.environ and os.environ.get(HOLDER_ENV) == f"{other.get('host')}:{other.get('pid')}":
                    return  # this process works under its launcher's lock
                raise GenomeLMError(f"{option} {Path(out)} is being written by {_holder_text(other)}; wait for it to "
                                    f"end or choose another {option}") from None
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:  # not a file its holder removed as we opened it
                    break
            os.close(fd)
    except OSError as e:
        if e.errno in STORAGE_ERRORS and e.filename:  # the CLI's one line for a full or read-only disk
            raise
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        raise GenomeLMError(f"cannot create output directory {out} (its lock {path.name}): "
                            f"{f'{blocker} is a file' if blocker else e.strerror}; choose a writable location with "
                            f"{option}") from None
    holder, host = _read_holder(fd), socket.gethostname()
    if holder and holder.get("host") != host:
        os.close(fd)
        raise GenomeLMError(f"{option} {out} is locked by {_holder_text(holder)} on another node; if that process is "
                            f"gone, remove {path} and run again")
    if holder and _alive(holder.get("pid")) and holder.get("pid") != os.getpid():
        os.close(fd)  # running, yet its flock is not seen: a filesystem that ignores flock
        raise GenomeLMError(f"{option} {out} is being written by {_holder_text(holder)}; wait for it to end or "
                            f"choose another {option}")
    if holder:
        log.warning("%s: taking over the lock of %s, whose process has ended", out, _holder_text(holder))
    record = {"command": command, "pid": os.getpid(), "host": host,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    _HELD[path] = fd
    os.environ[HOLDER_ENV] = f"{host}:{os.getpid()}"


def _release(path: Path) -> None:
    fd = _HELD.pop(path, None)
    if fd is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # before the unlock: a process that opened this file sees it gone, and retries
        os.close(fd)


@atexit.register
def release_all() -> None:
    """Give up every output lock this process holds (a command's end)."""
    for path in list(_HELD):
        _release(path)


@contextlib.contextmanager
def holding(out: str | os.PathLike, command: str, option: str = "--out", inside: bool = False) -> Iterator[None]:
    """Hold the lock of `out` for the block; released at its end unless held before."""
    path = lock_file(out, inside)
    held = path in _HELD
    lock_output(out, command, option, inside)
    try:
        yield
    finally:
        if not held:
            _release(path)


def claim_output(out: str | os.PathLike, kind: str, inputs: Iterable[str | os.PathLike] = (),
                 overwrite: bool = False, option: str = "--out") -> None:
    """Take the lock of `out`, then refuse in one line an `out` the command may not write (without
    `overwrite`: anything but a missing `out` or an empty folder; the rest: docs/refusals.md)."""
    out = check_out_path(out, option)
    lock_output(out, COMMANDS[kind], option)
    for path in inputs:  # an output inside an input folder: a rebuild or rotation of the input removes it
        folder = Path(path).resolve()
        if folder.is_dir() and folder in out.resolve().parents:
            raise GenomeLMError(f"{option} {out} lies inside this command's input {path}; write the output outside "
                                f"it, e.g. {option} {folder.parent / out.name}")
    if not out.exists() and not out.is_symlink():
        return
    empty = out.is_dir() and not out.is_symlink() and not any(out.iterdir())
    if not overwrite and not empty:
        raise GenomeLMError(f"{option} {out} already exists; pass --overwrite to replace it or choose another {option}")
    resolved = out.resolve()
    place = ("your home directory" if resolved == Path.home().resolve() else "a filesystem root"
             if resolved.parent == resolved else "the working directory or one of its parents"
             if Path.cwd().resolve().is_relative_to(resolved) else None)  # what no --overwrite may replace
    if place is not None:
        raise GenomeLMError(f"{option} {out} is {place}; --overwrite would delete it: choose a new folder for {option}")
    if os.path.ismount(resolved):
        raise GenomeLMError(f"{option} {out} is a mount point; an output is built beside it and renamed into place, "
                            f"which a mount point cannot take: give a folder inside it, e.g. {option} {out / 'out'}")
    if empty:
        return
    for path in inputs:
        if Path(path).resolve().is_relative_to(resolved):
            raise GenomeLMError(f"{option} {out} holds this command's input {path}; --overwrite would delete it: "
                                f"choose another {option}")
    marker, names = read_marker(out), {p.name for p in out.iterdir()} if out.is_dir() else set()
    if marker is None and kind in SIGNATURES and SIGNATURES[kind][0] <= names <= SIGNATURES[kind][1]:
        return  # an unmarked output of the kind, judged by its files
    if marker is None and out.is_dir():
        raise GenomeLMError(f"{option} {out} is not {KINDS[kind]}: it has no {MARKER} and holds other files than one "
                            f"would; --overwrite replaces only an output of the same command: choose another {option}")
    if marker is None or marker["kind"] != kind:
        raise GenomeLMError(f"{option} {out} is {what_it_is(out)}, not {KINDS[kind]}; --overwrite replaces only an "
                            f"output of the same command: choose another {option}")
    foreign = sorted(names - {MARKER, *marker["entries"]})
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise GenomeLMError(f"{option} {out} also holds files genome_lm did not write there ({shown}); move them "
                            f"out first, or choose another {option}")


def umask() -> int:
    """The process's file-mode creation mask."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", **open_kwargs) -> Iterator[IO]:
    """A temporary file `.NAME.*.tmp` beside `path`, renamed to `path` with a plain open's permissions
    when the block ends without an error; else removed, and `path` untouched."""
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


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    with atomic_file(path) as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def make_temp_dir(parent: str | os.PathLike, prefix: str) -> Path:
    """A new hidden work directory in `parent`, with a plain mkdir's permissions (mkdtemp makes 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, kind: str, inputs: Iterable[str | os.PathLike] = (),
                     overwrite: bool = False) -> Iterator[Path]:
    """Build output folder `final` of `kind` under a temporary name beside it, holding its lock; mark it
    and rename it into place on success (`claim_output` checks `final` before and again then). On any
    exception the temporary folder is removed; an existing `final` is replaced only by a complete one."""
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
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=parent))
            if final.exists():
                os.replace(final, old / "x")
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
