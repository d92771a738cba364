"""Trials as tables: the tidy DataFrame, and export/import of the raw CSV/Parquet form.

The functions here are the bodies of :meth:`TrialStore.to_dataframe`, :meth:`TrialStore.export`
and :meth:`TrialStore.import_` (documented there); they read and write through the store's own
connection and transactions. pandas and pyarrow are imported inside the functions that need them.

The *raw* form is one row per trial with the scalar columns (``trial_id, campaign, status,
workload, workload_version, created_at, started_at, ended_at, error``), the JSON text columns
``config, metrics, hardware``, and the campaign's own ``campaign_workload, campaign_space,
campaign_metadata``; CSV floats are written with ``repr`` so every bit survives. The *tidy* form
(one column per knob, metric and hardware field) is for analysis and cannot be imported back.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DependencyError, StoreError
from .schema import (STATUSES, _check_config, _check_mapping, _check_name, _check_status,
                     _check_time, _dumps)

if TYPE_CHECKING:
    import pandas as pd

    from .core import TrialStore

_INT64_MAX = 2**63 - 1
_FIXED_COLUMNS = ("trial_id", "campaign", "status", "workload", "workload_version", "created_at",
                  "started_at", "ended_at", "duration_s", "error")
_RAW_COLUMNS = ("trial_id", "campaign", "status", "workload", "workload_version", "created_at",
                "started_at", "ended_at", "error", "config", "metrics", "hardware",
                "campaign_workload", "campaign_space", "campaign_metadata")
_RAW_REQUIRED = ("campaign", "status", "config")


def to_dataframe(store: TrialStore, campaign: str | None = None) -> pd.DataFrame:
    """The tidy form of the trials (all, or one campaign's); see :meth:`TrialStore.to_dataframe`."""
    import pandas as pd

    trials = store.trials(campaign)
    cols: dict[str, Any] = {
        "trial_id": pd.Series([t.id for t in trials], dtype="int64"),
        **{name: pd.Series([getattr(t, name) for t in trials], dtype=object)
           for name in ("campaign", "status", "workload", "workload_version")},
        **{name: pd.Series([_nan(getattr(t, name)) for t in trials], dtype="float64")
           for name in ("created_at", "started_at", "ended_at", "duration_s")},
        "error": pd.Series([t.error for t in trials], dtype=object),
    }
    for key in _keys(t.config for t in trials):
        name = f"config.{key}" if key in _FIXED_COLUMNS else key
        cols[name] = _column(pd, [t.config.get(key) for t in trials], exact=True)
    for key in _keys(t.metrics for t in trials):
        name = f"metric.{key}" if key in cols else key
        cols[name] = _column(pd, [t.metrics.get(key) for t in trials], exact=False)
    hardware = [_flatten(t.hardware, "hw.") for t in trials]
    for key in _keys(hardware):
        cols[key] = _column(pd, [hw.get(key) for hw in hardware], exact=False)
    return pd.DataFrame(cols)


def export(store: TrialStore, path: str | os.PathLike[str], campaign: str | None = None) -> Path:
    """Write the raw form to ``.csv``/``.parquet`` atomically; see :meth:`TrialStore.export`."""
    path, kind = _file_kind(path)
    where, params = store._filter(campaign)
    rows = store._read(
        "SELECT t.id, t.campaign, t.status, t.workload, t.workload_version, t.created_at, "
        "t.started_at, t.ended_at, t.error, t.config, t.metrics, t.hardware, c.workload, "
        "c.space, c.metadata FROM trials t JOIN campaigns c ON c.name = t.campaign"
        + "".join(f" WHERE t.{w}" for w in where) + " ORDER BY t.id", params)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if kind == "csv":
            _write_csv(tmp, rows)
        else:
            _write_parquet(tmp, rows)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def import_(store: TrialStore, path: str | os.PathLike[str], campaign: str | None = None) -> int:
    """Append the trials of a raw file in one transaction; see :meth:`TrialStore.import_`."""
    path, kind = _file_kind(path)
    if not path.is_file():
        raise StoreError(f"no file {path} to import", hint="check the path")
    target = None if campaign is None else _check_name(campaign)
    columns, raw = _read_csv(path) if kind == "csv" else _read_parquet(path)
    missing = [c for c in _RAW_REQUIRED
               if c not in columns and not (c == "campaign" and target)]
    unknown = [c for c in columns if c not in _RAW_COLUMNS]
    if missing or unknown:
        raise StoreError(f"{path} is not a raw trial table: missing columns {missing}, "
                         f"unknown columns {unknown}",
                         hint=f"the raw form (store.export) has columns {list(_RAW_COLUMNS)}")
    rows = sorted((_parse_row(row, i, path, target) for i, row in enumerate(raw, start=1)),
                  key=lambda r: r["order"])
    with store._write() as conn:
        for row in rows:
            name = row["campaign"]
            known = conn.execute("SELECT 1 FROM campaigns WHERE name = ?", (name,)).fetchone()
            if known is None:
                same = {r["workload"] for r in rows if r["campaign"] == name}
                workload = row["campaign_workload"] or (same.pop() if len(same) == 1 else "")
                conn.execute("INSERT INTO campaigns VALUES (?, ?, ?, ?, ?)",
                             (name, row["campaign_space"], workload,
                              row["campaign_metadata"] or "{}", time.time()))
            store._campaign_workload(conn, name, row["workload"])  # checks, keeps row's
            conn.execute(
                "INSERT INTO trials (campaign, config, status, metrics, hardware, workload, "
                "workload_version, created_at, started_at, ended_at, error) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, *(row[key] for key in ("config", "status", "metrics", "hardware",
                                              "workload", "workload_version", "created_at",
                                              "started_at", "ended_at", "error"))))
    return len(rows)


# -------------------------------------------------------------------- tidy DataFrame helpers
def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _keys(dicts: Iterable[Mapping[str, Any]]) -> list[str]:
    """Keys of all dicts, in order of first appearance."""
    return list(dict.fromkeys(key for d in dicts for key in d))


def _flatten(value: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, Mapping) and item:
            out.update(_flatten(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


def _column(pd: Any, values: list[Any], *, exact: bool) -> pd.Series:
    """A Series keeping bool/int when it can; ``exact`` keeps ints nullable rather than float."""
    present = [v for v in values if v is not None]
    missing = len(present) < len(values)
    if present and all(isinstance(v, bool) for v in present):
        return pd.Series(values, dtype="boolean" if missing else bool)
    numbers = [v for v in present if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if present and len(numbers) == len(present):
        ints = all(isinstance(v, int) and abs(v) <= _INT64_MAX for v in present)
        if ints and (not missing or exact):
            return pd.Series(values, dtype="Int64" if missing else "int64")
        if not any(isinstance(v, int) and abs(v) > _INT64_MAX for v in present):
            return pd.Series([_nan(v) for v in values], dtype="float64")
    return pd.Series(values, dtype=object)


# -------------------------------------------------------------------- raw files
def _file_kind(path: str | os.PathLike[str]) -> tuple[Path, str]:
    path = Path(path).expanduser()
    kind = path.suffix.lower().lstrip(".")
    if kind not in ("csv", "parquet"):
        raise StoreError(f"cannot tell the format of {path} from its suffix {path.suffix!r}",
                         hint="use a .csv or .parquet file name")
    return path, kind


def _write_csv(path: Path, rows: list[tuple[Any, ...]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(_RAW_COLUMNS)
        for row in rows:  # repr keeps every float bit; None -> "" (error "" is stored as None)
            writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v
                             for v in row])


def _write_parquet(path: Path, rows: list[tuple[Any, ...]]) -> None:
    pd = _pandas_for_parquet()
    cols = {name: [row[i] for row in rows] for i, name in enumerate(_RAW_COLUMNS)}
    frame = pd.DataFrame({name: pd.Series(values, dtype="int64" if name == "trial_id" else
                                          "float64" if name.endswith("_at") else object)
                          for name, values in cols.items()})
    frame.to_parquet(path, index=False)


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long tracebacks
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _read_parquet(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    pd = _pandas_for_parquet()
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises many types for a bad file
        raise StoreError(f"cannot read {path} as Parquet: {err}", hint="check the file") from err
    return [str(c) for c in frame.columns], frame.astype(object).to_dict("records")


def _pandas_for_parquet() -> Any:
    try:
        import pandas as pd
        import pyarrow  # noqa: F401
    except ImportError as err:
        raise DependencyError(f"Parquet needs pandas and pyarrow: {err}",
                              hint="pip install pandas pyarrow, or export to .csv") from err
    return pd


def _parse_row(row: Mapping[str, Any], index: int, path: Path,
               target: str | None) -> dict[str, Any]:
    """Validate one raw row into insertable values; errors name the file, row and column."""
    def cell(name: str) -> Any:
        value = row.get(name)
        return None if value == "" or (isinstance(value, float) and math.isnan(value)) else value

    def fail(name: str, problem: str) -> StoreError:
        return StoreError(f"{path} row {index}, column {name!r}: {problem}",
                          hint="fix the file; nothing was imported")

    def number(name: str) -> float | None:
        value = cell(name)
        try:
            return _check_time(None if value is None else float(value), name)
        except (TypeError, ValueError, StoreError):
            raise fail(name, f"{value!r} is not finite unix seconds") from None

    def text(name: str) -> str | None:
        value = cell(name)
        return None if value is None else str(value)

    def json_text(name: str, check: Any, default: str | None) -> str | None:
        value = cell(name)
        if value is None:
            return default
        try:
            return _dumps(check(json.loads(str(value)), name))
        except (ValueError, StoreError) as err:
            raise fail(name, f"{err}") from None

    def checked(name: str, check: Any, *args: Any) -> Any:
        try:
            return check(*args)
        except StoreError as err:
            raise fail(name, err.message) from None

    campaign = target or checked("campaign", _check_name, text("campaign"))
    status = checked("status", _check_status, text("status"), STATUSES)
    config = json_text("config", lambda value, _: _check_config(value), None)
    if config is None:
        raise fail("config", "empty; a trial needs its config as JSON text")
    order, created_at = number("trial_id"), number("created_at")
    return {"order": index if order is None else order, "campaign": campaign, "status": status,
            "config": config, "metrics": json_text("metrics", _check_mapping, "{}"),
            "hardware": json_text("hardware", _check_mapping, "{}"),
            "workload": text("workload") or "", "workload_version": text("workload_version") or "",
            "created_at": time.time() if created_at is None else created_at,
            "started_at": number("started_at"), "ended_at": number("ended_at"),
            "error": text("error"),
            "campaign_workload": text("campaign_workload") or "",
            "campaign_space": json_text("campaign_space", _check_mapping, None),
            "campaign_metadata": json_text("campaign_metadata", _check_mapping, None)}
