"""The loop: ask, (review), launch, store, tell; several trials in flight; a shared budget.

:class:`Loop` is the part of :class:`~cubicml_lab.Campaign` that runs trials.
:meth:`~Loop.launch` runs one now; :meth:`~Loop.run` keeps up to ``parallel`` trials in flight
(one launcher call each, in threads) until the campaign holds ``budget`` finished trials. Every
trial is written to the store before it starts (``pending``), when its process is up
(``running``, with the process's record) and when it ends; a launcher's result comes back as a
:class:`~cubicml_lab.trials.TrialResult`, is stored, and is told to the searcher. A failure is
data, never an exception that ends the campaign. Processes running one campaign at once share
its budget: each new trial takes a slot in the store in one transaction
(:meth:`~cubicml_lab.store.TrialStore.claim_trial`).
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, LaunchError, StoreError
from ..search.proposal import Proposal
from ..store import NoRoom, Trial
from ..trials import TrialResult
from .checks import MAX_BUDGET, check_device_hours, check_early_stop, check_run_size
from .recovery import interrupted
from .state import CampaignState
from .view import format_trial

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Loop"]


class _Taken(StoreError):
    """Another process claimed the trial first: it runs there, not here."""


class _Stopped(Exception):
    """:meth:`Campaign.stop` was called while the campaign ran."""


def _launcher_failure(err: Exception) -> TrialResult:
    """A launcher that raised (a bug, not a trial's failure) becomes a ``failed`` result."""
    import traceback

    tail = "".join(traceback.format_exception(err)[-6:])
    return TrialResult(status="failed", metrics={}, hardware={},
                       error=f"launcher raised {type(err).__name__}: {err}\n{tail}")


def _end_bar_early(bar: Any, reason: str | None) -> None:
    """A progress bar whose campaign stopped before ``budget`` by its own rule (a stopping rule,
    an exhausted space) ends at the trials it ran, not short of them: tqdm's notebook bar turns
    red when closed short of its total, as after a failure. The bar's text says why it ended.

    Args:
        bar: A ``tqdm`` bar (text or notebook), not yet closed.
        reason: Why the campaign stopped (:attr:`Campaign.stop_reason`).
    """
    if getattr(bar, "disable", False) or not bar.total or bar.n >= bar.total:
        return
    bar.total = bar.n
    container = getattr(bar, "container", None)  # tqdm.notebook's widgets: text, bar, text
    if container is not None:
        container.children[1].max = max(bar.n, 1)
    if reason:
        bar.set_postfix_str(f"stopped: {reason.split(' (')[0].split(':')[0]}", refresh=False)
    bar.refresh()


class Loop(CampaignState):
    """How a :class:`~cubicml_lab.Campaign` runs trials: one now, or a budget of them.

    A mixin of :class:`~cubicml_lab.Campaign`: it shares the campaign's attributes
    (:class:`~cubicml_lab.campaign.state.CampaignState`) and reads the
    store (``_sync``), asks (``propose``, ``_next``), tells (``_tell``, ``_emit``) and recovers
    (``_fly``, ``_requeue``, ``_drop``) through the campaign's own methods."""

    def launch(self, proposal: Proposal | Mapping[str, Any], *,
               config: Mapping[str, Any] | None = None, verbose: bool = True) -> Trial | None:
        """Run one trial now (blocking), store it, tell the searcher, and return it.

        Args:
            proposal: A proposal from :meth:`propose`, or a configuration of the space.
            config: An edited configuration to run instead of the proposal's.
            verbose: Print one line when it finishes.

        Returns:
            The stored trial, or None when another process sharing the campaign claimed this
            trial first (it runs there).

        Raises:
            KeyboardInterrupt: Ctrl-C or Kernel -> Interrupt, re-raised with one line once the
                trial's processes are ended and it is back in the queue, to run first next
                time (so *Run All* stops).
            LaunchError: The launcher could not start the trial (it is re-queued).
        """
        p = self._as_proposal(proposal, config)
        self.stop_reason = None  # the campaign moves again: why a run stopped is past
        started = self._start(p)
        assert started is not None  # no budget: always added
        trial_id, params = started
        try:
            result = self._run_one(trial_id, params)
        except KeyboardInterrupt:
            line = self._requeue([(trial_id, params)], announce=False)
            raise interrupted(line) from None
        except _Taken:
            self._drop(trial_id, announce=verbose)
            return None
        except LaunchError as err:
            self._requeue([(trial_id, params)], announce=False,
                          reason=f"the launcher failed: {err}")
            raise
        except Exception as err:  # recorded as data, as in run()
            result = _launcher_failure(err)
        trial = self._finish(trial_id, params, result)
        if verbose:
            print(format_trial(trial_id, self.space, params, result, self.objective))
        return trial

    def _start(self, p: Proposal, budget: int | None = None
               ) -> tuple[int, dict[str, Any]] | None:
        """Add the trial to the store (``pending``) unless it is an interrupted one; it becomes
        ``running`` when its process is up (:meth:`_claim`). With ``budget``, a new trial takes
        one of the campaign's slots in the store; None when there is none left, or when another
        process runs this configuration now (it stays pending for the searcher until told)."""
        params = dict(p.config)
        if p.trial_id is not None:
            trial_id = p.trial_id
        elif budget is None:
            trial_id = self.store.add_trial(self.name, self._record_config(params),
                                            workload=self.workload.name,
                                            workload_version=self.workload.version)
        else:
            try:
                trial_id = self.store.claim_trial(
                    self.name, self._record_config(params), budget=budget,
                    workload=self.workload.name, workload_version=self.workload.version,
                    once=self.space.key(params) not in self._told_keys)  # else a chosen repeat
            except NoRoom as err:
                method = "release" if err.reason == "budget" else "mark_pending"
                keep = getattr(self.searcher, method, None)
                if callable(keep):
                    keep(params)
                return None
        self._fly(trial_id, p)
        return trial_id, params

    def _run_one(self, trial_id: int, params: dict[str, Any],
                 claimed: threading.Event | None = None) -> TrialResult:
        """Launch one trial in the calling thread, claiming it in the store once its process is
        up; then set ``claimed`` (a worker thread) or emit ``"started"`` (the caller's thread).
        Raises :class:`_Taken` when another process claimed it first."""

        followed = self._attach.pop(trial_id, None)
        current: list[dict[str, Any]] = []  # the record stored last, once the trial is claimed

        def on_start(record: dict[str, Any]) -> None:
            if current:  # the launcher's next process of the same trial (launch.Repeated)
                self._take_over(trial_id, current[-1], record)
                current.append(dict(record))
                return
            if followed is None:
                self._claim(trial_id, record)
            else:
                self._take_over(trial_id, followed, record)
            current.append(dict(record))
            if claimed is None:
                self._emit("started", trial_id)
            else:
                claimed.set()

        spec = self._spec(params)
        if followed is not None:
            return self.launcher.attach(followed["slurm_job_id"], spec,  # type: ignore[attr-defined]
                                        on_start=on_start)
        if self._launcher_reports_start():
            return self.launcher.run(spec, on_start=on_start)
        from ..launch.process import trial_record

        on_start(trial_record())  # a launcher of its own: this process is the one to record
        return self.launcher.run(spec)

    def _launcher_reports_start(self) -> bool:
        try:
            params = inspect.signature(self.launcher.run).parameters
        except (TypeError, ValueError):
            return False
        return "on_start" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

    def _claim(self, trial_id: int, record: dict[str, Any]) -> None:
        """``pending -> running`` with the trial process's record and what its proposal
        predicted (``hardware["proposal"]``, read back by any later kernel's dashboard); another
        process that got there first makes it :class:`_Taken`."""
        hardware = {"process": dict(record), "devices": int(self.launcher.world_size)}
        p = self._in_flight.get(trial_id)
        if p is not None:
            hardware["proposal"] = {"phase": p.phase, **{k: float(v) for k, v in (
                ("predicted", p.predicted), ("lower", p.lower), ("upper", p.upper),
                ("p_feasible", p.p_feasible)) if v is not None}}
        try:
            self.store.mark_running(trial_id, hardware=hardware)
        except StoreError as err:
            if self.store.get_trial(trial_id).status != "pending":
                raise _Taken(f"trial {trial_id} was claimed by another process",
                             hint="two processes share this campaign") from err
            raise

    def _take_over(self, trial_id: int, old: dict[str, Any], record: dict[str, Any]) -> None:
        """``running`` stays ``running``, with this process as the owner of the job it follows;
        another process that took it over first makes it :class:`_Taken`."""
        try:
            self.store.take_over_trial(trial_id, old, record)
        except StoreError as err:
            raise _Taken(f"trial {trial_id} was taken over by another process",
                         hint="two processes share this campaign") from err

    def _finish(self, trial_id: int, params: dict[str, Any], result: TrialResult) -> Trial:
        self.store.finish_trial(trial_id, status=result.status, metrics=result.metrics,
                                hardware=result.hardware, error=result.error)
        self._forget_flight(trial_id)
        trial = self.store.get_trial(trial_id)
        self._tell(trial)
        self._emit("finished", trial)
        return trial

    # -- the loop ------------------------------------------------------------------------------
    def run(self, budget: int | None = None, parallel: int | None = None, *,
            budget_device_hours: float | None = None, early_stop: bool | float = False,
            progress: bool = True,
            verbose: bool = True, on_trial: Callable[[Trial], None] | None = None,
            review: Callable[[Proposal], Mapping[str, Any] | None] | None = None,
            full: bool = False) -> pd.DataFrame:
        """Run until the campaign holds ``budget`` finished trials (resuming if it has some).

        Interrupting it (Ctrl-C, or Kernel -> Interrupt in Jupyter) stops it: the trials in
        flight are stopped (their processes ended, their Slurm jobs cancelled) and re-queued to
        run first next time, then ``KeyboardInterrupt`` is raised again with one line saying so,
        so that *Run All* stops at this cell (Jupyter shows the line, not a traceback).
        :meth:`stop` (e.g. from a widget in another thread) returns normally instead.

        Args:
            budget: Total finished trials wanted in this campaign, counting earlier runs;
                default :attr:`budget` (set by a campaign file); with only
                ``budget_device_hours``, :data:`~cubicml_lab.campaign.checks.MAX_BUDGET`.
            budget_device_hours: Stop launching once the campaign's finished trials have cost
                this many device-hours, counting earlier runs (:meth:`device_seconds`: each
                trial's devices x its wall-clock time, start-up included; on the CPU a device
                is a trial process, so 0.05 is 3 minutes of one process). Trials in flight
                then finish; None: no cost limit.
            early_stop: Stop a trial once its windows show that it cannot beat the best so
                far: the lower end of its median step time's 95% CI slower than what would
                tie the best less a margin (True: 10% on the CPU, whose processes of one
                configuration spread by up to ~7%, 3% on CUDA, where they spread by 0-2%:
                ``timing.policy.early_stop_margin``; a number in (0, 0.5): that margin). It is
                stored ``ok`` with the figures it has and ``stopped_early = 1``, is never the
                best, and the searcher is told it as censored (at most this fast). For the
                built-in workloads and command jobs that report their steps, on every launcher
                (a Slurm job ends with its trial), and an objective of ``throughput``,
                ``<units>_per_s`` or ``step_time_s``.
            parallel: Trials in flight at once (one launcher call each, in threads); default
                :attr:`parallel` (1 unless a campaign file says otherwise).
            progress: Show a tqdm progress bar (works in notebooks and terminals).
            verbose: Print one line per finished trial.
            on_trial: Called with each finished :class:`~cubicml_lab.store.Trial`.
            review: Called with each :class:`~cubicml_lab.search.Proposal` before it is
                launched; returns the configuration to run (the proposal's, or an edited one)
                or None to skip it (never proposed again).
            full: Return every field of every trial (:meth:`table` ``(full=True)``) instead of
                the columns a person reads.

        Returns:
            The campaign's trials, one row each: :meth:`table`.

        Raises:
            KeyboardInterrupt: On Ctrl-C / Kernel -> Interrupt, after the cleanup above.
            LaunchError: The launcher could not start trials (those in flight are re-queued).
        """
        if budget is None and self.budget is None and budget_device_hours is not None:
            budget = MAX_BUDGET
        budget, parallel = self._run_sizes(budget, parallel)
        self._early_stop = check_early_stop(early_stop, self.device)
        self._cost_cap_s = None if budget_device_hours is None else \
            3600.0 * check_device_hours(budget_device_hours)
        # interrupted trials shown by propose() but not launched: run() takes them first
        self._resumed[:0] = [p for p in self.proposals if p.trial_id is not None]
        self.proposals = [p for p in self.proposals if p.trial_id is None]
        finished = self._sync()
        self._plan_search(budget, finished)
        self.stop_reason = None
        self._stop.clear()
        bar, write = self._progress(budget, finished, progress, verbose)

        def report(trial_id: int, params: dict[str, Any], result: TrialResult,
                   trial: Trial) -> None:
            bar.update(1)
            if verbose:
                write(format_trial(trial_id, self.space, params, result, self.objective))
            if on_trial is not None:
                on_trial(trial)

        finished, stopped_by, in_flight = self._pooled(budget, parallel, finished, bar, review,
                                                       report)
        if stopped_by is not None:
            return self._stopped(stopped_by, in_flight, full)
        if self.stop_reason is None:
            self.stop_reason = "budget reached"
        self._emit("stopped", self.stop_reason)
        if verbose:
            print(f"{self.name}: {finished} finished trials; stopped: {self.stop_reason}")
        return self.table(full=full)

    def _plan_search(self, budget: int, finished: int) -> None:
        """Tell the searcher what this run may spend (``Searcher.plan_budget``): the device-
        seconds left under ``budget_device_hours``, else the trials left; a searcher that weighs
        prices cools their weight over it (:mod:`~cubicml_lab.search.cost`)."""
        plan = getattr(self.searcher, "plan_budget", None)
        if not callable(plan):
            return
        if self._cost_cap_s is not None:
            plan(device_s=max(self._cost_cap_s - self.device_seconds(), 1e-6))  # > 0
        else:
            plan(trials=max(budget - finished, 1))

    def _run_sizes(self, budget: int | None, parallel: int | None) -> tuple[int, int]:
        """:meth:`run`'s ``budget`` and ``parallel``, the campaign's defaults where not given,
        checked."""
        budget = self.budget if budget is None else budget
        parallel = self.parallel if parallel is None else parallel
        if budget is None:
            raise ConfigError("budget is not set", hint="e.g. run(budget=12)")
        return (check_run_size("budget", budget, self.launcher),
                check_run_size("parallel", parallel, self.launcher))

    def _progress(self, budget: int, finished: int, progress: bool, verbose: bool
                  ) -> tuple[Any, Callable[[str], None]]:
        """:meth:`run`'s progress bar and how it writes a line (beside the bar), having said
        what a resumed campaign runs first."""
        from tqdm.auto import tqdm

        bar = tqdm(total=budget, initial=min(finished, budget), desc=self.name, unit="trial",
                   disable=not progress, leave=True)
        write = bar.write if progress else print
        if self._resumed and verbose:
            followed = sum(p.trial_id in self._attach for p in self._resumed)
            rerun = len(self._resumed) - followed
            parts = [f"{rerun} interrupted trial(s) run again first"] if rerun else []
            parts += [f"{followed} Slurm job(s) of a dead run followed"] if followed else []
            write(f"resuming {self.name!r}: {finished} finished, {', '.join(parts)}")
        return bar, write

    def _pooled(self, budget: int, parallel: int, finished: int, bar: Any,
                review: Callable[[Proposal], Any] | None,
                report: Callable[[int, dict[str, Any], TrialResult, Trial], None]
                ) -> tuple[int, BaseException | None, list[tuple[int, dict[str, Any]]]]:
        """:meth:`_loop` on a pool of ``parallel`` threads: the number finished, what stopped
        it (an interrupt, a launcher failure, :meth:`stop`; None: it ended by itself) and the
        trials it left in flight. A stopped loop's trial processes are ended first, so that the
        threads return at once."""
        in_flight: dict[cf.Future[TrialResult], tuple[int, dict[str, Any]]] = {}
        pool = cf.ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="trial")
        stopped_by: BaseException | None = None
        self._running = True
        try:
            finished = self._loop(budget, parallel, finished, pool, in_flight, review, report)
            _end_bar_early(bar, self.stop_reason)
        except (KeyboardInterrupt, LaunchError, _Stopped) as err:
            stopped_by = err
            cancel = getattr(self.launcher, "cancel", None)
            if callable(cancel):
                cancel()  # kill the trial processes so the threads return at once
        finally:
            self._running = False
            bar.close()
            pool.shutdown(wait=stopped_by is None or callable(getattr(self.launcher, "cancel",
                                                                      None)),
                          cancel_futures=True)
        return finished, stopped_by, list(in_flight.values())

    def _stopped(self, err: BaseException, in_flight: list[tuple[int, dict[str, Any]]],
                 full: bool) -> pd.DataFrame:
        """:meth:`run` was stopped by ``err``: what was in flight goes back to the queue (to run
        first next time), then an interrupt is raised again with the line that says so (so
        *Run All* stops), a launcher failure too, and :meth:`stop` returns the table."""
        line = self._requeue(in_flight, announce=isinstance(err, _Stopped),
                             reason="stopped by Campaign.stop()" if isinstance(err, _Stopped)
                             else "interrupted" if isinstance(err, KeyboardInterrupt)
                             else f"the launcher failed: {err}")
        if isinstance(err, LaunchError):
            raise err
        if isinstance(err, KeyboardInterrupt):
            raise interrupted(line) from None
        return self.table(full=full)

    def _loop(self, budget: int, parallel: int, finished: int, pool: cf.ThreadPoolExecutor,
              in_flight: dict[cf.Future[TrialResult], tuple[int, dict[str, Any]]],
              review: Callable[[Proposal], Any] | None,
              report: Callable[[int, dict[str, Any], TrialResult, Trial], None]) -> int:
        """Keep up to ``parallel`` trials in flight until the store holds ``budget`` finished
        trials of this campaign (or the searcher stops); returns the number finished.
        ``in_flight`` holds what runs here. Other processes may run the same campaign: a new
        trial takes one of the campaign's ``budget`` slots in the store
        (:meth:`~cubicml_lab.store.TrialStore.claim_trial`), so between them they finish
        exactly ``budget``; while the others hold every slot left, this one waits for them."""
        checked_at = -1  # finished trials when the cost was last summed
        while True:
            finished = self._sync()
            if finished >= budget:
                break
            if self._cost_cap_s is not None and self.stop_reason is None \
                    and finished != checked_at:  # the store is read once per finished trial
                checked_at = finished
                spent = self.device_seconds()
                if spent >= self._cost_cap_s:
                    self.stop_reason = (f"device-hour budget reached: {spent / 3600:.3g} of "
                                        f"{self._cost_cap_s / 3600:.3g} device-hours spent")
            taken = sum(self.store.counts(self.name).values())
            room = min(parallel - len(in_flight), len(self._resumed) + max(0, budget - taken))
            for p in self._next(room, review) if room > 0 and self.stop_reason is None else []:
                started = self._start(p, budget)
                if started is None:
                    continue
                trial_id, params = started
                claimed = threading.Event()
                fut = pool.submit(self._run_one, trial_id, params, claimed)
                in_flight[fut] = (trial_id, params)
                while not claimed.wait(0.01) and not fut.done():
                    pass  # "started" once the trial is running in the store, as observers expect
                if claimed.is_set():
                    self._emit("started", trial_id)
            if self._stop.is_set():
                raise _Stopped
            if not in_flight:
                if self.stop_reason is not None or not self._others_hold_slots():
                    break
                self._stop.wait(0.25)  # the slots left are other processes' trials
                continue
            done, _ = cf.wait(in_flight, timeout=0.25, return_when=cf.FIRST_COMPLETED)
            if self._stop.is_set():
                raise _Stopped
            for fut in done:
                trial_id, params = in_flight.pop(fut)
                try:
                    result = self._result_of(fut)
                except _Taken:
                    self._drop(trial_id, announce=False)
                    continue
                except LaunchError:
                    in_flight[fut] = (trial_id, params)  # re-queued with the others
                    raise
                report(trial_id, params, result, self._finish(trial_id, params, result))
            self._check_stop_rule()
        return finished

    def _others_hold_slots(self) -> bool:
        """True while another live process on this host holds trials of this campaign
        (pending: just claimed; running: its campaign process is alive), which it will finish
        or give back; a trial stuck or on another host is not waited for."""
        from ..launch.process import owner_state

        for t in self.store.trials(self.name, status=["pending", "running"]):
            if t.id in self._in_flight:
                continue
            if t.status == "pending" or owner_state((t.hardware or {}).get("process")) == "alive":
                return True
        return False

    def _check_stop_rule(self) -> None:
        should_stop = getattr(self.searcher, "should_stop", None)
        if callable(should_stop) and self.stop_reason is None and should_stop():
            self.stop_reason = ("the searcher's stopping rule fired: "
                                f"{getattr(self.searcher, 'stop_reason', None) or ''}")

    @staticmethod
    def _result_of(fut: cf.Future[TrialResult]) -> TrialResult:
        try:
            return fut.result()
        except (LaunchError, _Taken):
            raise
        except Exception as err:  # a launcher bug must not lose the campaign: record it as data
            return _launcher_failure(err)
