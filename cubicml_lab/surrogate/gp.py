"""A Gaussian-process predictor of training speed: configuration -> objective, with uncertainty.

:class:`GPPredictor` owns the statistical model of the CubicML loop. It encodes configurations with
:meth:`Space.encode <cubicml_lab.space.Space.encode>`, fits a BoTorch ``SingleTaskGP`` (float64,
``Normalize`` inputs to the space's encoded bounds, ``Standardize`` outcomes, type-II maximum
likelihood through ``fit_gpytorch_mll``) on the logarithm of the objective, and reports predictions
back in the objective's own units (e.g. tokens/s).

Log model and what the numbers mean (``log_objective=True``, the default): with ``mu`` and ``s``
the GP posterior mean and standard deviation of ``log(y)`` at a configuration,

* ``predict`` returns ``mean = exp(mu)``: the **median** of the log-normal back-transform
  (``point_estimate == "median"``), not its mean ``exp(mu + s^2/2)``; the median is the natural
  point estimate of a multiplicative quantity and ranks configurations exactly as ``mu`` does;
* ``std = sqrt((exp(s^2) - 1) * exp(2 mu + s^2))``: the standard deviation of the log-normal
  belief about the noise-free objective (model uncertainty only);
* ``predict_interval`` returns ``exp(mu -/+ z * sqrt(s^2 + noise_var))``: an interval for a **new
  measurement**, so it includes the observation noise (``observation_noise=False`` drops it and
  gives an interval for the noise-free objective).

With ``log_objective=False`` the same holds on the raw scale: ``mean = mu``, ``std = s``,
``point_estimate == "mean"``, interval ``mu -/+ z * sqrt(s^2 + noise_var)``.

Observation noise: without ``noise`` the GP infers one homoscedastic noise level. With ``noise``
(the relative spread of each measurement, e.g. 0.02 for +/-2 %; in log space a relative spread is
approximately the standard deviation of ``log(y)``), the model uses it as fixed per-trial noise
``train_Yvar = max(noise^2, NOISE_FLOOR_LOG_VAR, STANDARDISED_NOISE_FLOOR * var(log y))``, and a new
measurement's noise variance is taken as the median of the training ``train_Yvar``.

Example:
    >>> from cubicml_lab.space import Space, PowerOfTwo
    >>> space = Space([PowerOfTwo("micro_batch", 1, 64)])
    >>> configs = space.enumerate()
    >>> pred = GPPredictor(space).fit(configs, [100.0 * c["micro_batch"] ** 0.5 for c in configs])
    >>> mean, std = pred.predict([{"micro_batch": 16}])
    >>> bool(350 < mean[0] < 450)
    True
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PredictorError, SpaceError

if TYPE_CHECKING:
    import torch

    from ..space import Space

__all__ = ["NOISE_FLOOR_LOG_VAR", "STANDARDISED_NOISE_FLOOR", "GPPredictor"]

#: Smallest per-trial noise variance in log units ((0.1 % relative spread)^2).
NOISE_FLOOR_LOG_VAR = 1e-6
#: Smallest per-trial noise variance relative to the variance of the training outcomes, so the
#: standardised noise the GP sees is never below this (keeps the kernel matrix well conditioned).
STANDARDISED_NOISE_FLOOR = 1e-6


def _as_float_array(name: str, values: Any, n: int | None = None) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise PredictorError(f"{name} must be a sequence of numbers, got {values!r:.80}",
                             hint="pass a list of floats, one per configuration") from None
    if arr.ndim != 1:
        raise PredictorError(f"{name} must be one-dimensional, got shape {arr.shape}",
                             hint="pass one number per configuration")
    if n is not None and len(arr) != n:
        raise PredictorError(f"{n} configs but {len(arr)} {name}",
                             hint=f"pass exactly one {name.rstrip('s')} per configuration")
    return arr


class GPPredictor:
    """Predicts an objective (default throughput, units/s, higher is better) from a configuration.

    Args:
        space: The space the configurations come from; fixes the encoding and its bounds.
        objective: Name of the predicted metric (used in messages and by searchers).
        log_objective: Model ``log(y)`` (default; needs positive values) instead of ``y``.
        seed: Seed of torch's generator for the hyperparameter fit (fits are deterministic).

    Attributes:
        point_estimate: ``"median"`` with ``log_objective`` (``predict`` returns ``exp(mu)``),
            ``"mean"`` otherwise.
        model: The fitted BoTorch ``SingleTaskGP`` (expert use; inputs are ``space.encode`` rows,
            outputs ``log(y)`` when ``log_objective``), None before :meth:`fit`.
        n_train: Number of training trials (0 before :meth:`fit`).
        fit_seconds: Wall time of the last :meth:`fit`, seconds.
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
        self._new_noise_var = 0.0  # observation-noise variance of a new measurement, model units
        self._fixed_noise = False

    def __repr__(self) -> str:
        state = f"n_train={self.n_train}" if self.model is not None else "not fitted"
        return (f"GPPredictor(objective={self.objective!r}, log_objective={self.log_objective}, "
                f"{state})")

    # -- input checks ---------------------------------------------------------------------------
    def _encode(self, configs: Sequence[dict], what: str) -> torch.Tensor:
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

    # -- fitting --------------------------------------------------------------------------------
    def fit(self, configs: Sequence[dict], values: Sequence[float],
            noise: Sequence[float] | None = None) -> GPPredictor:
        """Fit the GP to measured trials.

        Args:
            configs: n configurations of the space (repeats allowed).
            values: n measured objective values, in the objective's units.
            noise: Optional n relative spreads of the measurements (0.02 = 2 %), >= 0.

        Returns:
            self, fitted.

        Raises:
            PredictorError: Fewer than 2 trials or distinct configurations, lengths that do not
                match, NaN/inf values, values <= 0 with ``log_objective``, a configuration outside
                the space, negative or non-finite noise, or a fit that fails numerically.
        """
        import torch
        from botorch.exceptions.errors import ModelFittingError
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from botorch.models.transforms import Normalize, Standardize
        from gpytorch.mlls import ExactMarginalLogLikelihood

        t0 = time.perf_counter()
        configs = list(configs)
        y = _as_float_array("values", values, len(configs))
        if len(configs) < 2:
            raise PredictorError(f"need at least 2 trials to fit a GP, got {len(configs)}",
                                 hint="measure more configurations first")
        X = self._encode(configs, "configs")
        if len(torch.unique(X, dim=0)) < 2:
            raise PredictorError(f"all {len(configs)} trials have the same configuration",
                                 hint="measure at least 2 distinct configurations")
        y_model = self._to_model_units(y)
        Y = torch.as_tensor(y_model, dtype=torch.float64).unsqueeze(-1)
        Yvar = None
        if noise is not None:
            rel = _as_float_array("noise", noise, len(configs))
            if not np.all(np.isfinite(rel)) or (rel < 0).any():
                i = int(np.argmax(~np.isfinite(rel) | (rel < 0)))
                raise PredictorError(f"noise[{i}] = {float(rel[i])!r} is not a finite number >= 0",
                                     hint="noise is a measurement's relative spread, e.g. 0.02")
            var = rel**2 if self.log_objective else (rel * np.abs(y)) ** 2
            floor = max(NOISE_FLOOR_LOG_VAR if self.log_objective else 0.0,
                        STANDARDISED_NOISE_FLOOR * float(np.var(y_model)), 1e-12)
            var = np.maximum(var, floor)
            Yvar = torch.as_tensor(var, dtype=torch.float64).unsqueeze(-1)
        bounds = torch.as_tensor(self.space.encoded_bounds(), dtype=torch.float64)
        flat = bounds[1] <= bounds[0]  # a one-value parameter: avoid a zero range
        bounds[1] = torch.where(flat, bounds[0] + 1.0, bounds[1])

        torch.manual_seed(self.seed)
        model = SingleTaskGP(X, Y, train_Yvar=Yvar,
                             input_transform=Normalize(X.shape[-1], bounds=bounds),
                             outcome_transform=Standardize(m=1))
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # retries are handled by fit_gpytorch_mll
                fit_gpytorch_mll(mll)
        except (ModelFittingError, RuntimeError) as err:
            raise PredictorError(f"the GP fit failed on {len(configs)} trials: {err}",
                                 hint="check for duplicated or near-constant data") from err
        model.eval()
        self.model = model
        self.n_train = len(configs)
        self._fixed_noise = Yvar is not None
        if Yvar is not None:
            self._new_noise_var = float(Yvar.median())
        else:
            stdv = float(model.outcome_transform.stdvs.squeeze())
            self._new_noise_var = float(model.likelihood.noise.detach().mean()) * stdv**2
        self.fit_seconds = time.perf_counter() - t0
        return self

    # -- prediction -----------------------------------------------------------------------------
    def _posterior(self, configs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and variance of the latent function in model units, shape (n,) each."""
        import torch

        if self.model is None:
            raise PredictorError("predict called before fit",
                                 hint="call pred.fit(configs, values) first")
        X = self._encode(configs, "configs")
        with torch.no_grad():
            post = self.model.posterior(X)
            mu = post.mean.squeeze(-1).numpy().astype(np.float64)
            var = post.variance.squeeze(-1).clamp_min(0.0).numpy().astype(np.float64)
        return mu, var

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

    @property
    def noise_std(self) -> float:
        """Standard deviation of a new measurement's noise in model units (log units by default:
        about its relative spread), or NaN before :meth:`fit`."""
        return math.sqrt(self._new_noise_var) if self.model is not None else math.nan

