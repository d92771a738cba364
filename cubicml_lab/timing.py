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
* :func:`summarize` turns a :class:`Timing` into metrics: ``step_time_s`` (median), its relative
  spread and CI, ``throughput`` (units/s), ``achieved_tflops`` and ``mfu`` (0-1).
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
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Any

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
           "summarize", "time_steps"]

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

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            ok_type = (isinstance(value, int) if f.type == "int"
                       else isinstance(value, (int, float)) and math.isfinite(value))
            if isinstance(value, bool) or not ok_type:
                raise MeasurementError(f"MeasureOptions.{f.name} = {value!r} must be a finite "
                                       f"{f.type}", hint=f"default: {f.default!r}")
        checks = [("target_rel_ci", self.target_rel_ci > 0, "> 0"),
                  ("min_steps", self.min_steps >= 1, ">= 1"),
                  ("max_steps", self.max_steps >= self.min_steps, ">= min_steps"),
                  ("max_time_s", self.max_time_s > 0, "> 0"),
                  ("warmup_min_steps", self.warmup_min_steps >= 1, ">= 1 (never time step 1)"),
                  ("warmup_max_steps", self.warmup_max_steps >= self.warmup_min_steps,
                   ">= warmup_min_steps"),
                  ("warmup_max_s", self.warmup_max_s >= 0, ">= 0"),
                  ("settle_rel", self.settle_rel > 0, "> 0"),
                  ("window_min_s", self.window_min_s >= 0, ">= 0")]
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
        stop_reason: Why timing stopped: ``"target met"``, ``"max_steps"`` or ``"max_time_s"``.
        elapsed_s: Seconds spent in :func:`time_steps` (warm-up + timing + collection).
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


def _settled(times: list[float], rel: float) -> bool:
    """Whether the last 3 step times (never the first) are within ``rel`` of their median."""
    if len(times) < 4:
        return False
    last = sorted(times[-3:])
    return max(last[2] - last[1], last[1] - last[0]) <= rel * last[1]


def time_steps(step: Callable[[], Any], *, sync: Callable[[], None] | None = None,
               options: MeasureOptions = MeasureOptions(), timer: StepTimer | None = None,
               reduce: Callable[[float], float] | None = None) -> Timing:
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

    Multi-process runs pass ``reduce`` (e.g. an all-reduce MAX over ranks): every measured time,
    warm-up step or window, is replaced by its reduced value right after the clock stops (outside
    the window), so the slowest rank's time is reported, as Megatron-LM does, and every rank makes
    the same warm-up and stopping decisions. Budgets therefore count measured (reduced) time, not
    the clock between windows.

    Args:
        step: One training step; its return value is ignored.
        sync: Blocks until queued device work is done; used by the default timer only.
        options: Budgets and targets.
        timer: The clock; default ``StepTimer(sync)`` (:func:`make_timer` gives CUDA events).
        reduce: Maps a rank's measured seconds to the value all ranks agree on; ``None`` alone.

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
    warm: list[float] = []
    while True:
        timer.start()
        step()
        warm.append(agree(timer.stop()))
        n, spent = len(warm), sum(warm)
        budget_spent = n >= o.warmup_max_steps or spent >= o.warmup_max_s
        if n >= o.warmup_min_steps and (budget_spent or _settled(warm, o.settle_rel)):
            break
    recent = sorted(warm[1:][-3:] or warm)  # the first step (compilation...) says nothing
    est = max(recent[len(recent) // 2], 1e-9)
    k = max(1, min(math.ceil(o.window_min_s / est), o.max_steps // _MIN_WINDOWS))
    times: list[float] = []
    steps, stop_reason, rel_ci = 0, "max_steps", math.inf
    gc_was_enabled = gc.isenabled()
    gc.collect()
    timed_s = 0.0  # measured seconds of the windows so far
    try:
        gc.disable()
        while True:
            n = k if steps + k <= o.max_steps else o.max_steps - steps
            if n <= 0 or (n < k and steps >= o.min_steps):
                break  # max_steps (a short last window only to reach min_steps)
            if steps >= o.min_steps and timed_s + k * _quantile(sorted(times), 0.5) > o.max_time_s:
                stop_reason = "max_time_s"
                break
            gc.collect(1)
            timer.start()
            for _ in range(n):
                step()
            window_s = agree(timer.stop())
            times.append(window_s / n)
            timed_s += window_s
            steps += n
            rel_ci = _median_rel_ci(times)
            if steps >= o.min_steps and rel_ci <= o.target_rel_ci:
                stop_reason = "target met"
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    s = sorted(times)
    med = _quantile(s, 0.5)
    mad = _quantile(sorted(abs(x - med) for x in s), 0.5)
    iqr = _quantile(s, 0.75) - _quantile(s, 0.25)
    return Timing(step_times_s=times, warmup_steps=len(warm), warmup_step_times_s=warm,
                  steps_per_window=k, steps_timed=steps, windows=len(times),
                  median_step_time_s=med, rel_spread=iqr / med if med > 0 else math.nan,
                  rel_ci=rel_ci, target_met=rel_ci <= o.target_rel_ci,
                  outlier_steps=sum(x > med + 3 * 1.4826 * mad for x in s),
                  stop_reason=stop_reason, elapsed_s=time.perf_counter() - t_begin)


def summarize(timing: Timing, units_per_step: float, flops_per_step: float,
              peak_flops: float | None, n_devices: int = 1, *, units: str | None = None
              ) -> dict[str, float]:
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
        units: If given (e.g. ``"tokens"``), also ``<units>_per_s``, ``<units>_per_s_per_device``.

    Returns:
        ``step_time_s, step_time_rel_spread, step_time_rel_ci, steps_timed, warmup_steps,
        windows, target_met (1.0/0.0), outlier_steps, units_per_step, flops_per_step,
        throughput (units/s), throughput_per_device, achieved_tflops (TFLOP/s, all devices),
        peak_tflops (one device; NaN if unknown), mfu (0-1), n_devices, measure_s``.
    """
    t = timing.median_step_time_s
    throughput = units_per_step / t if t > 0 else math.nan
    achieved = flops_per_step / t if t > 0 else math.nan
    peak = float(peak_flops) if peak_flops else math.nan
    out = {"step_time_s": t, "step_time_rel_spread": timing.rel_spread,
           "step_time_rel_ci": timing.rel_ci, "steps_timed": float(timing.steps_timed),
           "warmup_steps": float(timing.warmup_steps), "windows": float(timing.windows),
           "target_met": 1.0 if timing.target_met else 0.0,
           "outlier_steps": float(timing.outlier_steps), "units_per_step": float(units_per_step),
           "flops_per_step": float(flops_per_step), "throughput": throughput,
           "throughput_per_device": throughput / n_devices, "achieved_tflops": achieved / 1e12,
           "peak_tflops": peak / 1e12, "mfu": achieved / (peak * n_devices),
           "n_devices": float(n_devices), "measure_s": timing.elapsed_s}
    if units:
        out[f"{units}_per_s"] = throughput
        out[f"{units}_per_s_per_device"] = throughput / n_devices
    return out
