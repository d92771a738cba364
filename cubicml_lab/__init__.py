"""cubicml-lab: measure, predict and search the configurations that make model training fast.

A thin library behind a series of notebooks. The loop, after CubicML (Wen et al., Meta, 2024)::

    Space -> Searcher.ask() -> Campaign -> Launcher -> run_trial (workload, timing) -> TrialResult
      ^                                                                        |
      +---- GPPredictor <---- TrialStore (SQLite: every trial, status, metrics, hardware)

(``run_trial``: :func:`cubicml_lab.launch.runner.run_trial`, beside the launchers.)

``import cubicml_lab`` is cheap: torch, BoTorch and pandas load only when a name that needs them is
first used. After ``import cubicml_lab as cml`` every public module is an attribute, loaded on
first use: :mod:`~cubicml_lab.analytical` (the physics model of LLM training),
:mod:`~cubicml_lab.campaign`, :mod:`~cubicml_lab.datasets`, :mod:`~cubicml_lab.errors`,
:mod:`~cubicml_lab.hardware`, :mod:`~cubicml_lab.integrations`, :mod:`~cubicml_lab.launch`,
:mod:`~cubicml_lab.plots`, :mod:`~cubicml_lab.report`, :mod:`~cubicml_lab.search`,
:mod:`~cubicml_lab.space`, :mod:`~cubicml_lab.store`, :mod:`~cubicml_lab.surrogate`,
:mod:`~cubicml_lab.timing`, :mod:`~cubicml_lab.trials`, :mod:`~cubicml_lab.widgets` and
:mod:`~cubicml_lab.workloads`. ``cml.physics`` still resolves, with a ``DeprecationWarning``:
it is the same model under its old name; use ``cml.analytical``.

Example:
    >>> import cubicml_lab as cml
    >>> space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 8), cml.Bool("compile")])
    >>> space.size()
    8
"""

import importlib as _importlib
import sys as _sys
import types as _types
import warnings as _warnings
from typing import TYPE_CHECKING

from .errors import CubicMLError
from .launch import measure
from .space import Bool, Choice, Float, Int, Ordinal, PowerOfTwo, Space
from .store import TrialStore
from .trials import Trial

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and editors
    from . import (analytical, campaign, datasets, errors, hardware, integrations, launch, plots,
                   report, search, space, store, surrogate, timing, trials, widgets, workloads)
    from .campaign import Campaign
    from .search import (BayesianSearch, PredictorGuidedSearch, Proposal, RandomSearch,
                         TableObjective)
    from .surrogate import GPPredictor, MLPPredictor, evaluate_predictor, learning_curve
    from .trials import TrialResult

__version__ = "0.1.0"

#: The public modules, each loaded on first use (``cml.search`` imports BoTorch then, not before).
_MODULES = ("analytical", "campaign", "datasets", "errors", "hardware", "integrations", "launch",
            "plots", "report", "search", "space", "store", "surrogate", "timing", "trials",
            "widgets", "workloads")

#: Public names defined in a module that needs torch, BoTorch or pandas: imported on first use.
_LAZY = {
    "GPPredictor": "cubicml_lab.surrogate",
    "MLPPredictor": "cubicml_lab.surrogate",
    "evaluate_predictor": "cubicml_lab.surrogate",
    "learning_curve": "cubicml_lab.surrogate",
    "BayesianOptions": "cubicml_lab.search",
    "BayesianSearch": "cubicml_lab.search",
    "PredictorGuidedSearch": "cubicml_lab.search",
    "Proposal": "cubicml_lab.search",
    "RandomSearch": "cubicml_lab.search",
    "TableObjective": "cubicml_lab.search",
    "Campaign": "cubicml_lab.campaign",
    "TrialResult": "cubicml_lab.trials",
}

__all__ = sorted([
    "Bool", "Choice", "CubicMLError", "Float", "Int", "Ordinal", "PowerOfTwo", "Space", "Trial",
    "TrialStore", "measure", *_LAZY, *_MODULES,
])


def __getattr__(name: str) -> object:
    if name in _MODULES:
        value = _importlib.import_module(f"{__name__}.{name}")
    elif name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)


class _Package(_types.ModuleType):
    """This package's module type: it adds the deprecated ``physics`` alias.

    ``cubicml_lab.physics`` is also the package that holds the model's code (``analytical``
    re-exports it), and the import system binds a loaded submodule onto its parent. A property
    on the module's type wins over that binding, so ``cml.physics`` warns however it got loaded.
    """

    @property
    def physics(self) -> _types.ModuleType:
        """Deprecated name of :mod:`cubicml_lab.analytical`'s physics (same classes)."""
        _warnings.warn("cubicml_lab.physics is deprecated: use cubicml_lab.analytical, which "
                       "holds the same model (LLMTrainingModel, GPUSpec, PhysicsConstants, GPUS, "
                       "TERMS, table_physics, ...) and the tables generated from it",
                       DeprecationWarning, stacklevel=2)
        return _importlib.import_module(f"{__name__}.physics")

    @physics.setter
    def physics(self, module: _types.ModuleType) -> None:
        """The import system binding the loaded submodule: the name stays the alias."""


_sys.modules[__name__].__class__ = _Package
