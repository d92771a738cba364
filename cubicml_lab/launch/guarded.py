"""One trial process behind its guard, as a launcher drives it.

:class:`GuardedProcess` starts :mod:`cubicml_lab.launch._guard` (a stdlib-only script) in a new
session and speaks its line protocol: the guard creates the trial's folder and says ``ready``; the
launcher writes the spec, records the trial (``on_start``) and says ``go``; the guard starts the
trial (``started <pid>``), reports its end (``exited <code>``, negative for a signal) and, when
its stdin closes, removes the folder and kills what is left of its process group, itself included.
Closing stdin is also what the death of the launcher's process does, at any moment: so a trial
never outlives its campaign and never leaves its folder behind. See the guard's docstring.

The guard leads the trial's process group and stays unreaped until :meth:`GuardedProcess.reap`,
so the group id cannot be handed to unrelated processes while the launcher may still signal it.

Each guard gets a fresh secret and its owner's identity in its environment
(:func:`~cubicml_lab.launch.process.guard_environment`), and the record handed to ``on_start``
carries the same secret: that is how a later campaign proves a process is one this lab started
before it signals it (:func:`~cubicml_lab.launch.process.end_trial_process`).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import LaunchError
from .process import (guard_environment, hold_token, new_token, process_start,
                      release_token, trial_record)

__all__ = ["GuardedProcess"]

GUARD = str(Path(__file__).resolve().with_name("_guard.py"))
_HANDSHAKE_S = 60.0  # seconds the guard may take to start, or to start the trial
_CLEANUP_S = 10.0  # seconds the guard may take to remove the folder and end its group
_READY_POLL_S = 0.2  # how often a waiting launcher checks ``ready()`` (a result written)


class GuardedProcess:
    """A trial command run by a guard that creates and removes ``folder``.

    Args:
        cmd: The trial's argument list (never run through a shell).
        folder: The trial's folder (must not exist; the guard creates it).
        env: The environment of the guard and the trial.
        cwd: The working directory of the guard and the trial (default: this process's).

    Raises:
        LaunchError: This Python cannot start the guard.
    """

    def __init__(self, cmd: list[str], folder: str, env: dict[str, str],
                 cwd: str | None = None) -> None:
        guard = [sys.executable, "-I", "-S", GUARD, "--parent", str(os.getpid()),
                 "--dir", folder, "--", *cmd]
        self.token = new_token()
        hold_token(self.token)
        try:
            self.proc = subprocess.Popen(guard, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE,
                                         env={**env, **guard_environment(self.token)},
                                         start_new_session=True, bufsize=0, cwd=cwd)
        except OSError as exc:
            release_token(self.token)
            raise LaunchError(f"cannot start the trial guard with {sys.executable!r}: {exc}",
                              hint="this Python must be able to run a script") from exc
        self.cmd, self.folder = cmd, folder
        self.trial: tuple[int, int | None] | None = None  # the trial process: pid, start
        self.exit_code: int | None = None  # the trial's, once the guard reports it
        self._buffer, self._eof = b"", False

    @property
    def pid(self) -> int:
        """The guard's pid, which is also the trial's process-group id."""
        return self.proc.pid

    def _line(self, timeout_s: float) -> str | None:
        """The guard's next line; ``""`` once it closed its stdout, None on timeout."""
        assert self.proc.stdout is not None
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            if self._eof:
                return ""
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 256)
            self._buffer += chunk
            self._eof = not chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode("utf-8", "replace").strip()

    def hand_over(self, spec_json: str,
                  on_start: Callable[[dict[str, Any]], None] | None) -> None:
        """Ready -> write the spec -> ``on_start(record)`` -> go -> started.

        Raises:
            LaunchError: The guard failed, or the trial command could not be started.
            Exception: Whatever ``on_start`` raised (the trial then never runs).
        """
        said = self._line(_HANDSHAKE_S)
        if said != "ready":
            raise self._failed(said)
        Path(self.folder, "spec.json").write_text(spec_json, encoding="utf-8")
        if on_start is not None:
            on_start(trial_record(self.pid, token=self.token))
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"go\n")
        except OSError:
            pass  # the guard is gone: the next line says so
        said = self._line(_HANDSHAKE_S)
        if said is not None and said.startswith("error "):
            raise LaunchError(f"cannot start the trial interpreter python={self.cmd[0]!r}: "
                              f"{said[6:]}",
                              hint="pass python= the path of an executable Python with "
                              "cubicml_lab and torch installed, or leave it out to use this one")
        word, _, pid = (said or "").partition(" ")
        if word != "started" or not pid.isdigit():
            raise self._failed(said)
        self.trial = (int(pid), process_start(int(pid)))

    def wait(self, timeout_s: float, ready: Callable[[], Any] | None = None) -> str:
        """Wait up to ``timeout_s`` for the trial to end (or for ``ready()``).

        Returns:
            ``"exited"`` (:attr:`exit_code` is set), ``"gone"`` (the guard itself died),
            ``"result"`` (``ready()`` was true first) or ``"timeout"``.
        """
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            said = self._line(min(remaining, _READY_POLL_S) if ready is not None else remaining)
            if said == "":
                return "gone"
            if said is not None and said.startswith("exited "):
                self.exit_code = int(said.split()[1])
                return "exited"
            if said is None and ready is not None and ready():
                return "result"
        return "timeout"

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the trial's whole process group (the guard ignores SIGTERM)."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def guard_status(self) -> int | None:
        """The guard's own exit status (negative: a signal) once it is dead, without reaping."""
        if not _exited(self.proc):
            return None
        if hasattr(os, "waitid"):
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                return -info.si_status if info.si_code != os.CLD_EXITED else info.si_status
        return self.proc.poll()

    def stop(self) -> None:
        """Close the guard's stdin: it removes the folder and ends its group; then kill whatever
        is left (a guard that did not finish in time). The guard stays unreaped."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        deadline = time.monotonic() + _CLEANUP_S
        while not _exited(self.proc) and time.monotonic() < deadline:
            time.sleep(0.002)
        self.signal(signal.SIGKILL)
        self.proc.kill()  # in case the group was already gone (the leader left it)

    def reap(self) -> None:
        """Reap the guard, close its pipes, and return once the trial process is gone."""
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        self.proc.wait()
        release_token(self.token)
        if self.trial is not None:
            pid, start = self.trial
            deadline = time.monotonic() + 5.0
            while start is not None and process_start(pid) == start \
                    and time.monotonic() < deadline:
                time.sleep(0.002)

    def _failed(self, said: str | None) -> LaunchError:
        """The guard exited or hung before the trial started: a LaunchError with its words."""
        detail = "it said nothing" if not said else f"it said {said!r}"
        deadline = time.monotonic() + 1.0
        while not _exited(self.proc) and time.monotonic() < deadline:
            time.sleep(0.01)
        if _exited(self.proc) and self.proc.stderr is not None:
            text = self.proc.stderr.read().decode("utf-8", "replace").strip()
            detail += f"; its stderr:\n{text[-2000:]}" if text else ""
        elif said is None:
            detail += f" within {_HANDSHAKE_S:g} s"
        return LaunchError(f"the trial guard ({GUARD}) stopped before the trial started: "
                           f"{detail}", hint="the machine may be overloaded or out of "
                           "processes; retry")


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """True once ``proc`` has exited, *without reaping it* (its pid keeps naming its group)."""
    if proc.returncode is not None:
        return True
    if not hasattr(os, "waitid"):  # macOS: poll() reaps, a small pid-reuse window remains
        return proc.poll() is not None
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None
