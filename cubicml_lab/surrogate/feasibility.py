"""Will a configuration run? A memory model and a failure classifier, both Gaussian processes.

Most of a co-design space does not fit: a search that cannot tell spends its trials on
out-of-memory crashes. :class:`FeasibilityModel` learns two things from the trials so far:

* **Peak memory** (GiB, log scale): a :class:`~cubicml_lab.surrogate.GPPredictor` on the peak
  memory of the trials that ran. With a device memory ``limit`` the probability of fitting is
  ``P(memory <= limit) = Phi((log limit - mu) / sqrt(s^2 + noise))``: it tells which of the
  configurations that ran would not fit a smaller device.
* **Failures** (out of memory, crashes, timeouts): a GP on labels +1 (ran) / -1 (failed), read as
  ``P(run) = Phi(mu / sqrt(s^2 + noise))``. This is the least-squares GP classifier (Rasmussen &
  Williams, *GPML*, section 6.5): not a calibrated likelihood, but smooth in the configuration,
  cheap, and fitted by the same code as the rest. It learns the out-of-memory boundary of the
  memory the trials ran under. An out-of-memory trial's memory figure (what was allocated when
  it failed) is only a lower bound of what it needed, so it does not enter the memory model, and
  nothing here extrapolates to a device with *more* memory than the trials had: measure there.

``predict`` multiplies the two. Before there are two trials of each kind, the missing part
answers 1 (no evidence of failure) so that a search without failures is not held back.

**A memory prior** (``memory_model``: a function config -> predicted peak GiB, e.g.
``cml.analytical.LLMTrainingModel(...).memory_gib``) changes the memory part: it answers from
the first trial, before anything was measured. The GP then models the *ratio* of the measured
peak to the prediction (log scale), and every trial corrects it: an ok trial with a measured
peak gives its ratio; an out-of-memory trial says its peak was above the limit, told as the
censored ratio ``max(1, limit / predicted) * CENSOR_MARGIN``; an ok trial without a figure whose
prediction was above the limit says the peak was below it (``limit / predicted /
CENSOR_MARGIN``). With fewer than two such trials the ratio is their geometric mean (1 with
none), with a log-scale spread of :data:`PRIOR_LOG_SD`. ``P(fits) = Phi((log limit - log
predicted - mu) / sd)``. Out-of-memory trials then teach the memory part from the first one.
They teach the classifier too, as every other failure does. The ratio GP corrects the memory
model smoothly; where the model is wrong in structure (a pipeline schedule that holds twice the
micro-batches it prices, so that layouts heavy in activations need more than the lighter ones
measured) one censored ratio among many ok ones is largely put down to noise, and the
classifier keeps the failure's neighbours unlikely whatever the ratio GP says.

Example:
    >>> from cubicml_lab.space import Space, PowerOfTwo
    >>> space = Space([PowerOfTwo("micro_batch", 1, 64)])
    >>> cfgs = space.enumerate()
    >>> fm = FeasibilityModel(space).fit(cfgs, ["ok"] * 5 + ["oom"] * 2)
    >>> p = fm.predict([{"micro_batch": 2}, {"micro_batch": 64}])
    >>> bool(p[0] > 0.8 and p[1] < 0.2)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .._params import brief
from ..errors import PredictorError
from ..trials import FINISHED
from .gp import GPPredictor
from .terms import evaluate_many

if TYPE_CHECKING:
    import torch

    from ..space import Space

__all__ = ["CENSOR_MARGIN", "PRIOR_LOG_SD", "FeasibilityModel"]

#: Spread (log scale) of a memory model's prediction before any trial corrects it: 0.1 = 10 %.
PRIOR_LOG_SD = 0.1
#: How far past the limit an out-of-memory trial's peak is taken to be (a censored observation).
CENSOR_MARGIN = 1.05


class FeasibilityModel:
    """Probability that a configuration runs, and fits in a given memory.

    Args:
        space: The configurations' space.
        seed: Seed of the GP fits.
        max_iter: Cap on each GP's L-BFGS-B iterations (None: to convergence); a searcher that
            refits after every trial caps it to stay fast.
        memory_model: Optional prior of peak memory, ``config -> GiB`` (module doc); with it the
            memory part answers before any trial, and fitting needs ``memory_limit``.

    Attributes:
        memory: The peak-memory :class:`GPPredictor` (GiB), or None (fewer than 2 trials with a
            memory figure).
        classifier: The ran/failed GP (labels +1/-1), or None (fewer than 2 trials, or all of one
            kind).
        all_failed: True when every trial the classifier saw failed (then it predicts 0).
        memory_ratio: With a memory model and fewer than two trials for its GP: the log ratio
            of measured to predicted peak memory applied to every configuration (0 with none).
    """

    def __init__(self, space: Space, *, seed: int = 0, max_iter: int | None = None,
                 memory_model: Callable[[dict], float] | None = None) -> None:
        if memory_model is not None and not callable(memory_model):
            raise PredictorError(f"memory_model = {brief(memory_model)} is not callable",
                                 hint="pass a function config -> predicted peak memory in GiB")
        self.space = space
        self.seed = seed
        self.max_iter = max_iter
        self.memory_model = memory_model
        self.memory: GPPredictor | None = None
        self.classifier: GPPredictor | None = None
        self.all_failed = False
        self.memory_ratio = 0.0

    def prior_gib(self, configs: Sequence[dict]) -> np.ndarray:
        """The memory model's prediction per configuration, GiB, checked (finite, > 0)."""
        rows = evaluate_many("memory_model", self.memory_model, list(configs))
        try:
            out = np.asarray(rows, dtype=np.float64).reshape(len(rows))
        except (TypeError, ValueError):
            out = np.full(len(rows), np.nan)
        bad = ~(np.isfinite(out) & (out > 0))
        if bad.any():
            i = int(np.argmax(bad))
            raise PredictorError(f"memory_model(configs[{i}]) = {brief(rows[i])} is not a "
                                 "finite number of GiB > 0",
                                 hint="return the predicted peak memory per GPU in GiB")
        return out

    def fit(self, configs: Sequence[dict], statuses: Sequence[str],
            peak_mem_gib: Sequence[float] | None = None, *,
            memory_limit: float | None = None,
            warm_start: FeasibilityModel | None = None,
            warm_max_iter: int | None = 0) -> FeasibilityModel:
        """Fit both parts to finished trials.

        Args:
            configs: n configurations.
            statuses: n statuses: ``"ok"``, ``"oom"``, ``"failed"`` or ``"timeout"``.
            peak_mem_gib: n peak memories in GiB (NaN where unknown), used for ``"ok"`` trials.
            memory_limit: Device memory in GiB; needed with a ``memory_model`` (the censored
                observations of out-of-memory trials are relative to it).
            warm_start: A fitted FeasibilityModel of the same space whose memory and
                classifier GPs' hyperparameters start this one's (``GPPredictor.fit``'s
                ``warm_start``). A GP with a warm start runs at most ``warm_max_iter``
                L-BFGS-B iterations (0, the default: none, it conditions on these trials
                with the warm start's hyperparameters); one without fits cold (``max_iter``).

        Returns:
            self.

        Raises:
            PredictorError: Lengths that do not match, an unknown status, or a bad memory figure.
        """
        configs = list(configs)
        statuses = [str(s) for s in statuses]
        n = len(configs)
        if len(statuses) != n or (peak_mem_gib is not None and len(peak_mem_gib) != n):
            raise PredictorError(
                f"{n} configs but {len(statuses)} statuses"
                + ("" if peak_mem_gib is None else f" and {len(peak_mem_gib)} memory figures"),
                hint="pass one status (and memory figure) per configuration")
        bad = [s for s in statuses if s not in FINISHED]
        if bad:
            raise PredictorError(f"unknown status {bad[0]!r}", hint=f"one of {FINISHED}")
        mem = (np.full(n, np.nan) if peak_mem_gib is None
               else np.asarray(peak_mem_gib, dtype=np.float64))

        mem_cfgs, mem_vals, cls_cfgs, labels = [], [], [], []
        for cfg, status, m in zip(configs, statuses, mem, strict=True):
            if status == "ok" and math.isfinite(m) and m > 0:
                mem_cfgs.append(cfg)
                mem_vals.append(m)
            cls_cfgs.append(cfg)
            labels.append(1.0 if status == "ok" else -1.0)

        self.memory = self.classifier = None
        if self.memory_model is not None:
            if memory_limit is None:
                raise PredictorError("a FeasibilityModel with a memory_model needs memory_limit",
                                     hint="fit(..., memory_limit=80) for an 80 GiB device")
            self._fit_ratio(configs, statuses, mem, float(memory_limit),
                            self._warm(warm_start, "memory", warm_max_iter))
        self.all_failed = bool(labels) and all(v < 0 for v in labels)
        if self.memory_model is None and _two_distinct(mem_cfgs):
            self.memory = GPPredictor(self.space, "peak_mem_gib", seed=self.seed).fit(
                mem_cfgs, mem_vals, **self._warm(warm_start, "memory", warm_max_iter))
        if len(set(labels)) == 2 and _two_distinct(cls_cfgs):
            self.classifier = GPPredictor(self.space, "runs", log_objective=False,
                                          seed=self.seed).fit(
                cls_cfgs, labels, **self._warm(warm_start, "classifier", warm_max_iter))
        return self

    def _warm(self, warm_start: FeasibilityModel | None, part: str,
              warm_max_iter: int | None) -> dict:
        """``GPPredictor.fit``'s ``max_iter`` and ``warm_start`` for ``part`` ("memory" or
        "classifier"): the warm start's GP of that part and ``warm_max_iter`` where it has
        one, else a cold fit of at most ``max_iter`` iterations."""
        gp = None if warm_start is None else getattr(warm_start, part)
        return {"max_iter": self.max_iter if gp is None else warm_max_iter, "warm_start": gp}

    def _fit_ratio(self, configs: list[dict], statuses: list[str], mem: np.ndarray,
                   limit: float, fit_args: dict) -> None:
        """The GP (or constant) of measured / predicted peak memory (module doc)."""
        prior = self.prior_gib(configs)
        cfgs, ratios = [], []
        for cfg, status, m, p in zip(configs, statuses, mem, prior, strict=True):
            if status == "ok" and math.isfinite(m) and m > 0:
                ratios.append(m / p)
            elif status == "oom":
                ratios.append(max(1.0, limit / p) * CENSOR_MARGIN)
            elif status == "ok" and p > limit:
                ratios.append(limit / p / CENSOR_MARGIN)
            else:
                continue
            cfgs.append(cfg)
        self.memory_ratio = float(np.mean(np.log(ratios))) if ratios else 0.0
        if _two_distinct(cfgs) and np.ptp(ratios) > 0:
            try:
                self.memory = GPPredictor(self.space, "peak_mem_ratio", seed=self.seed).fit(
                    cfgs, ratios, **fit_args)
            except PredictorError:
                self.memory = None

    def predict(self, configs: Sequence[dict], memory_limit: float | None = None) -> np.ndarray:
        """Probability, per configuration, that it runs (and fits in ``memory_limit`` GiB).

        Args:
            configs: n configurations of the space.
            memory_limit: Device memory in GiB; None leaves the memory model out.

        Returns:
            Float array of shape (n,) with values in [0, 1].
        """
        configs = list(configs)
        if not configs:
            return np.ones(0)
        X = self.classifier.encode(configs) if self.classifier is not None else \
            self.memory.encode(configs) if self.memory is not None else None
        prior = None
        if self.memory_model is not None and memory_limit is not None:
            prior = self.prior_gib(configs)
        return self.predict_encoded(X, len(configs), memory_limit, prior_gib=prior)

    def predict_encoded(self, X: torch.Tensor | None, n: int,
                        memory_limit: float | None = None, *,
                        prior_gib: np.ndarray | None = None, log: bool = False,
                        when_all_failed: np.ndarray | None = None,
                        skip_below: float | None = None) -> np.ndarray:
        """:meth:`predict` of ``n`` configurations already encoded (``space.encode``, shape
        (n, d)); ``X`` may be None when neither GP is fitted. With a ``memory_model``,
        ``prior_gib`` holds its prediction for each of the ``n`` (a searcher computes it once
        per pool); without it the memory part is left out. ``log=True`` returns ``log P``,
        exact far into the tail (a searcher weighing its acquisition by it can then tell a
        configuration 5 % over the limit from one 5 times over: ``P`` itself rounds to 0).
        ``when_all_failed``: the log probability of the failure part to use while every trial
        failed (default: P = 0 everywhere; a searcher passes one that grows with the distance
        to the failures). ``skip_below`` (with ``log=True``): a row whose other parts already
        put its ``log P`` below it skips the classifier and gets their sum, an upper bound of
        its ``log P`` (the classifier only lowers it): what a searcher that floors every row
        under a threshold needs, for a GP posterior fewer."""
        from scipy.stats import norm

        logp = np.zeros(n)
        if self.all_failed and when_all_failed is None:
            return np.full(n, -np.inf) if log else np.zeros(n)
        if self.all_failed:
            logp += np.asarray(when_all_failed, dtype=np.float64)
        memory = self._memory_log_p(X, n, memory_limit, prior_gib)
        if self.classifier is not None:
            rows = np.arange(n) if skip_below is None or not log else \
                np.flatnonzero(logp + memory >= skip_below)
            if len(rows):
                mu, var = self.classifier.posterior_encoded(X if len(rows) == n else X[rows])
                logp[rows] += norm.logcdf(mu / np.sqrt(var + self.classifier._new_noise_var))
        logp += memory
        return logp if log else np.exp(logp)

    def _memory_log_p(self, X: torch.Tensor | None, n: int, memory_limit: float | None,
                      prior_gib: np.ndarray | None) -> np.ndarray:
        """log P(fits in ``memory_limit``) of each row (0 where the memory part is left out)."""
        from scipy.stats import norm

        logp = np.zeros(n)
        if memory_limit is not None:
            if not (isinstance(memory_limit, (int, float)) and memory_limit > 0):
                raise PredictorError(f"memory_limit = {memory_limit!r} must be > 0 (GiB)",
                                     hint="e.g. memory_limit=80 for an 80 GiB device")
            if self.memory_model is not None and prior_gib is not None:
                mu, var = np.full(n, self.memory_ratio), np.full(n, PRIOR_LOG_SD**2)
                if self.memory is not None:
                    mu, var = self.memory.posterior_encoded(X)
                    var = var + self.memory._new_noise_var
                mu = mu + np.log(np.asarray(prior_gib, dtype=np.float64))
                logp += norm.logcdf((math.log(memory_limit) - mu) / np.sqrt(var))
            elif self.memory is not None and self.memory_model is None:
                mu, var = self.memory.posterior_encoded(X)
                sd = np.sqrt(var + self.memory._new_noise_var)
                logp += norm.logcdf((math.log(memory_limit) - mu) / sd)
        return logp


def _key(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))


def _two_distinct(configs: Sequence[dict]) -> bool:
    """Whether ``configs`` hold at least two distinct configurations; stops at the first one
    unlike the first (a search's thousand trials are not all keyed at every fit)."""
    if not configs:
        return False
    first = _key(configs[0])
    return any(_key(c) != first for c in configs[1:])
