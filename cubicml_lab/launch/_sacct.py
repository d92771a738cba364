"""What Slurm tells of a job once it has run: its ``sacct`` lines (state or exit code, by job and
step id), the tails of its logs, and :func:`missed_oom`, which reads them for an out-of-memory
kill that Slurm recorded as ``FAILED``.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["last_stderr", "log_tail", "missed_oom", "sacct_states"]

_TAIL_LINES = 40
# what slurmstepd and srun print when the cgroup's out-of-memory killer ended a task
_OOM_LINE = re.compile(r"oom-kill event|out of memory|exceeded (?:job|step) memory limit",
                       re.IGNORECASE)


def missed_oom(stderr_tail: str, exit_codes: dict[str, str]) -> str | None:
    """Why a job that Slurm recorded as ``FAILED`` was ended by the out-of-memory killer after
    all, or None.

    Slurm's cgroup v1 plugin learns of an OOM kill from an event that races the step's end; when
    it loses, the step is ``FAILED`` and slurmstepd may not print its notice. Two signs remain:
    the notice itself in the job's stderr, and a step killed by ``SIGKILL`` (sacct's ``ExitCode``
    ``exit:signal`` = ``0:9``), which is how the cgroup's killer ends a process. A time limit or
    ``scancel`` also ends with SIGKILL, but Slurm records those as ``TIMEOUT``/``CANCELLED``, and
    the trial never kills itself.

    Args:
        stderr_tail: The last lines of the job's stderr.
        exit_codes: sacct's ``ExitCode`` by job and step id (``{"123": "1:0", "123.0": "0:9"}``).
    """
    for line in stderr_tail.splitlines():
        if _OOM_LINE.search(line):
            return f"its stderr says {line.strip()!r}"
    killed = sorted(jid for jid, code in exit_codes.items()
                    if code.partition(":")[2] == str(int(signal.SIGKILL)))
    if killed:
        return (f"{', '.join(killed)} ended by SIGKILL (sacct ExitCode 0:9), the cgroup "
                "out-of-memory killer's signal")
    return None


def sacct_states(job_id: str, field: str = "State") -> dict[str, str] | None:
    """``{"123": "RUNNING", "123.batch": ..., "123.0": ...}`` from sacct (or another of its
    fields, by job and step id); None if it fails."""
    try:
        out = subprocess.run(["sacct", "-j", job_id, "-n", "-P", "-o", f"JobID,{field}"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        jid, _, state = line.partition("|")
        states[jid.strip()] = (state.split() or [""])[0]  # "CANCELLED by 0" -> "CANCELLED"
    return states


def _last_lines(path: Path) -> str | None:
    """The last :data:`_TAIL_LINES` lines of a log; None where it does not exist."""
    if not path.exists():
        return None
    return "\n".join(path.read_text(errors="replace").splitlines()[-_TAIL_LINES:])


def last_stderr(job: Any) -> str:
    """The last lines of the job's stderr; "" where that log does not exist."""
    return _last_lines(Path(job.paths.stderr)) or ""


def log_tail(job: Any) -> str:
    """The last lines of the job's stderr, then of its stdout."""
    parts = []
    for name in ("stderr", "stdout"):
        path = Path(getattr(job.paths, name))
        lines = _last_lines(path)
        if lines is not None:
            parts.append(f"--- {name} ({path}) ---\n{lines}")
    return "\n".join(parts) or "(no logs)"
