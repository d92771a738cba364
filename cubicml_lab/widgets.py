"""Jupyter views of a space, a campaign and a predictor, as ipywidgets 8 boxes.

Each widget is an ``ipywidgets.VBox``: a cell's last line or ``display(w)`` renders it, and it
nests in other boxes. Every number it shows comes from the library; the widgets only wire it.

=====================  ==========================================================================
widget                 shows and does
=====================  ==========================================================================
SpaceEditor            a form that builds a :class:`~cubicml_lab.Space`: size, a sample, the error
CampaignDashboard      a campaign live: counts, best against the reference, figure, latest trials,
                       the proposals waiting or running with what the searcher expects of them
ProposalReview         the next proposal(s) with prediction, interval, P(fits) and why: accept and
                       run, skip (never proposed again), or edit the knobs and run that instead
PredictorExplorer      one control per knob -> predicted objective, 95% interval and P(fits)
=====================  ==========================================================================

State and drawing are kept apart: each state change is a plain method (``editor.apply()``,
``dashboard.refresh()``, ``review.accept()``, ``explorer.set_config(...)``) that the buttons call,
and the ``_draw*`` methods only read what those methods leave. A method that fails on a person's
input (a bad constraint, an edited configuration outside the space) keeps the error in ``.error``
and shows its message and hint in red instead of raising: in a button callback a traceback would
go to JupyterLab's log console, where nobody sees it.

While ``campaign.run()`` blocks the kernel, the updates a dashboard sends on each campaign event
(:meth:`~cubicml_lab.campaign.Campaign.observe`) still reach JupyterLab, but button clicks wait
until the cell finishes. A dashboard of a campaign that runs in another process reads the store on
its refresh button, or every ``refresh_s`` seconds from a background thread.

Example:
    >>> import cubicml_lab as cml
    >>> editor = cml.widgets.SpaceEditor(cml.Space([cml.PowerOfTwo("micro_batch", 1, 8)]))
    >>> editor.space.size(), editor.error is None
    (4, True)
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from ._html import fmt, rows_table
from .campaign import Campaign, format_trial
from .errors import ConfigError, CubicMLError, SearchError, SpaceError
from .measure import TrialResult
from .space import PARAM_TYPES, PowerOfTwo, Space
from .store import FINAL_STATUSES, Trial, TrialStore

if TYPE_CHECKING:
    from ._params import Parameter
    from .search import Proposal

__all__ = ["CampaignDashboard", "PredictorExplorer", "ProposalReview", "SpaceEditor"]

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
    else:
        text = html.escape(f"{type(err).__name__}: {err}")
    return f"<div style='{_RED}; {_FONT}'>{text}</div>"


def _text(line: str, style: str = "") -> str:
    return f"<div style='{_FONT}; {style}'>{html.escape(line)}</div>"


def _knobs(config: Mapping[str, Any], names: list[str]) -> str:
    return ", ".join(f"{n}={config[n]}" for n in names if n in config)


def _unit(objective: str, metric_names: Any) -> str | None:
    """The objective's unit when it is a throughput whose units the metrics name."""
    if objective != "throughput":
        return None
    for units in ("tokens", "samples"):
        if f"{units}_per_s" in metric_names:
            return f"{units}/s"
    return None


def _interval(lo: float | None, hi: float | None) -> str:
    return "" if lo is None or hi is None else f"{fmt(lo)} – {fmt(hi)}"


def _set_png(out: W.Output, fig: Any, dpi: int = 80) -> None:
    """Show ``fig`` in ``out`` as one PNG, replacing what was there (no flicker, no kernel needed:
    the Output's state is set directly, so it also reaches JupyterLab from a callback)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
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
    """A button callback running ``action``; an unexpected exception is shown, not lost."""
    def on_click(_: Any) -> None:
        try:
            action()
        except Exception as err:  # in a callback a traceback would only reach the log console
            show(err)
    return on_click


# -- SpaceEditor -------------------------------------------------------------------------------
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


# -- CampaignDashboard -------------------------------------------------------------------------
class CampaignDashboard(W.VBox):
    """A campaign as it runs: trial counts, best against the reference, best-so-far figure, the
    latest trials, and the proposals waiting or running with their predictions.

    It observes the campaign (:meth:`~cubicml_lab.campaign.Campaign.observe`), so it updates while
    ``campaign.run()`` or a :class:`ProposalReview` runs trials in this kernel. For a campaign
    read back with :meth:`~cubicml_lab.campaign.Campaign.from_store` (e.g. one running in another
    process) the *refresh* button, or ``refresh_s``, re-reads the store.

    Args:
        campaign: The campaign to show.
        refresh_s: Re-read the store every this many seconds from a background thread (None:
            only on campaign events and the refresh button); :meth:`stop` ends it.
        n_trials: Latest trials shown in the table.

    Attributes:
        summary: ``campaign.summary()`` at the last refresh.
        trials: The campaign's trials at the last refresh.
        error: The error of the last refresh, or None.
    """

    def __init__(self, campaign: Campaign, *, refresh_s: float | None = None,
                 n_trials: int = 8) -> None:
        from matplotlib.figure import Figure

        self.campaign = campaign
        self.n_trials = n_trials
        self.refresh_s = refresh_s
        self.summary: dict[str, Any] = {}
        self.trials: list[Trial] = []
        self.error: BaseException | None = None
        self._recent: list[Proposal] = []  # proposals seen, newest last (to name a started trial)
        self._running: dict[int, Proposal | None] = {}
        self._ran: dict[int, Proposal] = {}  # trial id -> the proposal it ran, for "predicted"
        self._figure_key: tuple | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        # one Figure outside pyplot, redrawn in place: nothing to close, nothing shown twice
        self._fig = Figure(figsize=(5.6, 3.3))
        self._ax = self._fig.subplots()
        s = campaign.searcher
        self.title = W.HTML(
            f"<b style='{_FONT}'>Campaign '{html.escape(campaign.name)}'</b>"
            f"<span style='{_FONT}; {_GREY}'> · {html.escape(campaign.workload.name)} · "
            f"{html.escape(campaign.objective)} ({getattr(s, 'direction', 'maximize')}) · "
            f"{html.escape(type(s).__name__)} · {html.escape(str(campaign.store.path))}</span>")
        self.status = W.HTML()
        self.figure = W.Output(layout=W.Layout(min_height="270px"))
        self.latest = W.HTML()
        self.proposals = W.HTML()
        self.updated = W.HTML()
        self.refresh_button = W.Button(description="refresh", icon="refresh",
                                       tooltip="re-read the store")
        self.refresh_button.on_click(_guard(self.refresh, self._show_error))
        super().__init__([self.title, self.status,
                          W.HBox([self.figure, W.VBox([self.latest, self.proposals])],
                                 layout=W.Layout(flex_flow="row wrap")),
                          W.HBox([self.refresh_button, self.updated])])
        self.add_class("cubicml-dashboard")
        campaign.observe(self._on_event)
        self.refresh()
        if refresh_s:
            self.start(refresh_s)

    @classmethod
    def from_store(cls, store: TrialStore, name: str, *, refresh_s: float | None = None,
                   **kwargs: Any) -> CampaignDashboard:
        """A dashboard of a stored campaign (e.g. running in another process): see
        :meth:`Campaign.from_store`; ``kwargs`` go there."""
        return cls(Campaign.from_store(store, name, **kwargs), refresh_s=refresh_s)

    # -- state -----------------------------------------------------------------------------------
    def refresh(self, *, redraw: bool = False) -> None:
        """Re-read the campaign's trials and summary from the store and redraw; the figure only
        when a trial finished since the last draw, or with ``redraw=True``."""
        with self._lock:
            t0 = time.perf_counter()
            try:
                self.trials = self.campaign.trials()
                self.summary = self.campaign.summary()
                self.error = None
            except Exception as err:  # a closed or locked store: say so, keep the last view
                self.error = err
                self._show_error(err)
                return
            running = {t.id for t in self.trials if t.status == "running"}
            self._running = {i: p for i, p in self._running.items() if i in running}
            key = tuple((t.id, t.status) for t in self.trials if t.status in FINAL_STATUSES)
            if redraw or key != self._figure_key:
                self._draw_figure()
                self._figure_key = key
            self._draw()
            self.updated.value = _text(
                f"read {len(self.trials)} trials at {time.strftime('%H:%M:%S')} "
                f"({time.perf_counter() - t0:.2f} s)", _GREY)

    def _on_event(self, event: str, payload: Any) -> None:
        """Campaign events: remember proposals, follow running trials, refresh on a finish."""
        if self._closed:
            return
        with self._lock:
            if event == "proposed":
                self._recent = (self._recent + list(payload))[-64:]
            elif event == "started":
                self._running[payload] = self._proposal_of(payload)
                self.refresh()
                return
            elif event == "finished":
                p = self._running.pop(payload.id, None)
                if p is not None:
                    self._ran[payload.id] = p
                self.refresh()
                return
            elif event == "stopped":
                self.refresh()
                return
            self._draw()

    def _proposal_of(self, trial_id: int) -> Proposal | None:
        """The proposal a started trial runs: the one resuming it, else the newest with its
        configuration (None for a configuration edited by hand)."""
        for p in reversed(self._recent):
            if p.trial_id == trial_id:
                return p
        space = self.campaign.space
        try:
            key = space.key(self.campaign.store.get_trial(trial_id).config)
        except CubicMLError:
            return None
        return next((p for p in reversed(self._recent) if space.key(p.config) == key), None)

    def start(self, refresh_s: float | None = None) -> None:
        """Re-read the store every ``refresh_s`` seconds from a background thread."""
        self.stop()
        self.refresh_s = refresh_s or self.refresh_s or 5.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(self._stop,), daemon=True,
                                        name=f"dashboard-{self.campaign.name}")
        self._thread.start()

    def _poll(self, stop: threading.Event) -> None:
        while not stop.wait(self.refresh_s):
            self.refresh()

    def stop(self) -> None:
        """End the periodic refresh (if any)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def close(self) -> None:
        """Stop refreshing, ignore the campaign's events from now on, and close the widget."""
        self._closed = True
        self.stop()
        super().close()

    # -- drawing ---------------------------------------------------------------------------------
    def _unit(self) -> str | None:
        names = {k for t in self.trials for k in t.metrics}
        return _unit(self.campaign.objective, names)

    def _draw(self) -> None:
        self._draw_status()
        self._draw_latest()
        self._draw_proposals()

    def _draw_status(self) -> None:
        s, unit = self.summary, self._unit()
        counts = ", ".join(f"{n} {st}" for st, n in s.get("by_status", {}).items())
        n = s.get("trials", 0)
        parts = [f"{n} trial{'' if n == 1 else 's'}" + (f": {counts}" if counts else "")]
        if s.get("best") is not None:
            parts.append(f"best {fmt(s['best'])} {unit or self.campaign.objective} "
                         f"({_knobs(s['best_config'], self.campaign.space.names)})")
        if s.get("reference") is not None:
            parts.append(f"reference {fmt(s['reference'])}")
        if s.get("speedup") is not None:
            parts.append(f"{s['speedup']:.2f}× the reference")
        if s.get("stop_reason"):
            parts.append(f"stopped: {s['stop_reason']}")
        self.status.value = _text(" · ".join(parts), "font-weight: bold")

    def _draw_figure(self) -> None:
        from .plots import plot_best_so_far

        if not any(t.status in FINAL_STATUSES for t in self.trials):
            self.figure.outputs = ()
            return
        df = self.campaign.dataframe()
        df = df[df["status"].isin(FINAL_STATUSES)]
        self._ax.clear()
        plot_best_so_far(df, self.campaign.objective,
                         getattr(self.campaign.searcher, "direction", "maximize"),
                         reference=self.summary.get("reference"), unit=self._unit(), ax=self._ax)
        self._fig.tight_layout()
        _set_png(self.figure, self._fig)

    def _draw_latest(self) -> None:
        names, obj = self.campaign.space.names, self.campaign.objective
        latest = self.trials[-self.n_trials:][::-1]
        if not latest:
            self.latest.value = _text("no trials yet", _GREY)
            return
        rows = []
        for t in latest:
            p = self._ran.get(t.id) or self._running.get(t.id)
            predicted = "" if p is None or p.predicted is None else fmt(p.predicted)
            note = (t.error or "").strip().splitlines()[-1][:60] if t.error else ""
            rows.append([t.id, t.status, *(t.config.get(n) for n in names),
                         t.metrics.get(obj, ""), predicted,
                         t.metrics.get("step_time_s", ""), note])
        columns = ["id", "status", *names, obj, "predicted", "step_time_s", "note"]
        self.latest.value = (f"<div style='{_FONT}'><b>latest trials</b>"
                             f"{rows_table(columns, rows)}</div>")

    def _draw_proposals(self) -> None:
        names = self.campaign.space.names
        shown: list[tuple[str, Mapping[str, Any], Proposal | None]] = [
            (f"running #{t.id}", t.config, self._running.get(t.id))
            for t in self.trials if t.status == "running"]
        shown += [("waiting", p.config, p) for p in self.campaign.proposals]
        if not shown:
            self.proposals.value = _text("no proposal waiting or running", _GREY)
            return
        rows = [[state, *(cfg.get(n) for n in names),
                 "" if p is None or p.predicted is None else fmt(p.predicted),
                 "" if p is None else _interval(p.lower, p.upper),
                 "" if p is None or p.p_feasible is None else f"{p.p_feasible:.2f}",
                 "" if p is None else p.phase, "" if p is None else p.reason]
                for state, cfg, p in shown]
        columns = ["", *names, "predicted", "95% interval", "P(fits)", "phase", "why"]
        self.proposals.value = (f"<div style='{_FONT}'><b>proposals</b>"
                                f"{rows_table(columns, rows)}</div>")

    def _show_error(self, err: BaseException) -> None:
        self.updated.value = _error_html(err)


# -- ProposalReview ----------------------------------------------------------------------------
class ProposalReview(W.VBox):
    """Review the next proposal(s) of a campaign before anything runs.

    Shows each proposal with the searcher's prediction, its 95% interval, P(fits), the log
    acquisition value and why it was picked. *accept & run* launches it
    (:meth:`Campaign.launch`, blocking), shows the trial's result line and proposes the next;
    *skip* drops it for good (:meth:`Campaign.skip`, kept in the store); *edit* shows one input
    per knob, prefilled, and *run edited* launches the edited configuration instead. A
    :class:`CampaignDashboard` of the same campaign updates as these trials run.

    Args:
        campaign: The campaign to steer.
        n: Proposals shown at once (a picker selects the one the buttons act on).

    Attributes:
        proposals: The proposals shown, waiting in the campaign.
        selected: Index of the proposal the buttons act on.
        editing: Whether the knob inputs are shown.
        controls: Knob name -> input widget of the edit form.
        results: One line per trial run from this widget, newest last.
        last_trial: The last trial run from this widget, or None.
        error: The error of the last action, or None.
    """

    def __init__(self, campaign: Campaign, n: int = 1) -> None:
        self.campaign = campaign
        self.n = n
        self.proposals: list[Proposal] = []
        self.selected = 0
        self.editing = False
        self.controls: dict[str, W.ValueWidget] = {}
        self.results: list[str] = []
        self.last_trial: Trial | None = None
        self.error: BaseException | None = None
        self._busy = ""
        self.table = W.HTML()
        self.picker = W.ToggleButtons(options=[], layout=W.Layout(display="none"))
        self._drawing = False
        self.picker.observe(self._picked, names="value")
        self.accept_button = W.Button(description="accept & run", button_style="success",
                                      icon="play")
        self.skip_button = W.Button(description="skip", icon="times",
                                    tooltip="never propose this configuration again")
        self.edit_button = W.Button(description="edit", icon="edit")
        self.run_edited_button = W.Button(description="run edited", button_style="warning",
                                          icon="play")
        self.cancel_button = W.Button(description="cancel edit")
        for button, action in ((self.accept_button, self.accept), (self.skip_button, self.skip),
                               (self.edit_button, self.edit),
                               (self.run_edited_button, self.run_edited),
                               (self.cancel_button, self.cancel_edit)):
            button.on_click(_guard(action, self._fail))
        self.form = W.VBox()
        self.form_check = W.HTML()
        self.edit_box = W.VBox([self.form, self.form_check,
                                W.HBox([self.run_edited_button, self.cancel_button])])
        self.message = W.HTML()
        self.results_html = W.HTML()
        super().__init__([W.HTML(f"<b style='{_FONT}'>next proposal · campaign "
                                 f"'{html.escape(campaign.name)}'</b>"),
                          self.picker, self.table,
                          W.HBox([self.accept_button, self.skip_button, self.edit_button]),
                          self.edit_box, self.message, self.results_html])
        self.add_class("cubicml-proposal-review")
        self.propose()

    # -- state -----------------------------------------------------------------------------------
    def propose(self) -> list[Proposal]:
        """Fill up to ``n`` proposals: the ones still waiting in the campaign first, then new
        ones from ``campaign.propose`` (an exhausted search is shown, not raised)."""
        waiting = [p for p in self.proposals if any(p is q for q in self.campaign.proposals)]
        waiting += [q for q in self.campaign.proposals
                    if not any(q is p for p in waiting)][:max(self.n - len(waiting), 0)]
        if len(waiting) < self.n:
            try:
                waiting += self.campaign.propose(self.n - len(waiting))
            except CubicMLError as err:
                self.error = err
        self.proposals = waiting
        self.selected = min(self.selected, max(len(waiting) - 1, 0))
        self._draw()
        return list(waiting)

    def select(self, index: int) -> None:
        """Make the proposal at ``index`` the one the buttons act on."""
        if 0 <= index < len(self.proposals) and index != self.selected:
            self.selected = index
            if self.editing:
                self.edit(index)
            self._draw()

    def _picked(self, change: dict[str, Any]) -> None:
        if not self._drawing and change["new"] is not None:
            self.select(change["new"])

    def _pick(self, index: int | None) -> Proposal | None:
        i = self.selected if index is None else index
        if not 0 <= i < len(self.proposals):
            self.error = SearchError(f"no proposal #{i + 1} to act on",
                                    hint="the search may be exhausted; widen the space")
            self._draw()
            return None
        self.selected = i
        return self.proposals[i]

    def accept(self, index: int | None = None) -> Trial | None:
        """Run the selected proposal now (blocking), then propose the next.

        Returns:
            The stored trial, or None (interrupted, or an error shown in the widget).
        """
        p = self._pick(index)
        return None if p is None else self._launch(p, None)

    def skip(self, index: int | None = None) -> None:
        """Never run the selected proposal (kept in the store), then propose the next."""
        p = self._pick(index)
        if p is None:
            return
        self.error = None
        try:
            self.campaign.skip(p)
        except CubicMLError as err:
            self.error = err
            self._draw()
            return
        self.results.append(f"skipped   {_knobs(p.config, self.campaign.space.names)}")
        self._drop(p)
        self.propose()

    def edit(self, index: int | None = None) -> None:
        """Show one input per knob, prefilled with the selected proposal's configuration."""
        p = self._pick(index)
        if p is None:
            return
        self.controls = {q.name: _knob_control(q, p.config[q.name], slider=False)
                         for q in self.campaign.space.parameters}
        for c in self.controls.values():
            c.observe(lambda _: self._draw_check(), names="value")
        self.editing = True
        self._draw()

    def cancel_edit(self) -> None:
        """Hide the knob inputs."""
        self.editing = False
        self._draw()

    def edited_config(self) -> dict[str, Any]:
        """The configuration in the knob inputs."""
        return {name: c.value for name, c in self.controls.items()}

    def run_edited(self, config: Mapping[str, Any] | None = None) -> Trial | None:
        """Run ``config`` (default: the knob inputs) in place of the selected proposal.

        Returns:
            The stored trial, or None (interrupted, or an error, e.g. a configuration outside
            the space, shown in the widget).
        """
        p = self._pick(None)
        if p is None:
            return None
        config = dict(config) if config is not None else self.edited_config()
        if p.trial_id is not None and config != p.config:
            # Proposal.with_config keeps trial_id: the edit would run under the interrupted
            # trial's record (its stored config); refuse until that is fixed in the campaign
            self.error = ConfigError(
                f"proposal #{self.selected + 1} resumes interrupted trial {p.trial_id}, which "
                "runs with its stored configuration", hint="accept it as it is, or skip it and "
                "run the edited configuration with campaign.launch(config)")
            self._draw()
            return None
        return self._launch(p, config)

    def _launch(self, p: Proposal, config: dict[str, Any] | None) -> Trial | None:
        names = self.campaign.space.names
        self.error = None
        self._busy = (f"running {_knobs(config or p.config, names)} … (the kernel is busy until "
                      "the trial ends)")
        self._draw()
        try:
            trial = self.campaign.launch(p, config=config, verbose=False)
        except CubicMLError as err:
            self.error = err
            return None
        finally:
            self._busy = ""
            self._draw()
        if trial is None:
            self.results.append("interrupted: the trial was re-queued and is proposed first")
        else:
            self.last_trial = trial
            result = TrialResult(status=trial.status, metrics=trial.metrics,
                                 hardware=trial.hardware, error=trial.error)
            self.results.append(format_trial(trial.id, self.campaign.space, trial.config,
                                             result, self.campaign.objective))
        self._drop(p)
        self.editing = False
        self.propose()
        return trial

    def _drop(self, p: Proposal) -> None:
        self.proposals = [q for q in self.proposals if q is not p]

    def _fail(self, err: BaseException) -> None:
        self.error, self._busy = err, ""
        self._draw()

    # -- drawing ---------------------------------------------------------------------------------
    def _draw(self) -> None:
        names = self.campaign.space.names
        rows = []
        for i, p in enumerate(self.proposals):
            rows.append(["▶" if i == self.selected else "", i + 1,
                         *(p.config[n] for n in names),
                         "" if p.predicted is None else fmt(p.predicted),
                         _interval(p.lower, p.upper),
                         "" if p.p_feasible is None else f"{p.p_feasible:.2f}",
                         "" if p.acquisition is None else f"{p.acquisition:.3g}",
                         p.phase, p.reason])
        columns = ["", "#", *names, f"predicted {self.campaign.objective}",
                   "95% interval", "P(fits)", "log acq.", "phase", "why"]
        self.table.value = (f"<div style='{_FONT}'>{rows_table(columns, rows)}</div>" if rows
                            else _text("no proposal", _GREY))
        labels = [(f"#{i + 1}", i) for i in range(len(self.proposals))]
        self._drawing = True
        try:
            if list(self.picker.options) != labels:
                self.picker.options = labels
            self.picker.value = self.selected if self.proposals else None
        finally:
            self._drawing = False
        self.picker.layout.display = "flex" if len(self.proposals) > 1 else "none"
        idle = not self._busy and bool(self.proposals)
        for b in (self.accept_button, self.skip_button, self.edit_button,
                  self.run_edited_button, self.cancel_button):
            b.disabled = not idle
        self.edit_box.layout.display = "flex" if self.editing else "none"
        self.form.children = list(self.controls.values()) if self.editing else []
        if self.editing:
            self._draw_check()
        self.message.value = (_text(self._busy, "font-style: italic") if self._busy else
                              _error_html(self.error) if self.error is not None else "")
        self.results_html.value = "".join(
            f"<div style='font-family: var(--jp-code-font-family, monospace); font-size: 12px'>"
            f"{html.escape(line)}</div>" for line in self.results[-5:])

    def _draw_check(self) -> None:
        try:
            self.campaign.space.validate(self.edited_config())
        except SpaceError as err:
            self.form_check.value = _error_html(err)
        else:
            self.form_check.value = _text("✔ a configuration of the space", _GREY)


# -- PredictorExplorer -------------------------------------------------------------------------
class PredictorExplorer(W.VBox):
    """One control per knob -> the predictor's objective, 95% interval and P(fits).

    Ordered parameters get a slider over their values, choices a dropdown, bools a checkbox,
    floats a float slider. A combination outside the space shows the constraint it breaks
    instead of a number.

    Args:
        predictor: A fitted predictor with ``predict`` and ``predict_interval`` (e.g.
            :class:`~cubicml_lab.surrogate.GPPredictor`).
        space: The space of its configurations.
        reference: A configuration to start from; predictions are also shown relative to its
            prediction.
        memory_limit: Device memory in GiB for P(fits) (with a memory model).
        feasibility: A fitted :class:`~cubicml_lab.surrogate.FeasibilityModel` for P(fits);
            default: the predictor's own (``fit_feasibility``), if any. Without one P(fits) is
            omitted.
        unit: Unit of the objective shown after the numbers, e.g. ``"tokens/s"``.

    Attributes:
        controls: Knob name -> control widget.
        prediction: The last prediction: ``predicted``, ``lower``, ``upper``, ``p_fits`` (None
            when not known), ``relative`` (to the reference's prediction) and ``error``.
    """

    def __init__(self, predictor: Any, space: Space, *,
                 reference: Mapping[str, Any] | None = None, memory_limit: float | None = None,
                 feasibility: Any = None, unit: str | None = None) -> None:
        self.predictor, self.space = predictor, space
        self.memory_limit, self.unit = memory_limit, unit
        self.feasibility = feasibility  # else the predictor's own, if it has one
        if feasibility is None and getattr(predictor, "feasibility", None) is not None:
            self._p_fits: Callable[..., Any] | None = predictor.predict_feasibility
        else:
            self._p_fits = None if feasibility is None else feasibility.predict
        self.reference = space.project(reference) if reference is not None else None
        self.prediction: dict[str, Any] = {}
        self._flip: str | None = None  # "inverse" / "negate": the model predicts 1/y or -y
        self._holding = False
        start = self.reference or space.sample(1, seed=0)[0]
        self.controls = {p.name: _knob_control(p, start[p.name], slider=True)
                         for p in space.parameters}
        for c in self.controls.values():
            c.observe(lambda _: self.update(), names="value")
        self.output = W.HTML()
        title = f"predicted {getattr(predictor, 'objective', 'objective')} · " \
                f"{type(predictor).__name__}"
        if getattr(predictor, "n_train", None):
            title += f" on {predictor.n_train} trials"
        super().__init__([W.HTML(f"<b style='{_FONT}'>{html.escape(title)}</b>"),
                          *self.controls.values(), self.output])
        self.add_class("cubicml-predictor-explorer")
        self.update()

    @classmethod
    def from_search(cls, search: Any, **kwargs: Any) -> PredictorExplorer:
        """The GP and feasibility model of a Bayesian search's last BO ask, in the objective's
        units (a minimising search's model predicts 1/y, or -y, and is turned back)."""
        if getattr(search, "predictor", None) is None:
            raise SearchError("the search has no fitted predictor yet",
                             hint="it fits one at its first Bayesian-optimisation ask")
        kwargs.setdefault("feasibility", search.feasibility_model)
        kwargs.setdefault("memory_limit", getattr(search, "memory_limit_gib", None))
        out = cls(search.predictor, search.space, **kwargs)
        if getattr(search, "direction", "maximize") == "minimize":
            out._flip = "inverse" if search.log_objective else "negate"
            out.update()
        return out

    # -- state -----------------------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        """The configuration the controls show."""
        return {name: c.value for name, c in self.controls.items()}

    def set_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Set some or all knobs at once (one prediction) and return :attr:`prediction`."""
        self._holding = True
        try:
            for name, value in config.items():
                if name not in self.controls:
                    raise SpaceError(f"no knob {name!r}",
                                     hint=f"knobs: {', '.join(self.controls)}")
                self.controls[name].value = value
        finally:
            self._holding = False
        return self.update()

    def _predict(self, config: dict[str, Any]) -> tuple[float, float, float]:
        mid, _ = self.predictor.predict([config])
        lo, hi = self.predictor.predict_interval([config])
        m, lo_, hi_ = float(mid[0]), float(lo[0]), float(hi[0])
        if self._flip == "inverse":
            return 1.0 / m, 1.0 / hi_, 1.0 / lo_
        if self._flip == "negate":
            return -m, -hi_, -lo_
        return m, lo_, hi_

    def update(self) -> dict[str, Any]:
        """Predict for the controls' configuration and redraw; returns :attr:`prediction`."""
        if self._holding:
            return self.prediction
        config = self.config
        out: dict[str, Any] = {"config": config, "predicted": None, "lower": None,
                               "upper": None, "p_fits": None, "relative": None, "error": None}
        try:
            self.space.validate(config)
            out["predicted"], out["lower"], out["upper"] = self._predict(config)
            if self._p_fits is not None:
                out["p_fits"] = float(self._p_fits([config], memory_limit=self.memory_limit)[0])
            if self.reference is not None:
                out["relative"] = out["predicted"] / self._predict(self.reference)[0]
        except CubicMLError as err:
            out["error"] = err
        self.prediction = out
        self._draw()
        return out

    # -- drawing ---------------------------------------------------------------------------------
    def _draw(self) -> None:
        p = self.prediction
        if p["error"] is not None:
            prefix = "not a valid configuration: " if isinstance(p["error"], SpaceError) else ""
            self.output.value = _error_html(p["error"], prefix)
            return
        unit = f" {self.unit}" if self.unit else ""
        parts = [f"<b>{html.escape(fmt(p['predicted']))}{html.escape(unit)}</b> (95%: "
                 f"{html.escape(_interval(p['lower'], p['upper']))})"]
        if p["p_fits"] is not None:
            parts.append(f"P(fits) {p['p_fits']:.2f}")
        if p["relative"] is not None:
            parts.append(f"{p['relative']:.2f}× the reference's prediction")
        self.output.value = f"<div style='{_FONT}'>{' · '.join(parts)}</div>"
