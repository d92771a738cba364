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


@pytest.mark.parametrize("py", NOTEBOOKS, ids=lambda p: p.stem)
def test_twin_is_what_jupyterlab_saves_from_its_notebook(py):
    """JupyterLab saves the .py twin through jupytext under notebooks/jupytext.toml: the file
    in git must be byte for byte what that writes (its header included), or saving a notebook
    whose cells did not change rewrites its twin."""
    jupytext = pytest.importorskip("jupytext")
    from jupytext.config import load_jupytext_config

    config = load_jupytext_config(str(py.parent))
    saved = jupytext.writes(jupytext.read(py.with_suffix(".ipynb")), fmt="py:percent",
                            config=config)
    assert saved == py.read_text(), f"{py.name}: `make notebooks`, then rewrite the twin " \
        "from its notebook (jupytext --to py:percent)"


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


def test_every_path_the_readme_writes_to_is_git_ignored():
    """A path under data/ or runs/ that the README names and git does not track is one the
    commands it shows write (a store, a figure, a campaign file): git must ignore it, and the
    files SQLite keeps beside a store."""
    import re
    import shutil
    import subprocess

    repo = Path(__file__).parent.parent
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    named = set(re.findall(r"\b(?:data|runs)/[\w./-]*\w", (repo / "README.md").read_text()))
    tracked = set(subprocess.run(["git", "ls-files", "--", *named], cwd=repo, text=True,
                                 capture_output=True, check=True).stdout.split())
    written = sorted(named - tracked)
    assert "data/lab.sqlite" in written and "runs/demo.png" in written, written
    sidecars = [p + s for p in written if p.endswith(".sqlite") for s in ("-wal", "-shm")]
    check = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching",
                            "--", *written, *sidecars], cwd=repo, text=True, capture_output=True)
    not_ignored = [ln.split("\t")[-1] for ln in check.stdout.splitlines() if ln.startswith("::")]
    assert not not_ignored, f"the README writes to paths git does not ignore: {not_ignored}"
