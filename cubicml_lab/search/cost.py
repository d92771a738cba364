"""Cost-aware choice: what the next trial will cost, weighed against what it may gain.

A trial's price is its device-seconds (:data:`COST_METRIC`, ``"device_s"``): the devices it
held times its wall-clock seconds, start-up, build and warm-up included. A
:class:`~cubicml_lab.Campaign` tells it with every trial (``Trial.device_seconds``); a user's
own loop may tell it in the values too. Where the knobs change the price (more devices, slower
steps, a long compile) two configurations that promise the same improvement are not worth the
same: the cheaper answer leaves budget for more answers.

**The rule: cost-cooled expected improvement** (Lee, Perrone, Archambeau and Seeger, "Cost-aware
Bayesian optimization", 2020, their CArBO's acquisition). Each candidate's log acquisition loses
``alpha * log(c(x) / c_median)``, with ``c(x)`` the predicted price of a full trial and
``c_median`` the median over the candidates scored, so that ``alpha = 1`` is expected
improvement per device-second (Snoek, Larochelle and Adams 2012) and ``alpha = 0`` plain
expected improvement. ``alpha`` cools from 1 to 0 as the budget is spent (:func:`cooling`):
early, when many trials remain, cheap informative trials are worth more; at the end the last
trials go where the best is likely, whatever they cost. Plain EI per unit cost, never cooled,
keeps choosing cheap configurations that cannot win where price and speed are correlated.

**Before the GP** (no prior, the space-filling initial design), once the price model exists,
each candidate's distance to what was tried is weighed by the same ``(c(x) / c_median) **
-alpha``: coverage per device-second, CArBO's cost-effective initial design in spirit.

**The price model.** A GP of the told device-seconds (log) over the space's knobs, fitted on the
ok trials that ran in full (a trial stopped early or one that failed costs less than a full
measurement of its configuration would, so it would teach the model that losers and crashes are
cheap). Until :data:`COST_MIN_TRIALS` such trials exist, or where the predicted prices of the
candidates differ by less than :data:`COST_MATTERS` (90th over 10th percentile), no weight is
applied: on the CPU demo, where every trial holds one process for about the same time, the
search chooses as it would without prices.

**The budget** (:meth:`~cubicml_lab.search.BayesianSearch.plan_budget`): a campaign's run tells
the search what it may spend (trials, or device-seconds); ``alpha`` is the fraction of it left.
A search that was told no budget cools over :data:`COOLING_TRIALS` trials told.

Importing this module imports no torch.

Example:
    >>> round(cooling({"trials": 20, "n_told_at_start": 10}, n_told=15, spent_s=0.0), 3)
    0.75
    >>> w, note = cost_log_weights(np.log([10.0, 20.0, 40.0, 80.0]), alpha=1.0)
    >>> [round(float(x), 3) for x in w]
    [1.04, 0.347, -0.347, -1.04]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..trials import is_stopped_early

__all__ = ["COOLING_TRIALS", "COST_MATTERS", "COST_METRIC", "COST_MIN_TRIALS", "cooling",
           "cost_log_weights", "cost_observations", "told_cost"]

#: The told metric that holds a trial's price: devices x wall-clock seconds.
COST_METRIC = "device_s"
#: Full ok trials with a told price before the search weighs prices at all (a GP of two points
#: extrapolates a slope that nothing supports).
COST_MIN_TRIALS = 4
#: Predicted prices of the candidates (90th over 10th percentile) must differ by more than this
#: factor before they weigh: below it, the price model's own error (tens of percent after a few
#: trials) is as large as what it would trade against improvement.
COST_MATTERS = 1.5
#: Trials over which ``alpha`` cools from 1 to 0 when the search was told no budget.
COOLING_TRIALS = 50


def told_cost(values: Mapping[str, Any] | None) -> float | None:
    """The device-seconds told with a trial (:data:`COST_METRIC`), or None where absent or not
    a finite positive number."""
    v = (values or {}).get(COST_METRIC)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
    return float(v) if ok else None


def cost_observations(history: Sequence[Mapping[str, Any]]) -> tuple[list[dict], np.ndarray]:
    """``(configs, device-seconds)`` of the told trials a price model learns from: ok, not
    stopped early, with a told price (module doc, "The price model")."""
    rows = [(h["config"], told_cost(h["values"])) for h in history
            if h["status"] == "ok" and not is_stopped_early(h["values"] or {})]
    rows = [(c, v) for c, v in rows if v is not None]
    return [c for c, _ in rows], np.array([v for _, v in rows], dtype=np.float64)


def cooling(plan: Mapping[str, Any] | None, n_told: int, spent_s: float) -> float:
    """``alpha``, the weight of price against improvement, in [0, 1]: the fraction of the
    budget left (module doc, "The budget").

    Args:
        plan: What the search was told it may spend: ``{"device_s": seconds,
            "spent_at_start": device-seconds told by then}`` or ``{"trials": n,
            "n_told_at_start": n}``; None: :data:`COOLING_TRIALS` trials from none told.
        n_told: Trials told so far.
        spent_s: Device-seconds told so far.
    """
    plan = plan or {}
    budget_s = plan.get("device_s")
    if isinstance(budget_s, (int, float)) and budget_s > 0 and math.isfinite(budget_s):
        used = spent_s - float(plan.get("spent_at_start", 0.0))
        return float(min(1.0, max(0.0, 1.0 - used / budget_s)))
    trials = plan.get("trials")
    if isinstance(trials, int) and trials > 0:
        used = n_told - int(plan.get("n_told_at_start", 0))
        return float(min(1.0, max(0.0, 1.0 - used / trials)))
    return float(max(0.0, 1.0 - n_told / COOLING_TRIALS))


def cost_log_weights(log_cost: np.ndarray, alpha: float) -> tuple[np.ndarray, str]:
    """The log weights ``-alpha * log(c / c_median)`` of candidates with predicted log prices
    ``log_cost``, and a phrase saying what was done; zeros where the prices do not differ by
    :data:`COST_MATTERS` or ``alpha`` is 0."""
    log_cost = np.asarray(log_cost, dtype=np.float64)
    finite = log_cost[np.isfinite(log_cost)]
    if len(finite) < 2:
        return np.zeros(len(log_cost)), "no price to compare"
    lo, mid, hi = np.quantile(finite, [0.1, 0.5, 0.9])
    spread = math.exp(hi - lo)
    if spread <= COST_MATTERS:
        return np.zeros(len(log_cost)), f"prices within x{spread:.2f}: not weighed"
    if alpha <= 0:
        return np.zeros(len(log_cost)), "budget spent: improvement alone"
    w = -alpha * np.nan_to_num(log_cost - mid, nan=0.0)
    return w, f"price weighed (alpha {alpha:.2f}, prices x{spread:.1f} apart)"
