"""How a training step is timed: :func:`time_steps` (warm-up, timed windows, the contention
guard and the drift reference between windows), which returns a
:class:`~cubicml_lab.timing.figures.Timing`. What it is told, :class:`MeasureOptions`, lives in
:mod:`~cubicml_lab.timing.options`, and the clocks it reads (:class:`StepTimer`,
:class:`CudaEventTimer`, :func:`make_timer`) in :mod:`~cubicml_lab.timing.clocks`; both are
imported here too. Importing this module imports no torch.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..hardware import wait_for_idle
from ..hardware.drift import corrected_step_time
from .clocks import CudaEventTimer, StepTimer, make_timer
from .figures import Timing, median_rel_ci, quantile
from .options import MAX_IDLE_WAIT_S, MeasureOptions

__all__ = ["MAX_IDLE_WAIT_S", "CudaEventTimer", "MeasureOptions", "StepTimer", "WindowGuard",
           "is_losing", "make_timer", "time_steps"]

_MIN_WINDOWS = 8  # windows shrink below window_min_s if needed so that max_steps holds this many


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
        budget_spent = n >= o.warmup_max_steps or spent >= o.warmup_budget_s
        if n >= o.warmup_min_steps and (budget_spent or _settled(warm, o.settle_rel)):
            return warm


class _Windows:
    """The timed phase's state: clean, discarded and set-aside windows, reference samples,
    budgets, and whether the windows are gated on the machine's usual speed."""

    def __init__(self, o: MeasureOptions, agree: Callable[[float], float],
                 guard: WindowGuard | None, reference: Callable[[], float] | None,
                 usual: float | None) -> None:
        self.o, self.agree, self.guard, self.reference = o, agree, guard, reference
        self.times: list[float] = []  # clean windows, seconds per step
        self.pairs: list[float] = []  # per clean window, its neighbours' reference (NaN: none)
        self.dirty: list[float] = []  # discarded windows, seconds per step
        self.figures: list[dict[str, float]] = []
        self.refs: list[float] = []
        self.steps, self.timed_s, self.dirty_s, self.ref_s = 0, 0.0, 0.0, 0.0
        self.phase_s = 0.0  # every window and reference sample so far (what the gate may last)
        # drift gate: the usual reference step time (agreed by all ranks), and what was set aside
        usual = agree(usual or 0.0) if reference is not None and o.reference_share > 0 else 0.0
        self.usual = usual if usual > 0 and o.drift_tol > 0 else None
        self.gating = self.usual is not None
        self.per_window = (o.drift_per_window and reference is not None
                           and o.reference_share > 0)
        # (seconds per step, steps, window seconds, neighbours' reference)
        self.off: list[tuple[float, int, float, float]] = []
        self.off_s = 0.0
        self.last_ref: float | None = None

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

    @property
    def each_window(self) -> bool:
        """Whether the reference is sampled right after every window (gating, or correcting
        each window by its neighbours)."""
        return self.gating or self.per_window

    def sample_reference(self) -> float:
        """One reference sample if one is due (5 at least, then ``reference_share`` of time;
        every time while sampling after each window); returns the seconds it took (0 if none)."""
        if self.reference is None or self.o.reference_share <= 0:
            return 0.0
        if (not self.each_window and len(self.refs) >= _REF_MIN
                and self.ref_s >= self.o.reference_share * self.timed_s):
            return 0.0
        t0 = time.perf_counter()
        contended, per_step = self.guarded(self.reference, record=False)
        spent = self.agree(time.perf_counter() - t0)  # ranks decide alike on agreed time
        self.ref_s += spent
        self.phase_s += spent
        if contended:
            self.dirty_s += spent
            self.last_ref = None
        else:
            self.refs.append(per_step)
            self.last_ref = per_step
        return spent

    def off_state(self, ref: float | None) -> bool:
        """Whether a reference step time puts the machine off its usual speed (gating only)."""
        return (self.usual is not None and ref is not None
                and abs(math.log(ref / self.usual)) > self.o.drift_tol)

    def window(self, step: Callable[[], Any], timer: StepTimer, n: int) -> None:
        """Time one window of ``n`` steps; keep it if clean, else count it as discarded; while
        sampling after each window, sample the reference right after it, pair the window with
        the samples on either side, and (gating) set it aside if the machine was off its usual
        speed on either side (a switch of state may fall inside the window)."""

        def run() -> float:
            timer.start()
            for _ in range(n):
                step()
            return timer.stop()

        gc.collect(1)
        before = self.last_ref
        contended, window_s = self.guarded(run)
        self.phase_s += window_s
        if contended:
            self.dirty.append(window_s / n)
            self.dirty_s += window_s
            return
        pair = math.nan
        if self.each_window:
            spent = self.sample_reference()
            sides = [r for r in (before, self.last_ref) if r is not None]
            if sides:  # geometric mean of the clean samples on either side
                pair = math.exp(sum(map(math.log, sides)) / len(sides))
            if self.gating and any(self.off_state(r) for r in sides):
                self.off.append((window_s / n, n, window_s, pair))
                self.off_s += window_s + spent
                if self.phase_s > self.o.drift_budget * self.o.max_time_s:
                    self.stop_gating()
                return
        self.times.append(window_s / n)
        self.pairs.append(pair)
        self.timed_s += window_s
        self.steps += n

    def stop_gating(self) -> None:
        """Stop waiting for the usual speed: the set-aside windows join the clean ones (the
        latest of them, as many as ``max_steps`` leaves room for)."""
        self.gating = False
        room, join = self.o.max_steps - self.steps, []
        for per_step, n, window_s, pair in reversed(self.off):
            if n > room:
                break
            room -= n
            join.append((per_step, n, window_s, pair))
        for per_step, n, window_s, pair in reversed(join):
            self.times.append(per_step)
            self.pairs.append(pair)
            self.timed_s += window_s
            self.steps += n

    def figure_refs(self) -> list[float]:
        """The reference samples behind the figure: those at the usual speed while the set-aside
        windows are left out (all of them when none were or gating stopped)."""
        if not self.gating or not self.off:
            return self.refs
        return [r for r in self.refs if not self.off_state(r)] or self.refs

    def window_refs(self) -> list[float]:
        """Per clean window, the reference step time ``drift_per_window`` corrects it by: its
        neighbours', or where it has none the median of :meth:`figure_refs` (at least one clean
        sample needed)."""
        med = quantile(sorted(self.figure_refs()), 0.5)
        return [p if math.isfinite(p) else med for p in self.pairs]

    def figure_ci(self) -> float:
        """The CI timing stops on: the windows' median's, or with ``drift_per_window`` the
        median's of the windows each corrected by its neighbours' reference."""
        if not self.times:
            return math.inf
        if not self.per_window or not self.refs:  # no clean sample yet: the raw windows'
            return median_rel_ci(self.times)
        return median_rel_ci([corrected_step_time(t, 1.0 / r)  # as summarize() corrects them
                              for t, r in zip(self.times, self.window_refs())])


def time_steps(step: Callable[[], Any], *, sync: Callable[[], None] | None = None,
               options: MeasureOptions = MeasureOptions(), timer: StepTimer | None = None,
               reduce: Callable[[float], float] | None = None,
               guard: WindowGuard | None = None,
               reference: Callable[[], float] | None = None,
               reference_usual: float | None = None) -> Timing:
    """Time ``step`` in steady state: warm up until settled, then time windows of steps.

    Warm-up runs single steps, each synchronised and timed, until ``warmup_min_steps`` ran and
    the last 3 (never the first, which carries one-time costs) are within ``settle_rel`` of
    their median, or a warm-up budget is spent: at least 4 steps unless a budget ends it. Timing
    then runs windows of ``k = ceil(window_min_s / warm-up step time)`` steps (at most
    ``max_steps // 8``, so that the budget holds 8 windows: the order-statistic CI of a median
    needs 6), reading the clock and synchronising only at window edges. It stops once
    ``min_steps`` are timed and the median's CI is within ``target_rel_ci``, or when the next
    window would pass ``max_steps`` or ``max_time_s``, or (``losing_step_s``) once the clean
    windows show the step slower than that for sure (``stop_reason == "losing"``). Garbage: one full collection before
    timing, generation 1 between windows, none inside them (the caller's gc state is restored,
    also when ``step`` raises).

    Contention: with a ``guard`` (and ``options.guard``), a window the guard calls contended is
    discarded and re-timed; discarded windows count against ``contended_budget``, not the other
    budgets. When that runs out timing stops, and with fewer than 6 clean windows the timing is
    ``contended`` (flagged). Drift: ``reference`` (seconds per step of a fixed reference
    workload, e.g. :meth:`~cubicml_lab.hardware.ReferenceWork.sample`) is sampled before the
    first window and between windows, guarded alike, for ``reference_share`` of the time.

    Speed states: a machine shared with tenants it cannot see (a virtual machine's neighbours,
    a host's power states) may switch between a few speeds for seconds at a time, and
    configurations feel a switch unequally, so no single correction takes it out. Given the
    reference step time the machine usually has (``reference_usual``, e.g. from
    :func:`~cubicml_lab.hardware.reference_usual`; and ``options.drift_tol > 0``), the reference
    is sampled after every window, and a window next to a sample further than ``drift_tol`` from
    it is set aside and re-timed, as a contended one is; once the timed phase (every window and
    reference sample) has lasted ``drift_budget * max_time_s`` seconds, timing stops waiting and
    keeps them all. The figure then comes
    from windows at the usual speed (``Timing.drift_gated``) and the drift correction from the
    reference samples taken at it.

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
        reference_usual: Seconds per reference step at the machine's usual speed; ``None``:
            unknown, every window is kept.

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
    idle = _wait_for_idle(o.wait_for_idle_s) if o.wait_for_idle_s > 0 else {}
    t_begin = time.perf_counter()
    warm = _warm_up(step, timer, agree, o)
    recent = sorted(warm[1:][-3:] or warm)  # the first step (compilation...) says nothing
    k = _steps_per_window(max(recent[len(recent) // 2], 1e-9), o)
    w = _Windows(o, agree, guard if o.guard else None, reference, reference_usual)
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
                    and w.timed_s + k * quantile(sorted(w.times), 0.5) > o.max_time_s):
                stop_reason = "max_time_s"
                break
            if (w.times or w.dirty) and w.dirty_s > o.contended_budget * o.max_time_s:
                stop_reason = "contended"
                break
            w.window(step, timer, n)
            if not w.each_window:  # else window() sampled the reference after the window
                w.sample_reference()
            rel_ci = w.figure_ci()
            if w.steps >= o.min_steps and rel_ci <= o.target_rel_ci:
                stop_reason = "target met"
                break
            if is_losing(w.times, o.losing_step_s):
                stop_reason = "losing"
                break
        if w.gating and w.off and len(w.times) < _CLEAN_MIN:
            w.stop_gating()  # too few windows at the usual speed: keep every window
    finally:
        if gc_was_enabled:
            gc.enable()
    return replace(_timing(w, warm, k, stop_reason, time.perf_counter() - t_begin), idle=idle)


def _steps_per_window(step_s: float, o: MeasureOptions) -> int:
    """Steps per timed window for steps of about ``step_s`` seconds: enough for
    ``window_min_s``, but no more than ``max_steps`` allows for :data:`_MIN_WINDOWS` windows
    (a fast step would otherwise leave too few windows for a CI); 1 where ``step_s`` is not a
    positive time. The one rule for :func:`time_steps` and a job's reports
    (:func:`~cubicml_lab.timing.reported.reported_timing`)."""
    if not step_s > 0:
        return 1
    return max(1, min(math.ceil(o.window_min_s / step_s), o.max_steps // _MIN_WINDOWS))


def is_losing(times: Sequence[float], losing_step_s: float | None) -> bool:
    """Whether the windows so far (seconds per step each; at least :data:`_CLEAN_MIN` of them)
    put the lower end of their median's 95% CI above ``losing_step_s``
    (``MeasureOptions.losing_step_s``): the step is surely slower than that. The one rule for
    :func:`time_steps` (its clean windows) and a job's reports
    (:func:`~cubicml_lab.timing.reported.reported_stop`).

    Example:
        >>> is_losing([0.2] * 6, 0.1), is_losing([0.2] * 5, 0.1), is_losing([0.2] * 6, None)
        (True, False, False)
    """
    if losing_step_s is None or len(times) < _CLEAN_MIN:
        return False
    med = quantile(sorted(times), 0.5)
    return med * (1.0 - median_rel_ci(times)) > losing_step_s


def _wait_for_idle(timeout_s: float) -> dict[str, float]:
    """:func:`~cubicml_lab.hardware.wait_for_idle` with a progress bar once the cores are
    found busy (on stderr: a notebook shows it under the cell; a subprocess trial's log keeps
    it)."""
    bar: Any = None

    def show(waited: float, others: float) -> None:
        nonlocal bar
        if bar is None:
            from tqdm.auto import tqdm

            bar = tqdm(total=round(timeout_s), unit="s", desc="waiting for idle cores",
                       bar_format="{desc}: {n:.0f} of {total:.0f} s{postfix}", leave=False)
        bar.set_postfix_str(f"other work uses {others:.1f} cores")
        bar.update(min(round(waited), bar.total) - bar.n)

    try:
        return wait_for_idle(timeout_s, on_sample=show)
    finally:
        if bar is not None:  # the wait is over, found or not: no red "stopped early" bar
            bar.n = bar.total
            bar.close()


def _timing(w: _Windows, warm: list[float], k: int, stop_reason: str, elapsed: float) -> Timing:
    """The :class:`Timing` of a finished timed phase (a flagged one from its clean windows if
    any, else from the discarded ones)."""
    contended = stop_reason == "contended" and len(w.times) < _CLEAN_MIN
    times = w.times or w.dirty
    s = sorted(times)
    med = quantile(s, 0.5)
    mad = quantile(sorted(abs(x - med) for x in s), 0.5)
    iqr = quantile(s, 0.75) - quantile(s, 0.25)
    rel_ci = median_rel_ci(times)
    stop_ci = w.figure_ci() if w.times else rel_ci
    return Timing(step_times_s=times, warmup_steps=len(warm), warmup_step_times_s=warm,
                  steps_per_window=k, steps_timed=w.steps if w.times else k * len(w.dirty),
                  windows=len(times), median_step_time_s=med,
                  rel_spread=iqr / med if med > 0 else math.nan, rel_ci=rel_ci,
                  target_met=stop_ci <= w.o.target_rel_ci and not contended,
                  outlier_steps=sum(x > med + 3 * 1.4826 * mad for x in s),
                  stop_reason=stop_reason, elapsed_s=elapsed, contended=contended,
                  contended_windows=len(w.dirty), contended_s=w.dirty_s,
                  guard_figures=w.figures, reference_times_s=w.figure_refs(),
                  window_reference_s=(w.window_refs() if w.per_window and w.times and w.refs
                                      else []),
                  offstate_windows=len(w.off), offstate_s=w.off_s,
                  drift_gated=w.usual is not None and w.gating,
                  reference_usual_s=w.usual if w.usual is not None else math.nan)
