"""Environment variables: every one that genome_lm/ reads or sets is named in docs/config.md's
Environment section, which says who sets it and when it is read. Read from the source: each
`os.environ` access must name its variable (a string, a module constant, or a loop over one)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "genome_lm"


def documented() -> set[str]:
    text = (ROOT / "docs" / "config.md").read_text()
    section = text.split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([A-Z][A-Z0-9_]*)`", section))


def _constants(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """Module-level NAME = "X" or NAME = ("X", "Y")."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            items = value.elts if isinstance(value, ast.Tuple) else [value]
            if all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in items):
                out[node.targets[0].id] = tuple(v.value for v in items)
    return out


def _key(node: ast.AST) -> ast.AST | None:
    """The expression naming the variable of the `os.environ` access `node`."""
    parent = node.parent
    if isinstance(parent, ast.Attribute) and isinstance(parent.parent, ast.Call) and parent.parent.args:
        return parent.parent.args[0]  # os.environ.get(KEY, ...), .setdefault, .pop
    if isinstance(parent, ast.Subscript):
        return parent.slice  # os.environ[KEY]
    if isinstance(parent, ast.Compare) and node in parent.comparators:
        return parent.left  # KEY in os.environ
    return None


def _names(key: ast.AST | None, constants: dict) -> tuple[str, ...] | None:
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return (key.value,)
    if not isinstance(key, ast.Name):
        return None
    if key.id in constants:
        return constants[key.id]
    node = key
    while (node := getattr(node, "parent", None)) is not None:  # a loop variable over a constant
        loops = [node] if isinstance(node, ast.For) else getattr(node, "generators", [])
        for loop in loops:
            if isinstance(loop.target, ast.Name) and loop.target.id == key.id and isinstance(loop.iter, ast.Name):
                return constants.get(loop.iter.id)
    return None


def environment_uses(path: Path) -> list[tuple[int, tuple[str, ...] | None]]:
    """(line, the variables it names, None if it names none) of each `os.environ` in `path`."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node
    constants = _constants(tree)
    return sorted((node.lineno, _names(_key(node), constants)) for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr == "environ"
                  and isinstance(node.value, ast.Name) and node.value.id == "os")


def test_every_environment_variable_is_documented():
    known, problems = documented(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, names in environment_uses(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if names is None:
                problems.append(f"{where}: os.environ without a variable name this test can read")
            problems += [f"{where}: {name} is not in docs/config.md, Environment" for name in names or ()
                         if name not in known]
    assert not problems, "\n".join(problems)


def test_the_check_reads_names_and_loops(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('import os\nKEYS = ("A_B", "C")\nX = "D"\n'
                   'os.environ.get("E")\nos.environ[X]\n"F" in os.environ\n'
                   '{k: os.environ.get(k) for k in KEYS}\nfor key in KEYS:\n    os.environ.pop(key, None)\n'
                   'os.environ.get(name)\n')
    assert environment_uses(src) == [(4, ("E",)), (5, ("D",)), (6, ("F",)), (7, ("A_B", "C")), (9, ("A_B", "C")),
                                     (10, None)]
