"""Figures of a predictor: predicted against measured values (parity), quality against the
number of measured trials (learning curve), partial dependence and slices per knob, knob
importance, and the predicted feasibility map with the measured trials on top.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._style import (METRICS, PERCENT, axis_label, figure_axes, integer_x_ticks, need_columns,
                     place_legend, tick_label)

if TYPE_CHECKING:
    import matplotlib.axes
    import matplotlib.figure
    import pandas as pd

__all__ = ["learning_curve_data", "plot_feasibility_map", "plot_importance",
           "plot_learning_curve", "plot_parity", "plot_partial_dependence", "plot_slices"]


def plot_parity(measured: Sequence[float], predicted: Sequence[float],
                lo: Sequence[float] | None = None, hi: Sequence[float] | None = None, *,
                objective: str = "throughput", title: str | None = None, unit: str | None = None,
                log: bool | None = None, ax: matplotlib.axes.Axes | None = None
                ) -> matplotlib.figure.Figure:
    """Predicted against measured values with optional interval bars and the y = x line.

    ``log`` draws both axes on a log scale; None (default) does so when the values span more
    than a factor of 20 (speeds across a wide space do).
    """
    import numpy as np

    y, p = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    fig, ax = figure_axes(ax)
    if lo is not None and hi is not None:
        err = np.vstack([p - np.asarray(lo, dtype=float), np.asarray(hi, dtype=float) - p])
        ax.errorbar(y, p, yerr=np.clip(err, 0, None), fmt="o", ms=4, color="C1", ecolor="0.7",
                    label="prediction (95% interval)")
    else:
        ax.scatter(y, p, s=18, color="C1", label="prediction")
    both = np.concatenate([y, p])
    low, high = float(np.nanmin(both)), float(np.nanmax(both))
    if log is None:
        log = low > 0 and high / low > 20
    span = [low * 0.9, high * 1.1]
    ax.plot(span, span, color="0.4", lw=1, ls="--", label="y = x")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(f"measured {axis_label(objective, unit)}")
    ax.set_ylabel(f"predicted {axis_label(objective, unit)}")
    ax.set_title(title or "predictor, out-of-fold")
    place_legend(ax)
    return fig


def learning_curve_data(curve: pd.DataFrame | Sequence[Mapping[str, Any]],
                        metric: str = "kendall_tau") -> pd.DataFrame:
    """Median and quartiles of a quality metric against the training-set size, per predictor.

    Args:
        curve: :func:`~cubicml_lab.surrogate.learning_curve` output (a list of dicts or its
            DataFrame): columns ``predictor``, ``n`` and ``metric``.
        metric: Which score, e.g. ``"kendall_tau"``, ``"top5_recall"``, ``"regret"``.

    Returns:
        DataFrame with columns predictor, n, median, q25, q75, repeats (in the metric's units:
        fractions stay fractions), sorted by predictor (first seen first) and n.

    Example:
        >>> rows = [{"predictor": "gp", "n": 10, "kendall_tau": t} for t in (0.2, 0.4, 0.6)]
        >>> learning_curve_data(rows)["median"].tolist()
        [0.4]
    """
    import pandas as pd

    df = pd.DataFrame(list(curve)) if not isinstance(curve, pd.DataFrame) else curve
    need_columns(df, ["predictor", "n", metric], "learning_curve_data (learning_curve output)")
    grouped = df.groupby(["predictor", "n"], sort=False)[metric]
    out = grouped.agg(median="median", q25=lambda r: r.quantile(0.25),
                      q75=lambda r: r.quantile(0.75), repeats="count").reset_index()
    order = {name: i for i, name in enumerate(pd.unique(df["predictor"]))}
    return out.sort_values(["predictor", "n"], key=lambda c: c.map(order) if c.name ==
                           "predictor" else c, kind="stable").reset_index(drop=True)


def plot_learning_curve(curve: pd.DataFrame | Sequence[Mapping[str, Any]],
                        metric: str = "kendall_tau", *, title: str | None = None,
                        ax: matplotlib.axes.Axes | None = None) -> matplotlib.figure.Figure:
    """Median quality against the number of measured trials, one line per predictor, with the
    interquartile range over repeats as a band (:func:`learning_curve_data`). Fractions
    (regret, MAPE, coverage, recall) are drawn in percent."""
    data = learning_curve_data(curve, metric)
    scale = 100.0 if metric in PERCENT else 1.0
    fig, ax = figure_axes(ax, (6, 3.8))
    for i, (name, d) in enumerate(data.groupby("predictor", sort=False)):
        ax.plot(d["n"], scale * d["median"], marker="o", color=f"C{i}", label=name)
        if (d["repeats"] > 1).any():
            ax.fill_between(d["n"], scale * d["q25"], scale * d["q75"], color=f"C{i}",
                            alpha=0.15, lw=0)
    ax.set_xlabel("measured configurations (n)")
    ax.set_ylabel(f"{METRICS.get(metric, metric)} on the rest (median)")
    if metric == "kendall_tau":
        ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_title(title or "learning curve")
    sizes = sorted(set(data["n"]))
    if len(sizes) <= 8:
        ax.set_xticks(sizes)
    else:
        integer_x_ticks(ax)
    place_legend(ax)
    return fig


def plot_partial_dependence(data: pd.DataFrame, *, objective: str = "throughput",
                            unit: str | None = None, ncols: int = 4, log_y: bool = False,
                            title: str | None = None) -> matplotlib.figure.Figure:
    """One small panel per knob: the predicted objective against the knob's values with its
    interval band (ordered knobs as lines, categories as points with bars).

    Args:
        data: :func:`~cubicml_lab.surrogate.partial_dependence` or
            :func:`~cubicml_lab.surrogate.slices` output (columns knob, position, value,
            mean, lo, hi; with ``reference`` the reference's value is marked).
        objective, unit: What the y axis shows (the label).
        ncols: Panels per row.
        log_y: Log-scale y axes (speeds that span decades).
        title: Figure title.
    """
    import matplotlib.pyplot as plt
    import pandas as pd

    need_columns(data, ["knob", "position", "value", "mean", "lo", "hi"], "plot_partial_dependence")
    knobs = list(pd.unique(data["knob"]))
    ncols = max(1, min(ncols, len(knobs)))
    nrows = math.ceil(len(knobs) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.7 * ncols, 2.3 * nrows), sharey=True,
                             squeeze=False)
    for ax, knob in zip(axes.flat, knobs, strict=False):
        d = data[data["knob"] == knob].sort_values("position")
        x, mean = d["position"].to_numpy(), d["mean"].to_numpy(dtype=float)
        lo, hi = d["lo"].to_numpy(dtype=float), d["hi"].to_numpy(dtype=float)
        if any(isinstance(v, (str, bool)) for v in d["value"]):
            ax.errorbar(x, mean, yerr=[mean - lo, hi - mean], fmt="o", color="C0", ecolor="C0",
                        elinewidth=4, alpha=0.8, capsize=0)
        else:
            ax.fill_between(x, lo, hi, color="C0", alpha=0.18, lw=0)
            ax.plot(x, mean, marker="o", ms=3, color="C0")
        if "reference" in d:
            ref = d[d["reference"].astype(bool)]
            ax.plot(ref["position"], ref["mean"], marker="*", ms=11, color="C3", ls="none")
        ax.set_xticks(x, [tick_label(v) for v in d["value"]], fontsize=7,
                      rotation=45 if len(x) > 5 else 0)
        ax.set_xlim(x.min() - 0.5, x.max() + 0.5)
        ax.set_title(knob, fontsize=9)
        if log_y:
            ax.set_yscale("log")
    for ax in axes.flat[len(knobs):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel(axis_label(objective, unit), fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_slices(data: pd.DataFrame, **kwargs: Any) -> matplotlib.figure.Figure:
    """:func:`plot_partial_dependence` of :func:`~cubicml_lab.surrogate.slices` output: the
    reference configuration's own value of each knob is the red star."""
    return plot_partial_dependence(data, **kwargs)


def plot_importance(importance: pd.Series | pd.DataFrame, column: str | None = None, *,
                    xlabel: str | None = None, title: str | None = None, top: int | None = None,
                    ax: matplotlib.axes.Axes | None = None) -> matplotlib.figure.Figure:
    """Horizontal bars, the most important knob on top.

    Args:
        importance: :func:`~cubicml_lab.surrogate.knob_importance` output (bars of its
            ``importance``, labelled with ``max_over_min`` as a factor) or a Series such as
            :meth:`GPPredictor.importance() <cubicml_lab.surrogate.GPPredictor.importance>`.
        column: The DataFrame column to draw (default ``"importance"``).
        xlabel, title: Axis label and title (defaults say what the numbers are).
        top: Draw only the ``top`` largest.
    """
    import pandas as pd

    frame = importance if isinstance(importance, pd.DataFrame) else None
    if frame is not None:
        column = column or "importance"
        need_columns(frame, [column], "plot_importance")
        values = frame[column]
    else:
        values = importance
    values = values.astype(float).sort_values(ascending=False, kind="stable")
    values = values.iloc[:top] if top else values
    fig, ax = figure_axes(ax, (5.5, 0.3 * len(values) + 1.2))
    names = [str(i) for i in values.index][::-1]
    ax.barh(names, values.to_numpy()[::-1], color="C0")
    if frame is not None and "max_over_min" in frame:
        for name, v in zip(names, values.to_numpy()[::-1], strict=True):
            ratio = frame.loc[_key(frame.index, name), "max_over_min"]
            if pd.notna(ratio):
                ax.annotate(f"{ratio:.3g}x", (v, name), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=7)
        ax.margins(x=0.12)
    default = {"importance": "spread of the partial dependence (sd, log units)",
               "relevance": "kernel relevance (1 / lengthscale)"}.get(
                   str(column or values.name), str(column or values.name or "importance"))
    ax.set_xlabel(xlabel or default)
    ax.set_title(title or "which knobs matter")
    ax.tick_params(axis="y", labelsize=8)
    return fig


def _key(index: pd.Index, name: str) -> Any:
    return next(i for i in index if str(i) == name)


def plot_feasibility_map(grid: pd.DataFrame, measured: pd.DataFrame | None = None, *,
                         x: str | None = None, y: str | None = None, title: str | None = None,
                         seed: int = 0, ax: matplotlib.axes.Axes | None = None
                         ) -> matplotlib.figure.Figure:
    """Predicted probability that a configuration runs over two knobs, as a heatmap, with the
    measured trials on top (ok as open circles, failures as red crosses, jittered in a cell).

    Args:
        grid: :func:`~cubicml_lab.surrogate.feasibility_map` output: the two knob columns
            (``x`` and ``y``, default its first two columns), ``p_runs``.
        measured: Trials with the two knob columns and ``status`` (e.g. a dataset's table).
        x, y: The knob columns.
        title: Axes title.
        seed: Seed of the jitter.
    """
    import numpy as np
    import pandas as pd

    x = x or str(grid.columns[0])
    y = y or str(grid.columns[1])
    need_columns(grid, [x, y, "p_runs"], "plot_feasibility_map (feasibility_map output)")
    xs, ys = list(pd.unique(grid[x])), list(pd.unique(grid[y]))
    image = np.full((len(ys), len(xs)), np.nan)
    for vx, vy, p in zip(grid[x], grid[y], grid["p_runs"], strict=True):
        image[ys.index(vy), xs.index(vx)] = p
    fig, ax = figure_axes(ax, (1.1 * len(xs) + 3.2, 0.7 * len(ys) + 2.2))
    im = ax.imshow(image, origin="lower", cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    fig.colorbar(im, ax=ax, label="P(runs)", fraction=0.05, pad=0.02)
    for (i, j), p in np.ndenumerate(image):
        if np.isfinite(p):
            ax.text(j, i + 0.32, f"{p:.2f}", ha="center", va="center", fontsize=7, color="0.15")
    if measured is not None:
        need_columns(measured, [x, y, "status"], "plot_feasibility_map (measured trials)")
        ix = {tick_label(v): k for k, v in enumerate(xs)}
        iy = {tick_label(v): k for k, v in enumerate(ys)}
        rows = [(ix[tick_label(a)], iy[tick_label(b)], s) for a, b, s in
                zip(measured[x], measured[y], measured["status"], strict=True)
                if tick_label(a) in ix and tick_label(b) in iy]
        jitter = np.random.default_rng(seed).uniform(-0.3, 0.3, size=(len(rows), 2)) * \
            np.array([1.0, 0.5])
        for ok, style in ((True, {"marker": "o", "facecolors": "none", "edgecolors": "k",
                                  "label": "measured: ok"}),
                          (False, {"marker": "x", "color": "C3",
                                   "label": "measured: oom / failed"})):
            pts = [(c + dx, r - 0.1 + dy) for (c, r, s), (dx, dy) in zip(rows, jitter,
                                                                           strict=True)
                   if (s == "ok") == ok]
            if pts:
                ax.scatter(*zip(*pts, strict=True), s=14, lw=0.8, **style)
        place_legend(ax, "below")
    ax.set_xticks(range(len(xs)), [tick_label(v) for v in xs])
    ax.set_yticks(range(len(ys)), [tick_label(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or "predicted P(runs), measured trials on top")
    return fig
