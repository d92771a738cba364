"""The trial lifecycle in the store: adding, claiming, running, finishing and resetting trials.

:class:`TrialLifecycle` is the part of :class:`~cubicml_lab.store.TrialStore` that writes trials.
A trial moves ``pending -> running -> ok | oom | failed | timeout``; ``reset_trial`` takes an
interrupted ``running`` trial back to ``pending``; ``record_trial`` inserts a finished trial in one
step. Every input is validated before its ``BEGIN IMMEDIATE`` transaction starts, and each move
checks the trial's status inside the transaction, so of several processes making one move at once
exactly one succeeds. :class:`NoRoom` is what ``claim_trial`` raises when a campaign has no room.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

from ..errors import StoreError
from .campaigns import CampaignRecords
from .schema import (FINAL_STATUSES, _check_config, _check_error, _check_id, _check_mapping,
                     _check_metrics, _check_name, _check_status, _check_text, _check_time,
                     _column_json, _dumps, _show)

__all__ = ["NoRoom", "TrialLifecycle"]


class NoRoom(StoreError):
    """:meth:`~cubicml_lab.store.TrialStore.claim_trial` found no room: ``reason`` is
    ``"budget"`` (the campaign holds its budget of trials) or ``"busy"`` (the configuration is
    pending or running)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, hint="another process sharing the campaign took it; wait for "
                                       "its trials, or raise the budget")
        self.reason = reason


def _loads_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None



class TrialLifecycle(CampaignRecords):
    """Trials' writes, each one transaction (module doc)."""

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
