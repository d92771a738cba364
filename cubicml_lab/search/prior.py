"""The Bayesian search's prior: what it believes before (and beside) its own trials.

**Before the GP.** With a prior (a ``cost_model``, or ``history``), until ``PRIOR_MIN_OK`` (2)
ok observations exist, a :class:`~cubicml_lab.search.BayesianSearch` proposes the prior's best
predicted-feasible configurations (phase ``"prior"``, :func:`prior_picks`): ranked by minus the
log of the summed cost terms (the cost model's step time; without one, by the history's
prediction), among those whose probability of running is at least ``PRIOR_P_FEASIBLE`` (0.5),
each differing from everything tried, pending or picked in at least ``PRIOR_MIN_DIFF`` (2) knobs,
so the first trials are the prior's best guesses, not copies of one.

**Transfer.** ``history`` (campaign names of a store, DataFrames or Datasets of related jobs:
another model size, GPU count or device) is read and mapped onto the search's space by
:class:`~cubicml_lab.search.history.HistoryModel`, which fits a GP on the history's log
objective. Its prediction ``h`` enters the objective GP's prior mean as one more cost term,
``exp(-h)`` (:class:`PriorTerms`), whose weight the GP fits to the target's own trials (with no
cost model the mean is then ``b - c h``: a learned scale of the history), and ranks the first
proposals when there is no cost model. Once ``HISTORY_CHECK_MIN_OK`` (4) ok trials exist,
history whose ``h`` ranks them with a Kendall tau at most ``MIN_HISTORY_TAU`` (0.2) is dropped
for the rest of the search: related history helps from the first trial, unrelated history is
caught after a few.

Example:
    >>> import numpy as np
    >>> pool = [{"a": 1, "b": 1}, {"a": 1, "b": 2}, {"a": 2, "b": 2}]
    >>> picks, _ = prior_picks(2, pool, np.array([3.0, 2.0, 1.0]), np.zeros(3), ["a", "b"],
    ...                        [], np.random.default_rng(0))
    >>> [pool[i] for i in picks]
    [{'a': 1, 'b': 1}, {'a': 2, 'b': 2}]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .history import HistoryModel

__all__ = ["PriorTerms", "prior_picks"]

#: With a prior (``cost_model`` or ``history``) the GP takes over at this many ok trials.
PRIOR_MIN_OK = 2
#: The prior's picks need at least this probability of running (memory model, failures told).
PRIOR_P_FEASIBLE = 0.5
#: Each of the prior's picks differs from everything tried, pending or picked in this many knobs.
PRIOR_MIN_DIFF = 2


def prior_picks(n: int, pool: list[dict], score: np.ndarray, log_p: np.ndarray,
                names: Sequence[str], seen: list[dict], rng: np.random.Generator
                ) -> tuple[list[int], np.ndarray]:
    """The prior's ``n`` best predicted-feasible pool indices, each differing from everything
    in ``seen`` (tried, pending) and each other in at least :data:`PRIOR_MIN_DIFF` of the knobs
    ``names`` (too few such: the next best). ``score`` is the prior's guess of each
    configuration's log objective (larger is better) and ``log_p`` its log P(runs); ties go
    to ``rng``. Returns ``(picks, P(runs) of every pool configuration)``."""
    p = np.exp(log_p)
    fits = p >= PRIOR_P_FEASIBLE
    key = np.where(fits, score, -np.inf) if fits.any() else log_p
    order = np.lexsort((rng.random(len(pool)), -key))
    seen = list(seen)
    picks: list[int] = []
    for i in order:
        cfg = pool[int(i)]
        if all(sum(cfg[k] != o[k] for k in names) >= PRIOR_MIN_DIFF for o in seen):
            picks.append(int(i))
            seen.append(cfg)
            if len(picks) == n:
                break
    for i in order:  # too few different enough: the next best
        if len(picks) >= min(n, len(pool)):
            break
        if int(i) not in picks:
            picks.append(int(i))
    return picks, p


def cost_term_scores(logs: np.ndarray) -> np.ndarray:
    """Minus the log of the summed cost terms, from the terms' logs (one row per config)."""
    return -np.logaddexp.reduce(np.nan_to_num(logs, neginf=-1e300), axis=1)


class PriorTerms:
    """``terms(config) = [*cost_model(config), exp(-h(config))]``: the cost model's terms, then
    the history's (``h``: :class:`~cubicml_lab.search.history.HistoryModel`'s log objective),
    so the GP's prior mean weighs both by maximum likelihood (module doc, "Transfer").
    ``terms_frame`` is its vectorised twin (:func:`~cubicml_lab.surrogate.terms.batch_method`)."""

    def __init__(self, cost_model: Callable[[dict], Any] | None, history: HistoryModel) -> None:
        self.cost_model, self.history = cost_model, history

    def terms(self, config: dict) -> list[float]:
        return self._many([config])[0]

    def terms_frame(self, df: Any) -> list[list[float]]:
        return self._many(df.to_dict("records"))

    def _many(self, configs: list[dict]) -> list[list[float]]:
        from ..surrogate.terms import evaluate_many

        configs = [self.history.space.project(c) for c in configs]
        h = self.history.predict(configs)
        if self.cost_model is None:
            return [[math.exp(-float(x))] for x in h]
        rows = evaluate_many("cost_model", self.cost_model, configs)
        return [[*np.asarray(r, dtype=float).reshape(-1).tolist(), math.exp(-float(x))]
                for r, x in zip(rows, h)]
