"""`make lab` for the tests: a free port, a token, its own process group, a stop that frees it.

Used by tests/test_lab.py and tests/test_browser.py (and tests/conftest.py asks it whether
the browser test can run, and starts the one server both share: :func:`shared_lab_server`). The
server is started exactly as a person
starts it (`make lab`, with LAB_ARGS for the port and token), so that the tests prove the command
the README documents. Stopping sends SIGTERM to the whole process group (make and jupyter): the
server then shuts its kernels down (they run in sessions of their own, which a SIGKILL of the group
would leave behind); SIGKILL follows only if the group outlives the grace period.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
# JupyterLab settings for the tests' server only: no autosave (a notebook run in the browser
# must not write the checkout's notebook), no news or update prompts over the page.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    # every cell stays in the page (JupyterLab 4 otherwise detaches cells scrolled out of view,
    # and an error below the fold would go unseen)
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def browser_missing() -> str | None:
    """What tests/test_browser.py lacks here, with how to install it; ``None``: it can run."""
    import importlib.util

    if not CHROMIUM.exists():
        return ("needs Debian's chromium at /usr/bin/chromium: apt-get install chromium "
                "(CI installs it in .ci/system-deps)")
    if importlib.util.find_spec("playwright") is None:
        return "needs playwright: pip install playwright (in the dev extra)"
    if importlib.util.find_spec("jupyterlab") is None:
        return "needs JupyterLab: pip install -e '.[notebooks]'"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether nothing accepts connections on 127.0.0.1:``port`` and a server could bind it."""
    with socket.socket() as probe:
        probe.settimeout(1.0)
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tornado binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LabServer:
    """`make lab` on 127.0.0.1 with a token, in its own process group.

    Args:
        log_path: file that receives make's and JupyterLab's output.
        token: the server's token (``--IdentityProvider.token``).
        env: extra environment variables; a value of None removes the variable.
        extra_args: more `jupyter lab` options, appended to LAB_ARGS.
        make_vars: more `make lab` variables, e.g. ``("SMOKE=1",)``.
    """

    def __init__(self, log_path: Path, token: str = "cubicml-lab-test", *,
                 env: dict[str, str | None] | None = None, extra_args: tuple[str, ...] = (),
                 make_vars: tuple[str, ...] = ()):
        self.log_path, self.token, self.extra_args = Path(log_path), token, extra_args
        self.make_vars = make_vars
        self.env = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                self.env.pop(key, None)
            else:
                self.env[key] = value
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.answered_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lab_args(self) -> str:
        args = ["--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
                "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                # no calls to the internet from the server (news feed, update check)
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                *self.extra_args]
        return " ".join(args)

    def start(self, timeout_s: float = 300.0) -> LabServer:
        """Run `make lab`; wait until /api/status answers (else AssertionError with the log)."""
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed when the process ends
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", "lab", f"LAB_ARGS={self.lab_args()}",
             *self.make_vars], cwd=REPO,
            env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"`make lab` exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.get("/api/status")
                self.answered_after_s = time.monotonic() - t0
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"`make lab` did not answer in {timeout_s:.0f} s:\n{self.log_tail()}")

    def request(self, method: str, path: str, body: dict | None = None, *,
                token: bool = True) -> dict | None:
        """Call the server's REST API; the decoded JSON answer (None for an empty one)."""
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"token {self.token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def get(self, path: str, *, token: bool = True) -> dict:
        """GET ``path`` from the server's REST API and decode the JSON answer."""
        return self.request("GET", path, token=token)

    def log_tail(self, n_chars: int = 4000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n_chars:]

    def group_alive(self) -> bool:
        """Whether any process of the server's process group is still running."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the process group, wait for it to go, SIGKILL whatever outlives ``grace_s``."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.proc.poll() is None or self.group_alive()):
            time.sleep(0.2)
        if self.group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def running(self) -> LabServer:
        """The server, started again if a test stopped it (tests/test_lab.py stops it last)."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        return self

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def shared_lab_server(tmp: Path) -> LabServer:
    """The `make lab` that tests/test_lab.py and tests/test_browser.py share (one start, about
    40 s of a busy 2-core machine, instead of one per module): a smoke environment (the browser
    runs notebooks with tiny budgets), runs under ``tmp/runs`` (its ``runs`` attribute),
    test-only settings, and the checkout's ``git status --porcelain`` from before `make lab` ran
    (``status_before``; None outside a git checkout). Not started yet: enter it."""
    import shutil

    for rel, settings in LAB_SETTINGS.items():
        (tmp / "settings" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "settings" / rel).write_text(json.dumps(settings))
    env = {"CUBICML_LAB_SMOKE": "1", "CUBICML_LAB_RUNS": str(tmp / "runs"), "MPLBACKEND": None,
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "PYTHONPATH": os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH")] if p)}
    server = LabServer(tmp / "lab.log", env=env, extra_args=(
        f"--LabApp.user_settings_dir={tmp / 'settings'}", f"--LabApp.workspaces_dir={tmp / 'ws'}"))
    server.runs = tmp / "runs"  # type: ignore[attr-defined]
    in_git = shutil.which("git") is not None and (REPO / ".git").exists()
    server.status_before = subprocess.run(  # type: ignore[attr-defined]
        ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True,
        check=True).stdout if in_git else None
    return server
