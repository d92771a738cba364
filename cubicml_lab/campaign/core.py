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
(:meth:`~cubicml_lab.store.TrialStore.claim_trial`), so together they finish exactly ``budget``.
The launchers end a trial process when its campaign dies, and the folders of dead campaigns' trials are swept when a campaign starts.

The campaign's rooms: this module builds it (what it checks, what each trial is given, whom it
tells); :mod:`~cubicml_lab.campaign.asking` proposes and reviews; :mod:`~cubicml_lab.campaign.loop`
launches, stores and tells, in parallel, up to a budget; :mod:`~cubicml_lab.campaign.recovery`
reads the store against the processes after a death or an interrupt;
:mod:`~cubicml_lab.campaign.view` shows it; :mod:`~cubicml_lab.campaign.files` reads and writes
campaign files; :mod:`~cubicml_lab.campaign.checks` checks its sizes and device.

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

import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, SearchError, SpaceError, StoreError
from ..search.cost import COST_METRIC
from ..search.proposal import Proposal
from ..space import Space
from ..store import FINAL_STATUSES, Trial, TrialStore
from .asking import Asking
from .checks import check_device, check_measure_options, check_run_size
from .loop import Loop
from .recovery import Recovery
from .view import CampaignView

if TYPE_CHECKING:
    from ..launch import Launcher
    from ..search import Searcher
    from ..workloads import Command

__all__ = ["Campaign"]


class Campaign(Loop, Asking, Recovery, CampaignView):
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
        from ..launch import Subprocess
        from ..search import BayesianSearch
        from ..workloads import Command, check_reachable, get

        self.name = name
        self.space = space
        # a user's command takes its knobs from the space (checked against it here)
        self.workload = (workload.bind(space, fixed) if isinstance(workload, Command)
                         else get(workload))
        self.launcher = launcher if launcher is not None else Subprocess()
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
        self._check_fits()
        self.reference = self._checked_reference(reference)
        self._open_in_store()
        self._restore_review()

    def _check_fits(self) -> None:
        """The space and fixed knobs are knobs of the workload, the searcher searches this
        space, and every value a discrete parameter can take is one the workload accepts."""
        knobs = set(self.workload.default_config())
        not_knobs = [n for n in list(self.space.names) + list(self.fixed) if n not in knobs]
        if not_knobs:
            raise ConfigError(
                f"{not_knobs} are not knobs of workload {self.workload.name!r}",
                hint=f"its knobs: {', '.join(sorted(knobs))}",
            )
        if getattr(self.searcher, "space", self.space) != self.space:
            raise ConfigError(f"campaign {self.name!r}: the searcher was built on another space",
                              hint="pass the same Space to the searcher and the campaign")
        self._check_knob_values()

    def _checked_reference(self, reference: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``reference`` as a configuration of the space (None: none)."""
        if reference is None:
            return None
        try:
            checked = self.space.project(dict(reference))
            self.space.validate(checked)
        except SpaceError as err:
            raise ConfigError(f"reference = {dict(reference)} is not a configuration of the "
                              f"space: {err.message}", hint=err.hint or "") from None
        return checked

    def _restore_review(self) -> None:
        """The searcher skips what the stored campaign skipped, and measures the reference
        first."""
        for key in self.store.campaign_info(self.name)["metadata"].get("skipped", []):
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
        spec = {"workload": self.workload.name, "config": self._workload_config(params),
                "device": self.device, "measure": dict(self.measure_options),
                **self._command_spec()}
        beat = self._beat() if self._early_stop is not None else None
        return spec if beat is None else {**spec, "beat": beat}

    def _beat(self) -> dict[str, Any] | None:
        """The best so far as a trial's spec carries it (``run(early_stop=True)``), with the
        margin by which a trial must lose before it is stopped, or None
        while the campaign has no ok trial. A trial's windows are raw step times, so the best
        is given raw too where its trial stored a raw figure (``throughput_raw``,
        ``step_time_raw_s``; the stored figure is drift-corrected, which may move it far from
        the raw one on a machine whose reference speed has changed); else as stored."""
        try:
            config, value = self.best()
        except SearchError:
            return None
        raw_name = {"step_time_s": "step_time_raw_s"}.get(self.objective, "throughput_raw")
        raws = [t.metrics.get(raw_name) for t in self.trials() if t.status == "ok"
                and {n: t.config.get(n) for n in config} == config
                and t.metrics.get(self.objective) == value]
        raw = next((float(r) for r in raws if isinstance(r, (int, float))
                    and not isinstance(r, bool) and 0 < r < float("inf")), None)
        return {"objective": self.objective, "value": float(value if raw is None else raw),
                "direction": getattr(self.searcher, "direction", "maximize"),
                "margin": self._early_stop}

    def _tell(self, trial: Trial) -> None:
        if trial.id in self._told or trial.status not in FINAL_STATUSES:
            return
        params = {n: trial.config[n] for n in self.space.names}
        # every metric goes along: peak memory teaches the feasibility model, a second
        # objective or a noise metric may be read by the searcher; and what the trial cost
        # (a searcher that weighs prices learns them: search.cost)
        values = dict(trial.metrics or {})
        if trial.device_seconds is not None:
            values.setdefault(COST_METRIC, trial.device_seconds)
        self.searcher.tell(params, values, status=trial.status)
        self._told.add(trial.id)
        self._told_keys.add(self.space.key(params))

    # -- events --------------------------------------------------------------------------------
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

    # -- campaign files and stores (cubicml_lab.campaign.files) ---------------------------------
    def to_dict(self, budget: int | None = None, parallel: int | None = None) -> dict[str, Any]:
        """The campaign as plain data, the form of a campaign file (see :meth:`from_yaml`).

        Raises:
            ConfigError: The searcher holds what a file cannot (a cost model function, ...).
        """
        from .files import campaign_to_dict

        return campaign_to_dict(self, budget, parallel)

    def to_yaml(self, path: str | os.PathLike[str], budget: int | None = None,
                parallel: int | None = None) -> Path:
        """Write the campaign file that ``cubicml-lab run PATH`` (or :meth:`from_yaml`) starts
        or resumes, e.g. to let a long campaign live in tmux or as a job of its own."""
        from .files import write_campaign_file

        return write_campaign_file(self, path, budget, parallel)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], *,
                  allow_commands: bool = False) -> Campaign:
        """The campaign a campaign file describes, ready to :meth:`run` (budget and parallel
        from the file); see :func:`~cubicml_lab.campaign.files.campaign_from_file` for its keys.
        Checked like a space: unknown keys, bad values and a bad space, launcher or searcher are
        refused naming the field. A file is data until it names a program: a ``command``, a
        launcher's own interpreter or environment, Slurm setup lines or extra sbatch options
        make it a recipe, refused with the list of what it would run unless
        ``allow_commands=True`` (your consent to run it); see ``docs/threat-model.md``.

        Raises:
            ConfigError, SpaceError, StoreError: What is wrong, with the file's path.
        """
        from .files import campaign_from_file

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
        from ..search import BayesianSearch

        info = store.campaign_info(name)
        if info.get("space") is None or not info.get("workload"):
            raise StoreError(f"campaign {name!r} in {store.path} has no stored space or workload",
                             hint="only campaigns created by Campaign(...) can be read back")
        space = Space.from_dict(info["space"])
        meta = info["metadata"]
        from ..workloads import Command

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
