"""Predictors of training speed and their quality metrics.

:class:`GPPredictor` (BoTorch ``SingleTaskGP`` on the log objective) predicts an objective with
uncertainty from a configuration, :class:`MLPPredictor` (an ensemble of small MLPs, the paper's
kind of model) does the same for comparison, :class:`FeasibilityModel` predicts whether a
configuration fits in memory and runs; :func:`evaluate_predictor` and :func:`cross_val_predict`
measure how well any predictor ranks and brackets held-out trials; :func:`partial_dependence`,
:func:`slices`, :func:`knob_importance` and :func:`feasibility_map` show what a fitted one has
learned about the knobs (:mod:`~cubicml_lab.surrogate.explain`). Importing this package does
not import torch; BoTorch loads on the first fit.
"""

from __future__ import annotations

from .explain import feasibility_map, knob_importance, knob_values, partial_dependence, slices
from .feasibility import FeasibilityModel
from .gp import GPPredictor
from .metrics import (
    Predictor,
    cross_val_predict,
    evaluate_predictor,
    interval_coverage,
    kendall_tau,
    learning_curve,
    mape,
    regret,
    spearman,
    top_k_recall,
)
from .mlp import MLPPredictor

__all__ = [
    "FeasibilityModel",
    "GPPredictor",
    "MLPPredictor",
    "Predictor",
    "cross_val_predict",
    "evaluate_predictor",
    "feasibility_map",
    "interval_coverage",
    "kendall_tau",
    "knob_importance",
    "knob_values",
    "learning_curve",
    "mape",
    "partial_dependence",
    "regret",
    "slices",
    "spearman",
    "top_k_recall",
]
