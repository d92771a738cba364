"""How a :class:`~cubicml_lab.space.Space` shows itself: ``repr``, ``str`` and a notebook card.

``str(space)`` is a plain-text table (size, then one line per parameter, constant, derived value
and constraint); ``_repr_html_`` is the same as a card in a notebook. A discrete parameter shows
its values, the first three and the last when there are more than eight; a Float its
``[low, high]``. The size is the count of valid configurations, or, where that cannot be counted,
"continuous" or the grid size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._params import Parameter
from .errors import SpaceError

__all__ = ["SpaceView", "parameter_rows"]


def parameter_rows(parameters: Sequence[Parameter]) -> list[list[Any]]:
    """``[name, type, values shown]`` for each parameter."""
    rows = []
    for p in parameters:
        d = p.to_dict()
        if p.is_discrete:
            vals = p.values()
            shown = ", ".join(map(str, vals)) if len(vals) <= 8 else \
                f"{', '.join(map(str, vals[:3]))}, …, {vals[-1]} ({len(vals):,} values)"
        else:
            shown = f"[{d.get('low')}, {d.get('high')}]"
        rows.append([p.name, p.kind, shown])
    return rows


class SpaceView:
    """The views of a space, mixed into :class:`~cubicml_lab.space.Space`, whose ``parameters``,
    ``constants``, ``derived``, ``constraints``, ``size()`` and ``_product_size()`` they read."""

    parameters: list[Parameter]
    constants: dict[str, Any]
    derived: dict[str, str]
    constraints: list[str]

    def __repr__(self) -> str:
        parts = ", ".join(repr(p) for p in self.parameters)
        return f"Space([{parts}], constants={self.constants}, derived={self.derived}, " \
               f"constraints={self.constraints})"

    def _size_text(self) -> str:
        try:
            return f"{self.size():,} valid configurations"  # type: ignore[attr-defined]
        except SpaceError:
            grid = self._product_size()  # type: ignore[attr-defined]
            return ("continuous (Float parameters)" if math.isinf(grid)
                    else f"a grid of {grid:,} points, constrained (too many to count)")

    def __str__(self) -> str:
        lines = [f"Space: {self._size_text()}"]
        lines += [f"  {n:<20} {k:<12} {v}" for n, k, v in parameter_rows(self.parameters)]
        lines += [f"  constant  {k} = {v}" for k, v in self.constants.items()]
        lines += [f"  derived   {k} = {v}" for k, v in self.derived.items()]
        lines += [f"  subject to {c}" for c in self.constraints]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from ._html import card

        facts: list[tuple[str, Any]] = [("size", self._size_text())]
        facts += [(f"constant {k}", v) for k, v in self.constants.items()]
        facts += [(f"derived {k}", f"= {v}") for k, v in self.derived.items()]
        facts += [("subject to", c) for c in self.constraints]
        return card("Space", facts, table=(["parameter", "type", "values"],
                                           parameter_rows(self.parameters)))
