"""What the trial store file holds: tables, statuses, the :class:`Trial` record, value checks.

One SQLite file holds two tables, ``campaigns`` and ``trials``; ``PRAGMA user_version`` records
:data:`SCHEMA_VERSION`. :func:`_open` connects, refuses a file that is not SQLite, belongs to
another application or has a newer schema (without touching it), switches to WAL and creates the
tables in a new file.

Every value is checked before a write starts, so bad input never costs stored data: the
``_check_*`` functions validate the scalar columns (campaign name, trial id, status, times, text)
and the JSON columns. Config, metrics and hardware are stored as strict JSON text, never pickle:
config values must be finite JSON scalars; metrics, hardware, spaces and metadata become
strict-JSON-ready Python (numpy scalars made plain, non-finite floats as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``). :func:`_to_trial` reads a ``trials`` row back into a
:class:`Trial`, restoring those strings to floats.
"""

from __future__ import annotations

import json
import math
import operator
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StoreError

#: Version of the SQLite schema, kept in ``PRAGMA user_version``.
SCHEMA_VERSION = 1
#: Every trial status, in lifecycle order.
STATUSES = ("pending", "running", "ok", "oom", "failed", "timeout")
#: Statuses a trial ends in; a trial in one of them never changes again.
FINAL_STATUSES = ("ok", "oom", "failed", "timeout")

_SQLITE_MAGIC = b"SQLite format 3\x00"
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS campaigns (
        name TEXT PRIMARY KEY, space TEXT, workload TEXT NOT NULL,
        metadata TEXT NOT NULL, created_at REAL NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS trials (
        id INTEGER PRIMARY KEY, campaign TEXT NOT NULL REFERENCES campaigns(name),
        config TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN {STATUSES!r}),
        metrics TEXT NOT NULL, hardware TEXT NOT NULL, workload TEXT NOT NULL,
        workload_version TEXT NOT NULL, created_at REAL NOT NULL, started_at REAL,
        ended_at REAL, error TEXT)""",
    "CREATE INDEX IF NOT EXISTS trials_by_campaign ON trials (campaign, id)",
)


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One trial: a configuration, what became of it, and where it ran.

    Attributes:
        campaign: Name of the campaign the trial belongs to.
        id: Store-wide trial id (unique in one store file, assigned on insert).
        config: Knob name -> JSON scalar (the searched parameters, not derived values).
        status: One of :data:`STATUSES`.
        metrics: Measured values, e.g. ``tokens_per_s``, ``step_time_s``, ``peak_mem_gib``.
        hardware: Description of the machine the trial ran on (may be nested).
        workload: Workload name, e.g. ``"gpt"``.
        workload_version: Version string of the workload code.
        created_at: When the trial was added, unix seconds.
        started_at: When it started running, unix seconds; None if it never ran.
        ended_at: When it reached a final status, unix seconds; None until then.
        error: Error text of a failed trial; None otherwise.
    """

    campaign: str
    id: int
    config: dict[str, Any]
    status: str
    metrics: dict[str, Any]
    hardware: dict[str, Any]
    workload: str
    workload_version: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    error: str | None

    @property
    def duration_s(self) -> float | None:
        """Wall-clock seconds from start to end; None unless both are known."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


# -------------------------------------------------------------------- opening the file
def _open(path: Path) -> sqlite3.Connection:
    """Connect, refuse foreign or newer files without touching them, then set WAL and schema."""
    if path.is_dir():
        raise StoreError(f"trial store path {path} is a directory",
                         hint="pass a file path such as data/lab.sqlite")
    if path.exists():
        with path.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
        if head and head != _SQLITE_MAGIC:
            raise StoreError(f"{path} is not an SQLite file (it starts with {head[:8]!r})",
                             hint="pass the path of a cubicml-lab store, or a new file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as err:
        raise StoreError(f"cannot open trial store {path}: {err}",
                         hint="check that the directory exists and is writable") from err
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version > SCHEMA_VERSION:
            raise StoreError(f"{path} has store schema version {version}; this cubicml-lab "
                             f"reads version {SCHEMA_VERSION}",
                             hint="upgrade cubicml-lab (pip install -U cubicml-lab) to open it")
        if (version == 0 and tables) or (version and not {"campaigns", "trials"} <= tables):
            raise StoreError(f"{path} is an SQLite file but not a cubicml-lab trial store "
                             f"(user_version {version}, tables {sorted(tables)})",
                             hint="pass the path of a cubicml-lab store, or a new file name")
        conn.execute("PRAGMA foreign_keys = ON")
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode.lower() != "wal":
            raise StoreError(f"cannot switch {path} to WAL journal mode (got {mode!r})",
                             hint="keep the store on a local filesystem")
        if version == 0:
            conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
    except sqlite3.DatabaseError as err:
        conn.close()
        raise StoreError(f"cannot use {path} as a trial store: {err}",
                         hint="pass the path of a cubicml-lab store, or a new file name") from err
    except BaseException:
        conn.close()
        raise
    return conn


# -------------------------------------------------------------------- validation and JSON
def _check_name(name: object) -> str:
    """A campaign name: a string with at least one non-space character."""
    if not isinstance(name, str) or not name.strip():
        raise StoreError(f"campaign name must be a non-empty string, got {name!r}",
                         hint="name the campaign, e.g. 'gpt-cpu'")
    return name


def _check_text(value: object, field: str) -> str:
    """A text column such as ``workload`` or ``workload_version`` (``""`` allowed)."""
    if not isinstance(value, str):
        raise StoreError(f"{field} must be a string, got {value!r}", hint=f'pass {field}=""')
    return value


def _check_error(error: object) -> str | None:
    """Error text of a trial; ``""`` becomes None."""
    if error is not None and not isinstance(error, str):
        raise StoreError(f"error must be a string or None, got {type(error).__name__}",
                         hint="pass str(exception) or a formatted traceback")
    return error or None


def _check_id(trial_id: object) -> int:
    """A trial id: any int-like value except bool (numpy ints included)."""
    try:
        if isinstance(trial_id, bool):
            raise TypeError
        return operator.index(trial_id)  # type: ignore[arg-type]
    except TypeError:
        raise StoreError(f"trial id must be an int, got {trial_id!r}",
                         hint="use the id returned by add_trial") from None


def _check_status(status: object, allowed: tuple[str, ...]) -> str:
    """A status among ``allowed`` (a subset of :data:`STATUSES`)."""
    if status not in allowed:
        raise StoreError(f"status {status!r} is not allowed here; allowed: {', '.join(allowed)}",
                         hint="pending/running trials go through add_trial and mark_running"
                         if status in STATUSES else None)
    return status  # type: ignore[return-value]


def _check_time(value: object, field: str) -> float | None:
    """Finite unix seconds as float, or None; bools and non-finite values are refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise StoreError(f"{field} must be finite unix seconds or None, got {value!r}",
                         hint="use time.time()")
    return float(value)


def _plain(value: Any, where: str) -> Any:
    """``value`` as strict-JSON-ready Python; non-finite floats become "NaN"/"Infinity" strings."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return _plain(value.item(), where)  # numpy scalars
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise StoreError(f"{where}: key {key!r} is {type(key).__name__}, not str",
                                 hint="JSON object keys must be strings")
            out[key] = _plain(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise StoreError(f"{where} = {value!r} ({type(value).__name__}) is not JSON-serialisable",
                     hint="store numbers, strings, bools, None, lists and dicts "
                          "(convert arrays with .tolist())")


def _check_mapping(value: object, where: str) -> dict[str, Any]:
    """A dict with str keys (metrics, hardware, space, metadata) made strict-JSON-ready."""
    if not isinstance(value, Mapping):
        raise StoreError(f"{where} must be a dict, got {type(value).__name__}",
                         hint=f"pass {where} as a dict of name -> value")
    return _plain(value, where)


def _check_config(config: object) -> dict[str, Any]:
    """A config as stored: knob name -> finite JSON scalar, numpy scalars made plain."""
    if not isinstance(config, Mapping):
        raise StoreError(f"config must be a dict, got {type(config).__name__}",
                         hint="pass the config as a dict of knob name -> value")
    for key, value in config.items():
        if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
            value = value.item()
        if not (value is None or isinstance(value, (bool, int, float, str))) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise StoreError(f"config[{key!r}] = {value!r} ({type(value).__name__}) is not a "
                             "finite JSON scalar", hint="config values are int, float, str, "
                             "bool or None; put lists and nested values in metadata")
    return _plain(config, "config")


def _dumps(value: Any) -> str:
    """Compact strict JSON text (NaN/Infinity refused: pass values through :func:`_plain`)."""
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _restore(value: Any) -> Any:
    """Inverse of the non-finite float encoding of :func:`_plain`."""
    if isinstance(value, str):
        return _NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {key: _restore(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_restore(item) for item in value]
    return value


#: Selects a ``trials`` row in the column order :func:`_to_trial` reads.
_SELECT_TRIAL = ("SELECT id, campaign, config, status, metrics, hardware, workload, "
                 "workload_version, created_at, started_at, ended_at, error FROM trials")


def _to_trial(row: tuple[Any, ...]) -> Trial:
    """A ``trials`` row (columns of :data:`_SELECT_TRIAL`) as a :class:`Trial`."""
    (id_, campaign, config, status, metrics, hardware, workload, version, created_at,
     started_at, ended_at, error) = row
    return Trial(campaign=campaign, id=id_, config=json.loads(config), status=status,
                 metrics=_restore(json.loads(metrics)), hardware=_restore(json.loads(hardware)),
                 workload=workload, workload_version=version, created_at=created_at,
                 started_at=started_at, ended_at=ended_at, error=error)

