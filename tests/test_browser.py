"""JupyterLab in a real browser: `make lab`, open a notebook, Run All, read what a person would see.

Drives Debian's /usr/bin/chromium through the Python `playwright` package (never a downloaded
browser). The server runs with ``CUBICML_LAB_SMOKE=1`` (tiny budgets), writes under a temporary
``CUBICML_LAB_RUNS``, and has autosave off in a temporary settings folder, so that running the
notebook leaves the checkout as it was. Screenshots land in runs/browser/ (git-ignored).
``CUBICML_LAB_BROWSER_NOTEBOOKS=00_quickstart,04_codesign_search`` picks other notebooks.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from lab_server import CHROMIUM, REPO, browser_missing

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = REPO / "runs" / "browser"
NOTEBOOKS = os.environ.get("CUBICML_LAB_BROWSER_NOTEBOOKS", "04_codesign_search").split(",")
WIDGET_NOTEBOOKS = {"04_codesign_search"}  # notebooks that show the CampaignDashboard widget
NO_FIGURE_NOTEBOOKS = {"01_define_space"}  # notebooks that draw no figure (nothing is measured)
RUN_TIMEOUT_S = 600.0
# Every code cell's prompt, the kernel status, and what the output areas hold. An output is an
# error when it holds a traceback or a line that starts with an exception's name (SyntaxError
# shows no traceback); every output area is read, whatever its mime type.
STATE_JS = """() => {
  const isError = (t) => /Traceback \\(most recent call last\\)|^\\w*(Error|Exception):/m.test(t);
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const q = (sel) => [...panel.querySelectorAll(sel)];
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {
    kernel: indicator ? indicator.getAttribute('data-status') : null,
    prompts: q('.jp-CodeCell .jp-InputArea-prompt').map(e => e.textContent.trim()),
    tracebacks: q('.jp-OutputArea-output').map(e => e.innerText).filter(isError),
    widget_errors: q('.jp-OutputArea-output').map(e => e.innerText)
      .filter(t => t.includes('Error displaying widget')),
    images: q('.jp-OutputArea-output img').length,
    widgets: q('.jp-OutputArea-output .jupyter-widgets').length,
    dashboards: q('.jp-OutputArea-output .cubicml-dashboard').length,
    dialogs: [...document.querySelectorAll('.jp-Dialog')].map(e => e.innerText),
  };
}"""


# A kernel is attached and idle (the indicator also reads "idle" before any kernel starts).
KERNEL_READY_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const name = panel && panel.querySelector('.jp-KernelName');
  const indicator = panel && panel.querySelector('.jp-Notebook-ExecutionIndicator');
  const kernel = name ? name.textContent.trim() : '';
  return kernel !== '' && kernel !== 'No Kernel' && indicator
    && indicator.getAttribute('data-status') === 'idle';
}"""


def _require_browser():
    missing = browser_missing()
    if missing:
        pytest.skip(missing)


@pytest.fixture(scope="module")
def lab(request):
    """`make lab` with a smoke environment, a temporary runs folder and test-only settings
    (conftest.py's shared_lab, which tests/test_lab.py uses too). The notebooks' kernels are
    shut down after this module, as a person closing them would."""
    _require_browser()
    server = request.getfixturevalue("shared_lab").running()
    yield server
    for session in server.get("/api/sessions"):
        server.request("DELETE", f"/api/sessions/{session['id']}")


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _wait_until_done(page, timeout_s: float) -> dict:
    """Poll until a cell has run, the kernel is idle and no cell is queued or running, twice."""
    deadline, settled, state = time.monotonic() + timeout_s, 0, None
    while time.monotonic() < deadline:
        state = page.evaluate(STATE_JS)
        assert not state["dialogs"], f"JupyterLab shows a dialog: {state['dialogs']}"
        started = any(p != "[ ]:" for p in state["prompts"])
        busy = not started or state["kernel"] != "idle" or "[*]:" in state["prompts"]
        settled = 0 if busy else settled + 1
        if settled >= 2:
            return state
        time.sleep(2.0)
    raise AssertionError(f"the notebook was still running after {timeout_s:.0f} s: {state}")


# The notebook's own scroller: JupyterLab scrolls inside it, never the page.
SCROLLER = "document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')"


# The window height that shows every cell: the page around the scroller plus the cells' height.
WINDOW_HEIGHT_JS = f"""() => {{
  const s = {SCROLLER}; const cells = s.querySelectorAll('.jp-Cell');
  const box = s.getBoundingClientRect();
  const content = cells[cells.length - 1].getBoundingClientRect().bottom - box.top + s.scrollTop;
  return Math.ceil(box.top + content + (window.innerHeight - box.bottom) + 24);
}}"""


def _screenshot_whole_notebook(page, path: Path) -> None:
    """Grow the window to the notebook's height, scroll it to the top, then shoot."""
    for _ in range(3):  # off-screen cells have estimated heights until they are painted
        height = page.evaluate(WINDOW_HEIGHT_JS)
        page.set_viewport_size({"width": 1400, "height": int(min(max(height, 900), 16000))})
        page.evaluate(f"() => {{ {SCROLLER}.scrollTop = 0; }}")
        page.wait_for_timeout(1000)
    page.screenshot(path=str(path), full_page=True)


def test_launcher_lists_notebooks_and_kernel(lab, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{lab.url}/lab?token={lab.token}")
    page.wait_for_selector(".jp-Launcher", timeout=120_000)
    page.wait_for_selector(".jp-DirListing-item", timeout=60_000)
    listed = page.locator(".jp-DirListing-itemName").all_inner_texts()
    expected = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
    assert set(expected) <= {name.strip() for name in listed}, listed
    assert page.locator(".jp-LauncherCard", has_text="Python (cubicml-lab)").count() >= 1
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "launcher.png"))
    page.close()


@pytest.mark.timeout(int(RUN_TIMEOUT_S) + 300)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_all_cells_in_jupyterlab(lab, browser, name):
    assert (REPO / "notebooks" / f"{name}.ipynb").exists(), f"notebooks/{name}.ipynb missing"
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    # a workspace of its own: the shared one would reopen the notebooks of earlier tests beside it
    page.goto(f"{lab.url}/lab/workspaces/test-{name}/tree/{name}.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
    page.wait_for_function(KERNEL_READY_JS, timeout=180_000)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    state = _wait_until_done(page, RUN_TIMEOUT_S)

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.keyboard.press("Control+b")  # fold the file browser: the notebook gets the width
    _screenshot_whole_notebook(page, SCREENSHOTS / f"{name}.png")
    page.close()

    assert not state["tracebacks"], "error output:\n" + "\n\n".join(state["tracebacks"])
    assert not state["widget_errors"], state["widget_errors"]
    unrun = [i for i, p in enumerate(state["prompts"]) if not p[1:-2].isdigit()]
    assert not unrun, f"code cells {unrun} did not run (prompts {state['prompts']})"
    if name not in NO_FIGURE_NOTEBOOKS:
        assert state["images"] >= 1, "no figure was rendered"
        assert lab.runs.is_dir() and any(lab.runs.iterdir()), "nothing under CUBICML_LAB_RUNS"
    if name in WIDGET_NOTEBOOKS:
        assert state["widgets"] >= 1, "no ipywidget was rendered"
        assert state["dashboards"] >= 1, "the CampaignDashboard (.cubicml-dashboard) is not shown"
