"""How the library's records show themselves in Jupyter: one small HTML card style.

Each user-facing object (``Space``, ``TrialStore``, ``TrialResult``, ``Proposal``, ``Campaign``)
has a ``_repr_html_`` that Jupyter calls to render it. They all build the same card with
:func:`card`: a title line and a two-column table of facts, optionally followed by a small table
of rows. Values are HTML-escaped here, so a knob value or an error message can never inject
markup. Pure Python: importing this module costs nothing.

Example:
    >>> html = card("Space", [("size", "12 configurations")])
    >>> "<table" in html and "12 configurations" in html
    True
"""

from __future__ import annotations

import html as _html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["card", "fmt", "knobs", "rows_table"]

_STYLE = ("font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px; "
          "border: 1px solid var(--jp-border-color2, #ddd); border-radius: 4px; "
          "padding: 6px 10px; display: inline-block; max-width: 100%; overflow-x: auto")
_TD = "padding: 1px 8px 1px 0; text-align: left; vertical-align: top"


def fmt(value: Any) -> str:
    """A value as a short human string: numbers with thousands separators and 4 significant
    digits, booleans and None as words."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.4g}"
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def knobs(config: Mapping[str, Any], names: Sequence[str] | None = None) -> str:
    """A configuration as ``name=value, ...``: the knobs ``names`` names that ``config`` holds,
    in that order, or all of them in the configuration's own order."""
    return ", ".join(f"{n}={config[n]}" for n in (config if names is None else names)
                     if n in config)


def rows_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """An HTML table with a header row; cells are formatted with :func:`fmt` and escaped."""
    head = "".join(f"<th style='{_TD}'>{_html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td style='{_TD}'>{_html.escape(fmt(v))}</td>" for v in row) + "</tr>"
        for row in rows)
    return f"<table style='border-collapse: collapse'><tr>{head}</tr>{body}</table>"


def card(title: str, facts: Sequence[tuple[str, Any]] | Mapping[str, Any], *,
         table: tuple[Sequence[str], Iterable[Sequence[Any]]] | None = None,
         note: str | None = None) -> str:
    """A bordered card: bold title, a facts table (label, value), then optional rows and a note.

    Args:
        title: First line, e.g. ``"Campaign 'gpt-cpu'"``.
        facts: ``(label, value)`` pairs (or a mapping), shown as a two-column table.
        table: Optional ``(columns, rows)`` shown below the facts (see :func:`rows_table`).
        note: Optional grey line at the bottom (plain text).
    """
    items = facts.items() if isinstance(facts, Mapping) else facts
    rows = "".join(f"<tr><td style='{_TD}; color: var(--jp-ui-font-color2, #666)'>"
                   f"{_html.escape(str(k))}</td><td style='{_TD}'>{_html.escape(fmt(v))}</td></tr>"
                   for k, v in items)
    parts = [f"<div style='{_STYLE}'><b>{_html.escape(title)}</b>",
             f"<table style='border-collapse: collapse'>{rows}</table>"]
    if table is not None:
        parts.append(rows_table(*table))
    if note:
        parts.append(f"<div style='color: var(--jp-ui-font-color2, #666)'>"
                     f"{_html.escape(note)}</div>")
    return "".join(parts) + "</div>"
