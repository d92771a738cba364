"""What every predictor of cubicml_lab shares: input checks and the way back to the objective's units.

A predictor models ``log(y)`` (or ``y``) as a Gaussian belief with mean ``mu`` and variance ``s^2``
per configuration, plus an observation-noise variance for a new measurement. :class:`BasePredictor`
turns that into point estimates, standard deviations and intervals in the objective's units (see
:mod:`cubicml_lab.surrogate.gp` for the formulas), checks inputs with clear
:class:`~cubicml_lab.errors.PredictorError` messages, and carries the optional feasibility model.
A subclass implements ``fit`` and ``_posterior``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._params import brief
from ..errors import PredictorError, SpaceError

if TYPE_CHECKING:
    import torch

    from ..space import Space

__all__ = ["BasePredictor", "one_thread"]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one torch intra-op thread, then restore the setting.

    Fitting a small model (a GP's hyperparameters on at most a few hundred trials, a small MLP)
    is a long chain of tiny tensor operations: a second thread cannot speed them up, and when the
    other cores are busy (a trial running beside the search, a notebook kernel) the threads'
    hand-offs make fits several times slower. Note that the
    setting is process-wide: an in-process trial running in another thread at that moment sees
    it too (use the subprocess launcher to measure beside a search).
    """
    import torch

    before = torch.get_num_threads()
    if before > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before > 1:
            torch.set_num_threads(before)


def _as_float_array(name: str, values: Any, n: int | None = None) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise PredictorError(f"{name} must be a sequence of numbers, got {brief(values)}",
                             hint="pass a list of floats, one per configuration") from None
    if arr.ndim != 1:
        raise PredictorError(f"{name} must be one-dimensional, got shape {arr.shape}",
                             hint="pass one number per configuration")
    if n is not None and len(arr) != n:
        raise PredictorError(f"{n} configs but {len(arr)} {name}",
                             hint=f"pass exactly one {name.rstrip('s')} per configuration")
    return arr


class BasePredictor:
    """Shared state and methods of :class:`GPPredictor` and :class:`MLPPredictor`.

    Attributes:
        point_estimate: ``"median"`` with ``log_objective`` (``predict`` returns ``exp(mu)``),
            ``"mean"`` otherwise.
        n_train: Number of training trials (0 before ``fit``).
        fit_seconds: Wall time of the last ``fit``, seconds.
        feasibility: A fitted :class:`~cubicml_lab.surrogate.feasibility.FeasibilityModel`
            that :meth:`predict_feasibility` consults, or None; attach one with
            ``pred.feasibility = FeasibilityModel(space).fit(configs, statuses, peak_mem_gib)``.
    """

    def __init__(self, space: Space, objective: str = "throughput", *, log_objective: bool = True,
                 seed: int = 0) -> None:
        self.space = space
        self.objective = objective
        self.log_objective = bool(log_objective)
        self.seed = int(seed)
        self.point_estimate: str = "median" if self.log_objective else "mean"
        self.model: Any = None
        self.n_train: int = 0
        self.fit_seconds: float = 0.0
        self.feasibility: Any = None
        self._new_noise_var = 0.0  # observation-noise variance of a new measurement, model units

    def _posterior(self, configs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of the noise-free objective in model units, shape (n,) each."""
        raise NotImplementedError

    def _check_fitted(self) -> None:
        if self.model is None:
            raise PredictorError("predict called before fit",
                                 hint="call pred.fit(configs, values) first")

    def _encode(self, configs: Sequence[dict], what: str) -> torch.Tensor:
        """Check ``configs`` against the space and encode them (``Space.encode``)."""
        if isinstance(configs, dict):
            raise PredictorError(f"{what} must be a list of configuration dicts, got one dict",
                                 hint="wrap it in a list: [config]")
        configs = list(configs)
        for i, cfg in enumerate(configs):
            try:
                self.space.validate(cfg)
            except SpaceError as err:
                raise PredictorError(f"{what}[{i}] = {cfg!r} is not in the space: {err.message}",
                                     hint=err.hint or "pass configurations of this space") from None
        if not configs:
            raise PredictorError(f"{what} is empty", hint="pass at least one configuration")
        return self.space.encode(configs)

    def _to_model_units(self, y: np.ndarray) -> np.ndarray:
        bad = ~np.isfinite(y)
        if bad.any():
            i = int(np.argmax(bad))
            raise PredictorError(f"values[{i}] = {float(y[i])!r} is not finite "
                                 f"({int(bad.sum())} of {len(y)} values are NaN or inf)",
                                 hint="drop failed trials; tell only measured, finite values")
        if self.log_objective:
            bad = y <= 0
            if bad.any():
                i = int(np.argmax(bad))
                raise PredictorError(
                    f"values[{i}] = {float(y[i])!r} is not positive, but {self.objective!r} is "
                    "modelled on a log scale",
                    hint="pass log_objective=False for objectives that can be <= 0")
            return np.log(y)
        return y

    def predict(self, configs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Point estimate and standard deviation of the objective, in its own units.

        Args:
            configs: n configurations of the space.

        Returns:
            ``(mean, std)``, float64 arrays of shape (n,). With ``log_objective`` ``mean`` is the
            median ``exp(mu)`` and ``std`` the log-normal standard deviation (see module doc);
            both describe the noise-free objective, without observation noise.
        """
        mu, var = self._posterior(configs)
        if not self.log_objective:
            return mu, np.sqrt(var)
        median = np.exp(mu)
        std = np.sqrt(np.expm1(var) * np.exp(2.0 * mu + var))
        return median, std

    def predict_interval(self, configs: Sequence[dict], level: float = 0.95, *,
                         observation_noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Central ``level`` prediction interval, in the objective's units.

        Args:
            configs: n configurations of the space.
            level: Coverage probability in (0, 1), e.g. 0.95.
            observation_noise: Interval for a new measurement (default, includes the observation
                noise) or, if False, for the noise-free objective.

        Returns:
            ``(lo, hi)``, float64 arrays of shape (n,).
        """
        from scipy.stats import norm

        if not (isinstance(level, (int, float)) and 0.0 < level < 1.0):
            raise PredictorError(f"level = {level!r} is not in (0, 1)", hint="e.g. level=0.95")
        mu, var = self._posterior(configs)
        if observation_noise:
            var = var + self._new_noise_var
        half = float(norm.ppf(0.5 + level / 2.0)) * np.sqrt(var)
        lo, hi = mu - half, mu + half
        if self.log_objective:
            return np.exp(lo), np.exp(hi)
        return lo, hi

    # -- feasibility ----------------------------------------------------------------------------
    def predict_feasibility(self, configs: Sequence[dict],
                            memory_limit: float | None = None) -> np.ndarray:
        """Probability that each configuration runs (and, with ``memory_limit`` in GiB, that its
        peak memory stays under it), from the attached :attr:`feasibility` model; all ones
        while none is attached."""
        if self.feasibility is None:
            self._encode(configs, "configs")  # the same input checks as a fitted model
            return np.ones(len(list(configs)))
        return self.feasibility.predict(configs, memory_limit=memory_limit)

    @property
    def noise_std(self) -> float:
        """Standard deviation of a new measurement's noise in model units (log units by default:
        about its relative spread), or NaN before :meth:`fit`."""
        return math.sqrt(self._new_noise_var) if self.model is not None else math.nan


