"""The dependency rule of docs/architecture.md: genome -> model -> parallel -> train -> eval ->
report, with plan and cli on top. A module imports only from its own package and the layers below
it (errors, sizes, options, files, tf32, outputs, progress and settings are below everything; config
belongs to train). Read from the source, so imports inside functions count too."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "genome_lm"
LAYER = {"errors": 0, "sizes": 0, "options": 0, "files": 0, "tf32": 0, "outputs": 0, "progress": 0, "settings": 0,
         "genome": 1, "model": 2, "parallel": 3, "config": 4, "train": 4, "eval": 5, "report": 6, "plan": 7, "cli": 8,
         "demo": 8, "__main__": 9, "__init__": 9}


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
