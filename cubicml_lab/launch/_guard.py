"""The guard: the process between a launcher and its trial, so that a trial dies with its campaign.

:class:`~cubicml_lab.launch.Subprocess` starts this file as a script (``python -I -S _guard.py
--parent PID --dir DIR -- CMD...``), in a new session, so it leads the trial's process group. It
imports only the standard library (``-I -S``: no site packages, no ``PYTHON*`` variables), so it
starts in about 20 ms. It speaks one line at a time with the launcher on its stdin and stdout:

1. It asks for ``SIGUSR1`` when its parent dies (``PR_SET_PDEATHSIG``, Linux), checks that its
   parent is still ``PID``, creates ``DIR`` (the trial's folder, which must not exist yet) and
   says ``ready``.
2. It waits for ``go`` (the launcher has written the spec and recorded the trial as running);
   end of input instead means "do not run it": it removes ``DIR`` and exits.
3. It starts ``CMD`` in its own (the guard's) process group, on Linux with the kernel's
   address-layout randomisation off unless ``CUBICML_LAB_ADDRESS_LAYOUT=randomized`` (what
   :func:`cubicml_lab.launch.worker.fix_address_layout` would otherwise do by executing the
   trial a second time), with stdout and stderr to
   ``DIR/stdout.txt`` and ``DIR/stderr.txt`` and ``CUBICML_LAB_GUARD_PID`` set to the guard's
   pid, and says ``started <pid of CMD>``, or ``error <why>`` when ``CMD`` cannot be started.
4. It waits for ``CMD``, says ``exited <code>`` (negative: killed by that signal) and waits for
   the end of its input: the launcher reads the results in ``DIR`` first, then closes it.

At the end of its input, whether the launcher closed it (done) or died (at any moment; the
parent-death signal and a changed parent pid, checked every half second, are the fallbacks where
another process holds the pipe), the guard kills ``CMD`` if it still runs, removes ``DIR`` and
kills what is left of its process group, itself included: the folder is created and removed by
the same process, which lives exactly as long as it is needed. The signal is only a wake-up: a
parent *thread* that ends (the signal fires then too) leaves the trial running. ``SIGTERM`` from
the launcher's timeout reaches the whole group; the guard ignores it and reports the trial's end.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time

PARENT_DEATH_SIGNAL = signal.SIGUSR1
_POLL_S = 0.5


class _ParentGone(Exception):
    """The launcher is done with the trial, or its process died: end the trial, clean up."""


def _request_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(PARENT_DEATH_SIGNAL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # the stdin and parent-pid checks still catch it


def no_layout_randomization() -> bool:
    """Set ``ADDR_NO_RANDOMIZE`` in this process's personality, which a program it executes
    inherits (see the module doc); False where nothing was set: not Linux,
    ``CUBICML_LAB_ADDRESS_LAYOUT=randomized``, or a kernel that refuses it (the trial then
    runs randomised). Standard library only, so that the worker shares it
    (:func:`cubicml_lab.launch.worker.fix_address_layout`)."""
    if not sys.platform.startswith("linux") or \
            os.environ.get("CUBICML_LAB_ADDRESS_LAYOUT") == "randomized":
        return False
    import ctypes

    try:
        personality = ctypes.CDLL(None, use_errno=True).personality
        persona = personality(0xFFFFFFFF)  # asks, changes nothing
        return persona != -1 and personality(persona | 0x0040000) != -1  # ADDR_NO_RANDOMIZE
    except (OSError, AttributeError):
        return False


def _say(line: str) -> None:
    try:
        os.write(1, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
    except OSError:
        raise _ParentGone from None


class _Guard:
    def __init__(self, parent: int, folder: str, cmd: list[str]) -> None:
        self.parent, self.folder, self.cmd = parent, folder, cmd
        self.child: subprocess.Popen[bytes] | None = None
        self.child_done = False
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGCHLD, PARENT_DEATH_SIGNAL, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)  # wake select(); the loop below decides
        self.stdin_open = True

    def _check_parent(self) -> None:
        if os.getppid() != self.parent:
            raise _ParentGone

    def _wait(self, timeout: float) -> str:
        """Wait for a line on stdin (returned) or a signal (``""``); raise if the parent died."""
        self._check_parent()
        fds = [self.wake_r] + ([0] if self.stdin_open else [])
        ready, _, _ = select.select(fds, [], [], timeout)
        if self.wake_r in ready:
            while True:
                try:
                    if not os.read(self.wake_r, 512):
                        break
                except BlockingIOError:
                    break
        if 0 in ready:
            line = os.read(0, 64)
            if not line:  # end of input: the launcher closed it or died
                self.stdin_open = False
                raise _ParentGone
            return line.decode("ascii", "replace").strip()
        self._check_parent()
        return ""

    def run(self) -> None:
        """The protocol; it ends in :class:`_ParentGone` (done, or orphaned)."""
        _request_parent_death_signal()
        self._check_parent()
        os.mkdir(self.folder, 0o700)
        _say("ready")
        while self._wait(_POLL_S) != "go":
            pass
        no_layout_randomization()
        with (open(os.path.join(self.folder, "stdout.txt"), "wb") as out,
              open(os.path.join(self.folder, "stderr.txt"), "wb") as err):
            try:
                self.child = subprocess.Popen(
                    self.cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    env={**os.environ, "CUBICML_LAB_GUARD_PID": str(os.getpid())})
            except OSError as exc:
                _say(f"error {exc}")
                self.child_done = True
        if self.child is not None:
            self._watch_trial()
        while True:  # until the launcher has read the results and closes our stdin
            self._wait(_POLL_S)

    def _watch_trial(self) -> None:
        """Wait for the trial (or the parent's death) and report how it ended."""
        assert self.child is not None
        _say(f"started {self.child.pid}")
        while True:
            pid, status = os.waitpid(self.child.pid, os.WNOHANG)
            if pid:
                break
            self._wait(_POLL_S)
        self.child_done = True
        _say(f"exited {os.waitstatus_to_exitcode(status)}")

    def clean_up(self) -> None:
        """Done or orphaned: kill the trial, remove its folder, then kill the rest of the group."""
        if self.child is not None and not self.child_done:
            try:
                os.kill(self.child.pid, signal.SIGKILL)
                os.waitpid(self.child.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        deadline = time.monotonic() + 10
        while os.path.lexists(self.folder) and time.monotonic() < deadline:
            shutil.rmtree(self.folder, ignore_errors=True)  # again if a worker just wrote in it
            if os.path.lexists(self.folder):
                time.sleep(0.05)
        if os.getpgid(0) == os.getpid():  # never the launcher's group, only the trial's own
            os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    try:
        split = argv.index("--")
        opts, cmd = argv[:split], argv[split + 1:]
        parent = int(opts[opts.index("--parent") + 1])
        folder = opts[opts.index("--dir") + 1]
    except (ValueError, IndexError):
        print("usage: _guard.py --parent PID --dir DIR -- CMD...", file=sys.stderr)
        return 2
    if not cmd:
        print("_guard.py: no command after --", file=sys.stderr)
        return 2
    guard = _Guard(parent, folder, cmd)
    try:
        guard.run()
    except _ParentGone:  # the launcher is done, or dead
        guard.clean_up()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
