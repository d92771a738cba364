"""The co-design loop: ask the searcher, launch trials, measure, store, tell.

A :class:`Campaign` ties a :class:`~cubicml_lab.Space`, a workload, a launcher, a searcher and a
:class:`~cubicml_lab.store.TrialStore` together under a name. ``run(budget)`` keeps up to
``parallel`` trials in flight until the campaign holds ``budget`` finished trials. Every trial is
written to the store before it starts (``pending``), while it runs (``running``) and when it ends
(``ok``, ``oom``, ``failed`` or ``timeout``): a failure is data that the searcher is told about,
never an exception that ends the campaign.

A campaign whose name already has trials in the store resumes: finished trials are told to the
searcher, and trials left ``pending`` or ``running`` by an interrupted run (a closed notebook, a
killed process) are run again first. Each running trial carries the record of its process (host,
pid and start time of the trial process and of the campaign process that owns it, and the secret
its guard was started with, in ``trial.hardware["process"]``): a trial whose campaign died is
ended first and then run again. It is signalled only when the process proves that this lab
started it (its environment holds the record's secret and owner, see
:mod:`cubicml_lab.launch.process`): a record read from the store alone, imported, copied or
edited, never causes a signal; a trial whose campaign is alive
(another process sharing the store) is left to it, and its configuration is held as pending, so
no configuration ever runs twice at once. Processes running one campaign at once share its budget:
each new trial takes a slot (and its configuration) in the store in one transaction
(:meth:`~cubicml_lab.store.TrialStore.claim_trial`), so together they finish exactly ``budget``. The launchers end a trial process when its campaign
dies, and the folders of dead campaigns' trials are swept when a campaign starts.

A Slurm job outlives its campaign: a running trial whose record names a Slurm job
(``slurm_job_id``) and whose campaign died is followed, not launched again: the restarted
campaign takes it over in the store and collects the job's result, whether it is still queued,
running or already ended. Ctrl-C or Kernel -> Interrupt stops a run: its trials in flight are
ended (their Slurm jobs cancelled) and re-queued, and ``KeyboardInterrupt`` is raised again so
that Jupyter's *Run All* stops. :meth:`Campaign.stop` (from another thread, e.g. a widget) stops
a running campaign the same way but returns normally; called on a campaign that is not running,
it cancels the jobs a dead run of it left behind.

Example:
    >>> import cubicml_lab as cml
    >>> space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 8)])
    >>> camp = cml.Campaign("gpt-cpu", space, workload="gpt",            # doctest: +SKIP
    ...                     store=cml.TrialStore("data/lab.sqlite"))
    >>> df = camp.run(budget=12)        # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import json
import math
import os
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .campaign_view import CampaignView
from ._bounds import check_count
from ._params import brief
from .errors import ConfigError, LaunchError, SearchError, SpaceError, StoreError
from .trials import TrialResult, error_summary, is_contended
from .search.proposal import Proposal
from .space import Space
from .store import FINAL_STATUSES, NoRoom, Trial, TrialStore

if TYPE_CHECKING:
    import pandas as pd

    from .launch import Launcher
    from .search import Searcher
    from .workloads import Command

__all__ = ["Campaign", "format_trial"]

#: Most trials one campaign may hold (``budget``): far more than any search measures.
MAX_BUDGET = 1_000_000
#: Most trials in flight at once (``parallel``) where the launcher runs trials elsewhere (Slurm).
MAX_PARALLEL_REMOTE = 1024
_DEVICE = re.compile(r"^(cpu|cuda(:[0-9]{1,3})?)$")

#: ``(store file, trial id)`` of the trials running in this process (any Campaign object).
_LIVE: set[tuple[str, int]] = set()
_LIVE_LOCK = threading.Lock()


class _Taken(StoreError):
    """Another process claimed the trial first: it runs there, not here."""


class _Stopped(Exception):
    """:meth:`Campaign.stop` was called while the campaign ran."""


def _interrupted(line: str) -> KeyboardInterrupt:
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


def _remote(launcher: Any) -> bool:
    """True for a launcher whose trials run on other machines (Slurm)."""
    try:
        return launcher.describe().get("kind") == "slurm"
    except Exception:  # noqa: BLE001 - a user's launcher: assume it runs here
        return False


def check_device(device: object, launcher: Any) -> str:
    """``device`` if it names a device trials can use: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``,
    and, where the launcher runs trials on this machine, one this machine has.

    Raises:
        ConfigError: Naming ``device``, what this machine has and what to pass instead.
    """
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise ConfigError(f"device = {brief(device)} is not a device trials can run on",
                          hint="pass device='cpu', 'cuda' or 'cuda:N'")
    if device == "cpu" or _remote(launcher):
        return device
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        count = 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        raise ConfigError(f"device = {device!r}, but this machine has {count} usable CUDA "
                          "device(s), and the launcher runs trials here",
                          hint="pass device='cpu', or run on a GPU machine (e.g. "
                               "launcher=cml.launch.Slurm(...))")
    return device


def check_measure_options(options: object) -> dict[str, Any]:
    """``options`` as a dict of :class:`~cubicml_lab.timing.MeasureOptions` fields, checked by
    the options' own rules (unknown keys, types, ranges).

    Raises:
        ConfigError: Naming ``measure_options`` and the field.
    """
    from .errors import MeasurementError
    from .timing import MeasureOptions

    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"measure_options must be a dict, got {type(options).__name__}",
                          hint='e.g. measure_options={"max_time_s": 5}')
    try:
        MeasureOptions.from_dict(options)
    except MeasurementError as err:
        raise ConfigError(f"measure_options: {err.message}", hint=err.hint or "") from None
    except TypeError as err:
        raise ConfigError(f"measure_options: {err}", hint="pass field names as strings") from None
    return dict(options)


def check_run_size(field: str, value: object, launcher: Any) -> int:
    """``budget`` or ``parallel`` as a checked int: a budget up to :data:`MAX_BUDGET`; trials in
    flight up to what the machine runs at once (or :data:`MAX_PARALLEL_REMOTE` on Slurm)."""
    if field == "budget":
        return check_count("budget", value, high=MAX_BUDGET, error=ConfigError,
                           why="more trials than any search measures")
    if _remote(launcher):
        return check_count("parallel", value, high=MAX_PARALLEL_REMOTE, error=ConfigError,
                           why="trials in flight on a cluster, one thread each here")
    from .launch.base import local_process_limit

    high, why = local_process_limit()
    return check_count("parallel", value, high=high, error=ConfigError, why=why)


def format_trial(trial_id: int, space: Space, config: Mapping[str, Any], result: TrialResult,
                 objective: str) -> str:
    """One line per finished trial: id, status, objective with its 95% CI, step time and the
    searched knobs. The CI is the stored figure's (``{objective}_rel_ci``: for a CPU trial, of
    the windows corrected for the machine's speed), where it has none the raw step time's;
    ``±?`` when it is unknown (a figure from a single window)."""
    knobs = " ".join(f"{n}={config[n]}" for n in space.names)
    if result.status == "ok":
        m = result.metrics
        unit = "tokens/s" if "tokens_per_s" in m else "units/s"
        value = m.get(objective, math.nan)
        shown = (f"{value:>12,.0f} {unit}" if objective == "throughput"
                 else f"{objective}={value:.4g}")
        spread = m.get(f"{objective}_rel_ci", m.get("step_time_rel_ci", math.nan))
        ci = (f"±{100 * spread:.1f}%" if isinstance(spread, (int, float))
              and math.isfinite(spread) else "±?")  # unknown: a single window
        step = m.get("step_time_s", math.nan)
        flag = ("  [contended: other work shared the cores; not trusted]"
                if is_contended(m) else "")
        return (f"trial {trial_id:>3}  ok       {shown} {ci}  "
                f"step {step:.3f} s  {knobs}{flag}")
    short = error_summary(result.error, 80)
    return f"trial {trial_id:>3}  {result.status:<8} {'-':>21}  {knobs}  [{short}]"


class Campaign(CampaignView):
    """A named series of trials of one workload over one space, stored as it goes.

    Args:
        name: Campaign name in the store; an existing name resumes that campaign.
        space: The configurations to search.
        workload: Workload name (see ``cml.workloads.names()``); every parameter of the space
            must be one of its knobs. Constants and derived values that are knobs are passed too;
            the others are only recorded. Or a user's :class:`~cubicml_lab.workloads.Command`:
            its knobs are the space's names (and ``fixed``), each placeholder checked against
            them here; it travels with every trial and is stored for resume.
        launcher: Where trials run. Default: a fresh subprocess per trial.
        searcher: Proposes configurations. Default: ``BayesianSearch(space, seed=0)``.
        store: Where trials are kept. Default: ``TrialStore("data/lab.sqlite")``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; where the launcher runs trials on this
            machine, one it has (checked here, not at the first trial).
        measure_options: Overrides of :class:`~cubicml_lab.timing.MeasureOptions` fields,
            checked here by its rules.
        fixed: Workload knobs held fixed for every trial (not searched).
        reference: A configuration of the space to measure first (it is enqueued) and to
            compare the best against, e.g. the default way of training the model.

    Attributes:
        proposals: Proposals handed out by :meth:`propose` and not yet launched or skipped.
        stop_reason: Why the last :meth:`run` stopped (budget, stopping rule, interrupt).

    Raises:
        ConfigError: If a parameter of the space is not a knob of the workload, or ``device``,
            ``measure_options``, ``budget`` or ``parallel`` (when set) is not one that can run;
            the message names the field.
        StoreError: If the name exists in the store with another workload or space.
    """

    def __init__(
        self,
        name: str,
        space: Space,
        *,
        workload: str | Command,
        launcher: Launcher | None = None,
        searcher: Searcher | None = None,
        store: TrialStore | None = None,
        device: str = "cpu",
        measure_options: Mapping[str, Any] | None = None,
        fixed: Mapping[str, Any] | None = None,
        reference: Mapping[str, Any] | None = None,
    ) -> None:
        from .launch import Subprocess
        from .search import BayesianSearch
        from .workloads import Command, get

        self.name = name
        self.space = space
        # a user's command takes its knobs from the space (checked against it here)
        self.workload = (workload.bind(space, fixed) if isinstance(workload, Command)
                         else get(workload))
        self.launcher = launcher if launcher is not None else Subprocess()
        from .workloads import check_reachable

        check_reachable(self.workload.name, self.launcher)  # a notebook's object: InProcess only
        self.searcher = searcher if searcher is not None else BayesianSearch(space, seed=0)
        self.store = store if store is not None else TrialStore("data/lab.sqlite")
        self.device = check_device(device, self.launcher)
        self.measure_options = check_measure_options(measure_options)
        self.fixed = dict(fixed or {})
        self.stop_reason: str | None = None
        self._budget: int | None = None
        self._parallel = 1
        self.proposals: list[Proposal] = []
        self._told: set[int] = set()
        self._told_keys: set[str] = set()  # configurations told (a proposal of one: a repeat)
        self._observers: list[Callable[[str, Any], None]] = []
        self._resumed: list[Proposal] = []
        self._in_flight: dict[int, Proposal] = {}
        self._held: set[int] = set()  # trials running in another live process
        self._taking: set[int] = set()  # interrupted trials being taken to run (see _next)
        self._attach: dict[int, dict[str, Any]] = {}  # trial -> dead owner's record of its job
        self._stop = threading.Event()
        self._running = False  # run() in progress (stop() then only signals it)
        self._swept = False

        knobs = set(self.workload.default_config())
        not_knobs = [n for n in list(space.names) + list(self.fixed) if n not in knobs]
        if not_knobs:
            raise ConfigError(
                f"{not_knobs} are not knobs of workload {self.workload.name!r}",
                hint=f"its knobs: {', '.join(sorted(knobs))}",
            )
        if getattr(self.searcher, "space", space) != space:
            raise ConfigError(f"campaign {name!r}: the searcher was built on another space",
                              hint="pass the same Space to the searcher and the campaign")
        self._check_knob_values()
        self.reference = None
        if reference is not None:
            try:
                self.reference = self.space.project(dict(reference))
                self.space.validate(self.reference)
            except SpaceError as err:
                raise ConfigError(f"reference = {dict(reference)} is not a configuration of the "
                                  f"space: {err.message}", hint=err.hint or "") from None
        self._open_in_store()
        for key in self.store.campaign_info(name)["metadata"].get("skipped", []):
            skip = getattr(self.searcher, "skip", None)
            if callable(skip):
                skip(self.space.project(json.loads(key)))
        if self.reference is not None:
            enqueue = getattr(self.searcher, "enqueue", None)
            if callable(enqueue):
                enqueue(self.reference)

    @property
    def budget(self) -> int | None:
        """:meth:`run`'s default budget (a campaign file sets it); checked when set."""
        return self._budget

    @budget.setter
    def budget(self, value: int | None) -> None:
        self._budget = None if value is None else check_run_size("budget", value, self.launcher)

    @property
    def parallel(self) -> int:
        """:meth:`run`'s default trials in flight (1 unless a campaign file says otherwise);
        checked when set."""
        return self._parallel

    @parallel.setter
    def parallel(self, value: int) -> None:
        self._parallel = check_run_size("parallel", value, self.launcher)

    def _check_knob_values(self, most: int = 256) -> None:
        """Every value a discrete parameter can take must be one the workload accepts: all of
        them up to ``most``, else both ends and evenly spaced ones between (a wide ``Int`` is
        never listed; a bad value the check missed fails its trial, as data)."""
        base = self._workload_config(self.space.sample(1, seed=0)[0])
        for p in self.space.parameters:
            if p.is_discrete and p.name in base:
                values = p.values()
                n = len(values)
                picks = range(n) if n <= most else sorted({round(i * (n - 1) / (most - 1))
                                                          for i in range(most)})
                for i in picks:
                    self.workload.resolve({**base, p.name: values[i]})

    def _open_in_store(self) -> None:
        spec = self.space.to_dict()
        if self.name in self.store.campaigns():
            info = self.store.campaign_info(self.name)
            if info.get("space") not in (None, spec):
                raise StoreError(
                    f"campaign {self.name!r} already exists in {self.store.path} with another "
                    "space",
                    hint="give this campaign a new name, or rebuild the space it was run with "
                         "(Space.from_dict(store.campaign_info(name)['space']))",
                )
        self.store.create_campaign(
            self.name, space=spec, workload=self.workload.name,
            metadata={"objective": self.objective,
                      "direction": getattr(self.searcher, "direction", "maximize"),
                      "launcher": self.launcher.describe(), "device": self.device,
                      "measure_options": self.measure_options, "fixed": self.fixed,
                      "reference": self.reference, **self._command_spec()},
        )

    def _command_spec(self) -> dict[str, Any]:
        """``{"command": spec}`` for a user's command (it travels with each trial and is
        stored for resume), else ``{}``."""
        to_spec = getattr(self.workload, "to_spec", None)
        return {"command": to_spec()} if callable(to_spec) else {}

    # -- configuration plumbing ----------------------------------------------------------------
    def _workload_config(self, params: Mapping[str, Any]) -> dict[str, Any]:
        resolved = self.space.resolve(params)
        knobs = self.workload.default_config()
        cfg = {k: v for k, v in resolved.items() if k in knobs}
        cfg.update(self.fixed)
        return cfg

    def _record_config(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Everything a trial ran with: workload defaults, fixed knobs, resolved space values."""
        full = self.workload.resolve(self._workload_config(params))
        full.update(self.space.resolve(params))
        return full

    def _spec(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"workload": self.workload.name, "config": self._workload_config(params),
                "device": self.device, "measure": dict(self.measure_options),
                **self._command_spec()}

    def _tell(self, trial: Trial) -> None:
        if trial.id in self._told or trial.status not in FINAL_STATUSES:
            return
        params = {n: trial.config[n] for n in self.space.names}
        # every metric goes along: peak memory teaches the feasibility model, a second
        # objective or a noise metric may be read by the searcher
        self.searcher.tell(params, dict(trial.metrics or {}), status=trial.status)
        self._told.add(trial.id)
        self._told_keys.add(self.space.key(params))

    # -- events, proposals, single trials ------------------------------------------------------
    def observe(self, callback: Callable[[str, Any], None]) -> None:
        """Call ``callback(event, payload)`` as the campaign moves: ``"proposed"`` (a list of
        :class:`~cubicml_lab.search.Proposal`), ``"started"`` (trial id), ``"finished"`` (the
        stored :class:`~cubicml_lab.store.Trial`), ``"skipped"`` (a Proposal) and ``"stopped"``
        (the reason). Widgets use this to update live; an exception in a callback is shown as
        a warning, never allowed to end the campaign."""
        if not callable(callback):
            raise ConfigError(f"observe({callback!r:.60}): not callable",
                              hint="pass a function (event, payload) -> None")
        self._observers.append(callback)

    def _emit(self, event: str, payload: Any) -> None:
        import warnings

        for callback in list(self._observers):
            try:
                callback(event, payload)
            except Exception as err:  # a broken view must not end a campaign
                warnings.warn(f"campaign observer {callback!r:.60} failed on {event!r}: {err!r}",
                              stacklevel=2)

    def _sync(self) -> int:
        """Read the store: tell the searcher every finished trial it has not heard of, and queue
        the trials an interrupted run left ``pending`` or ``running`` (those are run again
        first; a running one is ended first if its campaign died, or held as pending if its
        campaign is alive elsewhere). Returns the number of finished trials."""
        if not self._swept:
            from .launch.process import sweep_trial_dirs

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
        from .launch.process import end_trial_process, owner_state

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
        from .launch.process import owner_state

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
            raise _interrupted(line) from None
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
        with _LIVE_LOCK:
            _LIVE.add(_live_key(self.store, trial_id))
        self._in_flight[trial_id] = p
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
        from .launch.process import trial_record

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
        hardware = {"process": dict(record)}
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

    def _forget_flight(self, trial_id: int) -> None:
        self._in_flight.pop(trial_id, None)
        with _LIVE_LOCK:
            _LIVE.discard(_live_key(self.store, trial_id))

    @staticmethod
    def _runs_here(t: Trial) -> bool:
        """A ``running`` trial claimed by this process (or with no record of who claimed it)."""
        from .launch.process import owner_state

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

    # -- the loop ------------------------------------------------------------------------------
    def run(self, budget: int | None = None, parallel: int | None = None, *,
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
                default :attr:`budget` (set by a campaign file).
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
        from tqdm.auto import tqdm

        budget = self.budget if budget is None else budget
        parallel = self.parallel if parallel is None else parallel
        if budget is None:
            raise ConfigError("budget is not set", hint="e.g. run(budget=12)")
        budget = check_run_size("budget", budget, self.launcher)
        parallel = check_run_size("parallel", parallel, self.launcher)
        # interrupted trials shown by propose() but not launched: run() takes them first
        self._resumed[:0] = [p for p in self.proposals if p.trial_id is not None]
        self.proposals = [p for p in self.proposals if p.trial_id is None]
        finished = self._sync()
        self.stop_reason = None
        self._stop.clear()
        bar = tqdm(total=budget, initial=min(finished, budget), desc=self.name, unit="trial",
                   disable=not progress, leave=True)
        write = bar.write if progress else print
        if self._resumed and verbose:
            followed = sum(p.trial_id in self._attach for p in self._resumed)
            rerun = len(self._resumed) - followed
            parts = [f"{rerun} interrupted trial(s) run again first"] if rerun else []
            parts += [f"{followed} Slurm job(s) of a dead run followed"] if followed else []
            write(f"resuming {self.name!r}: {finished} finished, {', '.join(parts)}")

        def report(trial_id: int, params: dict[str, Any], result: TrialResult,
                   trial: Trial) -> None:
            bar.update(1)
            if verbose:
                write(format_trial(trial_id, self.space, params, result, self.objective))
            if on_trial is not None:
                on_trial(trial)

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
        if stopped_by is not None:
            return self._stopped(stopped_by, list(in_flight.values()), full)
        if self.stop_reason is None:
            self.stop_reason = "budget reached"
        self._emit("stopped", self.stop_reason)
        if verbose:
            print(f"{self.name}: {finished} finished trials; stopped: {self.stop_reason}")
        return self.table(full=full)

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
            raise _interrupted(line) from None
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
        while True:
            finished = self._sync()
            if finished >= budget:
                break
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
        from .launch.process import owner_state

        for t in self.store.trials(self.name, status=["pending", "running"]):
            if t.id in self._in_flight:
                continue
            if t.status == "pending" or owner_state((t.hardware or {}).get("process")) == "alive":
                return True
        return False

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

    def _check_stop_rule(self) -> None:
        should_stop = getattr(self.searcher, "should_stop", None)
        if callable(should_stop) and self.stop_reason is None and should_stop():
            self.stop_reason = ("the searcher's stopping rule fired: "
                                f"{getattr(self.searcher, 'stop_reason', None) or ''}")

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

    @staticmethod
    def _result_of(fut: cf.Future[TrialResult]) -> TrialResult:
        try:
            return fut.result()
        except (LaunchError, _Taken):
            raise
        except Exception as err:  # a launcher bug must not lose the campaign: record it as data
            return _launcher_failure(err)

    # -- campaign files (cubicml_lab.campaign_file) -------------------------------------------
    def to_dict(self, budget: int | None = None, parallel: int | None = None) -> dict[str, Any]:
        """The campaign as plain data, the form of a campaign file (see :meth:`from_yaml`).

        Raises:
            ConfigError: The searcher holds what a file cannot (a cost model function, ...).
        """
        from .campaign_file import campaign_to_dict

        return campaign_to_dict(self, budget, parallel)

    def to_yaml(self, path: str | os.PathLike[str], budget: int | None = None,
                parallel: int | None = None) -> Path:
        """Write the campaign file that ``cubicml-lab run PATH`` (or :meth:`from_yaml`) starts
        or resumes, e.g. to let a long campaign live in tmux or as a job of its own."""
        from .campaign_file import write_campaign_file

        return write_campaign_file(self, path, budget, parallel)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], *,
                  allow_commands: bool = False) -> Campaign:
        """The campaign a campaign file describes, ready to :meth:`run` (budget and parallel
        from the file); see :func:`~cubicml_lab.campaign_file.campaign_from_file` for its keys.
        Checked like a space: unknown keys, bad values and a bad space, launcher or searcher are
        refused naming the field. A file is data until it names a program: a ``command``, a
        launcher's own interpreter or environment, Slurm setup lines or extra sbatch options
        make it a recipe, refused with the list of what it would run unless
        ``allow_commands=True`` (your consent to run it); see ``docs/threat-model.md``.

        Raises:
            ConfigError, SpaceError, StoreError: What is wrong, with the file's path.
        """
        from .campaign_file import campaign_from_file

        return campaign_from_file(cls, path, allow_commands=allow_commands)

    @classmethod
    def from_store(cls, store: TrialStore, name: str, **kwargs: Any) -> Campaign:
        """A campaign read back from a store, to look at or to continue.

        The space, workload, objective, measure options, fixed knobs and reference come from
        the stored record; ``kwargs`` (``launcher``, ``searcher``, ...) override them. The
        default searcher is ``BayesianSearch`` on the stored objective, told every finished
        trial.

        Raises:
            StoreError: If the campaign is unknown or was stored without its space.
        """
        from .search import BayesianSearch

        info = store.campaign_info(name)
        if info.get("space") is None or not info.get("workload"):
            raise StoreError(f"campaign {name!r} in {store.path} has no stored space or workload",
                             hint="only campaigns created by Campaign(...) can be read back")
        space = Space.from_dict(info["space"])
        meta = info["metadata"]
        from .workloads import Command

        args: dict[str, Any] = {
            "workload": (Command.from_spec(meta["command"]) if meta.get("command")
                         else info["workload"]), "store": store,
            "device": meta.get("device", "cpu"),
            "measure_options": meta.get("measure_options"), "fixed": meta.get("fixed"),
            "reference": meta.get("reference")}
        if "searcher" not in kwargs:
            args["searcher"] = BayesianSearch(space, objective=meta.get("objective", "throughput"),
                                              direction=meta.get("direction", "maximize"))
        args.update(kwargs)
        camp = cls(name, space, **args)
        camp._sync_told()
        return camp

    def _sync_told(self) -> None:
        for t in self.trials():
            self._tell(t)

    def recommend(self) -> tuple[dict[str, Any], float]:
        """:meth:`CampaignView.recommend`, the searcher first told the trials finished in the
        store since (by another process) unless this campaign is running; :meth:`best` where
        the searcher refuses one of them (a trial stored outside the space)."""
        if not self._running:
            try:
                self._sync_told()
            except SearchError:
                return self.best()
        return super().recommend()
