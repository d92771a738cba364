"""The GP's derived inputs: log features and log cost terms, their shapes, and the model on them.

With ``features`` or a ``cost_model`` (the :mod:`~cubicml_lab.surrogate.gp` module doc), the input
rows of a :class:`~cubicml_lab.surrogate.GPPredictor` gain columns after the space's: the logs of
the features and of the cost terms, which the kernel sees normalised to the fit's range, then the
log cost terms again, which the cost-model mean reads raw. :func:`log_values` evaluates and checks
those logs, :func:`extra_shapes` reads from a fit's training rows how the kernel bounds them and
how the mean centres and anchors each cost term, and :func:`model_with_extras` builds the BoTorch
model on them: a Matern-5/2 kernel and, with a cost model, the mean of
:func:`~cubicml_lab.surrogate.kernels.cost_mean_class`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import PredictorError
from .kernels import cost_mean_class, matern_with_floor
from .terms import evaluate_many, raise_bad_row, units_of

if TYPE_CHECKING:
    import torch

__all__ = ["ExtraShapes", "extra_shapes", "log_values", "model_with_extras"]


def log_values(name: str, fn: Callable[[dict], Any], configs: list[dict], what: str,
               expected: int) -> torch.Tensor:
    """log of ``fn(config)`` for each config, shape (n, k), checked: ``features`` must be
    > 0, ``cost_model`` terms >= 0 with at least one > 0 (a zero term's log, -inf, is
    left out of the mean's sum and put below the smallest value in the kernel)."""
    import torch

    positive = name == "features"
    rows = evaluate_many(name, fn, configs, what)
    try:  # one array for all rows: 50,000 candidates are checked in milliseconds
        values = np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)
    except (TypeError, ValueError):  # ragged rows or not numbers: name the first odd one
        width = np.size(rows[0])
        bad = next((i for i, r in enumerate(rows) if np.size(r) != width), 0)
        raise_bad_row(name, rows[bad], bad, what, positive, width)
    good = np.isfinite(values) & (values > 0 if positive else values >= 0)
    bad_rows = ~good.all(axis=1) | ~(values > 0).any(axis=1)
    if bad_rows.any():
        bad = int(np.argmax(bad_rows))
        raise_bad_row(name, rows[bad], bad, what, positive, values.shape[1])
    if expected and values.shape[1] != expected:
        raise PredictorError(f"{name} returned {values.shape[1]} values, the fit had "
                             f"{expected}", hint="return the same number of values")
    with np.errstate(divide="ignore"):
        return torch.as_tensor(np.log(values), dtype=torch.float64)


class ExtraShapes(NamedTuple):
    """What a fit reads from its training rows' derived columns (:func:`extra_shapes`)."""

    #: Cost terms per configuration (0 without a cost model).
    n_terms: int
    #: The kernel's bounds of the log features and log cost terms, shape (2, f + k).
    bounds: torch.Tensor
    #: Per cost term: the mean log term of the fit's trials it is centred on (None without terms).
    shift: torch.Tensor | None
    #: Per cost term: the term whose weight it takes (itself when the fit saw it).
    src: torch.Tensor | None
    #: (term, same-unit term whose weight per unit it is drawn towards).
    pairs: list[tuple[int, int]]


def extra_shapes(X: torch.Tensor, n_space: int, n_feats: int, cost_model: Any,
                 unit_prior_sd: float | None) -> ExtraShapes:
    """From the training rows ``X`` (``n_space`` columns of the space, then ``n_feats`` log
    features, then the log cost terms twice): the kernel's bounds of the log columns (finite min
    and max) and the mean's centring of the cost terms; with ``unit_prior_sd`` None, no term's
    weight is drawn towards another's."""
    import torch

    n_terms = (X.shape[1] - n_space - n_feats) // 2
    kernel_cols = X[:, n_space:n_space + n_feats + n_terms]
    finite = torch.isfinite(kernel_cols)
    lo = torch.where(finite, kernel_cols, torch.inf).min(0).values
    hi = torch.where(finite, kernel_cols, -torch.inf).max(0).values
    lo = torch.where(torch.isfinite(lo), lo, 0.0)  # a term that is 0 on every trial
    hi = torch.where(hi > lo, hi, lo + 1.0)
    bounds = torch.stack([lo, hi])
    if not n_terms:
        return ExtraShapes(0, bounds, None, None, [])
    logs = X[:, -n_terms:]
    finite = torch.isfinite(logs)  # a zero term (log = -inf) is left out of its mean
    shift = torch.where(finite, logs, 0.0).sum(0) / finite.sum(0).clamp_min(1)
    # a term 0 on every trial of the fit has no weight to learn: weighed as a seen term
    # of the same unit, else left out of the mean (at its prior weight and its own scale
    # it outweighed the others a million-fold on a new config)
    seen = finite.any(0)
    units = units_of(cost_model, n_terms)
    # each term's anchor: the first seen term of its unit (itself without units)
    anchor = [j if units is None else next(
        (i for i in range(n_terms) if seen[i] and units[i] == units[j]), j)
        for j in range(n_terms)]
    src = torch.tensor([j if seen[j] else anchor[j] for j in range(n_terms)])
    # and a seen term's weight per unit is drawn towards its anchor's
    pairs = [] if unit_prior_sd is None else [
        (j, anchor[j]) for j in range(n_terms) if seen[j] and anchor[j] != j]
    return ExtraShapes(n_terms, bounds, torch.where(seen, shift, torch.inf)[src], src, pairs)


def model_with_extras(X: torch.Tensor, Y: torch.Tensor, Yvar: torch.Tensor | None,
                      bounds: torch.Tensor, *, n_terms: int, shift: torch.Tensor | None,
                      src: torch.Tensor | None, pairs: list[tuple[int, int]],
                      exponent: float | None, exponent_prior_sd: float,
                      unit_prior_sd: float | None) -> Any:
    """A SingleTaskGP with derived inputs (module doc): a Matern-5/2 kernel with BoTorch's
    dimension-scaled lengthscale prior over the space's columns, the log features and the
    log cost terms (normalised to the fit's range; a zero term sits one range below it),
    and, with ``n_terms`` cost terms, the cost model's mean of the log cost terms appended last
    (centred on ``shift``, weights taken from ``src`` and drawn together along ``pairs`` by a
    prior of width ``unit_prior_sd``; its log-slope has a normal prior around ``exponent`` of
    width ``exponent_prior_sd``, or a wide one around 0 when ``exponent`` is None)."""
    import torch
    from botorch.models import SingleTaskGP
    from botorch.models.transforms import Normalize, Standardize

    d, k = X.shape[-1], n_terms
    kernel_cols = list(range(d - k))
    # the slope's prior is in log units of the objective; the mean's output is standardised
    spread = float(Y.std()) if len(Y) > 1 else 0.0
    scale = 1.0 / spread if exponent is not None and spread > 0 else 1.0
    prior = (0.0, 2.0) if exponent is None else (exponent, exponent_prior_sd)
    model = SingleTaskGP(
        X, Y, train_Yvar=Yvar, covar_module=matern_with_floor(kernel_cols),
        mean_module=cost_mean_class()(shift, src, scale, prior, pairs, unit_prior_sd)
        if k else None,
        input_transform=Normalize(d, bounds=bounds, indices=kernel_cols),
        outcome_transform=Standardize(m=1))
    if not k:
        return model
    with torch.no_grad():
        t = model.train_targets
        model.mean_module.b.fill_(float(t.mean()))
        for j, i in pairs:  # start where the unit prior centres: equal weight per unit
            model.mean_module.a[j] = model.mean_module.a[i] - shift[i] + shift[j]
        if exponent is not None:
            model.mean_module.c.fill_(exponent)
            return model
        # start from the least-squares line of the (standardised) targets on the log total
        # cost with equal weights, so that c has the right sign for throughput and time alike
        z = torch.logsumexp(X[:, -k:] - shift, dim=-1)
        z = z - z.mean()
        slope = float((z * (t - t.mean())).sum() / (z * z).sum().clamp_min(1e-12))
        model.mean_module.c.fill_(slope)
    return model
