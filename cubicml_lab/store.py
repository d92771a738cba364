"""The trial store: every trial of every campaign, in one SQLite file.

:class:`TrialStore` owns the historical job data of the CubicML loop. One SQLite file (stdlib
``sqlite3``, WAL journal, ``PRAGMA user_version`` = :data:`SCHEMA_VERSION`) holds two tables:
``campaigns`` (name, search space, workload, metadata) and ``trials`` (config, status, metrics,
hardware, workload name and version, timestamps in unix seconds, error text). Each write is one
``BEGIN IMMEDIATE`` transaction, and every input is validated before the transaction starts, so bad
input never costs data already stored. One connection, guarded by a lock, serves every thread.

A trial moves ``pending -> running -> ok | oom | failed | timeout``; ``reset_trial`` takes an
interrupted ``running`` trial back to ``pending``; ``record_trial`` inserts a finished trial in
one step.

Config, metrics and hardware are stored as strict JSON text, never pickle. Config values are JSON
scalars (int, float, str, bool, None) and read back with their type (``True`` stays ``True``, ``4``
stays ``4``). Non-finite floats in metrics and hardware are stored as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` and read back as floats, so a metric that is exactly one of those
strings also reads back as a float. Non-finite config values are refused.

``export``/``import_`` write and read the *raw* form: one row per trial with the scalar columns
(``trial_id, campaign, status, workload, workload_version, created_at, started_at, ended_at,
error``), the JSON text columns ``config, metrics, hardware``, and the campaign's own
``campaign_workload, campaign_space, campaign_metadata``. ``to_dataframe`` gives the tidy form for
analysis (one column per knob, metric and hardware field); it cannot be imported back.
"""

from __future__ import annotations

import csv
import json
import math
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import DependencyError, StoreError

if TYPE_CHECKING:
    import pandas as pd

    from .space import Space

__all__ = ["FINAL_STATUSES", "SCHEMA_VERSION", "STATUSES", "Trial", "TrialStore"]

#: Version of the SQLite schema, kept in ``PRAGMA user_version``.
SCHEMA_VERSION = 1
#: Every trial status, in lifecycle order.
STATUSES = ("pending", "running", "ok", "oom", "failed", "timeout")
#: Statuses a trial ends in; a trial in one of them never changes again.
FINAL_STATUSES = ("ok", "oom", "failed", "timeout")

_SQLITE_MAGIC = b"SQLite format 3\x00"
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_INT64_MAX = 2**63 - 1
_FIXED_COLUMNS = ("trial_id", "campaign", "status", "workload", "workload_version", "created_at",
                  "started_at", "ended_at", "duration_s", "error")
_RAW_COLUMNS = ("trial_id", "campaign", "status", "workload", "workload_version", "created_at",
                "started_at", "ended_at", "error", "config", "metrics", "hardware",
                "campaign_workload", "campaign_space", "campaign_metadata")
_RAW_REQUIRED = ("campaign", "status", "config")
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
_SELECT_TRIAL = ("SELECT id, campaign, config, status, metrics, hardware, workload, "
                 "workload_version, created_at, started_at, ended_at, error FROM trials")


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


class TrialStore:
    """Every trial of every campaign in one SQLite file (WAL, one transaction per write).

    Args:
        path: The SQLite file; created with its parent directories when missing. A file that is
            not SQLite, is another application's database, or has a newer schema raises
            :class:`~cubicml_lab.errors.StoreError` and is left untouched.

    Example:
        >>> import pathlib, tempfile
        >>> tmp = pathlib.Path(tempfile.mkdtemp())
        >>> with TrialStore(tmp / "lab.sqlite") as store:
        ...     store.create_campaign("demo", workload="gpt")
        ...     tid = store.add_trial("demo", {"micro_batch": 4, "compile": True}, workload="gpt")
        ...     store.mark_running(tid, hardware={"device": "cpu"})
        ...     store.finish_trial(tid, status="ok", metrics={"tokens_per_s": 1234.5})
        ...     trial = store.get_trial(tid)
        >>> trial.status, trial.config, trial.metrics
        ('ok', {'micro_batch': 4, 'compile': True}, {'tokens_per_s': 1234.5})
    """

    def __init__(self, path: str | os.PathLike[str] = "data/lab.sqlite") -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = _open(self.path)

    # ---------------------------------------------------------------- connection plumbing
    def close(self) -> None:
        """Close the file; later calls raise StoreError. Closing twice is harmless."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> TrialStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrialStore({str(self.path)!r})"

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"trial store {self.path} is closed",
                             hint="open it again: TrialStore(path)")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed on success, rolled back on any exception."""
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                conn.execute("COMMIT")
            except BaseException as err:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(err, sqlite3.Error):
                    raise StoreError(f"writing {self.path} failed: {err}",
                                     hint="another process may hold the file; retry") from err
                raise

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._connection().execute(sql, params).fetchall()
            except sqlite3.Error as err:
                raise StoreError(f"reading {self.path} failed: {err}") from err

    # ---------------------------------------------------------------- campaigns
    def create_campaign(self, name: str, *, space: Mapping[str, Any] | Space | None = None,
                        workload: str = "", metadata: Mapping[str, Any] | None = None,
                        exist_ok: bool = True) -> None:
        """Create a campaign, or reuse an existing one of the same workload.

        On an existing campaign nothing stored is overwritten: only an empty workload, a missing
        space or empty metadata is filled in from the arguments.

        Args:
            name: Campaign name (non-empty).
            space: The search space as a dict (or any object with ``to_dict()``, e.g. ``Space``).
            workload: Workload name; ``""`` leaves it unspecified.
            metadata: Free-form JSON-serialisable notes.
            exist_ok: If False, an existing campaign of this name raises StoreError.
        """
        name = _check_name(name)
        workload = _check_text(workload, "workload")
        if space is not None and not isinstance(space, Mapping) and hasattr(space, "to_dict"):
            space = space.to_dict()
        space_json = None if space is None else _dumps(_check_mapping(space, "space"))
        meta_json = _dumps(_check_mapping(metadata or {}, "metadata"))
        with self._write() as conn:
            row = conn.execute("SELECT workload FROM campaigns WHERE name = ?", (name,)).fetchone()
            if row is None:
                conn.execute("INSERT INTO campaigns VALUES (?, ?, ?, ?, ?)",
                             (name, space_json, workload, meta_json, time.time()))
                return
            if not exist_ok:
                raise StoreError(f"campaign {name!r} already exists in {self.path}",
                                 hint="pass exist_ok=True to reuse it, or choose another name")
            if workload and row[0] and workload != row[0]:
                raise StoreError(f"campaign {name!r} runs workload {row[0]!r}, not {workload!r}",
                                 hint=f"use another campaign name for workload {workload!r}")
            conn.execute("UPDATE campaigns SET workload = CASE WHEN workload = '' THEN ? ELSE "
                         "workload END, space = COALESCE(space, ?), metadata = CASE WHEN "
                         "metadata = '{}' THEN ? ELSE metadata END WHERE name = ?",
                         (workload, space_json, meta_json, name))

    def campaigns(self) -> list[str]:
        """Names of all campaigns, in creation order."""
        return [row[0] for row in self._read("SELECT name FROM campaigns ORDER BY rowid")]

    def campaign_info(self, name: str) -> dict[str, Any]:
        """A campaign's name, space (dict | None), workload, metadata and created_at."""
        rows = self._read("SELECT name, space, workload, metadata, created_at FROM campaigns "
                          "WHERE name = ?", (_check_name(name),))
        if not rows:
            raise self._unknown_campaign(name)
        name, space, workload, metadata, created_at = rows[0]
        return {"name": name, "space": None if space is None else json.loads(space),
                "workload": workload, "metadata": json.loads(metadata), "created_at": created_at}

    def _unknown_campaign(self, name: str) -> StoreError:
        known = ", ".join(repr(n) for n in self.campaigns()) or "none"
        return StoreError(f"unknown campaign {name!r} in {self.path}; known campaigns: {known}",
                          hint=f"create it first: store.create_campaign({name!r}, workload=...)")

    def _campaign_workload(self, conn: sqlite3.Connection, name: str, workload: str) -> str:
        """The workload a trial of ``name`` gets (its own, else the campaign's); raises on an
        unknown campaign or when both are set and differ."""
        row = conn.execute("SELECT workload FROM campaigns WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise self._unknown_campaign(name)
        if workload and row[0] and workload != row[0]:
            raise StoreError(f"trial workload {workload!r} does not match campaign {name!r}, "
                             f"which runs workload {row[0]!r}",
                             hint="add the trial to a campaign of its own workload")
        return workload or row[0]

    # ---------------------------------------------------------------- trial lifecycle
    def add_trial(self, campaign: str, config: Mapping[str, Any], *, workload: str,
                  workload_version: str = "") -> int:
        """Add a ``pending`` trial and return its id. ``workload=""`` takes the campaign's."""
        campaign, config_json = _check_name(campaign), _dumps(_check_config(config))
        workload = _check_text(workload, "workload")
        version = _check_text(workload_version, "workload_version")
        with self._write() as conn:
            workload = self._campaign_workload(conn, campaign, workload)
            cur = conn.execute(
                "INSERT INTO trials (campaign, config, status, metrics, hardware, workload, "
                "workload_version, created_at) VALUES (?, ?, 'pending', '{}', '{}', ?, ?, ?)",
                (campaign, config_json, workload, version, time.time()))
            return int(cur.lastrowid)

    def mark_running(self, trial_id: int, *, hardware: Mapping[str, Any] | None = None) -> None:
        """Move a trial ``pending -> running``; set ``started_at`` (and ``hardware`` if given)."""
        trial_id = _check_id(trial_id)
        hw_json = None if hardware is None else _dumps(_check_mapping(hardware, "hardware"))
        with self._write() as conn:
            self._expect(conn, trial_id, ("pending",), "mark_running")
            conn.execute("UPDATE trials SET status = 'running', started_at = ?, "
                         "hardware = COALESCE(?, hardware) WHERE id = ?",
                         (time.time(), hw_json, trial_id))

    def finish_trial(self, trial_id: int, *, status: str, metrics: Mapping[str, Any] | None = None,
                     hardware: Mapping[str, Any] | None = None, error: str | None = None) -> None:
        """Move a ``pending`` or ``running`` trial to a final status and set ``ended_at``.

        Args:
            trial_id: The trial.
            status: One of :data:`FINAL_STATUSES`.
            metrics: Measured values (non-finite floats allowed); replaces stored metrics.
            hardware: Merged over the hardware stored by :meth:`mark_running` (top-level keys).
            error: Error text; ``""`` is stored as None.
        """
        trial_id, status = _check_id(trial_id), _check_status(status, FINAL_STATUSES)
        metrics = _check_mapping(metrics or {}, "metrics")
        new_hw = _check_mapping(hardware or {}, "hardware")
        error = _check_error(error)
        with self._write() as conn:
            self._expect(conn, trial_id, ("pending", "running"), "finish_trial")
            (old_hw,) = conn.execute("SELECT hardware FROM trials WHERE id = ?",
                                     (trial_id,)).fetchone()
            conn.execute("UPDATE trials SET status = ?, metrics = ?, hardware = ?, error = ?, "
                         "ended_at = ? WHERE id = ?",
                         (status, _dumps(metrics), _dumps({**json.loads(old_hw), **new_hw}), error,
                          time.time(), trial_id))

    def reset_trial(self, trial_id: int) -> None:
        """Move an interrupted trial ``running -> pending``; clear ``started_at`` and hardware."""
        trial_id = _check_id(trial_id)
        with self._write() as conn:
            self._expect(conn, trial_id, ("running",), "reset_trial")
            conn.execute("UPDATE trials SET status = 'pending', started_at = NULL, hardware = '{}' "
                         "WHERE id = ?", (trial_id,))

    def _expect(self, conn: sqlite3.Connection, trial_id: int, allowed: tuple[str, ...],
                action: str) -> None:
        row = conn.execute("SELECT status FROM trials WHERE id = ?", (trial_id,)).fetchone()
        if row is None:
            raise StoreError(f"no trial with id {trial_id} in {self.path}",
                             hint="list trials with store.trials(campaign)")
        if row[0] not in allowed:
            raise StoreError(f"{action}: trial {trial_id} is {row[0]!r}, but {action} needs "
                             f"{' or '.join(map(repr, allowed))}",
                             hint="a finished trial never changes; add a new trial to measure again"
                             if row[0] in FINAL_STATUSES else None)

    def record_trial(self, campaign: str, config: Mapping[str, Any], *, status: str,
                     metrics: Mapping[str, Any] | None = None,
                     hardware: Mapping[str, Any] | None = None, workload: str = "",
                     workload_version: str = "", error: str | None = None,
                     started_at: float | None = None, ended_at: float | None = None) -> int:
        """Insert an already finished trial in one step (imports, replays) and return its id.

        ``status`` must be final; ``workload=""`` takes the campaign's; ``ended_at`` defaults to
        now. Times are unix seconds and ``started_at <= ended_at``.
        """
        campaign, config_json = _check_name(campaign), _dumps(_check_config(config))
        status = _check_status(status, FINAL_STATUSES)
        metrics_json = _dumps(_check_mapping(metrics or {}, "metrics"))
        hw_json = _dumps(_check_mapping(hardware or {}, "hardware"))
        workload = _check_text(workload, "workload")
        version = _check_text(workload_version, "workload_version")
        error, now = _check_error(error), time.time()
        started_at = _check_time(started_at, "started_at")
        ended_at = now if ended_at is None else _check_time(ended_at, "ended_at")
        if started_at is not None and started_at > ended_at:
            raise StoreError(f"started_at = {started_at} is after ended_at = {ended_at}",
                             hint="pass unix seconds with started_at <= ended_at")
        with self._write() as conn:
            workload = self._campaign_workload(conn, campaign, workload)
            cur = conn.execute(
                "INSERT INTO trials (campaign, config, status, metrics, hardware, workload, "
                "workload_version, created_at, started_at, ended_at, error) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (campaign, config_json, status, metrics_json, hw_json, workload, version, now,
                 started_at, ended_at, error))
            return int(cur.lastrowid)

    # ---------------------------------------------------------------- reading
    def get_trial(self, trial_id: int) -> Trial:
        """The trial with this id; unknown ids raise StoreError."""
        rows = self._read(f"{_SELECT_TRIAL} WHERE id = ?", (_check_id(trial_id),))
        if not rows:
            raise StoreError(f"no trial with id {trial_id} in {self.path}",
                             hint="list trials with store.trials(campaign)")
        return _to_trial(rows[0])

    def trials(self, campaign: str | None = None,
               status: str | Sequence[str] | None = None) -> list[Trial]:
        """Trials ordered by id, optionally of one campaign and/or with given status(es)."""
        where, params = self._filter(campaign)
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            wanted = [_check_status(s, STATUSES) for s in wanted]
            where.append(f"status IN ({', '.join('?' * len(wanted))})")
            params.extend(wanted)
        sql = _SELECT_TRIAL + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY id"
        return [_to_trial(row) for row in self._read(sql, params)]

    def _filter(self, campaign: str | None) -> tuple[list[str], list[Any]]:
        if campaign is None:
            return [], []
        if _check_name(campaign) not in self.campaigns():
            raise self._unknown_campaign(campaign)
        return ["campaign = ?"], [campaign]

    def to_dataframe(self, campaign: str | None = None) -> pd.DataFrame:
        """The tidy form: one row per trial, for analysis and plots.

        Columns: ``trial_id, campaign, status, workload, workload_version, created_at,
        started_at, ended_at, duration_s, error`` (times in unix seconds, NaN when unknown), then
        one column per config key (``config.<key>`` if it clashes with a fixed column), one per
        metric key (``metric.<key>`` if it clashes with a column before it), and the hardware
        flattened as ``hw.<key>`` (nested keys joined with dots). Config columns keep their type:
        bool, int64 (nullable ``boolean``/``Int64`` when some trials lack the key); numeric
        metrics are float64 with NaN when missing unless every trial has an int.
        """
        import pandas as pd

        trials = self.trials(campaign)
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

    # ---------------------------------------------------------------- export / import
    def export(self, path: str | os.PathLike[str], campaign: str | None = None) -> Path:
        """Write the raw form of the trials (all, or one campaign's) to ``.csv`` or ``.parquet``.

        The file is written beside the target and renamed into place, so a failed export leaves
        no half-written file. Campaigns without trials are not exported.

        Returns:
            The path written.
        """
        path, kind = _file_kind(path)
        where, params = self._filter(campaign)
        rows = self._read(
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

    def import_(self, path: str | os.PathLike[str], campaign: str | None = None) -> int:
        """Append the trials of a raw ``.csv``/``.parquet`` file (as written by :meth:`export`).

        Required columns: ``campaign`` (unless ``campaign`` is given), ``status``, ``config``; the
        other raw columns are optional, unknown ones are refused. Trials get new ids in the order
        of the file's ``trial_id``; missing campaigns are created. Everything is validated, then
        written in one transaction: on any error the store is unchanged. Importing a file twice
        adds its trials twice.

        Args:
            path: The file to read.
            campaign: Put every imported trial in this campaign instead of the file's.

        Returns:
            The number of trials imported.
        """
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
        with self._write() as conn:
            for row in rows:
                name = row["campaign"]
                known = conn.execute("SELECT 1 FROM campaigns WHERE name = ?", (name,)).fetchone()
                if known is None:
                    same = {r["workload"] for r in rows if r["campaign"] == name}
                    workload = row["campaign_workload"] or (same.pop() if len(same) == 1 else "")
                    conn.execute("INSERT INTO campaigns VALUES (?, ?, ?, ?, ?)",
                                 (name, row["campaign_space"], workload,
                                  row["campaign_metadata"] or "{}", time.time()))
                self._campaign_workload(conn, name, row["workload"])  # checks, keeps row's
                conn.execute(
                    "INSERT INTO trials (campaign, config, status, metrics, hardware, workload, "
                    "workload_version, created_at, started_at, ended_at, error) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (name, *(row[key] for key in ("config", "status", "metrics", "hardware",
                                                  "workload", "workload_version", "created_at",
                                                  "started_at", "ended_at", "error"))))
        return len(rows)


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
    if not isinstance(name, str) or not name.strip():
        raise StoreError(f"campaign name must be a non-empty string, got {name!r}",
                         hint="name the campaign, e.g. 'gpt-cpu'")
    return name


def _check_text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise StoreError(f"{field} must be a string, got {value!r}", hint=f'pass {field}=""')
    return value


def _check_error(error: object) -> str | None:
    if error is not None and not isinstance(error, str):
        raise StoreError(f"error must be a string or None, got {type(error).__name__}",
                         hint="pass str(exception) or a formatted traceback")
    return error or None


def _check_id(trial_id: object) -> int:
    try:
        if isinstance(trial_id, bool):
            raise TypeError
        return operator.index(trial_id)  # type: ignore[arg-type]
    except TypeError:
        raise StoreError(f"trial id must be an int, got {trial_id!r}",
                         hint="use the id returned by add_trial") from None


def _check_status(status: object, allowed: tuple[str, ...]) -> str:
    if status not in allowed:
        raise StoreError(f"status {status!r} is not allowed here; allowed: {', '.join(allowed)}",
                         hint="pending/running trials go through add_trial and mark_running"
                         if status in STATUSES else None)
    return status  # type: ignore[return-value]


def _check_time(value: object, field: str) -> float | None:
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


def _to_trial(row: tuple[Any, ...]) -> Trial:
    (id_, campaign, config, status, metrics, hardware, workload, version, created_at,
     started_at, ended_at, error) = row
    return Trial(campaign=campaign, id=id_, config=json.loads(config), status=status,
                 metrics=_restore(json.loads(metrics)), hardware=_restore(json.loads(hardware)),
                 workload=workload, workload_version=version, created_at=created_at,
                 started_at=started_at, ended_at=ended_at, error=error)


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
