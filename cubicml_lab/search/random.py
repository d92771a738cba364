"""Uniform random search: the baseline every smarter searcher must beat.

:class:`RandomSearch` proposes configurations drawn uniformly, without replacement, from the untried
valid pool (see :mod:`cubicml_lab.search.base`). Draws are seeded from ``(seed, n_told)``, so the
proposals are deterministic given the seed and the told history.
"""

from __future__ import annotations

import numpy as np

from .base import Searcher

__all__ = ["RandomSearch"]


class RandomSearch(Searcher):
    """Uniform random search over the untried pool; same arguments as :class:`Searcher`.

    Example:
        >>> from cubicml_lab.space import Space, PowerOfTwo
        >>> s = RandomSearch(Space([PowerOfTwo("micro_batch", 1, 64)]), seed=1)
        >>> batch = s.ask(3)
        >>> len({c["micro_batch"] for c in batch})
        3
    """

    def _propose(self, n: int, pool: list[dict], rng: np.random.Generator) -> list[dict]:
        idx = rng.choice(len(pool), size=min(n, len(pool)), replace=False)
        return [dict(pool[int(i)]) for i in idx]
