"""The :class:`TrialStore`: campaigns and the trial lifecycle over one SQLite connection.

One connection, guarded by a lock, serves every thread. Each write is one ``BEGIN IMMEDIATE``
transaction, committed on success and rolled back on any exception; every input is validated
(:mod:`cubicml_lab.store.schema`) before the transaction starts. A trial moves
``pending -> running -> ok | oom | failed | timeout``; ``reset_trial`` takes an interrupted
``running`` trial back to ``pending``; ``record_trial`` inserts a finished trial in one step.
The SQL behind the DataFrame, export and import is here; :mod:`cubicml_lab.store.tables` turns
trials and rows into tables and files and back (it never imports this module).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from . import tables
from .schema import (FINAL_STATUSES, STATUSES, _SELECT_TRIAL, Trial, _check_config, _check_error,
                     _check_id, _check_mapping, _check_metrics, _check_name, _check_path,
                     _check_status, _check_text, _check_time, _column_json, _dumps, _open,
                     _show, _to_trial)

if TYPE_CHECKING:
    import pandas as pd

    from ..space import Space


class NoRoom(StoreError):
    """:meth:`TrialStore.claim_trial` found no room: ``reason`` is ``"budget"`` (the campaign
    holds its budget of trials) or ``"busy"`` (the configuration is pending or running)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, hint="another process sharing the campaign took it; wait for "
                                       "its trials, or raise the budget")
        self.reason = reason


def _loads_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


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
        self.path = _check_path(path, "path")
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

    def _overview(self) -> list[tuple[str, str, dict[str, int]]]:
        """``(campaign, workload, {status: count})`` per campaign, in creation order."""
        rows = self._read("SELECT c.name, c.workload, t.status, COUNT(t.id) FROM campaigns c "
                          "LEFT JOIN trials t ON t.campaign = c.name GROUP BY c.name, t.status "
                          "ORDER BY c.rowid")
        out: dict[str, tuple[str, dict[str, int]]] = {}
        for name, workload, status, count in rows:
            counts = out.setdefault(name, (workload, {}))[1]
            if status is not None:
                counts[status] = int(count)
        return [(name, wl, counts) for name, (wl, counts) in out.items()]

    def __str__(self) -> str:
        if self._conn is None:
            return f"TrialStore({str(self.path)!r}, closed)"
        lines = [f"TrialStore({str(self.path)!r})"]
        for name, workload, counts in self._overview():
            shown = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no trials"
            lines.append(f"  {name} ({workload or 'no workload'}): {shown}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from .._html import card

        if self._conn is None:
            return card("TrialStore (closed)", [("file", str(self.path))])
        overview = self._overview()
        statuses = [s for s in STATUSES if any(s in c for _, _, c in overview)]
        rows = [[name, workload, sum(c.values()), *[c.get(s, 0) for s in statuses]]
                for name, workload, c in overview]
        return card("TrialStore", [("file", str(self.path)), ("campaigns", len(overview))],
                    table=(["campaign", "workload", "trials", *statuses], rows) if rows else None,
                    note="store.to_dataframe(name) gives one row per trial")

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

    def update_campaign_metadata(self, name: str, updates: Mapping[str, Any]) -> dict[str, Any]:
        """Merge ``updates`` into a campaign's metadata (top-level keys) and return the result.

        Raises:
            StoreError: On an unknown campaign or metadata that is not plain JSON.
        """
        name = _check_name(name)
        updates = _check_mapping(updates, "metadata")
        with self._write() as conn:
            row = conn.execute("SELECT metadata FROM campaigns WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise self._unknown_campaign(name)
            merged = {**_column_json(self.path, "campaigns", name, "metadata", row[0]),
                      **updates}
            conn.execute("UPDATE campaigns SET metadata = ? WHERE name = ?",
                         (_dumps(merged), name))
        return merged

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
        return {"name": name, "space": None if space is None else
                _column_json(self.path, "campaigns", name, "space", space),
                "workload": workload,
                "metadata": _column_json(self.path, "campaigns", name, "metadata", metadata),
                "created_at": created_at}

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

    def claim_trial(self, campaign: str, config: Mapping[str, Any], *, budget: int,
                    workload: str, workload_version: str = "", once: bool = False) -> int:
        """Add a ``pending`` trial only if the campaign has room for it, and return its id.

        In one ``BEGIN IMMEDIATE`` transaction: the campaign's trials (finished, pending and
        running, by any process) must number fewer than ``budget``, and no ``pending`` or
        ``running`` trial of it may have this ``config``. So processes sharing a campaign
        finish exactly ``budget`` trials between them and never run one configuration twice at
        once.

        Raises:
            NoRoom: ``budget`` trials are already there (``reason == "budget"``), this
                configuration is pending or running (``reason == "busy"``) or, with ``once``,
                finished (``reason == "done"``); nothing is written.
            StoreError: As :meth:`add_trial`.
        """
        campaign, plain = _check_name(campaign), _check_config(config)
        config_json = _dumps(plain)
        workload = _check_text(workload, "workload")
        version = _check_text(workload_version, "workload_version")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise StoreError(f"budget = {_show(budget)} must be an int >= 1",
                             hint="pass the campaign's budget, e.g. budget=12")
        with self._write() as conn:
            workload = self._campaign_workload(conn, campaign, workload)
            (count,) = conn.execute("SELECT COUNT(*) FROM trials WHERE campaign = ?",
                                    (campaign,)).fetchone()
            if count >= budget:
                raise NoRoom(f"campaign {campaign!r} already holds {count} of its {budget} "
                             "trials", reason="budget")
            for text, status in conn.execute("SELECT config, status FROM trials WHERE "
                                             "campaign = ?", (campaign,)):
                busy = status in ("pending", "running")
                if (busy or once) and (text == config_json or _loads_or_none(text) == plain):
                    raise NoRoom(f"campaign {campaign!r} already has {plain} ({status})",
                                 reason="busy" if busy else "done")
            cur = conn.execute(
                "INSERT INTO trials (campaign, config, status, metrics, hardware, workload, "
                "workload_version, created_at) VALUES (?, ?, 'pending', '{}', '{}', ?, ?, ?)",
                (campaign, config_json, workload, version, time.time()))
            return int(cur.lastrowid)

    def mark_running(self, trial_id: int, *, hardware: Mapping[str, Any] | None = None) -> None:
        """Move a trial ``pending -> running``; set ``started_at`` (and ``hardware`` if given).

        This is the trial's claim, and it is atomic: of several processes or threads starting
        one trial at once, exactly one succeeds and the others get a StoreError.
        """
        trial_id = _check_id(trial_id)
        hw_json = None if hardware is None else _dumps(_check_mapping(hardware, "hardware"))
        with self._write() as conn:
            self._expect(conn, trial_id, ("pending",), "mark_running")
            conn.execute("UPDATE trials SET status = 'running', started_at = ?, "
                         "hardware = COALESCE(?, hardware) WHERE id = ?",
                         (time.time(), hw_json, trial_id))

    def take_over_trial(self, trial_id: int, old: Mapping[str, Any],
                        new: Mapping[str, Any]) -> None:
        """Give a ``running`` trial a new owner: its ``hardware["process"]`` becomes ``new`` if
        it still is ``old`` (a restarted campaign following a job its dead predecessor started).

        Atomic like :meth:`mark_running`: of several processes taking one trial over at once,
        exactly one succeeds and the others get a StoreError.
        """
        trial_id = _check_id(trial_id)
        old, new = _check_mapping(old, "old"), _check_mapping(new, "new")
        with self._write() as conn:
            self._expect(conn, trial_id, ("running",), "take_over_trial")
            row = conn.execute("SELECT hardware FROM trials WHERE id = ?", (trial_id,)).fetchone()
            hardware = _column_json(self.path, "trials", trial_id, "hardware", row[0] or "{}")
            if hardware.get("process") != json.loads(_dumps(old)):
                raise StoreError(f"trial {trial_id} has another owner than the one to take over "
                                 "from", hint="another process took it over first")
            conn.execute("UPDATE trials SET hardware = ? WHERE id = ?",
                         (_dumps({**hardware, "process": dict(new)}), trial_id))

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
        metrics = _check_metrics({} if metrics is None else metrics)
        new_hw = _check_mapping({} if hardware is None else hardware, "hardware")
        error = _check_error(error)
        with self._write() as conn:
            self._expect(conn, trial_id, ("pending", "running"), "finish_trial")
            (old_hw,) = conn.execute("SELECT hardware FROM trials WHERE id = ?",
                                     (trial_id,)).fetchone()
            conn.execute("UPDATE trials SET status = ?, metrics = ?, hardware = ?, error = ?, "
                         "ended_at = ? WHERE id = ?",
                         (status, _dumps(metrics),
                          _dumps({**_column_json(self.path, "trials", trial_id, "hardware",
                                                 old_hw), **new_hw}), error,
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
        """Raise StoreError unless trial ``trial_id`` exists with a status among ``allowed``."""
        row = conn.execute("SELECT status FROM trials WHERE id = ?", (trial_id,)).fetchone()
        if row is None:
            raise StoreError(f"no trial with id {trial_id} in {self.path}",
                             hint="list trials with store.trials(campaign)")
        if row[0] not in allowed:
            raise StoreError(f"{action}: trial {trial_id} is {row[0]!r}, but {action} needs "
                             f"{' or '.join(map(repr, allowed))}",
                             hint="a finished trial never changes; add a new trial to measure again"
                             if row[0] in FINAL_STATUSES else "another process or thread started "
                             "it first (each trial runs once); add a new trial to run it again"
                             if row[0] == "running" else None)

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
        metrics_json = _dumps(_check_metrics({} if metrics is None else metrics))
        hw_json = _dumps(_check_mapping({} if hardware is None else hardware, "hardware"))
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
        return _to_trial(rows[0], self.path)

    def trials(self, campaign: str | None = None,
               status: str | Sequence[str] | None = None) -> list[Trial]:
        """Trials ordered by id, optionally of one campaign and/or with given status(es)."""
        where, params = self._filter(campaign)
        if status is not None:
            if not isinstance(status, (str, list, tuple, set, frozenset)):
                raise StoreError(f"status must be a status or a list of them, got {_show(status)}",
                                 hint=f"e.g. status='ok' or status=['ok', 'oom'] "
                                      f"(statuses: {', '.join(STATUSES)})")
            wanted = [status] if isinstance(status, str) else list(status)
            wanted = [_check_status(s, STATUSES) for s in wanted]
            where.append(f"status IN ({', '.join('?' * len(wanted))})")
            params.extend(wanted)
        sql = _SELECT_TRIAL + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY id"
        out = []
        for row in self._read(sql, params):
            try:
                out.append(_to_trial(row, self.path))
            except StoreError as err:  # one damaged row must not hide the others
                warnings.warn(f"{err.message}; it is left out (nothing was changed)",
                              stacklevel=2)
        return out

    def counts(self, campaign: str) -> dict[str, int]:
        """``{status: number of trials}`` of one campaign (statuses it has none of left out)."""
        where, params = self._filter(campaign)
        rows = self._read(f"SELECT status, COUNT(*) FROM trials WHERE {where[0]} GROUP BY status",
                          params)
        return {status: int(n) for status, n in rows}

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
        return tables.to_dataframe(self.trials(campaign))

    # ---------------------------------------------------------------- export / import
    def export(self, path: str | os.PathLike[str], campaign: str | None = None) -> Path:
        """Write the raw form of the trials (all, or one campaign's) to ``.csv`` or ``.parquet``.

        The file is written beside the target and renamed into place, so a failed export leaves
        no half-written file. Campaigns without trials are not exported.

        Returns:
            The path written.

        Raises:
            StoreError: On a suffix other than ``.csv``/``.parquet``, a folder, a path that
                cannot be written, the store's own file (under any spelling or link) or any
                other SQLite database: an export never overwrites a store.
        """
        own = [self.path, *(self.path.with_name(self.path.name + s) for s in ("-wal", "-shm"))]
        target, kind = tables.export_target(path, own)
        where, params = self._filter(campaign)
        rows = self._read(tables.RAW_SELECT + "".join(f" WHERE t.{w}" for w in where)
                          + " ORDER BY t.id", params)
        return tables.write_raw(target, kind, rows)

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

        Raises:
            StoreError: On a file that is not UTF-8 CSV or Parquet, a malformed row (the
                message names the row and column), or a campaign of another workload.
        """
        rows = tables.read_raw(path, None if campaign is None else _check_name(campaign))
        with self._write() as conn:
            for row in rows:
                self._insert_raw(conn, row, rows)
        return len(rows)

    def _insert_raw(self, conn: sqlite3.Connection, row: dict[str, Any],
                    rows: list[dict[str, Any]]) -> None:
        """Insert one validated raw row (creating its campaign if missing) in ``conn``'s
        transaction; a missing campaign gets the workload all its ``rows`` agree on."""
        name = row["campaign"]
        if conn.execute("SELECT 1 FROM campaigns WHERE name = ?", (name,)).fetchone() is None:
            same = {r["workload"] for r in rows if r["campaign"] == name}
            workload = row["campaign_workload"] or (same.pop() if len(same) == 1 else "")
            conn.execute("INSERT INTO campaigns VALUES (?, ?, ?, ?, ?)",
                         (name, row["campaign_space"], workload,
                          row["campaign_metadata"] or "{}", time.time()))
        self._campaign_workload(conn, name, row["workload"])  # checks, keeps the row's
        conn.execute(
            "INSERT INTO trials (campaign, config, status, metrics, hardware, workload, "
            "workload_version, created_at, started_at, ended_at, error) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (name, *(row[key] for key in ("config", "status", "metrics", "hardware", "workload",
                                          "workload_version", "created_at", "started_at",
                                          "ended_at", "error"))))
