"""One sweep case (`Case`), the set-ups its rows name, and how a case is run and judged (`run_case`)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.sweep.world import World

Setup = Callable[[dict], "subprocess.Popen | None"]  # writes into ctx["tmp"]; may start a process to end later
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (rank\d+ )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
LEFTOVER = re.compile(r"\.partial-|\.old-|\.lock$|\.eval-cache$|\.launch$|\.part$")


@dataclass(frozen=True)
class Case:
    """`genome-lm ARGV` after `setup`: it exits `exit`, and its one error line (a WARNING line when
    `exit` is 0) holds every one of `words`. ARGV and words name the world's paths as {shards}, {run},
    ...; {tmp} is the case's own folder, {out} = {tmp}/out, {holder} the pid of a process `setup` started.
    `after(ctx)` checks what the case leaves (None when fine, else what is wrong)."""

    command: str
    name: str
    argv: str
    words: tuple[str, ...]
    exit: int = 2
    setup: Setup | None = None
    after: Callable[[dict], str | None] | None = None

    @property
    def id(self) -> str:
        return f"{self.command}: {self.name}"


@dataclass
class Result:
    case: Case
    code: int | None
    line: str
    problems: list[str] = field(default_factory=list)
    new: bool = False  # no test outside the sweep asserts its message (`python -m tests.sweep`)

    @property
    def verdict(self) -> str:
        return "good" if not self.problems else "BAD: " + "; ".join(self.problems)


# ---- set-ups: each returns a Setup -------------------------------------------------------------------

def write(name: str, content: str | bytes) -> Setup:
    def setup(ctx):
        path = Path(ctx["tmp"], name)
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)  # type: ignore[operator]
    return setup


def copy(key: str, name: str, edit: Callable[[Path], None] | None = None) -> Setup:
    """The world's `key` (a path) copied to {tmp}/NAME, then `edit(copy)`."""
    def setup(ctx):
        src, dst = Path(ctx[key]), Path(ctx["tmp"], name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst, symlinks=True) if src.is_dir() else shutil.copy(src, dst)
        if edit is not None:
            edit(dst)
    return setup


def steps(*setups: Setup) -> Setup:
    def setup(ctx):
        procs = [s(ctx) for s in setups]
        return next((p for p in procs if p is not None), None)
    return setup


HOLD = ("import sys, time; from genome_lm.outputs import lock_output; "
        "lock_output(sys.argv[1], sys.argv[2], inside=sys.argv[3] == '1'); print('held', flush=True); time.sleep(900)")


def held(target: str, command: str, inside: bool = False) -> Setup:
    """A process that holds the lock of output `target` (formatted with ctx) as `command` would."""
    def setup(ctx):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, target.format(**ctx), command, "1" if inside else "0"],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        return proc
    return setup


SLOW = ("import sys, time; from genome_lm.parallel import callbacks; from genome_lm.cli import main; "
        "callbacks.install(lambda *a: time.sleep(float(sys.argv[1]))); sys.exit(main(sys.argv[2:]))")


def running(argv: str, appears: str, seconds: float = 1.0) -> Setup:
    """`genome-lm ARGV` in a child process whose steps take `seconds` more, once path `appears` exists."""
    def setup(ctx):
        proc = subprocess.Popen([sys.executable, "-c", SLOW, str(seconds), *shlex.split(argv.format(**ctx))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "TQDM_DISABLE": "1"})
        while not Path(appears.format(**ctx)).exists():
            if proc.poll() is not None:
                raise AssertionError(f"genome-lm {argv} ended first: {proc.communicate()[1][-2000:]}")
            time.sleep(0.2)
        ctx["_proc"] = proc
        return proc
    return setup


def finished_like(key: str, same: Callable[[Path, Path], bool]) -> Callable[[dict], str | None]:
    """The process `running` started ends with exit 0 and its --out is `same` as the world's `key`."""
    def after(ctx):
        proc = ctx["_proc"]
        if proc.wait(timeout=600) != 0:
            return f"the first command failed: {proc.communicate()[1][-300:]}"
        return None if same(Path(ctx["out"]), Path(ctx[key])) else f"the first command's result differs from {key}"
    return after


# ---- running and judging -----------------------------------------------------------------------------

def _run(argv: list[str]) -> tuple[int | None, str]:
    """main(argv) in this process: exit status (None: an exception escaped), stderr with the log."""
    from genome_lm.cli import main

    err = io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code: int | None = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: B036 - a traceback is what the sweep looks for
                code = None
                err.write(traceback.format_exc())
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    return code, err.getvalue()


def _leftovers(folder: Path, but: Path | None = None) -> list[str]:
    """Work files under `folder` (not under `but`) that a command that ended should have removed."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if LEFTOVER.search(p.name) and (but is None or but not in p.parents))


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def run_case(case: Case, world: World, index: int) -> Result:
    tmp = world.root / "cases" / f"{index:03d}"
    tmp.mkdir()
    ctx = {**world.paths(), "tmp": str(tmp), "out": str(tmp / "out")}
    proc = case.setup(ctx) if case.setup else None
    ctx["holder"] = str(proc.pid) if proc is not None else "?"
    before, world_before = _listing(tmp), _leftovers(world.root, but=tmp.parent)
    try:
        code, err = _run(shlex.split(case.argv.format(**ctx)))
        problems = judge(case, code, err, {k: str(v) for k, v in ctx.items() if k != "_proc"})
        if case.after is not None:  # a first command still writes {out}: it must end as a clean run would
            problems += [wrong] if (wrong := case.after(ctx)) else []
            problems += [f"left {', '.join(left[:3])}"] if (left := _leftovers(tmp)) else []
        elif case.exit != 0 and (new := sorted(_listing(tmp) - before)):
            problems.append(f"left {', '.join(new[:3])}")
        if (left := sorted(set(_leftovers(world.root, but=tmp.parent)) - set(world_before))):
            problems.append(f"left {', '.join(left[:3])}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    return Result(case, code, _the_line(case, err), problems)


def _the_line(case: Case, err: str) -> str:
    lines = _message_lines(err) if case.exit else [x for x in err.splitlines() if " WARNING " in x]
    return lines[0] if lines else ""


def _message_lines(err: str) -> list[str]:
    """stderr less the log and argparse's usage lines."""
    return [x for x in err.splitlines() if x.strip() and not LOG_LINE.match(x) and not x.startswith(("usage:", " "))]


def judge(case: Case, code: int | None, err: str, ctx: dict[str, str]) -> list[str]:
    problems = []
    if code is None or "Traceback" in err:
        problems.append("traceback: " + err.strip().splitlines()[-1][:200])
    elif code != case.exit:
        problems.append(f"exit {code}, not {case.exit}")
    lines = _message_lines(err)
    if case.exit and len(lines) != 1:
        problems.append(f"{len(lines)} message lines")
    if case.exit and lines and not lines[0].startswith(f"genome-lm {case.command}: "):
        problems.append("the line does not name the command")
    line = _the_line(case, err)
    missing = [w for w in (w.format(**ctx) for w in case.words) if w not in line]
    if missing:
        problems.append(f"line lacks {missing}")
    return problems
