"""Asking and reviewing: the proposals a campaign hands out, and a person's say over them.

:class:`Asking` is the part of :class:`~cubicml_lab.Campaign` between the searcher and a launch:
:meth:`~Asking.propose` (interrupted trials first, then the searcher's proposals), the review
of each one before it runs (run as proposed, edited, or skipped), :meth:`~Asking.skip` and
:meth:`~Asking.unskip`, kept in the store's campaign record so that a resumed campaign skips
the same configurations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..errors import ConfigError, SearchError, SpaceError
from ..search.proposal import Proposal
from .state import CampaignState

__all__ = ["Asking"]


def _exhausted_reason(err: SearchError) -> str:
    """A run's stop reason when the searcher has nothing to propose: everything left was
    skipped (:class:`~cubicml_lab.errors.SearchExhausted` with ``skipped``; un-skipping helps),
    or the search space is exhausted."""
    skipped = getattr(err, "skipped", 0)
    if skipped:
        return (f"everything left was skipped: the {skipped} configurations not yet tried were "
                "skipped by the review rule or by hand (campaign.unskip() lets the search "
                "propose them again)")
    return f"search space exhausted ({err.message})"


class Asking(CampaignState):
    """What a :class:`~cubicml_lab.Campaign` proposes and what a person makes of it.

    A mixin of :class:`~cubicml_lab.Campaign`: it shares the campaign's attributes
    (:class:`~cubicml_lab.campaign.state.CampaignState`), reads the store
    first (``_sync``) and tells the observers (``_emit``) through the campaign's own methods."""

    def propose(self, n: int = 1) -> list[Proposal]:
        """The next ``n`` configurations to run, with the searcher's figures (nothing runs).

        Interrupted trials come first; then ``searcher.propose(n)``. Each proposal stays
        pending until it is passed to :meth:`launch` or :meth:`skip`; :attr:`proposals` holds
        the ones waiting.

        Raises:
            SearchError: When the searcher has nothing left to propose (a
                :class:`~cubicml_lab.errors.SearchExhausted` whose ``skipped`` counts the
                untried configurations that were skipped: :meth:`unskip` gives them back).
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"propose(n={n!r}): n must be an int >= 1", hint="e.g. propose(1)")
        self._sync()
        out = self._take_resumed(n)
        if len(out) < n:
            out += self._searcher_proposals(n - len(out))
        self.proposals.extend(out)
        self._emit("proposed", list(out))
        return out

    def _take_resumed(self, n: int) -> list[Proposal]:
        """Up to ``n`` interrupted trials to run again, none with the configuration of a trial
        in flight or of another one taken now (those wait for a later call)."""
        busy = {self.space.key(p.config) for p in [*self._in_flight.values(), *self.proposals]}
        out: list[Proposal] = []
        for p in list(self._resumed):
            if len(out) < n and self.space.key(p.config) not in busy:
                self._resumed.remove(p)
                busy.add(self.space.key(p.config))
                out.append(p)
        return out

    def _searcher_proposals(self, n: int) -> list[Proposal]:
        propose = getattr(self.searcher, "propose", None)
        if callable(propose):
            return list(propose(n))
        return [Proposal(config=c, objective=self.objective, phase="random", reason="asked")
                for c in self.searcher.ask(n)]

    def _as_proposal(self, what: Proposal | Mapping[str, Any], config: Mapping[str, Any] | None
                     ) -> Proposal:
        """The proposal to run, taken off :attr:`proposals`: ``what`` itself, or an edited copy
        when ``config`` differs (the original goes back to the searcher, unasked), or a
        hand-written configuration."""
        if not isinstance(what, Proposal):
            if not isinstance(what, Mapping):
                raise ConfigError(f"expected a Proposal or a config dict, got {what!r:.80}",
                                  hint="camp.launch(camp.propose()[0]) or camp.launch({...})")
            what, config = Proposal(config=dict(what), objective=self.objective,
                                    phase="edited", reason="configuration given by hand"), None
        chosen = what
        if config is not None and dict(config) != what.config:
            chosen = what.with_config(dict(config), reason="edited by hand from a proposal")
        try:
            self.space.validate(chosen.config)
        except SpaceError as err:
            raise ConfigError(f"cannot run {chosen.config}: {err.message}",
                              hint=err.hint or "pick values the space allows") from None
        self._forget(what, release=chosen is not what)
        return replace(chosen, config=self.space.project(chosen.config))

    def _forget(self, proposal: Proposal, *, release: bool) -> None:
        self.proposals = [p for p in self.proposals if p is not proposal]
        if release and proposal.trial_id is None:
            release_fn = getattr(self.searcher, "release", None)
            if callable(release_fn):
                release_fn(proposal.config)

    def skip(self, proposal: Proposal | Mapping[str, Any]) -> None:
        """Do not run this proposal, and never propose it again (the searcher is told, and the
        skip is kept in the store's campaign record, so a resumed campaign skips it too)."""
        p = proposal if isinstance(proposal, Proposal) else Proposal(config=dict(proposal))
        self._forget(p, release=False)
        if p.trial_id is not None:  # an interrupted trial the person does not want again
            followed = self._attach.pop(p.trial_id, None)
            if followed is not None:
                self.launcher.cancel_job(followed["slurm_job_id"])  # type: ignore[attr-defined]
            self.store.finish_trial(p.trial_id, status="failed",
                                    error="skipped by hand after an interruption")
            return self._emit("skipped", p)
        skip = getattr(self.searcher, "skip", None)
        if callable(skip):
            skip(p.config)
        key = self.space.key(p.config)
        skipped = self.store.campaign_info(self.name)["metadata"].get("skipped", [])
        if key not in skipped:
            self.store.update_campaign_metadata(self.name, {"skipped": [*skipped, key]})
        self._emit("skipped", p)

    def unskip(self, config: Mapping[str, Any] | None = None) -> int:
        """Let the search propose skipped configurations again: ``config``, or (None) every
        one skipped, by hand, from :class:`~cubicml_lab.widgets.ProposalReview` or by a
        ``run(review=...)`` rule. The skips are forgotten in the store too, so a resumed
        campaign proposes them as well.

        This is the way on when a run stopped because everything left was skipped
        (:attr:`stop_reason` says so, apart from a search space that is exhausted): un-skip,
        loosen the rule if it skipped too much, and run again.

        Returns:
            How many configurations were un-skipped.

        Raises:
            SearchError: If ``config`` is not a configuration of the space (SpaceError with
                a searcher that cannot un-skip).
        """
        before = set(getattr(self.searcher, "skipped", []))
        unskip = getattr(self.searcher, "unskip", None)
        if callable(unskip):
            unskip(None if config is None else dict(config))  # checks config
        elif config is not None:
            self.space.validate(dict(config))
        after = set(getattr(self.searcher, "skipped", []))
        stored = self.store.campaign_info(self.name)["metadata"].get("skipped", [])
        keys = set(stored) if config is None else \
            {self.space.key(self.space.project(dict(config)))} & set(stored)
        if keys:
            self.store.update_campaign_metadata(
                self.name, {"skipped": [k for k in stored if k not in keys]})
        return len((before - after) | keys)

    def _next(self, room: int, review: Callable[[Proposal], Any] | None) -> list[Proposal]:
        """Up to ``room`` proposals to launch, each passed through ``review`` when given."""
        out: list[Proposal] = []
        while len(out) < room and self.stop_reason is None:
            # taken but not started yet: the sync in propose() must not queue them again
            self._taking = {p.trial_id for p in out if p.trial_id is not None}
            try:
                batch = self.propose(room - len(out))
            except SearchError as err:
                self.stop_reason = _exhausted_reason(err)
                break
            finally:
                self._taking = set()
            for p in batch:
                choice = p.config if review is None else review(p)
                if choice is None:
                    self.skip(p)
                else:
                    out.append(self._as_proposal(p, choice))
        return out
