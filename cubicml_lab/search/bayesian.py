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
   untried pool in chunks of shape ``(chunk, 1, d)``. A batch (``n > 1``) is built greedily: take
   the best, add it to ``X_pending``, re-evaluate, repeat, so the batch is diverse. Configurations
   asked but not yet told are passed as ``X_pending`` too.

If the GP cannot be fitted (fewer than 2 distinct ok configurations, all ok values identical, or a
numerical failure) that ask falls back to the space-filling step; :attr:`last_ask_info` says why.
Failed trials (oom, failed, timeout) do not enter the GP; they are only never proposed again.

Determinism: torch and numpy are seeded from ``(seed, n_told)`` at each ask, so a searcher told the
same history proposes the same configurations (a resumed campaign continues as if it had never
stopped).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PredictorError, SearchError
from .base import Searcher

if TYPE_CHECKING:
    from ..space import Space

__all__ = ["BayesianSearch", "default_n_init"]


def default_n_init(space: Space) -> int:
    """Initial-design size: ``min(max(4, d + 1), 8)`` with ``d`` the encoded dimension."""
    return min(max(4, len(space.encoded_names) + 1), 8)


class BayesianSearch(Searcher):
    """GP-based Bayesian optimisation with the ask/tell interface of :class:`Searcher`.

    Args:
        space, objective, direction, candidates, seed, num_candidates: as :class:`Searcher`.
        n_init: Ok observations to collect by space-filling design before the GP takes over
            (default :func:`default_n_init`: ``min(max(4, d + 1), 8)``, ``d`` = encoded dimension).
        log_objective: Model ``log(objective)`` (default; ok values must then be > 0).
        mc_samples: Quasi-Monte-Carlo samples of the acquisition function.
        chunk_size: Pool configurations evaluated per acquisition call (memory vs. speed).

    Attributes:
        last_ask_info: What the last proposing ask did: ``phase`` ("initial", "bo" or
            "fallback"), ``reason``, ``fit_s`` and ``ask_s`` (seconds), ``max_acquisition`` (log
            acquisition value of the first pick, None outside BO), ``acquisition`` (one value per
            pick), ``n_ok`` and ``n_pool`` (untried configurations considered).
        predictor: The :class:`~cubicml_lab.surrogate.GPPredictor` of the last BO ask, or None.

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
                 chunk_size: int = 1024) -> None:
        super().__init__(space, objective, direction, candidates, seed,
                         num_candidates=num_candidates)
        if n_init is None:
            n_init = default_n_init(space)
        for name, v, low in (("n_init", n_init, 0), ("mc_samples", mc_samples, 1),
                             ("chunk_size", chunk_size, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise SearchError(f"{name} = {v!r} must be an int >= {low}", hint="e.g. 8")
        self.n_init = n_init
        self.log_objective = bool(log_objective)
        self.requires_positive = self.log_objective
        self.mc_samples = mc_samples
        self.chunk_size = chunk_size
        self.last_ask_info: dict[str, Any] = {}
        self.predictor: Any = None

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

    def _fit(self, configs: list[dict], values: np.ndarray, seed: int) -> Any:
        from ..surrogate import GPPredictor

        if self.direction == "minimize":
            values = 1.0 / values if self.log_objective else -values
        pred = GPPredictor(self.space, self.objective, log_objective=self.log_objective, seed=seed)
        return pred.fit(configs, values)

    def _bo(self, n: int, pool: list[dict], configs: list[dict], seed: int,
            info: dict[str, Any]) -> list[dict]:
        import torch
        from botorch.acquisition.logei import qLogNoisyExpectedImprovement
        from botorch.sampling import SobolQMCNormalSampler

        model = self.predictor.model
        X_base = self.space.encode(configs)
        X_pool = self.space.encode(pool)
        pending = self.pending
        X_pend = self.space.encode(pending) if pending else X_pool[:0]
        picks: list[int] = []
        acq_values: list[float] = []
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(min(n, len(pool))):
                Xp = torch.cat([X_pend, X_pool[picks]]) if picks or pending else None
                sampler = SobolQMCNormalSampler(torch.Size([self.mc_samples]), seed=seed)
                acqf = qLogNoisyExpectedImprovement(model, X_baseline=X_base, sampler=sampler,
                                                    X_pending=Xp, prune_baseline=True)
                vals = torch.cat([acqf(X_pool[i:i + self.chunk_size].unsqueeze(1))
                                  for i in range(0, len(pool), self.chunk_size)])
                vals = torch.nan_to_num(vals, nan=-torch.inf)
                if picks:
                    vals[picks] = -torch.inf
                j = int(torch.argmax(vals))
                picks.append(j)
                acq_values.append(float(vals[j]))
        info["acquisition"] = acq_values
        info["max_acquisition"] = acq_values[0] if acq_values else None
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
                                "n_ok": len(configs), "n_pool": len(pool)}
        self.last_ask_info = info
        if len(configs) < self.n_init:
            info["reason"] = f"{len(configs)} of n_init = {self.n_init} ok observations so far"
        else:
            n_distinct = len({self.space.key(c) for c in configs})
            if n_distinct < 2:
                info["reason"] = (f"only {n_distinct} distinct ok configuration; the GP needs 2")
            elif np.ptp(values) == 0:
                info["reason"] = (f"all {len(values)} ok values are identical ({values[0]:g}); "
                                  "the GP has nothing to learn")
            else:
                try:
                    self.predictor = self._fit(configs, values, seed)
                    info["fit_s"] = self.predictor.fit_seconds
                    info["phase"] = "bo"
                    info["reason"] = f"GP on {len(configs)} ok observations"
                except PredictorError as err:
                    info["reason"] = f"GP fit failed: {err.message}"
            if info["phase"] != "bo":
                info["phase"] = "fallback"
        if info["phase"] == "bo":
            try:
                out = self._bo(n, pool, configs, seed, info)
            except RuntimeError as err:  # e.g. a kernel matrix that is not positive definite
                info["phase"], info["reason"] = "fallback", f"acquisition failed: {err}"
                out = self._space_filling(n, pool, rng)
        else:
            out = self._space_filling(n, pool, rng)
        info["ask_s"] = time.perf_counter() - t0
        return out
