"""Timing: steady-state step time, throughput, peak memory, FLOPs and MFU of a training step.

This module owns how a training step is timed and what its figures are (the record a trial
returns, :class:`~cubicml_lab.trials.TrialResult`, lives in :mod:`cubicml_lab.trials`):

* :func:`time_steps` runs a step function until its time per step has settled (warm-up, never
  timed), then times *windows* of steps, synchronising only at window edges, until the 95%
  confidence interval of the median step time is within ``target_rel_ci`` of it, or a step or
  time budget runs out. Python's garbage collector is kept out of the timed windows (generation 1
  is collected between windows, as torchtitan does; collection is disabled inside them).
* Clocks: :class:`StepTimer` (``time.perf_counter`` with the workload's ``sync`` at the edges) on
  CPU, :class:`CudaEventTimer` (CUDA events recorded at the edges) on GPUs; :func:`make_timer`.
* Contention guard: a :class:`WindowGuard` (on CPU :class:`~cubicml_lab.hardware.CpuContention`:
  the run-queue wait of the trial's threads) judges every window; a contended one is discarded
  and re-timed, and a trial that cannot get 6 clean windows within ``contended_budget`` is
  flagged (``Timing.contended``; ``metrics["contended"] = 1.0``, status stays ``"ok"``).
* Drift reference: a fixed small workload (:class:`~cubicml_lab.hardware.ReferenceWork`) sampled
  between the windows gives the machine's speed at that moment (``reference_speed``).
* :func:`summarize` turns a :class:`Timing` into metrics: ``step_time_s`` (median), its relative
  spread and CI, ``throughput`` (units/s), ``throughput_raw`` and ``throughput_rel`` (over the
  reference), ``throughput_log_var`` (noise for a GP), ``achieved_tflops`` and ``mfu`` (0-1),
  and what the guard and the reference saw (:func:`guard_metrics`, :func:`reference_metrics`).
* Re-exported from :mod:`cubicml_lab.hardware`: :func:`peak_memory_gib`,
  :func:`reset_peak_memory`, :func:`device_peak_flops` and :func:`hardware_info`.

The raw step time, units per step and device count are always stored, so MFU can be recomputed
later under another FLOP convention. Multi-process runs report the slowest rank's step time, as
Megatron-LM does (``time_steps(reduce=...)``). Importing this module imports no torch.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any, Protocol

from .errors import MeasurementError
from .hardware import (  # re-exported: timing is where users look for them
    device_peak_flops,
    hardware_info,
    host_record,
    peak_memory_gib,
    reset_peak_memory,
)

__all__ = ["CudaEventTimer", "MeasureOptions", "StepTimer", "Timing", "device_peak_flops",
           "hardware_info", "host_record", "make_timer", "peak_memory_gib", "reset_peak_memory",
           "guard_metrics", "reference_metrics", "summarize", "time_steps", "WindowGuard",
           "CONTENDED_LOG_VAR", "DRIFT_EXPONENT", "REPEAT_LOG_SD", "UNTRUSTED_LOG_VAR"]

_MIN_WINDOWS = 8  # windows shrink below window_min_s if needed so that max_steps holds this many


# ----------------------------------------------------------------------------- the options
@dataclass(frozen=True, kw_only=True)
class MeasureOptions:
    """How long and how precisely :func:`time_steps` measures.

    Attributes:
        target_rel_ci: Stop once the 95% CI half-width of the median step time, divided by the
            median, is at most this (a fraction; 0.02 = 2%).
        min_steps: Timed steps at least (steps, not windows), even past ``max_time_s``.
        max_steps: Timed steps at most (steps, not windows).
        max_time_s: Budget of the timed phase in seconds (a window that would overrun it is not
            started once ``min_steps`` are timed).
        warmup_min_steps: Untimed warm-up steps at least (>= 1: the first step is never timed).
        warmup_max_steps: Warm-up steps at most.
        warmup_max_s: Warm-up budget in seconds (ends it once ``warmup_min_steps`` ran).
        settle_rel: Warm-up ends when the last 3 step times (not counting the first step) are
            within this fraction of their median.
        window_min_s: Seconds a timed window lasts at least; steps are grouped so, and the
            device is synchronised only at window edges.
        guard: Discard and re-time windows that shared the machine (on CPU: the trial's
            threads waited for a core more than ``max_cpu_wait`` of the window; on CUDA: the
            device throttled); see :class:`~cubicml_lab.hardware.CpuContention`.
        max_cpu_wait: Largest fraction of a window the trial's threads may have waited,
            runnable, for a CPU before the window counts as contended.
        contended_budget: Seconds of discarded windows after which timing stops, as a
            multiple of ``max_time_s``; the trial is then flagged ``contended`` unless it
            already has 6 clean windows.
        reference_share: Fraction of the timed seconds spent on the drift reference
            (:class:`~cubicml_lab.hardware.ReferenceWork`, at least 5 samples of ~20 ms,
            between windows); 0 for none.
    """

    target_rel_ci: float = 0.02
    min_steps: int = 5
    max_steps: int = 200
    max_time_s: float = 20.0
    warmup_min_steps: int = 2
    warmup_max_steps: int = 20
    warmup_max_s: float = 20.0
    settle_rel: float = 0.10
    window_min_s: float = 0.05
    guard: bool = True
    max_cpu_wait: float = 0.10
    contended_budget: float = 0.5
    reference_share: float = 0.10

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            ok_type = (isinstance(value, int) if f.type == "int"
                       else isinstance(value, (int, float)) and math.isfinite(value))
            if (f.type == "bool") != isinstance(value, bool) or not ok_type:
                raise MeasurementError(f"MeasureOptions.{f.name} = {value!r} must be a "
                                       f"{'' if f.type == 'bool' else 'finite '}{f.type}",
                                       hint=f"default: {f.default!r}")
        checks = [("target_rel_ci", self.target_rel_ci > 0, "> 0"),
                  ("min_steps", self.min_steps >= 1, ">= 1"),
                  ("max_steps", self.max_steps >= self.min_steps, ">= min_steps"),
                  ("max_time_s", self.max_time_s > 0, "> 0"),
                  ("warmup_min_steps", self.warmup_min_steps >= 1, ">= 1 (never time step 1)"),
                  ("warmup_max_steps", self.warmup_max_steps >= self.warmup_min_steps,
                   ">= warmup_min_steps"),
                  ("warmup_max_s", self.warmup_max_s >= 0, ">= 0"),
                  ("settle_rel", self.settle_rel > 0, "> 0"),
                  ("window_min_s", self.window_min_s >= 0, ">= 0"),
                  ("max_cpu_wait", self.max_cpu_wait > 0, "> 0"),
                  ("contended_budget", self.contended_budget >= 0, ">= 0"),
                  ("reference_share", 0 <= self.reference_share < 1, "in [0, 1)")]
        for name, ok, rule in checks:
            if not ok:
                raise MeasurementError(
                    f"MeasureOptions.{name} = {getattr(self, name)!r} must be {rule}",
                    hint=f"default: {getattr(MeasureOptions, name)!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> MeasureOptions:
        """Options from a dict of field values; an unknown key raises naming the known ones."""
        d = dict(d or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise MeasurementError(f"unknown measure option(s) {unknown}",
                                   hint=f"known options: {', '.join(known)}")
        for f in fields(cls):  # JSON may carry 1.0 for an int or 1 for a float
            v = d.get(f.name)
            if f.type == "float" and isinstance(v, int) and not isinstance(v, bool):
                d[f.name] = float(v)
            elif f.type == "int" and isinstance(v, float) and v.is_integer():
                d[f.name] = int(v)
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Every field with its value."""
        return asdict(self)


# ---------------------------------------------------------------------------------- clocks
class StepTimer:
    """Wall clock of a window of steps: ``time.perf_counter``, ``sync()`` called at both edges.

    Args:
        sync: Blocks until queued device work is done (e.g. ``torch.cuda.synchronize``); ``None``
            for eager CPU work.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self._t0 = 0.0

    def start(self) -> None:
        """Mark the start of a window."""
        if self.sync is not None:
            self.sync()
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Mark the end of the window; return its duration in seconds."""
        if self.sync is not None:
            self.sync()
        return time.perf_counter() - self._t0


class CudaEventTimer(StepTimer):
    """Device-side clock: CUDA events recorded at the window edges, synchronised at the end only.

    The elapsed time is the GPU stream's time between the two events, so it includes kernels and
    any idle gaps while the CPU was launching them.

    Args:
        device: A CUDA device, e.g. ``"cuda"`` or ``"cuda:1"``.
    """

    def __init__(self, device: str = "cuda") -> None:
        import torch

        super().__init__(None)
        self.device = torch.device(device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            self._start.record()

    def stop(self) -> float:
        import torch

        with torch.cuda.device(self.device):
            self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3  # ms -> s


def make_timer(device: str = "cpu", sync: Callable[[], None] | None = None) -> StepTimer:
    """The right clock for ``device``: CUDA events on ``cuda[:N]``, else perf_counter + ``sync``."""
    return CudaEventTimer(device) if str(device).startswith("cuda") else StepTimer(sync)


# ------------------------------------------------------------------------------ statistics
def _quantile(sorted_x: list[float], q: float) -> float:
    """Linear-interpolation quantile of an ascending list (numpy's default method)."""
    pos = q * (len(sorted_x) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_x) - 1)
    return sorted_x[lo] + (sorted_x[hi] - sorted_x[lo]) * (pos - lo)


@lru_cache(maxsize=4096)
def _median_ci_rank(n: int) -> int:
    """Largest 1-based rank ``l`` with P(Binomial(n, 1/2) <= l - 1) <= 2.5%; 0 if none.

    ``[x_(l), x_(n+1-l)]`` is then a distribution-free >= 95% CI of the median.
    """
    total, cdf, rank = 2**n, 0, 0
    for j in range(n):  # exact integer arithmetic: no float underflow
        cdf += math.comb(n, j)
        if cdf * 40 > total:  # P(B <= j) > 0.025
            break
        rank = j + 1
    return rank


def _median_rel_ci(x: list[float]) -> float:
    """95% CI half-width of the median over the median (order-statistic CI; inf if n < 6)."""
    s = sorted(x)
    rank = _median_ci_rank(len(s))
    med = _quantile(s, 0.5)
    if rank == 0 or med <= 0:
        return math.inf
    return max(med - s[rank - 1], s[len(s) - rank] - med) / med


@dataclass(frozen=True, kw_only=True)
class Timing:
    """What :func:`time_steps` measured (times in seconds).

    Attributes:
        step_times_s: Time per step of each timed window (window time / steps in it).
        warmup_steps: Untimed steps run before timing.
        warmup_step_times_s: Time of each warm-up step (individually synchronised).
        steps_per_window: Steps in each timed window.
        steps_timed: Timed steps in all (windows x steps_per_window).
        windows: Timed windows.
        median_step_time_s: Median of ``step_times_s``.
        rel_spread: Interquartile range of ``step_times_s`` over its median.
        rel_ci: 95% CI half-width of the median over the median: the larger side of the
            distribution-free order-statistic (binomial) interval; ``inf`` with < 6 windows.
        target_met: ``rel_ci <= options.target_rel_ci``.
        outlier_steps: Windows slower than median + 3 * 1.4826 * MAD (reported, still counted).
        stop_reason: Why timing stopped: ``"target met"``, ``"max_steps"``, ``"max_time_s"`` or
            ``"contended"`` (the ``contended_budget`` of discarded windows).
        elapsed_s: Seconds spent in :func:`time_steps` (warm-up + timing + collection).
        contended: Fewer than 6 clean windows when ``contended_budget`` ran out: the figures
            are not to be trusted (they come from the clean windows if any, else from all).
        contended_windows: Windows the guard discarded (and re-timed).
        contended_s: Seconds of discarded windows and reference samples.
        guard_figures: Per window, clean or discarded, in order: the guard's figures (e.g.
            ``cpu_wait``, ``cpu_util``, ``others_cpu``) and ``contended`` (1.0 / 0.0).
        reference_times_s: Seconds per reference step of each clean reference sample.
    """

    step_times_s: list[float]
    warmup_steps: int
    warmup_step_times_s: list[float]
    steps_per_window: int
    steps_timed: int
    windows: int
    median_step_time_s: float
    rel_spread: float
    rel_ci: float
    target_met: bool
    outlier_steps: int
    stop_reason: str
    elapsed_s: float
    contended: bool = False
    contended_windows: int = 0
    contended_s: float = 0.0
    guard_figures: list[dict[str, float]] = field(default_factory=list)
    reference_times_s: list[float] = field(default_factory=list)


def _settled(times: list[float], rel: float) -> bool:
    """Whether the last 3 step times (never the first) are within ``rel`` of their median."""
    if len(times) < 4:
        return False
    last = sorted(times[-3:])
    return max(last[2] - last[1], last[1] - last[0]) <= rel * last[1]


class WindowGuard(Protocol):
    """What :func:`time_steps` asks of a contention guard (e.g.
    :class:`~cubicml_lab.hardware.CpuContention`): mark a window's start, then say at its end
    whether it shared the machine, with the figures that decided it."""

    def start(self) -> None: ...

    def stop(self) -> tuple[bool, dict[str, float]]: ...


_CLEAN_MIN = 6  # clean windows a trial needs, when contention stops timing, to stay unflagged
_REF_MIN = 5  # reference samples at least (their median's CI needs 6: the first 5 + share)


def _warm_up(step: Callable[[], Any], timer: StepTimer, agree: Callable[[float], float],
             o: MeasureOptions) -> list[float]:
    """Single synchronised steps until settled or a warm-up budget is spent; their times."""
    warm: list[float] = []
    while True:
        timer.start()
        step()
        warm.append(agree(timer.stop()))
        n, spent = len(warm), sum(warm)
        budget_spent = n >= o.warmup_max_steps or spent >= o.warmup_max_s
        if n >= o.warmup_min_steps and (budget_spent or _settled(warm, o.settle_rel)):
            return warm


class _Windows:
    """The timed phase's state: clean and discarded windows, reference samples, budgets."""

    def __init__(self, o: MeasureOptions, agree: Callable[[float], float],
                 guard: WindowGuard | None, reference: Callable[[], float] | None) -> None:
        self.o, self.agree, self.guard, self.reference = o, agree, guard, reference
        self.times: list[float] = []  # clean windows, seconds per step
        self.dirty: list[float] = []  # discarded windows, seconds per step
        self.figures: list[dict[str, float]] = []
        self.refs: list[float] = []
        self.steps, self.timed_s, self.dirty_s, self.ref_s = 0, 0.0, 0.0, 0.0

    def guarded(self, run: Callable[[], float], record: bool = True) -> tuple[bool, float]:
        """Run ``run`` (returns seconds) inside the guard: ``(contended, agreed seconds)``;
        ``record``: keep the guard's figures (windows are recorded, reference samples not)."""
        if self.guard is None:
            return False, self.agree(run())
        self.guard.start()
        seconds = run()
        contended, fig = self.guard.stop()
        contended = self.agree(1.0 if contended else 0.0) > 0  # any rank contended: all discard
        if record:
            self.figures.append({**fig, "contended": 1.0 if contended else 0.0})
        return contended, self.agree(seconds)

    def sample_reference(self) -> None:
        """One reference sample, if one is due: 5 at least, then ``reference_share`` of time."""
        if self.reference is None or self.o.reference_share <= 0:
            return
        if len(self.refs) >= _REF_MIN and self.ref_s >= self.o.reference_share * self.timed_s:
            return
        t0 = time.perf_counter()
        contended, per_step = self.guarded(self.reference, record=False)
        spent = self.agree(time.perf_counter() - t0)  # ranks decide alike on agreed time
        self.ref_s += spent
        if contended:
            self.dirty_s += spent
        else:
            self.refs.append(per_step)

    def window(self, step: Callable[[], Any], timer: StepTimer, n: int) -> None:
        """Time one window of ``n`` steps; keep it if clean, else count it as discarded."""

        def run() -> float:
            timer.start()
            for _ in range(n):
                step()
            return timer.stop()

        gc.collect(1)
        contended, window_s = self.guarded(run)
        if contended:
            self.dirty.append(window_s / n)
            self.dirty_s += window_s
            return
        self.times.append(window_s / n)
        self.timed_s += window_s
        self.steps += n


def time_steps(step: Callable[[], Any], *, sync: Callable[[], None] | None = None,
               options: MeasureOptions = MeasureOptions(), timer: StepTimer | None = None,
               reduce: Callable[[float], float] | None = None,
               guard: WindowGuard | None = None,
               reference: Callable[[], float] | None = None) -> Timing:
    """Time ``step`` in steady state: warm up until settled, then time windows of steps.

    Warm-up runs single steps, each synchronised and timed, until ``warmup_min_steps`` ran and
    the last 3 (never the first, which carries one-time costs) are within ``settle_rel`` of
    their median, or a warm-up budget is spent: at least 4 steps unless a budget ends it. Timing
    then runs windows of ``k = ceil(window_min_s / warm-up step time)`` steps (at most
    ``max_steps // 8``, so that the budget holds 8 windows: the order-statistic CI of a median
    needs 6), reading the clock and synchronising only at window edges. It stops once
    ``min_steps`` are timed and the median's CI is within ``target_rel_ci``, or when the next
    window would pass ``max_steps`` or ``max_time_s``. Garbage: one full collection before
    timing, generation 1 between windows, none inside them (the caller's gc state is restored,
    also when ``step`` raises).

    Contention: with a ``guard`` (and ``options.guard``), a window the guard calls contended is
    discarded and re-timed; discarded windows count against ``contended_budget``, not the other
    budgets. When that runs out timing stops, and with fewer than 6 clean windows the timing is
    ``contended`` (flagged). Drift: ``reference`` (seconds per step of a fixed reference
    workload, e.g. :meth:`~cubicml_lab.hardware.ReferenceWork.sample`) is sampled before the
    first window and between windows, guarded alike, for ``reference_share`` of the time.

    Multi-process runs pass ``reduce`` (e.g. an all-reduce MAX over ranks): every measured time,
    warm-up step, window or reference sample, and every guard verdict, is replaced by its reduced
    value right after the clock stops (outside the window), so the slowest rank's time is
    reported, as Megatron-LM does, and every rank makes the same decisions. Budgets therefore
    count measured (reduced) time, not the clock between windows.

    Args:
        step: One training step; its return value is ignored.
        sync: Blocks until queued device work is done; used by the default timer only.
        options: Budgets and targets.
        timer: The clock; default ``StepTimer(sync)`` (:func:`make_timer` gives CUDA events).
        reduce: Maps a rank's measured seconds to the value all ranks agree on; ``None`` alone.
        guard: Tells contended windows apart (:class:`WindowGuard`); ``None``: none is.
        reference: Runs one drift-reference sample, returns its seconds per reference step.

    Returns:
        The :class:`Timing`.

    Example:
        >>> t = time_steps(lambda: time.sleep(0.002),
        ...                options=MeasureOptions(max_time_s=0.3, window_min_s=0.01))
        >>> 0.0015 < t.median_step_time_s < 0.01 and t.warmup_steps >= 2
        True
    """
    timer = timer if timer is not None else StepTimer(sync)
    agree = reduce if reduce is not None else float
    o = options
    t_begin = time.perf_counter()
    warm = _warm_up(step, timer, agree, o)
    recent = sorted(warm[1:][-3:] or warm)  # the first step (compilation...) says nothing
    est = max(recent[len(recent) // 2], 1e-9)
    k = max(1, min(math.ceil(o.window_min_s / est), o.max_steps // _MIN_WINDOWS))
    w = _Windows(o, agree, guard if o.guard else None, reference)
    stop_reason, rel_ci = "max_steps", math.inf
    gc_was_enabled = gc.isenabled()
    gc.collect()
    try:
        gc.disable()
        w.sample_reference()
        while True:
            n = k if w.steps + k <= o.max_steps else o.max_steps - w.steps
            if n <= 0 or (n < k and w.steps >= o.min_steps):
                break  # max_steps (a short last window only to reach min_steps)
            if (w.steps >= o.min_steps
                    and w.timed_s + k * _quantile(sorted(w.times), 0.5) > o.max_time_s):
                stop_reason = "max_time_s"
                break
            if (w.times or w.dirty) and w.dirty_s > o.contended_budget * o.max_time_s:
                stop_reason = "contended"
                break
            w.window(step, timer, n)
            w.sample_reference()
            rel_ci = _median_rel_ci(w.times) if w.times else math.inf
            if w.steps >= o.min_steps and rel_ci <= o.target_rel_ci:
                stop_reason = "target met"
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return _timing(w, warm, k, stop_reason, time.perf_counter() - t_begin)


def _timing(w: _Windows, warm: list[float], k: int, stop_reason: str, elapsed: float) -> Timing:
    """The :class:`Timing` of a finished timed phase (a flagged one from its clean windows if
    any, else from the discarded ones)."""
    contended = stop_reason == "contended" and len(w.times) < _CLEAN_MIN
    times = w.times or w.dirty
    s = sorted(times)
    med = _quantile(s, 0.5)
    mad = _quantile(sorted(abs(x - med) for x in s), 0.5)
    iqr = _quantile(s, 0.75) - _quantile(s, 0.25)
    rel_ci = _median_rel_ci(times)
    return Timing(step_times_s=times, warmup_steps=len(warm), warmup_step_times_s=warm,
                  steps_per_window=k, steps_timed=w.steps if w.times else k * len(w.dirty),
                  windows=len(times), median_step_time_s=med,
                  rel_spread=iqr / med if med > 0 else math.nan, rel_ci=rel_ci,
                  target_met=rel_ci <= w.o.target_rel_ci and not contended,
                  outlier_steps=sum(x > med + 3 * 1.4826 * mad for x in s),
                  stop_reason=stop_reason, elapsed_s=elapsed, contended=contended,
                  contended_windows=len(w.dirty), contended_s=w.dirty_s,
                  guard_figures=w.figures, reference_times_s=w.refs)


#: Repeat-to-repeat noise of a clean, drift-corrected CPU figure that its own windows cannot
#: see, as a standard deviation of its log. ``benchmarks/measure_repeatability.py`` on an idle
#: 2-core VM, 10 configs x 5 fresh processes: 1.4% on a steady host (raw 1.9%), 3.6% while the
#: host's speed drifted by 25% (raw 6.9%).
REPEAT_LOG_SD = 0.025
#: How much of the reference's drift the default figure takes out: ``throughput = raw *
#: (nominal / reference_speed) ** DRIFT_EXPONENT``. Regressing log raw throughput on log
#: reference speed over fresh-process repeats (10 configs x 5, three runs of
#: ``benchmarks/measure_repeatability.py`` on a 2-core VM) gave slopes 0.66, 0.73 and 0.72:
#: the workloads drift less than the compute-dense reference, whose own noise also flattens the
#: slope. With 0.7 the repeat-to-repeat standard deviation was 1.1%, 2.7% and 4.4% (raw 1.9%,
#: 6.9%, 9.1%; full correction 1.4%, 3.6%, 5.4%); on a fourth run, after the choice, 3.0%
#: (raw 8.3%, full 3.9%; slope 0.76).
DRIFT_EXPONENT = 0.7
#: Log-variance given to a flagged (contended) figure: its clean windows were too few.
CONTENDED_LOG_VAR = 0.05
#: ... and to a flagged figure with no clean window at all (taken under contention).
UNTRUSTED_LOG_VAR = 1.0


def _median(x: list[float]) -> float:
    return _quantile(sorted(x), 0.5) if x else math.nan


def guard_metrics(timing: Timing) -> dict[str, float]:
    """What the contention guard saw: ``contended`` (1.0 / 0.0), ``contended_windows``,
    ``contended_s``, and medians over the windows of ``cpu_wait`` (all windows), ``cpu_util``
    (clean ones) and ``others_cpu`` (all windows, in cores); NaN where not measured."""
    figs = timing.guard_figures
    clean = [f for f in figs if not f.get("contended")]

    def med(rows: list[dict[str, float]], key: str) -> float:
        return _median([f[key] for f in rows if key in f and not math.isnan(f[key])])

    return {"contended": 1.0 if timing.contended else 0.0,
            "contended_windows": float(timing.contended_windows),
            "contended_s": timing.contended_s, "cpu_wait": med(figs, "cpu_wait"),
            "cpu_util": med(clean or figs, "cpu_util"), "others_cpu": med(figs, "others_cpu")}


def reference_metrics(timing: Timing) -> dict[str, float]:
    """The drift reference: ``reference_speed`` (reference steps/s, median of the samples),
    ``reference_step_s``, ``reference_rel_spread`` (IQR / median), ``reference_rel_ci`` (95%
    CI half-width of the median / median; inf under 6 samples), ``reference_samples``."""
    refs = timing.reference_times_s
    if not refs:
        return {"reference_speed": math.nan, "reference_step_s": math.nan,
                "reference_rel_spread": math.nan, "reference_rel_ci": math.nan,
                "reference_samples": 0.0}
    s = sorted(refs)
    med = _quantile(s, 0.5)
    return {"reference_speed": 1.0 / med, "reference_step_s": med,
            "reference_rel_spread": (_quantile(s, 0.75) - _quantile(s, 0.25)) / med,
            "reference_rel_ci": _median_rel_ci(refs), "reference_samples": float(len(refs))}


def _rel_ci(timing: Timing, ref: dict[str, float] | None) -> float:
    """95% CI half-width over the figure: the windows' (their IQR / median when too few for a
    CI), combined with the reference's when the figure is drift-corrected (``ref``)."""
    ci = timing.rel_ci if math.isfinite(timing.rel_ci) else timing.rel_spread
    if ref is not None:
        rci = ref["reference_rel_ci"]
        rci = rci if math.isfinite(rci) else ref["reference_rel_spread"]
        ci = math.hypot(ci, DRIFT_EXPONENT * rci)
    return ci


def _log_var(timing: Timing, rel_ci: float) -> float:
    """Observed-noise variance of log(throughput): the CI as a standard deviation, plus the
    repeat-to-repeat floor; a flagged figure gets at least a large fixed variance."""
    sd = rel_ci / 1.96 if math.isfinite(rel_ci) else 0.5
    var = sd * sd + REPEAT_LOG_SD**2
    if timing.contended:
        clean = any(not f.get("contended") for f in timing.guard_figures)
        var = max(var, CONTENDED_LOG_VAR if clean else UNTRUSTED_LOG_VAR)
    return var


def summarize(timing: Timing, units_per_step: float, flops_per_step: float,
              peak_flops: float | None, n_devices: int = 1, *, units: str | None = None,
              reference_nominal: float | None = None) -> dict[str, float]:
    """Metrics of a timing: step time, its noise, throughput, achieved TFLOP/s and MFU.

    ``units_per_step`` and ``flops_per_step`` are global (all devices); ``peak_flops`` is one
    device's peak FLOP/s. ``mfu = flops_per_step / step_time_s / (peak_flops * n_devices)``;
    NaN when the peak is unknown.

    Args:
        timing: From :func:`time_steps`.
        units_per_step: Tokens or samples per optimizer step.
        flops_per_step: Model FLOPs per optimizer step.
        peak_flops: Peak FLOP/s of one device, or ``None``.
        n_devices: Devices the step ran on.
        units: If given (e.g. ``"tokens"``), also ``<units>_per_s``, ``<units>_per_s_per_device``
            (the same figures as ``throughput`` and ``throughput_per_device``).
        reference_nominal: The machine's nominal reference speed
            (:func:`~cubicml_lab.hardware.reference_nominal`); with it and a reference
            measured, ``throughput`` is drift-corrected.

    Drift correction: with ``reference_nominal`` and a measured reference, ``step_time_s`` is
    the median window step time ``step_time_raw_s`` scaled to the machine at its nominal speed,
    ``* (reference_speed / reference_nominal) ** DRIFT_EXPONENT``, and every figure derived from
    it (``throughput``, ``<units>_per_s``, ``achieved_tflops``, ``mfu``) follows, so that
    ``throughput * step_time_s == units_per_step`` always holds; ``drift_corrected`` (1.0 /
    0.0) says whether it was applied. ``throughput_raw`` and ``step_time_raw_s`` are the
    figures as measured.

    Returns:
        ``step_time_s, step_time_raw_s, step_time_rel_spread, step_time_rel_ci, steps_timed,
        warmup_steps, windows, target_met (1.0/0.0), outlier_steps, units_per_step,
        flops_per_step, throughput`` (units/s, drift-corrected when possible),
        ``drift_corrected``, ``throughput_raw`` (units / median raw step time),
        ``throughput_rel`` (units per reference step: raw over ``reference_speed``, the full
        ratio; NaN without a reference),
        ``throughput_rel_ci`` (95% CI half-width of ``throughput`` over it: the windows' and,
        when corrected, the reference's), ``throughput_log_var`` (observed-noise variance of
        log ``throughput``, for a GP: ``(rel_ci / 1.96)**2 + REPEAT_LOG_SD**2``, at least
        ``CONTENDED_LOG_VAR`` or ``UNTRUSTED_LOG_VAR`` when flagged), ``throughput_per_device,
        achieved_tflops (TFLOP/s, all devices), peak_tflops (one device; NaN if unknown), mfu
        (0-1), n_devices, measure_s``, plus :func:`guard_metrics` and
        :func:`reference_metrics`.
    """
    t_raw = timing.median_step_time_s
    raw = units_per_step / t_raw if t_raw > 0 else math.nan
    peak = float(peak_flops) if peak_flops else math.nan
    ref = reference_metrics(timing)
    corrected = bool(reference_nominal) and math.isfinite(ref["reference_speed"])
    # the step time this step would take on the machine at its nominal speed
    t = (t_raw * (ref["reference_speed"] / reference_nominal) ** DRIFT_EXPONENT
         if corrected else t_raw)
    throughput = units_per_step / t if t > 0 else math.nan
    achieved = flops_per_step / t if t > 0 else math.nan
    rel_ci = _rel_ci(timing, ref if corrected else None)
    out = {"step_time_s": t, "step_time_raw_s": t_raw, "step_time_rel_spread": timing.rel_spread,
           "step_time_rel_ci": timing.rel_ci, "steps_timed": float(timing.steps_timed),
           "warmup_steps": float(timing.warmup_steps), "windows": float(timing.windows),
           "target_met": 1.0 if timing.target_met else 0.0,
           "outlier_steps": float(timing.outlier_steps), "units_per_step": float(units_per_step),
           "flops_per_step": float(flops_per_step), "throughput": throughput,
           "throughput_raw": raw, "throughput_rel": raw / ref["reference_speed"],
           "drift_corrected": 1.0 if corrected else 0.0, "throughput_rel_ci": rel_ci,
           "throughput_log_var": _log_var(timing, rel_ci),
           "throughput_per_device": throughput / n_devices, "achieved_tflops": achieved / 1e12,
           "peak_tflops": peak / 1e12, "mfu": achieved / (peak * n_devices),
           "n_devices": float(n_devices), "measure_s": timing.elapsed_s,
           **guard_metrics(timing), **ref}
    if units:
        out[f"{units}_per_s"] = throughput
        out[f"{units}_per_s_per_device"] = throughput / n_devices
    return out
