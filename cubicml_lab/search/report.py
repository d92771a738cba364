"""What a Bayesian search reports: its recommendation, when to stop, the Pareto front, and
why it proposed what it did.

:class:`BayesianReport` is the reporting half of :class:`~cubicml_lab.search.BayesianSearch`:
it reads the models that the search fits (:class:`~cubicml_lab.search.fitting.BayesianModels`)
and never proposes anything itself.

**Stopping.** Each BO ask records the best feasibility-weighted expected improvement, relative to
the incumbent (with ``log_objective`` the expected improvement of ``log(objective)`` is already
relative: 0.005 is 0.5 %). :meth:`BayesianSearch.should_stop` fires when it has stayed below
``stop_threshold`` for ``stop_patience`` BO asks in a row; :attr:`stop_reason` says so in words.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import PredictorError, SearchError
from ..trials import figure_flag
from .calibration import PriorReport, prior_report
from .fitting import BayesianModels
from .proposal import Proposal

__all__ = ["BayesianReport"]


class BayesianReport(BayesianModels):
    """Recommendation, stopping rule, Pareto front and explained proposals of a Bayesian search
    (module doc). The search supplies :meth:`_current_data`, :meth:`_objective_fit` and
    :meth:`fit_predictor`.

    Attributes:
        improvement_trace: The best relative expected improvement of each BO ask, in order.
        stop_reason: Why :meth:`should_stop` fired, or None.
    """

    def _current_data(self) -> tuple:
        """``(configs, values, noise, covariate)`` the objective's GP is fitted on now."""
        raise NotImplementedError

    def _objective_fit(self, data: tuple, seed: int) -> Any:
        """The objective's GP on ``data``, fitted once per set of observations."""
        raise NotImplementedError

    def fit_predictor(self) -> Any:
        """Fit the search's models on the observations it holds now; return the GP."""
        raise NotImplementedError

    def _fit_reason(self) -> str:
        """Which observations :attr:`predictor` was fitted on, in words (a proposal's "why")."""
        n_fit = int(self.predictor.n_train)
        n_ok = sum(h["status"] == "ok" for h in self._history)
        left = n_ok - n_fit
        return f"GP on {n_fit} ok observations" + (
            f" ({left} contended left out: no trial carries a spread to weigh them by)"
            if left > 0 else "")

    def _explain(self, configs: list[dict], enqueued: list[bool]) -> list[Proposal]:
        """Proposals with the GP's prediction and 95% interval, P(runs) and the acquisition
        value of each pick (:mod:`~cubicml_lab.search.bayesian`); figures the searcher does not
        have yet stay None."""
        base = super()._explain(configs, enqueued)
        info = self.last_ask_info
        if base and all(enqueued):  # no proposing ask: the GP of everything told, if any
            try:
                self.fit_predictor()
            except SearchError:
                return base
        elif not base or info.get("phase") != "bo" or self.predictor is None:
            if info.get("phase") == "initial":  # before the GP: the initial design
                base = [p if p.phase == "enqueued" else replace(
                    p, reason=f"space-filling design ({info.get('reason', '')}): the untried "
                    "configuration farthest from everything tried") for p in base]
            return base
        lo, hi = self.predictor.predict_interval(configs)
        mid, _ = self.predictor.predict(configs)
        if self.direction == "minimize":  # the GP models 1 / objective (or -objective)
            mid, lo, hi = ((1.0 / mid, 1.0 / hi, 1.0 / lo) if self.log_objective
                           else (-mid, -hi, -lo))
        p_ok = (self.feasibility_model.predict(configs, memory_limit=self.memory_limit_gib)
                if self.feasibility_model is not None else [None] * len(configs))
        prior_note = self._prior_note()
        priced = "price_weight_of_picks" in info  # search.cost: the price weighed
        acq = list(info.get("acquisition") or [])
        picks = iter(acq[-sum(not q for q in enqueued):] if acq else [])
        out = []
        for i, (p, queued) in enumerate(zip(base, enqueued)):
            a = None if queued else next(picks, None)
            why = p.reason if queued else (
                f"highest {'hypervolume ' if self.second_objective else ''}expected improvement"
                f"{' x P(runs)' if self.feasibility_model is not None else ''}"
                f"{' / price^alpha' if priced else ''} among "
                f"{info.get('n_pool', 0):,} untried configurations ({info.get('reason', '')}"
                f"{'; ' + info['price'] if priced else ''})" + prior_note)
            out.append(replace(p, predicted=float(mid[i]), lower=float(lo[i]),
                               upper=float(hi[i]), acquisition=a, reason=why,
                               p_feasible=None if p_ok[i] is None else float(p_ok[i])))
        return out

    def prior_report(self) -> PriorReport:
        """What the trials taught the search about its ``cost_model``: which terms moved and
        by how much, the fitted slope, how well the model as given, the calibrated model and
        the GP predict the ok trials, and the memory model's misses
        (:mod:`~cubicml_lab.search.calibration`).

        Raises:
            SearchError: Without a cost model, with too few ok trials (``calibration.MIN_OK``),
                or when the GP cannot be fitted.
        """
        return prior_report(self)

    def _prior_note(self) -> str:
        """``"; <the report's headline>"`` when the prior is off, else "" (a proposal's why)."""
        if self.cost_model is None or self.second_objective is not None:
            return ""
        try:
            report = prior_report(self)
        except (SearchError, PredictorError):
            return ""
        return f"; {report.headline} (prior_report())" if report.prior_is_off else ""

    def recommend(self) -> tuple[dict, float]:
        """The measured configuration the GP rates best: ``(config, estimate)``.

        Of the configurations measured ok, the one with the highest posterior mean (by
        direction), and that mean in the objective's units. Under noise the best single
        measurement (:meth:`best`) is biased: it won partly by its own noise. The posterior mean
        weighs each figure by the noise it was told with and by its neighbours' figures (how
        often each rule picks the same configuration over stored demo campaigns: the results
        page in ``docs/``). A configuration measured only with flagged figures
        (:func:`~cubicml_lab.trials.figure_flag`: contended, or no interval) is not picked while
        another exists. Falls back to :meth:`best` while the GP cannot be
        fitted (fewer than 2 distinct ok configurations, a second objective, a failed fit).

        The GP is fitted on exactly the observations told so far (the fit an ask at this
        point makes, and shared with it), and the answer is kept until the next trial is
        told: a campaign's card and dashboard ask for it at every refresh.

        Raises:
            SearchError: If no trial has been told with status "ok".
        """
        with self._fit_lock:
            kept = self._recommended
            when = (self.n_told, self._history_in_use())
            if kept is not None and kept[0] == when:
                return dict(kept[1]), kept[2]
            config, estimate = self._recommend()
            self._recommended = ((self.n_told, self._history_in_use()), dict(config), estimate)
            return config, estimate

    def _recommend(self) -> tuple[dict, float]:
        if self.second_objective is not None:
            return self.best()
        data = self._current_data()
        configs, values = data[0], data[1]
        if not configs or self._not_ready(configs, values, 2, "the GP"):
            return self.best()
        try:
            pred = self._objective_fit(data, self._fit_seed())
        except PredictorError:
            return self.best()
        seen: dict[Any, dict] = {}
        for c in self._baseline(configs):  # a flagged figure alone: no best (Campaign.best())
            seen.setdefault(self.space.key(c), c)
        unique = list(seen.values())
        mu = np.asarray(pred.predict(unique)[0], dtype=np.float64)
        i = int(np.argmax(mu))
        est = float(mu[i])
        if self.direction == "minimize":
            est = 1.0 / est if self.log_objective else -est
        return dict(unique[i]), est

    def should_stop(self) -> bool:
        """True when the last ``stop_patience`` BO asks each expected less than
        ``stop_threshold`` relative improvement (feasibility-weighted); :attr:`stop_reason`
        then says so with the figures. Never while every ok figure is flagged
        (:func:`~cubicml_lab.trials.figure_flag`: contended or without an interval): the
        improvement is then measured against a bar nobody trusts, so the search goes on until
        one clean figure exists (:attr:`stop_reason` says it held off).

        Example:
            >>> from cubicml_lab.search import BayesianSearch
            >>> from cubicml_lab.space import Space, Int
            >>> s = BayesianSearch(Space([Int("micro_batch", 1, 8)]), seed=0)
            >>> s.should_stop()  # no BO ask yet
            False
        """
        recent = self.improvement_trace[-self.stop_patience:]
        if len(recent) < self.stop_patience or any(r >= self.stop_threshold for r in recent):
            return False
        ok = [h for h in self._history if h["status"] == "ok"]
        if ok and all(figure_flag(h["values"], self.objective) is not None for h in ok):
            self.stop_reason = (f"held off: all {len(ok)} ok figures are flagged (contended or "
                                "without an interval), so no improvement can be trusted yet")
            return False
        what = "hypervolume improvement" if self.second_objective else "improvement"
        self.stop_reason = (
            f"expected {what} below {100 * self.stop_threshold:g}% for {self.stop_patience} asks "
            f"in a row (last: {', '.join(f'{100 * r:.3g}%' for r in recent)})")
        return True

    def pareto(self) -> list[dict[str, Any]]:
        """The non-dominated ok trials on (objective, second_objective).

        Returns:
            One dict per Pareto-optimal trial, ``{"config", <objective>, <second_objective>}``,
            sorted by the objective, best first.

        Raises:
            SearchError: Without ``second_objective``.
        """
        if self.second_objective is None:
            raise SearchError("pareto() needs two objectives",
                              hint="BayesianSearch(..., second_objective='peak_mem_gib')")
        rows = [h for h in self._history if h["status"] == "ok"
                and self.second_objective in h["values"]]
        sign = np.array([1.0 if self.direction == "maximize" else -1.0,
                         1.0 if self.second_direction == "maximize" else -1.0])
        Y = np.array([[h["value"], h["values"][self.second_objective]] for h in rows]) * sign
        front = [i for i in range(len(rows))
                 if not any((Y[j] >= Y[i]).all() and (Y[j] > Y[i]).any() for j in range(len(rows)))]
        front.sort(key=lambda i: -Y[i, 0])
        return [{"config": dict(rows[i]["config"]), self.objective: rows[i]["value"],
                 self.second_objective: rows[i]["values"][self.second_objective]} for i in front]
