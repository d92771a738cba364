"""Bayesian optimisation over a discrete pool: a GP on log(objective), noisy expected improvement.

:class:`BayesianSearch` runs in two phases.

1. **Initial design** until ``n_init`` ok observations exist: greedy maximin in the normalised
   encoded space (each column scaled to [0, 1] by ``space.encoded_bounds()``). The first point is a
   seeded random pick when nothing has been tried; every later point is the untried configuration
   farthest from everything already told (failures included), pending or picked.
2. **BO**: a :class:`~cubicml_lab.surrogate.GPPredictor` (``SingleTaskGP``, ``Normalize`` /
   ``Standardize``, float64) is fitted on ``log(objective)`` of the ok observations (on
   ``log(1 / objective)`` when minimising, so a larger model output is always better), and
   ``qLogNoisyExpectedImprovement`` (``X_baseline`` = observed ok configurations,
   ``prune_baseline=True``, a seeded ``SobolQMCNormalSampler``) is evaluated exhaustively over the
   untried pool in chunks of shape ``(chunk, 1, d)`` (a pool larger than ``SCREEN_SIZE`` is first
   screened to that many by the analytic log EI against the best posterior mean observed). A
   batch (``n > 1``) is built greedily: take the best, add it to ``X_pending``, re-evaluate,
   repeat, so the batch is diverse. Configurations asked but not yet told are passed as
   ``X_pending`` too. The hyperparameters are fitted from scratch only every 25 % of growth of
   the history and warm-started in between (``BayesianSearch._fit``).

If the GP cannot be fitted (fewer than 2 distinct ok configurations, all ok values identical, or a
numerical failure) that ask falls back to the space-filling step; :attr:`last_ask_info` says why.

**Failures.** Failed trials (oom, failed, timeout) do not enter the objective's GP; they are never
proposed again, and they teach a :class:`~cubicml_lab.surrogate.FeasibilityModel` (a GP classifier
of ran/failed, and with ``memory_limit_gib`` a log peak-memory GP): the acquisition value of every
candidate is multiplied by its probability of running (added in log space), so the search learns
the out-of-memory boundary instead of walking into it again. Before the first failure (and without
a memory limit) the weight is 1.

**Stopping.** Each BO ask records the best feasibility-weighted expected improvement, relative to
the incumbent (with ``log_objective`` the expected improvement of ``log(objective)`` is already
relative: 0.005 is 0.5 %). :meth:`BayesianSearch.should_stop` fires when it has stayed below
``stop_threshold`` for ``stop_patience`` BO asks in a row; :attr:`stop_reason` says so in words.

**Two objectives.** With ``second_objective`` (e.g. ``"peak_mem_gib"``, minimised by default) the
search models both (a GP each, on logs) and maximises ``qLogNoisyExpectedHypervolumeImprovement``
with the reference point just below the worst observed values; :meth:`BayesianSearch.pareto`
returns the non-dominated trials. The stopping rule then reads the expected hypervolume
improvement relative to the current hypervolume.

Determinism: torch and numpy are seeded from ``(seed, n_told)`` at each ask, so a searcher told the
same history proposes the same configurations (a resumed campaign continues as if it had never
stopped).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import replace
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PredictorError, SearchError
from .base import Searcher
from .proposal import Proposal

if TYPE_CHECKING:
    import torch

    from ..space import Space

__all__ = ["BayesianSearch", "default_n_init"]

#: L-BFGS-B iterations of a warm-started hyperparameter fit (see ``BayesianSearch._fit``).
WARM_MAX_ITER = 40
#: L-BFGS-B iterations of each feasibility-model GP (cold-started at every ask).
FEASIBILITY_MAX_ITER = 40
#: Observed configurations (those of highest posterior mean) kept as qLogNEI's baseline.
BASELINE_MAX = 64
#: Pools larger than this are screened by analytic log EI to this many before qLogNEI runs.
SCREEN_SIZE = 2048


def log_ei_standard(z: torch.Tensor) -> torch.Tensor:
    """``log(phi(z) + z * Phi(z))``: the log expected improvement over ``z`` of a standard
    normal, elementwise, float64, stable far into the negative tail.

    The expected improvement of ``N(mu, sigma^2)`` over a threshold ``t`` is
    ``sigma * h((mu - t) / sigma)`` with this ``h``. For ``z <= -1`` it is computed as
    ``log phi(z) + log1p(-|z| sqrt(pi/2) erfcx(|z| / sqrt 2))``, and below ``z = -1e4`` as
    ``log phi(z) - 2 log|z|`` (the leading term), where the direct form would round to
    ``log 0``. Agrees with BoTorch's analytic LogEI to 1e-9 (``tests/test_search.py``).

    Example:
        >>> import torch
        >>> round(float(log_ei_standard(torch.tensor([0.0], dtype=torch.float64))[0]), 6)
        -0.918939
    """
    import torch

    z = torch.as_tensor(z, dtype=torch.float64)
    log_phi = -0.5 * z * z - 0.5 * math.log(2.0 * math.pi)
    upper = torch.log(torch.exp(log_phi) + z * torch.special.ndtr(z))  # z > -1
    tail = torch.clamp(z, max=-1.0)
    w = -tail * math.sqrt(math.pi / 2.0) * torch.special.erfcx(-tail / math.sqrt(2.0))
    lower = log_phi + torch.log1p(-w.clamp(max=1.0 - 1e-16))
    far = log_phi - 2.0 * torch.log(-torch.clamp(z, max=-1.0))
    return torch.where(z > -1.0, upper, torch.where(z > -1e4, lower, far))


def default_n_init(space: Space, pool_size: int | None = None) -> int:
    """Initial-design size: ``min(max(4, d + 1), 8)`` with ``d`` the encoded dimension, and at
    most a tenth of an explicit candidate pool of ``pool_size`` (but at least 3): on a table of
    40 configurations, 8 random trials would already be a fifth of it."""
    n = min(max(4, len(space.encoded_names) + 1), 8)
    return n if pool_size is None else min(n, max(3, pool_size // 10))


class BayesianSearch(Searcher):
    """GP-based Bayesian optimisation with the ask/tell interface of :class:`Searcher`.

    Args:
        space, objective, direction, candidates, seed, num_candidates: as :class:`Searcher`.
        n_init: Ok observations to collect by space-filling design before the GP takes over
            (default :func:`default_n_init`: ``min(max(4, d + 1), 8)``, ``d`` = encoded dimension,
            and at most a tenth of an explicit candidate pool).
        log_objective: Model ``log(objective)`` (default; ok values must then be > 0).
        mc_samples: Quasi-Monte-Carlo samples of the acquisition function.
        chunk_size: Pool configurations evaluated per acquisition call (memory vs. speed).
        feasibility: Weight the acquisition by the probability of running (module doc).
        memory_limit_gib: Device memory; with it the weight includes P(peak memory <= limit),
            learned from the ``memory_metric`` told with ok trials.
        memory_metric: Name of the peak-memory metric in the told values.
        second_objective: A second metric to optimise (Pareto search), e.g. "peak_mem_gib".
        second_direction: Its direction, "minimize" (default) or "maximize".
        stop_threshold: Relative expected improvement under which a BO ask counts as flat.
        stop_patience: Flat BO asks in a row after which :meth:`should_stop` fires.
        noise_metric: A told metric holding each trial's relative spread (e.g.
            "step_time_rel_ci"), passed to the GP as observed noise; None infers one noise level.
        cost_model: An analytical cost model for the objective GP's prior mean
            (``GPPredictor(cost_model=...)``, e.g. ``Dataset.cost_model`` or a function calling
            :func:`cubicml_lab.workloads.gpt.cost_terms`): better guesses from the first trials.
        features: Derived inputs for the objective GP's kernel (``GPPredictor(features=...)``,
            e.g. ``Dataset.features`` or :func:`cubicml_lab.workloads.gpt.shape_features`).

    Attributes:
        last_ask_info: What the last proposing ask did: ``phase`` ("initial", "bo" or
            "fallback"), ``reason``, ``fit_s`` and ``ask_s`` (seconds), ``max_acquisition`` (log
            acquisition value of the first pick, None outside BO), ``acquisition`` (one value per
            pick), ``n_ok`` and ``n_pool`` (untried configurations considered).
        predictor: The :class:`~cubicml_lab.surrogate.GPPredictor` of the last BO ask, or None.
        feasibility_model: The :class:`~cubicml_lab.surrogate.FeasibilityModel` of the last BO
            ask, or None (no failure told yet and no memory limit).
        improvement_trace: The best relative expected improvement of each BO ask, in order.
        stop_reason: Why :meth:`should_stop` fired, or None.

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
                 n_init: int | None = None, num_candidates: int = 5000, *,
                 log_objective: bool = True, mc_samples: int = 128,
                 chunk_size: int = 1024, feasibility: bool = True,
                 memory_limit_gib: float | None = None, memory_metric: str = "peak_mem_gib",
                 second_objective: str | None = None, second_direction: str = "minimize",
                 stop_threshold: float = 0.005, stop_patience: int = 3,
                 noise_metric: str | None = None,
                 cost_model: Callable[[dict], Any] | None = None,
                 features: Callable[[dict], Any] | None = None) -> None:
        super().__init__(space, objective, direction, candidates, seed,
                         num_candidates=num_candidates)
        if n_init is None:
            n_init = default_n_init(space, None if self._candidates is None
                                    else len(self._candidates))
        for name, v, low in (("n_init", n_init, 0), ("mc_samples", mc_samples, 1),
                             ("chunk_size", chunk_size, 1), ("stop_patience", stop_patience, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise SearchError(f"{name} = {v!r} must be an int >= {low}", hint="e.g. 8")
        for name, v in (("stop_threshold", stop_threshold), ("memory_limit_gib", memory_limit_gib)):
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise SearchError(f"{name} = {v!r} must be a number > 0",
                                  hint="e.g. stop_threshold=0.005 (0.5 %), memory_limit_gib=80")
        if second_direction not in ("maximize", "minimize"):
            raise SearchError(f"second_direction = {second_direction!r} is not 'maximize' or "
                              "'minimize'", hint="peak memory is minimised: 'minimize'")
        for name, fn in (("cost_model", cost_model), ("features", features)):
            if second_objective is not None and fn is not None:
                raise SearchError(f"{name} works with one objective, not with second_objective",
                                  hint="drop one of them")
            if fn is not None and not callable(fn):
                raise SearchError(f"{name} = {fn!r:.60} is not callable",
                                  hint="pass a function config -> list of numbers, or None")
        if second_objective is not None and second_objective == objective:
            raise SearchError(f"second_objective = {second_objective!r} is the objective itself",
                              hint="name another metric, e.g. 'peak_mem_gib'")
        self.n_init = n_init
        self.log_objective = bool(log_objective)
        self.requires_positive = self.log_objective
        self.mc_samples = mc_samples
        self.chunk_size = chunk_size
        self.feasibility = bool(feasibility)
        self.memory_limit_gib = memory_limit_gib
        self.memory_metric = memory_metric
        self.second_objective = second_objective
        self.second_direction = second_direction
        self.stop_threshold = float(stop_threshold)
        self.stop_patience = stop_patience
        self.noise_metric = noise_metric
        self.cost_model = cost_model
        self.features = features
        self.last_ask_info: dict[str, Any] = {}
        self.predictor: Any = None
        self.second_predictor: Any = None
        self.feasibility_model: Any = None
        self.improvement_trace: list[float] = []
        self._anchors: dict[str, tuple[int, Any]] = {}
        self._row_of: dict[str, int] = {}
        self._rows: list[np.ndarray] = []
        self._rows_tensor: Any = None
        self.stop_reason: str | None = None

    # -- phases ---------------------------------------------------------------------------------
    def _normalised(self, configs: Sequence[dict]) -> np.ndarray:
        bounds = self.space.encoded_bounds()
        span = np.where(bounds[1] > bounds[0], bounds[1] - bounds[0], 1.0)
        if not configs:
            return np.zeros((0, bounds.shape[1]))
        return (self.space.encode_array(configs) - bounds[0]) / span

    def _space_filling(self, n: int, pool: list[dict], rng: np.random.Generator) -> list[dict]:
        """Greedy maximin: each pick maximises its distance to everything tried or picked."""
        order = rng.permutation(len(pool))  # random tie-breaks, random first pick
        P = self._normalised([pool[i] for i in order])
        seen = self._normalised([h["config"] for h in self._history] + self.pending)
        min_d = np.full(len(P), np.inf)
        for start in range(0, len(seen), 256):
            block = seen[start:start + 256]
            d = np.sqrt(((P[:, None, :] - block[None, :, :]) ** 2).sum(-1)).min(axis=1)
            min_d = np.minimum(min_d, d)
        picks: list[int] = []
        for _ in range(min(n, len(P))):
            j = int(np.argmax(min_d))  # all inf (nothing seen): index 0, a random config
            picks.append(j)
            min_d = np.minimum(min_d, np.sqrt(((P - P[j]) ** 2).sum(-1)))
            min_d[picks] = -np.inf
        return [dict(pool[int(order[j])]) for j in picks]

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

    def _fit(self, configs: list[dict], values: np.ndarray, seed: int,
             metric: str | None = None, direction: str | None = None,
             noise: np.ndarray | None = None) -> Any:
        """A GP of ``metric`` on the ok history, hyperparameters warm-started.

        Refitting from scratch after every trial costs hundreds of L-BFGS iterations. Instead the
        hyperparameters are fitted cold only at *anchor* sizes of the history (every 25 % of
        growth, :meth:`_anchor`), on the first ``anchor`` ok observations with a seed of its own;
        in between, the fit starts from the anchor's hyperparameters and runs at most
        ``WARM_MAX_ITER`` iterations. Both depend only on the told history, so a resumed search
        refits the same anchor and proposes what the original would have.
        """
        from ..surrogate import GPPredictor

        metric = metric or self.objective
        values = self._model_values(values, direction or self.direction)
        n = len(configs)
        m = self._anchor(n)

        def make(s: int) -> Any:
            return GPPredictor(self.space, metric, log_objective=self.log_objective, seed=s,
                               cost_model=self.cost_model if metric == self.objective else None,
                               features=self.features if metric == self.objective else None)

        anchor_seed = int(np.random.default_rng([self.seed, m, 7]).integers(2**31 - 1))
        cached = self._anchors.get(metric)
        if cached is None or cached[0] != m:
            if n == m:
                pred = make(anchor_seed).fit(configs, values, noise=noise)
                self._anchors[metric] = (m, pred)
                return pred
            sub_noise = None if noise is None else noise[:m]
            try:
                anchor = make(anchor_seed).fit(configs[:m], values[:m], noise=sub_noise)
            except PredictorError:  # e.g. the first m were all identical: fit cold instead
                return make(seed).fit(configs, values, noise=noise)
            self._anchors[metric] = cached = (m, anchor)
        if n == m:
            return cached[1]
        return make(seed).fit(configs, values, noise=noise, warm_start=cached[1],
                              max_iter=WARM_MAX_ITER)

    def _second_values(self) -> tuple[list[dict], np.ndarray]:
        """The ok trials told with a finite, usable value of ``second_objective``."""
        rows = [h for h in self._history if h["status"] == "ok"
                and self.second_objective in h["values"]
                and (h["values"][self.second_objective] > 0 or not self.log_objective)]
        return ([h["config"] for h in rows],
                np.array([h["values"][self.second_objective] for h in rows], dtype=np.float64))

    def _noise(self) -> np.ndarray | None:
        if self.noise_metric is None:
            return None
        ok = [h for h in self._history if h["status"] == "ok"]
        if not all(self.noise_metric in h["values"] for h in ok):
            return None  # some trial lacks it: infer one noise level instead
        return np.array([max(h["values"][self.noise_metric], 0.0) for h in ok])

    def _fit_feasibility(self, seed: int) -> Any:
        """The FeasibilityModel of everything told, or None while there is nothing to learn."""
        from ..surrogate import FeasibilityModel

        failed = any(h["status"] != "ok" for h in self._history)
        if not self.feasibility or not (failed or self.memory_limit_gib is not None):
            return None
        mem = [h["values"].get(self.memory_metric, np.nan) for h in self._history]
        return FeasibilityModel(self.space, seed=seed, max_iter=FEASIBILITY_MAX_ITER).fit(
            [h["config"] for h in self._history], [h["status"] for h in self._history], mem)

    def _acquisition(self, X_base: Any, seed: int) -> tuple[Any, Any]:
        """``(factory(X_pending) -> acquisition function, incumbent scale)``."""
        import torch
        from botorch.sampling import SobolQMCNormalSampler

        sampler = SobolQMCNormalSampler(torch.Size([self.mc_samples]), seed=seed)
        if self.second_predictor is None:
            from botorch.acquisition.logei import qLogNoisyExpectedImprovement

            model = self.predictor.model
            if self.log_objective:
                scale = 1.0  # EI of log(y) is already relative
            else:
                scale = max(abs(float(model.posterior(X_base).mean.max())), 1e-12)

            def single(X_pending: Any) -> Any:
                return qLogNoisyExpectedImprovement(model, X_baseline=X_base, sampler=sampler,
                                                    X_pending=X_pending, prune_baseline=True)
            return single, scale

        from botorch.acquisition.multi_objective.logei import (
            qLogNoisyExpectedHypervolumeImprovement,
        )
        from botorch.models import ModelListGP
        from botorch.utils.multi_objective.box_decompositions import DominatedPartitioning

        model = ModelListGP(self.predictor.model, self.second_predictor.model)
        with torch.no_grad():
            Y = model.posterior(X_base).mean
        span = (Y.max(0).values - Y.min(0).values).clamp_min(1e-6)
        ref = Y.min(0).values - 0.1 * span
        hv = float(DominatedPartitioning(ref_point=ref, Y=Y).compute_hypervolume())

        def multi(X_pending: Any) -> Any:
            return qLogNoisyExpectedHypervolumeImprovement(
                model, ref_point=ref.tolist(), X_baseline=X_base, sampler=sampler,
                X_pending=X_pending, prune_baseline=True)
        return multi, max(hv, 1e-12)

    def _encode_pool(self, pool: list[dict]) -> Any:
        """``space.encode(pool)`` through a cache keyed by configuration: a fixed pool of tens of
        thousands is encoded once per search, not at every ask. With a ``cost_model`` or
        ``features`` the rows go on with their logs (the objective GP's input; the feasibility
        model takes the space's columns)."""
        import torch

        keys = self._untried_keys if len(self._untried_keys) == len(pool) else \
            [self.space.key(c) for c in pool]
        new = [i for i, k in enumerate(keys) if k not in self._row_of]
        if new:
            rows = self.space.encode_array([pool[i] for i in new])
            if self.cost_model is not None or self.features is not None:  # the objective GP's
                extra = self.predictor.derived_columns([pool[i] for i in new], "candidates")
                rows = np.concatenate([rows, extra.numpy()], axis=1)  # input: + derived columns
            start = len(self._rows)
            self._rows.extend(rows)
            for j, i in enumerate(new):
                self._row_of[keys[i]] = start + j
            self._rows_tensor = None
        if self._rows_tensor is None:
            self._rows_tensor = torch.from_numpy(np.asarray(self._rows, dtype=np.float64))
        return self._rows_tensor[torch.as_tensor([self._row_of[k] for k in keys])]

    def _bo(self, n: int, pool: list[dict], configs: list[dict], seed: int,
            info: dict[str, Any]) -> list[dict]:
        import torch

        X_base = self.predictor.encode(configs)
        X_pool = self._encode_pool(pool)
        n_space = self.space.encoded_bounds().shape[1]
        single = self.second_predictor is None
        keep = max(SCREEN_SIZE, 8 * n)
        mu_b = None
        if single and (len(configs) > BASELINE_MAX or len(pool) > keep):
            mu_b = torch.as_tensor(self.predictor.posterior_encoded(X_base)[0])
        if single and len(configs) > BASELINE_MAX:
            # noisy EI integrates over which observed point is the incumbent; only those with a
            # high posterior mean can be (BoTorch's prune_baseline then trims further)
            X_base = X_base[torch.topk(mu_b, BASELINE_MAX).indices]
            info["baseline"] = BASELINE_MAX
        score = None
        if single and len(pool) > keep:
            # screen with the analytic log EI (no joint samples) against the best posterior
            # mean observed: the exact acquisition then runs over the most promising only; with
            # a feasibility model, first to 4x that many by EI alone (its GP is not evaluated
            # over the whole pool), then by EI x P(feasible)
            mu, var = (torch.as_tensor(a) for a in self.predictor.posterior_encoded(X_pool))
            sigma = var.clamp_min(1e-18).sqrt()
            score = torch.nan_to_num(log_ei_standard((mu - float(mu_b.max())) / sigma)
                                     + sigma.log(), nan=-torch.inf)
            first = min(len(pool), 4 * keep if self.feasibility_model is not None else keep)
            top = torch.topk(score, first).indices.sort().values
            pool, X_pool, score = [pool[int(i)] for i in top], X_pool[top], score[top]
            info["screened"] = keep
        log_w = torch.zeros(len(pool), dtype=X_pool.dtype)
        if self.feasibility_model is not None:
            p = self.feasibility_model.predict_encoded(X_pool[:, :n_space], len(pool),
                                                       memory_limit=self.memory_limit_gib)
            log_w = torch.as_tensor(np.log(np.clip(p, 1e-12, 1.0)), dtype=X_pool.dtype)
            info["p_feasible_of_picks"] = []
            if score is not None and len(pool) > keep:
                top = torch.topk(score + log_w, keep).indices.sort().values
                pool, X_pool, log_w = [pool[int(i)] for i in top], X_pool[top], log_w[top]
        pending = self.pending
        X_pend = self.predictor.encode(pending) if pending else X_pool[:0]
        picks: list[int] = []
        acq_values: list[float] = []
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make, scale = self._acquisition(X_base, seed)
            for _ in range(min(n, len(pool))):
                Xp = torch.cat([X_pend, X_pool[picks]]) if picks or pending else None
                acqf = make(Xp)
                vals = torch.cat([acqf(X_pool[i:i + self.chunk_size].unsqueeze(1))
                                  for i in range(0, len(pool), self.chunk_size)])
                vals = torch.nan_to_num(vals, nan=-torch.inf) + log_w
                if picks:
                    vals[picks] = -torch.inf
                j = int(torch.argmax(vals))
                picks.append(j)
                acq_values.append(float(vals[j]))
                if "p_feasible_of_picks" in info:
                    info["p_feasible_of_picks"].append(float(torch.exp(log_w[j])))
        info["acquisition"] = acq_values
        info["max_acquisition"] = acq_values[0] if acq_values else None
        if acq_values:
            info["relative_improvement"] = float(np.exp(acq_values[0])) / scale
        return [dict(pool[j]) for j in picks]

    # -- the Searcher hook ----------------------------------------------------------------------
    def _propose(self, n: int, pool: list[dict], rng: np.random.Generator) -> list[dict]:
        import torch

        t0 = time.perf_counter()
        seed = int(rng.integers(2**31 - 1))
        torch.manual_seed(seed)
        configs, values = self._ok()
        info: dict[str, Any] = {"phase": "initial", "reason": "", "fit_s": 0.0, "ask_s": 0.0,
                                "max_acquisition": None, "acquisition": [],
                                "relative_improvement": None,
                                "n_ok": len(configs), "n_pool": len(pool)}
        self.last_ask_info = info
        blocked = self._not_ready(configs, values, self.n_init, "the GP")
        if blocked:
            info["phase"], info["reason"] = blocked
        else:
            try:
                self.predictor = self._fit(configs, values, seed, noise=self._noise())
                self.second_predictor = None
                if self.second_objective is not None:
                    c2, v2 = self._second_values()
                    if len(c2) != len(configs):
                        raise PredictorError(
                            f"{len(configs) - len(c2)} ok trials were told without a usable "
                            f"{self.second_objective!r}", hint="tell both metrics")
                    self.second_predictor = self._fit(c2, v2, seed, self.second_objective,
                                                      self.second_direction)
                self.feasibility_model = self._fit_feasibility(seed)
                info["fit_s"] = time.perf_counter() - t0
                info["phase"] = "bo"
                info["reason"] = f"GP on {len(configs)} ok observations"
            except PredictorError as err:
                info["reason"] = f"GP fit failed: {err.message}"
                info["phase"] = "fallback"
        if info["phase"] == "bo":
            try:
                out = self._bo(n, pool, configs, seed, info)
                self.improvement_trace.append(info["relative_improvement"])
            except RuntimeError as err:  # e.g. a kernel matrix that is not positive definite
                info["phase"], info["reason"] = "fallback", f"acquisition failed: {err}"
                out = self._space_filling(n, pool, rng)
        else:
            out = self._space_filling(n, pool, rng)
        info["ask_s"] = time.perf_counter() - t0
        return out

    def _explain(self, configs: list[dict], enqueued: list[bool]) -> list[Proposal]:
        """Proposals with the GP's prediction and 95% interval, P(runs) and the acquisition
        value of each pick (module doc); figures the searcher does not have yet stay None."""
        base = super()._explain(configs, enqueued)
        info = self.last_ask_info
        bo = info.get("phase") == "bo" and self.predictor is not None
        if not base or not bo:  # before the GP: the initial design or a fallback
            if info.get("phase") == "initial":
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
        acq = list(info.get("acquisition") or [])
        picks = iter(acq[-sum(not q for q in enqueued):] if acq else [])
        out = []
        for i, (p, queued) in enumerate(zip(base, enqueued)):
            a = None if queued else next(picks, None)
            why = p.reason if queued else (
                f"highest {'hypervolume ' if self.second_objective else ''}expected improvement"
                f"{' x P(runs)' if self.feasibility_model is not None else ''} among "
                f"{info.get('n_pool', 0):,} untried configurations ({info.get('reason', '')})")
            out.append(replace(p, predicted=float(mid[i]), lower=float(lo[i]),
                               upper=float(hi[i]), acquisition=a, reason=why,
                               p_feasible=None if p_ok[i] is None else float(p_ok[i])))
        return out

    # -- stopping and Pareto front --------------------------------------------------------------
    def should_stop(self) -> bool:
        """True when the last ``stop_patience`` BO asks each expected less than
        ``stop_threshold`` relative improvement (feasibility-weighted); :attr:`stop_reason`
        then says so with the figures.

        Example:
            >>> from cubicml_lab.space import Space, Int
            >>> s = BayesianSearch(Space([Int("micro_batch", 1, 8)]), seed=0)
            >>> s.should_stop()  # no BO ask yet
            False
        """
        recent = self.improvement_trace[-self.stop_patience:]
        if len(recent) < self.stop_patience or any(r >= self.stop_threshold for r in recent):
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
