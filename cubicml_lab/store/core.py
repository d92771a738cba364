"""The :class:`TrialStore`: a store file opened, its trials read, and the SQL of export and import.

:class:`TrialStore` is built in layers, each the base class of the next:
:class:`~cubicml_lab.store.connection.StoreConnection` (the one connection, its lock, one
``BEGIN IMMEDIATE`` transaction per write), :class:`~cubicml_lab.store.campaigns.CampaignRecords`
(the ``campaigns`` table) and :class:`~cubicml_lab.store.lifecycle.TrialLifecycle` (the trials'
writes: ``pending -> running -> ok | oom | failed | timeout``). This module adds opening and
closing the file, how a store shows itself, the reads (trials, counts, the DataFrame) and the SQL
behind export and import; :mod:`cubicml_lab.store.tables` turns trials and rows into tables and
files and back (it never imports this module).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from . import tables
from .lifecycle import NoRoom, TrialLifecycle
from .schema import (STATUSES, _SELECT_TRIAL, Trial, _check_id, _check_name, _check_path,
                     _check_status, _open, _show, _to_trial)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NoRoom", "TrialStore"]


class TrialStore(TrialLifecycle):
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

    # ---------------------------------------------------------------- the file, and how it shows
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
