"""Shared fixtures: small spaces and a store in a temporary folder."""

from __future__ import annotations

import os
import sys

import pytest

# Tests never write the user's cache (the CPU peak-FLOP/s micro-benchmark cache, for instance).
os.environ.setdefault("CUBICML_LAB_CACHE_DIR", os.path.join(os.path.dirname(__file__), ".cache"))


def pytest_sessionstart(session):
    """Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE, as in CI), compile the package
    into its __pycache__ (git-ignored) once: every trial subprocess, worker and notebook kernel
    the tests start then imports it from there instead of compiling it again (about 0.6 s of a
    2-core machine per process). A module edited later is compiled again, as ever."""
    if sys.dont_write_bytecode:
        import compileall

        package = os.path.join(os.path.dirname(os.path.dirname(__file__)), "cubicml_lab")
        compileall.compile_dir(package, quiet=1)


@pytest.fixture
def tiny_space():
    """A small mixed space with a constant, a derived value and constraints (20 valid configs)."""
    import cubicml_lab as cml

    return cml.Space(
        [cml.PowerOfTwo("tp", 1, 8), cml.PowerOfTwo("pp", 1, 8),
         cml.Choice("recompute", ["none", "full"])],
        constants={"world_size": 8},
        derived={"dp": "world_size // (tp * pp)"},
        constraints=["tp * pp <= world_size"],
    )


@pytest.fixture
def tmp_store(tmp_path):
    """A fresh SQLite trial store in a temporary folder."""
    from cubicml_lab.store import TrialStore

    store = TrialStore(tmp_path / "lab.sqlite")
    yield store
    store.close()


@pytest.fixture(scope="session")
def shared_lab(tmp_path_factory):
    """One `make lab` for tests/test_lab.py and tests/test_browser.py (lab_server.py's
    shared_lab_server), started when the first of them needs it; each module's own `lab`
    fixture checks what it needs first (make, JupyterLab, the browser)."""
    import shutil

    pytest.importorskip("jupyterlab", reason="JupyterLab is not installed: `make install` "
                        "(or pip install -e '.[notebooks]')")
    if shutil.which("make") is None:
        pytest.skip("`make lab` needs make (apt-get install make)")
    from lab_server import shared_lab_server

    with shared_lab_server(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
    """A notebook that tests/test_browser.py runs in JupyterLab in this session (Run All Cells,
    then no error output and every cell run) is not also run headless by tests/test_notebooks.py:
    the browser's run covers the headless one and costs as much again (notebook 04: 84 s then
    92 s). Where the browser test skips, or is not selected, the headless run stays."""
    in_browser = {item.callspec.params["name"] for item in items
                  if item.originalname == "test_notebook_runs_all_cells_in_jupyterlab"}
    if not in_browser:
        return
    from lab_server import browser_missing

    if browser_missing():
        return
    for item in items:
        if (item.originalname == "test_notebook_executes_in_smoke_mode"
                and item.callspec.params["py"].stem in in_browser):
            item.add_marker(pytest.mark.skip(
                reason="run in JupyterLab by tests/test_browser.py in this session"))
