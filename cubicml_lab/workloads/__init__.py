"""Real training workloads, by name.

``get("gpt")`` returns a :class:`~cubicml_lab.workloads.base.Workload`; ``names()`` lists them.
Running one as a measured trial is :func:`cubicml_lab.trials.run_trial`, which builds the job
through the workload and times it with :mod:`cubicml_lab.timing`. Importing this package imports
no torch.

Example:
    >>> from cubicml_lab import workloads
    >>> workloads.names()
    ['dlrm', 'gpt']
    >>> workloads.get("gpt").default_config()["d_model"]
    128
"""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import Built, Knob, Workload

__all__ = ["Built", "Knob", "Workload", "get", "names"]

_REGISTRY: dict[str, tuple[str, str]] = {"dlrm": ("cubicml_lab.workloads.dlrm", "DLRMWorkload"),
                                         "gpt": ("cubicml_lab.workloads.gpt", "GPTWorkload")}


def names() -> list[str]:
    """Registered workload names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Workload:
    """A fresh instance of the workload called ``name``.

    Raises:
        ConfigError: No such workload (the message lists the known ones).
    """
    if name not in _REGISTRY:
        raise ConfigError(f"unknown workload {name!r}",
                          hint=f"known workloads: {', '.join(names())}")
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)()
