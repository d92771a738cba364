"""Run a trial inside the calling Python process: fast, no isolation.

:class:`InProcess` calls :func:`cubicml_lab.launch.runner.run_trial` directly, so a trial costs only
its own steps (no interpreter start, no torch import after the first trial). The price is that
nothing is isolated:

* Peak memory (``peak_mem_gib`` on CPU) is read from the process's resident-set high-water mark,
  which never goes down. After a large trial, every later trial in the same process reports at
  least that peak. Use :class:`~cubicml_lab.launch.Subprocess` when peak memory matters.
* A trial that hangs hangs the caller (there is no timeout), and a crash in native code (a
  segfault) takes the notebook kernel down with it.
* Thread settings and allocator caches persist from one trial to the next.

This module imports no torch; the workload imports it when the first trial runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import Launcher, check_spec
from .process import trial_record

if TYPE_CHECKING:
    from ..trials import TrialResult

__all__ = ["InProcess"]


class InProcess(Launcher):
    """Run each trial in this process by calling :func:`cubicml_lab.launch.runner.run_trial`.

    Fast and simple, for notebooks and tests. Peak RSS is this process's lifetime high-water
    mark (see the module docstring); there is no timeout and no memory limit.

    Example:
        >>> InProcess().describe()
        {'kind': 'inprocess'}
    """

    def run(self, spec: dict[str, Any], *,
            on_start: Callable[[dict[str, Any]], None] | None = None) -> TrialResult:
        """Run one trial here and return its result (never raises for a failed trial).

        Args:
            spec: The trial spec (see :mod:`cubicml_lab.launch.base`).
            on_start: Called with this process's record before the trial runs (the trial dies
                with its caller by construction).

        Returns:
            What :func:`cubicml_lab.launch.runner.run_trial` measured.

        Raises:
            ConfigError: The spec is malformed.
        """
        from .runner import run_spec  # a user's command, or run_trial

        spec = check_spec(spec)
        if on_start is not None:
            on_start(trial_record())
        return run_spec(spec)

    def describe(self) -> dict[str, Any]:
        """Return ``{"kind": "inprocess"}``."""
        return {"kind": "inprocess"}
