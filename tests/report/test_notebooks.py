"""Every notebook in notebooks/ is committed without outputs and executes against small eval outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"loss_by_context.ipynb", "training_curves.ipynb"}


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
