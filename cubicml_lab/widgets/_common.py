"""What the widgets share: colours, fonts, small HTML pieces, a knob's input control, and a
button callback that shows an error instead of losing it."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from .._html import fmt
from ..errors import CubicMLError

if TYPE_CHECKING:
    from .._params import Parameter

_RED = "color: var(--jp-error-color1, #c62828)"
_GREY = "color: var(--jp-ui-font-color2, #666)"
_FONT = "font-size: 12px; font-family: var(--jp-ui-font-family, sans-serif)"


# -- shared drawing helpers --------------------------------------------------------------------
def _error_html(err: BaseException, prefix: str = "") -> str:
    """An error as red text: the message, then the hint (CubicMLError), never a traceback."""
    if isinstance(err, CubicMLError):
        text = html.escape(prefix + err.message)
        if err.hint:
            text += f"<br><i>hint: {html.escape(err.hint)}</i>"
    elif isinstance(err, KeyboardInterrupt):  # Kernel -> Interrupt: what it stopped, if said
        text = html.escape(prefix + (str(err) or "interrupted"))
    else:
        text = html.escape(f"{type(err).__name__}: {err}")
    return f"<div style='{_RED}; {_FONT}'>{text}</div>"


def _text(line: str, style: str = "") -> str:
    return f"<div style='{_FONT}; {style}'>{html.escape(line)}</div>"


#: Name endings that carry a unit (the library's metric names: ``step_time_s``, ...).
_SUFFIX_UNITS = (("_per_s", "/s"), ("_gib", "GiB"), ("_ms", "ms"), ("_s", "s"))


def _unit(objective: str, metric_names: Any = ()) -> str | None:
    """The objective's unit: a throughput's from the metrics beside it (``tokens_per_s`` ->
    ``tokens/s``), else its name's ending (``step_time_s`` -> ``s``); None when neither says.

    Example:
        >>> _unit("throughput", ["tokens_per_s"]), _unit("step_time_s"), _unit("loss")
        ('tokens/s', 's', None)
    """
    if objective == "throughput":
        for units in ("tokens", "samples"):
            if f"{units}_per_s" in metric_names:
                return f"{units}/s"
        return None
    for suffix, unit in _SUFFIX_UNITS:
        if objective.endswith(suffix) and len(objective) > len(suffix):
            stem = objective[:-len(suffix)]
            return f"{stem.rsplit('_', 1)[-1]}/s" if suffix == "_per_s" else unit
    return None


def _interval(lo: float | None, hi: float | None) -> str:
    return "" if lo is None or hi is None else f"{fmt(lo)} – {fmt(hi)}"


def _set_png(out: W.Output, fig: Any, dpi: int = 80) -> None:
    """Show ``fig`` in ``out`` as one PNG, replacing what was there (no flicker, no kernel needed:
    the Output's state is set directly, so it also reaches JupyterLab from a callback)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    png = base64.b64encode(buf.getvalue()).decode("ascii")
    out.outputs = ({"output_type": "display_data", "metadata": {},
                    "data": {"image/png": png, "text/plain": "<best-so-far figure>"}},)


def _knob_control(p: Parameter, value: Any, *, slider: bool) -> W.ValueWidget:
    """One input for a parameter: a checkbox for a bool, a dropdown for a choice, a slider over
    the values of an ordered parameter (``slider=True``) or a dropdown (``slider=False``), a
    float slider or box for a Float; an Int with many values gets an int slider or box."""
    desc = {"description": p.name, "style": {"description_width": "initial"}}
    if p.kind == "bool":
        return W.Checkbox(value=bool(value), indent=False, **desc)
    if not p.is_discrete:
        low, high, log = p.low, p.high, p.log  # type: ignore[attr-defined]
        if not slider:
            return W.BoundedFloatText(value=value, min=low, max=high, **desc)
        if log:
            return W.FloatLogSlider(value=value, base=10, min=math.log10(low),
                                    max=math.log10(high), continuous_update=False, **desc)
        return W.FloatSlider(value=value, min=low, max=high, step=(high - low) / 100 or 1.0,
                             continuous_update=False, **desc)
    values = p.values()
    if p.kind == "int" and len(values) > 64:
        cls = W.IntSlider if slider else W.BoundedIntText
        extra = {"continuous_update": False} if slider else {}
        return cls(value=value, min=values[0], max=values[-1], **extra, **desc)
    options = [(str(v), v) for v in values]
    if p.kind == "choice" or not slider:
        return W.Dropdown(options=options, value=value, **desc)
    return W.SelectionSlider(options=options, value=value, continuous_update=False, **desc)


def _guard(action: Callable[[], Any], show: Callable[[BaseException], None]
           ) -> Callable[[Any], None]:
    """A button callback running ``action``; an unexpected exception is shown, not lost, and
    so is Kernel -> Interrupt, which ends with the click (a callback has no cells after it to
    stop; raised on, it would only reach the server's log)."""
    def on_click(_: Any) -> None:
        try:
            action()
        except (Exception, KeyboardInterrupt) as err:  # a traceback would reach only the log
            show(err)
    return on_click
