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

Analytical prior mean (``cost_model``): with a function returning a configuration's cost terms
``t_1..t_k`` per unit of the objective (e.g. FLOPs, bytes of optimizer state and per-step overhead
per token; >= 0, any scale), the GP's prior mean is ``b + c * log(sum_i exp(a_i) t_i)`` instead of a
constant, with ``a_i``, ``b`` and ``c`` fitted with the kernel by maximum likelihood (the kernel
then models what the cost model misses). ``c`` is the objective's log-slope in the weighted total:
-1 where the objective is a speed and the terms its costs per unit (seconds per token of tokens/s),
the centre of its prior (``cost_exponent``, width :data:`COST_EXPONENT_PRIOR_SD`). Left free (a wide
prior around 0), it shrinks and takes the effects of the knobs a fit never varied down with it;
held near -1, it ranks at least as well. It carries the physics of the workload to configurations
far from the trials, which matters most when the trials are few
(``benchmarks/predictor_quality.py``; the measured history of this section: ``docs/results.md``,
"History moved from the code"). See :func:`cubicml_lab.workloads.gpt.cost_terms`. A cost
model may return a mapping of term name to value (its values are taken in order, e.g.
``LLMTrainingModel.cost_terms``); a bound method ``obj.m`` whose object also has ``obj.m_frame`` (a
DataFrame of configurations -> one row each) is evaluated over many configurations in one call
(:func:`evaluate_many`). A term that is 0 on every trial of a fit has no weight of its own to learn:
if the cost model names its terms' units (``term_units``, e.g. ``("flop", "flop", "byte")``) and a
term of the same unit was seen, it is weighed as that term (an fp32 FLOP, never measured, costs what
a measured bf16 FLOP costs, until an fp32 trial says otherwise); else it is left out of the mean.
A seen term's weight per unit has a normal prior, of width :data:`UNIT_PRIOR_SD` in log units,
around that of the first seen term of its unit: a few trials of one precision that do not tell its
weights apart (fp32 trials that all have 2 heads, so the attention scores per token never vary) are
drawn towards the other precision's instead of drifting where the fit puts them. The width is 1,
not narrower: per-unit costs of two precisions differ many times over on some machines (a CPU
without bf16 kernels), and a narrow prior would hold them together.

Derived inputs (``features``, and the cost terms): with either, the kernel is a Matern-5/2 with
BoTorch's dimension-scaled lengthscale prior over the space's columns, then the logs of the
``features`` (positive sizes that set a kernel's efficiency, e.g. the GEMMs' row count
``micro_batch * seq_len``: :func:`cubicml_lab.workloads.gpt.shape_features`), then the log cost
terms, each normalised to the range the fit saw (a zero cost term sits one range below it). A
smooth effect of a product of knobs is then a function of one input, which a product kernel
over the knobs learns only from many more trials. Each step (Matern instead of RBF, the cost
terms in the kernel, the features) adds a little to the ranking
(``benchmarks/predictor_quality.py``).

What the fit learned: :meth:`GPPredictor.cost_shares` splits each configuration's modelled
cost between the cost model's terms (named by its ``term_names``), :meth:`GPPredictor.importance`
reads the kernel's lengthscales per knob; :mod:`cubicml_lab.surrogate.explain` has the
model-agnostic views (partial dependence, knob importance).

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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._params import brief
from ..errors import PredictorError
from .base import _as_float_array, one_thread
from .derived import extra_shapes, log_values, model_with_extras
from .fitted import _CHOLESKY_MAX, FittedGP
from .kernels import hyperparameters, index_columns, matern_with_floor, one_hot_to_index
from .terms import batch_method, evaluate_many

# the names these had here before the module was split (tests import some of them)
_matern_with_floor, _one_hot_to_index = matern_with_floor, one_hot_to_index

if TYPE_CHECKING:
    import torch

    from ..space import Space

__all__ = ["COST_EXPONENT_PRIOR_SD", "EXTRAS_MAX_ITER", "NOISE_FLOOR_LOG_VAR",
           "STANDARDISED_NOISE_FLOOR", "UNIT_PRIOR_SD", "GPPredictor",
           "batch_method", "evaluate_many"]

#: Smallest per-trial noise variance in log units ((0.1 % relative spread)^2).
NOISE_FLOOR_LOG_VAR = 1e-6
#: Smallest per-trial noise variance relative to the variance of the training outcomes, so the
#: standardised noise the GP sees is never below this (keeps the kernel matrix well conditioned).
STANDARDISED_NOISE_FLOOR = 1e-6
#: L-BFGS iterations of a fit with derived inputs (``cost_model``, ``features``) unless
#: ``max_iter`` says otherwise. Uncapped, those fits creep along flat directions for hundreds of
#: iterations; capped, they rank as well or slightly better (early stopping), several times faster.
EXTRAS_MAX_ITER = 150
#: Width of the normal prior on the cost model's log-slope around ``cost_exponent``. Fitted
#: freely, the slope shrinks well above -1: the fit shrinks the cost model's spread and with it
#: the effects no other trial of a fit showed (one thread instead of two, fp32 instead of bf16),
#: which then come out far off.
COST_EXPONENT_PRIOR_SD = 0.5
#: Width of the normal prior, in log units, on how far a cost term's weight per unit (its cost
#: per FLOP, per score, ...) lies from that of the fit's first seen term of the same unit
#: (``term_units``; module doc). None: each seen term's weight is fitted on its own.
UNIT_PRIOR_SD: float | None = 1.0


class GPPredictor(FittedGP):
    """Predicts an objective (default throughput, units/s, higher is better) from a configuration.

    Args:
        space: The space the configurations come from; fixes the encoding and its bounds.
        objective: Name of the predicted metric (used in messages and by searchers).
        log_objective: Model ``log(y)`` (default; needs positive values) instead of ``y``.
        seed: Seed of torch's generator for the hyperparameter fit (fits are deterministic).
        categorical: How ``Choice`` parameters enter the kernel: ``"onehot"`` (default; one
            column per value, each with its own ARD lengthscale in BoTorch's default RBF
            kernel) or ``"mixed"`` (BoTorch ``MixedSingleTaskGP``: one index column per
            parameter under a categorical kernel, combined with the kernel of the other columns).
            ``benchmarks/predictor_quality.py`` compares the two on the shipped datasets.
        max_fit_points: With more trials than this, the kernel's hyperparameters are fitted
            (type-II maximum likelihood) on a seeded random subset of this many, and the GP then
            conditions on every trial with them: the fit's cost stops growing with the cube of
            the history while predictions still use all of it.
        cost_model: Optional analytical prior mean (module doc): ``config -> cost terms`` per
            unit of the objective, a number or a sequence of k numbers >= 0 (0 where a term
            does not apply, e.g. pipeline bubbles without a pipeline; at least one > 0), the
            same k for every configuration. Needs ``categorical="onehot"``.
        features: Optional derived inputs for the kernel (module doc): ``config -> numbers``
            > 0, the same count for every configuration, e.g.
            :func:`cubicml_lab.workloads.gpt.shape_features`. Needs ``categorical="onehot"``.
        cost_exponent: With ``cost_model`` and ``log_objective``: the log-slope of the
            objective in the cost model's weighted total (module doc), the centre of a normal
            prior of width :data:`COST_EXPONENT_PRIOR_SD` and the fit's starting point. -1
            (default): the objective is a speed and the terms are costs per unit of it (tokens/s
            and seconds per token), as in a search, which models every objective as larger is
            better; +1: the objective is a time that the terms add up to (step time and seconds
            per step); None: a wide prior around 0, the slope left to the data. Ignored without
            ``log_objective``.

    Attributes:
        point_estimate: ``"median"`` with ``log_objective`` (``predict`` returns ``exp(mu)``),
            ``"mean"`` otherwise.
        model: The fitted BoTorch ``SingleTaskGP`` (expert use; inputs are ``space.encode`` rows,
            outputs ``log(y)`` when ``log_objective``), None before :meth:`fit`.
        n_train: Number of training trials (0 before :meth:`fit`).
        fit_seconds: Wall time of the last :meth:`fit`, seconds.
    """

    def __init__(self, space: Space, objective: str = "throughput", *, log_objective: bool = True,
                 seed: int = 0, categorical: str = "onehot", max_fit_points: int = 400,
                 cost_model: Callable[[dict], Any] | None = None,
                 features: Callable[[dict], Any] | None = None,
                 cost_exponent: float | None = -1.0) -> None:
        if categorical not in ("onehot", "mixed"):
            raise PredictorError(f"categorical = {categorical!r} is not 'onehot' or 'mixed'",
                                 hint="'onehot' (ARD over one-hot columns) or 'mixed' "
                                      "(categorical kernel)")
        super().__init__(space, objective, log_objective=log_objective, seed=seed)
        self.categorical = categorical
        if not isinstance(max_fit_points, int) or max_fit_points < 2:
            raise PredictorError(f"max_fit_points = {max_fit_points!r} must be an int >= 2",
                                 hint="e.g. 400")
        self.max_fit_points = max_fit_points
        for name, fn, example in (("cost_model", cost_model, "cost_terms"),
                                  ("features", features, "shape_features")):
            if fn is not None and not callable(fn):
                raise PredictorError(f"{name} = {brief(fn)} is not callable",
                                     hint="pass a function config -> list of numbers, e.g. "
                                          f"cubicml_lab.workloads.gpt.{example}")
            if fn is not None and categorical != "onehot":
                raise PredictorError(f"{name} needs categorical='onehot'",
                                     hint=f"drop categorical='mixed' or {name}")
        if cost_exponent is not None and (isinstance(cost_exponent, bool) or not isinstance(
                cost_exponent, (int, float)) or not math.isfinite(cost_exponent)):
            raise PredictorError(f"cost_exponent = {cost_exponent!r} is not a finite number "
                                 "or None",
                                 hint="-1 for a speed (tokens/s), +1 for a time (s/step), None to "
                                      "fit it freely")
        self.cost_model = cost_model
        self.features = features
        self.cost_exponent = None if cost_exponent is None else float(cost_exponent)
        self._n_feats = 0  # derived features per configuration (kernel columns)
        self._n_terms = 0  # cost terms per configuration (kernel columns, then the mean's)
        self._extra_bounds: torch.Tensor | None = None  # kernel bounds of the derived columns
        self._cost_shift: torch.Tensor | None = None  # mean log term of the fit's trials
        self._cost_src: torch.Tensor | None = None  # whose weight each term takes (module doc)
        self._cost_pairs: list[tuple[int, int]] = []  # (term, same-unit term it is drawn to)
        self._fixed_noise = False
        self._factor: tuple | None = None

    def __repr__(self) -> str:
        state = f"n_train={self.n_train}" if self.model is not None else "not fitted"
        return (f"GPPredictor(objective={self.objective!r}, log_objective={self.log_objective}, "
                f"categorical={self.categorical!r}, {state})")

    # -- input checks and the model's inputs -----------------------------------------------------
    def encode(self, configs: Sequence[dict]) -> torch.Tensor:
        """The model's input rows for ``configs``, checked: float64, shape (n, d).

        The space's columns (``space.encode``; with ``categorical="mixed"`` a category's index
        instead of its one-hot block), then, with ``features`` or a ``cost_model``, the columns
        of :meth:`derived_columns`. Rows made here go to :meth:`posterior_encoded`; a caller
        that scores a fixed pool many times encodes it once.
        """
        return self._encode(configs, "configs")

    def _encode(self, configs: Sequence[dict], what: str) -> torch.Tensor:
        X = super()._encode(configs, what)
        if self.cost_model is not None or self.features is not None:
            import torch

            return torch.cat([X, self.derived_columns(list(configs), what)], dim=1)
        return X if self._cat_blocks() == [] else one_hot_to_index(X, self._cat_blocks())

    def derived_columns(self, configs: Sequence[dict], what: str = "configs") -> torch.Tensor:
        """The input columns after the space's, float64, shape (n, f + 2 k): the log
        ``features`` (f) and the log cost terms (k), which the kernel sees normalised, then the
        log cost terms again, which the mean reads raw. Empty (n, 0) without either function.

        Args:
            configs: Configurations of the space.
            what: How an error message names them (e.g. ``"candidates"``).
        """
        import torch

        if self.features is None and self.cost_model is None:
            return torch.zeros((len(configs), 0), dtype=torch.float64)
        configs = list(configs)
        parts = []
        if self.features is not None:
            parts.append(self._logs("features", self.features, configs, what, self._n_feats))
        if self.cost_model is not None:
            costs = self._logs("cost_model", self.cost_model, configs, what, self._n_terms)
            parts += [costs, costs]
        return torch.cat(parts, dim=1)

    #: log of ``fn(config)`` per config, checked
    #: (:func:`~cubicml_lab.surrogate.derived.log_values`).
    _logs = staticmethod(log_values)

    def _cat_blocks(self) -> list[tuple[int, int]]:
        """(first column, number of columns) of each Choice parameter's one-hot block, when
        ``categorical == "mixed"``; empty otherwise."""
        if self.categorical != "mixed":
            return []
        blocks, col = [], 0
        for p in self.space.parameters:
            width = len(p.encoded_names())
            if p.kind == "choice":
                blocks.append((col, width))
            col += width
        return blocks

    def _bounds(self) -> torch.Tensor:
        """Bounds of the model's input columns (one-hot, or index columns for categories)."""
        import torch

        bounds = torch.as_tensor(self.space.encoded_bounds(), dtype=torch.float64)
        blocks = self._cat_blocks()
        if blocks:
            bounds = one_hot_to_index(bounds, blocks)
            for col, width in index_columns(blocks):
                bounds[0, col], bounds[1, col] = 0.0, float(width - 1)
        flat = bounds[1] <= bounds[0]  # a one-value parameter: avoid a zero range
        bounds[1] = torch.where(flat, bounds[0] + 1.0, bounds[1])
        if self._extra_bounds is not None:  # the kernel's derived columns: the fit's range
            bounds = torch.cat([bounds, self._extra_bounds], dim=1)
        if self._n_terms:  # the mean's log cost terms pass through un-normalised (see _build)
            extra = torch.tensor([[0.0], [1.0]], dtype=torch.float64).expand(2, self._n_terms)
            bounds = torch.cat([bounds, extra], dim=1)
        return bounds

    # -- fitting --------------------------------------------------------------------------------
    def fit(self, configs: Sequence[dict], values: Sequence[float],
            noise: Sequence[float] | None = None, *, warm_start: GPPredictor | None = None,
            max_iter: int | None = None) -> GPPredictor:
        """Fit the GP to measured trials.

        Args:
            configs: n configurations of the space (repeats allowed).
            values: n measured objective values, in the objective's units.
            noise: Optional n relative spreads of the measurements (0.02 = 2 %), >= 0.
            warm_start: A fitted GPPredictor of the same space and settings whose kernel
                hyperparameters start the optimisation (a search refitting after each new trial
                converges in a few iterations instead of hundreds).
            max_iter: Cap on L-BFGS-B iterations (None: run to convergence, or
                :data:`EXTRAS_MAX_ITER` with a ``cost_model`` or ``features``). 0 with a
                usable ``warm_start``: no iterations, the GP conditions on these trials with
                the warm start's hyperparameters as they are.

        Returns:
            self, fitted.

        Raises:
            PredictorError: Fewer than 2 trials or distinct configurations, lengths that do not
                match, NaN/inf values, values <= 0 with ``log_objective``, a configuration outside
                the space, negative or non-finite noise, or a fit that fails numerically.
        """
        import torch

        t0 = time.perf_counter()
        configs = list(configs)
        y = _as_float_array("values", values, len(configs))
        if len(configs) < 2:
            raise PredictorError(f"need at least 2 trials to fit a GP, got {len(configs)}",
                                 hint="measure more configurations first")
        self._n_feats = self._n_terms = 0  # a refit may change them
        self._extra_bounds = None
        X = self._encode(configs, "configs")
        if len(torch.unique(X, dim=0)) < 2:
            raise PredictorError(f"all {len(configs)} trials have the same configuration",
                                 hint="measure at least 2 distinct configurations")
        y_model = self._to_model_units(y)
        Y = torch.as_tensor(y_model, dtype=torch.float64).unsqueeze(-1)
        if self.cost_model is not None or self.features is not None:
            self._set_extra_shapes(X, configs[0])
        Yvar = None if noise is None else self._noise_var(noise, y, y_model)
        bounds = self._bounds()
        torch.manual_seed(self.seed)
        n = X.shape[0]
        sub = (torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))[
            :self.max_fit_points] if n > self.max_fit_points else None)
        model = self._build(X, Y, Yvar, bounds) if sub is None else self._build(
            X[sub], Y[sub], None if Yvar is None else Yvar[sub], bounds)
        warm = warm_start is not None and warm_start.model is not None \
            and warm_start.categorical == self.categorical \
            and warm_start._fixed_noise == (Yvar is not None)
        if warm:
            model.load_state_dict(hyperparameters(warm_start.model, Yvar is None), strict=False)
        if max_iter is None and self._extra_bounds is not None:
            max_iter = EXTRAS_MAX_ITER
        if not (warm and max_iter == 0):
            self._maximise_likelihood(model, max_iter, len(configs))
        if sub is not None:  # condition on every trial with the hyperparameters of the subset
            learned = hyperparameters(model, Yvar is None)
            model = self._build(X, Y, Yvar, bounds)
            model.load_state_dict(learned, strict=False)
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

    def _noise_var(self, noise: Sequence[float], y: np.ndarray,
                   y_model: np.ndarray) -> torch.Tensor:
        """The fixed per-trial noise variance, shape (n, 1), in model units (module doc)."""
        import torch

        rel = _as_float_array("noise", noise, len(y))
        if not np.all(np.isfinite(rel)) or (rel < 0).any():
            i = int(np.argmax(~np.isfinite(rel) | (rel < 0)))
            raise PredictorError(f"noise[{i}] = {float(rel[i])!r} is not a finite number >= 0",
                                 hint="noise is a measurement's relative spread, e.g. 0.02")
        var = rel**2 if self.log_objective else (rel * np.abs(y)) ** 2
        floor = max(NOISE_FLOOR_LOG_VAR if self.log_objective else 0.0,
                    STANDARDISED_NOISE_FLOOR * float(np.var(y_model)), 1e-12)
        return torch.as_tensor(np.maximum(var, floor), dtype=torch.float64).unsqueeze(-1)

    @staticmethod
    def _maximise_likelihood(model: Any, max_iter: int | None, n: int) -> None:
        """Type-II maximum likelihood of ``model``'s hyperparameters (L-BFGS-B, at most
        ``max_iter`` iterations; None: to convergence) on ``n`` trials.

        Raises:
            PredictorError: If the fit fails numerically.
        """
        import gpytorch
        from botorch.exceptions.errors import ModelFittingError
        from botorch.fit import fit_gpytorch_mll
        from gpytorch.mlls import ExactMarginalLogLikelihood

        options = {} if max_iter is None else {"options": {"maxiter": int(max_iter)}}
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        try:
            with warnings.catch_warnings(), gpytorch.settings.max_cholesky_size(_CHOLESKY_MAX), \
                    one_thread():
                warnings.simplefilter("ignore")  # retries are handled by fit_gpytorch_mll
                fit_gpytorch_mll(mll, optimizer_kwargs=options)
        except (ModelFittingError, RuntimeError) as err:
            raise PredictorError(f"the GP fit failed on {n} trials: {err}",
                                 hint="check for duplicated or near-constant data") from err

    def _set_extra_shapes(self, X: torch.Tensor, first: dict) -> None:
        """From the training inputs: how many features and cost terms, the kernel's bounds of
        their log columns and the mean's centring of the cost terms
        (:func:`~cubicml_lab.surrogate.derived.extra_shapes`)."""
        n_space = self.space.encoded_bounds().shape[1]
        self._n_feats = 0 if self.features is None else \
            self._logs("features", self.features, [first], "configs", 0).shape[1]
        shapes = extra_shapes(X, n_space, self._n_feats, self.cost_model, UNIT_PRIOR_SD)
        self._n_terms, self._extra_bounds = shapes.n_terms, shapes.bounds
        if self._n_terms:
            self._cost_shift, self._cost_src = shapes.shift, shapes.src
            self._cost_pairs = shapes.pairs

    def _build(self, X: torch.Tensor, Y: torch.Tensor, Yvar: torch.Tensor | None,
               bounds: torch.Tensor) -> Any:
        """An unfitted BoTorch model of (X, Y): MixedSingleTaskGP or SingleTaskGP."""
        from botorch.models import MixedSingleTaskGP, SingleTaskGP
        from botorch.models.transforms import Normalize, Standardize

        cat_dims = [i for i, _ in index_columns(self._cat_blocks())]
        if self._extra_bounds is not None:
            return model_with_extras(
                X, Y, Yvar, bounds, n_terms=self._n_terms, shift=self._cost_shift,
                src=self._cost_src, pairs=self._cost_pairs,
                exponent=self.cost_exponent if self.log_objective else None,
                exponent_prior_sd=COST_EXPONENT_PRIOR_SD, unit_prior_sd=UNIT_PRIOR_SD)
        if cat_dims:
            cont = [i for i in range(X.shape[-1]) if i not in cat_dims]
            return MixedSingleTaskGP(
                X, Y, cat_dims=cat_dims, train_Yvar=Yvar, outcome_transform=Standardize(m=1),
                input_transform=Normalize(X.shape[-1], bounds=bounds, indices=cont) if cont
                else None)
        return SingleTaskGP(X, Y, train_Yvar=Yvar,
                            input_transform=Normalize(X.shape[-1], bounds=bounds),
                            outcome_transform=Standardize(m=1))
