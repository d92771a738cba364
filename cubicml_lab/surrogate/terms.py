"""What a cost model or a features function returns, read the same way everywhere.

A cost model (``config -> cost terms``) or a features function (``config -> derived inputs``)
is a user's function. :func:`evaluate_many` calls it over many configurations at once, through
its vectorised twin when it has one (:func:`batch_method`: ``cost_terms`` ->
``cost_terms_frame``); :func:`names_of` and :func:`units_of` read the names and units it
declares; :func:`raise_bad_row` says which configuration gave a bad row. Pure Python and NumPy:
the GP (:mod:`~cubicml_lab.surrogate.gp`), the feasibility model and the searches share it.

Example:
    >>> evaluate_many("cost_model", lambda c: [c["mb"], 1.0], [{"mb": 2}, {"mb": 4}])
    [[2, 1.0], [4, 1.0]]
    >>> names_of(None, "term_names", "term", 2)
    ['term 0', 'term 1']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from .._params import brief
from ..errors import PredictorError

__all__ = ["batch_method", "evaluate_many", "names_of", "raise_bad_row", "units_of"]


def batch_method(fn: Any) -> Callable[[Any], Any] | None:
    """The vectorised twin of ``fn``, or None: for a bound method ``obj.m`` whose object also
    has ``obj.m_frame`` (e.g. ``LLMTrainingModel.cost_terms`` and ``cost_terms_frame``), that
    method, which takes a DataFrame of configurations and returns one row (or value) each."""
    owner, name = getattr(fn, "__self__", None), getattr(fn, "__name__", None)
    frame = getattr(owner, f"{name}_frame", None) if owner is not None and name else None
    return frame if callable(frame) else None


def evaluate_many(name: str, fn: Callable[[dict], Any], configs: Sequence[dict],
                  what: str = "configs") -> list[Any]:
    """``fn(config)`` of each configuration as a list of rows (a mapping's values in order),
    through ``fn``'s vectorised twin when it has one (:func:`batch_method`): a search scores
    tens of thousands of candidates with one call.

    Raises:
        PredictorError: ``fn`` raised (the message names the configuration).
    """
    frame = batch_method(fn)
    if frame is not None and len(configs) > 1:
        import pandas as pd

        try:
            out = frame(pd.DataFrame([dict(c) for c in configs]))
        except Exception:  # noqa: BLE001 - one config at a time then, to name the bad one
            out = None
        if out is not None:
            values = np.asarray(out, dtype=np.float64)
            return list(values.reshape(len(configs), -1))
    rows = []
    for i, cfg in enumerate(configs):
        try:
            row = fn(dict(cfg))
        except Exception as err:  # noqa: BLE001 - a user's function: report any failure
            raise PredictorError(f"{name}({what}[{i}]) raised {type(err).__name__}: "
                                 f"{err}", hint=f"make {name} accept {brief(cfg)}") from None
        rows.append(list(row.values()) if isinstance(row, Mapping) else row)
    return rows


def raise_bad_row(name: str, row: Any, i: int, what: str, positive: bool,
                   width: int) -> NoReturn:
    """The PredictorError for row ``i`` of ``name``'s outputs: not ``width`` finite numbers
    > 0 (``positive``), or >= 0 with one > 0."""
    rule = "> 0" if positive else ">= 0, at least one > 0"
    raise PredictorError(
        f"{name}({what}[{i}]) = {brief(row)} is not {width} finite number(s) {rule}",
        hint="return the same number of values for every configuration"
             + ("" if positive else " (0 where a term does not apply)"))


def units_of(fn: Any, count: int) -> list[str] | None:
    """``fn.term_units`` (one unit per cost term, any strings) or ``None``; a tuple of the
    wrong length raises."""
    units = getattr(fn, "term_units", None)
    return None if units is None else names_of(fn, "term_units", "", count)


def names_of(fn: Any, attr: str, prefix: str, count: int) -> list[str]:
    """``fn.<attr>`` (a tuple of ``count`` names) or ``"<prefix> 0"``, ``"<prefix> 1"``, ..."""
    names = getattr(fn, attr, None)
    if names is None:
        return [f"{prefix} {i}".strip() for i in range(count)]
    names = [str(n) for n in names]
    if len(names) != count:
        raise PredictorError(f"{brief(fn)}.{attr} has {len(names)} names for {count} values",
                             hint=f"give {attr} one name per value the function returns")
    return names
