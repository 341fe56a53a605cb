"""The dependency rule of docs/architecture.md: genome -> model -> parallel -> train -> eval ->
report, with plan and cli on top. A module imports only from its own package and the layers below
it (errors, sizes, options, files, outputs, progress and settings are below everything; config
belongs to train), and no two modules import each other, directly or around a longer loop, within a
package too. Read from the source, so imports inside functions (and under `if TYPE_CHECKING:`) count too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "genome_lm"
LAYER = {"errors": 0, "sizes": 0, "options": 0, "outputs": 0, "progress": 0, "settings": 0,
         "genome": 1, "model": 2, "parallel": 3, "config": 4, "train": 4, "eval": 5, "score": 6, "report": 6,
         "plan": 7, "cli": 8, "demo": 8, "__main__": 9, "__init__": 9}


def imports_of(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("genome_lm.")]


def test_layers_point_one_way():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = path.relative_to(PACKAGE).with_suffix("").parts[0]
        assert mine in LAYER, f"{path}: not in the layer map of this test (add it, and to docs/architecture.md)"
        for line, name in imports_of(path):
            theirs = name.split(".")[1]
            if theirs != mine and LAYER[theirs] > LAYER[mine]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({mine}) imports {name}")
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from genome_lm.train import train\n")
    assert imports_of(bad) == [(2, "genome_lm.train")]


def module_name(path: Path, root: Path) -> str:
    """`root/genome_lm/eval/run.py` -> `genome_lm.eval.run`; a package's `__init__.py` -> the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, dict[str, int]]:
    """module -> {module it imports: first line}, over every `.py` under `package`. `from P import X`
    points to the module `P.X` when X is a module, else to `P`; relative imports are resolved."""
    root = package.parent
    modules = {module_name(path, root): path for path in sorted(package.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                while target and target not in modules:  # `import genome_lm.model.x.y` of a name inside
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(component: set[str], graph: dict[str, dict[str, int]]) -> str:
    edges = [f"  {a} (line {line}) imports {b}" for a in sorted(component) for b, line in sorted(graph[a].items())
             if b in component]
    return " <-> ".join(sorted(component)) + ":\n" + "\n".join(edges)


def test_no_import_cycles():
    graph = import_graph(PACKAGE)
    cycles = import_cycles(graph)
    assert not cycles, "modules that import each other (move what both need into a module of its own):\n" + \
        "\n".join(describe(c, graph) for c in cycles)


@pytest.mark.parametrize("second", [
    "from pkg.a import f\n",  # top level
    "def g():\n    from pkg.a import f\n",  # inside a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n",  # types only
    "def g():\n    from . import a\n",  # relative
])
def test_the_check_sees_a_cycle(tmp_path, second):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import g\n\n\ndef f():\n    pass\n")
    (package / "b.py").write_text(second)
    (package / "c.py").write_text("import pkg.a\n")  # points into the loop, not part of it
    assert import_cycles(import_graph(package)) == [{"pkg.a", "pkg.b"}]
