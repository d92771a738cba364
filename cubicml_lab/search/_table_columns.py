"""Reading a table's columns for :class:`~cubicml_lab.search.table.TableObjective`: which are
the knobs, the metrics and the status, each checked with a :class:`~cubicml_lab.errors.SearchError`
that names the column and the fix, and the space of the values a table holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .._params import brief
from ..errors import SearchError, SpaceError
from ..space import Space
from ..trials import FINISHED

if TYPE_CHECKING:
    import pandas as pd


def shown(names: Sequence[str], limit: int = 20) -> str:
    more = f" ... ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def nanmedian(block: np.ndarray) -> np.ndarray:
    """Column medians ignoring NaN (an all-NaN column gives NaN, without a warning)."""
    out = np.full(block.shape[1], np.nan)
    for j in range(block.shape[1]):
        col = block[:, j][np.isfinite(block[:, j])]
        if len(col):
            out[j] = float(np.median(col))
    return out


def metric_names(df: pd.DataFrame, metrics: Sequence[str] | None, knobs: list[str],
                  status_col: str | None, columns: list[str]) -> Sequence[str]:
    """``metrics`` checked to be columns (SearchError), or every numeric, not boolean column
    that is neither a knob nor the status."""
    import pandas as pd

    if metrics is None:
        metrics = [c for c in df.columns if c not in knobs and c != status_col
                   and pd.api.types.is_numeric_dtype(df[c].dtype)
                   and not pd.api.types.is_bool_dtype(df[c].dtype)]
    missing = [c for c in metrics if c not in df.columns]
    if missing:
        raise SearchError(f"metrics {missing} are not columns of the table",
                          hint=f"choose among {shown(columns)}")
    return metrics


def statuses(df: pd.DataFrame, status_col: str | None, y: np.ndarray,
              columns: list[str]) -> np.ndarray:
    """The status of every row, checked."""
    if status_col is None:
        return np.where(np.isfinite(y), "ok", "failed").astype(object)
    if status_col not in df.columns:
        raise SearchError(f"the table has no status column {status_col!r}; its columns: "
                          f"{shown(columns)}",
                          hint="pass status_col=<column>, or status_col=None to count rows with a "
                               "finite objective as ok and the rest as failed")
    raw = df[status_col]
    status = np.array([s.strip() if isinstance(s, str) else s for s in raw], dtype=object)
    bad = sorted({repr(s) for s in status if s not in FINISHED})
    if bad:
        raise SearchError(f"column {status_col!r} holds unknown status value(s) {', '.join(bad)}",
                          hint=f"statuses are {', '.join(FINISHED)}; map the others first, e.g. "
                               f"df[{status_col!r}].replace({{'no_result': 'failed'}})")
    return status


def knob_names(df: pd.DataFrame, knobs: Sequence[str] | None, space: Space | None,
                objective: str, status_col: str | None, columns: list[str]) -> list[str]:
    """The knob columns: given, the space's, or inferred from the dtypes."""
    import pandas as pd

    if isinstance(knobs, str):
        raise SearchError(f"knobs = {brief(knobs)} must be a list of column names",
                          hint=f"e.g. knobs=[{brief(knobs)}]")
    if knobs is None and space is not None:
        knobs = list(space.names)
    elif knobs is None:
        knobs = [c for c in df.columns if c not in (objective, status_col)
                 and (pd.api.types.is_integer_dtype(df[c].dtype)
                      or pd.api.types.is_bool_dtype(df[c].dtype)
                      or not pd.api.types.is_numeric_dtype(df[c].dtype))]
        if not knobs:
            raise SearchError(f"no knob column found among {shown(columns)} (integer, boolean "
                              "and text columns are knobs; float columns are metrics)",
                              hint="pass knobs=[...] naming the configuration columns")
    knobs = list(knobs)
    missing = [k for k in knobs if k not in df.columns]
    if missing:
        raise SearchError(f"knob column(s) {missing} are not in the table; its columns: "
                          f"{shown(columns)}", hint="pass knobs= naming existing columns")
    clash = [k for k in knobs if k in (objective, status_col)]
    if clash:
        raise SearchError(f"{clash} cannot be both a knob and the objective/status column",
                          hint="leave them out of knobs")
    if space is not None and sorted(knobs) != sorted(space.names):
        raise SearchError(f"knobs {sorted(knobs)} differ from the space's parameters "
                          f"{sorted(space.names)}", hint="pass knobs=None to use the space's")
    blank = [k for k in knobs if df[k].isna().any()]
    if blank:
        raise SearchError(f"knob column(s) {blank} have blank cells",
                          hint="fill them with a placeholder value (cubicml_lab.datasets uses -1 "
                               "and 'unknown'), or drop those rows")
    return knobs


def observed_space(df: pd.DataFrame, knobs: list[str]) -> Space:
    """A space holding exactly the values observed in each knob column."""
    from ..datasets import observed_parameter

    try:
        return Space([observed_parameter(k, df[k]) for k in knobs])
    except SpaceError as err:
        raise SearchError(f"cannot build a space from the knob columns: {err.message}",
                          hint=err.hint or "pass space=...") from None
