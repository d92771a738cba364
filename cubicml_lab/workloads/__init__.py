"""Real training workloads, by name.

``get("gpt")`` returns a :class:`~cubicml_lab.workloads.base.Workload`; ``names()`` lists them.
Running one as a measured trial is :func:`cubicml_lab.launch.runner.run_trial`, which builds
the job through the workload and times it with :mod:`cubicml_lab.timing`. Importing this package
imports no torch.

Example:
    >>> from cubicml_lab import workloads
    >>> workloads.names()
    ['dlrm', 'gpt']
    >>> workloads.get("gpt").default_config()["d_model"]
    128
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .._params import brief
from .base import Built, Knob, Workload
from .command import Command
from .custom import PythonWorkload
from .registry import BUILT_IN, check_reachable, register, registered, unregister

__all__ = ["Built", "Command", "Knob", "Workload", "WithDefaults", "get", "names"]
__all__ += ["PythonWorkload", "check_reachable", "register", "registered", "unregister"]

_REGISTRY = BUILT_IN  # name -> (module, class) of the built-in workloads


def names() -> list[str]:
    """Workload names, sorted: the built-ins and your own (:func:`register`, entry points)."""
    return sorted(set(_REGISTRY) | set(registered()))


def get(name: str) -> Workload:
    """A fresh instance of the workload called ``name``.

    Raises:
        ConfigError: No such workload (the message lists the known ones), or one of your own
            that this process cannot load (see :mod:`~cubicml_lab.workloads.registry`).
    """
    if not isinstance(name, str) or name not in _REGISTRY:
        from .registry import lookup  # checks the name's type: a ConfigError, never a TypeError

        own = lookup(name)
        if own is not None:
            return own
        raise ConfigError(f"unknown workload {brief(name)}",
                          hint=f"known workloads: {', '.join(names())}; your own: "
                               "cml.workloads.register(name, 'module:attribute')")
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)()


class WithDefaults:
    """``config -> fn(config)`` for a function of a workload's module (``cost_terms``,
    ``shape_features``) that needs every knob, with the workload's defaults and ``constants``
    filled in where ``config`` leaves a knob out: a GP's ``cost_model`` or ``features`` over a
    space that searches only some knobs. Carries the function's ``term_names``, ``term_units``
    or ``feature_names``.

    Example:
        >>> terms = WithDefaults("gpt", "cost_terms", {"d_model": 256})
        >>> len(terms({"micro_batch": 4})) == len(terms.term_names)
        True
    """

    def __init__(self, workload: str, fn: str = "cost_terms",
                 constants: Mapping[str, Any] | None = None) -> None:
        self.workload, self.fn = workload, fn
        self._fn = getattr(importlib.import_module(_REGISTRY[workload][0]), fn)
        for names in ("term_names", "term_units", "feature_names"):  # what names its values
            if hasattr(self._fn, names):
                setattr(self, names, getattr(self._fn, names))
        self._base = {**get(workload).default_config(), **(constants or {})}

    def __call__(self, config: Mapping[str, Any]) -> list[float]:
        return self._fn({**self._base, **config})

    def __repr__(self) -> str:
        return f"<{self.fn} of the {self.workload!r} workload>"
