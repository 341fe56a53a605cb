"""Every notebook in notebooks/ is committed without outputs and executes against small eval outputs."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def genome_lm_names(source: str) -> list[tuple[str, str]]:
    """(module, name) for every name that `source` takes from genome_lm: `from genome_lm.M import N`,
    and `A.N` where A is a genome_lm module it imported (`from genome_lm import report`)."""
    modules, names = {}, []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "genome_lm":
            for alias in node.names:
                names.append((node.module, alias.name))
                if importlib.util.find_spec(f"{node.module}.{alias.name}") is not None:
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            modules.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("genome_lm")})
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            names.append((modules[node.value.id], node.attr))
    return names


def test_there_are_notebooks_and_what_they_call_exists():
    """Both notebooks are valid nbformat 4 with Python code cells, and every genome_lm function, module
    and attribute their code names exists (a rename in genome_lm.report breaks them here, in a second)."""
    assert {p.name for p in NOTEBOOKS} >= {"loss_by_context.ipynb", "training_curves.ipynb"}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        names = genome_lm_names(source)
        assert len(names) >= 5, f"{path.name}: uses {names}, expected it to call genome_lm.report"
        missing = [f"{m}.{n}" for m, n in names if not hasattr(importlib.import_module(m), n)]
        assert not missing, f"{path.name} calls what genome_lm does not have: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, evaluated, monkeypatch, tmp_path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name}: commit it without outputs"
    assert any("parameters" in c.metadata.get("tags", []) for c in code)
    monkeypatch.setenv("GENOME_LM_EVALS", f"{evaluated.eval0},{evaluated.eval1}")
    monkeypatch.setenv("GENOME_LM_COMPARES", "")
    monkeypatch.setenv("GENOME_LM_RUNS", str(evaluated.run))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {}))
    assert images >= 1
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors


def test_loss_by_context_shows_a_replicate_compare(evaluated, monkeypatch, tmp_path):
    """Given a compare of replicate evals, the notebook shows each pair and the CI over seeds."""
    from genome_lm.eval import write_compare

    path = next(p for p in NOTEBOOKS if p.name == "loss_by_context.ipynb")
    nb = nbformat.read(path, as_version=4)
    rep = write_compare(f"{evaluated.eval0},{evaluated.eval1}", f"{evaluated.eval1},{evaluated.eval0}",
                        tmp_path / "rep", resamples=100)
    monkeypatch.setenv("GENOME_LM_EVALS", f"{evaluated.eval0},{evaluated.eval1}")
    monkeypatch.setenv("GENOME_LM_COMPARES", str(tmp_path / "rep"))
    monkeypatch.setenv("GENOME_LM_RUNS", str(evaluated.run))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = "".join(o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.outputs)
    assert "2 replicate pairs" in shown and f"{rep['replicates']['pairs'][0]['diff']:+.4f}" in shown
