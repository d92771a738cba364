"""A campaign after a death: what the store says runs, what really runs, and what to do.

:class:`Recovery` is the part of :class:`~cubicml_lab.Campaign` that reads the store against
the processes of this host. A trial left ``pending`` or ``running`` by an interrupted run is
run again first; a running one whose campaign died is ended first (signalled only when its
process proves that this lab started it, see :mod:`cubicml_lab.launch.process`); one whose
campaign is alive elsewhere is held as pending, so no configuration runs twice at once; a
Slurm job that outlived its campaign is followed (re-attached), not launched again. After an
interrupt (Ctrl-C, :meth:`~cubicml_lab.Campaign.stop`, a launcher that cannot start trials)
the trials in flight go back to ``pending``, and :func:`interrupted` is the one-line
``KeyboardInterrupt`` raised again.

The trials running in this process, whichever :class:`~cubicml_lab.Campaign` object runs them,
are known here (:meth:`Recovery._fly`), so that a second object on the same store never takes
them for a dead campaign's.
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from ..search.proposal import Proposal
from ..store import FINAL_STATUSES
from .state import CampaignState

if TYPE_CHECKING:
    from ..store import Trial, TrialStore

__all__ = ["Recovery", "interrupted"]

#: ``(store file, trial id)`` of the trials running in this process (any Campaign object).
_LIVE: set[tuple[str, int]] = set()
_LIVE_LOCK = threading.Lock()


def interrupted(line: str) -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` a campaign raises after cleaning up from Ctrl-C or Kernel ->
    Interrupt, carrying the one line that says what was stopped and re-queued.

    A plain ``KeyboardInterrupt``, so *Run All* stops at its cell, ``except KeyboardInterrupt``
    catches it and a script ends as after any Ctrl-C (exit by SIGINT); Jupyter shows its one
    line (IPython's ``_render_traceback_`` hook) instead of a traceback through the launcher.
    """
    err = KeyboardInterrupt(line)
    err._render_traceback_ = lambda: [f"KeyboardInterrupt: {line}"]  # type: ignore[attr-defined]
    return err


def _live_key(store: TrialStore, trial_id: int) -> tuple[str, int]:
    return (str(store.path.resolve()), trial_id)


class Recovery(CampaignState):
    """What a :class:`~cubicml_lab.Campaign` does with trials an earlier run (or another
    process) left: sync with the store, re-attach, end orphans, re-queue after an interrupt.

    A mixin of :class:`~cubicml_lab.Campaign`: it shares the campaign's attributes
    (:class:`~cubicml_lab.campaign.state.CampaignState`) and tells the
    searcher (``_tell``) and the observers (``_emit``) through the campaign's own methods."""

    def _sync(self) -> int:
        """Read the store: tell the searcher every finished trial it has not heard of, and queue
        the trials an interrupted run left ``pending`` or ``running`` (those are run again
        first; a running one is ended first if its campaign died, or held as pending if its
        campaign is alive elsewhere). Returns the number of finished trials."""
        if not self._swept:
            from ..launch.process import sweep_trial_dirs

            sweep_trial_dirs()
            self._swept = True
        finished = 0
        queued = {p.trial_id for p in [*self._resumed, *self.proposals]} | self._taking
        for t in self.store.trials(self.name):
            if t.status in FINAL_STATUSES:
                self._tell(t)
                self._held.discard(t.id)
                finished += 1
            elif t.id in self._in_flight or t.id in queued:
                continue
            elif t.status == "running" and self._job_outlived_owner(t):
                self._queue_resumed(t, follow=True)
            elif t.status == "running" and not self._recover(t):
                self._hold(t)
            else:
                self._held.discard(t.id)
                self._queue_resumed(t)
        return finished

    def _recover(self, t: Trial) -> bool:
        """A trial the store says is running but this campaign is not running. Returns True when
        it is back to ``pending`` (its campaign died: its process, if any, was ended first), False
        when it runs elsewhere (a live campaign process, another host) or would not die."""
        from ..launch.process import end_trial_process, owner_state

        record = (t.hardware or {}).get("process")
        state = owner_state(record)
        if state in ("alive", "elsewhere"):
            return False
        if state == "this process":
            with _LIVE_LOCK:
                if _live_key(self.store, t.id) in _LIVE:
                    return False
        outcome = end_trial_process(record)
        if outcome in ("alive", "elsewhere"):
            warnings.warn(f"{self.name}: trial {t.id}'s process {record.get('pid')} outlived its "
                          "campaign and would not die; it stays 'running'", stacklevel=3)
            return False
        if outcome == "not ours":
            warnings.warn(f"{self.name}: trial {t.id}'s stored process record names pid "
                          f"{record.get('pid')}, a live process this lab cannot prove it started "
                          "(an imported, copied or edited record?); it was not signalled, and "
                          "the trial runs again", stacklevel=3)
        try:
            self.store.reset_trial(t.id)
        except StoreError:  # another process resumed it first
            return self.store.get_trial(t.id).status == "pending"
        return True

    def _job_outlived_owner(self, t: Trial) -> bool:
        """A running trial whose campaign died and whose job (Slurm) this launcher can follow."""
        from ..launch.process import owner_state

        record = (t.hardware or {}).get("process")
        return (callable(getattr(self.launcher, "attach", None)) and isinstance(record, dict)
                and isinstance(record.get("slurm_job_id"), str)
                and owner_state(record) == "dead")

    def _hold(self, t: Trial) -> None:
        """Keep a trial that runs elsewhere out of this searcher's proposals until it is told."""
        if t.id not in self._held:
            hold = getattr(self.searcher, "mark_pending", None)
            if callable(hold):
                hold({n: t.config[n] for n in self.space.names})
            self._held.add(t.id)

    def _queue_resumed(self, t: Trial, *, follow: bool = False) -> None:
        """Run an interrupted trial again first (or, ``follow``, collect the job it still has),
        held as pending so no ask proposes it too."""
        config = {n: t.config[n] for n in self.space.names}
        hold = getattr(self.searcher, "mark_pending", None)
        if callable(hold):  # so that a parallel ask never proposes it a second time
            hold(config)
        reason = f"trial {t.id} was interrupted before it finished: run again first"
        if follow:
            self._attach[t.id] = dict(t.hardware["process"])
            reason = (f"trial {t.id}'s Slurm job {t.hardware['process']['slurm_job_id']} "
                      "outlived the campaign process that launched it: collect it first")
        self._resumed.append(Proposal(config=config, objective=self.objective, phase="resumed",
                                      trial_id=t.id, reason=reason))

    # -- trials in flight here -----------------------------------------------------------------
    def _fly(self, trial_id: int, proposal: Proposal) -> None:
        """The trial runs in this process now (until :meth:`_forget_flight`)."""
        with _LIVE_LOCK:
            _LIVE.add(_live_key(self.store, trial_id))
        self._in_flight[trial_id] = proposal

    def _forget_flight(self, trial_id: int) -> None:
        self._in_flight.pop(trial_id, None)
        with _LIVE_LOCK:
            _LIVE.discard(_live_key(self.store, trial_id))

    @staticmethod
    def _runs_here(t: Trial) -> bool:
        """A ``running`` trial claimed by this process (or with no record of who claimed it)."""
        from ..launch.process import owner_state

        return t.status == "running" and owner_state(
            (t.hardware or {}).get("process")) in ("this process", "unknown")

    def _drop(self, trial_id: int, *, announce: bool) -> None:
        """Another process claimed this trial first: it runs there; hold its configuration as
        pending until it is told (the next sync reads its result)."""
        self._forget_flight(trial_id)
        self._hold(self.store.get_trial(trial_id))
        if announce:
            print(f"{self.name}: trial {trial_id} was claimed by another process; left to it")

    def _requeue(self, started: list[tuple[int, dict[str, Any]]], *, announce: bool,
                 reason: str = "interrupted") -> str:
        """After an interrupt (or a launcher that cannot start trials): trials in flight go back
        to ``pending`` in the store (run again first on the next call) and leave the searcher's
        pending set. Returns the one line that says so (printed when ``announce``)."""
        for trial_id, params in started:
            self._forget_flight(trial_id)
            if self._runs_here(self.store.get_trial(trial_id)):
                self.store.reset_trial(trial_id)
            release = getattr(self.searcher, "release", None)
            if callable(release):
                release(params)
        self.stop_reason = reason
        self._emit("stopped", self.stop_reason)
        n = len(started)
        line = (f"{self.name}: {reason}; {n} trial{'s' if n != 1 else ''} in flight "
                f"{'were' if n != 1 else 'was'} stopped and re-queued (run again to resume)"
                if n else f"{self.name}: {reason}; no trial was in flight (run again to go on)")
        if announce:
            print(line)
        return line

    def stop(self) -> None:
        """Stop this campaign: a :meth:`run` in progress (in another thread, e.g. behind a
        widget's button) returns its table (where an interrupt raises); its trials in flight are
        cancelled (their Slurm jobs ``scancel``-ed, their processes ended) and run again first
        next time.
        On a campaign that is not running, this cancels the Slurm jobs that a dead run of it
        left running, and puts their trials back to ``pending``."""
        self._stop.set()
        cancel = getattr(self.launcher, "cancel", None)
        if callable(cancel):
            cancel()
        if self._running or self._in_flight:
            return
        self._sync()
        for trial_id in list(self._attach):
            self._cancel_followed(trial_id)

    def _cancel_followed(self, trial_id: int) -> None:
        record = self._attach.pop(trial_id)
        self.launcher.cancel_job(record["slurm_job_id"])  # type: ignore[attr-defined]
        try:
            self.store.reset_trial(trial_id)
        except StoreError:
            pass  # another process got to it first
        self._resumed = [p for p in self._resumed if p.trial_id != trial_id]
        release = getattr(self.searcher, "release", None)
        trial = self.store.get_trial(trial_id)
        if callable(release):
            release({n: trial.config[n] for n in self.space.names})
        print(f"{self.name}: cancelled trial {trial_id}'s Slurm job "
              f"{record['slurm_job_id']}; the trial is pending again")
