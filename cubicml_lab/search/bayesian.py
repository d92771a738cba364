"""Bayesian optimisation over a discrete pool: a GP on log(objective), noisy expected improvement.

:class:`BayesianSearch` runs in two phases, each in a module of its own.

1. **Before the GP**: with a prior (a ``cost_model``, or ``history``) the prior's best
   predicted-feasible configurations until ``PRIOR_MIN_OK`` (2) ok observations exist
   (:mod:`~cubicml_lab.search.prior`, which also holds "Transfer": how history enters the GP's
   prior mean); without one, a space-filling **initial design** until ``n_init`` trials were
   told (:mod:`~cubicml_lab.search.design`). While every trial failed and no memory model says
   why, the space-filling design stands in for the prior's picks until one trial runs.
2. **BO**: a :class:`~cubicml_lab.surrogate.GPPredictor` (``SingleTaskGP``, ``Normalize`` /
   ``Standardize``, float64) is fitted on ``log(objective)`` of the ok observations (on
   ``log(1 / objective)`` when minimising, so a larger model output is always better), and the
   acquisition (:mod:`~cubicml_lab.search.acquisition`: noisy expected improvement weighted by
   the probability of running, or the hypervolume improvement of two objectives) picks from the
   untried pool. The hyperparameters are fitted from scratch only every 25 % of growth of
   the history and warm-started in between (``BayesianSearch._fit``). Every fit is of exactly
   the observations told so far, kept under a key that holds them all, and shared by the ask,
   :meth:`BayesianSearch.recommend` and :meth:`BayesianSearch.fit_predictor` at that point
   (``predictor.n_train`` is what a proposal's "why" counts); so asking for a recommendation
   early changes no later proposal.

Its knobs are one record, :class:`~cubicml_lab.search.options.BayesianOptions`; what each
phase picks is :mod:`~cubicml_lab.search.phases`.

If the GP cannot be fitted (fewer than 2 distinct ok configurations, all ok values identical, or a
numerical failure) that ask falls back to the space-filling step; :attr:`last_ask_info` says why.

**Failures.** Failed trials (oom, failed, timeout) do not enter the objective's GP; they are never
proposed again, and they teach a :class:`~cubicml_lab.surrogate.FeasibilityModel` (a GP classifier
of ran/failed, and with ``memory_limit_gib`` a log peak-memory GP) whose probability of running
weights the acquisition. Before the first failure (and without a memory limit) the weight is 1.

**Memory model.** ``memory_model`` (config -> predicted peak GiB per GPU, e.g.
``cml.analytical.LLMTrainingModel(...).memory_gib``) with ``memory_limit_gib`` seeds the
feasibility model: from the first ask, configurations predicted not to fit get a low probability
of running, and every trial corrects the prediction (the GP then models measured / predicted
memory; an out-of-memory trial is a censored observation above the limit: see
:class:`~cubicml_lab.surrogate.FeasibilityModel`). In BO it also bounds the acquisition's bets
(``BO_P_FEASIBLE``); the prior's first picks keep to ``PRIOR_P_FEASIBLE`` alike. A memory model
is evaluated once per configuration (cached), through its vectorised twin when it has one
(``memory_gib_frame``, :func:`~cubicml_lab.surrogate.terms.batch_method`); so is a cost model
(``cost_terms_frame``).

**Machine drift.** With ``learn_drift`` the objective's GP learns how much of the drift
reference's slowdown to take out of each trial (:mod:`~cubicml_lab.search.drift`);
:attr:`BayesianSearch.drift_exponent` holds the exponent of the last fit.

**Two objectives.** With ``second_objective`` (e.g. ``"peak_mem_gib"``, minimised by default) the
search models both (a GP each, on logs) and maximises the expected hypervolume improvement
(:mod:`~cubicml_lab.search.acquisition`); :meth:`BayesianSearch.pareto` returns the
non-dominated trials. The stopping rule then reads the expected hypervolume improvement relative
to the current hypervolume.

Determinism: torch and numpy are seeded from ``(seed, n_told)`` at each ask, so a searcher told the
same history proposes the same configurations (a resumed campaign continues as if it had never
stopped).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PredictorError, SearchError
from ..trials import is_stopped_early
from .acquisition import BO_P_FEASIBLE, log_ei_standard
from .drift import DRIFT_ROUNDS, DRIFT_TOL, at_drift_exponent, drift_covariate, learn_drift
from .fitting import CONTENDED_REL_NOISE, FEASIBILITY_MAX_ITER, NOISE_METRICS, observed_noise
from .history import HistoryModel
from .options import MAX_MC_SAMPLES, MAX_N_INIT, BayesianOptions, default_n_init
from .phases import BayesianPhases
from .prior import PRIOR_MIN_OK, PriorTerms
from .report import BayesianReport

#: The relative 95% CI taken for a trial stopped early that carries none (its bound's width).
STOPPED_REL_CI = 0.10

if TYPE_CHECKING:
    from ..space import Space

# names that lived here before the search was split (tests and notebooks import them from here)
_PriorTerms = PriorTerms
_REEXPORTED = (BO_P_FEASIBLE, CONTENDED_REL_NOISE, DRIFT_ROUNDS, DRIFT_TOL, FEASIBILITY_MAX_ITER,
               MAX_MC_SAMPLES, MAX_N_INIT, NOISE_METRICS, log_ei_standard)

__all__ = ["BayesianOptions", "BayesianSearch", "at_drift_exponent", "default_n_init",
           "drift_covariate", "learn_drift", "observed_noise"]

#: L-BFGS-B iterations of a warm-started hyperparameter fit (see ``BayesianSearch._fit``).
WARM_MAX_ITER = 40
#: From this many observations on, a warm fit keeps its anchor's hyperparameters (conditions on
#: every trial, no iterations): one more trial among hundreds barely moves them, and the
#: iterations were most of an ask's fit at 1,000 observations. Anchors still refit cold.
WARM_FIT_MAX_N = 256


def warm_iterations(n: int) -> int:
    """L-BFGS-B iterations of a warm fit on ``n`` observations (``WARM_MAX_ITER``, then 0)."""
    return WARM_MAX_ITER if n < WARM_FIT_MAX_N else 0


class BayesianSearch(BayesianReport, BayesianPhases):
    """GP-based Bayesian optimisation with the ask/tell interface of :class:`Searcher`.

    Args:
        space, objective, direction, candidates, seed: as :class:`Searcher`.
        options: The tuning knobs, a :class:`~cubicml_lab.search.options.BayesianOptions`
            (default: its defaults).
        **knobs: Keyword shorthands for the fields of ``options``, each overriding that field:
            ``BayesianSearch(space, n_init=4)`` is
            ``BayesianSearch(space, options=BayesianOptions(n_init=4))``. The fields:
            ``n_init``, ``num_candidates``, ``log_objective``, ``mc_samples``, ``chunk_size``,
            ``feasibility``, ``memory_limit_gib`` (device memory per GPU, GiB: with it the
            weight includes P(peak memory <= limit); without ``memory_model`` that probability
            comes from a GP of the *measured* ``memory_metric`` told with ok trials, with it
            the prediction answers from the first ask and the trials correct it: module doc,
            "Memory model"), ``memory_metric``, ``second_objective``, ``second_direction``,
            ``stop_threshold``, ``stop_patience``, ``noise_metric``, ``learn_drift``,
            ``cost_aware`` (weigh told trial prices: :mod:`~cubicml_lab.search.cost`). Each is
            also a read-only attribute of the search (``search.n_init``: resolved from
            :func:`default_n_init` when None).
        cost_model: An analytical cost model for the objective GP's prior mean
            (``GPPredictor(cost_model=...)``, e.g. ``Dataset.cost_model`` or a function calling
            :func:`cubicml_lab.workloads.gpt.cost_terms`): better guesses from the first trials.
        features: Derived inputs for the objective GP's kernel (``GPPredictor(features=...)``,
            e.g. ``Dataset.features`` or :func:`cubicml_lab.workloads.gpt.shape_features`).
        memory_model: Predicted peak memory per GPU, ``config -> GiB`` (e.g.
            ``LLMTrainingModel(...).memory_gib``); needs ``memory_limit_gib`` (module doc).
        history: Related jobs' trials: campaign names (read from ``store``), DataFrames (knob
            columns, the objective, optionally ``status``) or Datasets (module doc).
        store: The TrialStore (or its path) that ``history`` names come from; default
            ``data/lab.sqlite`` if it exists.

    Raises:
        SearchError: On a bad argument or option, naming it and the fix: e.g. an option
            name that :class:`BayesianOptions` lacks, ``memory_model`` without
            ``memory_limit_gib``, a ``cost_model`` or ``memory_model`` that is not callable, a
            ``history`` entry that is not a campaign of the store, a DataFrame or a Dataset.

    Attributes:
        options: The :class:`BayesianOptions` in use (``n_init`` resolved).
        last_ask_info: What the last proposing ask did: ``phase`` ("prior", "initial", "bo" or
            "fallback"), ``reason``, ``fit_s`` and ``ask_s`` (seconds), ``max_acquisition`` (log
            acquisition value of the first pick, None outside BO), ``acquisition`` (one value per
            pick), ``n_ok`` and ``n_pool`` (untried configurations considered).
        predictor: The :class:`~cubicml_lab.surrogate.GPPredictor` of the last BO ask, or None.
        feasibility_model: The :class:`~cubicml_lab.surrogate.FeasibilityModel` of the last BO
            ask, or None (no failure told yet and no memory limit).
        improvement_trace: The best relative expected improvement of each BO ask, in order.
        stop_reason: Why :meth:`should_stop` fired, or None.
        history_model: The :class:`~cubicml_lab.search.history.HistoryModel`, or None.

    Example:
        >>> from cubicml_lab.space import Space, Int
        >>> s = BayesianSearch(Space([Int("micro_batch", 1, 32)]), seed=0, n_init=3)
        >>> for _ in range(5):
        ...     [cfg] = s.ask()
        ...     s.tell(cfg, {"throughput": 1000.0 - (cfg["micro_batch"] - 20) ** 2})
        >>> s.last_ask_info["phase"]
        'bo'
    """

    def __init__(self, space: Space, objective: str = "throughput", direction: str = "maximize",
                 candidates: Sequence[dict] | None = None, seed: int = 0,
                 options: BayesianOptions | None = None, *,
                 cost_model: Callable[[dict], Any] | None = None,
                 features: Callable[[dict], Any] | None = None,
                 memory_model: Callable[[dict], float] | None = None,
                 history: Sequence[Any] | None = None, store: Any = None,
                 **knobs: Any) -> None:
        opts = BayesianOptions.build(options, knobs)
        super().__init__(space, objective, direction, candidates, seed,
                         num_candidates=opts.num_candidates)
        if opts.n_init is None:
            opts = opts.replace(n_init=default_n_init(
                space, None if self._candidates is None else len(self._candidates)))
        opts.check_given(objective, cost_model=cost_model, features=features,
                         memory_model=memory_model, history=history)
        self.options = opts
        self.requires_positive = opts.log_objective
        self.cost_model = cost_model
        self.features = features
        self.memory_model = memory_model
        self.history_model: HistoryModel | None = None
        if history is not None:
            self.history_model = HistoryModel(space, history, objective, direction=direction,
                                              store=store, seed=self.seed)
        self.history_names = None if history is None or not all(
            isinstance(h, str) for h in history) else list(history)
        self.store = store
        self._init_state()

    @property
    def learn_drift(self) -> bool:
        """Whether the drift exponent is learned: ``options.learn_drift`` with
        ``options.log_objective`` (read-only)."""
        return self.options.learn_drift and self.options.log_objective

    # -- phases ---------------------------------------------------------------------------------
    def _fit(self, configs: list[dict], values: np.ndarray, seed: int,
             metric: str | None = None, direction: str | None = None,
             noise: np.ndarray | None = None, covariate: np.ndarray | None = None) -> Any:
        """A GP of ``metric`` on the ok history, hyperparameters warm-started.

        Refitting from scratch after every trial costs hundreds of L-BFGS iterations. Instead the
        hyperparameters are fitted cold only at *anchor* sizes of the history (every 25 % of
        growth, :meth:`_anchor`), on the first ``anchor`` ok observations with a seed of its own;
        in between, the fit starts from the anchor's hyperparameters and runs at most
        ``WARM_MAX_ITER`` iterations, none from ``WARM_FIT_MAX_N`` observations on (below the
        first anchor size every fit is cold). Both
        depend only on the told history, so a resumed search refits the same anchor and
        proposes what the original would have; an anchor is reused only for exactly the
        observations it was fitted on (:meth:`_anchor_fit`), and a fit is always of all of
        ``configs``: never one of fewer observations kept from an earlier call.

        With ``covariate`` (:func:`drift_covariate` of the trials) the drift exponent is learned
        on top (:func:`learn_drift`, refits warm-started from the fit before) and kept in
        :attr:`drift_exponent`.
        """
        if covariate is None and (metric or self.objective) == self.objective:
            self.drift_exponent = None  # nothing drifted (or not learned) in this fit
        if covariate is not None:
            sign = -1.0 if (direction or self.direction) == "minimize" else 1.0

            def refit(v: np.ndarray, warm: Any) -> Any:
                if warm is None:
                    return self._fit(configs, v, seed, metric, direction, noise)
                return self._make_gp(metric or self.objective, seed).fit(
                    configs, self._model_values(v, direction or self.direction), noise=noise,
                    warm_start=warm, max_iter=warm_iterations(len(configs)))

            pred, self.drift_exponent, _ = learn_drift(refit, values, covariate, sign)
            return pred
        metric = metric or self.objective
        values = self._model_values(values, direction or self.direction)
        n = len(configs)
        m = self._anchor(n)
        if n < m:  # no anchor size reached yet (a prior's first fits, failures): fit cold
            return self._make_gp(metric, seed).fit(configs, values, noise=noise)
        anchor = self._anchor_fit(metric, configs[:m], values[:m],
                                  None if noise is None else noise[:m], cold_ok=n > m)
        if anchor is None:  # e.g. the first m were all identical: fit cold instead
            return self._make_gp(metric, seed).fit(configs, values, noise=noise)
        if n == m:
            return anchor
        return self._make_gp(metric, seed).fit(configs, values, noise=noise,
                                               warm_start=anchor, max_iter=warm_iterations(n))

    def _gp_data(self) -> tuple[list[dict], np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The objective GP's ok observations, their observed noise
        (:mod:`~cubicml_lab.search.fitting`, "Observed noise") and drift covariate (module doc,
        "Machine drift"): ``(configs, values, relative noise or None, covariate or None)``."""
        ok = [h for h in self._history if h["status"] == "ok"]
        rel, keep = observed_noise([h["values"] for h in ok], self.objective, self.noise_metric)
        ok = [h for h, k in zip(ok, keep) if k]
        cov = drift_covariate([h["values"] for h in ok], self.objective) \
            if self.learn_drift and len(ok) >= 3 else None
        return ([h["config"] for h in ok], np.array([self._observed(h) for h in ok],
                                                    dtype=np.float64), rel, cov)

    def _observed(self, h: dict) -> float:
        """An ok observation's value for the GP: its figure, or for a trial stopped early
        (:func:`~cubicml_lab.trials.is_stopped_early`: at most this fast) the optimistic end
        of its 95% interval, so the GP never believes it slower than it may be, and the
        acquisition, which compares with the best, rates its neighbours by that bound."""
        value = float(h["value"])
        if not is_stopped_early(h["values"]):
            return value
        v = h["values"]
        rel = v.get(f"{self.objective}_rel_ci", v.get("step_time_rel_ci", STOPPED_REL_CI))
        rel = rel if isinstance(rel, (int, float)) and 0 <= rel < 0.5 else STOPPED_REL_CI
        return value / (1.0 - rel) if self.direction == "maximize" else value * (1.0 - rel)

    # -- the Searcher hook ----------------------------------------------------------------------
    def _propose(self, n: int, pool: list[dict], rng: np.random.Generator) -> list[dict]:
        with self._fit_lock:
            return self._propose_locked(n, pool, rng)

    def _propose_locked(self, n: int, pool: list[dict], rng: np.random.Generator
                        ) -> list[dict]:
        import torch

        t0 = time.perf_counter()
        seed = int(rng.integers(2**31 - 1))  # = _fit_seed(): rng is self._rng(), fresh
        torch.manual_seed(seed)
        n_all = len(pool)
        pool = self._held(pool)
        data = self._current_data()
        configs = data[0]
        self._refresh_history(configs, data[1])
        info: dict[str, Any] = {"phase": "initial", "reason": "", "fit_s": 0.0, "ask_s": 0.0,
                                "max_acquisition": None, "acquisition": [],
                                "relative_improvement": None,
                                "n_ok": len(configs), "n_pool": len(pool)}
        if len(pool) < n_all:
            info["layouts_left_out"] = n_all - len(pool)
        self.last_ask_info = info
        need, prior = self._gp_need()
        blocked = self._not_ready(configs, data[1], need, "the GP")
        if blocked:
            info["phase"], info["reason"] = blocked
        else:
            try:
                self._fit_models(data, seed)
                info["fit_s"] = time.perf_counter() - t0
                info["phase"] = "bo"
                info["reason"] = self._fit_reason()
            except PredictorError as err:
                info["reason"] = f"GP fit failed: {err.message}"
                info["phase"] = "fallback"
        out = None
        if info["phase"] == "bo":
            try:
                out = self._bo(n, pool, configs, seed, info)
                self.improvement_trace.append(info["relative_improvement"])
            except RuntimeError as err:  # e.g. a kernel matrix that is not positive definite
                info["phase"], info["reason"] = "fallback", f"acquisition failed: {err}"
        if out is None:
            out = self._before_the_gp(n, pool, rng, seed, info, prior)
        info["ask_s"] = time.perf_counter() - t0
        return out

    # -- the models, fitted on exactly the observations held ------------------------------------
    def _current_data(self) -> tuple[list[dict], np.ndarray, np.ndarray | None,
                                     np.ndarray | None]:
        """``(configs, values, noise, covariate)`` the objective's GP is fitted on now
        (:meth:`_gp_data`; the ok history with two objectives). Only an ask checks the
        history against them (:meth:`_refresh_history`, which may drop it for good): a
        recommend() or fit_predictor() between asks changes nothing an ask will do."""
        return (self._gp_data() if self.second_objective is None
                else (*self._ok(), None, None))

    def _gp_need(self) -> tuple[int, bool]:
        """``(ok observations the GP needs, whether a prior is in use)``: with a prior the GP
        starts at ``PRIOR_MIN_OK`` ok trials; without one, failures count towards the initial
        design, and past it 2 ok trials are enough."""
        prior = self.cost_model is not None or self._history_in_use()
        return (PRIOR_MIN_OK if prior else self.n_init if self.n_told < self.n_init
                else 2), prior

    def _objective_fit(self, data: tuple, seed: int) -> Any:
        """The objective's GP on ``data`` (:meth:`_current_data`), fitted once per set of
        observations: kept under a key holding every configuration, value, noise and
        covariate it was fitted on (and the seed and whether the history is in use), so a
        tell, which changes them, always brings a new fit."""
        configs, values, noise, covariate = data
        key = (seed, self._history_in_use(), self._data_key(configs, values, noise, covariate))
        kept = self._objective_fits
        if kept is not None and kept[0] == key:
            self.drift_exponent = kept[2]
            return kept[1]
        pred = self._fit(configs, values, seed, noise=noise, covariate=covariate)
        self._objective_fits = (key, pred, self.drift_exponent)
        return pred

    def _fit_models(self, data: tuple, seed: int) -> None:
        """Fit :attr:`predictor`, :attr:`second_predictor` and :attr:`feasibility_model` on
        ``data`` and the whole history.

        Raises:
            PredictorError: If a fit fails (the attributes are then not current).
        """
        self._models_at = None
        configs = data[0]
        self.predictor = self._objective_fit(data, seed)
        self.second_predictor = None
        if self.second_objective is not None:
            c2, v2 = self._second_values()
            if len(c2) != len(configs):
                raise PredictorError(f"{len(configs) - len(c2)} ok trials were told without a "
                                     f"usable {self.second_objective!r}", hint="tell both metrics")
            self.second_predictor = self._fit(c2, v2, seed, self.second_objective,
                                              self.second_direction)
        self.feasibility_model = self._fit_feasibility(seed)
        self._models_at = self.n_told

    def fit_predictor(self) -> Any:
        """Fit the search's models on exactly the observations it holds now, and return the GP.

        :attr:`predictor`, :attr:`second_predictor` and :attr:`feasibility_model` are those
        of the last fit: a Bayesian-optimisation ask makes one, and the trials told after it
        are not in it. This brings them up to date (the fit an ask at this point makes, and
        shared with it, with the history as the last ask left it), e.g. before a
        :class:`~cubicml_lab.widgets.PredictorExplorer` reads them.

        Returns:
            The objective's :class:`~cubicml_lab.surrogate.GPPredictor`; its ``n_train`` is
            the number of ok observations it was fitted on.

        Raises:
            SearchError: While no GP can be fitted (too few ok observations, all identical)
                or the fit fails, saying why.

        Example:
            >>> from cubicml_lab.space import Space, Int
            >>> s = BayesianSearch(Space([Int("micro_batch", 1, 32)]), seed=0, n_init=2)
            >>> for mb in (2, 8, 16):
            ...     s.tell({"micro_batch": mb}, {"throughput": 100.0 * mb ** 0.5})
            >>> s.fit_predictor().n_train
            3
        """
        with self._fit_lock:
            if self._models_at == self.n_told and self.predictor is not None:
                return self.predictor
            data = self._current_data()
            blocked = self._not_ready(data[0], data[1], self._gp_need()[0], "the GP")
            if blocked:
                raise SearchError(f"no GP yet: {blocked[1]}",
                                  hint="tell more measured (ok) trials; the first "
                                       "Bayesian-optimisation ask fits it")
            try:
                self._fit_models(data, self._fit_seed())
            except PredictorError as err:
                raise SearchError(f"the GP could not be fitted: {err.message}",
                                  hint=err.hint or "tell more trials with distinct values"
                                  ) from None
            return self.predictor
