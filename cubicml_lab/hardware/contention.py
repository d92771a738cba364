"""Is the machine shared, and how fast is it now? :class:`CpuContention` tells whether a timed
window shared its cores with other work; :class:`ReferenceWork` gauges the machine's speed next
to a trial (drift correction), on the scale :func:`reference_nominal` keeps. Importing it imports
no torch.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import MeasurementError
from .cache import cpu_model, locked_json_cache
from .drift import USUAL_MIN, USUAL_MOVED, usual_speed  # re-exported: the gate's usual speed

__all__ = ["DEFAULT_REFERENCE_ROWS", "MAX_CPU_WAIT", "REFERENCE_PRECISIONS", "REFERENCE_ROWS",
           "USUAL_HISTORY", "USUAL_MIN", "USUAL_MOVED", "CpuContention", "ReferenceWork",
           "StepReference", "establish_reference_scale", "mlp_reference_gauges",
           "mlp_reference_name", "reference_nominal", "reference_rows", "reference_usual",
           "usual_speed"]


def _threads_wait_s() -> float | None:
    """Seconds this process's threads spent runnable but waiting for a CPU, summed over its
    threads (Linux ``/proc/self/task/*/schedstat``, second field); None where unavailable."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    total, seen = 0, 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
            seen += 1
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9 if seen else None


def _machine_cpu_s() -> tuple[float, float] | None:
    """CPU seconds all cores spent busy since boot (``/proc/stat``: user, nice, system, irq,
    softirq and steal; 10 ms resolution), and of those, stolen: the time a virtual machine's
    CPUs were ready to run while the hypervisor ran something else; None where unavailable."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()[1:9]
        ticks = [int(fields[i]) for i in (0, 1, 2, 5, 6, 7)]
    except (OSError, IndexError, ValueError):
        return None
    return sum(ticks) / _CLK_TCK, ticks[-1] / _CLK_TCK


_CLK_TCK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
_CPUS = os.cpu_count() or 1  # /proc/stat's first line sums over all of them


#: Default largest ``cpu_wait`` of a clean window (a fraction of the window's wall time). A
#: window's slowdown grows about 3x as fast as its threads' run-queue wait, so 0.02 keeps a
#: clean window within a few percent of the quiet machine, while windows on a quiet machine
#: (waits mostly under 0.005) pass.
MAX_CPU_WAIT = 0.02


class CpuContention:
    """Tells whether a timed window of a CPU trial shared its cores with other work.

    Between :meth:`start` and :meth:`stop` it reads, for the window:

    * ``cpu_wait``: time this process's threads waited, runnable, for a CPU (Linux
      ``schedstat`` run-queue delay, summed over threads) over ``wall x threads``. On an idle
      machine it stays near 0 whatever the trial does; when other processes compete for the
      cores it grows with the share they take (with two CPU-bound competitors on 2 cores and a
      2-thread trial, about 0.5).
    * ``cpu_util``: the process's CPU time over ``wall x threads`` (below 1 when threads wait,
      for a CPU or for each other).
    * ``others_cpu``: CPU the rest of the machine used, in cores (``/proc/stat`` busy time minus
      this process's).
    * ``cpu_steal``: in a virtual machine, the time its CPUs were ready to run while the host
      ran other work (``/proc/stat``'s steal column), over ``wall x`` the machine's CPUs: the
      same kind of wait as ``cpu_wait``, one level down, which the guest's scheduler does not
      see. An idle machine shows 0-1 tick in 200 a second.

    A window is contended when ``cpu_wait > max_wait`` or ``cpu_steal`` (less one 10-ms tick,
    the resolution it is read at) ``> max_wait``; where
    ``schedstat`` is missing, when the others used more than the cores this trial leaves free
    plus ``max_wait x threads``. Where neither can be read (not Linux), no window is ever
    contended.

    Background work is not harmless because it is marked so: on Linux with autogroup
    (``/proc/sys/kernel/sched_autogroup_enabled`` = 1, the default of most distributions) each
    session is scheduled as one group, so ``SCHED_IDLE`` or ``nice 19`` work started from
    another terminal competes with a trial as an equal. Give background work a low group
    priority (``echo 19 > /proc/$$/autogroup`` in the shell that starts it).

    Args:
        threads: Threads the trial computes with (torch's intra-op threads).
        max_wait: Largest ``cpu_wait`` of a clean window (0.02: the threads may have waited
            2% of the window; such a window ran up to about 6% slow, see :data:`MAX_CPU_WAIT`).
        cores: Cores the trial may run on; default: this process's affinity.
    """

    def __init__(self, threads: int, max_wait: float = MAX_CPU_WAIT,
                 cores: int | None = None) -> None:
        self.threads = max(1, int(threads))
        self.max_wait = max_wait
        if cores is None:
            cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else os.cpu_count() or 1)
        self.cores = cores
        self._start: tuple[float, float, float | None, float | None] = (0.0, 0.0, None, None)

    @staticmethod
    def available() -> bool:
        """Whether this platform lets the guard see contention (Linux ``/proc``)."""
        return _threads_wait_s() is not None or _machine_cpu_s() is not None

    def start(self) -> None:
        """Mark the start of a window."""
        self._start = (time.perf_counter(), time.process_time(), _threads_wait_s(),
                       _machine_cpu_s())

    def stop(self) -> tuple[bool, dict[str, float]]:
        """End the window: ``(contended, {"cpu_wait", "cpu_util", "others_cpu",
        "cpu_steal"})``."""
        wall1, cpu1, wait1, mach1 = (time.perf_counter(), time.process_time(),
                                     _threads_wait_s(), _machine_cpu_s())
        wall0, cpu0, wait0, mach0 = self._start
        wall = max(wall1 - wall0, 1e-9)
        own = cpu1 - cpu0
        fig = {"cpu_util": own / (wall * self.threads), "cpu_wait": math.nan,
               "others_cpu": math.nan, "cpu_steal": math.nan}
        if wait0 is not None and wait1 is not None:
            fig["cpu_wait"] = max(0.0, wait1 - wait0) / (wall * self.threads)
        if mach0 is not None and mach1 is not None:
            fig["others_cpu"] = max(0.0, mach1[0] - mach0[0] - own) / wall
            fig["cpu_steal"] = max(0.0, mach1[1] - mach0[1]) / (wall * _CPUS)
        # less one tick of /proc/stat's resolution, which alone would be 10% of a 50-ms window
        stolen = fig["cpu_steal"] - 1.0 / (_CLK_TCK * wall * _CPUS)
        if stolen > self.max_wait:  # NaN compares False
            contended = True
        elif not math.isnan(fig["cpu_wait"]):
            contended = fig["cpu_wait"] > self.max_wait
        elif not math.isnan(fig["others_cpu"]):
            free = max(0, self.cores - self.threads)
            contended = fig["others_cpu"] > free + self.max_wait * self.threads
        else:
            contended = False
        return contended, fig


# ----------------------------------------------------------------------- drift reference
#: The sizes :class:`ReferenceWork` comes in: rows of its batch, powers of two (128 rows are
#: too few: their samples spread more than :attr:`ReferenceWork.tolerance`).
REFERENCE_ROWS = (256, 512, 1024)
#: The size used when a trial does not say how many rows its matmuls have.
DEFAULT_REFERENCE_ROWS = 256
#: The precisions :class:`ReferenceWork` runs its matmuls in: a trial in one of them is gauged
#: by the reference in its own (bf16: under ``torch.autocast``, as the workloads run it).
REFERENCE_PRECISIONS = ("fp32", "bf16")


def reference_rows(rows: int | None) -> int:
    """The :data:`REFERENCE_ROWS` size nearest (in log) to a trial's ``rows`` per matmul
    (``None``: :data:`DEFAULT_REFERENCE_ROWS`).

    Example:
        >>> [reference_rows(r) for r in (None, 1, 128, 300, 400, 4096)]
        [256, 256, 256, 256, 512, 1024]
    """
    if rows is None or rows <= 0:
        return DEFAULT_REFERENCE_ROWS
    return min(REFERENCE_ROWS, key=lambda r: (abs(math.log(rows / r)), r))


class _Gauge:
    """Times a fixed step to gauge the machine's speed: :meth:`sample` runs a fixed number of
    steps (chosen on the first call so that a sample lasts about ``sample_s``) and returns
    seconds per step. Subclasses give ``_step``, ``sample_s`` and ``name`` (the key of its
    nominal and usual speeds: :func:`reference_nominal`, :func:`reference_usual`)."""

    sample_s: float = 0.02
    steps: int = 0  # steps per sample, set by the first sample
    name: int | str = DEFAULT_REFERENCE_ROWS
    #: The precision its matmuls run in: it gauges trials that run in the same one.
    precision: str = "fp32"

    def _step(self) -> None:
        raise NotImplementedError

    def sample(self) -> float:
        """Seconds per reference step over one sample (the first call also calibrates)."""
        if self.steps == 0:
            self.steps = self._calibrate()
        t0 = time.perf_counter()
        for _ in range(self.steps):
            self._step()
        return (time.perf_counter() - t0) / self.steps

    def _calibrate(self) -> int:
        """Steps per sample: ``sample_s`` over the median of 5 timed steps (one slow step would
        size every sample too small), after 3 warm-up steps, at least 1.

        A step that lasts several samples' length is the whole sample, so the calibration stops
        as soon as that is settled: the warm-up ends after a step of over
        :data:`_LONG_STEP_SAMPLES` ``sample_s`` (its one-time costs are then a small part of it),
        and the timing once 3 of the 5 steps have each lasted over ``sample_s`` / 1.5 (the
        median is then one of them, and rounds to 1 step).
        """
        for _ in range(3):
            t0 = time.perf_counter()
            self._step()
            if time.perf_counter() - t0 > _LONG_STEP_SAMPLES * self.sample_s:
                break
        times: list[float] = []
        while len(times) < 5 and sum(t > self.sample_s / 1.5 for t in times) < 3:
            t0 = time.perf_counter()
            self._step()
            times.append(time.perf_counter() - t0)
        if len(times) < 5:  # the median of the 5 is over sample_s / 1.5
            return 1
        return max(1, round(self.sample_s / max(sorted(times)[2], 1e-6)))


#: A reference step that lasts over this many ``sample_s`` ends the calibration's warm-up.
_LONG_STEP_SAMPLES = 10


class ReferenceWork(_Gauge):
    """A fixed small training step that gauges how fast the machine runs now.

    The forward and backward pass of a fixed two-layer MLP (256 -> 1024 -> 256, GELU, fp32,
    a batch of ``rows``; 0.8 GFLOP per step at 256 rows), run with torch's current thread count:
    its matmuls and elementwise ops are large enough to use every thread, as a trial's do (a
    smaller one ran on one thread and did not feel what a 2-thread trial felt). A trial's
    figures divided by this figure, taken in the same process next to its windows, cancel what
    slows both alike: clock changes, other tenants of a virtual machine, cache and memory state.

    What slows a step depends on its working set, so a trial's reference has about as many rows
    as its own matmuls (:func:`reference_rows`). A trial spreads least across
    processes over a reference of its own size.

    A trial in bf16 is gauged by the same MLP with its matmuls in bf16 (``precision``, under
    ``torch.autocast`` as the workloads run bf16): a CPU's bf16 kernels may be another code path
    than its fp32 ones (emulated on one without bf16 instructions, on which the fp32 reference
    did not follow a bf16 trial), or the same units (on one with them, where it did). Its
    nominals join the fp32 scale (:func:`mlp_reference_gauges`).

    Args:
        sample_s: Seconds one sample lasts, about.
        rows: Rows of the batch, one of :data:`REFERENCE_ROWS` (see :func:`reference_rows`).
        precision: The matmuls' precision, one of :data:`REFERENCE_PRECISIONS`.
    """

    #: Relative spread (IQR / median) of clean samples in one process on an idle machine, at
    #: most (with :func:`tune_cpu_allocator`; without it samples spread more).
    tolerance = 0.08

    def __init__(self, sample_s: float = 0.02, rows: int = DEFAULT_REFERENCE_ROWS,
                 precision: str = "fp32") -> None:
        import torch

        if rows not in REFERENCE_ROWS:
            raise MeasurementError(f"ReferenceWork(rows={rows!r}) is not a reference size",
                                   hint=f"one of {REFERENCE_ROWS}; reference_rows(n) picks one")
        if precision not in REFERENCE_PRECISIONS:
            raise MeasurementError(
                f"ReferenceWork(precision={precision!r}) is not a reference precision",
                hint=f"one of {REFERENCE_PRECISIONS}; a trial in another keeps its raw figure")
        gen = torch.Generator().manual_seed(0)
        self._w1 = torch.randn(256, 1024, generator=gen).mul_(0.05).requires_grad_()
        self._w2 = torch.randn(1024, 256, generator=gen).mul_(0.05).requires_grad_()
        self._x = torch.randn(rows, 256, generator=gen)
        self.sample_s, self.rows, self.precision = sample_s, rows, precision
        self.name = mlp_reference_name(rows, precision)
        self.steps = 0

    def _step(self) -> None:
        import torch.nn.functional as F

        if self.precision == "fp32":
            y = F.gelu(self._x @ self._w1) @ self._w2
        else:  # the matmuls in bf16, the weights and their gradients fp32
            import torch

            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = (F.gelu(self._x @ self._w1) @ self._w2).float()
        y.square().mean().backward()
        self._w1.grad = self._w2.grad = None


def mlp_reference_name(rows: int, precision: str = "fp32") -> int | str:
    """The key of the nominal and usual speeds of :class:`ReferenceWork` at ``rows`` and
    ``precision``: the rows alone for fp32 (the scale's key before other precisions had one),
    e.g. ``"mlp bf16 rows=256"`` for another.

    Example:
        >>> mlp_reference_name(256), mlp_reference_name(1024, "bf16")
        (256, 'mlp bf16 rows=1024')
    """
    return rows if precision == "fp32" else f"mlp {precision} rows={rows}"


def mlp_reference_gauges(precision: str = "fp32") -> dict[int | str, Callable[[], Any]]:
    """The :class:`ReferenceWork` sizes whose nominals make one scale with a trial's in
    ``precision``, by key, each a function that builds it (for
    :func:`establish_reference_scale`): the fp32 sizes, and for another precision its own
    sizes too, so that a missing precision's nominals are moved onto the kept fp32 scale."""
    gauges: dict[int | str, Callable[[], Any]] = {
        r: functools.partial(ReferenceWork, rows=r) for r in REFERENCE_ROWS}
    if precision != "fp32":
        gauges.update({mlp_reference_name(r, precision): functools.partial(
            ReferenceWork, rows=r, precision=precision) for r in REFERENCE_ROWS})
    return gauges


class StepReference(_Gauge):
    """A workload's own drift reference: the training step of a fixed small configuration of it
    (one of :attr:`~cubicml_lab.workloads.Workload.drift_references`), sampled like
    :class:`ReferenceWork` between a trial's windows.

    A matmul-bound MLP does not feel what slows every workload (an embedding-bound dlrm
    configuration drifts with a small dlrm, not with the MLP), so a workload may be gauged by a
    small configuration of itself. Where a workload names several (dlrm: a small and a large
    table size, :meth:`~cubicml_lab.workloads.dlrm.DLRMWorkload.drift_reference_for`), their
    nominals are measured together (:func:`establish_reference_scale` with ``gauges``).

    Args:
        step: Runs one step of the reference configuration.
        name: Names the reference and its configuration (the key of its nominal and usual
            speeds): another configuration, or another version of the workload, is another
            scale.
        sample_s: Seconds one sample lasts, about.
        precision: The precision the reference configuration's matmuls run in.
    """

    def __init__(self, step: Callable[[], object], name: str, sample_s: float = 0.02,
                 precision: str = "fp32") -> None:
        self._run, self.name, self.sample_s, self.precision = step, name, sample_s, precision
        self.steps = 0

    def _step(self) -> None:
        self._run()


def _key(threads: int, rows: int | str = DEFAULT_REFERENCE_ROWS) -> str:
    """The cache key of this CPU model at ``threads`` for the reference of ``rows`` (an MLP
    size, or the name of a :class:`StepReference`)."""
    if isinstance(rows, str):
        return f"{cpu_model()}|threads={threads}|ref={rows}"
    return f"{cpu_model()}|threads={threads}|rows={rows}"


def reference_nominal(speed: float, threads: int, record: bool = False,
                      rows: int | str = DEFAULT_REFERENCE_ROWS, *, first: bool = True) -> float:
    """This machine's nominal :class:`ReferenceWork` speed (reference steps/s) at ``threads``
    for the reference of ``rows``.

    The first figure kept for this CPU model, thread count and size (by
    :func:`establish_reference_scale`, or else the first offered here) is stored in
    ``$CUBICML_LAB_CACHE_DIR/reference.json`` (default ``~/.cache/cubicml_lab``), and returned
    until :func:`establish_reference_scale` finds a nominal of its scale contradicted by its own
    recent figures and re-establishes the whole scale, so that drift-corrected throughputs
    (``raw * nominal / reference_speed``) of the trials on this machine share one scale, in the
    workload's units per second. Delete the file to start a new scale. Figures stored before a
    new scale keep the old one; ``throughput_rel`` and ``reference_speed`` are stored too, so
    any trial can be put on any scale (the replaced nominals stay in the file, under
    ``"replaced"``).

    Args:
        speed: This trial's reference speed, offered as the nominal if none is kept yet.
        threads: Threads the reference ran with.
        record: Also add ``speed`` to the machine's recent figures at ``threads`` and ``rows``
            (the last :data:`USUAL_HISTORY`, which :func:`reference_usual` reads); a non-finite
            or non-positive one is not added.
        rows: The reference's size (:data:`REFERENCE_ROWS`), or a :class:`StepReference`'s
            name (its nominal is the first figure offered).
        first: Whether ``speed`` may become the nominal when none is kept; if not (a figure
            taken beside other work), NaN is returned and nothing is kept.
    """
    key = _key(threads, rows)
    with locked_json_cache("reference.json") as cache:
        entry = cache.get(key)
        if not isinstance(entry, dict):
            if not first:
                return math.nan
            entry = cache[key] = {"steps_per_s": float(speed), "measured_at": time.time()}
        if record and math.isfinite(speed) and speed > 0:
            entry["recent"] = (_recent_speeds(entry) + [float(speed)])[-USUAL_HISTORY:]
        return float(entry["steps_per_s"])


def _recent_speeds(entry: Any) -> list[float]:
    """The recent reference speeds (steps/s, oldest first) kept in a cache entry."""
    recent = entry.get("recent") if isinstance(entry, dict) else None
    return ([float(x) for x in recent if isinstance(x, (int, float))]
            if isinstance(recent, list) else [])


def _kept_nominal(cache: dict, threads: int, rows: int | str) -> float | None:
    entry = cache.get(_key(threads, rows))
    speed = entry.get("steps_per_s") if isinstance(entry, dict) else None
    return float(speed) if isinstance(speed, (int, float)) and speed > 0 else None


#: Seconds the sampling rounds of :func:`establish_reference_scale` may last, about (sub-second
#: for the fp32 MLP: only a much slower reference samples fewer than its ``rounds``).
SCALE_ROUNDS_S = 10.0
#: A kept nominal further than this factor (either way) from the usual speed of its own recent
#: trials is stale, and a scale measured again replaces it only if each of its figures is within
#: this factor of its usual speed. A clean machine's reference speeds spread a few % between
#: processes, while contention drives them down about 2x on a 2-core VM: 1.5 lies between, so a
#: nominal measured under load is found out, and a new one measured under load is refused.
STALE_NOMINAL_FACTOR = 1.5
#: Seconds a stale scale keeps its nominals after its history refused the figures measured
#: again (the machine was likely loaded) before it is measured again: at most
#: :data:`SCALE_ROUNDS_S` of sampling every 10 minutes, on a trial runner's every trial.
STALE_RETRY_S = 600.0
#: Replaced nominals kept in each entry (the latest), with when and why they were replaced.
_REPLACED_KEPT = 5


def _stale_usuals(cache: dict, threads: int, names: list[int | str]
                  ) -> dict[int | str, float]:
    """The usual recent speeds of the references of a scale whose nominals are all kept and
    one of which is off its usual speed by over :data:`STALE_NOMINAL_FACTOR`, unless the scale
    was measured against them within :data:`STALE_RETRY_S`; ``{}`` otherwise."""
    entries = {r: cache.get(_key(threads, r)) for r in names}
    if not all(isinstance(e, dict) for e in entries.values()):
        return {}
    if any(time.time() - float(e.get("checked_at", -math.inf)) < STALE_RETRY_S
           for e in entries.values()):
        return {}
    usual = {r: usual_speed(_recent_speeds(e), ReferenceWork.tolerance)
             for r, e in entries.items()}
    usual_known = {r: u for r, u in usual.items() if u is not None}
    kept = {r: _kept_nominal(cache, threads, r) for r in usual_known}
    if any(v is not None and _off(v, usual_known[r]) for r, v in kept.items()):
        return usual_known
    return {}


def _off(speed: float, usual: float) -> bool:
    """Whether ``speed`` is further than :data:`STALE_NOMINAL_FACTOR` from ``usual``."""
    return abs(math.log(speed / usual)) > math.log(STALE_NOMINAL_FACTOR)


def establish_reference_scale(threads: int, rounds: int = 7,
                              gauges: Mapping[int | str, Callable[[], Any]] | None = None
                              ) -> dict[int | str, float]:
    """The nominal speeds of every reference of one scale at ``threads`` (torch's current
    thread count must be ``threads``), measured together where any is missing or stale: by
    default the :data:`REFERENCE_ROWS` sizes of :class:`ReferenceWork`; ``gauges``: another
    set, by the key of each one's nominal (a size, or a :class:`StepReference`'s name), each a
    function that builds it (called only when the scale is measured).

    Trials correct their figures each over the reference of their own size, so the sizes'
    nominals must describe one machine state, or the configurations that use one size would be
    shifted against those that use another: where one is missing, every size is sampled
    ``rounds`` times, round-robin within a second or two, and a missing size's nominal is its
    median speed, moved by the ratio of the kept nominals to the medians now measured of the
    sizes that have one (geometric mean), or taken as measured when none has. Where a round
    lasts longer (a step of seconds: bf16 matmuls on a CPU without bf16 instructions), only the
    rounds that fit in :data:`SCALE_ROUNDS_S` are sampled, 3 at least.

    Where all are kept, each is held to the usual speed of its own recent trials
    (:func:`usual_speed` of the figures :func:`reference_nominal` recorded, once there are
    :data:`USUAL_MIN`; tolerance :attr:`ReferenceWork.tolerance`). One further than
    :data:`STALE_NOMINAL_FACTOR` from it is stale (measured under load, or before the machine
    changed): the whole scale is sampled as above, and every nominal replaced by its median as
    measured, provided each figure whose usual speed is known is within the factor of it (the
    history and the machine now agree); otherwise, the machine being likely loaded, the kept
    nominals stay, and the scale is measured again no sooner than :data:`STALE_RETRY_S` later
    (``"checked_at"`` in each entry). A replaced nominal is kept under ``"replaced"`` in its
    entry (the latest few, with when it was measured and replaced and the usual speed that
    contradicted it); the recent figures stay. Figures stored before keep the old scale; their
    ``throughput_rel`` and ``reference_speed`` put them on the new one. Where all are kept and
    none is stale, nothing is measured: this reads the cache file and returns.

    Returns:
        ``{size or name: nominal steps/s}`` for every one.
    """
    if gauges is None:
        gauges = mlp_reference_gauges()
    names = list(gauges)
    with locked_json_cache("reference.json") as cache:
        kept = {r: _kept_nominal(cache, threads, r) for r in names}
        stale = _stale_usuals(cache, threads, names)
    if all(v is not None for v in kept.values()) and not stale:
        return {r: float(v) for r, v in kept.items() if v is not None}
    now = _measure_together(gauges, rounds)
    with locked_json_cache("reference.json") as cache:  # another process may have won the race
        kept = {r: _kept_nominal(cache, threads, r) for r in names}
        if any(v is None for v in kept.values()):
            _keep_missing(cache, threads, kept, now)
        else:
            _replace_stale(cache, threads, names, now)
        return {r: float(cache[_key(threads, r)]["steps_per_s"]) for r in names}


def _measure_together(gauges: Mapping[int | str, Callable[[], Any]], rounds: int
                      ) -> dict[int | str, float]:
    """Each gauge's median speed (steps/s) over ``rounds`` round-robin samples (fewer where
    they would last over :data:`SCALE_ROUNDS_S`, 3 at least)."""
    works = {r: make() for r, make in gauges.items()}
    samples: dict[int | str, list[float]] = {r: [] for r in works}
    n = rounds
    for k in range(rounds):
        t0 = time.perf_counter()
        for r, work in works.items():
            samples[r].append(work.sample())
        if k == 1:  # the first round also calibrated every gauge: the second is a round's length
            fit = int(SCALE_ROUNDS_S / max(time.perf_counter() - t0, 1e-9))
            n = max(min(rounds, 3), min(rounds, fit))
        if k + 1 >= n:
            break
    return {r: 1.0 / sorted(x)[len(x) // 2] for r, x in samples.items()}


def _keep_missing(cache: dict, threads: int, kept: dict[int | str, float | None],
                  now: dict[int | str, float]) -> None:
    """Keep a nominal for each reference missing one: its speed ``now`` moved onto the kept
    nominals' scale (the geometric mean of their ratios to their speeds now)."""
    have = [math.log(v / now[r]) for r, v in kept.items() if v is not None]
    shift = math.exp(sum(have) / len(have)) if have else 1.0
    for r, v in kept.items():
        if v is None:
            entry = cache.get(_key(threads, r))
            entry = entry if isinstance(entry, dict) else {}
            entry.update(steps_per_s=now[r] * shift, measured_at=time.time())
            cache[_key(threads, r)] = entry


def _replace_stale(cache: dict, threads: int, names: list[int | str],
                   now: dict[int | str, float]) -> None:
    """Replace every nominal of a stale scale by its speed ``now`` where those agree with the
    usual speeds (:data:`STALE_NOMINAL_FACTOR`); mark the scale checked either way."""
    usual = _stale_usuals(cache, threads, names)
    if not usual:  # another process replaced or checked it meanwhile
        return
    at = time.time()
    agree = not any(_off(now[r], u) for r, u in usual.items())
    for r in names:
        entry = cache[_key(threads, r)]
        entry["checked_at"] = at
        if agree:
            old = {"steps_per_s": entry["steps_per_s"], "measured_at": entry.get("measured_at"),
                   "replaced_at": at, "usual": usual.get(r)}
            replaced = entry.get("replaced")
            replaced = replaced if isinstance(replaced, list) else []
            entry["replaced"] = (replaced + [old])[-_REPLACED_KEPT:]
            entry.update(steps_per_s=now[r], measured_at=at)


#: Reference speeds of this many recent trials are kept per CPU model and thread count.
USUAL_HISTORY = 25
def reference_usual(threads: int, tol: float, rows: int | str = DEFAULT_REFERENCE_ROWS
                    ) -> float | None:
    """This machine's usual :class:`ReferenceWork` speed (steps/s) at ``threads`` and ``rows``
    (or a :class:`StepReference`'s, by name):
    the :func:`usual_speed` of the last :data:`USUAL_HISTORY` trials' figures (recorded by
    :func:`reference_nominal`, kept in ``$CUBICML_LAB_CACHE_DIR/reference.json``); ``None``
    until :data:`USUAL_MIN` were recorded. ``tol``: how far (in log) figures of one speed state
    lie apart (``MeasureOptions.drift_tol``)."""
    with locked_json_cache("reference.json") as cache:
        recent = _recent_speeds(cache.get(_key(threads, rows)))
    return usual_speed(recent, tol)
