"""Drift correction's arithmetic: one home for how a figure is put on the machine's nominal speed.

A drift reference (:class:`~cubicml_lab.hardware.ReferenceWork` or a
:class:`~cubicml_lab.hardware.StepReference`) is timed beside a trial. Its speed over the
machine's nominal one (``speed_ratio = reference_speed / nominal``, both in reference steps/s)
says how fast the machine ran, and a step time ``t`` (s) is corrected to
``t * speed_ratio ** DRIFT_EXPONENT`` (:func:`corrected_step_time`); a rate (units/s) is divided
by the same factor. A trial's *shift* is ``log(corrected / raw) / DRIFT_EXPONENT``, the log of
nominal over reference speed (:func:`drift_shift`). Figures corrected at another slope ``s`` are
``corrected * exp((s - DRIFT_EXPONENT) * shift)`` (:func:`at_slope`); the slope one configuration
feels is fitted from its fresh processes (:func:`own_drift_fit`) and pooled across trials
(:class:`DriftSlopePool`). The speed a machine is usually at, which the speed-state gate holds
windows to, is :func:`usual_speed`.

The timing (:mod:`cubicml_lab.timing`), the launchers (``launch.Repeated``), the trial's
records and the searchers call these; the measured grounds of each constant are in
``docs/results.md``. Pure arithmetic: importing it imports no torch and no sibling module.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from typing import Any

__all__ = ["DRIFT_BOUNDS", "DRIFT_EXPONENT", "DRIFT_PRIOR_SD", "REPEAT_LOG_SD", "USUAL_MIN",
           "USUAL_MOVED", "DriftSlopePool", "applied_factor", "at_slope", "corrected_step_time",
           "drift_shift", "drift_shifts", "drift_slope_sums", "own_drift_fit", "own_drift_slope",
           "posterior_slope", "rescale_figures", "usual_speed"]

#: Repeat-to-repeat noise of a clean CPU figure that its own windows cannot see, as a standard
#: deviation of its log (0.025: 2.5%); the floor of a figure's observed noise, and the noise of
#: each process's log figure in a drift-slope fit.
REPEAT_LOG_SD = 0.025
#: How much of the reference's drift the corrected figure takes out: ``throughput_corrected =
#: raw * (nominal / reference_speed) ** DRIFT_EXPONENT``. 1.0, all of it, because the reference
#: has about the trial's rows per matmul (:func:`~cubicml_lab.hardware.reference_rows`) and so
#: feels what the trial feels; how much a configuration feels beyond that is its own slope,
#: fitted where its processes show it (:func:`own_drift_fit`).
DRIFT_EXPONENT = 1.0
#: Standard deviation of the normal prior (mean :data:`DRIFT_EXPONENT`) on a drift slope learned
#: from data: a search's (``cubicml_lab.search.bayesian.learn_drift``) and a trial's own, from
#: its fresh processes (:func:`own_drift_slope`).
DRIFT_PRIOR_SD = 0.5
#: A learned drift slope is kept within these bounds (0: raw figures; 2: twice the reference's).
DRIFT_BOUNDS = (0.0, 2.0)
#: Recent figures needed before :func:`usual_speed` names a usual speed.
USUAL_MIN = 5
#: This many latest figures that agree with each other and not with the usual speed make theirs
#: the usual one: the machine has moved (each of those trials waited for the old speed in vain).
USUAL_MOVED = 3


def corrected_step_time(step_time_s: float, speed_ratio: float) -> float:
    """A step time (s) on the machine at its nominal speed: ``step_time_s * speed_ratio **
    DRIFT_EXPONENT``, ``speed_ratio`` being the reference's speed over its nominal one.

    Example:
        >>> corrected_step_time(0.2, 0.8)  # the reference ran 20% slow: the step is faster
        0.16000000000000003
    """
    return step_time_s * speed_ratio ** DRIFT_EXPONENT


def drift_shift(raw: float, corrected: float) -> float:
    """A figure's shift: ``log(corrected / raw) / DRIFT_EXPONENT``, the log of the machine's
    nominal over its measured reference speed (0: no correction).

    Example:
        >>> round(drift_shift(100.0, 110.0), 4)
        0.0953
    """
    return math.log(corrected / raw) / DRIFT_EXPONENT


def applied_factor(raw: float, corrected: float) -> float:
    """The factor the correction multiplied a raw rate by (> 1: the reference ran slow).

    Example:
        >>> applied_factor(100.0, 110.0)
        1.1
    """
    return corrected / raw


def at_slope(corrected: Any, shift: Any, slope: float) -> Any:
    """A figure corrected with ``DRIFT_EXPONENT`` re-corrected at ``slope`` instead:
    ``corrected * exp((slope - DRIFT_EXPONENT) * shift)``; works elementwise on numpy arrays.

    Example:
        >>> at_slope(110.0, drift_shift(100.0, 110.0), 0.0)  # slope 0: the raw figure
        100.0
    """
    x = (slope - DRIFT_EXPONENT) * shift
    if isinstance(x, (int, float)):
        return corrected * math.exp(x)
    import numpy as np  # arrays: numpy's exp, elementwise

    return corrected * np.exp(x)


def drift_slope_sums(raw: list[float], shift: list[float]) -> tuple[float, float]:
    """What one trial's processes say of its drift slope: ``(sxx, sxy)``, the sums of squares
    and cross-products about their means of ``shift_i`` and ``log raw_i`` (see
    :func:`own_drift_slope`). Sums from trials that share a slope add up; a trial whose
    processes' references read alike adds ``sxx`` near 0: nothing.

    Example:
        >>> [round(x, 4) for x in drift_slope_sums([100.0, 130.0], [0.4, 0.0])]
        [0.08, -0.0525]
    """
    n = len(raw)
    ms, my = sum(shift) / n, sum(math.log(r) for r in raw) / n
    return (sum((x - ms) ** 2 for x in shift),
            sum((x - ms) * (math.log(r) - my) for x, r in zip(shift, raw)))


def posterior_slope(sxx: float, sxy: float, prior_mean: float = DRIFT_EXPONENT) -> float:
    """The slope ``b`` of ``log raw = a - b * shift`` that :func:`drift_slope_sums` ``(sxx,
    sxy)`` give: its posterior mean under a normal prior of mean ``prior_mean`` and sd
    :data:`DRIFT_PRIOR_SD`, each log figure carrying :data:`REPEAT_LOG_SD` of noise of its own;
    within :data:`DRIFT_BOUNDS`.

    Example:
        >>> round(posterior_slope(0.0, 0.0, prior_mean=0.6), 3)  # no evidence: the prior
        0.6
    """
    noise, prior = REPEAT_LOG_SD**2, DRIFT_PRIOR_SD**2
    b = (-sxy / noise + prior_mean / prior) / (sxx / noise + 1.0 / prior)
    return min(max(b, DRIFT_BOUNDS[0]), DRIFT_BOUNDS[1])


def own_drift_slope(raw: list[float], shift: list[float],
                    prior_mean: float = DRIFT_EXPONENT) -> float:
    """How much of the drift reference's moves one configuration feels, from its repeats in
    fresh processes: the slope ``b`` of ``log raw_i = a - b * shift_i`` (``raw_i`` a process's
    raw figure, ``shift_i`` its ``log(nominal / reference speed)``), :func:`posterior_slope` of
    their :func:`drift_slope_sums`, with a prior of mean ``prior_mean`` (default
    :data:`DRIFT_EXPONENT`: the full correction). Processes whose references read alike say
    little and leave it near the prior; two whose references were 30% apart set it.

    Example:
        >>> round(own_drift_slope([100.0, 100.0], [0.0, 0.0]), 3)  # no move: the prior's mean
        1.0
        >>> round(own_drift_slope([100.0, 130.0], [0.4, 0.0]), 3)  # 0.4 of reference, 0.26 felt
        0.666
    """
    return posterior_slope(*drift_slope_sums(raw, shift), prior_mean=prior_mean)


def drift_shifts(raw: list[float], corrected: list[float]) -> list[float] | None:
    """Each process's :func:`drift_shift`; None where a figure is missing, NaN or not
    positive."""
    if not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0
               for x in [*raw, *corrected]):
        return None
    return [drift_shift(r, c) for c, r in zip(corrected, raw)]


def own_drift_fit(raw: list[float], corrected: list[float],
                  prior_mean: float = DRIFT_EXPONENT) -> tuple[float, float] | None:
    """A trial's processes re-corrected at their own drift slope: ``(slope, factor)``, the
    slope (:func:`own_drift_slope` of their :func:`drift_shifts`, with a prior of mean
    ``prior_mean``) and the factor that takes the geometric mean of the ``corrected`` figures
    (each with all of its reference's move out) to that of the raw figures corrected at the
    slope; None where a figure is missing, NaN or not positive.

    Example:
        >>> slope, factor = own_drift_fit([100.0, 130.0], [100.0 * math.exp(0.4), 130.0])
        >>> round(slope, 3), round(factor, 3)
        (0.666, 0.935)
    """
    shift = drift_shifts(raw, corrected)
    if shift is None:
        return None
    slope = own_drift_slope(raw, shift, prior_mean)
    return slope, math.exp((slope - DRIFT_EXPONENT) * sum(shift) / len(shift))


def rescale_figures(metrics: dict[str, float], factor: float, default_corrected: bool) -> None:
    """Multiply a trial's corrected rates by ``factor`` and divide its corrected step times by
    it, in place: ``throughput_corrected`` and ``step_time_corrected_s`` always, and with
    ``default_corrected`` (its default figures are the corrected ones) ``throughput``, per
    device, ``achieved_tflops``, ``mfu``, every ``*_per_s`` rate and ``step_time_s`` too.

    Example:
        >>> m = {"throughput_corrected": 100.0, "step_time_corrected_s": 0.5, "throughput": 90.0}
        >>> rescale_figures(m, 1.25, default_corrected=False); m
        {'throughput_corrected': 125.0, 'step_time_corrected_s': 0.4, 'throughput': 90.0}
    """
    rates, times = ["throughput_corrected"], ["step_time_corrected_s"]
    if default_corrected:
        rates += ["throughput", "throughput_per_device", "achieved_tflops", "mfu",
                  *(k for k in metrics if k.endswith(("_per_s", "_per_s_per_device")))]
        times.append("step_time_s")
    for name in rates + times:
        if name in metrics:
            metrics[name] = metrics[name] * factor if name in rates else metrics[name] / factor


class DriftSlopePool:
    """The drift-slope evidence of earlier trials, pooled by key (``Repeated`` keys it by
    workload and drift reference, whose configurations feel the machine alike): each trial
    adds its processes' :func:`drift_slope_sums`, and :meth:`prior` is the slope they give
    together, the mean of the next trial's prior. Safe to share between threads.

    Example:
        >>> pool = DriftSlopePool()
        >>> pool.prior("gpt") is None
        True
        >>> pool.add("gpt", [100.0, 130.0], [100.0 * math.exp(0.4), 130.0])
        >>> round(pool.prior("gpt"), 3)
        0.666
    """

    def __init__(self) -> None:
        self._sums: dict[Hashable, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def prior(self, key: Hashable) -> float | None:
        """The slope the trials under ``key`` showed together; None before the first."""
        with self._lock:
            sums = self._sums.get(key)
        return None if sums is None else posterior_slope(*sums)

    def add(self, key: Hashable, raw: list[float], corrected: list[float]) -> None:
        """Add one trial's processes (raw and corrected figures); nothing where a figure is
        missing, NaN or not positive (:func:`drift_shifts`)."""
        shift = drift_shifts(raw, corrected)
        if shift is None:
            return
        sxx, sxy = drift_slope_sums(raw, shift)
        with self._lock:
            old = self._sums.get(key, (0.0, 0.0))
            self._sums[key] = (old[0] + sxx, old[1] + sxy)

    def slopes(self) -> dict[Hashable, float]:
        """The slope each key's trials showed so far."""
        with self._lock:
            return {key: posterior_slope(*sums) for key, sums in self._sums.items()}

    def __repr__(self) -> str:
        return f"DriftSlopePool({ {k: round(v, 3) for k, v in self.slopes().items()} })"


def usual_speed(speeds: list[float], tol: float) -> float | None:
    """The speed most of ``speeds`` (oldest first) agree on: the median of the largest group
    within ``tol`` (in log) of one of them (ties: the group whose centre is nearest the overall
    median); but the median of the last :data:`USUAL_MOVED` when they lie within ``tol`` of each
    other and further from that; ``None`` for fewer than :data:`USUAL_MIN` figures.

    A machine that switches between speed states has several clusters; the mode, not the
    median, is the state it is usually in, until it settles in another.

    Example:
        >>> round(usual_speed([240, 236, 280, 244, 238, 279, 241], 0.08))
        240
        >>> round(usual_speed([240, 236, 280, 244, 238, 279, 241, 200, 203, 199], 0.08))
        200
    """
    ordered = [math.log(s) for s in speeds if s > 0 and math.isfinite(s)]
    if len(ordered) < USUAL_MIN:
        return None
    logs = sorted(ordered)
    mid = logs[len(logs) // 2]
    groups = [[x for x in logs if abs(x - c) <= tol] for c in logs]
    best = max(groups, key=lambda g: (len(g), -abs(g[len(g) // 2] - mid)))
    usual = best[len(best) // 2]
    last = sorted(ordered[-USUAL_MOVED:])
    moved = last[len(last) // 2]
    if last[-1] - last[0] <= tol and abs(moved - usual) > tol:
        return math.exp(moved)
    return math.exp(usual)
