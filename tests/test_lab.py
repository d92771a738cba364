"""`make lab`: JupyterLab on 127.0.0.1 with the notebooks and the `cubicml-lab` kernel.

The server is the one a person starts (`make lab` in this checkout, with LAB_ARGS for a free port
and a token), in its own process group, shared with tests/test_browser.py (one start per session). The tests read its REST API, start the registered kernel,
check that the checkout's `git status` is what it was, that the git filter `make lab` installs
keeps a notebook saved with outputs out of `git diff`, that a notebook run and saved through
`make lab SMOKE=1` (its kernel and its contents API, on a copy of the notebook) leaves `git status`
clean, and that stopping it frees the port.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
from pathlib import Path

import pytest
from lab_server import REPO, LabServer, port_is_free

pytestmark = pytest.mark.slow

NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))


def _git(*args: str, cwd: Path = REPO, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def _in_git_checkout() -> bool:
    return shutil.which("git") is not None and (REPO / ".git").exists()


@pytest.fixture
def lab(shared_lab):
    """The `make lab` this session shares with tests/test_browser.py (conftest.py's
    shared_lab), running: test_stop_frees_the_port stops it."""
    return shared_lab.running()


def test_answers_on_localhost_only_with_the_token(lab):
    assert lab.get("/api/status")["kernels"] == 0
    with pytest.raises(urllib.error.HTTPError) as denied:
        lab.get("/api/contents/", token=False)
    assert denied.value.code == 403
    print(f"`make lab` answered after {lab.answered_after_s:.1f} s")


def test_contents_lists_every_notebook(lab):
    listing = {item["name"]: item["type"] for item in lab.get("/api/contents/")["content"]}
    assert NOTEBOOKS, "no notebooks/*.ipynb in the checkout"
    missing = [name for name in NOTEBOOKS if listing.get(name) != "notebook"]
    assert not missing, f"not listed as notebooks: {missing} (listing: {listing})"
    model = lab.get(f"/api/contents/{NOTEBOOKS[0]}")
    assert model["type"] == "notebook" and model["content"]["cells"]


def test_cubicml_lab_kernel_is_registered_and_imports_this_checkout(lab):
    BlockingKernelClient = pytest.importorskip("jupyter_client").BlockingKernelClient
    specs = lab.get("/api/kernelspecs")["kernelspecs"]
    assert "cubicml-lab" in specs, f"kernels: {sorted(specs)}"
    spec = specs["cubicml-lab"]["spec"]
    assert spec["display_name"] == "Python (cubicml-lab)"
    assert Path(spec["argv"][0]).parent.resolve() == (REPO / ".venv" / "bin").resolve()
    kernel = lab.request("POST", "/api/kernels", {"name": "cubicml-lab"})
    client = BlockingKernelClient()
    try:
        runtime = Path(lab.env["JUPYTER_RUNTIME_DIR"])
        client.load_connection_file(runtime / f"kernel-{kernel['id']}.json")
        client.start_channels()
        client.wait_for_ready(timeout=120)
        printed: list[str] = []

        def on_output(msg: dict) -> None:
            printed.append(msg["content"].get("text", ""))

        code = "import sys, cubicml_lab\nprint(sys.prefix, cubicml_lab.__file__, sep='\\n')"
        reply = client.execute_interactive(code, timeout=120, output_hook=on_output)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        lab.request("DELETE", f"/api/kernels/{kernel['id']}")
    prefix, package = "".join(printed).strip().splitlines()
    assert Path(prefix).resolve() == (REPO / ".venv").resolve()
    assert Path(package).resolve().is_relative_to(REPO.resolve()), package


def test_checkout_stays_clean(lab):
    if lab.status_before is None:
        pytest.skip("not a git checkout")
    assert _git("status", "--porcelain").stdout == lab.status_before
    assert _git("check-attr", "filter", "diff", "--", "notebooks/x.ipynb").stdout.split("\n")[:2] \
        == ["notebooks/x.ipynb: filter: nbstripout", "notebooks/x.ipynb: diff: ipynb"]


def _saved_in_jupyterlab(nb: dict, edit: str | None = None) -> dict:
    """What JupyterLab writes after running a notebook: outputs, counts, kernel and widget state."""
    nb = json.loads(json.dumps(nb))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for count, cell in enumerate(code, 1):
        cell["execution_count"] = count
        cell["metadata"]["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00.000000Z"}
        cell["outputs"] = [
            {"output_type": "stream", "name": "stdout", "text": ["tokens_per_s 1234.5\n"]},
            {"output_type": "display_data", "metadata": {},
             "data": {"image/png": "iVBORw0KGgo=", "text/plain": ["<Figure size 640x480>"]}}]
    if edit is not None:
        code[0]["source"] = [edit + "\n"] + code[0]["source"]
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return nb


def test_git_filter_keeps_outputs_out_of_git(lab, tmp_path):
    if not _in_git_checkout():
        pytest.skip("not a git checkout")
    filters = _git("config", "--get-regexp", r"^(filter\.nbstripout|diff\.ipynb)\.").stdout
    assert "nbstripout" in filters, "`make lab` did not install the nbstripout git filter"
    repo = tmp_path / "clone"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    for line in filters.splitlines():
        key, value = line.split(" ", 1)
        _git("config", key, value, cwd=repo)
    shutil.copy(REPO / ".gitattributes", repo / ".gitattributes")
    nb_path = repo / NOTEBOOKS[0]
    shutil.copy(REPO / "notebooks" / NOTEBOOKS[0], nb_path)
    _git("add", "-A", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "stripped", cwd=repo)
    stripped = json.loads(nb_path.read_text())

    nb_path.write_text(json.dumps(_saved_in_jupyterlab(stripped), indent=1) + "\n")
    assert _git("diff", "--exit-code", cwd=repo, check=False).returncode == 0
    _git("add", "-A", cwd=repo)
    assert _git("diff", "--cached", "--exit-code", cwd=repo, check=False).returncode == 0
    assert _git("status", "--porcelain", cwd=repo).stdout == ""

    edit = "# edited in JupyterLab"
    nb_path.write_text(json.dumps(_saved_in_jupyterlab(stripped, edit), indent=1) + "\n")
    diff = _git("diff", cwd=repo).stdout
    added = [ln for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) == 1 and edit in added[0], diff


def _copy_of_the_notebook(repo: Path, name: str) -> None:
    """This checkout's notebook ``name``, its .py twin, notebooks/jupytext.toml, .gitattributes
    and .gitignore as they are now, in ``repo`` (the other notebooks would only give the git
    filter, a Python process per file, more to clean)."""
    (repo / "notebooks").mkdir(parents=True)
    for dotfile in (".gitattributes", ".gitignore"):
        shutil.copy(REPO / dotfile, repo / dotfile)
    for path in (REPO / "notebooks").iterdir():
        if path.suffix == ".toml" or path.stem == Path(name).stem:
            shutil.copy(path, repo / "notebooks" / path.name)


def _commit_through_the_filter(repo: Path) -> None:
    """Make ``repo`` a git repository with the git filter `make lab` installed in this
    checkout, and commit what it holds through it."""
    _git("init", "-q", cwd=repo)
    filters = _git("config", "--get-regexp", r"^(filter\.nbstripout|diff\.ipynb)\.").stdout
    assert "nbstripout" in filters, "`make lab` did not install the nbstripout git filter"
    for line in filters.splitlines():
        key, value = line.split(" ", 1)
        _git("config", key, value, cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "notebooks", cwd=repo)


def _run_cells(server: LabServer, nb: dict, kernel_id: str) -> None:
    """Run every code cell of ``nb`` in the kernel, as JupyterLab does: outputs, counts and
    the kernel's language_info land in ``nb``; an error output fails with its traceback."""
    from jupyter_client import BlockingKernelClient
    from nbformat.v4 import output_from_msg

    client = BlockingKernelClient()
    client.load_connection_file(Path(server.env["JUPYTER_RUNTIME_DIR"])
                                / f"kernel-{kernel_id}.json")
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        nb["metadata"]["language_info"] = client.kernel_info(reply=True, timeout=60)[
            "content"]["language_info"]
        for count, cell in enumerate((c for c in nb["cells"] if c["cell_type"] == "code"), 1):
            outputs: list[dict] = []

            def keep(msg: dict, outputs: list[dict] = outputs) -> None:
                if msg["msg_type"] in ("stream", "display_data", "execute_result", "error"):
                    outputs.append(output_from_msg(msg))

            source = "".join(cell["source"]) if isinstance(cell["source"], list) \
                else cell["source"]
            reply = client.execute_interactive(source, timeout=600, output_hook=keep)
            cell["outputs"], cell["execution_count"] = outputs, count
            errors = [o for o in outputs if o["output_type"] == "error"]
            assert reply["content"]["status"] == "ok" and not errors, \
                "\n".join(errors[0]["traceback"]) if errors else reply["content"]
    finally:
        client.stop_channels()


@pytest.mark.notebook
def test_a_notebook_run_and_saved_in_jupyterlab_leaves_git_status_clean(tmp_path):
    """The README's promise: run a notebook in `make lab SMOKE=1` and save it (JupyterLab
    writes the .ipynb with outputs and jupytext its .py twin), and `git status` shows nothing.
    01 (a few seconds of cells, outputs that change the file's size, a file under runs/) shows
    it as well as 00 did in a tenth of the time; the browser test runs 00 and 04."""
    pytest.importorskip("jupyterlab", reason="JupyterLab is not installed: `make install`")
    if shutil.which("make") is None or not _in_git_checkout():
        pytest.skip("needs make and a git checkout")
    name = "01_define_space.ipynb"
    _copy_of_the_notebook(tmp_path / "repo", name)
    server = LabServer(tmp_path / "lab.log", env={
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "CUBICML_LAB_RUNS": None,
        "CUBICML_LAB_SMOKE": None, "MPLBACKEND": None}, make_vars=("SMOKE=1",),
        extra_args=(f"--ServerApp.root_dir={tmp_path / 'repo' / 'notebooks'}",))
    with server:  # `make lab` first: it installs the git filter the copy is committed with
        _commit_through_the_filter(tmp_path / "repo")
        model = server.get(f"/api/contents/{name}")
        nb = model["content"]
        session = server.request("POST", "/api/sessions", {
            "path": name, "name": name, "type": "notebook",
            "kernel": {"name": nb["metadata"]["kernelspec"]["name"]}})
        try:
            _run_cells(server, nb, session["kernel"]["id"])
            server.request("PUT", f"/api/contents/{name}",
                           {"type": "notebook", "format": "json", "content": nb})
        finally:
            server.request("DELETE", f"/api/sessions/{session['id']}")
        assert "smoke mode" in server.log_tail(10**6)  # `make lab SMOKE=1` said so at start
    saved = json.loads((tmp_path / "repo" / "notebooks" / name).read_text())
    printed = "".join("".join(o.get("text", "")) for c in saved["cells"]
                      for o in c.get("outputs", []))
    assert "SMOKE RUN" in printed  # `make lab SMOKE=1` reached the kernel
    assert any((tmp_path / "repo" / "runs").iterdir()), "the notebook wrote nothing to runs/"
    status = _git("status", "--porcelain", "--untracked-files=all", cwd=tmp_path / "repo")
    assert status.stdout == "", (status.stdout + _git(
        "diff", "--", "notebooks", cwd=tmp_path / "repo").stdout[:3000])


def test_the_save_hook_refreshes_only_a_notebook_whose_filtered_content_is_unchanged(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    from cubicml_lab.lab import refresh_git_index

    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    _git("config", "filter.strip.clean", "grep -v '^output'", cwd=repo)  # nbstripout's role
    (repo / ".gitattributes").write_text("*.ipynb filter=strip\n")
    nb = repo / "a.ipynb"
    nb.write_text("cell 1\n")
    _git("add", "-A", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a", cwd=repo)

    nb.write_text("cell 1\noutput: 1234.5 tokens/s\n")  # saved with an output: a new size
    assert _git("status", "--porcelain", cwd=repo).stdout == " M a.ipynb\n"  # git's shortcut
    assert refresh_git_index(os_path=str(nb), model={}, contents_manager=None)
    assert _git("status", "--porcelain", cwd=repo).stdout == ""
    assert _git("diff", "--cached", "--quiet", cwd=repo, check=False).returncode == 0

    nb.write_text("cell 1 edited\noutput: 1234.5 tokens/s\n")  # an edit stays for git to show
    assert not refresh_git_index(os_path=str(nb))
    assert _git("status", "--porcelain", cwd=repo).stdout == " M a.ipynb\n"
    assert not refresh_git_index(os_path=str(tmp_path / "elsewhere.ipynb"))  # untracked, no repo


def test_stop_frees_the_port(lab):
    port = lab.port
    lab.stop()
    assert not lab.group_alive(), "a process of `make lab` outlived the stop"
    assert port_is_free(port)
