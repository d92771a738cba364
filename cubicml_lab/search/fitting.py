"""The Bayesian search's models and what they are fitted on: the half of
:class:`~cubicml_lab.search.BayesianSearch` that holds state.

:class:`BayesianModels` keeps the encoded pool (each configuration encoded once per search,
with its cost terms), the cost and memory models' answers, the anchors of the warm-started
hyperparameter fits, the feasibility model of everything told, and which configurations the
models can hold. :class:`~cubicml_lab.search.BayesianSearch` adds the phases, the ask and
what it reports.

**Observed noise.** With ``noise_metric`` None the search reads each ok trial's relative spread
from ``"<objective>_rel_ci"``, ``"throughput_rel_ci"`` or ``"step_time_rel_ci"`` (the first that
any trial carries; a trial without it takes the median of the others, one whose spread is
unknown, NaN or inf, from a single window, the largest of the others) and passes it to the GP as
fixed per-trial noise; a trial told with ``contended`` > 0 (a measurement taken while something
else used the machine; ``True`` is accepted) gets at least ``CONTENDED_REL_NOISE`` (10 %). When
no trial carries a spread, contended trials are left out of the objective's GP (while 2 others
remain). With ``noise_metric`` named, every ok trial must carry it, as before.

**Flagged figures.** A figure that :func:`~cubicml_lab.trials.figure_flag` flags (told
``contended``, or with a CI that is NaN or inf: unknown, from a single window) teaches the GP
with its noise, but never sets the incumbent alone: while any configuration was measured with
an unflagged figure, only those form the acquisition's baseline (so its incumbent and the
stopping rule's improvement), the screen's best posterior mean and the candidates of
:meth:`BayesianSearch.recommend`, as :meth:`~cubicml_lab.search.Searcher.best` and
``Campaign.best()`` (what a review rule compares with) skip flagged figures.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PredictorError, SearchError
from ..trials import figure_flag, is_contended
from .base import Searcher
from .design import failure_proximity
from .options import BayesianOptions
from .prior import PriorTerms

if TYPE_CHECKING:
    from .history import HistoryModel

__all__ = ["BayesianModels", "observed_noise"]

#: L-BFGS-B iterations of each feasibility-model GP fitted cold (at an anchor size).
FEASIBILITY_MAX_ITER = 40
#: L-BFGS-B iterations of a feasibility-model GP between anchor sizes, warm-started from the
#: anchor's: 0, it conditions on every trial with the anchor's hyperparameters. Fitting cold
#: at each ask was half of an ask's fitting time at 1,000 trials (40 iterations on 400 of
#: them, ~3 s on 2 cores); a few more trials barely move a memory model's hyperparameters.
FEASIBILITY_WARM_MAX_ITER = 0
#: Told metrics read as a trial's relative spread (observed noise) when ``noise_metric`` is None.
NOISE_METRICS = ("throughput_rel_ci", "step_time_rel_ci")
#: Relative spread assumed at least for a contended measurement (10 %).
CONTENDED_REL_NOISE = 0.1


def observed_noise(metrics: Sequence[Mapping[str, float]], objective: str = "throughput",
                   noise_metric: str | None = None) -> tuple[np.ndarray | None, np.ndarray]:
    """The relative noise of each ok trial's ``objective`` as the GP is told it, and which trials
    the GP keeps (module doc, "Observed noise").

    Args:
        metrics: One mapping of told metrics per ok trial (a metric a trial lacks is absent).
        objective: The objective's name; its ``"<objective>_rel_ci"`` is read first.
        noise_metric: A metric every trial must carry, read instead; None picks as above.

    Returns:
        ``(rel, keep)``: n relative spreads (absent: the median of the known ones; NaN or
        inf, unknown: the largest; contended trials at least
        :data:`CONTENDED_REL_NOISE`), or None to let the GP infer one noise level; and a boolean
        mask of the trials to fit on (all of them, but the contended ones where no trial carries
        a spread and at least 2 others remain).

    Example:
        >>> rel, keep = observed_noise([{"throughput_rel_ci": 0.02}, {"contended": 1.0}, {}])
        >>> rel.tolist(), keep.tolist()
        ([0.02, 0.1, 0.02], [True, True, True])
    """
    metric = noise_metric or next(
        (m for m in (f"{objective}_rel_ci", *NOISE_METRICS) if any(m in v for v in metrics)),
        None)
    contended = np.array([is_contended(v) for v in metrics], dtype=bool)
    keep = np.ones(len(metrics), dtype=bool)
    told = [v.get(metric, math.nan) if metric is not None else math.nan for v in metrics]
    known = [max(float(x), 0.0) for x in told if math.isfinite(x)]
    if known:
        if noise_metric is not None and any(noise_metric not in v for v in metrics):
            return None, keep  # an explicit metric missing on some trial: infer one level
        fill, unknown = float(np.median(known)), max(known)  # absent; present but unknown
        rel = np.array([max(float(x), 0.0) if math.isfinite(x)
                        else (unknown if metric in v else fill)
                        for x, v in zip(told, metrics)], dtype=np.float64)
        rel[contended] = np.maximum(rel[contended], CONTENDED_REL_NOISE)
        return rel, keep
    if contended.any() and (~contended).sum() >= 2:
        keep = ~contended  # no spread known: leave them out
    return None, keep


class BayesianModels(Searcher):
    """The models of a Bayesian search and their caches (module doc); no phases, no asks.

    A subclass sets :attr:`options`, ``cost_model``, ``features``, ``memory_model``,
    ``history_model`` and calls :meth:`_init_state` in its constructor.
    """

    options: BayesianOptions
    cost_model: Any
    features: Any
    memory_model: Any
    history_model: HistoryModel | None
    #: The objective's GPPredictor of the last fit, or None.
    predictor: Any
    #: The second objective's GPPredictor of the last fit, or None.
    second_predictor: Any
    #: The FeasibilityModel of the last fit, or None.
    feasibility_model: Any
    #: The drift exponent of the last objective fit (None: not learned, nothing drifted).
    drift_exponent: float | None
    #: What the last proposing ask did (see BayesianSearch).
    last_ask_info: dict[str, Any]
    #: The best relative expected improvement of each BO ask, in order.
    improvement_trace: list[float]
    #: Why should_stop() fired, or None.
    stop_reason: str | None

    def _init_state(self) -> None:
        """The caches and the record of the asks, empty."""
        self._mem_of: dict[str, float] = {}
        self._n_terms = 0  # cost terms (the history's included) per encoded pool row
        self._prior_terms: PriorTerms | None = None
        self.last_ask_info: dict[str, Any] = {}
        self.predictor: Any = None
        #: The drift exponent of the last objective fit (None: not learned, nothing drifted).
        self.drift_exponent: float | None = None
        self.second_predictor: Any = None
        self.feasibility_model: Any = None
        self.improvement_trace: list[float] = []
        # metric -> (data key, fit); "\0feasibility" -> the feasibility model's anchor
        self._anchors: dict[str, tuple[tuple, Any]] = {}
        self._recommended: tuple[Any, dict, float] | None = None  # (when, pick, estimate)
        #: (data key, GP, drift exponent) of the last objective fit (:meth:`_objective_fit`)
        self._objective_fits: tuple[Any, Any, float | None] | None = None
        self._models_at: int | None = None  # n_told when predictor & co. were last fitted
        self._feasibility_fit: tuple[tuple[int, int], Any] | None = None  # (n_told, seed), fit
        self._holds: dict[str, bool] = {}  # key -> whether the models hold its layout
        # ask() and recommend() fit on the same caches (_anchors, drift_exponent): a
        # dashboard's poll thread may call recommend() while a campaign's run loop asks
        self._fit_lock = threading.RLock()
        self._row_of: dict[str, int] = {}
        self._rows: list[np.ndarray] = []
        self._rows_tensor: Any = None
        self.stop_reason: str | None = None

    def _model_values(self, values: np.ndarray, direction: str) -> np.ndarray:
        """Values turned so that larger is better (1/y or -y when minimising)."""
        if direction == "minimize":
            return 1.0 / values if self.log_objective else -values
        return values

    def _anchor(self, n: int) -> int:
        """The history size at which the hyperparameters are fitted from scratch: the largest
        of ``n_init'' = max(n_init, 2)`` grown by 25 % steps that is <= n."""
        m = max(self.n_init, 2)
        while math.ceil(m * 1.25) <= n:
            m = math.ceil(m * 1.25)
        return m

    def _anchor_fit(self, metric: str, configs: list[dict], values: np.ndarray,
                    noise: np.ndarray | None, cold_ok: bool) -> Any:
        """The cold fit on the first ``m = len(configs)`` observations (values as the GP models
        them), kept per metric and reused only for exactly these observations: the key holds
        every configuration, value and noise it was fitted on, so no tell, however it changes
        the first ``m`` (a contended trial left out, a noise filled in), hands back a fit of
        other data. None where the fit fails and ``cold_ok`` (the caller fits cold instead).

        Raises:
            PredictorError: If the fit fails and not ``cold_ok``.
        """
        m = len(configs)
        key = (m, self._data_key(configs, values, noise))
        cached = self._anchors.get(metric)
        if cached is not None and cached[0] == key:
            return cached[1]
        anchor_seed = int(np.random.default_rng([self.seed, m, 7]).integers(2**31 - 1))
        try:
            anchor = self._make_gp(metric, anchor_seed).fit(configs, values, noise=noise)
        except PredictorError:
            if not cold_ok:
                raise
            return None
        self._anchors[metric] = (key, anchor)
        return anchor

    def _data_key(self, configs: Sequence[dict], *arrays: np.ndarray | None) -> tuple:
        """An exact, hashable record of a fit's observations: each configuration's key and the
        bytes of each array (values, noise, covariate; None stays None)."""
        return (tuple(self.space.key(c) for c in configs),
                *(None if a is None else np.asarray(a, dtype=np.float64).tobytes()
                  for a in arrays))

    def _make_gp(self, metric: str, seed: int) -> Any:
        """An unfitted GPPredictor of ``metric`` (the objective's with the prior and features)."""
        from ..surrogate import GPPredictor

        return GPPredictor(self.space, metric, log_objective=self.log_objective, seed=seed,
                           cost_model=self._gp_cost_model() if metric == self.objective else None,
                           features=self.features if metric == self.objective else None)

    def _second_values(self) -> tuple[list[dict], np.ndarray]:
        """The ok trials told with a finite, usable value of ``second_objective``."""
        rows = [h for h in self._history if h["status"] == "ok"
                and self.second_objective in h["values"]
                and (h["values"][self.second_objective] > 0 or not self.log_objective)]
        return ([h["config"] for h in rows],
                np.array([h["values"][self.second_objective] for h in rows], dtype=np.float64))

    def _fit_feasibility(self, seed: int) -> Any:
        """The FeasibilityModel of everything told, or None while there is nothing to learn;
        fitted once per ``(n_told, seed)`` (every tell bumps n_told), so the asks between two
        tells (a review rule skipping proposal after proposal) reuse it.

        Its GPs' hyperparameters are fitted cold only at the anchor sizes of the history
        (:meth:`_anchor`, as the objective's), on the first ``anchor`` trials with a seed of
        their own, kept under a key of exactly those trials; in between, each GP conditions
        on every trial with the anchor's hyperparameters (``FEASIBILITY_WARM_MAX_ITER``
        iterations). Both depend only on the told history, so a resumed search makes the
        same fits."""
        failed = any(h["status"] != "ok" for h in self._history)
        if not self.feasibility or not (failed or self.memory_limit_gib is not None):
            return None
        kept = self._feasibility_fit
        if kept is not None and kept[0] == (self.n_told, seed):
            return kept[1]
        n = len(self._history)
        m = self._anchor(n)
        anchor = None
        if m < n:
            first = self._history[:m]
            key = (tuple(h["status"] for h in first),
                   self._data_key([h["config"] for h in first], self._memory_told(first)))
            cached = self._anchors.get("\0feasibility")
            if cached is not None and cached[0] == key:
                anchor = cached[1]
            else:
                anchor_seed = int(np.random.default_rng([self.seed, m, 11]).integers(2**31 - 1))
                try:
                    anchor = self._feasibility_of(first, anchor_seed)
                except PredictorError:  # the fit of everything, cold, may still work
                    anchor = None
                self._anchors["\0feasibility"] = (key, anchor)
        model = self._feasibility_of(self._history, seed, anchor)
        self._feasibility_fit = ((self.n_told, seed), model)
        return model

    def _memory_told(self, history: list[dict]) -> np.ndarray:
        """The told ``memory_metric`` of each trial of ``history`` (NaN where not told)."""
        return np.array([h["values"].get(self.memory_metric, np.nan) for h in history],
                        dtype=np.float64)

    def _feasibility_of(self, history: list[dict], seed: int, warm: Any = None) -> Any:
        """A FeasibilityModel fitted on ``history``: cold, or warm-started from ``warm``."""
        from ..surrogate import FeasibilityModel

        return FeasibilityModel(self.space, seed=seed, max_iter=FEASIBILITY_MAX_ITER,
                                memory_model=self.memory_model).fit(
            [h["config"] for h in history], [h["status"] for h in history],
            self._memory_told(history),
            memory_limit=self.memory_limit_gib if self.memory_model is not None else None,
            warm_start=warm, warm_max_iter=FEASIBILITY_WARM_MAX_ITER)

    def _log_p_feasible(self, X_space: Any, pool: list[dict],
                        keys: list[str] | None, skip_below: float | None = None) -> np.ndarray:
        """log P(runs) of each pool configuration from the feasibility model (0 without one);
        the memory model's predictions are cached by configuration. ``skip_below``: rows the
        memory part already puts below it get an upper bound
        (:meth:`~cubicml_lab.surrogate.FeasibilityModel.predict_encoded`)."""
        if self.feasibility_model is None:
            return np.zeros(len(pool))
        prior = None
        if self.memory_model is not None:
            keys = keys if keys is not None else [self.space.key(c) for c in pool]
            new = [i for i, k in enumerate(keys) if k not in self._mem_of]
            if new:
                got = self.feasibility_model.prior_gib([pool[i] for i in new])
                self._mem_of.update({keys[i]: float(g) for i, g in zip(new, got)})
            prior = np.array([self._mem_of[k] for k in keys])
        near = None
        if self.feasibility_model.all_failed:
            near = failure_proximity(self.space, X_space, [h["config"] for h in self._history
                                                          if h["status"] != "ok"])
        return self.feasibility_model.predict_encoded(X_space, len(pool),
                                                      memory_limit=self.memory_limit_gib,
                                                      prior_gib=prior, log=True,
                                                      when_all_failed=near,
                                                      skip_below=skip_below)

    def _encode_pool(self, pool: list[dict]) -> Any:
        """``space.encode(pool)`` through a cache keyed by configuration: a fixed pool of tens of
        thousands is encoded once per search, not at every ask. With a ``cost_model`` or
        ``features`` the rows go on with their logs (the objective GP's input; the feasibility
        model takes the space's columns)."""
        import torch

        keys = self._pool_keys(pool)
        new = [i for i, k in enumerate(keys) if k not in self._row_of]
        if new:
            rows = self.space.encode_array([pool[i] for i in new])
            terms = self._gp_cost_model()
            if terms is not None or self.features is not None:  # the objective GP's input:
                from ..surrogate import GPPredictor
                from ..surrogate.terms import evaluate_many

                extra = GPPredictor(self.space, cost_model=terms, features=self.features
                                    ).derived_columns([pool[i] for i in new], "candidates")
                rows = np.concatenate([rows, extra.numpy()], axis=1)
                self._n_terms = 0 if terms is None else int(np.size(evaluate_many(
                    "cost_model", terms, [pool[new[0]]])[0]))
            start = len(self._rows)
            self._rows.extend(rows)
            for j, i in enumerate(new):
                self._row_of[keys[i]] = start + j
            self._rows_tensor = None
        if self._rows_tensor is None:
            self._rows_tensor = torch.from_numpy(np.asarray(self._rows, dtype=np.float64))
        return self._rows_tensor[torch.as_tensor([self._row_of[k] for k in keys])]

    def _pool_keys(self, pool: list[dict]) -> list[str]:
        return self._untried_keys if len(self._untried_keys) == len(pool) else \
            [self.space.key(c) for c in pool]

    def _gp_cost_model(self) -> Any:
        """The objective GP's cost model: ``cost_model``, with the history's term appended while
        the history is in use (:mod:`~cubicml_lab.search.prior`, "Transfer")."""
        if self.history_model is None or not self.history_model.active:
            return self.cost_model
        if self._prior_terms is None:
            self._prior_terms = PriorTerms(self.cost_model, self.history_model)
        return self._prior_terms.terms

    def _refresh_history(self, configs: list[dict], values: np.ndarray) -> None:
        """Check the history against the ok trials; once it is dropped, the GP's inputs change:
        forget the encoded rows and the anchors of the hyperparameters."""
        hm = self.history_model
        if hm is None or not hm.active:
            return
        if not hm.check(configs, np.log(np.clip(self._model_values(values, self.direction),
                                                1e-300, None)) if len(values) else values):
            self._rows, self._row_of, self._rows_tensor = [], {}, None
            self._anchors.clear()

    def _held(self, pool: list[dict]) -> list[dict]:
        """``pool`` without the configurations whose layout the cost or memory model cannot
        hold (a model with a ``holds_frame`` method, e.g. ``LLMTrainingModel``: ``tp * pp``
        not dividing its GPUs); they would make the model raise. Results are cached by key.

        Raises:
            SearchError: If no configuration of the pool is left.
        """
        checks = [getattr(getattr(fn, "__self__", None), "holds_frame", None)
                  for fn in (self.cost_model, self.memory_model)]
        checks = [c for c in checks if callable(c)]
        if not checks or not pool:
            return pool
        keys = self._pool_keys(pool)
        new = [i for i, k in enumerate(keys) if k not in self._holds]
        if new:
            import pandas as pd

            frame = pd.DataFrame([pool[i] for i in new])
            ok = np.ones(len(new), dtype=bool)
            for check in checks:
                ok &= np.asarray(check(frame), dtype=bool)
            self._holds.update((keys[i], bool(v)) for i, v in zip(new, ok))
        kept = [i for i, k in enumerate(keys) if self._holds[k]]
        if not kept:
            raise SearchError(f"none of the {len(pool):,} candidates has a layout the cost or "
                              "memory model can hold (e.g. tp * pp does not divide its GPUs)",
                              hint="add the constraint 'n_gpus % (tp * pp) == 0' to the space")
        if len(kept) < len(pool):
            self._untried_keys = [keys[i] for i in kept]
            pool = [pool[i] for i in kept]
        return pool

    def _history_in_use(self) -> bool:
        return self.history_model is not None and self.history_model.active

    def _fit_seed(self) -> int:
        """The seed of the fits at this point: the first draw of the ask's ``rng``
        (``(seed, n_told)``), so an ask, :meth:`recommend` and :meth:`fit_predictor` at the
        same point make (and share) the same fit."""
        return int(self._rng().integers(2**31 - 1))

    def _baseline(self, configs: list[dict]) -> list[dict]:
        """The observed configurations an incumbent may come from (the acquisition's
        baseline, the screen's best posterior mean, :meth:`recommend`'s pick): those measured
        at least once with an unflagged figure (:func:`~cubicml_lab.trials.figure_flag`: not
        contended, a known CI), all of ``configs`` where none is. A flagged figure still
        teaches the GP, with its noise, but never sets the bar alone."""
        trusted = {self.space.key(h["config"]) for h in self._history if h["status"] == "ok"
                   and figure_flag(h["values"], self.objective) is None}
        return [c for c in configs if self.space.key(c) in trusted] or list(configs)

    def _normalised_space_rows(self, pool: list[dict]) -> Any:
        n_space = self.space.encoded_bounds().shape[1]
        return self._encode_pool(pool)[:, :n_space]


def _option(name: str) -> property:
    return property(lambda self: getattr(self.options, name),
                    doc=f"``options.{name}`` (read-only; see :class:`BayesianOptions`).")


for _name in BayesianOptions.names():
    if _name not in ("learn_drift", "num_candidates"):  # BayesianSearch's; a Searcher attribute
        setattr(BayesianModels, _name, _option(_name))
