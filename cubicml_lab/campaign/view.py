"""Reading a campaign back: its trials, the best so far against the reference, and how it shows.

:class:`CampaignView` is the part of :class:`~cubicml_lab.Campaign` that only reads the store:
the trials (as :class:`~cubicml_lab.store.Trial` objects or a DataFrame), the best finished
trial, the reference configuration's measured value and the speed-up over it, a summary a person
glances at, and the campaign's HTML card in Jupyter (and readable line elsewhere).

Example:
    >>> import os, tempfile, cubicml_lab as cml
    >>> space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 8)])
    >>> store = cml.TrialStore(os.path.join(tempfile.mkdtemp(), "lab.sqlite"))
    >>> camp = cml.Campaign("gpt-cpu", space, workload="gpt", store=store)
    >>> camp.summary()["trials"], camp.summary()["best"]
    (0, None)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import CubicMLError, SearchError
from ..store import FINAL_STATUSES
from ..trials import TrialResult, error_summary, figure_flag, is_contended, is_stopped_early
from .state import CampaignState

if TYPE_CHECKING:
    import pandas as pd

    from ..space import Space
    from ..store import Trial

__all__ = ["CampaignView", "format_trial", "status_counts"]


class CampaignView(CampaignState):
    """What a :class:`~cubicml_lab.Campaign` shows of itself; it reads the store and changes
    nothing."""

    @property
    def objective(self) -> str:
        """The metric the searcher optimises (``throughput`` by default)."""
        return getattr(self.searcher, "objective", "throughput")

    def trials(self) -> list[Trial]:
        """Every trial of this campaign in the store, by id."""
        return self.store.trials(self.name)

    def dataframe(self) -> pd.DataFrame:
        """Every field of every trial of the campaign, one row each: ``table(full=True)``."""
        return self.store.to_dataframe(self.name)

    def table(self, *, full: bool = False) -> pd.DataFrame:
        """The campaign's trials, one row each, as a person reads them.

        Args:
            full: Every field instead: each config key, metric and hardware field a column,
                times in unix seconds (:meth:`~cubicml_lab.store.TrialStore.to_dataframe`, what
                analysis and the plots take; the same as :meth:`dataframe`).

        Returns:
            By default ``trial_id``, ``status``, the searched knobs, the objective and its
            relative 95% CI, the unit-named metrics (``tokens_per_s``, ``step_time_s``,
            ``peak_mem_gib``, ``mfu``, ...) the trials have, ``contended``, ``started_at``
            (local time, a datetime), ``duration_s`` and the last line of ``error``
            (:func:`~cubicml_lab.store.tables.readable_frame`).
        """
        if full:
            return self.dataframe()
        from ..store.tables import readable_frame

        return readable_frame(self.trials(), self.space.names, self.objective)

    def best(self) -> tuple[dict[str, Any], float]:
        """The best finished ``ok`` trial's searched parameters and objective value.

        A flagged figure (:func:`~cubicml_lab.trials.figure_flag`: the contention guard
        flagged it, its figure measured while other work shared the cores, or its 95% CI is
        unknown, a figure from a single window) is not taken as the best while an unflagged
        ``ok`` trial exists: it may be noise, whichever way it went. A review rule that
        compares proposals with ``best()`` so compares them with a figure to trust.
        """
        direction = getattr(self.searcher, "direction", "maximize")
        ok = [t for t in self.trials() if t.status == "ok" and self.objective in t.metrics]
        if not ok:
            raise SearchError(f"campaign {self.name!r} has no successful trial yet",
                              hint="run it, or look at the errors with campaign.dataframe()")
        ok = _unflagged_first(ok, self.objective)
        pick = max if direction == "maximize" else min
        best = pick(ok, key=lambda t: t.metrics[self.objective])
        return {n: best.config[n] for n in self.space.names}, float(best.metrics[self.objective])

    def recommend(self) -> tuple[dict[str, Any], float]:
        """The configuration to run, with its measured value: the searcher's pick among the
        configurations it was told measured where it makes one
        (:meth:`~cubicml_lab.BayesianSearch.recommend`: the highest posterior mean, which weighs
        each figure by its noise and its neighbours', where the best single measurement won
        partly by its own noise), else :meth:`best`. The value is :meth:`measured_value` (the
        median of its ok trials).

        Raises:
            SearchError: If the campaign has no successful trial yet.
        """
        pick = getattr(self.searcher, "recommend", None)
        if pick is not None:
            try:
                config, _ = pick()
            except SearchError:  # told nothing yet (trials another process stored)
                return self.best()
            config = {n: config[n] for n in self.space.names}
            value = self.measured_value(config)
            if value is not None:
                return config, value
        return self.best()

    def device_seconds(self) -> float:
        """What the campaign's finished trials cost: the sum of their
        :attr:`~cubicml_lab.store.Trial.device_seconds` (devices x wall-clock seconds, start-up
        included), across every run and process that stored them. ``/ 3600``: device-hours,
        what ``run(budget_device_hours=...)`` counts."""
        return spent_s(self.trials())

    def prior_report(self) -> Any:
        """What the trials taught the searcher about its physics prior: which cost terms moved
        and by how much, and how well the calibrated model predicts
        (:meth:`BayesianSearch.prior_report <cubicml_lab.search.BayesianSearch.prior_report>`).

        Raises:
            SearchError: If the searcher has no cost model (or is not a Bayesian search), or
                has too few ok trials.
        """
        report = getattr(self.searcher, "prior_report", None)
        if report is None or getattr(self.searcher, "cost_model", None) is None:
            raise SearchError(f"{type(self.searcher).__name__} has no physics prior to report on",
                              hint="Campaign(..., searcher=BayesianSearch(space, "
                                   "cost_model=job.cost_terms))")
        return report()

    def _prior_headline(self) -> str | None:
        """The prior report's one line, or None (no prior, too few trials, no fit)."""
        try:
            return self.prior_report().headline
        except CubicMLError:
            return None

    def reference_value(self) -> float | None:
        """The objective measured for :attr:`reference` (:meth:`measured_value`), or None."""
        return None if self.reference is None else self.measured_value(self.reference)

    def measured_value(self, config: dict[str, Any]) -> float | None:
        """The objective measured for ``config``: the median over its ok trials whose figure
        is not flagged (:func:`~cubicml_lab.trials.figure_flag`: contended, or no interval;
        over all its ok trials where every one is), or None."""
        values = [float(t.metrics[self.objective])
                  for t in _unflagged_first(self._measured(config), self.objective)]
        return statistics.median(values) if values else None

    def measured_flagged(self, config: dict[str, Any]) -> bool:
        """Whether ``config`` was measured and every one of its ok trials flagged by the
        contention guard: :meth:`measured_value` is then a figure from a busy machine."""
        ok = self._measured(config)
        return bool(ok) and all(is_contended(t.metrics) for t in ok)

    def _measured(self, config: dict[str, Any]) -> list[Trial]:
        """``config``'s ok trials that carry the objective."""
        key = self.space.key(config)
        return [t for t in self.trials()
                if t.status == "ok" and self.objective in t.metrics
                and self.space.key({n: t.config[n] for n in self.space.names}) == key]

    def summary(self) -> dict[str, Any]:
        """What a person glances at: trials by status, the best so far against the reference,
        why the last run stopped, the proposals waiting.

        Returns:
            A dict with ``trials`` (count), ``by_status`` ({status: count}), ``contended``
            (ok trials the contention guard flagged), ``best_config``, ``best`` (objective
            value: the best single measurement), ``recommended_config`` and ``recommended``
            (:meth:`recommend`: the searcher's pick and its measured value), ``reference`` (its
            value), ``speedup`` (recommended / reference, for a maximised objective),
            ``stop_reason``, ``waiting``, ``prior`` (with a physics prior and enough ok trials:
            :meth:`prior_report`'s headline, else None), ``device_s`` (what the finished
            trials cost: :meth:`device_seconds`).
        """
        trials = self.trials()
        by_status: dict[str, int] = {}
        for t in trials:
            by_status[t.status] = by_status.get(t.status, 0) + 1
        contended = sum(t.status == "ok" and is_contended(t.metrics) for t in trials)
        try:
            (best_config, best), (rec_config, rec) = self.best(), self.recommend()
        except SearchError:
            best_config = best = rec_config = rec = None
        ref = self.reference_value()
        speedup = None
        if rec is not None and ref:
            maximize = getattr(self.searcher, "direction", "maximize") == "maximize"
            speedup = rec / ref if maximize else ref / rec
        return {"trials": len(trials), "by_status": by_status, "contended": contended,
                "best_config": best_config, "best": best,
                "recommended_config": rec_config, "recommended": rec,
                "reference": ref, "speedup": speedup,
                "stop_reason": self.stop_reason, "waiting": len(self.proposals),
                "prior": self._prior_headline() if trials else None,
                "device_s": spent_s(trials)}

    def _facts(self) -> list[tuple[str, Any]]:
        from .._html import fmt, knobs

        s = self.summary()
        facts: list[tuple[str, Any]] = [
            ("workload", self.workload.name), ("launcher", repr(self.launcher)),
            ("searcher", type(self.searcher).__name__), ("store", str(self.store.path)),
            ("trials", status_counts(s) or "none yet")]
        if s["best"] is not None:
            facts.append((f"best {self.objective}", s["best"]))
            facts.append(("best config", knobs(s["best_config"])))
        if s["recommended"] is not None and s["recommended_config"] != s["best_config"]:
            facts.append(("recommended", f"{knobs(s['recommended_config'])}: "
                          f"{fmt(s['recommended'])} measured, rated higher by the searcher's "
                          "model (the best single figure won partly by its noise)"))
        if s["reference"] is not None:
            facts.append((f"reference {self.objective}", s["reference"]))
        if s["speedup"] is not None:
            what = "recommended" if s["recommended_config"] != s["best_config"] else "best"
            facts.append((f"speed-up over reference ({what})", f"{s['speedup']:.2f}x"))
        if s["device_s"]:
            facts.append(("spent", device_time(s["device_s"])))
        if s["stop_reason"]:
            facts.append(("stopped", s["stop_reason"]))
        if s["prior"]:
            facts.append(("physics prior", s["prior"]))
        return facts

    def __repr__(self) -> str:
        return (f"Campaign({self.name!r}, workload={self.workload.name!r}, "
                f"store={str(self.store.path)!r}, trials={len(self.trials())})")

    def __str__(self) -> str:
        from .._html import fmt

        return f"Campaign {self.name!r}\n" + "\n".join(f"  {k}: {fmt(v)}"
                                                     for k, v in self._facts())

    def _repr_html_(self) -> str:
        from .._html import card

        return card(f"Campaign '{self.name}'", self._facts(),
                    note="campaign.table(): one row per trial; table(full=True): every field")

    def wall_time_s(self) -> float:
        """Seconds from the first trial's start to the last trial's end."""
        times = [(t.started_at, t.ended_at) for t in self.trials() if t.started_at and t.ended_at]
        return max(e for _, e in times) - min(s for s, _ in times) if times else 0.0


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
        flag += ("  [stopped early: cannot beat the best; at most this fast]"
                 if is_stopped_early(m) else "")
        return (f"trial {trial_id:>3}  ok       {shown} {ci}  "
                f"step {step:.3f} s  {knobs}{flag}")
    short = error_summary(result.error, 80)
    return f"trial {trial_id:>3}  {result.status:<8} {'-':>21}  {knobs}  [{short}]"


def status_counts(summary: dict[str, Any]) -> str:
    """``"12 ok (2 contended), 1 oom"`` from :meth:`CampaignView.summary`: trials by status, and
    how many of the ok ones the contention guard flagged (their figures are not trusted)."""
    flagged = summary.get("contended", 0)
    return ", ".join(f"{n} {st}" + (f" ({flagged} contended)" if st == "ok" and flagged else "")
                     for st, n in summary.get("by_status", {}).items())


def _unflagged_first(trials: list[Trial], objective: str) -> list[Trial]:
    """The trials whose figure is not flagged (:func:`~cubicml_lab.trials.figure_flag`:
    contended, or no interval), or all of them where every one is (a flagged figure may be
    noise, whichever way it went, while a clean one exists)."""
    trials = [t for t in trials if not is_stopped_early(t.metrics)] or trials  # never the best
    return [t for t in trials if figure_flag(t.metrics, objective) is None] or trials


def spent_s(trials: list[Trial]) -> float:
    """The device-seconds the finished ``trials`` cost (:attr:`Trial.device_seconds`)."""
    return float(sum(t.device_seconds or 0.0 for t in trials if t.status in FINAL_STATUSES))


def device_time(seconds: float) -> str:
    """Device time as a person reads it: ``"42 device-s"``, ``"3.5 device-min"`` or
    ``"2.1 device-h"``.

    Example:
        >>> device_time(30), device_time(210), device_time(7560)
        ('30 device-s', '3.5 device-min', '2.1 device-h')
    """
    if seconds < 120:
        return f"{seconds:.0f} device-s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} device-min"
    return f"{seconds / 3600:.3g} device-h"
