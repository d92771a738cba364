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

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import PredictorError

__all__ = ["Predictor", "cross_val_predict", "evaluate_predictor", "interval_coverage",
           "kendall_tau", "learning_curve", "mape", "quartiles", "regret", "relative_regret",
           "spearman", "top_k_recall"]


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


def top_k_recall(y_true: Sequence[float], y_pred: Sequence[float], frac: float = 0.05) -> float:
    """Share of the truly best ``frac`` of configurations that are among the predicted best ``frac``.

    ``k = max(1, round(frac * n))``; higher values are better (throughput). Ties in ``y_true``
    are broken by order, so the true top k is always exactly k configurations.

    Example:
        >>> top_k_recall([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 7, 8, 10, 9], 0.2)
        1.0
    """
    t, p = _pair(y_true, y_pred)
    if not 0 < frac <= 1:
        raise PredictorError(f"frac = {frac!r} is not in (0, 1]", hint="e.g. frac=0.05 (top 5%)")
    k = max(1, int(round(frac * len(t))))
    true_top = set(np.argsort(-t, kind="stable")[:k].tolist())
    pred_top = set(np.argsort(-p, kind="stable")[:k].tolist())
    return len(true_top & pred_top) / k


def relative_regret(best: float, value: float, direction: str = "maximize") -> float:
    """How much worse ``value`` is than ``best``, as a fraction of ``|best|``: ``(best - value) /
    |best|`` when maximising, ``(value - best) / |best|`` when minimising (0: the best; 0.05:
    5 % worse); NaN when ``best`` is 0. The one regret formula of the package
    (:func:`regret`, ``TableObjective.regret`` and the replays call it).

    Example:
        >>> relative_regret(200.0, 150.0), relative_regret(2.0, 2.5, "minimize")
        (0.25, 0.25)
    """
    best, value = float(best), float(value)
    if best == 0:
        return float("nan")
    gap = best - value if direction == "maximize" else value - best
    return gap / abs(best)


def regret(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """How much worse the predicted best configuration truly is than the true best, as a
    fraction of the true best (0 = the predictor picked the best; higher is better for ``y``):
    :func:`relative_regret` of the predicted best.

    Example:
        >>> regret([100.0, 90.0, 80.0], [1.0, 2.0, 0.0])
        0.1
    """
    t, p = _pair(y_true, y_pred)
    return relative_regret(float(t.max()), float(t[int(np.argmax(p))]))


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """``(q25, median, q75)`` of the non-NaN ``values``, linearly interpolated
    (NumPy's and pandas' default); NaNs when none is left. The one quartile summary of the
    package (search comparisons, regret and learning curves).

    Example:
        >>> quartiles([1.0, 2.0, 3.0, 4.0, float("nan")])
        (1.75, 2.5, 3.25)
    """
    a = np.asarray(values, dtype=np.float64).ravel()
    a = a[~np.isnan(a)]
    if a.size == 0:
        return (float("nan"),) * 3
    q25, med, q75 = np.percentile(a, [25, 50, 75])
    return float(q25), float(med), float(q75)


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


def _fit_predict(factory: Callable[[], Predictor], configs: list[dict], y: np.ndarray,
                 noise: Sequence[float] | None, train: np.ndarray, test: np.ndarray,
                 level: float) -> dict[str, Any]:
    """Fit a fresh predictor on ``train`` rows, predict ``test`` rows; time both."""
    pred = factory()
    t0 = time.perf_counter()
    pred.fit([configs[i] for i in train], y[train],
             None if noise is None else [noise[i] for i in train])
    t1 = time.perf_counter()
    cfgs = [configs[i] for i in test]
    mean, std = pred.predict(cfgs)
    lo, hi = pred.predict_interval(cfgs, level=level)
    return {"mean": mean, "std": std, "lo": lo, "hi": hi, "fit_s": t1 - t0,
            "predict_s": time.perf_counter() - t1}


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
        which fold held the trial out); plus ``fit_s`` and ``predict_s``, the mean seconds of
        one fold's fit and prediction (scalars).

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
    fit_s = predict_s = 0.0
    for f, test in enumerate(_folds(n, folds, seed)):
        train = np.setdiff1d(np.arange(n), test)
        got = _fit_predict(pred_factory, configs, y, noise, train, test, level)
        for k in ("mean", "std", "lo", "hi"):
            out[k][test] = got[k]
        fit_s, predict_s = fit_s + got["fit_s"], predict_s + got["predict_s"]
        fold_of[test] = f
    k = int(fold_of.max()) + 1
    return {"y": y, **out, "fold": fold_of, "fit_s": np.float64(fit_s / k),
            "predict_s": np.float64(predict_s / k)}


def evaluate_predictor(pred_factory: Callable[[], Predictor], configs: Sequence[dict],
                       values: Sequence[float], folds: int | str = 5, seed: int = 0,
                       noise: Sequence[float] | None = None) -> dict[str, float]:
    """Cross-validated quality of a predictor.

    Args: as :func:`cross_val_predict`.

    Returns:
        ``kendall_tau``, ``spearman`` (rank correlations of pooled out-of-fold predictions),
        ``mape`` (fraction, 0.05 = 5 %), ``coverage95`` (fraction of measured values inside the
        95 % interval for a new measurement), ``top5_recall`` (:func:`top_k_recall` of the top
        5 %), ``regret`` (:func:`regret` of the predicted best), ``fit_s`` and ``predict_s``
        (mean seconds per fold), ``n`` (trials) and ``folds`` (number of folds).

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
    return {**_scores(cv["y"], cv["mean"], cv["lo"], cv["hi"]), "fit_s": float(cv["fit_s"]),
            "predict_s": float(cv["predict_s"]), "n": len(cv["y"]),
            "folds": int(cv["fold"].max()) + 1}


def _scores(y: np.ndarray, mean: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> dict[str, float]:
    return {
        "kendall_tau": kendall_tau(y, mean),
        "spearman": spearman(y, mean),
        "mape": mape(y, mean) if (y != 0).all() else float("nan"),
        "coverage95": interval_coverage(y, lo, hi),
        "top5_recall": top_k_recall(y, mean, 0.05),
        "regret": regret(y, mean),
    }


def learning_curve(pred_factories: Mapping[str, Callable[[], Predictor]], configs: Sequence[dict],
                   values: Sequence[float], sizes: Sequence[int] = (10, 20, 50, 100, 200), *,
                   repeats: int = 3, seed: int = 0, noise: Sequence[float] | None = None,
                   progress: bool = False, min_test: int = 20) -> list[dict[str, Any]]:
    """Quality against the number of training trials, for several predictors on the same splits.

    For each size ``n`` smaller than the table, ``repeats`` times: ``n`` trials drawn at random
    (the same draw for every predictor) train, all the others test. A size that would leave
    fewer than ``max(min_test, rows // 4)`` test trials (a Kendall tau over a handful of trials
    says little) is replaced by one leave-one-out run over the whole table (``n`` is then
    reported as rows - 1, with ``split = "loo"``), so small tables still get a figure.

    Args:
        pred_factories: Name -> unfitted predictor factory, e.g. ``{"gp": lambda:
            GPPredictor(space)}``.
        configs, values, noise: The table (as :func:`cross_val_predict`).
        sizes: Training-set sizes.
        repeats: Random draws per size.
        seed: Seed of the draws.
        progress: Show a tqdm bar.
        min_test: Fewest test trials of a random split (see above).

    Returns:
        One dict per (predictor, size, repeat): ``predictor``, ``n``, ``split`` (``"random"`` or
        ``"loo"``), ``repeat`` and the :func:`evaluate_predictor` scores of the test trials.
    """
    from tqdm.auto import tqdm

    configs = list(configs)
    y = np.asarray(values, dtype=np.float64).ravel()
    rows_n = len(configs)
    if y.size != rows_n:
        raise PredictorError(f"{rows_n} configs but {y.size} values",
                             hint="pass one value per configuration")
    rng = np.random.default_rng(seed)
    plan: list[tuple[int, str, int, np.ndarray | None]] = []
    loo_done = False
    for n in sizes:
        if n > rows_n - max(min_test, rows_n // 4):
            if not loo_done:
                plan.append((rows_n - 1, "loo", 0, None))
                loo_done = True
            continue
        plan += [(n, "random", r, rng.permutation(rows_n)[:n]) for r in range(repeats)]
    out: list[dict[str, Any]] = []
    bar = tqdm(total=len(plan) * len(pred_factories), disable=not progress, unit="fit")
    for n, split, r, train in plan:
        for name, factory in pred_factories.items():
            if train is None:
                scores = evaluate_predictor(factory, configs, y, folds="loo", noise=noise)
            else:
                test = np.setdiff1d(np.arange(rows_n), train)
                got = _fit_predict(factory, configs, y, noise, train, test, 0.95)
                scores = {**_scores(y[test], got["mean"], got["lo"], got["hi"]),
                          "fit_s": got["fit_s"], "predict_s": got["predict_s"]}
            out.append({**scores, "predictor": name, "n": n, "split": split, "repeat": r})
            bar.update()
    bar.close()
    return out
