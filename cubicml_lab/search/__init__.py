"""Searchers with one ask/tell interface: which configurations to measure next.

:class:`Searcher` holds the shared bookkeeping (pool, pending, told, enqueued, best);
:class:`RandomSearch` draws uniformly from the untried pool; :class:`BayesianSearch` fits a GP on
log(objective) and maximises noisy expected improvement over the pool, tuned by one
:class:`BayesianOptions` record;
:class:`PredictorGuidedSearch` (the CubicML paper's loop) fits an MLP predictor and launches its
predicted top-k. Importing this package does not import torch; BoTorch loads at the first
Bayesian-optimisation step. :class:`TableObjective` replays a search offline against a table of
measured (or modelled) configurations, and :func:`compare_searchers` replays several searchers
with several seeds, which :func:`summarize_searches` sums up.
"""

from __future__ import annotations

from .base import Searcher
from .bayesian import BayesianSearch
from .calibration import PriorReport, prior_report
from .compare import compare_searchers, searcher_factory, summarize_searches
from .guided import PredictorGuidedSearch
from .options import BayesianOptions
from .proposal import Proposal
from .random import RandomSearch
from .table import TableObjective, TableResult

__all__ = ["BayesianOptions", "BayesianSearch", "PredictorGuidedSearch", "PriorReport", "Proposal",
           "RandomSearch", "Searcher", "TableObjective", "TableResult", "compare_searchers",
           "prior_report", "searcher_factory", "summarize_searches"]
