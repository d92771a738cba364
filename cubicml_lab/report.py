"""The reporter a training job calls once per optimizer step, standard library only.

A job that the lab runs as a command (:class:`cubicml_lab.workloads.Command`) finds the path of a
metrics file in the environment variable :data:`ENV_VAR` (``CUBICML_LAB_METRICS``) and appends
one JSON line per event to it; the lab reads the lines, drops the warm-up, and turns the steps into
its usual figures. Outside the lab the variable is unset and every call is a cheap no-op, so a
script keeps these calls and runs as before::

    from cubicml_lab import report

    for batch in loader:
        loss = train_step(batch)                       # one optimizer step
        report.step(tokens=batch.numel(), samples=len(batch), loss=float(loss))
    report.memory()                                    # peak memory, best effort

The lines, one ``write()`` each to a file opened in append mode (so processes of one job, and
the ranks of a torchrun job, can share the file without mixing their lines)::

    {"v": 1, "event": "step", "rank": 0, "t": <time.monotonic()>, "wall": <time.time()>,
     "step": <int or null>, "tokens": <int or null>, "samples": <int or null>,
     "loss": <float or null>, ...extra numeric fields}
    {"v": 1, "event": "memory", "rank": 0, "t": ..., "wall": ..., "peak_gib": <float>}

``rank`` is the environment's ``RANK`` (0 where unset). A non-finite loss is written as JSON's
``NaN`` / ``Infinity`` tokens (Python's :mod:`json` reads them back), so a diverged run shows.

This module imports nothing but the standard library and :mod:`cubicml_lab.errors`: no torch, no
numpy (it looks torch up in ``sys.modules`` only when asked for memory and torch is loaded).

Example:
    >>> import os
    >>> from cubicml_lab import report
    >>> os.environ.pop(report.ENV_VAR, None) and None
    >>> report.active(), report.step(tokens=512, loss=2.5)
    (False, False)
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import types
from typing import Any

from .errors import ConfigError

__all__ = ["ENV_VAR", "VERSION", "Reporter", "active", "current", "memory", "step"]

#: The environment variable holding the metrics file's path.
ENV_VAR = "CUBICML_LAB_METRICS"
#: The version of the line format (the ``"v"`` of every line).
VERSION = 1
_GIB = float(1 << 30)


def _rank() -> int:
    """This process's rank: the environment's ``RANK``, 0 where unset or not an integer."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _count(name: str, value: Any) -> int | None:
    """``value`` as a count (an int >= 0, or None); a float that is a whole number is taken."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"report.step({name}={value!r}): {name} must be a whole number >= 0 "
                          "or None", hint=f"pass {name}=int(...) (e.g. the batch's size)")
    return value


def _number(name: str, value: Any) -> float | int | None:
    """``value`` as a plain number for JSON (a 0-d tensor or numpy scalar through ``float``)."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    try:
        return float(value)  # torch/numpy scalars
    except (TypeError, ValueError):
        raise ConfigError(f"report: {name}={value!r:.80} is not a number",
                          hint="pass numbers only (e.g. loss=loss.item())") from None


def _best_effort_peak_gib() -> float:
    """Peak memory of this process in GiB: CUDA's allocator peak where torch is loaded and CUDA is
    initialised, else the resident high-water mark (``ru_maxrss``: KiB on Linux, bytes on
    macOS)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        return cuda.max_memory_allocated() / _GIB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / _GIB if sys.platform == "darwin" else rss * 1024 / _GIB


class Reporter:
    """Appends a job's step and memory events to one metrics file, a line per event.

    Args:
        path: The metrics file; ``None``: the file named by :data:`ENV_VAR` when it is first used
            (no file named: inactive, every call a no-op).
        rank: The rank written on each line; ``None``: the environment's ``RANK`` (0 if unset).

    Example:
        >>> import tempfile, pathlib, json
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> r = Reporter(path, rank=0)
        >>> r.step(tokens=1024, samples=8, loss=3.1, step=1, lr=1e-3)
        True
        >>> line = json.loads(path.read_text())
        >>> line["event"], line["tokens"], line["lr"]
        ('step', 1024, 0.001)
        >>> r
        <cubicml_lab.report.Reporter: writing to .../metrics.jsonl as rank 0; 1 step reported>
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, rank: int | None = None):
        self._fixed = None if path is None else os.fspath(path)
        self._rank = rank
        self._fd: int | None = None
        self._fd_path: str | None = None
        self._pid = 0
        self.steps = 0  #: step events written by this reporter

    @property
    def path(self) -> str | None:
        """The metrics file written to (``None``: inactive)."""
        return self._fixed if self._fixed is not None else (os.environ.get(ENV_VAR) or None)

    def active(self) -> bool:
        """Whether calls write (a metrics file is named)."""
        return self.path is not None

    def step(self, tokens: int | None = None, samples: int | None = None,
             loss: float | None = None, step: int | None = None, **extra: Any) -> bool:
        """Report one optimizer step, just after it. Returns whether a line was written.

        Args:
            tokens: Tokens the step consumed on this rank (all its micro-batches), or None.
            samples: Samples (sequences, images) the step consumed on this rank, or None.
            loss: The step's loss (a float; a 0-d tensor is read with ``float``), or None.
            step: The trainer's step number, or None.
            **extra: Further numeric fields to record (e.g. ``lr=3e-4``, ``grad_norm=0.9``).

        Raises:
            ConfigError: A count that is not a whole number >= 0, or a field that is not a
                number (checked only while active: a no-op checks nothing).
        """
        if not self.active():
            return False
        fields = {"step": _count("step", step), "tokens": _count("tokens", tokens),
                  "samples": _count("samples", samples), "loss": _number("loss", loss)}
        for key, value in extra.items():
            if key in ("v", "event", "rank", "t", "wall"):
                raise ConfigError(f"report.step({key}=...): {key!r} is a field of every line",
                                  hint="give the extra figure another name")
            fields[key] = _number(key, value)
        self._write("step", fields)
        self.steps += 1
        return True

    def memory(self, peak_gib: float | None = None) -> bool:
        """Report the job's peak memory in GiB (``None``: best effort, see below). Returns whether
        a line was written.

        Best effort: ``torch.cuda.max_memory_allocated()`` where torch is already imported and
        CUDA initialised, else this process's resident high-water mark (``ru_maxrss``).
        """
        if not self.active():
            return False
        value = _best_effort_peak_gib() if peak_gib is None else _number("peak_gib", peak_gib)
        self._write("memory", {"peak_gib": value})
        return True

    def _write(self, event: str, fields: dict[str, Any]) -> None:
        line = {"v": VERSION, "event": event,
                "rank": self._rank if self._rank is not None else _rank(),
                "t": time.monotonic(), "wall": time.time(), **fields}
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        os.write(self._file(), data)  # one write to an O_APPEND file: lines never interleave

    def _file(self) -> int:
        """The open file descriptor of :attr:`path` (reopened when the path changes, or in a
        forked child, which must not share the parent's descriptor bookkeeping)."""
        path = self.path
        if self._fd is None or path != self._fd_path or self._pid != os.getpid():
            self.close()
            assert path is not None
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._fd_path, self._pid = path, os.getpid()
        return self._fd

    def close(self) -> None:
        """Close the file (a later call opens it again)."""
        if self._fd is not None and self._pid == os.getpid():
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = self._fd_path = None

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        path = self.path
        if path is None:
            return (f"<cubicml_lab.report.Reporter: inactive ({ENV_VAR} is unset): every call "
                    "is a no-op>")
        rank = self._rank if self._rank is not None else _rank()
        return (f"<cubicml_lab.report.Reporter: writing to {path} as rank {rank}; "
                f"{self.steps} step{'' if self.steps == 1 else 's'} reported>")


_DEFAULT = Reporter()


def current() -> Reporter:
    """The reporter of this process, which :func:`step`, :func:`memory` and :func:`active` use."""
    return _DEFAULT


def step(tokens: int | None = None, samples: int | None = None, loss: float | None = None,
         step: int | None = None, **extra: Any) -> bool:
    """Report one optimizer step to the lab (:meth:`Reporter.step`); a no-op outside it."""
    return _DEFAULT.step(tokens=tokens, samples=samples, loss=loss, step=step, **extra)


def memory(peak_gib: float | None = None) -> bool:
    """Report the job's peak memory in GiB (:meth:`Reporter.memory`); a no-op outside the lab."""
    return _DEFAULT.memory(peak_gib)


def active() -> bool:
    """Whether this process runs under the lab (the metrics file is named)."""
    return _DEFAULT.active()


class _ReportModule(types.ModuleType):
    """The module shows its reporter's state: ``report`` in a notebook says where it writes."""

    def __repr__(self) -> str:
        return repr(_DEFAULT).replace("cubicml_lab.report.Reporter", "cubicml_lab.report", 1)


sys.modules[__name__].__class__ = _ReportModule
