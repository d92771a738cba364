"""cubicml-lab: measure, predict and search the configurations that make model training fast.

A thin library behind a series of notebooks. The loop, after CubicML (Wen et al., Meta, 2024)::

    Space -> Searcher.ask() -> Campaign -> Launcher -> run_trial (workload, timing) -> TrialResult
      ^                                                                        |
      +---- GPPredictor <---- TrialStore (SQLite: every trial, status, metrics, hardware)

``import cubicml_lab`` is cheap: torch, BoTorch and pandas load only when a name that needs them is
first used.

Example:
    >>> import cubicml_lab as cml
    >>> space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 8), cml.Bool("compile")])
    >>> space.size()
    8
"""

from __future__ import annotations

import importlib
from typing import Any

from . import errors
from .errors import CubicMLError
from .launch import measure
from .space import Bool, Choice, Float, Int, Ordinal, PowerOfTwo, Space
from .store import TrialStore
from .trials import Trial

__version__ = "0.1.0"

_LAZY = {
    "GPPredictor": ("cubicml_lab.surrogate", "GPPredictor"),
    "MLPPredictor": ("cubicml_lab.surrogate", "MLPPredictor"),
    "evaluate_predictor": ("cubicml_lab.surrogate", "evaluate_predictor"),
    "learning_curve": ("cubicml_lab.surrogate", "learning_curve"),
    "BayesianSearch": ("cubicml_lab.search", "BayesianSearch"),
    "PredictorGuidedSearch": ("cubicml_lab.search", "PredictorGuidedSearch"),
    "RandomSearch": ("cubicml_lab.search", "RandomSearch"),
    "TableObjective": ("cubicml_lab.search", "TableObjective"),
    "Campaign": ("cubicml_lab.campaign", "Campaign"),
    "workloads": ("cubicml_lab.workloads", None),
    "datasets": ("cubicml_lab.datasets", None),
    "launch": ("cubicml_lab.launch", None),
    "plots": ("cubicml_lab.plots", None),
    "widgets": ("cubicml_lab.widgets", None),
    "TrialResult": ("cubicml_lab.trials", "TrialResult"),
}

__all__ = [
    "BayesianSearch",
    "Bool",
    "Campaign",
    "Choice",
    "CubicMLError",
    "Float",
    "GPPredictor",
    "Int",
    "MLPPredictor",
    "Ordinal",
    "PowerOfTwo",
    "PredictorGuidedSearch",
    "RandomSearch",
    "Space",
    "TableObjective",
    "Trial",
    "TrialResult",
    "TrialStore",
    "datasets",
    "errors",
    "evaluate_predictor",
    "launch",
    "learning_curve",
    "measure",
    "plots",
    "widgets",
    "workloads",
]


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'cubicml_lab' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
