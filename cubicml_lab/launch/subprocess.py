"""Run each trial in a fresh Python interpreter, with a timeout and an optional memory limit.

:class:`Subprocess` starts
``python -m cubicml_lab.launch.worker --spec SPEC.json --result RESULT.json``
in a new process session for every trial, waits for it, and reads the result back. What this buys
over :class:`~cubicml_lab.launch.InProcess`:

* **Honest peak memory**: each trial starts from a clean process, so ``peak_mem_gib`` (resident
  set high-water mark on CPU) belongs to that trial alone.
* **Timeouts**: after ``timeout_s`` the trial's whole process group gets ``SIGTERM``, then
  ``SIGKILL`` after a grace period; the result has status ``"timeout"``. Descendants that stay in
  the group (workers, helpers) die with it; a descendant that starts its own session escapes.
* **Crash isolation**: a non-zero exit, a signal (segfault, OOM killer) or a missing result is a
  ``"failed"`` result carrying the exit code or signal name and the last lines of stderr.
* **Dies with its caller**: the trial runs under a small guard process (see
  :mod:`cubicml_lab.launch.guarded`) that leads its process group, creates and removes its
  folder, and ends the whole group the moment the calling process dies, however it dies
  (SIGKILL included; ``PR_SET_PDEATHSIG`` and the end of a pipe tell it). The trial process
  itself asks for ``SIGKILL`` when its guard dies. A killed campaign leaves no trial running and
  no folder behind; ``run(spec, on_start=...)`` hands the caller the record of the trial process
  (pid and start time), which a campaign stores so that a later one can end a trial whose guard
  was killed too (:func:`~cubicml_lab.launch.process.end_trial_process`).
* **Memory limit**: ``memory_limit_gib`` caps the trial's *virtual address space*
  (``RLIMIT_AS``), set by the trial process before it imports torch. A trial that exceeds it comes
  back as ``"oom"``. RLIMIT_AS counts reserved, not resident, memory, and torch reserves a lot:
  importing torch alone needs the better part of a GiB of address space (find the floor on a
  machine by running ``Subprocess(memory_limit_gib=x)`` on a tiny config for rising x); below
  it OpenBLAS aborts at import, which is reported as ``"oom"`` too. The floor grows with the thread count (per-thread BLAS buffers, stacks and
  malloc arenas), so give at least 2 GiB plus what the config needs.

Cost: an interpreter start per trial: importing torch, and the first ``torch.optim`` optimizer
loading ``torch._dynamo``, take seconds that an in-process trial does not pay (the figures are on
the results page in ``docs/``). The
child's stdout and stderr go to files in its folder (``cubicml-trial-<owner pid>-...`` in the temp
directory), never to the console, and the folder is removed when the trial is done.

The child imports the same ``cubicml_lab`` as the caller: when the package is a source checkout,
its parent directory is put first on the child's ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._bounds import check_word
from .._params import brief
from ..errors import ConfigError, MeasurementError
from .base import Launcher, check_spec
from .guarded import GuardedProcess
from .process import new_trial_dir

if TYPE_CHECKING:
    from ..trials import TrialResult

__all__ = ["Subprocess", "check_env", "check_python", "log_tail"]

_TERM_GRACE_S = 5.0  # seconds between SIGTERM and SIGKILL on a timeout
_RESULT_GRACE_S = 15.0  # seconds a job may take to exit once a result is written
_STDERR_TAIL_LINES = 40
_MEMORY_WORDS = re.compile(
    r"MemoryError|can.?t allocate memory|cannot allocate memory|out of memory|bad_alloc|"
    r"memory allocation|failed to map segment",
    re.IGNORECASE,
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding cubicml_lab/


def check_python(owner: str, python: Any) -> str | None:
    """``python`` (an interpreter path, or None for the one running this code) as a str with no
    control character; ``owner`` names the launcher in the message."""
    if python is None:
        return None
    path = os.fspath(python) if isinstance(python, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{owner} python = {brief(python)} is not a path",
                          hint="pass the path of a Python executable, or leave it out")
    return check_word(f"{owner} python", path, error=ConfigError,
                      hint="pass the path of a Python executable, or leave it out")


def check_env(owner: str, env: Any) -> dict[str, str]:
    """``env`` as a dict of variable names (letters, digits, ``_``) to values with no control
    character; ``owner`` names the launcher in the message."""
    env = {} if env is None else env
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigError(f"{owner} env must map str to str, got {brief(env)}",
                          hint='write every value as a string, e.g. {"OMP_NUM_THREADS": "2"}')
    for key, value in env.items():
        if not _ENV_NAME.fullmatch(key):
            raise ConfigError(f"{owner} env: {brief(key)} is not a variable name",
                              hint="names are letters, digits and _, not starting with a digit")
        check_word(f"{owner} env[{key!r}]", value, error=ConfigError)
    return dict(env)


def _positive(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"Subprocess {name} must be a number, got {type(value).__name__} {brief(value)}",
            hint=f"pass {name} in its unit, e.g. {name}=60",
        )
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"Subprocess {name} = {brief(value)} must be finite and > 0",
            hint=f"pass a positive {name}",
        )
    return float(value)


class Subprocess(Launcher):
    """Run each trial in a fresh interpreter: isolated memory, a timeout, an optional memory cap.

    Args:
        timeout_s: Wall-clock limit per trial in seconds, from start to exit, interpreter start
            and torch import included, a wait for idle cores (the measure option
            ``wait_for_idle_s``) not.
        memory_limit_gib: Cap on the trial's virtual address space in GiB (``RLIMIT_AS``);
            ``None`` for no cap. Must exceed the torch import floor (see the module docstring).
        python: Interpreter to run the trial with; default: the one running this code.
        env: Extra environment variables for the trial, set on top of this process's environment
            (e.g. ``{"OMP_NUM_THREADS": "2"}``).

    Raises:
        ConfigError: An option is out of range or of the wrong type; the message names it.

    Example:
        >>> Subprocess(timeout_s=60, memory_limit_gib=4).describe()["memory_limit_gib"]
        4.0
    """

    def __init__(
        self,
        timeout_s: float = 600,
        memory_limit_gib: float | None = None,
        python: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.timeout_s = _positive("timeout_s", timeout_s)
        self.memory_limit_gib = (
            None if memory_limit_gib is None else _positive("memory_limit_gib", memory_limit_gib)
        )
        self.python = check_python(type(self).__name__, python)
        self.env = check_env(type(self).__name__, env)
        self._live: set[int] = set()  # process-group ids of the trials running now
        self._live_lock = threading.Lock()

    def cancel(self) -> int:
        """Kill every trial this launcher is running now (their whole process groups).

        The threads blocked in :meth:`run` then return at once with a ``failed`` result; a
        campaign interrupted by the user calls this and re-queues those trials.

        Returns:
            The number of trials killed.
        """
        with self._live_lock:  # held while signalling: no group is reaped (its id freed) meanwhile
            for pgid in self._live:
                _signal_group(pgid, signal.SIGKILL)
            return len(self._live)

    def describe(self) -> dict[str, Any]:
        """Return the launcher kind and its options as plain JSON."""
        return {
            "kind": "subprocess",
            "timeout_s": self.timeout_s,
            "memory_limit_gib": self.memory_limit_gib,
            "python": self.python,
            "env": dict(self.env),
        }

    def command(self, spec_path: str, result_path: str) -> list[str]:
        """Return the argument list that runs one trial (never run through a shell)."""
        cmd = [self.python or sys.executable, "-m", "cubicml_lab.launch.worker"]
        cmd += ["--spec", spec_path, "--result", result_path]
        if self.memory_limit_gib is not None:
            cmd += ["--memory-limit-gib", repr(self.memory_limit_gib)]
        return cmd

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if _PACKAGE_ROOT.name not in ("site-packages", "dist-packages"):
            root = str(_PACKAGE_ROOT)
            rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
            env["PYTHONPATH"] = os.pathsep.join([root, *rest])
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash prints a Python traceback
        env.update(self.env)
        return env

    def run(self, spec: dict[str, Any], *,
            on_start: Callable[[dict[str, Any]], None] | None = None) -> TrialResult:
        """Run one trial in a fresh interpreter and block until it exits or times out.

        Args:
            spec: The trial spec (see :mod:`cubicml_lab.launch.base`).
            on_start: Called with the trial process's record (see
                :func:`~cubicml_lab.launch.process.trial_record`) once its guard is up and
                before the trial runs; if it raises, the trial never runs and the error
                propagates.

        Returns:
            The child's result when it wrote one (even if it was then slow to exit); otherwise a
            ``"timeout"``, ``"oom"`` or ``"failed"`` result built here, with ``wall_s`` the
            seconds from start to exit and ``error`` saying what happened and ending with the
            last lines of the child's stderr.

        Raises:
            ConfigError: The spec is malformed.
            LaunchError: The interpreter could not be started (missing, not executable).
        """
        spec = check_spec(spec)
        folder = new_trial_dir()
        result_path = os.path.join(folder, "result.json")
        # a user's command runs in one trial process, which starts the job (under torchrun
        # for Torchrun: see launch.job)
        command = Subprocess.command if spec.get("command") is not None else type(self).command
        cmd = command(self, os.path.join(folder, "spec.json"), result_path)
        start = time.perf_counter()
        try:
            job = GuardedProcess(cmd, folder, self._child_env())
            with self._live_lock:
                self._live.add(job.pid)
            try:
                job.hand_over(json.dumps(spec), on_start)
                timed_out = self._wait_trial(job, folder, _idle_allowance_s(spec))
                wall_s = time.perf_counter() - start
                code = job.exit_code if job.exit_code is not None else job.guard_status()
                return self._collect(spec, code, timed_out, wall_s, result_path,
                                     os.path.join(folder, "stderr.txt"))
            finally:  # the guard removes the folder and kills what is left of the group
                job.stop()
                with self._live_lock:  # before the reap frees the group id
                    self._live.discard(job.pid)
                job.reap()
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # if the guard could not

    def _wait_trial(self, job: GuardedProcess, folder: str, allowance_s: float = 0.0) -> bool:
        """Wait for the trial to end, enforcing the timeout (plus ``allowance_s``, the trial's
        wait for idle cores); True if it timed out."""
        outcome = job.wait(self.timeout_s + allowance_s, lambda: _results_in(folder))
        if outcome == "result":  # a result is written: give the rest a moment to exit
            if job.wait(_RESULT_GRACE_S) == "timeout":
                job.signal(signal.SIGTERM)
                job.wait(_TERM_GRACE_S)
            return False
        if outcome == "timeout":
            job.signal(signal.SIGTERM)
            job.wait(_TERM_GRACE_S)
            return True
        return False

    def _collect(
        self,
        spec: dict[str, Any],
        returncode: int | None,
        timed_out: bool,
        wall_s: float,
        result_path: str,
        stderr_path: str,
    ) -> TrialResult:
        """Turn what the child left behind into a :class:`TrialResult`."""
        from ..trials import TrialResult

        tail = log_tail(stderr_path, _STDERR_TAIL_LINES)
        written = _results_in(os.path.dirname(result_path))
        if written:
            try:
                by_rank = {rank: TrialResult.from_json(Path(path).read_text(
                    encoding="utf-8", errors="replace")) for rank, path in written.items()}
            except (ValueError, TypeError, KeyError, MeasurementError) as exc:
                return self._failure(
                    spec, "failed", wall_s, f"the trial's result file is not valid JSON for a "
                    f"TrialResult ({type(exc).__name__}: {exc}); exit code {returncode}", tail
                )
            return _merge_ranks(by_rank)
        if timed_out:
            message = (
                f"timed out after {wall_s:.1f} s (timeout_s = {self.timeout_s:g}); "
                "killed the trial's process group"
            )
            return self._failure(spec, "timeout", wall_s, message, tail)
        if returncode is None:
            how = "did not exit"
        elif returncode < 0:
            how = f"killed by signal {_signal_name(-returncode)}"
            if -returncode == signal.SIGKILL:
                how += " (the kernel OOM killer sends SIGKILL when the machine runs out of memory)"
        else:
            how = f"exited with code {returncode}"
        message = f"trial process {how} without writing a result"
        status = "failed"
        if self.memory_limit_gib is not None and _MEMORY_WORDS.search(tail):
            status = "oom"
            message += f" under memory_limit_gib = {self.memory_limit_gib:g}"
        return self._failure(spec, status, wall_s, message, tail)

    def _failure(
        self, spec: dict[str, Any], status: str, wall_s: float, message: str, tail: str
    ) -> TrialResult:
        from ..trials import failure_result

        error = message if not tail else f"{message}\n--- last lines of stderr ---\n{tail}"
        return failure_result(spec, status, error, wall_s=wall_s)


def _idle_allowance_s(spec: dict[str, Any]) -> float:
    """Seconds the trial may wait for idle cores before it starts (its measure option
    ``wait_for_idle_s``, checked by ``MeasureOptions``); they do not count against
    ``timeout_s``."""
    wait = (spec.get("measure") or {}).get("wait_for_idle_s", 0.0)
    return float(wait) if isinstance(wait, (int, float)) and not isinstance(wait, bool) \
        and 0 < wait < math.inf else 0.0


def _results_in(directory: str) -> dict[int, str]:
    """Result files in a trial directory by rank: ``result.json`` (rank 0) and
    ``result.json.rank<N>`` (a failed rank N of a multi-process trial)."""
    found: dict[int, str] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        if name == "result.json":
            found[0] = os.path.join(directory, name)
        elif name.startswith("result.json.rank") and name[16:].isdigit():
            found[int(name[16:])] = os.path.join(directory, name)
    return found


def _merge_ranks(by_rank: dict[int, TrialResult]) -> TrialResult:
    """One result from the ranks that wrote one: an out-of-memory rank's if any (its peers'
    errors are only the consequence), else rank 0's, else the lowest rank's; the other ranks'
    statuses and first error lines are appended to its error."""
    from dataclasses import replace

    oom = sorted(r for r, res in by_rank.items() if res.status == "oom")
    chosen = oom[0] if oom else min(by_rank)
    result = by_rank[chosen]
    others = [f"rank {r}: {res.status}: {(res.error or '').splitlines()[0] if res.error else ''}"
              for r, res in sorted(by_rank.items()) if r != chosen]
    if not others:
        return result
    error = (result.error or "") + "\n--- other ranks ---\n" + "\n".join(others)
    return replace(result, error=error)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to a process group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def log_tail(path: str, lines: int) -> str:
    """Return the last ``lines`` lines of a text file (at most the last 64 KiB are read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").rstrip().splitlines()[-lines:])
