"""Campaigns in the store: creating one, its metadata and info, and the checks writes need.

:class:`CampaignRecords` is the part of :class:`~cubicml_lab.store.TrialStore` that reads and
writes the ``campaigns`` table: :meth:`~CampaignRecords.create_campaign` (reusing an existing
campaign of the same workload, never overwriting what is stored),
:meth:`~CampaignRecords.update_campaign_metadata`, :meth:`~CampaignRecords.campaigns`,
:meth:`~CampaignRecords.campaign_info`, and the workload a new trial of a campaign gets.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from .connection import StoreConnection
from .schema import _check_mapping, _check_name, _check_text, _column_json, _dumps

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["CampaignRecords"]


class CampaignRecords(StoreConnection):
    """Campaigns: name, search space, workload and metadata (module doc)."""

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
