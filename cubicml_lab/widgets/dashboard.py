"""`CampaignDashboard`: a campaign as it runs, or as its store holds it."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from .._html import fmt, knobs, rows_table
from ..campaign import Campaign
from ..campaign.view import device_time, status_counts
from ..errors import CubicMLError
from ..store import FINAL_STATUSES, Trial, TrialStore
from ..trials import contention_note, error_summary, is_contended, is_stopped_early, trial_log
from ._common import _FONT, _GREY, _error_html, _guard, _interval, _set_png, _text, _unit

if TYPE_CHECKING:
    from ..search import Proposal


class CampaignDashboard(W.VBox):
    """A campaign as it runs: trial counts, best against the reference, best-so-far figure, the
    latest trials, the proposals waiting or running with their predictions, and one ended
    trial's log (its error and, for a command workload, the job's argv and last lines), picked
    from ``log_picker`` (the newest trial that did not end ``ok`` until a person picks).

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
        # a trial's log one pick away: the error and, for a command, the job's last lines
        self.log_picker = W.Dropdown(description="log of", options=[("(no trial log yet)", None)],
                                     layout=W.Layout(width="360px"))
        self.log_view = W.HTML()
        self.log_picker.observe(lambda _change: self._draw_log(), names="value")
        super().__init__([self.title, self.status,
                          W.HBox([self.figure, W.VBox([self.latest, self.proposals])],
                                 layout=W.Layout(flex_flow="row wrap")),
                          W.HBox([self.refresh_button, self.updated]),
                          self.log_picker, self.log_view])
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
        self._draw_log_picker()

    def _draw_log_picker(self) -> None:
        """The finished trials, newest first, that have something to read (an error or a job's
        output); the newest one that did not end ``ok`` is picked until a person picks."""
        ended = [t for t in self.trials[::-1] if t.status in FINAL_STATUSES
                 and trial_log(t.error, t.hardware)]
        options = [(f"#{t.id} {t.status}: {error_summary(t.error, 50) or 'job output'}", t.id)
                   for t in ended] or [("(no trial log yet)", None)]
        if [o[1] for o in options] == [o[1] for o in self.log_picker.options]:
            return
        keep = self.log_picker.value if self.log_picker.value in {o[1] for o in options} \
            else next((t.id for t in ended if t.status != "ok"), options[0][1])
        self.log_picker.options = options
        self.log_picker.value = keep
        self._draw_log()

    def _draw_log(self) -> None:
        trial = next((t for t in self.trials if t.id == self.log_picker.value), None)
        text = "" if trial is None else trial_log(trial.error, trial.hardware)
        self.log_view.value = "" if not text else (
            "<pre style='max-height: 16em; overflow: auto; font-size: 11px; "
            f"white-space: pre-wrap'>{html.escape(text)}</pre>")

    def _draw_status(self) -> None:
        s, unit = self.summary, self._unit()
        counts = status_counts(s)
        n = s.get("trials", 0)
        parts = [f"{n} trial{'' if n == 1 else 's'}" + (f": {counts}" if counts else "")]
        names = self.campaign.space.names
        if s.get("best") is not None:
            parts.append(f"best {fmt(s['best'])} {unit or self.campaign.objective} "
                         f"({knobs(s['best_config'], names)})")
        if s.get("recommended") is not None and s.get("recommended_config") != s["best_config"]:
            parts.append(f"recommended {fmt(s['recommended'])} "
                         f"({knobs(s['recommended_config'], names)}: the model rates it higher)")
        if s.get("reference") is not None:
            parts.append(f"reference {fmt(s['reference'])}")
        if s.get("speedup") is not None:
            parts.append(f"{s['speedup']:.2f}× the reference")
        if s.get("device_s"):
            parts.append(f"spent {device_time(s['device_s'])}")
        if s.get("stop_reason"):
            parts.append(f"stopped: {s['stop_reason']}")
        if s.get("prior"):
            parts.append(f"physics prior: {s['prior']}")
        self.status.value = _text(" · ".join(parts), "font-weight: bold") + _text(
            contention_note(self.trials) or "", "color: var(--jp-warn-color0, #b45309)")

    def _draw_figure(self) -> None:
        from ..plots import plot_best_so_far

        if not any(t.status in FINAL_STATUSES for t in self.trials):
            self.figure.outputs = ()
            return
        df = self.campaign.dataframe()
        df = df[df["status"].isin(FINAL_STATUSES)]
        for extra in self._fig.axes:  # the spend axis of the last draw
            if extra is not self._ax:
                extra.remove()
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
            predicted = self._predicted(t)
            note = error_summary(t.error, 60)
            shown = t.status
            if t.status == "ok" and is_contended(t.metrics):
                shown = "ok, contended"
            if t.status == "ok" and is_stopped_early(t.metrics):
                shown += ", stopped early"
            rows.append([t.id, shown,
                         *(t.config.get(n) for n in names),
                         t.metrics.get(obj, ""), predicted,
                         t.metrics.get("step_time_s", ""), note])
        columns = ["id", "status", *names, obj, "predicted", "step_time_s", "note"]
        self.latest.value = (f"<div style='{_FONT}'><b>latest trials</b>"
                             f"{rows_table(columns, rows)}</div>")

    def _predicted(self, t: Trial) -> str:
        """What the search predicted for ``t`` when it was proposed: the record the campaign
        stored with the trial (so a trial of an earlier kernel has it too), else the proposal
        this dashboard saw; blank for a configuration given by hand or a space-filling one."""
        stored = (t.hardware or {}).get("proposal")
        if isinstance(stored, Mapping) and isinstance(stored.get("predicted"), (int, float)):
            return fmt(stored["predicted"])
        p = self._ran.get(t.id) or self._running.get(t.id)
        return "" if p is None or p.predicted is None else fmt(p.predicted)

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
