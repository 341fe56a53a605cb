"""Model code reads no module-level mutable state: what changes how the model runs comes in as a
typed setting on a module (`model/patch.py`, the `backend` / `fla` of KDA), never as a global that
some other code sets.

The scan (AST, every module of `genome_lm/`): state is a module-level name rebound through `global`
in a function, or bound to a mutable object (a list, dict or set display or comprehension, or a call
of list / dict / set / defaultdict / deque / OrderedDict / Counter / bytearray) that a function
changes (a mutating method, an item stored or deleted); a function of `genome_lm/model/` that reads
such a name (its own module's, or imported with `from ... import`) fails the test. Tables that no
function changes are constants.
"""

from __future__ import annotations

import ast
from pathlib import Path

import genome_lm

PACKAGE = Path(genome_lm.__file__).parent
MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "deque", "OrderedDict", "Counter", "bytearray"}
MUTABLE_DISPLAYS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add", "discard",
            "remove", "appendleft", "popleft", "sort", "reverse", "__setitem__", "__delitem__"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, MUTABLE_DISPLAYS):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in MUTABLE_CALLS
    return False


def _top_level(tree: ast.Module):
    """Statements run at import (module body, and inside its top-level if / try blocks)."""
    todo = list(tree.body)
    while todo:
        stmt = todo.pop()
        yield stmt
        if isinstance(stmt, (ast.If, ast.Try)):
            todo += stmt.body + stmt.orelse + getattr(stmt, "finalbody", []) + [
                s for h in getattr(stmt, "handlers", []) for s in h.body]


def mutable_bindings(tree: ast.Module) -> set[str]:
    """Module-level names bound to mutable objects."""
    names = set()
    for stmt in _top_level(tree):
        if isinstance(stmt, ast.Assign) and _is_mutable(stmt.value):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and _is_mutable(stmt.value):
            names.add(stmt.target.id)
    return names


def _functions(tree: ast.Module):
    return (node for fn in ast.walk(tree) if isinstance(fn, FUNCTIONS) for node in ast.walk(fn))


def changed_in_functions(tree: ast.Module) -> set[str]:
    """Names a function rebinds through `global`, calls a mutating method of, or stores / deletes an item of."""
    names = set()
    for node in _functions(tree):
        if isinstance(node, ast.Global):
            names |= set(node.names)
        elif isinstance(node, ast.Attribute) and node.attr in MUTATORS and isinstance(node.value, ast.Name):
            names.add(node.value.id)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) and \
                isinstance(node.value, ast.Name):
            names.add(node.value.id)
    return names


def read_in_functions(tree: ast.Module) -> set[str]:
    """Names loaded inside any function (or lambda) of the module."""
    return {node.id for node in _functions(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def _imported(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Local name -> (module, name) of each `from module import name`."""
    return {alias.asname or alias.name: (node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}


def hidden_state(root: Path, readers: str) -> list[str]:
    """'module.name read by module' for each piece of module-level mutable state of the package at
    `root` (its folder) that a function of a module under `readers` (e.g. "genome_lm.model") reads."""
    trees = {_module_name(p, root.parent): ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))}
    changed = set()
    for mod, tree in trees.items():
        imported = _imported(tree)
        for name in changed_in_functions(tree):
            changed.add(imported.get(name, (mod, name)))
    state = {(mod, name) for mod, tree in trees.items() for name in mutable_bindings(tree) if (mod, name) in changed}
    state |= {(mod, name) for mod, tree in trees.items() for node in _functions(tree)
              if isinstance(node, ast.Global) for name in node.names}
    found = []
    for mod, tree in trees.items():
        if mod != readers and not mod.startswith(readers + "."):
            continue
        imported = _imported(tree)
        for name in read_in_functions(tree):
            where = (mod, name) if (mod, name) in state else imported.get(name)
            if where in state:
                found.append(f"{where[0]}.{where[1]} read by {mod}")
    return sorted(found)


def test_model_code_reads_no_module_level_mutable_state():
    assert hidden_state(PACKAGE, "genome_lm.model") == []


def test_the_scan_finds_state_rebound_or_changed_elsewhere_and_passes_constant_tables(tmp_path):
    pkg = tmp_path / "genome_lm" / "model"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("_ON = []\nLIMIT = None\nTABLE = {1: 2}\n\n"
                              "def f():\n    return bool(_ON) and TABLE[1]\n\n"
                              "def g(x):\n    global LIMIT\n    LIMIT = x\n")
    (pkg / "b.py").write_text("from genome_lm.model.a import LIMIT\n\ndef h():\n    return LIMIT\n")
    (tmp_path / "genome_lm" / "c.py").write_text("from genome_lm.model.a import _ON\n\n"
                                                 "def on():\n    _ON.append(1)\n")
    assert hidden_state(tmp_path / "genome_lm", "genome_lm.model") == [
        "genome_lm.model.a.LIMIT read by genome_lm.model.b", "genome_lm.model.a._ON read by genome_lm.model.a"]
