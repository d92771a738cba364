"""Figures from step times a job reported itself (a user's command, its metrics file or logs).

:func:`time_steps` times a step function the lab calls; a program the lab only launches reports
its steps instead. :func:`reported_timing` turns those reports into the same
:class:`~cubicml_lab.timing.figures.Timing` record, by the same rules: the first report is never
timed, warm-up lasts until the last 3 agree within ``settle_rel`` (or a warm-up budget is spent),
then the steps are grouped into windows of at least ``window_min_s`` (shorter where ``max_steps``
would leave fewer than 8), whose median and order-statistic 95% CI are the figure
(:func:`~cubicml_lab.timing.figures.median_rel_ci`).
:func:`reported_stop` says when the job has given enough: the CI target met after ``min_steps``,
``max_steps`` timed, or ``max_time_s`` of timed steps; or, given ``losing_step_s`` (from a
campaign's best so far), once its windows show it cannot beat that, by the rule a timed step
stops by (:func:`~cubicml_lab.timing.steps.is_losing`). Importing this module imports no torch.

Example:
    >>> from cubicml_lab.timing import MeasureOptions
    >>> o = MeasureOptions(min_steps=5, window_min_s=0.0)
    >>> t = reported_timing([(1, 0.5)] + [(1, 0.1)] * 40, o)
    >>> t.warmup_steps, round(t.median_step_time_s, 3), reported_stop(t, o)
    (4, 0.1, 'target met')
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .figures import Timing, median_rel_ci, quantile
from .steps import MeasureOptions, _settled, _steps_per_window, is_losing

__all__ = ["reported_stop", "reported_timing"]


def _warmup_end(values: Sequence[float], o: MeasureOptions) -> int:
    """How many reports are warm-up: ``warmup_min_steps`` at least, then until the last 3 (never
    the first) settle or the warm-up budget (reports or seconds) is spent."""
    spent = 0.0
    for n in range(1, len(values) + 1):
        spent += values[n - 1]
        if n < o.warmup_min_steps:
            continue
        if n >= o.warmup_max_steps or spent >= o.warmup_budget_s or \
                _settled(list(values[:n]), o.settle_rel):
            return n
    return len(values)


def reported_timing(reports: Sequence[tuple[int, float]], options: MeasureOptions,
                    elapsed_s: float = math.nan) -> Timing:
    """The :class:`Timing` of a job's reported steps.

    Args:
        reports: In order, ``(steps, seconds per step)`` of each report: one optimizer step, or
            a log line averaging ``steps`` of them (Megatron-LM's ``log_interval``).
        options: Warm-up, window and stopping rules (:class:`MeasureOptions`).
        elapsed_s: Seconds the job ran so far (``Timing.elapsed_s``).

    Returns:
        The record; with too few reports for a window, ``windows == 0`` and NaN figures.
    """
    values = [float(v) for _, v in reports]
    warm = _warmup_end(values, options)
    recent = sorted(values[1:warm][-3:] or values[:warm] or [math.nan])
    est = recent[len(recent) // 2]
    k = _steps_per_window(est, options)
    windows: list[float] = []
    steps, secs, timed = 0, 0.0, 0
    for n, v in reports[warm:]:
        steps, secs = steps + n, secs + n * v
        if steps >= k:
            windows.append(secs / steps)
            timed += steps
            steps, secs = 0, 0.0
    s = sorted(windows)
    med = quantile(s, 0.5) if s else math.nan
    mad = quantile(sorted(abs(x - med) for x in s), 0.5) if s else math.nan
    rel_ci = median_rel_ci(windows) if windows else math.inf
    return Timing(step_times_s=windows, warmup_steps=sum(n for n, _ in reports[:warm]),
                  warmup_step_times_s=values[:warm], steps_per_window=k, steps_timed=timed,
                  windows=len(windows), median_step_time_s=med,
                  rel_spread=(quantile(s, 0.75) - quantile(s, 0.25)) / med if s else math.nan,
                  rel_ci=rel_ci,
                  target_met=rel_ci <= options.target_rel_ci and timed >= options.min_steps,
                  outlier_steps=sum(x > med + 3 * 1.4826 * mad for x in s),
                  stop_reason="reported", elapsed_s=elapsed_s)


def reported_stop(timing: Timing, options: MeasureOptions) -> str | None:
    """Why a job that reported ``timing`` can be stopped now, or None: ``"target met"`` (CI
    within ``target_rel_ci`` after ``min_steps``), ``"max_steps"`` or ``"max_time_s"`` (of
    timed steps, once ``min_steps`` are timed), else ``"losing"``: ``options.losing_step_s``
    is set and at least 6 windows put the lower end of their median's CI above it
    (:func:`~cubicml_lab.timing.steps.is_losing`, the rule :func:`time_steps` stops by; the
    caller gives the bound in the windows' own unit: seconds per step, or per token or sample
    for a log of rates).

    Example:
        >>> o = MeasureOptions(min_steps=50, window_min_s=0.0, losing_step_s=0.05)
        >>> reported_stop(reported_timing([(1, 0.1)] * 12, o), o)
        'losing'
    """
    if timing.steps_timed >= options.min_steps:
        if timing.target_met:
            return "target met"
        if timing.steps_timed >= options.max_steps:
            return "max_steps"
        timed_s = sum(timing.step_times_s) * max(1, timing.steps_timed) / max(1, timing.windows)
        if timed_s >= options.max_time_s:
            return "max_time_s"
    return "losing" if is_losing(timing.step_times_s, options.losing_step_s) else None
