"""What each phase of a Bayesian search picks: the prior's best, the acquisition's, the
space-filling design's.

:class:`BayesianPhases` is the picking half of :class:`~cubicml_lab.search.BayesianSearch`: given
the untried pool and the models the search fitted
(:class:`~cubicml_lab.search.fitting.BayesianModels`), each method returns the configurations of
one phase and fills in the ask's record (``info``). Which phase an ask is in, and fitting the
models, is the search's.

* **prior** (:meth:`~BayesianPhases._prior_picks`): before the GP, the prior's best
  predicted-feasible configurations (:func:`~cubicml_lab.search.prior.prior_picks`), scored by
  the cost model's terms or the history's prediction;
* **bo** (:meth:`~BayesianPhases._bo`): the acquisition's greedy picks
  (:mod:`~cubicml_lab.search.acquisition`), the pool screened by the posterior mean when large,
  weighted by the probability of running and, where trials' prices differ, by their predicted
  price (:mod:`~cubicml_lab.search.cost`);
* **initial** / **fallback** (:meth:`~BayesianPhases._before_the_gp`): the prior's picks where
  there is a prior, else the space-filling design (:mod:`~cubicml_lab.search.design`), weighted
  by the probability of running where a feasibility model exists.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import PredictorError
from . import acquisition as acq
from .cost import (COST_METRIC, COST_MIN_TRIALS, cooling, cost_log_weights,
                   cost_observations, told_cost)
from .design import space_filling
from .fitting import BayesianModels
from .prior import cost_term_scores, prior_picks

__all__ = ["BayesianPhases"]


class _Weigher:
    """The log weights of a pool's rows for their probability of running, computed once per row
    and only for the rows asked (a screen asks for those it scores exactly).

    With ``cut`` (a memory model) those under ``BO_P_FEASIBLE`` are floored while at least ``n``
    others remain (:func:`~cubicml_lab.search.acquisition.feasibility_weights`). Lazily, the
    floor is assumed (:meth:`weights`) and checked on the rows kept (:meth:`kept`): the kept
    rows of highest score plus weight hold every likely row of the pool up to their number,
    so fewer than ``n`` likely rows among them means fewer in the pool, and the kept rows are
    weighed again without the floor. While the floor is assumed, a row the memory part alone
    puts under it gets that part, an upper bound (``log_p(rows, skip_below)``: no failure
    classifier for it); such rows are weighed exactly only if the floor is lifted."""

    def __init__(self, log_p: Any, size: int, n: int, dtype: Any, cut: bool) -> None:
        self.log_p, self.n, self.dtype, self.cut = log_p, n, dtype, cut
        self._p = np.full(size, np.nan)
        self._bound = np.zeros(size, dtype=bool)  # _p holds an upper bound, under the floor
        self._floor = math.log(acq.BO_P_FEASIBLE) if cut and acq.BO_P_FEASIBLE else None

    def _raw(self, rows: Any, exact: bool = False) -> np.ndarray:
        idx = np.asarray(rows, dtype=np.int64)
        todo = idx[np.isnan(self._p[idx]) | (exact & self._bound[idx])]
        if len(todo):
            skip = None if exact else self._floor
            self._p[todo] = self.log_p(todo, skip)
            self._bound[todo] = False if skip is None else self._p[todo] < skip
        return self._p[idx]

    def weights(self, rows: Any) -> Any:
        """Log weights of ``rows`` (indices into the pool), the floor assumed."""
        return acq.feasibility_weights(self._raw(rows), 0, self.dtype, self.cut)

    def kept(self, rows: Any) -> Any:
        """Log weights of the kept ``rows``, floored only where ``n`` likely rows remain."""
        raw = self._raw(rows)
        if self._floor is not None and int((raw >= self._floor).sum()) < self.n:
            raw = self._raw(rows, exact=True)  # the floor is lifted: every weight counts
        return acq.feasibility_weights(raw, self.n, self.dtype, self.cut)


class BayesianPhases(BayesianModels):
    """The picks of each phase of a Bayesian search (module doc); no fits of the objective."""

    def _prior_scores(self, pool: list[dict], X: Any) -> np.ndarray | None:
        """The prior's guess of each pool configuration's log objective (larger is better, up
        to a constant): minus the log of the summed cost terms, else the history's ``h``."""
        if self.cost_model is not None:
            n_hist = int(self._gp_cost_model() is not self.cost_model)
            return cost_term_scores(X[:, X.shape[1] - self._n_terms:X.shape[1] - n_hist].numpy())
        if self.history_model is not None and self.history_model.active:
            return self.history_model.predict(pool, self._pool_keys(pool))
        return None

    def _prior_picks(self, n: int, pool: list[dict], rng: np.random.Generator,
                     info: dict[str, Any]) -> list[dict] | None:
        """Before the GP: the prior's best predicted-feasible configurations
        (:func:`~cubicml_lab.search.prior.prior_picks`)."""
        fm = self.feasibility_model
        if fm is not None and fm.all_failed and self.memory_model is None:
            return None  # its favourites failed, nothing ran yet: explore (space-filling) first
        X = self._encode_pool(pool)
        score = self._prior_scores(pool, X)
        if score is None:
            return None
        n_space = self.space.encoded_bounds().shape[1]
        log_p = self._log_p_feasible(X[:, :n_space], pool, self._pool_keys(pool))
        picks, p = prior_picks(n, pool, score, log_p, self.space.names,
                               [h["config"] for h in self._history] + self.pending, rng)
        info["p_feasible_of_picks"] = [float(p[i]) for i in picks]
        info["prior_score_of_picks"] = [float(score[i]) for i in picks]
        return [dict(pool[i]) for i in picks]

    def _bo(self, n: int, pool: list[dict], configs: list[dict], seed: int,
            info: dict[str, Any]) -> list[dict]:
        """The BO phase's picks (:mod:`~cubicml_lab.search.acquisition`), ``info`` filled in."""
        import warnings

        import torch

        X_base = self.predictor.encode(self._baseline(configs))
        X_pool, keys = self._encode_pool(pool), self._pool_keys(pool)
        single = self.second_predictor is None
        keep = max(acq.SCREEN_SIZE, 8 * n)
        if single and (len(X_base) > acq.BASELINE_MAX or len(pool) > keep):
            if len(X_base) > acq.BASELINE_MAX:
                info["baseline"] = acq.BASELINE_MAX
            X_base, mu_b = acq.trim_baseline(self.predictor, X_base)
        log_w = torch.zeros(len(pool), dtype=X_pool.dtype)
        weigh = self._feasibility_weigher(pool, X_pool, keys, n) \
            if self.feasibility_model is not None else None
        if single and len(pool) > keep:
            top, _ = acq.screen(self.predictor, X_pool, float(mu_b.max()), keep,
                                None if weigh is None else weigh.weights)
            if weigh is not None:
                log_w = weigh.kept(top)
            pool, X_pool, keys = [pool[int(i)] for i in top], X_pool[top], [keys[int(i)]
                                                                             for i in top]
            info["screened"] = keep
        elif weigh is not None:
            log_w = weigh.kept(np.arange(len(pool)))
        X_pend = self.predictor.encode(self.pending) if self.pending else X_pool[:0]
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make, scale = acq.acquisition_factory(self.predictor, self.second_predictor, X_base,
                                                  self.mc_samples, self.log_objective, seed)
        price_w = self._price_weights(X_pool, seed, info) if single else None
        picks, values = acq.greedy_picks(make, X_pool, X_pend, n, self.chunk_size,
                                         log_w if price_w is None else log_w + price_w)
        if price_w is not None:  # what is reported (and stops a search) is the improvement
            values = [v - float(price_w[j]) for v, j in zip(values, picks)]
            info["price_weight_of_picks"] = [float(price_w[j]) for j in picks]
        if self.feasibility_model is not None:
            info["p_feasible_of_picks"] = [float(torch.exp(log_w[j])) for j in picks]
        info["acquisition"] = values
        info["max_acquisition"] = values[0] if values else None
        if values:
            info["relative_improvement"] = float(np.exp(values[0])) / scale
        return [dict(pool[j]) for j in picks]

    def _feasibility_weigher(self, pool: list[dict], X_pool: Any, keys: list[str],
                             n: int) -> _Weigher:
        """The acquisition's log weights for the probability of running
        (:func:`~cubicml_lab.search.acquisition.feasibility_weights`), computed only for the rows
        a screen scores (:class:`_Weigher`)."""
        n_space = self.space.encoded_bounds().shape[1]

        def log_p(rows: np.ndarray, skip_below: float | None) -> np.ndarray:
            idx = [int(i) for i in rows]
            return self._log_p_feasible(X_pool[idx, :n_space], [pool[i] for i in idx],
                                        [keys[i] for i in idx], skip_below)

        return _Weigher(log_p, len(pool), n, X_pool.dtype, self.memory_model is not None)

    def _price_weights(self, X_pool: Any, seed: int, info: dict[str, Any]) -> Any:
        """Log weights of each pool row for its predicted price (:mod:`~cubicml_lab.search.cost`:
        cost-cooled expected improvement), or None where prices are not weighed: the option is
        off, too few full trials told a price, or the price model cannot be fitted. ``info``
        gains ``price`` (what was done), ``alpha`` and ``predicted_device_s`` (the median)."""
        import torch

        if not self.options.cost_aware:
            return None
        configs, costs = cost_observations(self._history)
        if len(configs) < COST_MIN_TRIALS or float(costs.max()) <= float(costs.min()):
            return None
        try:
            with torch.random.fork_rng():  # the objective's choices never hang on this fit
                model = self._fit(configs, costs, seed, metric=COST_METRIC,
                                  direction="maximize")
        except PredictorError as err:
            info["price"] = f"price model not fitted: {err.message}"
            return None
        n_space = self.space.encoded_bounds().shape[1]
        mu = model.posterior_encoded(X_pool[:, :n_space])[0]
        log_cost = mu if self.log_objective else np.log(np.maximum(mu, 1e-12))
        spent = sum(told_cost(h["values"]) or 0.0 for h in self._history)
        alpha = cooling(self.budget_plan, self.n_told, spent)
        w, info["price"] = cost_log_weights(log_cost, alpha)
        info["alpha"] = alpha
        info["predicted_device_s"] = float(np.exp(np.median(log_cost)))
        return torch.as_tensor(w, dtype=X_pool.dtype) if np.any(w) else None

    def _before_the_gp(self, n: int, pool: list[dict], rng: np.random.Generator, seed: int,
                       info: dict[str, Any], prior: bool) -> list[dict]:
        """The prior's picks (phase "prior") or the space-filling design, which a feasibility
        model (the memory model, or failures told) weights by the probability of running, and
        told prices (:meth:`_price_weights`) by the price: coverage per device-second."""
        import torch

        try:
            self.feasibility_model = self._fit_feasibility(seed)
        except PredictorError:
            self.feasibility_model = None
        if prior:
            out = self._prior_picks(n, pool, rng, info)
            if out is not None:
                info["reason"] = (f"the prior's best predicted-feasible configurations "
                                  f"({info['reason']})")
                info["phase"] = "prior"
                return out
        p_ok = None
        X = self._normalised_space_rows(pool)
        if self.feasibility_model is not None:
            p_ok = np.exp(self._log_p_feasible(X, pool, self._pool_keys(pool)))
        price_w = self._price_weights(torch.as_tensor(X), seed, info) if pool else None
        if price_w is not None:  # coverage per price: a cost-effective design (CArBO)
            w = np.exp(price_w.numpy() - float(price_w.max()))
            p_ok = w if p_ok is None else p_ok * w
        return space_filling(n, pool, self.space,
                             [h["config"] for h in self._history] + self.pending, rng, p_ok)

