"""The shape of the code a maintainer reads (docs/architecture.md, Contracts and conventions):
no function of genome_lm/ is longer than `MAX_LINES` lines, from its `def` to its last line,
unless its docstring says why, in a sentence that starts with `REASON`. Read from the source."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "genome_lm"
MAX_LINES = 80
REASON = "Long because"


def long_functions(path: Path) -> list[str]:
    """`path:line name (N lines)` for each function of `path` over MAX_LINES without a reason."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES and REASON not in (ast.get_docstring(node) or ""):
                found.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines_without_a_reason():
    found = [f for path in sorted(PACKAGE.rglob("*.py")) for f in long_functions(path)]
    assert not found, (f"functions over {MAX_LINES} lines (split them, or say why in the docstring: "
                       f"'{REASON} ...'):\n" + "\n".join(found))


def test_the_check_sees_a_long_function_and_its_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    bad = tmp_path / "bad.py"
    bad.write_text(f"def f():\n{body}")
    assert long_functions(bad) == [f"{bad}:1 f ({MAX_LINES + 1} lines)"]
    bad.write_text(f'def f():\n    """{REASON} it is a table."""\n{body}')
    assert long_functions(bad) == []
