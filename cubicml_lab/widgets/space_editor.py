"""`SpaceEditor`: build or edit a :class:`~cubicml_lab.Space` in a form; it shows the space's
size, a sample of configurations and the first error."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from .._html import rows_table
from ..errors import CubicMLError, SpaceError
from ..space import PARAM_TYPES, PowerOfTwo, Space
from ._common import _FONT, _GREY, _error_html, _guard, _text

if TYPE_CHECKING:
    pass


_KINDS = list(PARAM_TYPES)  # int, power_of_two, ordinal, choice, bool, float
_PLACEHOLDER = {"int": "low..high  (add ' log' for a log scale)", "power_of_two": "low..high",
                "ordinal": "values in order, e.g. 512, 768, 1024", "float": "low..high  (' log')",
                "choice": "values, e.g. fp32, bf16", "bool": "(False, True)"}


#: One comma-separated value: a double-quoted JSON string (may hold commas) or plain text.
_VALUE_RE = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[^,]+)\s*(?:,|$)')


def _scalar(text: str) -> Any:
    """A typed value from form text: JSON numbers, true/false and quoted strings, else the text."""
    text = text.strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (int, float, str, bool)) else text


def _value_text(v: Any) -> str:
    """Form text that :func:`_scalar` reads back as ``v`` (number-like strings are quoted)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v) if (_scalar(v) != v or "," in v) else v
    return repr(v)


def _number(text: str, name: str, what: str) -> int | float:
    for cast in (int, float):
        try:
            return cast(text.strip())
        except ValueError:
            pass
    raise SpaceError(f"parameter {name!r}: {what} {text.strip()!r} is not a number",
                     hint="write the range as low..high, e.g. 1..16")


def _param_dict(name: str, kind: str, text: str) -> dict[str, Any]:
    """A parameter description (``param_from_dict`` form) from one row of the editor."""
    name = name.strip()
    if kind == "bool":
        return {"type": kind, "name": name}
    if kind in ("ordinal", "choice"):
        values = [_scalar(t) for t in _VALUE_RE.findall(text) if t.strip()]
        return {"type": kind, "name": name, "values": values}
    body = text.strip()
    log = body.endswith(" log") or body == "log"
    body = body[:-3].strip() if log else body
    parts = body.split("..")
    if len(parts) != 2:
        raise SpaceError(f"parameter {name!r} ({kind}): range {text.strip()!r} is not low..high",
                         hint="e.g. 1..16" + ("" if kind == "power_of_two" else ", or 1..64 log"))
    low, high = (_number(t, name, w) for t, w in zip(parts, ("low", "high")))
    out: dict[str, Any] = {"type": kind, "name": name, "low": low, "high": high}
    if log:
        if kind == "power_of_two":
            raise SpaceError(f"parameter {name!r}: a power_of_two is always on a log scale",
                             hint="drop ' log'")
        out["log"] = True
    return out


def _row_text(d: Mapping[str, Any]) -> str:
    """The editor text of a parameter description (inverse of :func:`_param_dict`)."""
    if d["type"] == "bool":
        return ""
    if "values" in d:
        return ", ".join(_value_text(v) for v in d["values"])
    return f"{d['low']!r}..{d['high']!r}" + (" log" if d.get("log") else "")


def _assignments(text: str, what: str) -> dict[str, str]:
    """``name = text`` lines (blank lines and ``#`` comments skipped) as a dict."""
    out: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, eq, rhs = line.partition("=")
        if not eq or not name.strip() or not rhs.strip():
            raise SpaceError(f"{what} line {i} {line.strip()!r} is not 'name = value'",
                             hint=f"one {what} a line, e.g. " +
                                  ("dp = world_size // (tp * pp)" if what == "derived"
                                   else "world_size = 8"))
        out[name.strip()] = rhs.strip()
    return out


class ParameterRow:
    """One parameter row of a :class:`SpaceEditor`: ``name`` (Text), ``kind`` (Dropdown of the
    parameter types), ``values`` (Text) and a ``remove`` button; ``box`` holds them."""

    def __init__(self, name: str, kind: str, text: str, on_remove: Callable[[ParameterRow], None]):
        self.name = W.Text(value=name, placeholder="name", layout=W.Layout(width="150px"))
        self.kind = W.Dropdown(options=_KINDS, value=kind, layout=W.Layout(width="130px"))
        self.values = W.Text(value=text, layout=W.Layout(width="320px"))
        self.remove = W.Button(description="✕", tooltip="remove this parameter",
                               layout=W.Layout(width="36px"))
        self.remove.on_click(lambda _: on_remove(self))
        self.kind.observe(lambda _: self._kind_changed(), names="value")
        self._kind_changed()
        self.box = W.HBox([self.name, self.kind, self.values, self.remove])

    def _kind_changed(self) -> None:
        self.values.placeholder = _PLACEHOLDER[self.kind.value]
        self.values.disabled = self.kind.value == "bool"

    def to_dict(self) -> dict[str, Any]:
        """The row as a parameter description (``param_from_dict`` form)."""
        return _param_dict(self.name.value, self.kind.value, self.values.value)


class SpaceEditor(W.VBox):
    """Build or edit a :class:`~cubicml_lab.Space` in a form.

    One row per parameter (name, type, values: ``low..high`` for int, power_of_two and float,
    with `` log`` for a log scale; comma-separated values for ordinal and choice), and three text
    areas, one entry a line: constants (``name = value``), derived values (``name =
    expression``) and constraints. *apply* builds the space through ``Space.from_dict`` (the
    expressions go to the space's restricted evaluator, never ``eval``) and shows its size and a
    sample, or the first error with its hint, in red.

    Args:
        space: The space to start from; default one ``micro_batch`` parameter.
        sample_rows: Configurations shown in the sample table.

    Attributes:
        space: The last valid space (kept when a later apply fails).
        error: The error of the last apply, or None.
        rows: One :class:`ParameterRow` per parameter of the form.
    """

    def __init__(self, space: Space | None = None, *, sample_rows: int = 5) -> None:
        self.space: Space = space if space is not None else Space(
            [PowerOfTwo("micro_batch", 1, 16)])
        self.error: CubicMLError | None = None
        self.sample_rows = sample_rows
        self.rows: list[ParameterRow] = []
        area = {"layout": W.Layout(width="330px", height="84px")}
        self.constants = W.Textarea(placeholder="world_size = 8", **area)
        self.derived = W.Textarea(placeholder="dp = world_size // (tp * pp)", **area)
        self.constraints = W.Textarea(placeholder="world_size % (tp * pp) == 0", **area)
        self.add_button = W.Button(description="add parameter", icon="plus")
        self.apply_button = W.Button(description="apply", button_style="primary", icon="check")
        self.add_button.on_click(_guard(self.add_parameter, self._show_error))
        self.apply_button.on_click(_guard(self.apply, self._show_error))
        self.rows_box = W.VBox()
        self.status = W.HTML()
        self.sample = W.HTML()
        labels = [W.HTML(f"<b style='{_FONT}'>{t}</b>") for t in
                  ("constants", "derived values", "constraints")]
        texts = W.HBox([W.VBox([lab, t]) for lab, t in
                        zip(labels, (self.constants, self.derived, self.constraints))])
        super().__init__([W.HTML(f"<b style='{_FONT}'>parameters</b> (name, type, values)"),
                          self.rows_box, W.HBox([self.add_button, self.apply_button]), texts,
                          self.status, self.sample])
        self.add_class("cubicml-space-editor")
        self.load(self.space)

    # -- state -----------------------------------------------------------------------------------
    def load(self, space: Space) -> None:
        """Fill the form from ``space`` and apply it."""
        d = space.to_dict()
        self.rows = [self._row(p["name"], p["type"], _row_text(p)) for p in d["parameters"]]
        self.constants.value = "\n".join(f"{k} = {_value_text(v)}"
                                         for k, v in d["constants"].items())
        self.derived.value = "\n".join(f"{k} = {v}" for k, v in d["derived"].items())
        self.constraints.value = "\n".join(d["constraints"])
        self.apply()

    def _row(self, name: str, kind: str, text: str) -> ParameterRow:
        return ParameterRow(name, kind, text, on_remove=lambda r: self.remove_parameter(
            self.rows.index(r)))

    def add_parameter(self, name: str | None = None, kind: str = "int", values: str = "1..8"
                      ) -> None:
        """Append a parameter row (not applied until :meth:`apply`)."""
        if kind not in _KINDS:
            self._show_error(SpaceError(f"type {kind!r} is not a parameter type",
                                        hint=f"one of {', '.join(_KINDS)}"))
            return
        taken = {r.name.value for r in self.rows}
        name = name or next(f"x{i}" for i in range(1, len(taken) + 2) if f"x{i}" not in taken)
        self.rows.append(self._row(name, kind, "" if kind == "bool" else values))
        self._draw_rows()

    def remove_parameter(self, index: int) -> None:
        """Remove the parameter row at ``index`` (not applied until :meth:`apply`)."""
        del self.rows[index]
        self._draw_rows()

    def to_dict(self) -> dict[str, Any]:
        """The form as a space description (``Space.from_dict`` input).

        Raises:
            SpaceError: On a row or line that cannot be read.
        """
        return {"parameters": [r.to_dict() for r in self.rows],
                "constants": {k: _scalar(v) for k, v in
                              _assignments(self.constants.value, "constant").items()},
                "derived": _assignments(self.derived.value, "derived"),
                "constraints": [c.strip() for c in self.constraints.value.splitlines()
                                if c.strip() and not c.lstrip().startswith("#")]}

    def apply(self) -> Space | None:
        """Build the space from the form: on success it becomes :attr:`space`; on failure the
        error is shown (and kept in :attr:`error`) and :attr:`space` stays the last valid one.

        Returns:
            The new space, or None.
        """
        try:
            space = Space.from_dict(self.to_dict())
        except CubicMLError as err:
            self.error = err
        else:
            self.space, self.error = space, None
        self._draw()
        return self.space if self.error is None else None

    # -- drawing ---------------------------------------------------------------------------------
    def _draw_rows(self) -> None:
        self.rows_box.children = [r.box for r in self.rows]

    def _draw(self) -> None:
        self._draw_rows()
        space = self.space
        try:
            size = f"{space.size():,} valid configurations"
        except SpaceError:
            size = "continuous, or too large to count exactly"
        if self.error is not None:
            self.status.value = _error_html(self.error) + _text(
                f"(the last valid space is kept in .space: {size})", _GREY)
            return
        self.status.value = _text(f"✔ {size}", "font-weight: bold")
        try:
            sample = space.sample(min(self.sample_rows, space.size()), seed=0)
        except SpaceError:  # continuous or too large to count: a full sample
            sample = space.sample(self.sample_rows, seed=0)
        extra = [n for n in space.derived]
        rows = [[cfg[n] for n in space.names] + [space.resolve(cfg)[n] for n in extra]
                for cfg in sample]
        self.sample.value = (f"<div style='{_FONT}'><span style='{_GREY}'>a sample of "
                             f"{len(sample)}</span>{rows_table(space.names + extra, rows)}</div>")

    def _show_error(self, err: BaseException) -> None:
        self.status.value = _error_html(err)
