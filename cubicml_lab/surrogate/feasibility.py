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
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import PredictorError
from ..trials import FINISHED
from .gp import GPPredictor

if TYPE_CHECKING:
    import torch

    from ..space import Space

__all__ = ["FeasibilityModel"]



class FeasibilityModel:
    """Probability that a configuration runs, and fits in a given memory.

    Args:
        space: The configurations' space.
        seed: Seed of the GP fits.
        max_iter: Cap on each GP's L-BFGS-B iterations (None: to convergence); a searcher that
            refits after every trial caps it to stay fast.

    Attributes:
        memory: The peak-memory :class:`GPPredictor` (GiB), or None (fewer than 2 trials with a
            memory figure).
        classifier: The ran/failed GP (labels +1/-1), or None (fewer than 2 trials, or all of one
            kind).
        all_failed: True when every trial the classifier saw failed (then it predicts 0).
    """

    def __init__(self, space: Space, *, seed: int = 0, max_iter: int | None = None) -> None:
        self.space = space
        self.seed = seed
        self.max_iter = max_iter
        self.memory: GPPredictor | None = None
        self.classifier: GPPredictor | None = None
        self.all_failed = False

    def fit(self, configs: Sequence[dict], statuses: Sequence[str],
            peak_mem_gib: Sequence[float] | None = None) -> FeasibilityModel:
        """Fit both parts to finished trials.

        Args:
            configs: n configurations.
            statuses: n statuses: ``"ok"``, ``"oom"``, ``"failed"`` or ``"timeout"``.
            peak_mem_gib: n peak memories in GiB (NaN where unknown), used for ``"ok"`` trials.

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
        self.all_failed = bool(labels) and all(v < 0 for v in labels)
        if len({_key(c) for c in mem_cfgs}) >= 2:
            self.memory = GPPredictor(self.space, "peak_mem_gib", seed=self.seed).fit(
                mem_cfgs, mem_vals, max_iter=self.max_iter)
        if len(set(labels)) == 2 and len({_key(c) for c in cls_cfgs}) >= 2:
            self.classifier = GPPredictor(self.space, "runs", log_objective=False,
                                          seed=self.seed).fit(cls_cfgs, labels,
                                                              max_iter=self.max_iter)
        return self

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
        return self.predict_encoded(X, len(configs), memory_limit)

    def predict_encoded(self, X: torch.Tensor | None, n: int,
                        memory_limit: float | None = None) -> np.ndarray:
        """:meth:`predict` of ``n`` configurations already encoded (``space.encode``, shape
        (n, d)); ``X`` may be None when neither GP is fitted."""
        from scipy.stats import norm

        p = np.ones(n)
        if self.all_failed:
            return np.zeros(n)
        if self.classifier is not None:
            mu, var = self.classifier.posterior_encoded(X)
            p *= norm.cdf(mu / np.sqrt(var + self.classifier._new_noise_var))
        if memory_limit is not None:
            if not (isinstance(memory_limit, (int, float)) and memory_limit > 0):
                raise PredictorError(f"memory_limit = {memory_limit!r} must be > 0 (GiB)",
                                     hint="e.g. memory_limit=80 for an 80 GiB device")
            if self.memory is not None:
                mu, var = self.memory.posterior_encoded(X)
                sd = np.sqrt(var + self.memory._new_noise_var)
                p *= norm.cdf((math.log(memory_limit) - mu) / sd)
        return p


def _key(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))
