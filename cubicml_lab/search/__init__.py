"""Searchers with one ask/tell interface: which configurations to measure next.

:class:`Searcher` holds the shared bookkeeping (pool, pending, told, enqueued, best);
:class:`RandomSearch` draws uniformly from the untried pool; :class:`BayesianSearch` fits a GP on
log(objective) and maximises noisy expected improvement over the pool. Importing this package does
not import torch; BoTorch loads at the first Bayesian-optimisation step.
"""

from __future__ import annotations

from .base import Searcher
from .bayesian import BayesianSearch
from .random import RandomSearch

__all__ = ["BayesianSearch", "RandomSearch", "Searcher"]
