"""The Bayesian search's acquisition: which untried configurations a fitted GP bets on.

A :class:`~cubicml_lab.search.BayesianSearch` in its BO phase hands this module its fitted
predictors, the encoded pool and the probability that each configuration runs; it gets back
the picks and their log acquisition values.

**Single objective.** ``qLogNoisyExpectedImprovement`` (``X_baseline`` = observed ok
configurations, those with an unflagged figure while any exists, ``prune_baseline=True``, a
seeded ``SobolQMCNormalSampler``) is evaluated exhaustively over the untried pool in chunks of
shape ``(chunk, 1, d)``, on the predictor's ``botorch_model()`` (the same posterior from its
cached Cholesky factor, each distinct row solved once:
:class:`~cubicml_lab.surrogate.posterior.FactorPosteriorModel`). A pool larger than ``SCREEN_SIZE`` is first screened to that many by
the analytic log EI (:func:`log_ei_standard`) against the best posterior mean observed, plus the
log probability of running where it is weighed (:func:`screen`: exactly the top of every
untried row, computed for far fewer), and a baseline larger than ``BASELINE_MAX`` keeps its highest posterior means
(:func:`trim_baseline`). A batch (``n > 1``) is built greedily (:func:`greedy_picks`): take the
best, add it to ``X_pending``, re-evaluate, repeat, so the batch is diverse; configurations asked
but not yet told are passed as ``X_pending`` too.

**Failures.** The acquisition value of every candidate is multiplied by its probability of
running (added in log space, exactly far into the tail, floored at ``LOG_P_FLOOR``:
:func:`feasibility_weights`), so the search learns the out-of-memory boundary instead of walking
into it again. With a memory model it also bounds the acquisition's bets: while at least as many
untried configurations as asked for have a probability of running of at least
``BO_P_FEASIBLE`` (0.5), the others are left out (weighted by ``LOG_P_FLOOR``). Without a memory
model every configuration stays in, weighted by its probability (a classifier of a few failures
is too rough to cut by).

**Two objectives.** With a second predictor the acquisition is
``qLogNoisyExpectedHypervolumeImprovement`` with the reference point just below the worst
observed values, and the improvement is read relative to the current hypervolume. BoTorch (0.18)
compiles a fused C++ kernel of that acquisition at its first use (``-O3 -march=native``, into
``~/.cache/torch_extensions``): tens of seconds at a search's first ask, and a library tuned to
one CPU in a cache that a cluster's nodes may share. :func:`acquisition_factory` keeps BoTorch's
PyTorch implementation instead, which proposes the same configurations in the same time (the
measurement: ``docs/results.md``, "History moved from the code").

Example:
    >>> import torch
    >>> round(float(log_ei_standard(torch.tensor([0.0], dtype=torch.float64))[0]), 6)
    -0.918939
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["acquisition_factory", "feasibility_weights", "greedy_picks", "log_ei_standard",
           "screen", "trim_baseline"]

#: Observed configurations (those of highest posterior mean) kept as qLogNEI's baseline.
BASELINE_MAX = 64
#: Pools larger than this are screened by analytic log EI to this many before qLogNEI runs.
SCREEN_SIZE = 2048
#: Floor of log P(runs) in the acquisition (a configuration all but sure to fail).
LOG_P_FLOOR = -1e4
#: With a memory model, BO proposes only configurations at least this likely to run while
#: enough of them remain (None: every configuration, weighted by its probability).
BO_P_FEASIBLE: float | None = 0.5


def log_ei_standard(z: torch.Tensor) -> torch.Tensor:
    """``log(phi(z) + z * Phi(z))``: the log expected improvement over ``z`` of a standard
    normal, elementwise, float64, stable far into the negative tail.

    The expected improvement of ``N(mu, sigma^2)`` over a threshold ``t`` is
    ``sigma * h((mu - t) / sigma)`` with this ``h``. For ``z <= -1`` it is computed as
    ``log phi(z) + log1p(-|z| sqrt(pi/2) erfcx(|z| / sqrt 2))``, and below ``z = -1e4`` as
    ``log phi(z) - 2 log|z|`` (the leading term), where the direct form would round to
    ``log 0``. Agrees with BoTorch's analytic LogEI to 1e-9 (``tests/test_search.py``).
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


def acquisition_factory(predictor: Any, second: Any, X_base: Any, mc_samples: int,
                        log_objective: bool, seed: int) -> tuple[Callable[[Any], Any], float]:
    """``(factory(X_pending) -> acquisition function, incumbent scale)`` of the fitted
    ``predictor`` (and ``second``, the second objective's, or None), baseline ``X_base``."""
    import torch
    from botorch.sampling import SobolQMCNormalSampler

    sampler = SobolQMCNormalSampler(torch.Size([mc_samples]), seed=seed)
    if second is None:
        from botorch.acquisition.logei import qLogNoisyExpectedImprovement

        # the same posterior as predictor.model's, each distinct row solved once (the
        # baseline rows shared by every candidate): several times faster, equal to rounding
        model = predictor.botorch_model() if hasattr(predictor, "botorch_model") \
            else predictor.model
        if log_objective:
            scale = 1.0  # EI of log(y) is already relative
        else:
            scale = max(abs(float(model.posterior(X_base).mean.max())), 1e-12)

        def single(X_pending: Any) -> Any:
            return qLogNoisyExpectedImprovement(model, X_baseline=X_base, sampler=sampler,
                                                X_pending=X_pending, prune_baseline=True)
        return single, scale

    from botorch.acquisition.multi_objective import logei
    from botorch.acquisition.multi_objective.logei import (
        qLogNoisyExpectedHypervolumeImprovement,
    )
    from botorch.models import ModelListGP
    from botorch.utils.multi_objective.box_decompositions import DominatedPartitioning

    if getattr(logei, "_C", None) is None and hasattr(logei, "_load_attempted"):
        logei._load_attempted = True  # no JIT build of the fused kernel (module doc)
    model = ModelListGP(predictor.model, second.model)
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


def trim_baseline(predictor: Any, X_base: Any) -> tuple[Any, Any]:
    """``(X_base, mu)``: the baseline cut to the ``BASELINE_MAX`` of highest posterior mean
    (noisy EI integrates over which observed point is the incumbent; only those with a high
    posterior mean can be, and BoTorch's ``prune_baseline`` then trims further), and the
    posterior means of the whole baseline given."""
    import torch

    mu = torch.as_tensor(predictor.posterior_encoded(X_base)[0])
    if len(X_base) > BASELINE_MAX:
        X_base = X_base[torch.topk(mu, BASELINE_MAX).indices]
    return X_base, mu


def screen(predictor: Any, X_pool: Any, best_mean: float, keep: int,
           weight: Callable[[Any], Any] | None = None) -> tuple[Any, Any]:
    """Screen a large pool with the analytic log EI (no joint samples) against the best
    posterior mean observed (``best_mean``), plus ``weight(indices)`` (log weights, at most 0:
    the probability of running) where given, so the exact acquisition runs over the most
    promising only. Returns ``(indices kept, their log EI plus weight)``, the indices in pool
    order. A GP predictor ranks by its exact posterior without computing every row's variance,
    nor the weight of rows that cannot be kept
    (:meth:`~cubicml_lab.surrogate.fitted.FittedGP.top_encoded`)."""
    import torch

    def log_ei(mu: Any, var: Any) -> Any:
        sigma = var.clamp_min(1e-18).sqrt()
        return log_ei_standard((mu - best_mean) / sigma) + sigma.log()

    if hasattr(predictor, "top_encoded"):
        return predictor.top_encoded(X_pool, log_ei, keep, weight)
    mu, var = (torch.as_tensor(a) for a in predictor.posterior_encoded(X_pool))
    score = log_ei(mu, var) if weight is None else \
        log_ei(mu, var) + weight(torch.arange(len(X_pool)))
    score = torch.nan_to_num(score, nan=-torch.inf)
    top = torch.topk(score, min(len(X_pool), keep)).indices.sort().values
    return top, score[top]


def feasibility_weights(log_p: np.ndarray, n: int, dtype: Any, cut: bool) -> Any:
    """Log weights of the acquisition: ``log P(runs)`` floored at ``LOG_P_FLOOR``; with ``cut``
    (a memory model) those under ``BO_P_FEASIBLE`` floored too, while ``n`` others remain."""
    import torch

    log_w = torch.as_tensor(np.maximum(log_p, LOG_P_FLOOR), dtype=dtype)
    if cut and BO_P_FEASIBLE is not None:
        likely = log_w >= math.log(BO_P_FEASIBLE)
        if int(likely.sum()) >= n:
            log_w = torch.where(likely, log_w, torch.full_like(log_w, LOG_P_FLOOR))
    return log_w


def greedy_picks(make: Callable[[Any], Any], X_pool: Any, X_pend: Any, n: int,
                 chunk_size: int, log_w: Any) -> tuple[list[int], list[float]]:
    """Pick ``n`` rows of ``X_pool`` one at a time, each the best of ``make(X_pending)`` plus
    ``log_w`` with the pending rows and the picks so far as ``X_pending``: ``(picks, values)``."""
    import torch

    picks: list[int] = []
    values: list[float] = []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(min(n, len(X_pool))):
            Xp = torch.cat([X_pend, X_pool[picks]]) if picks or len(X_pend) else None
            acqf = make(Xp)
            vals = torch.cat([acqf(X_pool[i:i + chunk_size].unsqueeze(1))
                              for i in range(0, len(X_pool), chunk_size)])
            vals = torch.nan_to_num(vals, nan=-torch.inf) + log_w
            if picks:
                vals[picks] = -torch.inf
            j = int(torch.argmax(vals))
            picks.append(j)
            values.append(float(vals[j]))
    return picks, values
