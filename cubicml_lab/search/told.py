"""What a searcher is told, checked: the finite numbers among a trial's told values.

:meth:`~cubicml_lab.search.Searcher.tell` takes a mapping of metric name -> number (or None for
a trial that produced none). A bool is refused, except in a flag of :data:`FLAG_METRICS`; an int
too large for a float is refused; NaN and inf figures are dropped, but an unknown CI
(``*_rel_ci``) is kept as inf, so the search knows the figure's spread could not be measured.

Example:
    >>> told_numbers({"throughput": 1234.5, "contended": True, "throughput_rel_ci": float("nan")})
    {'throughput': 1234.5, 'contended': 1.0, 'throughput_rel_ci': inf}
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np

from .._params import brief
from ..errors import SearchError

__all__ = ["FLAG_METRICS", "told_numbers"]

#: Told metrics that are flags: a bool there is kept as 1.0 / 0.0 (any other bool is refused).
FLAG_METRICS = ("contended",)


def told_numbers(values: object) -> dict[str, float]:
    """The finite numbers among a told trial's ``values`` (metric name -> float); a CI
    (``*_rel_ci``) that is NaN or inf, unknown, is kept as inf.

    Raises:
        SearchError: If ``values`` is neither a mapping nor None, or holds a bool or an int too
            large for a float (the message names the entry).
    """
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise SearchError(f"values = {brief(values)} must be a dict of metric name -> "
                          "number, or None", hint="e.g. tell(config, {'throughput': 1234.5}), "
                          "or tell(config, None, status='oom')")
    out = {}
    for name, raw in values.items():
        if not isinstance(name, str):
            raise SearchError(f"values has the key {brief(name)} ({type(name).__name__}); "
                              "metric names are strings", hint="e.g. {'throughput': 1234.5}")
        if isinstance(raw, (bool, np.bool_)) and name in FLAG_METRICS:
            out[str(name)] = float(raw)
            continue
        if isinstance(raw, (bool, np.bool_)):
            raise SearchError(f"values[{brief(name)}] = {raw} is a bool, not a number",
                              hint="tell measurements as numbers (1.0 or 0.0), or leave it out")
        if isinstance(raw, numbers.Real):
            try:
                value = float(raw)
            except OverflowError:
                raise SearchError(f"values[{brief(name)}] is an int of "
                                  f"{int(raw).bit_length()} bits, too large for a float",
                                  hint="tell it in a larger unit, or as a float") from None
            if math.isfinite(value):
                out[str(name)] = value
            elif str(name).endswith("_rel_ci"):  # a figure's CI that could not be measured
                out[str(name)] = math.inf
    return out
