"""The Bayesian search's initial design: spread the first trials over the space.

*Without a prior*, a :class:`~cubicml_lab.search.BayesianSearch` runs an **initial design**
until ``n_init`` trials were told (failures count: an out-of-memory trial is information too),
then the GP as soon as 2 ok trials exist: greedy maximin in the normalised encoded space (each
column scaled to [0, 1] by ``space.encoded_bounds()``, :func:`normalised`), each point the
untried configuration farthest from everything already told (failures included), pending or
picked, its distance weighted by its probability of running once a failure was told (or a
memory model given); the first point is a seeded random pick among the likeliest to run
(:func:`space_filling`). While every trial told has failed (nothing to contrast them with), a
configuration's probability of running falls with its nearness to the failures
(:func:`failure_proximity`, ``FAILURE_LENGTH``), so the first out-of-memory trial already steers
the next proposals away from it.

Example:
    >>> import numpy as np
    >>> from cubicml_lab.space import Space, Int
    >>> space = Space([Int("micro_batch", 1, 9)])
    >>> pool = [{"micro_batch": m} for m in range(1, 10)]
    >>> space_filling(2, pool, space, [{"micro_batch": 1}], np.random.default_rng(0))
    [{'micro_batch': 9}, {'micro_batch': 5}]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["failure_proximity", "normalised", "space_filling"]

#: Length (normalised encoded units: a quarter of a knob's range) over which a failure makes
#: its neighbours likely to fail too, while every trial told failed (:func:`failure_proximity`).
FAILURE_LENGTH = 0.25


def normalised(space: Space, configs: Sequence[dict]) -> np.ndarray:
    """``configs`` encoded, each column scaled to [0, 1] by ``space.encoded_bounds()``."""
    bounds = space.encoded_bounds()
    span = np.where(bounds[1] > bounds[0], bounds[1] - bounds[0], 1.0)
    if not configs:
        return np.zeros((0, bounds.shape[1]))
    return (space.encode_array(configs) - bounds[0]) / span


def space_filling(n: int, pool: list[dict], space: Space, seen: Sequence[dict],
                  rng: np.random.Generator, p_ok: np.ndarray | None = None) -> list[dict]:
    """Greedy maximin: each pick maximises its distance to everything ``seen`` (told, pending)
    or picked (times its probability of running, ``p_ok``, once a failure taught the
    feasibility model)."""
    order = rng.permutation(len(pool))  # random tie-breaks, random first pick
    w = np.ones(len(pool)) if p_ok is None else np.clip(p_ok[order], 1e-6, 1.0)
    P = normalised(space, [pool[i] for i in order])
    done = normalised(space, list(seen))
    min_d = np.full(len(P), np.inf)
    for start in range(0, len(done), 256):
        block = done[start:start + 256]
        d = np.sqrt(((P[:, None, :] - block[None, :, :]) ** 2).sum(-1)).min(axis=1)
        min_d = np.minimum(min_d, d)
    picks: list[int] = []
    for _ in range(min(n, len(P))):
        # nothing seen yet (all inf): the likeliest to run, ties to the random order
        j = int(np.argmax(np.where(np.isposinf(min_d), 1.0, min_d) * w))
        picks.append(j)
        min_d = np.minimum(min_d, np.sqrt(((P - P[j]) ** 2).sum(-1)))
        min_d[picks] = -np.inf
    return [dict(pool[int(order[j])]) for j in picks]


def failure_proximity(space: Space, X_space: Any, failures: Sequence[dict]) -> np.ndarray:
    """log P(runs) while every trial told failed: the sum over ``failures`` of
    ``log(1 - exp(-d^2 / (2 FAILURE_LENGTH^2)))``, ``d`` the normalised distance of each row
    of ``X_space`` (encoded, unscaled) to it: a configuration one knob step from a failure is
    likelier to fail than one far from all."""
    bounds = space.encoded_bounds()
    span = np.where(bounds[1] > bounds[0], bounds[1] - bounds[0], 1.0)
    X = (np.asarray(X_space, dtype=np.float64) - bounds[0]) / span
    out = np.zeros(len(X))
    for f in normalised(space, list(failures)):
        d2 = ((X - f) ** 2).sum(1)
        out += np.log(np.clip(-np.expm1(-d2 / (2 * FAILURE_LENGTH**2)), 1e-12, 1.0))
    return out
