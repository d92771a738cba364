"""How good is a predictor? Ranking, error and calibration metrics, and cross-validation.

A search only needs a predictor to *rank* configurations well, so the headline metrics are rank
correlations (Kendall tau-b, as in the CubicML paper, and Spearman rho). MAPE measures the size of
the errors as a **fraction** (0.05 = 5 %), and ``coverage95`` the share of measured values that fall
inside the predictor's central 95 % interval for a new measurement (well calibrated: about 0.95).

:func:`cross_val_predict` makes out-of-fold predictions (shuffled, seeded k-fold or leave-one-out);
:func:`evaluate_predictor` scores them. Metrics are computed once on all out-of-fold predictions
pooled together (not averaged per fold), so they do not depend on how small each fold is.

Example:
    >>> round(kendall_tau([1, 2, 3, 4], [10, 20, 40, 30]), 3)
    0.667
    >>> mape([100.0, 200.0], [110.0, 180.0])
    0.1
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import PredictorError

__all__ = ["Predictor", "cross_val_predict", "evaluate_predictor", "interval_coverage",
           "kendall_tau", "mape", "spearman"]


@runtime_checkable
class Predictor(Protocol):
    """What :func:`evaluate_predictor` needs: ``fit``, ``predict`` and ``predict_interval``."""

    def fit(self, configs: Sequence[dict], values: Sequence[float],
            noise: Sequence[float] | None = None) -> Any: ...

    def predict(self, configs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]: ...

    def predict_interval(self, configs: Sequence[dict],
                         level: float = 0.95) -> tuple[np.ndarray, np.ndarray]: ...


def _pair(y_true: Sequence[float], y_pred: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(y_true, dtype=np.float64).ravel()
    b = np.asarray(y_pred, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise PredictorError(f"y_true has {a.size} values but y_pred has {b.size}",
                             hint="pass one prediction per measured value")
    return a, b


def kendall_tau(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """Kendall's tau-b rank correlation in [-1, 1]; NaN if either input is constant or n < 2."""
    from scipy.stats import kendalltau

    a, b = _pair(y_true, y_pred)
    if a.size < 2:
        return float("nan")
    return float(kendalltau(a, b).statistic)


def spearman(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """Spearman's rank correlation rho in [-1, 1]; NaN if either input is constant or n < 2."""
    from scipy.stats import spearmanr

    a, b = _pair(y_true, y_pred)
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def mape(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """Mean absolute percentage error as a fraction: mean(|pred - true| / |true|); 0.05 = 5 %.

    Raises:
        PredictorError: If a true value is 0 (the relative error is undefined).
    """
    a, b = _pair(y_true, y_pred)
    if (a == 0).any():
        raise PredictorError("mape is undefined when a true value is 0",
                             hint="use a metric on the raw scale for objectives that can be 0")
    return float(np.mean(np.abs(b - a) / np.abs(a)))


def interval_coverage(y: Sequence[float], lo: Sequence[float], hi: Sequence[float]) -> float:
    """Fraction (0-1) of ``y`` with ``lo <= y <= hi``."""
    a, low = _pair(y, lo)
    _, high = _pair(y, hi)
    return float(np.mean((low <= a) & (a <= high)))


def _folds(n: int, folds: int | str, seed: int) -> list[np.ndarray]:
    if folds == "loo":
        k = n
    elif isinstance(folds, (int, np.integer)) and not isinstance(folds, bool) and folds >= 2:
        k = int(folds)
        if k > n:
            raise PredictorError(f"folds = {k} is more than the {n} trials",
                                 hint="use fewer folds, or folds='loo' (leave one out)")
    else:
        raise PredictorError(f"folds = {folds!r} is neither an int >= 2 nor 'loo'",
                             hint="e.g. folds=5 or folds='loo'")
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(idx) for idx in np.array_split(perm, k)]


def cross_val_predict(pred_factory: Callable[[], Predictor], configs: Sequence[dict],
                      values: Sequence[float], folds: int | str = 5, seed: int = 0,
                      noise: Sequence[float] | None = None,
                      level: float = 0.95) -> dict[str, np.ndarray]:
    """Out-of-fold predictions, e.g. for a parity plot.

    Each fold is predicted by a fresh predictor from ``pred_factory()`` fitted on the other folds.

    Args:
        pred_factory: Builds an unfitted predictor, e.g. ``lambda: GPPredictor(space)``.
        configs: n configurations.
        values: n measured objective values.
        folds: Number of shuffled folds (int >= 2) or ``"loo"`` for leave-one-out.
        seed: Seed of the fold shuffle.
        noise: Optional n relative spreads of the measurements, passed to ``fit``.
        level: Coverage of the interval returned in ``lo``/``hi``.

    Returns:
        Float arrays of shape (n,) in the input order: ``y`` (measured), ``mean`` (point
        estimate), ``std``, ``lo``, ``hi`` (interval for a new measurement), and ``fold`` (int,
        which fold held the trial out).

    Raises:
        PredictorError: On mismatched lengths, bad ``folds``, or a fold the predictor cannot fit.
    """
    configs = list(configs)
    y = np.asarray(values, dtype=np.float64).ravel()
    n = len(configs)
    if y.size != n or (noise is not None and len(noise) != n):
        raise PredictorError(f"{n} configs, {y.size} values"
                             + ("" if noise is None else f", {len(noise)} noise values"),
                             hint="pass one value (and noise) per configuration")
    out = {k: np.full(n, np.nan) for k in ("mean", "std", "lo", "hi")}
    fold_of = np.full(n, -1, dtype=np.int64)
    for f, test in enumerate(_folds(n, folds, seed)):
        train = np.setdiff1d(np.arange(n), test)
        pred = pred_factory()
        pred.fit([configs[i] for i in train], y[train],
                 None if noise is None else [noise[i] for i in train])
        test_cfgs = [configs[i] for i in test]
        out["mean"][test], out["std"][test] = pred.predict(test_cfgs)
        out["lo"][test], out["hi"][test] = pred.predict_interval(test_cfgs, level=level)
        fold_of[test] = f
    return {"y": y, **out, "fold": fold_of}


def evaluate_predictor(pred_factory: Callable[[], Predictor], configs: Sequence[dict],
                       values: Sequence[float], folds: int | str = 5, seed: int = 0,
                       noise: Sequence[float] | None = None) -> dict[str, float]:
    """Cross-validated quality of a predictor.

    Args: as :func:`cross_val_predict`.

    Returns:
        ``kendall_tau``, ``spearman`` (rank correlations of pooled out-of-fold predictions),
        ``mape`` (fraction, 0.05 = 5 %), ``coverage95`` (fraction of measured values inside the
        95 % interval for a new measurement), ``n`` (trials) and ``folds`` (number of folds).

    Example:
        >>> from cubicml_lab.space import Space, Int
        >>> from cubicml_lab.surrogate import GPPredictor
        >>> space = Space([Int("micro_batch", 1, 30)])
        >>> cfgs = space.enumerate()
        >>> vals = [100.0 + 10 * c["micro_batch"] for c in cfgs]
        >>> evaluate_predictor(lambda: GPPredictor(space), cfgs, vals)["kendall_tau"] > 0.9
        True
    """
    cv = cross_val_predict(pred_factory, configs, values, folds=folds, seed=seed, noise=noise)
    y = cv["y"]
    return {
        "kendall_tau": kendall_tau(y, cv["mean"]),
        "spearman": spearman(y, cv["mean"]),
        "mape": mape(y, cv["mean"]) if (y != 0).all() else float("nan"),
        "coverage95": interval_coverage(y, cv["lo"], cv["hi"]),
        "n": len(y),
        "folds": int(cv["fold"].max()) + 1,
    }
