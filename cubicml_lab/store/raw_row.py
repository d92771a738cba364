"""One row of an imported raw trial file, checked into the values the import inserts.

:func:`parse_row` reads a row of the raw form (a dict of column -> cell, as
:func:`~cubicml_lab.store.tables.read_raw` reads it from CSV or Parquet): every cell is checked
as the store checks its own inputs, and an error names the file, the row and the column. A row
that claims to be ``pending`` or ``running`` comes back ``pending``, without a process record or
start and end times (an interrupted trial, run again by its campaign).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import StoreError
from .schema import (STATUSES, _check_config, _check_mapping, _check_metrics, _check_name,
                     _check_status, _check_text, _check_time, _dumps, _show)

__all__ = ["parse_row"]


class _Cells:
    """One raw row's cells, read and checked; an error names the file, row and column."""

    def __init__(self, row: Mapping[str, Any], index: int, path: Path) -> None:
        self.row, self.index, self.path = row, index, path

    def cell(self, name: str) -> Any:
        value = self.row.get(name)
        if value is None or (isinstance(value, str) and not value) or (
                isinstance(value, float) and math.isnan(value)):
            return None
        if not isinstance(value, (str, int, float)):  # e.g. a Parquet list or bytes column
            raise self.fail(name, f"{_show(value)} is a {type(value).__name__}, not text or a "
                                  "number")
        return value

    def fail(self, name: str, problem: str) -> StoreError:
        return StoreError(f"{self.path} row {self.index}, column {name!r}: {problem}",
                          hint="fix the file; nothing was imported")

    def number(self, name: str, what: str = "finite unix seconds") -> float | None:
        value = self.cell(name)
        try:
            return _check_time(None if value is None else float(value), name)
        except (TypeError, ValueError, OverflowError, StoreError):
            raise self.fail(name, f"{_show(value)} is not {what}") from None

    def text(self, name: str) -> str | None:
        value = self.cell(name)
        return None if value is None else str(value)

    def json_text(self, name: str, check: Any, default: str | None) -> str | None:
        value = self.cell(name)
        if value is None:
            return default
        try:
            return _dumps(check(json.loads(str(value)), name))
        except (ValueError, StoreError) as err:
            raise self.fail(name, f"{err}") from None
        except RecursionError:
            raise self.fail(name, "the JSON nests too deeply") from None

    def checked(self, name: str, check: Any, *args: Any) -> Any:
        try:
            return check(*args)
        except StoreError as err:
            raise self.fail(name, err.message) from None


def parse_row(row: Mapping[str, Any], index: int, path: Path,
              target: str | None) -> dict[str, Any]:
    """Validate one raw row into insertable values; errors name the file, row and column."""
    cells = _Cells(row, index, path)
    number, text, json_text, checked = cells.number, cells.text, cells.json_text, cells.checked
    campaign = target or checked("campaign", _check_name, text("campaign"))
    status = checked("status", _check_status, text("status"), STATUSES)
    config = json_text("config", lambda value, _: _check_config(value), None)
    if config is None:
        raise cells.fail("config", "empty; a trial needs its config as JSON text")
    order, created_at = number("trial_id", "a trial id"), number("created_at")
    hardware = json_text("hardware", _check_mapping, "{}")
    started_at, ended_at = number("started_at"), number("ended_at")
    if status in ("pending", "running"):  # interrupted: run again, never a process to signal
        kept = {k: v for k, v in json.loads(hardware).items() if k != "process"}
        hardware = _dumps(kept)
        status, started_at, ended_at = "pending", None, None
    return {"order": index if order is None else order, "campaign": campaign, "status": status,
            "config": config,
            "metrics": json_text("metrics", lambda value, _: _check_metrics(value), "{}"),
            "hardware": hardware,
            "workload": checked("workload", _check_text, text("workload") or "", "workload"),
            "workload_version": checked("workload_version", _check_text,
                                        text("workload_version") or "", "workload_version"),
            "created_at": time.time() if created_at is None else created_at,
            "started_at": started_at, "ended_at": ended_at,
            "error": text("error"),
            "campaign_workload": text("campaign_workload") or "",
            "campaign_space": json_text("campaign_space", _check_mapping, None),
            "campaign_metadata": json_text("campaign_metadata", _check_mapping, None)}
