"""The command line itself: `--help` of every command answers without importing the heavy libraries,
and every boolean is one plain flag."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from genome_lm.cli import COMMANDS, _model, build_parser, main

HEAVY = ("torch", "transformers", "ray", "datasets", "pyarrow")

# Each argv's --help (or --version) in one process, then the heavy modules loaded so far: a command
# that loads one is named by the first entry that shows it.
HELP_IN_ONE_PROCESS = """
import contextlib, io, json, sys
from genome_lm.cli import main
seen = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(argv)
        except SystemExit as e:
            code = e.code
    seen.append([argv, code, out.getvalue()[:6], [m for m in json.loads(sys.argv[2]) if m in sys.modules]])
print(json.dumps(seen))
"""


def test_help_and_version_import_nothing_heavy():
    argvs = [["--help"], ["--version"], *[[name, "--help"] for name in COMMANDS]]
    proc = subprocess.run([sys.executable, "-c", HELP_IN_ONE_PROCESS, json.dumps(argvs), json.dumps(HEAVY)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert [argv for argv, *_ in seen] == argvs
    for argv, code, start, heavy in seen:
        assert code == 0 and start in ("usage:", "genome"), (argv, code, start)
        assert heavy == [], f"genome-lm {' '.join(argv)} imported {heavy}"


def test_the_check_sees_a_heavy_import():
    proc = subprocess.run([sys.executable, "-c", HELP_IN_ONE_PROCESS.replace("seen = []", "import pyarrow\nseen = []"),
                           json.dumps([["--version"]]), json.dumps(HEAVY)], capture_output=True, text=True, timeout=120)
    assert json.loads(proc.stdout)[0][3] == ["pyarrow"]


def test_only_the_named_command_gets_its_flags():
    parser = build_parser(["-v", "train", "--help"])
    flags = {name: {o for a in sub._actions for o in a.option_strings}
             for name, sub in parser._subparsers._group_actions[0].choices.items()}  # type: ignore[union-attr]
    assert "--resume" in flags["train"] and flags["eval"] == {"-h", "--help"}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_boolean_is_one_plain_flag(name):
    """`--x` turns on a field that defaults to false (or to unset); `--no-x` turns off one that defaults
    to true; no field has both."""
    parser = build_parser([name])
    sub = parser._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
    fields = {n: f for ref in COMMANDS[name].models for n, f in _model(ref).model_fields.items()}
    for action in sub._actions:
        field = fields.get(action.dest)
        if field is None or bool not in (field.annotation, *getattr(field.annotation, "__args__", ())):
            continue
        [flag] = action.option_strings
        assert flag.startswith("--no-") == (field.default is True), (name, flag)
        assert action.nargs == 0 and action.const is (field.default is not True), (name, flag)


@pytest.mark.parametrize("argv", [["train", "e.yaml", "--no-resume"], ["eval", "--checkpoint", "c", "--no-parity"],
                                  ["eval", "--checkpoint", "c", "--tf32"], ["plan", "--no-offload"]])
def test_generated_negatives_are_unknown(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"genome-lm {argv[0]}: error: unrecognized arguments: {argv[-1]}"
