"""Trials as tables: the tidy DataFrame, and export/import of the raw CSV/Parquet form.

The store (:mod:`~cubicml_lab.store.core`) calls these for :meth:`TrialStore.to_dataframe`,
:meth:`TrialStore.export` and :meth:`TrialStore.import_` (documented there); it runs the SQL and
the transactions, and this module turns trials and rows into tables and files and back, never
touching the store itself (so the two import one way: core -> tables -> schema). pandas and
pyarrow are imported inside the functions that need them.

The *raw* form is one row per trial with the scalar columns (``trial_id, campaign, status,
workload, workload_version, created_at, started_at, ended_at, error``), the JSON text columns
``config, metrics, hardware``, and the campaign's own ``campaign_workload, campaign_space,
campaign_metadata``; CSV floats are written with ``repr`` so every bit survives. The *tidy* form
(one column per knob, metric and hardware field) is for analysis and cannot be imported back.

A CSV cell that a spreadsheet would run as a formula (one starting with ``=``, ``+``, ``-``, ``@``,
a tab or a carriage return) is written with a ``'`` in front (OWASP's rule), and so is a cell that
starts with ``'`` followed by one of those or by another ``'``; the import takes exactly that
``'`` off again (:func:`csv_cell`, :func:`from_csv_cell`), so a round trip loses nothing. An
imported trial that claims to be ``pending`` or ``running`` is stored as interrupted:
``pending``, without a process record or start time, to be run again by its campaign; a file
never names a process that a campaign would signal.
The *readable* form (:func:`readable_frame`, what ``Campaign.table()`` shows) is a handful of
those columns, with times as datetimes.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DependencyError, StoreError
from ..trials import error_summary, is_contended, is_stopped_early
from .raw_row import parse_row
from .schema import _SQLITE_MAGIC, Trial, _check_path

if TYPE_CHECKING:
    import pandas as pd

_INT64_MAX = 2**63 - 1
_FIXED_COLUMNS = ("trial_id", "campaign", "status", "workload", "workload_version", "created_at",
                  "started_at", "ended_at", "duration_s", "error")
_RAW_COLUMNS = ("trial_id", "campaign", "status", "workload", "workload_version", "created_at",
                "started_at", "ended_at", "error", "config", "metrics", "hardware",
                "campaign_workload", "campaign_space", "campaign_metadata")
_RAW_REQUIRED = ("campaign", "status", "config")
#: Selects the raw form's rows (columns in :data:`_RAW_COLUMNS` order); the store appends an
#: optional ``WHERE t.campaign = ?`` and the ordering.
RAW_SELECT = ("SELECT t.id, t.campaign, t.status, t.workload, t.workload_version, t.created_at, "
              "t.started_at, t.ended_at, t.error, t.config, t.metrics, t.hardware, c.workload, "
              "c.space, c.metadata FROM trials t JOIN campaigns c ON c.name = t.campaign")


def to_dataframe(trials: Sequence[Trial]) -> pd.DataFrame:
    """The tidy form of ``trials``; see :meth:`TrialStore.to_dataframe`."""
    import pandas as pd

    cols: dict[str, Any] = {
        "trial_id": pd.Series([t.id for t in trials], dtype="int64"),
        **{name: pd.Series([getattr(t, name) for t in trials], dtype=object)
           for name in ("campaign", "status", "workload", "workload_version")},
        **{name: pd.Series([_nan(getattr(t, name)) for t in trials], dtype="float64")
           for name in ("created_at", "started_at", "ended_at", "duration_s")},
        "error": pd.Series([t.error for t in trials], dtype=object),
    }
    tidy_columns(cols, [t.config for t in trials], [t.metrics for t in trials],
                 [t.hardware for t in trials],
                 lambda kind, values: _column(pd, values, exact=kind == "config"))
    return pd.DataFrame(cols)


def tidy_columns(cols: dict[str, Any], configs: Sequence[Mapping[str, Any]],
                 metrics: Sequence[Mapping[str, Any]], hardware: Sequence[Mapping[str, Any]],
                 column: Callable[[str, list[Any]], Any]) -> list[str]:
    """Add a tidy trial table's config, metric and hardware columns to ``cols`` (in place).

    One column per config key (``config.<key>`` where the key is a column already there), per
    metric (``metric.<key>`` likewise) and per flattened hardware field (``hw.<path>``:
    :func:`flatten`), each in order of first appearance (:func:`keys_in_order`); a trial
    without a key gets None. ``column(kind, values)`` builds each column (``kind``:
    ``"config"``, ``"metric"`` or ``"hw"``). The one home of the tidy layout: the store's
    :func:`to_dataframe` and :mod:`cubicml_lab.datasets` (reading an export) both call it.

    Returns:
        The config columns' names, in order.

    Example:
        >>> cols = {"status": ["ok"]}
        >>> tidy_columns(cols, [{"status": 1}], [{"tps": 2.0}], [{"gpu": {"name": "h100"}}],
        ...              lambda kind, values: values)
        ['config.status']
        >>> cols
        {'status': ['ok'], 'config.status': [1], 'tps': [2.0], 'hw.gpu.name': ['h100']}
    """
    config_columns = []
    for key in keys_in_order(configs):
        name = f"config.{key}" if key in cols else key
        cols[name] = column("config", [c.get(key) for c in configs])
        config_columns.append(name)
    for key in keys_in_order(metrics):
        name = f"metric.{key}" if key in cols else key
        cols[name] = column("metric", [m.get(key) for m in metrics])
    flat = [flatten(h, "hw.") for h in hardware]
    for key in keys_in_order(flat):
        cols[key] = column("hw", [h.get(key) for h in flat])
    return config_columns


#: Metrics a person reads beside the objective, each named with its unit, in this order.
READ_METRICS = ("tokens_per_s", "samples_per_s", "step_time_s", "peak_mem_gib", "mfu")


def readable_frame(trials: Sequence[Trial], knobs: Sequence[str],
                   objective: str = "throughput") -> pd.DataFrame:
    """What a person reads of ``trials``: a handful of columns, one row per trial.

    Columns: ``trial_id``, ``status``, the ``knobs``, the ``objective`` and its relative 95% CI
    (``{objective}_rel_ci``, where stored), the metrics of :data:`READ_METRICS` that the trials
    have (names carry units), ``contended`` (the contention guard flagged the figure: not
    trusted), ``stopped_early`` where a trial has it (its timing stopped once it could not
    beat the best: its figure bounds its speed), ``started_at`` (local time to the second, a
    pandas datetime), ``duration_s``, ``device_s``
    (:attr:`~cubicml_lab.store.Trial.device_seconds`: devices x wall seconds) and ``error``
    (its summary line: :func:`~cubicml_lab.trials.error_summary`). Values are as stored, not
    rounded; :func:`to_dataframe` has every field.

    Example:
        >>> from cubicml_lab.store import Trial
        >>> t = Trial(id=1, campaign="c", status="ok", config={"micro_batch": 4, "lr": 0.1},
        ...           metrics={"throughput": 900.0, "tokens_per_s": 900.0, "loss": 3.2},
        ...           hardware={}, workload="gpt", workload_version="1", created_at=1.8e9,
        ...           started_at=1.8e9, ended_at=1.8e9 + 12.5, error=None)
        >>> df = readable_frame([t], ["micro_batch"])
        >>> list(df.columns)
        ['trial_id', 'status', 'micro_batch', 'throughput', 'tokens_per_s', 'contended', \
'started_at', 'duration_s', 'device_s', 'error']
        >>> df["started_at"].dtype.kind, df["duration_s"].item()  # M: a datetime
        ('M', 12.5)
    """
    import pandas as pd

    metrics = [objective, f"{objective}_rel_ci"] + [m for m in READ_METRICS if m != objective]
    present = set(keys_in_order(t.metrics for t in trials))
    cols: dict[str, Any] = {"trial_id": pd.Series([t.id for t in trials], dtype="int64"),
                            "status": pd.Series([t.status for t in trials], dtype=object)}
    for knob in knobs:
        cols[knob] = _column(pd, [t.config.get(knob) for t in trials], exact=True)
    for name in metrics:
        if name == objective or name in present:
            cols[name] = _column(pd, [t.metrics.get(name) for t in trials], exact=False)
    cols["contended"] = pd.Series([is_contended(t.metrics) for t in trials], dtype=bool)
    if "stopped_early" in present:
        cols["stopped_early"] = pd.Series([is_stopped_early(t.metrics) for t in trials],
                                          dtype=bool)
    started = pd.to_datetime(pd.Series([_nan(t.started_at) for t in trials], dtype="float64"),
                             unit="s", utc=True)
    cols["started_at"] = started.dt.tz_convert(_local_zone()).dt.tz_localize(None).dt.floor("s")
    cols["duration_s"] = pd.Series([_nan(t.duration_s) for t in trials], dtype="float64")
    cols["device_s"] = pd.Series([_nan(t.device_seconds) for t in trials], dtype="float64")
    cols["error"] = pd.Series([error_summary(t.error) or None for t in trials], dtype=object)
    return pd.DataFrame(cols)


def _local_zone() -> Any:
    import datetime

    return datetime.datetime.now().astimezone().tzinfo


def export_target(path: object, protect: Sequence[Path]) -> tuple[Path, str]:
    """The checked export target and its kind (``csv``/``parquet``), before anything is read.

    Refused: an unknown suffix, a folder, any of the ``protect`` files (the store and its WAL
    files, also through another spelling or a link), and any existing SQLite database.
    """
    path, kind = _file_kind(path)
    if path.is_dir():
        raise StoreError(f"cannot export to {path}: it is a folder",
                         hint=f"pass a file name inside it, e.g. {path / ('trials.' + kind)}")
    if path.exists():
        if any(_same_file(path, other) for other in protect):
            raise StoreError(f"cannot export to {path}: it is the trial store's own file, and "
                             "exporting there would destroy the store",
                             hint=f"export to another file, e.g. {path.with_name('trials.' + kind)}")
        if _head(path) == _SQLITE_MAGIC:
            raise StoreError(f"cannot export to {path}: it is an SQLite database (a trial "
                             "store?), which an export would overwrite",
                             hint=f"export to a new file, e.g. {path.with_name('trials.' + kind)}")
    return path, kind


def write_raw(path: Path, kind: str, rows: list[tuple[Any, ...]]) -> Path:
    """Write raw ``rows`` (checked ``path`` and ``kind`` from :func:`export_target`) beside the
    target, then rename it into place: a failed export leaves no half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "csv":
            _write_csv(tmp, rows)
        else:
            _write_parquet(tmp, rows)
        os.replace(tmp, path)
    except OSError as err:
        raise StoreError(f"cannot export to {path}: {err.strerror or err}",
                         hint="choose a folder you can write to, with free space") from err
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return path


def read_raw(path: object, target: str | None) -> list[dict[str, Any]]:
    """Read and validate every row of a raw file, in the order of its ``trial_id``; each row
    is a dict of insertable values (see :func:`~cubicml_lab.store.raw_row.parse_row`). Nothing
    is written here."""
    path, kind = _file_kind(path)
    if not path.is_file():
        raise StoreError(f"no file {path} to import", hint="check the path")
    columns, raw = _read_csv(path) if kind == "csv" else _read_parquet(path)
    missing = [c for c in _RAW_REQUIRED
               if c not in columns and not (c == "campaign" and target)]
    unknown = [c for c in columns if c not in _RAW_COLUMNS]
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if missing or unknown or twice:
        raise StoreError(f"{path} is not a raw trial table: missing columns {missing}, "
                         f"unknown columns {unknown}" + (f", repeated columns {twice}" if twice
                                                         else ""),
                         hint=f"the raw form (store.export) has columns {list(_RAW_COLUMNS)}")
    return sorted((parse_row(row, i, path, target) for i, row in enumerate(raw, start=1)),
                  key=lambda r: r["order"])


# -------------------------------------------------------------------- tidy DataFrame helpers
def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def keys_in_order(dicts: Iterable[Mapping[str, Any]]) -> list[str]:
    """Keys of all dicts, in order of first appearance (the column order of a tidy table)."""
    return list(dict.fromkeys(key for d in dicts for key in d))


def flatten(value: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Nested mappings as one level, keys joined by dots after ``prefix``: the ``hw.`` columns
    of a tidy table (``{"gpu": {"name": "x"}}`` -> ``{"hw.gpu.name": "x"}``)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, Mapping) and item:
            out.update(flatten(item, f"{prefix}{key}."))
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
def _file_kind(path: object) -> tuple[Path, str]:
    path = _check_path(path, "path")
    kind = path.suffix.lower().lstrip(".")
    if kind not in ("csv", "parquet"):
        raise StoreError(f"cannot tell the format of {path} from its suffix {path.suffix!r}",
                         hint="use a .csv or .parquet file name")
    return path, kind


def _same_file(path: Path, other: Path) -> bool:
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read(len(_SQLITE_MAGIC))
    except OSError:
        return b""


#: First characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(text: str) -> str:
    """``text`` as a CSV cell no spreadsheet runs as a formula: ``'`` in front of a cell that
    starts with a formula character, or with ``'`` and then one of those or another ``'``.

    Example:
        >>> [csv_cell(t) for t in ("=1+2", "-3", "'=x", "'ok", "plain")]
        ["'=1+2", "'-3", "''=x", "'ok", 'plain']
    """
    if text[:1] in FORMULA_STARTS or (text[:1] == "'" and text[1:2] in (*FORMULA_STARTS, "'")):
        return "'" + text
    return text


def from_csv_cell(cell: str) -> str:
    """The text :func:`csv_cell` was given (its exact inverse)."""
    if cell[:1] == "'" and cell[1:2] in (*FORMULA_STARTS, "'"):
        return cell[1:]
    return cell


def _write_csv(path: Path, rows: list[tuple[Any, ...]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(_RAW_COLUMNS)
        for row in rows:  # repr keeps every float bit; None -> "" (error "" is stored as None)
            writer.writerow([csv_cell("" if v is None else repr(v) if isinstance(v, float)
                                      else str(v)) for v in row])


def _write_parquet(path: Path, rows: list[tuple[Any, ...]]) -> None:
    pd = _pandas_for_parquet()
    cols = {name: [row[i] for row in rows] for i, name in enumerate(_RAW_COLUMNS)}
    frame = pd.DataFrame({name: pd.Series(values, dtype="int64" if name == "trial_id" else
                                          "float64" if name.endswith("_at") else object)
                          for name, values in cols.items()})
    frame.to_parquet(path, index=False)


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Header and rows of a UTF-8 CSV (a BOM is allowed); a row longer or shorter than the
    header, bytes that are not UTF-8, or a malformed quote raise StoreError."""
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long tracebacks
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            lines = [line for line in csv.reader(fh, strict=True) if line]
    except UnicodeDecodeError as err:
        raise StoreError(f"cannot import {path}: it is not UTF-8 text (byte "
                         f"{err.object[err.start]:#04x} at offset {err.start})",
                         hint="save the file as UTF-8 CSV (store.export writes it so)") from None
    except csv.Error as err:
        raise StoreError(f"cannot import {path}: malformed CSV ({err})",
                         hint="fix the file, or export it again with store.export") from None
    lines = [[from_csv_cell(cell) for cell in line] for line in lines]
    header = lines[0] if lines else []
    for number, line in enumerate(lines[1:], start=1):
        if len(line) != len(header):
            raise StoreError(f"cannot import {path}: row {number} has {len(line)} cells but the "
                             f"header has {len(header)}",
                             hint="fix the file; nothing was imported")
    return header, [dict(zip(header, line)) for line in lines[1:]]


def _read_parquet(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    pd = _pandas_for_parquet()
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises many types for a bad file
        raise StoreError(f"cannot read {path} as Parquet: {err}", hint="check the file") from err
    columns = [str(c) for c in frame.columns]
    frame = frame.astype(object)
    frame = frame.where(frame.notna(), None)  # NaN, None, pd.NA and NaT alike
    return columns, [dict(zip(columns, row)) for row in frame.itertuples(index=False, name=None)]


def _pandas_for_parquet() -> Any:
    try:
        import pandas as pd
        import pyarrow  # noqa: F401
    except ImportError as err:
        raise DependencyError(f"Parquet needs pandas and pyarrow: {err}",
                              hint="pip install pandas pyarrow, or export to .csv") from err
    return pd
