"""Output folders a command owns: it writes only into an output it made, and `--overwrite` replaces
only such an output, made by the same kind of command.

Each output folder holds a marker, `.genome_lm.json`:
`{"kind": "eval", "entries": ["summary.json", "tokens.parquet"], "inputs": ["/abs/ckpt", ...]}`.
`claim_output` refuses, in one line and before any work, to replace the working directory, one of
its parents, home or a root; a folder that is or holds one of the command's inputs; an unmarked
folder (unless it holds exactly an output of the kind, `SIGNATURES`), a file, or a marked folder of
another kind; a marked folder that also holds files the command did not write.

One writer per output: `claim_output` (and `lock_output`) take an exclusive `fcntl.flock` on
`PARENT/.NAME.lock`, which records the holder and is held until the command ends (`holding`,
`release_all`). A second command is refused naming the holder; a lock left by a gone process on this
host is taken over with a warning. Workers of a launch run under their launcher's lock (`HOLDER_ENV`)."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from genome_lm.errors import STORAGE_ERRORS, GenomeLMError

log = logging.getLogger(__name__)
MARKER = ".genome_lm.json"
HOLDER_ENV = "GENOME_LM_OUTPUT_HOLDER"  # "host:pid" of the process holding the locks a launch's workers use
COMMANDS = {"shards": "prepare", "eval": "eval", "compare": "compare", "model": "export", "run": "train",
            "score": "score", "variants": "variants"}
_HELD: dict[Path, int] = {}  # lock file -> its open descriptor, for the outputs this process holds
os.register_at_fork(after_in_child=_HELD.clear)  # a forked child holds none of its parent's locks
KINDS = {
    "shards": "shards (genome-lm prepare)",
    "eval": "an eval (genome-lm eval)",
    "compare": "a comparison (genome-lm compare)",
    "model": "a model directory (genome-lm export, or a run's checkpoint)",
    "run": "a run directory (genome-lm train)",
    "score": "a score (genome-lm score)",
    "variants": "variant scores (genome-lm variants)",
}


# The files that identify an unmarked output of each kind, and the names such an output may hold.
SIGNATURES = {
    "shards": ({"manifest.json"}, {"manifest.json", "train", "eval", "megatron"}),
    "eval": ({"summary.json", "tokens.parquet"}, {"summary.json", "tokens.parquet", "context_ablation.parquet",
                                                  "parity.json"}),
    "compare": ({"compare.json"}, {"compare.json"}),
}


def _unmarked_kind(folder: Path) -> str | None:
    """The kind an unmarked folder is an output of, judged by its files (`SIGNATURES`), or None."""
    names = {p.name for p in folder.iterdir()}
    for kind, (needed, allowed) in SIGNATURES.items():
        if needed <= names and names <= allowed:
            return kind
    return None


def read_marker(folder: Path) -> dict | None:
    """The marker of `folder`, or None when it has none (or an unreadable one)."""
    try:
        marker = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("kind") in KINDS else None


def write_marker(folder: Path, kind: str, inputs: Iterable[str | os.PathLike] = (), **extra) -> None:
    """Mark `folder` as an output of `kind` holding what is in it now; `extra` fields are kept in the
    marker too (a run records `sequences_per_step`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}; one of {sorted(KINDS)}")
    folder = Path(folder)
    entries = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    marker = {"kind": kind, "entries": entries, "inputs": [str(Path(i).resolve()) for i in inputs], **extra}
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n")


def _contains(folder: Path, path: Path) -> bool:
    return path == folder or folder in path.parents


def _never_replaced(resolved: Path) -> str | None:
    """What `resolved` is when it is a place no --overwrite may replace, else None."""
    if resolved == Path.home().resolve():
        return "your home directory"
    if resolved.parent == resolved:
        return "a filesystem root"
    if _contains(resolved, Path.cwd().resolve()):
        return "the working directory or one of its parents"
    return None


def what_it_is(path: Path) -> str:
    """A few words for what `path` holds, for refusals: its kind, or what kind of thing it is."""
    if not path.is_dir():
        return "a file"
    marker = read_marker(path)
    if marker is not None:
        return KINDS[marker["kind"]]
    if (path / "manifest.json").is_file():
        return "shards (genome-lm prepare)"
    if (path / "checkpoints").is_dir() or (path / "config.yaml").is_file():
        return "a run directory (genome-lm train)"
    if (path / "summary.json").is_file():
        return "an eval or comparison"
    return "a folder genome_lm did not make"


def check_out_path(out: str | os.PathLike, option: str = "--out") -> Path:
    """`out` as a Path; one `GenomeLMError` line for an empty path (an unset shell variable) and for a
    literal '~' that the shell did not expand."""
    if not str(out).strip():
        raise GenomeLMError(f"{option} is empty (an unset shell variable?); give the path to write")
    out = Path(out)
    if out.parts and out.parts[0] == "~":
        raise GenomeLMError(f"{option} {out} starts with a literal '~' (the shell expands ~ only when it is not "
                            f"quoted): write {Path.home() / Path(*out.parts[1:])} or another path")
    return out


def lock_file(out: str | os.PathLike, inside: bool = False) -> Path:
    """Where the lock of output `out` lives: `.NAME.lock` beside it (beside a symlink's target), or
    `.genome_lm.lock` inside it (`inside`: a folder that is written into, never replaced)."""
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


def _open_locked(path: Path, out: Path, option: str) -> int | None:
    """An open descriptor of `path` locked exclusively, or None when this process works under its
    launcher's lock; refuses when another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd) or {}
            os.close(fd)
            if "RANK" in os.environ and os.environ.get(HOLDER_ENV) == f"{holder.get('host')}:{holder.get('pid')}":
                return None
            raise GenomeLMError(f"{option} {out} is being written by {_holder_text(holder)}; wait for it to end or "
                                f"choose another {option}") from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # not a file its holder removed as we opened it
                return fd
        os.close(fd)


def lock_output(out: str | os.PathLike, command: str, option: str = "--out", inside: bool = False) -> None:
    """Hold the lock of output `out` for `command` until the command ends (module docstring); a second
    call for the same output is a no-op."""
    path = lock_file(out, inside)
    if path in _HELD:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_locked(path, Path(out), option)
    except OSError as e:
        if e.errno in STORAGE_ERRORS and e.filename:  # the CLI's one line for a full or read-only disk
            raise
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        raise GenomeLMError(f"cannot create output directory {out} (its lock {path.name}): "
                            f"{f'{blocker} is a file' if blocker else e.strerror}; choose a writable location with "
                            f"{option}") from None
    if fd is None:
        return
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
    """Hold the lock of `out` for the block (`lock_output`); released at its end unless held before."""
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
    """Take the lock of `out` (`lock_output`), then refuse, with one `GenomeLMError` line, an `out` that
    the command may not write (module docstring).

    A missing `out` is always fine, and so is an empty folder; any other existing one needs `overwrite`.
    """
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
    if (place := _never_replaced(resolved)) is not None:
        raise GenomeLMError(f"{option} {out} is {place}; --overwrite would delete it: choose a new folder for {option}")
    if os.path.ismount(resolved):
        raise GenomeLMError(f"{option} {out} is a mount point; an output is built beside it and renamed into place, "
                            f"which a mount point cannot take: give a folder inside it, e.g. {option} {out / 'out'}")
    if empty:
        return
    for path in inputs:
        if _contains(resolved, Path(path).resolve()):
            raise GenomeLMError(f"{option} {out} holds this command's input {path}; --overwrite would delete it: "
                                f"choose another {option}")
    marker = read_marker(out)
    if marker is None and out.is_dir() and _unmarked_kind(out) == kind:
        return
    if marker is None and out.is_dir():
        raise GenomeLMError(f"{option} {out} is not {KINDS[kind]}: it has no {MARKER} and holds other files than one "
                            f"would; --overwrite replaces only an output of the same command: choose another {option}")
    if marker is None or marker["kind"] != kind:
        raise GenomeLMError(f"{option} {out} is {what_it_is(out)}, not {KINDS[kind]}; --overwrite replaces only an "
                            f"output of the same command: choose another {option}")
    foreign = sorted(p.name for p in out.iterdir() if p.name != MARKER and p.name not in marker["entries"])
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise GenomeLMError(f"{option} {out} also holds files genome_lm did not write there ({shown}); move them "
                            f"out first, or choose another {option}")
