"""Predictors of training speed and their quality metrics.

:class:`GPPredictor` (BoTorch ``SingleTaskGP`` on the log objective) predicts an objective with
uncertainty from a configuration; :func:`evaluate_predictor` and :func:`cross_val_predict` measure
how well any predictor ranks and brackets held-out trials. Importing this package does not import
torch; BoTorch loads on the first fit.
"""

from __future__ import annotations

from .gp import GPPredictor
from .metrics import (
    Predictor,
    cross_val_predict,
    evaluate_predictor,
    interval_coverage,
    kendall_tau,
    mape,
    spearman,
)

__all__ = [
    "GPPredictor",
    "Predictor",
    "cross_val_predict",
    "evaluate_predictor",
    "interval_coverage",
    "kendall_tau",
    "mape",
    "spearman",
]
