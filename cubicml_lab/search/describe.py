"""Searchers as plain data: :func:`searcher_to_dict` and :func:`searcher_from_dict`.

A campaign file (``Campaign.to_yaml``, ``cubicml-lab run FILE.yaml``) names its searcher as a
small mapping: ``{"kind": "bayesian", "seed": 0, "n_init": 8, ...}`` or ``{"kind": "random"}``.
A Bayesian search's :class:`~cubicml_lab.search.options.BayesianOptions` travel field by field
(every field is a plain value), so the options read back equal those written. Only options
that are plain values travel; a searcher holding a function (``cost_model``,
``features``, ``memory_model``), a fixed candidate pool or history given as tables cannot be
written, and says which option is in the way. History given as campaign names travels as
``history: [names]`` with ``store: path`` (when one was given).

Example:
    >>> import cubicml_lab as cml
    >>> from cubicml_lab.search.describe import searcher_from_dict, searcher_to_dict
    >>> space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 8)])
    >>> searcher_to_dict(searcher_from_dict(space, {"kind": "random", "seed": 3}))
    {'kind': 'random', 'objective': 'throughput', 'direction': 'maximize', 'seed': 3}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._params import brief
from ..errors import ConfigError
from .bayesian import BayesianSearch
from .options import BayesianOptions
from .random import RandomSearch

if TYPE_CHECKING:
    from ..space import Space
    from .base import Searcher

__all__ = ["searcher_from_dict", "searcher_to_dict"]

_COMMON = ("objective", "direction", "seed")
_OPTIONS: dict[str, tuple[type, tuple[str, ...]]] = {
    "bayesian": (BayesianSearch, (*_COMMON, *(n for n in BayesianOptions.names()
                                              if n != "second_objective"),
                                  "history", "store")),
    "random": (RandomSearch, _COMMON),
}
# options whose value is code or data a file cannot hold, by searcher attribute
_NOT_WRITABLE = ("cost_model", "features", "memory_model", "second_objective", "_candidates")
# options written only when set (older files and readers do not know them)
_ONLY_WHEN_SET = ("history", "store")


def searcher_to_dict(searcher: Searcher) -> dict[str, Any]:
    """The searcher's kind and options as plain data.

    Raises:
        ConfigError: The searcher is of another kind, or holds an option a file cannot hold.
    """
    kind = next((k for k, (cls, _) in _OPTIONS.items() if type(searcher) is cls), None)
    if kind is None:
        raise ConfigError(f"a {type(searcher).__name__} cannot be written to a campaign file",
                          hint=f"use one of: {', '.join(_OPTIONS)} (BayesianSearch, RandomSearch)")
    for name in _NOT_WRITABLE:
        if getattr(searcher, name, None) is not None:
            shown = "candidates" if name == "_candidates" else name
            raise ConfigError(f"the searcher's {shown} cannot be written to a campaign file",
                              hint=f"build the campaign in Python to use {shown}, or drop it")
    if getattr(searcher, "history_model", None) is not None and searcher.history_names is None:
        raise ConfigError("the searcher's history holds tables, which a campaign file cannot hold",
                          hint="give history as campaign names of a store, or build the "
                               "campaign in Python")
    out = {"kind": kind}
    for name in _OPTIONS[kind][1]:
        options = getattr(searcher, "options", None)
        if isinstance(options, BayesianOptions) and name in BayesianOptions.names():
            value = getattr(options, name)  # as given: learn_drift without log_objective too
        else:
            value = getattr(searcher, "history_names" if name == "history" else name, None)
        if name == "store" and value is not None and not isinstance(value, str):
            value = str(getattr(value, "path", value))
        if name not in _ONLY_WHEN_SET or value is not None:
            out[name] = value
    return out


def searcher_from_dict(space: Space, data: Mapping[str, Any]) -> Searcher:
    """A searcher on ``space`` from :func:`searcher_to_dict`'s form.

    Raises:
        ConfigError: Not a mapping, an unknown kind or option, or a bad value (the message
            names the option and lists the allowed ones).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"searcher must be a mapping with a 'kind', got {brief(data)}",
                          hint='e.g. searcher: {kind: bayesian, seed: 0}')
    kind = data.get("kind", "bayesian")
    if kind not in _OPTIONS:
        raise ConfigError(f"searcher kind {kind!r} is not one of {', '.join(_OPTIONS)}",
                          hint="kind: bayesian (the default) or kind: random")
    cls, allowed = _OPTIONS[kind]
    unknown = sorted(set(data) - {"kind", *allowed})
    if unknown:
        raise ConfigError(f"searcher ({kind}): unknown option(s) {unknown}",
                          hint=f"its options: {', '.join(allowed)}")
    try:
        return cls(space, **{k: v for k, v in data.items() if k != "kind"})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"searcher ({kind}): {err}",
                          hint=f"its options: {', '.join(allowed)}") from None
