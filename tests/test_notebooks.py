"""Notebooks: each .py percent twin matches its .ipynb, outputs are stripped, and it runs headless."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.py"))


def _code(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


@pytest.mark.parametrize("py", NOTEBOOKS, ids=lambda p: p.stem)
def test_twin_in_sync_and_stripped(py):
    jupytext = pytest.importorskip("jupytext")
    ipynb = py.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} missing: run `make notebooks`"
    from_py, from_ipynb = jupytext.read(py), jupytext.read(ipynb)
    assert _code(from_py) == _code(from_ipynb), f"{ipynb.name} out of date: run `make notebooks`"
    for cell in from_ipynb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "outputs not stripped"
    tags = [c.metadata.get("tags", []) for c in from_py.cells]
    assert sum("parameters" in t for t in tags) == 1, "exactly one `parameters` cell"


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.parametrize("py", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_in_smoke_mode(py, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("CUBICML_LAB_SMOKE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("CUBICML_LAB_RUNS", str(tmp_path))
    # the kernel must import this checkout's package, whatever the kernel's own path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(py.parent.parent), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(py.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert any(tmp_path.iterdir()), "the notebook wrote nothing under CUBICML_LAB_RUNS"
