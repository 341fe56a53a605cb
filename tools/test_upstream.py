"""Drift canary: genome_lm's checks on the newest release of every direct dependency, before the lock moves.

It builds a throwaway venv (removed and recreated on every run) with this interpreter's `venv`,
upgrades pip, installs torch at the Makefile's TORCH_SPEC (torch's build is platform-specific, so
the machine's build is kept; `--torch SPEC` picks another), then the newest release of every
direct dependency that pyproject.toml names in [project].dependencies and in each
[project.optional-dependencies] extra, with version specifiers stripped and extras kept
(`ray[train]`): requirements.lock and pyproject's ranges are ignored. The set is resolved by pip
with torch held at the installed build; the accelerator packages that `make lock` leaves out of
the lock (nvidia-*, cuda-*, triton) are left out here too, and the rest is installed as
`make setup` installs the lock (`--no-deps`), followed by `pip install --no-deps -e .`.

In that venv, from the repository root, each stage runs on its own, with a timeout:

    pip check    the installed set is consistent
    contract     `genome-lm check-upstream`: every upstream symbol, signature and attribute
    parity       tests/model files that compare genome_lm with unpatched upstream transformers
    end-to-end   tests/test_demo.py's quick demo: synth -> prepare -> train -> eval -> report
    ray          the two tests that launch training and eval through Ray (marked slow)
    datasets     shard writing and reading through HF datasets (tests/genome)

A pytest stage fails on a failed test or error, on no test collected, and on a skip whose reason
is not a missing GPU (a newest release that moved something a test imports shows up as a skip).

It prints a line as each step starts, then two tables: each direct dependency's locked version
(requirements.lock; torch: the spec), the newest installed one and whether it moved (with the
newest release on the index where the resolver kept an older one), and each stage's result with
what failed. Every command's full output is kept in VENV/logs/. Exit status: 0 when every stage
passes, 1 otherwise, 2 when it cannot start (pyproject.toml or requirements.lock unreadable, a
--venv that is not a throwaway folder). It follows the registry, so it is not deterministic and not part of CI;
a maintainer runs it before `make lock`:

    make test-upstream
    .venv/bin/python tools/test_upstream.py [--venv DIR] [--torch SPEC] [--json PATH]
                                            [--timeout SECONDS] [--only STAGE ...]

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = Path("/tmp/genome_lm-upstream")
FALLBACK_TORCH_SPEC = "torch==2.13.0"
ACCELERATORS = re.compile(r"^(nvidia-|cuda-|triton)")  # as `make lock` leaves them out of the lock
STAGE_TIMEOUT = 20 * 60
INSTALL_TIMEOUT = 30 * 60
MARK = "not slow and not gpu and not browser"  # pyproject's default selection
# The tests/model files that run genome_lm against unpatched upstream transformers or build on its
# classes (transformers' loss, loader, Cache and generate; fla's naive references).
PARITY_FILES = (
    "test_contract.py", "test_build.py", "test_kda.py", "test_dsa.py", "test_moe.py", "test_checkpoint.py",
    "test_generate.py", "test_long_context.py", "test_kda_lean.py", "test_mlp_lean.py", "test_streaming.py",
)
E2E_TESTS = ("tests/test_demo.py::test_quick_demo_end_to_end",)
RAY_TESTS = (
    "tests/parallel/test_train_parallel.py::test_ray_train_two_cpu_workers_fail_and_resume",
    "tests/eval/test_eval_parallel.py::test_ray_two_cpu_workers_equal_one_process",
)
DATASETS_TESTS = ("tests/genome/test_prepare.py", "tests/genome/test_leakage.py")
STAGES = ("pip check", "contract", "parity", "end-to-end", "ray", "datasets")
EXPECTED_SKIP = re.compile(r"cuda|gpu", re.I)
START = time.monotonic()


class CanaryError(Exception):
    """One line for the user; the script exits 2 with it."""


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def log(message: str) -> None:
    """A progress line, stamped with the time since the start."""
    elapsed = int(time.monotonic() - START)
    print(f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {message}", flush=True)


# --- what the project pins -------------------------------------------------------------------


@dataclass
class Dep:
    """A direct dependency: its name, extras and where pyproject names it."""

    name: str
    extras: list[str] = field(default_factory=list)
    marker: str = ""
    groups: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name + (f"[{','.join(self.extras)}]" if self.extras else "")

    @property
    def requirement(self) -> str:
        """The newest-release requirement: the name and extras, no version, the marker if any."""
        return self.label + (f"; {self.marker}" if self.marker else "")


REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?[^;]*(?:;\s*(.*))?$")


def direct_deps(pyproject: Path) -> list[Dep]:
    """[project].dependencies and every optional-dependencies extra, in file order, one entry a name."""
    project = tomllib.loads(pyproject.read_text())["project"]
    groups = [("dependencies", project.get("dependencies", []))]
    groups += list(project.get("optional-dependencies", {}).items())
    deps: dict[str, Dep] = {}
    for group, reqs in groups:
        for req in reqs:
            m = REQ.match(req)
            if not m:
                raise CanaryError(f"{pyproject}: cannot read the requirement {req!r}")
            key = canon(m[1])
            dep = deps.setdefault(key, Dep(key, marker=(m[3] or "").strip()))
            dep.extras += [e for e in (x.strip() for x in (m[2] or "").split(",")) if e and e not in dep.extras]
            dep.groups.append(group)
    return list(deps.values())


def read_lock(path: Path) -> dict[str, str]:
    """name -> version of each `name==version` pin of a requirements file."""
    if not path.is_file():
        raise CanaryError(f"{path} not found (`make lock` writes it)")
    pins = {}
    for line in path.read_text().splitlines():
        if m := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)", line):
            pins[canon(m[1])] = m[2]
    return pins


def makefile_torch_spec(makefile: Path) -> str:
    text = makefile.read_text() if makefile.is_file() else ""
    m = re.search(r"^TORCH_SPEC\s*\??=\s*(\S+)\s*$", text, re.M)
    return m[1] if m else FALLBACK_TORCH_SPEC


# --- running commands ------------------------------------------------------------------------


@dataclass
class Ran:
    rc: int | None  # None: timed out
    output: str
    seconds: float
    log: Path


def run(cmd: list[str], log_path: Path, timeout: float, env: dict[str, str] | None = None) -> Ran:
    """Run `cmd` from the repository root in its own process group, output to `log_path`; kill the
    group when it runs past `timeout` (rc None) or on Ctrl-C."""
    start = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc = None
        except BaseException:
            kill_group(proc)
            raise
    output = log_path.read_text(errors="replace").split("\n", 1)[-1]
    return Ran(rc, output, time.monotonic() - start, log_path)


def kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def pip_error(text: str) -> str:
    """The line that says why pip failed: the resolver's conflict, else its last ERROR line."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("The conflict is caused by"):
            causes = [ln.strip() for ln in lines[i + 1:] if ln.strip()]
            causes = causes[: next((j for j, c in enumerate(causes) if c.startswith(("To fix", "Additionally"))),
                                   len(causes))]
            return "conflict: " + "; ".join(causes)
    errors = [ln.strip() for ln in lines if ln.strip().startswith("ERROR")]
    return errors[-1] if errors else last_line(text)


class Venv:
    def __init__(self, path: Path):
        self.path = path
        self.python = str(path / "bin" / "python")
        self.logs = path / "logs"
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        self.env.update(VIRTUAL_ENV=str(path), PATH=f"{path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                        PIP_DISABLE_PIP_VERSION_CHECK="1")

    def pip(self, name: str, *args: str, timeout: float = INSTALL_TIMEOUT) -> Ran:
        return run([self.python, "-m", "pip", *args], self.logs / f"{name}.log", timeout, self.env)

    def installed(self) -> dict[str, str]:
        done = subprocess.run([self.python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                              env=self.env, timeout=300)
        if done.returncode != 0:
            raise CanaryError(f"pip list in {self.path} failed: {last_line(done.stderr)}")
        return {canon(p["name"]): p["version"] for p in json.loads(done.stdout)}


def check_venv_path(path: Path) -> None:
    """Refuse to remove anything but a venv or an empty folder, and never the running venv or the project's."""
    resolved = path.resolve()
    protected = {Path(sys.prefix).resolve(), (ROOT / ".venv").resolve(), ROOT, Path.home().resolve()}
    if resolved in protected or resolved in ROOT.parents or resolved in Path(sys.prefix).resolve().parents:
        raise CanaryError(f"--venv {path}: refusing to remove {resolved}; pass a throwaway folder")
    if path.is_file() or path.is_dir() and not (path / "pyvenv.cfg").is_file() and any(path.iterdir()):
        raise CanaryError(f"--venv {path}: exists and is not a venv; refusing to remove it")


# --- installing the newest releases ----------------------------------------------------------


@dataclass
class Install:
    ok: bool = False
    reason: str = ""
    seconds: float = 0.0
    torch: str = ""
    resolved: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    registry: dict[str, str] = field(default_factory=dict)
    installed: dict[str, str] = field(default_factory=dict)


def dry_run_report(venv: Venv, name: str, args: list[str]) -> tuple[dict[str, str] | None, Ran]:
    """name -> version of what `pip install --dry-run ARGS` would install (None when pip fails)."""
    report = venv.logs / f"{name}.json"
    ran = venv.pip(name, "install", "--dry-run", "--report", str(report), *args)
    if ran.rc != 0 or not report.is_file():
        return None, ran
    items = json.loads(report.read_text()).get("install", [])
    return {canon(i["metadata"]["name"]): i["metadata"]["version"] for i in items}, ran


def install(venv: Venv, deps: list[Dep], torch_spec: str) -> Install:
    """The venv with torch at `torch_spec` and the newest releases of `deps`; `ok` False and `reason` on failure."""
    result = Install()
    start = time.monotonic()
    try:
        _install(venv, deps, torch_spec, result)
        result.ok = not result.reason
    except (CanaryError, OSError, subprocess.SubprocessError) as exc:
        result.reason = str(exc)
    result.seconds = time.monotonic() - start
    return result


def _install(venv: Venv, deps: list[Dep], torch_spec: str, result: Install) -> None:
    def fail(step: str, ran: Ran) -> None:
        why = f"timed out after {ran.seconds:.0f} s" if ran.rc is None else pip_error(ran.output)
        result.reason = f"{step}: {why} (log: {ran.log})"

    log(f"creating {venv.path} ({sys.executable} -m venv)")
    shutil.rmtree(venv.path, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "venv", str(venv.path)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        result.reason = f"python -m venv {venv.path}: {last_line(done.stdout + done.stderr)}"
        return
    venv.logs.mkdir(parents=True, exist_ok=True)

    log("upgrading pip")
    if (ran := venv.pip("pip-upgrade", "install", "--upgrade", "pip")).rc != 0:
        return fail("pip upgrade", ran)

    log(f"installing {torch_spec}")
    if (ran := venv.pip("torch", "install", torch_spec)).rc != 0:
        return fail(f"pip install {torch_spec}", ran)
    result.torch = venv.installed().get("torch", "")
    if not result.torch:
        result.reason = f"pip install {torch_spec} left no torch in {venv.path}"
        return
    # Every later pip call keeps this build: nothing may pull another torch (a CUDA build is GBs).
    constraints = venv.logs / "constraints.txt"
    constraints.write_text(f"torch=={result.torch}\n")

    names = [d.name for d in deps if d.name != "torch"]
    log(f"looking up the newest release of {len(names)} direct dependencies on the index")
    registry, _ = dry_run_report(venv, "registry", ["--no-deps", "--ignore-installed", *names])
    result.registry = registry or {}

    reqs = [d.requirement for d in deps if d.name != "torch"]
    log(f"resolving the newest releases: {' '.join(shlex.quote(r) for r in reqs)}")
    resolved, ran = dry_run_report(venv, "resolve", ["--upgrade", "-c", str(constraints), *reqs])
    if resolved is None:
        return fail("resolving the newest releases", ran)
    if "torch" in resolved:
        result.reason = f"the resolver wanted torch {resolved['torch']} in place of {result.torch}"
        return
    result.left_out = {n: v for n, v in resolved.items() if ACCELERATORS.match(n)}
    result.resolved = {n: v for n, v in sorted(resolved.items()) if n not in result.left_out}

    log(f"installing {len(result.resolved)} packages (--no-deps; left out: "
        f"{', '.join(f'{n} {v}' for n, v in result.left_out.items()) or 'none'})")
    pins = venv.logs / "newest.txt"
    pins.write_text("".join(f"{n}=={v}\n" for n, v in result.resolved.items()))
    if (ran := venv.pip("install", "install", "--no-deps", "-c", str(constraints), "-r", str(pins))).rc != 0:
        return fail("installing the newest releases", ran)

    log(f"installing genome_lm (pip install --no-deps -e {ROOT})")
    if (ran := venv.pip("editable", "install", "--no-deps", "-e", str(ROOT))).rc != 0:
        return fail("pip install -e", ran)
    result.installed = venv.installed()
    if result.installed.get("torch") != result.torch:
        result.reason = f"torch {result.torch} became {result.installed.get('torch')} during the installs"


# --- stages ----------------------------------------------------------------------------------


@dataclass
class Stage:
    name: str
    command: list[str]
    result: str = "not run"  # pass, FAIL, TIMEOUT or not run
    reason: str = ""
    summary: str = ""
    seconds: float = 0.0
    log: str = ""

    @property
    def passed(self) -> bool:
        return self.result == "pass"


def pytest_cmd(venv: Venv, mark: str, paths: list[str]) -> list[str]:
    return [venv.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", mark, *paths]


def stages(venv: Venv) -> list[Stage]:
    parity = [f"tests/model/{f}" for f in PARITY_FILES if (ROOT / "tests" / "model" / f).is_file()]
    return [
        Stage("pip check", [venv.python, "-m", "pip", "check"]),
        Stage("contract", [str(venv.path / "bin" / "genome-lm"), "check-upstream"]),
        Stage("parity", pytest_cmd(venv, MARK, parity)) if parity else
        Stage("parity", [], "FAIL", f"none of tests/model/{{{','.join(PARITY_FILES)}}} exists"),
        Stage("end-to-end", pytest_cmd(venv, MARK, list(E2E_TESTS))),
        Stage("ray", pytest_cmd(venv, "not gpu", list(RAY_TESTS))),  # these two are marked slow
        Stage("datasets", pytest_cmd(venv, MARK, list(DATASETS_TESTS))),
    ]


def shorten(items: list[str], keep: int = 3) -> str:
    return ", ".join(items[:keep]) + (f" (+{len(items) - keep} more)" if len(items) > keep else "")


def judge_pytest(rc: int, output: str) -> tuple[bool, str, str]:
    """(passed, what failed, pytest's summary line) from a pytest run's `-ra` output."""
    lines = [ln.rstrip() for ln in output.splitlines()]
    counts = re.compile(r"\b\d+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b|no tests ran")
    summary = next((ln.strip("= ") for ln in reversed(lines) if counts.search(ln)), last_line(output))
    failed = [m for ln in lines if (m := re.match(r"(FAILED|ERROR) (\S+)(?: - (.*))?$", ln))]
    skips = [m for ln in lines if (m := re.match(r"SKIPPED \[(\d+)\] (\S+?): (.*)$", ln))]
    unexpected = [m for m in skips if not EXPECTED_SKIP.search(m[3])]
    skipped = ""
    if unexpected:
        skipped = f"{sum(int(m[1]) for m in unexpected)} skipped: {unexpected[0][2]}: {unexpected[0][3][:150]}"
    if failed:
        n_failed = sum(m[1] == "FAILED" for m in failed)
        counts_text = ", ".join(t for t in (f"{n_failed} failed" if n_failed else "",
                                             f"{len(failed) - n_failed} error" if len(failed) > n_failed else "") if t)
        ids = [m[2].removeprefix("tests/") for m in failed]
        first = next((m[3] for m in failed if m[3]), "")
        reason = f"{counts_text}: {shorten(ids)}" + (f"; first: {first[:200]}" if first else "")
        return False, reason + (f"; {skipped}" if skipped else ""), summary
    if rc == 5:
        return False, f"no tests collected ({summary})", summary
    if rc != 0:
        errors = [ln.strip() for ln in lines if ln.startswith(("ERROR", "E "))]
        return False, (errors[-1] if errors else last_line(output))[:300], summary
    if skipped:
        return False, skipped, summary
    return True, "", summary


def run_stage(venv: Venv, stage: Stage, timeout: float) -> None:
    log(f"stage {stage.name}: {shlex.join(stage.command[2:] if stage.command[0] == venv.python else stage.command)}")
    ran = run(stage.command, venv.logs / f"stage-{stage.name.replace(' ', '-')}.log", timeout, venv.env)
    stage.seconds, stage.log = ran.seconds, str(ran.log)
    is_pytest = stage.command[1:3] == ["-m", "pytest"]
    if ran.rc is None:
        stage.result = "TIMEOUT"
        stage.reason = f"timed out after {timeout:.0f} s; last line: {last_line(ran.output)[:200]}"
        return
    if is_pytest:
        ok, stage.reason, stage.summary = judge_pytest(ran.rc, ran.output)
    else:
        ok, stage.summary = ran.rc == 0, last_line(ran.output)
        stage.reason = "" if ok else f"exit {ran.rc}: {stage.summary}"
    stage.result = "pass" if ok else "FAIL"
    log(f"stage {stage.name}: {stage.result} in {ran.seconds:.0f} s: {stage.reason or stage.summary}")


# --- report ----------------------------------------------------------------------------------


def package_rows(deps: list[Dep], lock: dict[str, str], torch_spec: str, inst: Install) -> list[dict]:
    rows = []
    for dep in deps:
        if dep.name == "torch":
            m = re.fullmatch(r"\s*torch\s*==\s*(\S+)\s*", torch_spec)
            locked = m[1] if m else torch_spec
            newest = inst.torch
            moved = ("no" if newest.split("+")[0] == locked.split("+")[0] else "yes") if m and newest else "-"
            registry = ""
        else:
            locked = lock.get(dep.name, "")
            newest = inst.installed.get(dep.name, "")
            moved = "-" if not newest else "new" if not locked else "no" if newest == locked else "yes"
            registry = inst.registry.get(dep.name, "")
        rows.append(dict(package=dep.label, locked=locked or "-", newest=newest or "-", moved=moved,
                         registry=registry, held_back=bool(newest and registry and registry != newest),
                         groups=dep.groups))
    return rows


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def fmt(cells: list[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([fmt(headers), "-+-".join("-" * w for w in widths), *map(fmt, rows)])


def report(rows: list[dict], stage_list: list[Stage], inst: Install, torch_spec: str, venv: Venv) -> str:
    pkg_rows = [[r["package"], r["locked"], r["newest"] + (f" (index: {r['registry']})" if r["held_back"] else ""),
                 r["moved"]] for r in rows]
    notes = [f"torch: {torch_spec} (the Makefile's TORCH_SPEC unless --torch), this machine's build"
             f"{f' ({inst.torch})' if inst.torch else ''}, not the newest release; the lock leaves torch out."]
    if inst.left_out:
        notes.append("left out, as `make lock` leaves accelerator packages out of the lock: "
                     + ", ".join(f"{n} {v}" for n, v in inst.left_out.items()) + ".")
    if any(r["held_back"] for r in rows):
        notes.append("(index: X): the newest release on the index is X, but the resolver installed an older one "
                     f"(X conflicts with torch {inst.torch or torch_spec} or with another newest release).")
    stage_rows = [["install", "pass" if inst.ok else "FAIL", f"{inst.seconds:.0f} s", inst.reason]]
    stage_rows += [[s.name, s.result, f"{s.seconds:.0f} s" if s.result not in ("not run", "skipped") else "-", s.reason]
                   for s in stage_list]
    return "\n".join([
        table(["package", "locked", "newest", "moved"], pkg_rows), "", *notes, "",
        table(["stage", "result", "time", "what failed"], stage_rows), "",
        f"full output of each step: {venv.logs}/",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV,
                        help=f"the throwaway venv, removed and recreated (default {DEFAULT_VENV})")
    parser.add_argument("--torch", metavar="SPEC", help="torch requirement (default: the Makefile's TORCH_SPEC)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write both tables as JSON here")
    parser.add_argument("--timeout", type=float, default=STAGE_TIMEOUT, metavar="SECONDS",
                        help=f"limit of each stage (default {STAGE_TIMEOUT})")
    parser.add_argument("--only", action="append", choices=STAGES, metavar="STAGE",
                        help=f"run only this stage (repeatable; one of: {', '.join(STAGES)})")
    args = parser.parse_args(argv)
    started = time.time()
    try:
        torch_spec = args.torch or makefile_torch_spec(ROOT / "Makefile")
        deps = direct_deps(ROOT / "pyproject.toml")
        lock = read_lock(ROOT / "requirements.lock")
        check_venv_path(args.venv)
    except CanaryError as exc:
        print(f"test_upstream: error: {exc}", file=sys.stderr)
        return 2
    venv = Venv(args.venv.absolute())
    inst = install(venv, deps, torch_spec)
    stage_list = stages(venv)
    for stage in stage_list:
        if not inst.ok:
            break
        if args.only and stage.name not in args.only:
            stage.result = "skipped"
        elif stage.command:
            run_stage(venv, stage, args.timeout)
    rows = package_rows(deps, lock, torch_spec, inst)
    passed = inst.ok and all(s.passed or s.result == "skipped" for s in stage_list)
    wall = time.time() - started
    print()
    print(report(rows, stage_list, inst, torch_spec, venv))
    print(f"\n{'all stages passed' if passed else 'FAILED'} in {wall / 60:.1f} min")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "passed": passed, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "wall_s": round(wall, 1), "python": sys.version.split()[0], "venv": str(venv.path),
            "torch_spec": torch_spec, "packages": rows,
            "install": {k: v for k, v in asdict(inst).items() if k not in ("installed",)},
            "stages": [asdict(s) for s in stage_list],
        }, indent=2) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
