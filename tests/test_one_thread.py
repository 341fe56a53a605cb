"""Torch's thread count is set for one test at a time, by the `one_thread` fixture (tests/conftest.py):
no test module sets it when it is imported, where it would hold for every test that runs after it."""

import ast
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parent


def set_at_import(path: Path) -> list[int]:
    """Lines of `path` that call `*.set_num_threads(...)` outside any function or class."""
    lines = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        lines += [n.lineno for n in ast.walk(node) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Attribute) and n.func.attr == "set_num_threads"]
    return lines


def test_no_test_module_sets_the_thread_count_at_import():
    found = [f"{path.relative_to(TESTS.parent)}:{line}" for path in sorted(TESTS.rglob("*.py"))
             for line in set_at_import(path)]
    assert not found, "set at import, for the rest of the run (use the one_thread fixture):\n" + "\n".join(found)


def test_one_thread_holds_for_the_test(one_thread):
    assert torch.get_num_threads() == 1


def test_the_check_sees_a_module_level_call(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text("import torch\n\ntorch.set_num_threads(1)\n\n\ndef f():\n    torch.set_num_threads(2)\n")
    assert set_at_import(module) == [3]
