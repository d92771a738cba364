"""The store's one SQLite connection: each write one transaction, each read under the lock.

:class:`StoreConnection` is the base of :class:`~cubicml_lab.store.TrialStore`: one connection,
guarded by a re-entrant lock, serves every thread. :meth:`~StoreConnection._write` is one
``BEGIN IMMEDIATE`` transaction, committed on success and rolled back on any exception (an SQLite
error becomes a :class:`~cubicml_lab.errors.StoreError`); :meth:`~StoreConnection._read` runs one
query. ``TrialStore.__init__`` opens the file and sets the attributes named here.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import StoreError

__all__ = ["StoreConnection"]


class StoreConnection:
    """The connection, its lock and the store's file (set by ``TrialStore.__init__``)."""

    path: Path
    _lock: threading.RLock
    _conn: sqlite3.Connection | None

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
