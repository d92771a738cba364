"""How a Bayesian search learns the machine-drift exponent: :func:`learn_drift` and the
covariate it reads (:func:`drift_covariate`).

A trial's stored objective (``throughput``, the default figure) is its raw figure corrected to
the machine's nominal speed by the drift reference timed beside it, with
:data:`~cubicml_lab.timing.DRIFT_EXPONENT` (1: all of the reference's slowdown taken out). How
much of it a trial shares varies by machine and by configuration, so the GP learns the exponent
per search: with each ok trial's shift ``log(objective / raw) / DRIFT_EXPONENT`` as a covariate
(:func:`drift_covariate`), the fit's targets are ``log raw + s * shift`` with the slope ``s``
estimated under the fitted GP by generalised least squares
(:meth:`~cubicml_lab.surrogate.GPPredictor.covariate_slope`), a normal prior of mean
``DRIFT_EXPONENT`` and sd :data:`DRIFT_PRIOR_SD`, then refitted at ``s`` (:func:`learn_drift`,
at most :data:`DRIFT_ROUNDS` rounds). :attr:`~cubicml_lab.search.BayesianSearch.drift_exponent`
holds it. A trial that felt less of the drift than its reference is then corrected by as much as
it felt, not over-corrected into a false best, so the ranking and the figures shared across
campaigns agree better than at a fixed exponent (the measurements: ``docs/results.md``, "History
moved from the code"; ``benchmarks/demo_report_noise.py``). Trials without a raw figure (a
GPU's, with no CPU reference) shift by 0, and a search in which no trial shifts fits the stored
figures as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..hardware.drift import DRIFT_BOUNDS, DRIFT_EXPONENT, DRIFT_PRIOR_SD, at_slope, drift_shift

__all__ = ["DRIFT_ROUNDS", "DRIFT_TOL", "at_drift_exponent", "drift_covariate", "learn_drift"]

#: Refits at a newly learned drift exponent, at most (module doc).
DRIFT_ROUNDS = 2
#: A learned exponent this close to the one fitted needs no refit.
DRIFT_TOL = 0.02
#: The raw twin of an objective, where its name does not follow ``<objective>_raw``.
_RAW_METRIC = {"step_time_s": "step_time_raw_s"}


def drift_covariate(metrics: Sequence[Mapping[str, float]],
                    objective: str = "throughput") -> np.ndarray | None:
    """Per trial, how far the drift correction moved its objective: ``log(objective / raw) /
    DRIFT_EXPONENT``, the log of the machine's nominal over its measured reference speed for a
    throughput (0 where either figure is missing or not positive); None when no trial moved.

    Example:
        >>> drift_covariate([{"throughput": 110.0, "throughput_raw": 100.0}, {"throughput": 5.0}])
        array([0.09531018, 0.        ])
    """
    raw = _RAW_METRIC.get(objective, f"{objective}_raw")
    c = np.zeros(len(metrics), dtype=np.float64)
    for i, m in enumerate(metrics):
        a, b = m.get(objective, math.nan), m.get(raw, math.nan)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0:
            c[i] = drift_shift(b, a)
    return c if np.any(np.abs(c) > 1e-9) else None


def at_drift_exponent(values: np.ndarray, covariate: np.ndarray, exponent: float) -> np.ndarray:
    """The trials' figures corrected with ``exponent`` instead of ``DRIFT_EXPONENT``:
    ``values * (nominal / reference) ** (exponent - DRIFT_EXPONENT)``, the covariate being
    :func:`drift_covariate`'s log ratio."""
    return at_slope(values, covariate, exponent)


def learn_drift(fit: Callable[[np.ndarray, Any], Any], values: np.ndarray,
                covariate: np.ndarray, sign: float = 1.0) -> tuple[Any, float, np.ndarray]:
    """Fit a GP with the drift exponent learned (module doc).

    Args:
        fit: ``fit(values, warm_start) -> GPPredictor`` (log objective), fitted on the trials.
        values: The stored objective of each trial (corrected with ``DRIFT_EXPONENT``).
        covariate: :func:`drift_covariate` of the same trials.
        sign: -1 where the fit models the objective's reciprocal (minimised), else 1.

    Returns:
        ``(predictor, exponent, values)``: the GP fitted at the learned exponent, the exponent,
        and the trials' values at it (``raw * (nominal / reference) ** exponent``).
    """
    pred, beta, out = fit(values, None), DRIFT_EXPONENT, values
    for _ in range(DRIFT_ROUNDS):
        new = pred.covariate_slope(sign * covariate, beta, (DRIFT_EXPONENT, DRIFT_PRIOR_SD))
        new = min(max(new, DRIFT_BOUNDS[0]), DRIFT_BOUNDS[1])
        if abs(new - beta) < DRIFT_TOL:
            break
        beta = new
        out = at_drift_exponent(values, covariate, beta)
        pred = fit(out, pred)
    return pred, beta, out
