"""How a measured table becomes a dataset's table: the raw export expanded to one column per
config key, metric and hardware field (the store's tidy layout,
:func:`~cubicml_lab.store.tables.tidy_columns`), statuses normalised, blank knob cells filled,
knob columns typed, and a parameter made of the values observed.

:mod:`cubicml_lab.datasets` calls these while it loads a table; they know nothing of which
dataset it is.

Example:
    >>> import pandas as pd
    >>> observed_parameter("micro_batch", pd.Series([4, 1, 2, 4]))
    Ordinal(name='micro_batch', choices=(1, 2, 4))
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._params import brief
from .errors import ConfigError, DataError
from .space import Bool, Choice, Ordinal, Parameter
from .store.tables import tidy_columns
from .trials import FINISHED, restore

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

__all__ = ["UNKNOWN", "UNKNOWN_NUMBER", "expand_raw", "fill_blanks", "is_number_col",
           "observed_parameter", "plain", "status_column", "tidy_config_columns"]

#: Placeholder for a blank string knob cell.
UNKNOWN = "unknown"
#: Placeholder for a blank numeric knob cell (every real knob value here is positive or zero).
UNKNOWN_NUMBER = -1
#: The statuses of a measured row (the store's final statuses).
#: Source status words that are not ours, and what they become.
_STATUS_MAP = {"no_result": "failed"}


def expand_raw(pd: Any, df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One column per config key, metric and (flattened, ``hw.``) hardware field."""
    cols = {c: df[c] for c in df.columns if c not in ("config", "metrics", "hardware")}
    parsed = {c: [_as_dict(v, c) for v in df[c]] if c in df.columns else [{}] * len(df)
              for c in ("config", "metrics", "hardware")}

    def column(kind: str, values: list[Any]) -> pd.Series:
        if kind == "metric":
            return pd.Series([_number(v) for v in values], index=df.index)
        return pd.Series(values, dtype=object, index=df.index)

    config_keys = tidy_columns(cols, parsed["config"], parsed["metrics"], parsed["hardware"],
                               column)
    out = pd.DataFrame(cols, index=df.index)
    for col in config_keys:  # object -> int64/float64/bool when every value allows it
        out[col] = _typed(pd, out[col])
    return out.reset_index(drop=True), config_keys


def tidy_config_columns(df: pd.DataFrame, path: Path) -> list[str]:
    """The config columns of a tidy table: the knobs of its workload(s), as named there."""
    from . import workloads

    columns: list[str] = []
    for workload in sorted({str(w) for w in df.get("workload", [])}):
        try:
            knobs = workloads.get(workload).knobs()
        except ConfigError as err:  # a workload this version of the lab does not know
            raise DataError(f"{path}: cannot tell config columns from metrics for workload "
                            f"{workload!r} ({err})",
                            hint="write the raw form (TrialStore.export) instead") from None
        for knob in knobs:
            for col in (f"config.{knob}", knob):
                if col in df.columns and col not in columns:
                    columns.append(col)
                    break
    if not columns:
        raise DataError(f"{path} has no config column (neither 'config' nor a workload's knobs)",
                        hint="write it with TrialStore.to_dataframe(...).to_parquet(path)")
    return columns


def status_column(df: pd.DataFrame, objective: str) -> pd.Series:
    """``ok``/``oom``/``failed``/``timeout`` per row; keeps the source's word in source_status."""
    import numpy as np
    import pandas as pd

    if "status" not in df.columns:
        return pd.Series(np.where(df[objective].notna(), "ok", "failed"), index=df.index,
                         dtype=object)
    raw = df["status"].astype(str).str.strip()
    if raw.isin(list(_STATUS_MAP)).any():
        df["source_status"] = raw
    status = raw.replace(_STATUS_MAP)
    bad = sorted(set(status) - set(FINISHED))
    if bad:
        raise DataError(f"unknown status value(s) {bad}",
                        hint=f"statuses are {', '.join(FINISHED)} (and no_result -> failed)")
    return status.astype(object)


def fill_blanks(df: pd.DataFrame, knobs: Sequence[str]) -> dict[str, int]:
    """Fill blank knob cells in place (numbers: -1, strings/bools: "unknown"); count per knob."""
    import pandas as pd

    filled = {}
    for k in knobs:
        col = df[k]
        n = int(col.isna().sum())
        if is_number_col(col):
            col = col.fillna(UNKNOWN_NUMBER) if n else col
            if pd.api.types.is_float_dtype(col.dtype) and (col % 1 == 0).all():
                col = col.astype("int64")
            elif str(col.dtype) == "Int64":
                col = col.astype("int64")
        elif n:
            col = col.astype(object).where(col.notna(), UNKNOWN)
        df[k] = col
        if n:
            filled[k] = n
    return filled


def observed_parameter(name: str, col: pd.Series, order: Sequence[Any] | None = None) -> Parameter:
    """A parameter holding exactly the values observed in ``col``: ``Ordinal`` for numbers
    (sorted, or in ``order``), ``Bool`` for both booleans, ``Choice`` otherwise."""
    values = list(dict.fromkeys(plain(v) for v in col))
    if order is not None:
        extra = [v for v in values if v not in order]
        if extra:
            raise DataError(f"knob {name!r}: values {extra} are not in the order {list(order)}")
        return Ordinal(name, [v for v in order if v in values])
    if all(isinstance(v, bool) for v in values) and len(values) == 2:
        return Bool(name)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return Ordinal(name, sorted(values))
    return Choice(name, sorted(values, key=lambda v: (type(v).__name__, str(v))))


def is_number_col(col: pd.Series) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype)


def _typed(pd: Any, col: pd.Series) -> pd.Series:
    """An object column of config values as int64/float64/bool when every value allows it."""
    present = [v for v in col if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if present and all(isinstance(v, bool) for v in present):
        return col.astype("boolean" if len(present) < len(col) else bool)
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        if all(isinstance(v, int) for v in present):
            return col.astype("Int64" if len(present) < len(col) else "int64")
        return pd.to_numeric(col).astype("float64")
    return col


def _as_dict(value: Any, column: str) -> dict[str, Any]:
    """A JSON text or dict cell as a dict ({} for a missing cell)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (str, bytes)):
        try:
            out = json.loads(value) if value else {}
        except json.JSONDecodeError as err:
            raise DataError(f"column {column!r}: {brief(value)} is not JSON ({err})",
                            hint="write the table with TrialStore.to_dataframe or export") from None
        if isinstance(out, dict):
            return out
    raise DataError(f"column {column!r}: {brief(value)} is not a JSON object or dict",
                    hint="write the table with TrialStore.to_dataframe or export")


def _number(value: Any) -> Any:
    """Metric values: the store's "NaN"/"Infinity" strings back to floats (the trials' codec,
    :func:`~cubicml_lab.trials.restore`), None to NaN."""
    if value is None:
        return math.nan
    return restore(value) if isinstance(value, str) else value


def plain(value: Any) -> Any:
    """A plain Python scalar from a NumPy/pandas scalar."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value
