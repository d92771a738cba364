"""Matplotlib figures of campaigns and predictors, computed as data first, then drawn.

Each ``*_data`` function returns a pandas DataFrame that a notebook can show or test; each
``plot_*`` function draws it on an Axes (a new Figure when none is given) and returns the Figure.
Nothing here changes the store or the model: plots only read the API below them. One style
throughout: trial axes count whole trials, regret and other fractions are drawn in percent
(the data keep fractions, 0.05 = 5 %), failures are red crosses, and legends sit where they hide
the least (``loc="best"`` on a translucent frame) or below the axes when the data fill them.

=========================  ==================================================================
figure                     data
=========================  ==================================================================
plot_best_so_far           a campaign's trials (:func:`best_so_far_data`)
plot_regret_curves         replays stacked over seeds (:func:`regret_curves_data`)
plot_parity                measured vs out-of-fold predictions (``cross_val_predict``)
plot_learning_curve        ``learning_curve`` output (:func:`learning_curve_data`)
plot_partial_dependence    ``partial_dependence`` or ``slices`` output, one panel per knob
plot_importance            ``knob_importance`` or ``GPPredictor.importance`` output
plot_pareto                trials or ``BayesianSearch.pareto()`` (:func:`pareto_data`)
plot_feasibility_map       ``feasibility_map`` output, measured statuses overlaid
campaign_figure            best-so-far and parity side by side
=========================  ==================================================================

Example:
    >>> import pandas as pd
    >>> df = pd.DataFrame({"trial_id": [1, 2, 3], "status": ["ok", "oom", "ok"],
    ...                    "throughput": [10.0, None, 30.0]})
    >>> best_so_far_data(df)["best"].tolist()
    [10.0, 10.0, 30.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import DataError

if TYPE_CHECKING:
    import matplotlib.axes
    import matplotlib.figure
    import numpy as np
    import pandas as pd

__all__ = ["best_so_far_data", "campaign_figure", "learning_curve_data", "pareto_data",
           "plot_best_so_far", "plot_feasibility_map", "plot_importance", "plot_learning_curve",
           "plot_pareto", "plot_parity", "plot_partial_dependence",
           "plot_regret_curves", "plot_repeats", "plot_slices", "regret_curves_data"]

_LABELS = {"throughput": "throughput (units/s)", "tokens_per_s": "tokens/s",
           "samples_per_s": "samples/s", "step_time_s": "step time (s)",
           "peak_mem_gib": "peak memory (GiB)", "mfu": "MFU (0-1)"}


def _label(objective: str, unit: str | None = None) -> str:
    if unit is not None:
        return f"{objective} ({unit})"
    return _LABELS.get(objective, objective)


#: Metrics stored as fractions (0.05 = 5 %) and drawn in percent.
_PERCENT = {"regret": "regret (% below the best)", "mape": "MAPE (%)",
            "coverage95": "95% interval coverage (%)", "top5_recall": "top-5% recall (%)"}
_METRICS = {"kendall_tau": "Kendall tau", "spearman": "Spearman rho", **_PERCENT}


def _axes(ax: matplotlib.axes.Axes | None, size: tuple[float, float] = (5, 4)
          ) -> tuple[matplotlib.figure.Figure, matplotlib.axes.Axes]:
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=size)
        return fig, ax
    return ax.figure, ax


def _legend(ax: matplotlib.axes.Axes, where: str = "best") -> None:
    """The one legend style: inside the axes on a translucent frame, where matplotlib finds it
    hides least or else in a corner, as long as it hides no data point or line; otherwise below
    the axes (always there with ``where="below"``)."""
    if where != "below":
        for loc in ("best", "lower right", "upper right", "lower left", "upper left"):
            legend = ax.legend(loc=loc, fontsize=8, framealpha=0.8)
            if not _hides_data(ax, legend):
                return
            legend.remove()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8,
              frameon=False)


def _hides_data(ax: matplotlib.axes.Axes, legend: Any, pad_px: float = 3.0) -> bool:
    """Whether ``legend`` covers a marker or a line of ``ax`` (both in display pixels; lines
    are sampled between their vertices)."""
    import numpy as np

    box = legend.get_window_extent().padded(pad_px)  # any canvas, pyplot's or a bare Figure
    points = [c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections
              if len(c.get_offsets())]
    for line in ax.get_lines():
        xy = np.column_stack(line.get_data()).astype(float)
        style = line.get_drawstyle()
        if len(xy) > 1 and style in ("steps-post", "steps-pre", "steps"):  # the drawn corners
            corner = (np.column_stack([xy[1:, 0], xy[:-1, 1]]) if style == "steps-post"
                      else np.column_stack([xy[:-1, 0], xy[1:, 1]]))
            xy = np.insert(xy, np.arange(1, len(xy)), corner, axis=0)
        xy = line.get_transform().transform(xy)  # data, or axes units for axhline's x
        if len(xy) > 1:  # 16 points per segment: a line under the legend counts too
            t = np.linspace(0.0, 1.0, 16)[:, None, None]
            xy = (xy[:-1][None] * (1 - t) + xy[1:][None] * t).reshape(-1, 2)
        points.append(xy)
    xy = np.concatenate(points) if points else np.empty((0, 2))
    xy = xy[np.isfinite(xy).all(axis=1)]
    inside = ((xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0)
              & (xy[:, 1] <= box.y1))
    return bool(inside.any())


def _integer_x(ax: matplotlib.axes.Axes, first: float | None = None,
               last: float | None = None) -> None:
    """Whole-number ticks on the x axis (trials, counts); where the data span ``first`` to
    ``last`` covers few of them, half a step of room each side (one trial: 0.5 to 1.5 with one
    tick at 1, not matplotlib's 0.945 to 1.055)."""
    from matplotlib.ticker import MaxNLocator

    if first is not None and last is not None and last - first < 4:
        ax.set_xticks(range(math.ceil(first), math.floor(last) + 1))
        ax.set_xlim(first - 0.5, last + 0.5)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _need(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"{what} needs column(s) {missing}; got {list(df.columns)[:12]}",
                        hint=f"pass the output of the function {what} documents")


def best_so_far_data(df: pd.DataFrame, objective: str = "throughput",
                     direction: str = "maximize") -> pd.DataFrame:
    """Per trial in id order: its value (NaN unless ok) and the best ok value so far.

    A flagged trial (:func:`~cubicml_lab.trials.figure_flag`: a ``contended`` column > 0,
    other work shared the cores while it was timed; or a stored ``{objective}_rel_ci`` that is
    NaN or inf, a figure without an interval) keeps its value but does not move the
    best-so-far line while the campaign has an unflagged ok trial, as
    :meth:`~cubicml_lab.Campaign.best` passes over it.

    Args:
        df: A campaign's trials (``store.to_dataframe(name)``).
        objective: Metric column to follow.
        direction: ``"maximize"`` or ``"minimize"``.

    Returns:
        DataFrame with columns trial (1-based position), trial_id, status, value, best,
        contended (bool) and rel_ci (the value's relative 95% CI from ``{objective}_rel_ci``,
        NaN where none was stored).
    """
    import numpy as np
    import pandas as pd

    df = df.sort_values("trial_id")
    ok = df["status"].eq("ok").to_numpy()
    raw = _column(df, objective)
    value = np.where(ok, raw, np.nan)
    contended = ok & (np.nan_to_num(_column(df, "contended")) > 0)
    ci = f"{objective}_rel_ci" if f"{objective}_rel_ci" in df else "step_time_rel_ci"
    flagged = contended | (ok & (ci in df) & ~np.isfinite(_column(df, ci)))
    counted = np.where(flagged, np.nan, value) if (ok & ~flagged).any() else value
    signed = counted if direction == "maximize" else -counted
    best = np.fmax.accumulate(signed)  # NaN (failed trials) carry the best so far forward
    best = best if direction == "maximize" else -best
    return pd.DataFrame({"trial": np.arange(1, len(df) + 1), "trial_id": df["trial_id"].to_numpy(),
                         "status": df["status"].to_numpy(), "value": value, "best": best,
                         "contended": contended,
                         "rel_ci": np.where(ok, _column(df, f"{objective}_rel_ci"), np.nan)})


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    """``df[name]`` as floats, all NaN when the column is missing."""
    import numpy as np
    import pandas as pd

    if name not in df:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)


def plot_best_so_far(df: pd.DataFrame, objective: str = "throughput", direction: str = "maximize",
                     *, reference: float | None = None, reference_label: str = "default config",
                     unit: str | None = None, ax: matplotlib.axes.Axes | None = None
                     ) -> matplotlib.figure.Figure:
    """Best-so-far curve of a campaign: each trial a dot with its 95% CI where one was stored,
    a trial flagged contended an open dot (not counted as best), failures on the x axis."""
    import numpy as np

    data = best_so_far_data(df, objective, direction)
    fig, ax = _axes(ax)
    ok = data["status"] == "ok"
    clean, flagged = ok & ~data["contended"], ok & data["contended"]
    ax.plot(data["trial"], data["best"], drawstyle="steps-post", color="C0", label="best so far")
    ax.scatter(data.loc[clean, "trial"], data.loc[clean, "value"], s=18, color="C0", alpha=0.6,
               label="trial")
    half = (data["value"] * data["rel_ci"]).where(ok)
    if np.isfinite(half.to_numpy(dtype=float)).any():
        ax.errorbar(data["trial"], data["value"], yerr=half, fmt="none", ecolor="C0",
                    alpha=0.4, lw=1, capsize=2, label="95% CI")
    if flagged.any():
        ax.scatter(data.loc[flagged, "trial"], data.loc[flagged, "value"], s=30,
                   facecolors="none", edgecolors="C1", label="contended (not trusted)")
    failed = data[~ok]
    if len(failed):
        y0 = float(data["value"].min()) if ok.any() else 0.0
        ax.scatter(failed["trial"], [y0] * len(failed), marker="x", color="C3",
                   label="oom / failed / timeout")
    if reference is not None:
        ax.axhline(reference, color="0.4", ls="--", lw=1, label=reference_label)
    ax.set_xlabel("trial")
    ax.set_ylabel(_label(objective, unit))
    ax.set_title("search progress")
    _integer_x(ax, 1, max(len(data), 1))
    _legend(ax)
    return fig


def plot_repeats(repeats: pd.DataFrame, metric: str = "throughput", *,
                 labels: Sequence[str] | None = None, unit: str | None = None,
                 ax: matplotlib.axes.Axes | None = None) -> matplotlib.figure.Figure:
    """The spread of repeated measurements: one box per configuration, each ok run a dot.

    Args:
        repeats: One row per measurement with ``config`` (an index), ``status`` and ``metric``,
            as :func:`cubicml_lab.launch.measure_repeats` returns.
        metric: Column to draw, e.g. ``"tokens_per_s"``.
        labels: Tick label per configuration index (default: the index).
        unit: Unit for the axis label.
    """
    import numpy as np

    _need(repeats, ["config", "status", metric], "plot_repeats")
    ok = repeats[repeats["status"] == "ok"]
    groups = sorted(ok["config"].unique())
    data = [ok.loc[ok["config"] == g, metric].to_numpy(dtype=float) for g in groups]
    fig, ax = _axes(ax, (6, 3.2))
    if data:
        ax.boxplot(data, widths=0.5, showfliers=False)
    for i, values in enumerate(data, start=1):
        ax.scatter(np.full(len(values), i), values, s=14, color="C0", alpha=0.6, zorder=3)
    ax.set_xticks(range(1, len(groups) + 1),
                  [str(labels[g]) if labels is not None else str(g) for g in groups],
                  fontsize=8, rotation=12 if labels is not None else 0)
    ax.set_xlabel("configuration")
    ax.set_ylabel(_label(metric, unit))
    runs = ok.groupby("config").size()
    n = "no" if runs.empty else (f"{runs.min()}" if runs.nunique() == 1
                                 else f"{runs.min()}-{runs.max()}")
    ax.set_title(f"{n} ok fresh-process repeats per configuration")
    return fig


def regret_curves_data(runs: pd.DataFrame) -> pd.DataFrame:
    """Median and quartiles of the regret after each trial, per searcher, over seeds.

    Args:
        runs: Replays stacked: columns ``searcher``, ``seed``, ``trial`` and ``regret`` (e.g.
            :meth:`~cubicml_lab.search.TableObjective.replay` outputs with the first two added).

    Returns:
        DataFrame with columns searcher, trial, median, q25, q75, seeds; regrets stay
        fractions of the best (0.05 = 5 %), as ``runs`` has them; :func:`plot_regret_curves`
        draws them in percent.

    Example:
        >>> import pandas as pd
        >>> runs = pd.DataFrame({"searcher": ["a"] * 4, "seed": [0, 0, 1, 1],
        ...                      "trial": [1, 2, 1, 2], "regret": [0.5, 0.1, 0.3, 0.0]})
        >>> regret_curves_data(runs)["median"].tolist()
        [0.4, 0.05]
    """
    from .surrogate.metrics import quartiles

    grouped = runs.groupby(["searcher", "trial"], sort=False)["regret"]
    out = grouped.agg(median="median", q25=lambda r: quartiles(r)[0],
                      q75=lambda r: quartiles(r)[2], seeds="count")
    return out.reset_index()


def plot_regret_curves(runs: pd.DataFrame, *, title: str = "regret of the best found",
                       ax: matplotlib.axes.Axes | None = None) -> matplotlib.figure.Figure:
    """Regret (% slower than the table's best) against trials: median line and interquartile
    band per searcher (:func:`regret_curves_data`)."""
    data = regret_curves_data(runs)
    fig, ax = _axes(ax)
    for i, (name, d) in enumerate(data.groupby("searcher", sort=False)):
        ax.plot(d["trial"], 100 * d["median"], color=f"C{i}", label=f"{name} (median)")
        ax.fill_between(d["trial"], 100 * d["q25"], 100 * d["q75"], color=f"C{i}", alpha=0.15,
                        lw=0)
    ax.set_xlabel("trials")
    ax.set_ylabel(_PERCENT["regret"])
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    _integer_x(ax, data["trial"].min(), data["trial"].max())
    _legend(ax)
    return fig


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
    fig, ax = _axes(ax)
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
    ax.set_xlabel(f"measured {_label(objective, unit)}")
    ax.set_ylabel(f"predicted {_label(objective, unit)}")
    ax.set_title(title or "predictor, out-of-fold")
    _legend(ax)
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
    _need(df, ["predictor", "n", metric], "learning_curve_data (learning_curve output)")
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
    scale = 100.0 if metric in _PERCENT else 1.0
    fig, ax = _axes(ax, (6, 3.8))
    for i, (name, d) in enumerate(data.groupby("predictor", sort=False)):
        ax.plot(d["n"], scale * d["median"], marker="o", color=f"C{i}", label=name)
        if (d["repeats"] > 1).any():
            ax.fill_between(d["n"], scale * d["q25"], scale * d["q75"], color=f"C{i}",
                            alpha=0.15, lw=0)
    ax.set_xlabel("measured configurations (n)")
    ax.set_ylabel(f"{_METRICS.get(metric, metric)} on the rest (median)")
    if metric == "kendall_tau":
        ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_title(title or "learning curve")
    sizes = sorted(set(data["n"]))
    if len(sizes) <= 8:
        ax.set_xticks(sizes)
    else:
        _integer_x(ax)
    _legend(ax)
    return fig


def _tick(value: Any) -> str:
    """A short tick label: 1000000 -> 1M, 32768 -> 32768, 0.001 -> 0.001, True -> True."""
    value = value.item() if hasattr(value, "item") and not isinstance(value, str) else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if abs(value) >= size and value % size == 0:
            return f"{value // size:g}{suffix}"
    return f"{value:g}"


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

    _need(data, ["knob", "position", "value", "mean", "lo", "hi"], "plot_partial_dependence")
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
        ax.set_xticks(x, [_tick(v) for v in d["value"]], fontsize=7,
                      rotation=45 if len(x) > 5 else 0)
        ax.set_xlim(x.min() - 0.5, x.max() + 0.5)
        ax.set_title(knob, fontsize=9)
        if log_y:
            ax.set_yscale("log")
    for ax in axes.flat[len(knobs):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel(_label(objective, unit), fontsize=8)
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
        _need(frame, [column], "plot_importance")
        values = frame[column]
    else:
        values = importance
    values = values.astype(float).sort_values(ascending=False, kind="stable")
    values = values.iloc[:top] if top else values
    fig, ax = _axes(ax, (5.5, 0.3 * len(values) + 1.2))
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


def pareto_data(trials: pd.DataFrame | Sequence[Mapping[str, Any]],
                objective: str = "throughput", second_objective: str = "peak_mem_gib", *,
                directions: tuple[str, str] = ("maximize", "minimize")) -> pd.DataFrame:
    """The ok trials with two metrics, and which of them are Pareto-optimal.

    Args:
        trials: A trials DataFrame (rows with a ``status`` other than ``"ok"`` are dropped) or
            :meth:`BayesianSearch.pareto() <cubicml_lab.search.BayesianSearch.pareto>` output.
        objective, second_objective: The two metric columns.
        directions: ``"maximize"`` or ``"minimize"`` for each.

    Returns:
        DataFrame of the usable rows (both metrics finite) with a boolean ``on_front``,
        sorted by ``objective``, best first.

    Example:
        >>> import pandas as pd
        >>> t = pd.DataFrame({"status": ["ok"] * 3, "throughput": [10.0, 20.0, 15.0],
        ...                   "peak_mem_gib": [1.0, 3.0, 4.0]})
        >>> pareto_data(t)["on_front"].tolist()
        [True, False, True]
    """
    import numpy as np
    import pandas as pd

    df = trials.copy() if isinstance(trials, pd.DataFrame) else pd.DataFrame(list(trials))
    _need(df, [objective, second_objective], "pareto_data")
    bad = [d for d in directions if d not in ("maximize", "minimize")]
    if bad or len(directions) != 2:
        raise DataError(f"directions = {directions!r}: each must be 'maximize' or 'minimize'",
                        hint="e.g. directions=('maximize', 'minimize')")
    if "status" in df:
        df = df[df["status"] == "ok"]
    y = df[[objective, second_objective]].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    keep = np.isfinite(y).all(axis=1)
    df, y = df[keep].copy(), y[keep]
    y = y * np.array([1.0 if d == "maximize" else -1.0 for d in directions])
    dominated = ((y[None, :, :] >= y[:, None, :]).all(-1) & (y[None, :, :] > y[:, None, :])
                 .any(-1)).any(axis=1)
    df["on_front"] = ~dominated
    return df.sort_values(objective, ascending=directions[0] != "maximize",
                          kind="stable").reset_index(drop=True)


def plot_pareto(trials: pd.DataFrame | Sequence[Mapping[str, Any]],
                objective: str = "throughput", second_objective: str = "peak_mem_gib", *,
                directions: tuple[str, str] = ("maximize", "minimize"), unit: str | None = None,
                second_unit: str | None = None, title: str | None = None,
                ax: matplotlib.axes.Axes | None = None) -> matplotlib.figure.Figure:
    """The trade-off of two metrics: every ok trial in grey, the Pareto front highlighted and
    joined by a staircase (:func:`pareto_data`); ``second_objective`` on the x axis."""
    data = pareto_data(trials, objective, second_objective, directions=directions)
    fig, ax = _axes(ax, (5.5, 4))
    rest, front = data[~data["on_front"]], data[data["on_front"]]
    ax.scatter(rest[second_objective], rest[objective], s=14, color="0.65", label="trial")
    front = front.sort_values(second_objective)
    ax.plot(front[second_objective], front[objective], drawstyle="steps-post", color="C1", lw=1)
    ax.scatter(front[second_objective], front[objective], s=30, color="C1", zorder=3,
               label=f"Pareto front ({len(front)})")
    ax.set_xlabel(_label(second_objective, second_unit))
    ax.set_ylabel(_label(objective, unit))
    ax.set_title(title or f"{objective} against {second_objective}")
    _legend(ax)
    return fig


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
    _need(grid, [x, y, "p_runs"], "plot_feasibility_map (feasibility_map output)")
    xs, ys = list(pd.unique(grid[x])), list(pd.unique(grid[y]))
    image = np.full((len(ys), len(xs)), np.nan)
    for vx, vy, p in zip(grid[x], grid[y], grid["p_runs"], strict=True):
        image[ys.index(vy), xs.index(vx)] = p
    fig, ax = _axes(ax, (1.1 * len(xs) + 3.2, 0.7 * len(ys) + 2.2))
    im = ax.imshow(image, origin="lower", cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    fig.colorbar(im, ax=ax, label="P(runs)", fraction=0.05, pad=0.02)
    for (i, j), p in np.ndenumerate(image):
        if np.isfinite(p):
            ax.text(j, i + 0.32, f"{p:.2f}", ha="center", va="center", fontsize=7, color="0.15")
    if measured is not None:
        _need(measured, [x, y, "status"], "plot_feasibility_map (measured trials)")
        ix = {_tick(v): k for k, v in enumerate(xs)}
        iy = {_tick(v): k for k, v in enumerate(ys)}
        rows = [(ix[_tick(a)], iy[_tick(b)], s) for a, b, s in
                zip(measured[x], measured[y], measured["status"], strict=True)
                if _tick(a) in ix and _tick(b) in iy]
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
        _legend(ax, "below")
    ax.set_xticks(range(len(xs)), [_tick(v) for v in xs])
    ax.set_yticks(range(len(ys)), [_tick(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or "predicted P(runs), measured trials on top")
    return fig


def campaign_figure(df: pd.DataFrame, cv: dict[str, Any] | None = None, *,
                    objective: str = "throughput", direction: str = "maximize",
                    reference: float | None = None, title: str | None = None,
                    unit: str | None = None) -> matplotlib.figure.Figure:
    """Two panels: best-so-far curve and (when ``cv`` is given) the out-of-fold parity plot.

    Args:
        df: A campaign's trials.
        cv: Out-of-fold predictions: keys measured, mean, lo, hi and optionally kendall_tau.
        objective: Metric followed.
        direction: ``"maximize"`` or ``"minimize"``.
        reference: A value drawn as a dashed line (e.g. the default configuration's).
        title: Figure title.
        unit: Unit shown in the axis labels (e.g. "tokens/s"); default: the objective's own.
    """
    import matplotlib.pyplot as plt

    ncols = 2 if cv is not None else 1
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 4.2), squeeze=False)
    plot_best_so_far(df, objective, direction, reference=reference, unit=unit, ax=axes[0, 0])
    if cv is not None:
        tau = cv.get("kendall_tau")
        sub = None if tau is None else f"GP, leave-one-out (Kendall tau = {tau:.2f})"
        plot_parity(cv["measured"], cv["mean"], cv.get("lo"), cv.get("hi"), objective=objective,
                    title=sub, unit=unit, ax=axes[0, 1])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
