"""Waiting for idle cores before a trial: :func:`wait_for_idle`.

A CPU trial timed while other processes use its cores is flagged ``contended`` by the guard
(:class:`~cubicml_lab.hardware.CpuContention`) and weighs less in the search. Where the other work
comes and goes (a test run, a build, a notebook of a colleague), waiting for it to end before the
trial starts gives clean figures instead. :func:`wait_for_idle` samples how much of this process's
cores other work uses (``/proc/stat``'s per-core lines, less this process's own CPU time) and
returns once a sample finds them idle, or once its time runs out; the trial then runs either way,
and its record says how long it waited and what it found (``MeasureOptions.wait_for_idle_s``).
Importing it imports no torch.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

__all__ = ["IDLE_MAX_OTHERS", "cores_busy_s", "wait_for_idle"]

#: Cores other work may use, on a sample's average, while this process's cores still count as
#: idle: a tenth of a core (a JupyterLab server and its idle kernels stay under it; one CPU-bound
#: process uses a whole core).
IDLE_MAX_OTHERS = 0.1


def _own_cores() -> list[int]:
    """The cores this process may run on (its affinity), else every core."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cores_busy_s(cores: list[int]) -> float | None:
    """CPU seconds the given cores spent busy since boot (``/proc/stat`` per-core lines: user,
    nice, system, irq, softirq and steal), None where unavailable (not Linux)."""
    wanted, total, seen = {f"cpu{c}" for c in cores}, 0, 0
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                fields = line.split()
                if not fields or fields[0].decode() not in wanted:
                    continue
                total += sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8))
                seen += 1
    except (OSError, IndexError, ValueError):
        return None
    tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
    return total / tick if seen else None


def _others_cpu(cores: list[int], sample_s: float) -> float:
    """Cores' worth of CPU that other work used on ``cores`` over the next ``sample_s``."""
    busy0, own0, t0 = cores_busy_s(cores), time.process_time(), time.perf_counter()
    time.sleep(sample_s)
    busy1, own1, t1 = cores_busy_s(cores), time.process_time(), time.perf_counter()
    if busy0 is None or busy1 is None:
        return math.nan
    return max(0.0, busy1 - busy0 - (own1 - own0)) / max(t1 - t0, 1e-9)


def wait_for_idle(timeout_s: float, *, max_others: float = IDLE_MAX_OTHERS,
                  sample_s: float = 1.0,
                  on_sample: Callable[[float, float], None] | None = None) -> dict[str, float]:
    """Wait until other work leaves this process's cores idle, for ``timeout_s`` at most.

    Args:
        timeout_s: Seconds to wait at most (> 0); the wait ends at the first sample past it.
        max_others: Cores' worth of other work a sample may find and still call the cores idle.
        sample_s: Seconds each sample lasts.
        on_sample: Called after each busy sample with ``(seconds waited, others' cores)``, e.g.
            to show a status line.

    Returns:
        ``idle_wait_s`` (seconds waited), ``idle_others_cpu`` (cores other work used in the
        last sample; NaN where ``/proc/stat`` is unavailable, and the wait then ends at once)
        and ``idle_timed_out`` (1.0 when the time ran out with the cores still busy, else 0.0).

    Example:
        >>> record = wait_for_idle(0.2, max_others=math.inf, sample_s=0.05)
        >>> record["idle_timed_out"], record["idle_wait_s"] < 0.2
        (0.0, True)
    """
    cores, t0 = _own_cores(), time.perf_counter()
    while True:
        others = _others_cpu(cores, sample_s)
        waited = time.perf_counter() - t0
        if math.isnan(others) or others <= max_others:
            return {"idle_wait_s": waited, "idle_others_cpu": others, "idle_timed_out": 0.0}
        if waited >= timeout_s:
            return {"idle_wait_s": waited, "idle_others_cpu": others, "idle_timed_out": 1.0}
        if on_sample is not None:
            on_sample(waited, others)
