"""The co-design loop: ask the searcher, launch trials, measure, store, tell.

A :class:`Campaign` ties a :class:`~cubicml_lab.Space`, a workload, a launcher, a searcher and a
:class:`~cubicml_lab.store.TrialStore` together under a name. ``run(budget)`` keeps up to
``parallel`` trials in flight until the campaign holds ``budget`` finished trials. Every trial is
written to the store before it starts (``pending``), while it runs (``running``) and when it ends
(``ok``, ``oom``, ``failed`` or ``timeout``): a failure is data that the searcher is told about,
never an exception that ends the campaign.

A campaign whose name already has trials in the store resumes: finished trials are told to the
searcher, and trials left ``pending`` or ``running`` by an interrupted run (a closed notebook, a
killed process) are run again first.

Example:
    >>> import cubicml_lab as cml  # doctest: +SKIP
    >>> camp = cml.Campaign("gpt-cpu", space, workload="gpt", store=cml.TrialStore("data/lab.sqlite"))
    >>> camp.run(budget=12)                                  # a pandas DataFrame, one row per trial
"""

from __future__ import annotations

import concurrent.futures as cf
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, LaunchError, SearchError, StoreError
from .measure import TrialResult
from .space import Space
from .store import FINAL_STATUSES, Trial, TrialStore

if TYPE_CHECKING:
    import pandas as pd

    from .launch import Launcher
    from .search import Searcher

__all__ = ["Campaign", "format_trial"]


def format_trial(trial_id: int, space: Space, config: Mapping[str, Any], result: TrialResult,
                 objective: str) -> str:
    """One line per finished trial: id, status, objective, step time and the searched knobs."""
    knobs = " ".join(f"{n}={config[n]}" for n in space.names)
    if result.status == "ok":
        m = result.metrics
        unit = "tokens/s" if "tokens_per_s" in m else "units/s"
        value = m.get(objective, math.nan)
        shown = f"{value:>12,.0f} {unit}" if objective == "throughput" else f"{objective}={value:.4g}"
        spread = m.get("step_time_rel_ci", math.nan)
        return (f"trial {trial_id:>3}  ok       {shown}  step {m.get('step_time_s', math.nan):.3f} s "
                f"(±{100 * spread:.1f}%)  {knobs}")
    reason = (result.error or "").strip().splitlines()
    short = reason[-1][:80] if reason else ""
    return f"trial {trial_id:>3}  {result.status:<8} {'-':>21}  {knobs}  [{short}]"


class Campaign:
    """A named series of trials of one workload over one space, stored as it goes.

    Args:
        name: Campaign name in the store; an existing name resumes that campaign.
        space: The configurations to search.
        workload: Workload name (see ``cml.workloads.names()``); every parameter of the space
            must be one of its knobs. Constants and derived values that are knobs are passed too;
            the others are only recorded.
        launcher: Where trials run. Default: a fresh subprocess per trial.
        searcher: Proposes configurations. Default: ``BayesianSearch(space, seed=0)``.
        store: Where trials are kept. Default: ``TrialStore("data/lab.sqlite")``.
        device: ``"cpu"`` or ``"cuda"``.
        measure_options: Overrides of :class:`~cubicml_lab.measure.MeasureOptions` fields.
        fixed: Workload knobs held fixed for every trial (not searched).

    Raises:
        ConfigError: If a parameter of the space is not a knob of the workload.
        StoreError: If the name exists in the store with another workload or space.
    """

    def __init__(
        self,
        name: str,
        space: Space,
        *,
        workload: str,
        launcher: Launcher | None = None,
        searcher: Searcher | None = None,
        store: TrialStore | None = None,
        device: str = "cpu",
        measure_options: Mapping[str, Any] | None = None,
        fixed: Mapping[str, Any] | None = None,
    ) -> None:
        from .launch import Subprocess
        from .search import BayesianSearch
        from .workloads import get

        self.name = name
        self.space = space
        self.workload = get(workload)
        self.launcher = launcher if launcher is not None else Subprocess()
        self.searcher = searcher if searcher is not None else BayesianSearch(space, seed=0)
        self.store = store if store is not None else TrialStore("data/lab.sqlite")
        self.device = device
        self.measure_options = dict(measure_options or {})
        self.fixed = dict(fixed or {})
        self.stop_reason: str | None = None
        self._told: set[int] = set()

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
        self._open_in_store()

    def _check_knob_values(self) -> None:
        """Every value a discrete parameter can take must be one the workload accepts."""
        base = self._workload_config(self.space.sample(1, seed=0)[0])
        for p in self.space.parameters:
            if p.is_discrete and p.name in base:
                for value in p.values():
                    self.workload.resolve({**base, p.name: value})

    @property
    def objective(self) -> str:
        return getattr(self.searcher, "objective", "throughput")

    def _open_in_store(self) -> None:
        spec = self.space.to_dict()
        if self.name in self.store.campaigns():
            info = self.store.campaign_info(self.name)
            if info.get("space") not in (None, spec):
                raise StoreError(
                    f"campaign {self.name!r} already exists in {self.store.path} with another space",
                    hint="give this campaign a new name, or rebuild the space it was run with "
                         "(Space.from_dict(store.campaign_info(name)['space']))",
                )
        self.store.create_campaign(
            self.name, space=spec, workload=self.workload.name,
            metadata={"objective": self.objective,
                      "direction": getattr(self.searcher, "direction", "maximize"),
                      "launcher": self.launcher.describe(), "device": self.device,
                      "measure_options": self.measure_options, "fixed": self.fixed},
        )

    # -- configuration plumbing ----------------------------------------------------------------
    def _workload_config(self, params: Mapping[str, Any]) -> dict[str, Any]:
        resolved = self.space.resolve(params)
        knobs = self.workload.default_config()
        cfg = {k: v for k, v in resolved.items() if k in knobs}
        cfg.update(self.fixed)
        return cfg

    def _record_config(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Everything a trial ran with: workload defaults, fixed knobs, the resolved space values."""
        full = self.workload.resolve(self._workload_config(params))
        full.update(self.space.resolve(params))
        return full

    def _spec(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"workload": self.workload.name, "config": self._workload_config(params),
                "device": self.device, "measure": dict(self.measure_options)}

    def _tell(self, trial: Trial) -> None:
        if trial.id in self._told or trial.status not in FINAL_STATUSES:
            return
        params = {n: trial.config[n] for n in self.space.names}
        # every metric goes along: peak memory teaches the feasibility model, a second
        # objective or a noise metric may be read by the searcher
        self.searcher.tell(params, dict(trial.metrics or {}), status=trial.status)
        self._told.add(trial.id)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, budget: int, parallel: int = 1, *, progress: bool = True,
            verbose: bool = True, on_trial: Callable[[Trial], None] | None = None) -> pd.DataFrame:
        """Run until the campaign holds ``budget`` finished trials (resuming if it has some).

        Args:
            budget: Total finished trials wanted in this campaign, counting earlier runs.
            parallel: Trials in flight at once (one launcher call each, in threads).
            progress: Show a tqdm progress bar (works in notebooks and terminals).
            verbose: Print one line per finished trial.
            on_trial: Called with each finished :class:`~cubicml_lab.store.Trial`.

        Returns:
            The campaign's trials as a DataFrame (``store.to_dataframe(name)``).
        """
        from tqdm.auto import tqdm

        if not isinstance(budget, int) or budget < 1:
            raise ConfigError(f"budget = {budget!r} must be a positive int", hint="e.g. budget=12")
        if not isinstance(parallel, int) or parallel < 1:
            raise ConfigError(f"parallel = {parallel!r} must be a positive int", hint="e.g. 1")
        trials = self.store.trials(self.name)
        for t in trials:
            self._tell(t)
        finished = sum(t.status in FINAL_STATUSES for t in trials)
        interrupted = [t for t in trials if t.status not in FINAL_STATUSES]
        for t in interrupted:
            if t.status == "running":
                self.store.reset_trial(t.id)
        self.stop_reason = None
        bar = tqdm(total=budget, initial=min(finished, budget), desc=self.name, unit="trial",
                   disable=not progress, leave=True)
        write = bar.write if progress else print
        if interrupted and verbose:
            write(f"resuming {self.name!r}: {finished} finished, {len(interrupted)} interrupted "
                  "trial(s) run again first")
        queue = [(t.id, {n: t.config[n] for n in self.space.names}) for t in interrupted]
        in_flight: dict[cf.Future[TrialResult], tuple[int, dict[str, Any]]] = {}
        pool = cf.ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="trial")
        try:
            while finished < budget:
                room = min(parallel - len(in_flight), budget - finished - len(in_flight))
                new = self._next(room, queue) if room > 0 and self.stop_reason is None else []
                for trial_id, params in new:
                    self.store.mark_running(trial_id)
                    in_flight[pool.submit(self.launcher.run, self._spec(params))] = (trial_id, params)
                if not in_flight:
                    break
                done, _ = cf.wait(in_flight, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    trial_id, params = in_flight.pop(fut)
                    result = self._result_of(fut)
                    self.store.finish_trial(trial_id, status=result.status, metrics=result.metrics,
                                            hardware=result.hardware, error=result.error)
                    trial = self.store.get_trial(trial_id)
                    self._tell(trial)
                    finished += 1
                    bar.update(1)
                    if verbose:
                        write(format_trial(trial_id, self.space, params, result, self.objective))
                    if on_trial is not None:
                        on_trial(trial)
                should_stop = getattr(self.searcher, "should_stop", None)
                if callable(should_stop) and self.stop_reason is None and should_stop():
                    self.stop_reason = ("the searcher's stopping rule fired: "
                                        f"{getattr(self.searcher, 'stop_reason', None) or ''}")
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            bar.close()
        if self.stop_reason is None:
            self.stop_reason = "budget reached"
        if verbose:
            print(f"{self.name}: {finished} finished trials; stopped: {self.stop_reason}")
        return self.store.to_dataframe(self.name)

    def _next(self, room: int, queue: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict]]:
        out = []
        while queue and len(out) < room:
            out.append(queue.pop(0))
        if len(out) < room:
            try:
                configs = self.searcher.ask(room - len(out))
            except SearchError as err:
                self.stop_reason = f"search space exhausted ({err.message})"
                configs = []
            for params in configs:
                trial_id = self.store.add_trial(self.name, self._record_config(params),
                                                workload=self.workload.name,
                                                workload_version=self.workload.version)
                out.append((trial_id, params))
        return out

    @staticmethod
    def _result_of(fut: cf.Future[TrialResult]) -> TrialResult:
        try:
            return fut.result()
        except LaunchError:
            raise
        except Exception as err:  # a launcher bug must not lose the campaign: record it as data
            import traceback

            tail = "".join(traceback.format_exception(err)[-6:])
            return TrialResult(status="failed", metrics={}, hardware={},
                               error=f"launcher raised {type(err).__name__}: {err}\n{tail}")

    # -- reading back --------------------------------------------------------------------------
    def trials(self) -> list[Trial]:
        """Every trial of this campaign in the store, by id."""
        return self.store.trials(self.name)

    def dataframe(self) -> pd.DataFrame:
        """The campaign's trials as a DataFrame (one row per trial)."""
        return self.store.to_dataframe(self.name)

    def best(self) -> tuple[dict[str, Any], float]:
        """The best finished ``ok`` trial's searched parameters and objective value."""
        direction = getattr(self.searcher, "direction", "maximize")
        ok = [t for t in self.trials() if t.status == "ok" and self.objective in t.metrics]
        if not ok:
            raise SearchError(f"campaign {self.name!r} has no successful trial yet",
                              hint="run it, or look at the errors with campaign.dataframe()")
        pick = max if direction == "maximize" else min
        best = pick(ok, key=lambda t: t.metrics[self.objective])
        return {n: best.config[n] for n in self.space.names}, float(best.metrics[self.objective])

    def wall_time_s(self) -> float:
        """Seconds from the first trial's start to the last trial's end."""
        times = [(t.started_at, t.ended_at) for t in self.trials() if t.started_at and t.ended_at]
        return max(e for _, e in times) - min(s for s, _ in times) if times else 0.0

