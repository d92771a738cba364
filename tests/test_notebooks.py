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


#: Seconds each smoke run took alone on a 2-core machine: the runs start longest first, so the
#: two at a time finish together. Only the order depends on it; a notebook not listed starts first.
SMOKE_RUN_S = {"06_cluster_prior": 95, "02_collect_data": 59, "00_quickstart": 51,
               "07_your_own_job": 44, "04_codesign_search": 41, "03_fit_predictor": 33,
               "05_paper_analysis": 25, "01_define_space": 3}
CELL_TIMEOUT_S = 600  # a cell that runs longer (a hung kernel) fails its notebook's test


def _smoke_env(py: Path, runs: Path) -> dict[str, str]:
    """The environment of one notebook's kernel: smoke budgets, Agg, its own runs folder, and
    this checkout's package first on the path, whatever the kernel's own path. Passed to the
    kernel it is meant for, not set in this process, which runs two kernels at once."""
    pythonpath = os.pathsep.join([str(py.parent.parent), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "CUBICML_LAB_SMOKE": "1", "MPLBACKEND": "Agg",
            "CUBICML_LAB_RUNS": str(runs), "PYTHONPATH": pythonpath}


def _execute_smoke(py: Path, runs: Path):
    """Run one notebook headless in a kernel of its own; return it with its outputs."""
    import asyncio

    import nbclient
    import nbformat

    nb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(py.parent)}})
    asyncio.run(client.async_execute(env=_smoke_env(py, runs)))  # its own loop, in its thread
    return nb


@pytest.fixture(scope="module")
def smoke_runs(request, tmp_path_factory):
    """Start the smoke run of every notebook this session runs (selected, not skipped), two at
    a time, each kernel a process of its own: {stem: (future of the executed notebook, runs
    folder)}. Most of a run is interpreter start, imports and waiting on tiny campaigns, so two
    share a 2-core machine in about half the wall time of one after the other."""
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from concurrent.futures import ThreadPoolExecutor

    selected = [item.callspec.params["py"] for item in request.session.items
                if item.originalname == "test_notebook_executes_in_smoke_mode"
                and item.get_closest_marker("skip") is None]
    selected.sort(key=lambda py: -SMOKE_RUN_S.get(py.stem, float("inf")))
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="smoke")
    runs = {py.stem: tmp_path_factory.mktemp(py.stem) for py in selected}
    try:
        yield {py.stem: (pool.submit(_execute_smoke, py, runs[py.stem]), runs[py.stem])
               for py in selected}
    finally:  # a failure with -x: the runs not started yet do not start
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.parametrize("py", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_in_smoke_mode(py, smoke_runs):
    future, runs = smoke_runs[py.stem]
    nb = future.result()  # raises what the run raised: the failing cell, its traceback
    errors = [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells)
              if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    assert any(runs.iterdir()), "the notebook wrote nothing under CUBICML_LAB_RUNS"


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
