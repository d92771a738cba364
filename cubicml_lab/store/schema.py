"""What the trial store file holds: its tables and the checks of every value written to them.

One SQLite file holds two tables, ``campaigns`` and ``trials``; ``PRAGMA user_version`` records
:data:`SCHEMA_VERSION`. :func:`_open` connects, refuses a file that is not SQLite, belongs to
another application or has a newer schema (without touching it), switches to WAL and creates the
tables in a new file; several processes may do so at once (the checks and the creation are one
transaction, and every lock is waited for up to :data:`BUSY_TIMEOUT_S`).

Every value is checked before a write starts, so bad input never costs stored data: the
``_check_*`` functions validate the scalar columns (campaign name, trial id, status, times, text)
and the JSON columns. Config, metrics and hardware are stored as strict JSON text, never pickle:
config values must be finite JSON scalars; metrics, hardware, spaces and metadata become
strict-JSON-ready Python (numpy scalars made plain, non-finite floats as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``). Ints outside 64 bits, text that is not Unicode, nesting deeper
than 64 levels and bools among metrics are refused, each with a message naming the field.
:func:`_to_trial` reads a ``trials`` row back into a :class:`~cubicml_lab.trials.Trial`, restoring
those strings to floats. The statuses, the record and the codec are :mod:`cubicml_lab.trials`'.
"""

from __future__ import annotations

import json
import math
import operator
import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .._bounds import check_regular_or_absent
from ..errors import StoreError
from ..trials import FINISHED, STATUSES, Trial, dumps, json_safe, restore

#: Alias of :data:`cubicml_lab.trials.FINISHED` (the statuses a trial ends in), the store's
#: older name, kept for ``from cubicml_lab.store import FINAL_STATUSES``.
FINAL_STATUSES = FINISHED

#: Version of the SQLite schema, kept in ``PRAGMA user_version``.
SCHEMA_VERSION = 1
#: Seconds one process waits for another's lock (opening, switching to WAL, each write).
BUSY_TIMEOUT_S = 30.0

_SQLITE_MAGIC = b"SQLite format 3\x00"
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
#: JSON nesting deeper than this is refused (metrics, hardware, spaces, metadata).
_MAX_DEPTH = 64
#: Integers outside this range are refused: SQLite, pandas and Parquet hold 64 bits.
_INT64 = (-2**63, 2**63 - 1)
_T = TypeVar("_T")
#: Longest file name and path, in bytes (Linux's NAME_MAX and PATH_MAX; macOS's are smaller
#: paths, 1024, where the OS then refuses with a StoreError too).
_NAME_MAX, _PATH_MAX = 255, 4096


# -------------------------------------------------------------------- opening the file
def _open(path: Path) -> sqlite3.Connection:
    """Connect, refuse foreign or newer files without touching them, then set WAL and schema.

    Any number of processes may open (and create) one file at once: the version and tables
    are read in one snapshot, the WAL switch is retried while another process holds the file,
    and a new file gets its tables in one ``BEGIN IMMEDIATE`` transaction that checks them
    again, so no process sees a half-made store.
    """
    try:
        _refuse_foreign_file(path)
    except OSError as err:
        raise StoreError(f"cannot use {path} as a trial store: {err.strerror or err}",
                         hint="check the path and its folders' permissions") from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
    except (OSError, ValueError, sqlite3.Error) as err:
        raise StoreError(f"cannot open trial store {path}: {err}",
                         hint="check that the directory exists and is writable") from err
    try:
        version = _checked_version(conn, path)  # before the WAL switch: a foreign file is refused
        (mode,) = _patiently(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
        if mode.lower() != "wal":
            raise StoreError(f"cannot switch {path} to WAL journal mode (got {mode!r})",
                             hint="keep the store on a local filesystem")
        if version != SCHEMA_VERSION:
            _create_schema(conn, path)
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.DatabaseError as err:
        conn.close()
        raise StoreError(f"cannot use {path} as a trial store: {err}",
                         hint="pass the path of a cubicml-lab store, or a new file name; if "
                              "another process holds it, retry") from err
    except BaseException:
        conn.close()
        raise
    return conn


def _refuse_foreign_file(path: Path) -> None:
    """Refuse a folder, a FIFO or device (opening one could hang), or a file that is not SQLite,
    before SQLite touches it."""
    if path.is_dir():
        raise StoreError(f"trial store path {path} is a directory",
                         hint="pass a file path such as data/lab.sqlite")
    check_regular_or_absent(path, what="trial store", error=StoreError,
                            hint="pass a file path such as data/lab.sqlite (a FIFO or device "
                                 "is not a store)")
    if path.exists():
        try:
            with path.open("rb") as fh:
                head = fh.read(len(_SQLITE_MAGIC))
        except OSError as err:
            raise StoreError(f"cannot read trial store {path}: {err.strerror or err}",
                             hint="check the file's permissions") from err
        if head and head != _SQLITE_MAGIC:
            raise StoreError(f"{path} is not an SQLite file (it starts with {head[:8]!r})",
                             hint="pass the path of a cubicml-lab store, or a new file name")


def _checked_version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version, read with the table names in one snapshot and checked."""
    conn.execute("BEGIN")  # deferred: the first read (retried while busy) takes the snapshot
    try:
        version, tables = _schema_of(conn)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
    _check_schema(path, version, tables)
    return version


def _create_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Create the tables in one write transaction that checks the version again: of several
    processes creating one file, one creates the tables and the others find them whole."""
    _patiently(lambda: conn.execute("BEGIN IMMEDIATE"))
    try:
        version, tables = _schema_of(conn)
        _check_schema(path, version, tables)
        if version != SCHEMA_VERSION:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _schema_of(conn: sqlite3.Connection) -> tuple[int, set[str]]:
    """``(user_version, table names)``; read in the caller's transaction."""
    (version,) = _patiently(lambda: conn.execute("PRAGMA user_version").fetchone())
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return version, tables


def _check_schema(path: Path, version: int, tables: set[str]) -> None:
    """Refuse a newer schema, or an SQLite file of another application."""
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path} has store schema version {version}; this cubicml-lab "
                         f"reads version {SCHEMA_VERSION}",
                         hint="upgrade cubicml-lab (pip install -U cubicml-lab) to open it")
    if (version == 0 and tables) or (version and not {"campaigns", "trials"} <= tables):
        raise StoreError(f"{path} is an SQLite file but not a cubicml-lab trial store "
                         f"(user_version {version}, tables {sorted(tables)})",
                         hint="pass the path of a cubicml-lab store, or a new file name")


def _is_busy(err: sqlite3.Error) -> bool:
    """True for SQLITE_BUSY / SQLITE_LOCKED (another connection holds a lock)."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (and extended codes)
    return "locked" in str(err) or "busy" in str(err)


def _patiently(step: Callable[[], _T]) -> _T:
    """``step()``, retried with backoff for up to :data:`BUSY_TIMEOUT_S` while it finds the
    file busy: SQLite's own busy timeout does not cover every lock (e.g. the WAL switch)."""
    deadline, delay = time.monotonic() + BUSY_TIMEOUT_S, 0.001
    while True:
        try:
            return step()
        except sqlite3.OperationalError as err:
            if not _is_busy(err) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(2 * delay, 0.1)


# -------------------------------------------------------------------- validation and JSON
def _show(value: object, limit: int = 80) -> str:
    """``repr(value)`` shortened for a message; safe for any value (a huge int has no repr)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an int of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any repr may fail, e.g. one holding a 5000-digit int
        text = f"<a {type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _check_path(value: object, field: str) -> Path:
    """A file path given as ``str`` or ``os.PathLike``, with ``~`` expanded."""
    try:
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError
        path = Path(value).expanduser()
    except TypeError:
        raise StoreError(f"{field} must be a path (str or pathlib.Path), got {_show(value)}",
                         hint=f"e.g. {field}='data/lab.sqlite'") from None
    if "\x00" in str(path) or not str(value):
        raise StoreError(f"{field} = {_show(value)} is not a usable file path",
                         hint="pass a file name without NUL characters")
    try:
        encoded = [os.fsencode(part) for part in path.parts]
    except UnicodeError:
        raise StoreError(f"{field} = {_show(value)} cannot be written as a file name here",
                         hint="use a name in the file system's encoding (UTF-8)") from None
    longest = max(encoded, key=len, default=b"")
    if len(longest) > _NAME_MAX:
        raise StoreError(f"{field}: the name {_show(os.fsdecode(longest), 60)} is "
                         f"{len(longest)} bytes, more than the {_NAME_MAX} a file name may have",
                         hint="choose a shorter file or folder name")
    total = len(os.fsencode(str(path)))
    if total > _PATH_MAX:
        raise StoreError(f"{field} = {_show(value, 60)} is {total} bytes, more than the "
                         f"{_PATH_MAX} a path may have", hint="choose a shorter path")
    return path


def _check_unicode(text: str, where: str) -> str:
    """``text`` itself, if it can be stored as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise StoreError(f"{where} = {_show(text)} holds {text[err.start]!r} at position "
                         f"{err.start}, which is not Unicode text (a lone surrogate)",
                         hint="decode bytes with errors='replace', or drop that character"
                         ) from None
    return text


def _check_name(name: object) -> str:
    """A campaign name: a string with at least one non-space character."""
    if not isinstance(name, str) or not name.strip():
        raise StoreError(f"campaign name must be a non-empty string, got {_show(name)}",
                         hint="name the campaign, e.g. 'gpt-cpu'")
    return _check_unicode(name, "campaign name")


def _check_text(value: object, field: str) -> str:
    """A text column such as ``workload`` or ``workload_version`` (``""`` allowed)."""
    if not isinstance(value, str):
        raise StoreError(f"{field} must be a string, got {_show(value)}", hint=f'pass {field}=""')
    return _check_unicode(value, field)


def _check_error(error: object) -> str | None:
    """Error text of a trial; ``""`` becomes None. A lone surrogate (undecodable output of a
    trial process) is kept as its escape, ``\\udcff``: a failed trial is data, never refused."""
    if error is not None and not isinstance(error, str):
        raise StoreError(f"error must be a string or None, got {type(error).__name__}",
                         hint="pass str(exception) or a formatted traceback")
    return error.encode("utf-8", "backslashreplace").decode("utf-8") if error else None


def _check_id(trial_id: object) -> int:
    """A trial id: any int-like value except bool (numpy ints included), in SQLite's range."""
    try:
        if isinstance(trial_id, bool):
            raise TypeError
        value = operator.index(trial_id)  # type: ignore[arg-type]
        if not _INT64[0] <= value <= _INT64[1]:
            raise TypeError
        return value
    except TypeError:
        raise StoreError(f"trial id must be an int, got {_show(trial_id)}",
                         hint="use the id returned by add_trial") from None


def _check_status(status: object, allowed: tuple[str, ...]) -> str:
    """A status among ``allowed`` (a subset of :data:`STATUSES`)."""
    if not isinstance(status, str) or status not in allowed:
        raise StoreError(f"status {_show(status)} is not allowed here; allowed: "
                         f"{', '.join(allowed)}",
                         hint="pending/running trials go through add_trial and mark_running"
                         if status in STATUSES else f"pass one of {', '.join(allowed)}")
    return status


def _check_time(value: object, field: str) -> float | None:
    """Finite unix seconds as float, or None; bools and non-finite values are refused."""
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        seconds = float(value)  # OverflowError for a huge int
        if not math.isfinite(seconds):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise StoreError(f"{field} must be finite unix seconds or None, got {_show(value)}",
                         hint="use time.time()") from None
    return seconds


def _plain(value: Any, where: str, *, bools: bool = True, depth: int = 0) -> Any:
    """``value`` as strict-JSON-ready Python; non-finite floats become "NaN"/"Infinity" strings.

    Refused with a :class:`StoreError` naming ``where``: objects JSON cannot hold, ints outside
    64 bits, text that is not Unicode, nesting deeper than :data:`_MAX_DEPTH`, and bools unless
    ``bools``.
    """
    if value is None or isinstance(value, str):
        return value if value is None else _check_unicode(value, where)
    if isinstance(value, bool):
        if not bools:
            raise StoreError(f"{where} = {value} is a bool, not a number",
                             hint="store a measurement as a number (1.0 or 0.0); flags belong "
                                  "in hardware or the campaign's metadata")
        return value
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise StoreError(f"{where} = {_show(value)} is outside the 64-bit integer range "
                             "that SQLite, pandas and Parquet hold",
                             hint="store it as a float (float(x)) or as a string")
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else json_safe(value)  # the trials codec
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return _plain(value.item(), where, bools=bools, depth=depth)  # numpy scalars
    if isinstance(value, (Mapping, list, tuple)) and depth >= _MAX_DEPTH:
        shown = where if len(where) <= 60 else f"{where[:57]}..."
        raise StoreError(f"{shown} nests deeper than {_MAX_DEPTH} levels",
                         hint="flatten it, or store it as a file next to the store")
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise StoreError(f"{where}: key {_show(key)} is {type(key).__name__}, not str",
                                 hint="JSON object keys must be strings")
            _check_unicode(key, f"{where} key")
            out[key] = _plain(item, f"{where}[{key!r}]", bools=bools, depth=depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]", bools=bools, depth=depth + 1)
                for i, item in enumerate(value)]
    raise StoreError(f"{where} = {_show(value)} ({type(value).__name__}) is not "
                     "JSON-serialisable", hint="store numbers, strings, bools, None, lists and "
                     "dicts (convert arrays with .tolist())")


def _check_mapping(value: object, where: str, *, bools: bool = True) -> dict[str, Any]:
    """A dict with str keys (metrics, hardware, space, metadata) made strict-JSON-ready."""
    if not isinstance(value, Mapping):
        raise StoreError(f"{where} must be a dict, got {type(value).__name__}",
                         hint=f"pass {where} as a dict of name -> value")
    return _plain(value, where, bools=bools)


def _check_metrics(value: object) -> dict[str, Any]:
    """Metrics: a dict of name -> number (NaN and infinities kept), or lists and dicts of
    numbers (e.g. a loss curve); bools are refused, since a searcher reads numbers only."""
    return _check_mapping(value, "metrics", bools=False)


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
            raise StoreError(f"config[{_show(key)}] = {_show(value)} ({type(value).__name__}) "
                             "is not a finite JSON scalar", hint="config values are int, float, "
                             "str, bool or None; put lists and nested values in metadata")
    return _plain(config, "config")


#: Compact strict JSON text: the trials' codec (:func:`cubicml_lab.trials.dumps`).
_dumps = dumps


#: Selects a ``trials`` row in the column order :func:`_to_trial` reads.
_SELECT_TRIAL = ("SELECT id, campaign, config, status, metrics, hardware, workload, "
                 "workload_version, created_at, started_at, ended_at, error FROM trials")


def _column_json(path: object, table: str, row_id: object, column: str, text: object) -> Any:
    """A stored JSON column read back; text that is not JSON (a store edited by hand, a
    damaged file) raises a StoreError naming the table, the row and the column."""
    try:
        if not isinstance(text, (str, bytes)):
            raise ValueError(f"a {type(text).__name__}, not JSON text")
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise StoreError(f"{path}: table {table!r}, row {_show(row_id)}, column {column!r} "
                         f"does not hold valid JSON ({_show(str(err), 60)})",
                         hint="the file was changed outside cubicml-lab; fix or delete that "
                              "row with sqlite3 (the other rows are readable)") from None


def _to_trial(row: tuple[Any, ...], path: object = "trial store") -> Trial:
    """A ``trials`` row (columns of :data:`_SELECT_TRIAL`) as a :class:`Trial`; a column that
    is not JSON raises a StoreError naming it (:func:`_column_json`)."""
    (id_, campaign, config, status, metrics, hardware, workload, version, created_at,
     started_at, ended_at, error) = row

    def column(name: str, text: object) -> Any:
        return _column_json(path, "trials", id_, name, text)

    values = {name: column(name, text) for name, text in
              (("config", config), ("metrics", metrics), ("hardware", hardware))}
    for name, value in values.items():
        if not isinstance(value, dict):
            raise StoreError(f"{path}: table 'trials', row {id_}, column {name!r} holds a "
                             f"{type(value).__name__}, not a JSON object",
                             hint="the file was changed outside cubicml-lab; fix or delete "
                                  "that row with sqlite3 (the other rows are readable)")
    return Trial(campaign=campaign, id=id_, config=values["config"], status=status,
                 metrics=restore(values["metrics"]), hardware=restore(values["hardware"]),
                 workload=workload, workload_version=version, created_at=created_at,
                 started_at=started_at, ended_at=ended_at, error=error)

