"""`ProposalReview`: look at the next proposal(s) of a campaign, then accept, skip or edit
before anything runs."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from .._html import fmt, knobs, rows_table
from ..campaign import Campaign, format_trial
from ..errors import ConfigError, CubicMLError, SearchError, SearchExhausted, SpaceError
from ..trials import TrialResult
from ..store import Trial
from ._common import _FONT, _GREY, _error_html, _guard, _interval, _knob_control, _text

if TYPE_CHECKING:
    from ..search import Proposal


class ProposalReview(W.VBox):
    """Review the next proposal(s) of a campaign before anything runs.

    Shows each proposal with the searcher's prediction, its 95% interval, P(fits), the log
    acquisition value and why it was picked. *accept & run* launches it
    (:meth:`Campaign.launch`, blocking), shows the trial's result line and proposes the next;
    *skip* drops it for good (:meth:`Campaign.skip`, kept in the store); *edit* shows one input
    per knob, prefilled, and *run edited* launches the edited configuration instead. When
    everything left was skipped (not the space exhausted: the message says which), *un-skip
    all* gives the skipped configurations back to the search (:meth:`unskip`). A
    :class:`CampaignDashboard` of the same campaign updates as these trials run.

    Kernel -> Interrupt while a trial runs stops it: the campaign ends its processes (cancels
    its Slurm job) and re-queues it, and the widget says so in red and proposes it first;
    nothing more runs until the next click. Called from code (``review.accept()`` in a cell),
    the ``KeyboardInterrupt`` is then raised again, so *Run All* stops there; from a button, it
    ends with the click (a button's callback has no cells after it to stop, and an exception
    there would only reach the server's log).

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
        self.unskip_button = W.Button(description="un-skip all", icon="undo",
                                      layout=W.Layout(display="none"),
                                      tooltip="let the search propose the skipped "
                                              "configurations again")
        self.run_edited_button = W.Button(description="run edited", button_style="warning",
                                          icon="play")
        self.cancel_button = W.Button(description="cancel edit")
        for button, action in ((self.accept_button, self.accept), (self.skip_button, self.skip),
                               (self.edit_button, self.edit),
                               (self.run_edited_button, self.run_edited),
                               (self.cancel_button, self.cancel_edit),
                               (self.unskip_button, self.unskip)):
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
                          W.HBox([self.accept_button, self.skip_button, self.edit_button,
                                  self.unskip_button]),
                          self.edit_box, self.message, self.results_html])
        self.add_class("cubicml-proposal-review")
        self.propose()

    # -- state -----------------------------------------------------------------------------------
    def propose(self) -> list[Proposal]:
        """Fill up to ``n`` proposals: the ones still waiting in the campaign first, then new
        ones from ``campaign.propose`` (a search with nothing left is shown, not raised: an
        exhausted space, or everything left skipped, with *un-skip all*)."""
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
            if not isinstance(self.error, SearchExhausted):  # that one says why, and how on
                self.error = SearchError(f"no proposal #{i + 1} to act on",
                                         hint="propose() again; campaign.propose() says why "
                                              "nothing is proposed")
            self._draw()
            return None
        self.selected = i
        return self.proposals[i]

    def accept(self, index: int | None = None) -> Trial | None:
        """Run the selected proposal now (blocking), then propose the next.

        Returns:
            The stored trial, or None (an error shown in the widget).

        Raises:
            KeyboardInterrupt: Kernel -> Interrupt, once the trial is stopped and re-queued.
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
        self.results.append(f"skipped   {knobs(p.config, self.campaign.space.names)}")
        self._drop(p)
        self.propose()

    def unskip(self) -> int:
        """Let the search propose every skipped configuration again (:meth:`Campaign.unskip`,
        forgotten in the store too), then propose. The button shows when the search stopped
        proposing because everything left was skipped.

        Returns:
            How many configurations were un-skipped.
        """
        n = self.campaign.unskip()
        self.error = None
        self.results.append(f"un-skipped {n} configuration{'s' if n != 1 else ''}")
        self.propose()
        return n

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
            The stored trial, or None (an error, e.g. a configuration outside the space, shown
            in the widget).

        Raises:
            KeyboardInterrupt: Kernel -> Interrupt, once the trial is stopped and re-queued.
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
        self._busy = (f"running {knobs(config or p.config, names)} … (the kernel is busy until "
                      "the trial ends)")
        self._draw()
        try:
            trial = self.campaign.launch(p, config=config, verbose=False)
        except CubicMLError as err:
            self.error = err
            return None
        except KeyboardInterrupt as err:  # the trial is stopped and re-queued by now
            self._interrupted(p, err)
            raise
        finally:
            self._busy = ""
            self._draw()
        if trial is None:
            self.results.append("claimed by another process sharing the campaign: it runs there")
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

    def _interrupted(self, p: Proposal, err: KeyboardInterrupt) -> None:
        """Say in the widget that an interrupt stopped the trial (re-queued by the campaign) and
        show the proposals again, the interrupted trial first; nothing more runs."""
        self.results.append("interrupted: the trial was stopped and re-queued; it is proposed "
                            "first, and nothing runs until you click again")
        self._drop(p)
        self.editing = False
        self.propose()
        self.error = err

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
        all_skipped = isinstance(self.error, SearchExhausted) and self.error.skipped > 0
        self.unskip_button.layout.display = "flex" if all_skipped else "none"
        self.unskip_button.disabled = bool(self._busy)
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
