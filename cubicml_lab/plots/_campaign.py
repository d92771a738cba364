"""Figures of measured trials: search progress (best so far), the spread of repeated
measurements, regret curves of replayed searches, the Pareto front of two metrics, and the
two-panel campaign figure. Each ``*_data`` function returns the DataFrame its ``plot_*`` draws.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import DataError
from ._predictor import plot_parity
from ._style import (PERCENT, axis_label, figure_axes, float_column, integer_x_ticks,
                     need_columns, place_legend)

if TYPE_CHECKING:
    import matplotlib.axes
    import matplotlib.figure
    import pandas as pd

__all__ = ["best_so_far_data", "campaign_figure", "pareto_data", "plot_best_so_far",
           "plot_pareto", "plot_regret_curves", "plot_repeats", "regret_curves_data"]


def best_so_far_data(df: pd.DataFrame, objective: str = "throughput",
                     direction: str = "maximize") -> pd.DataFrame:
    """Per trial in id order: its value (NaN unless ok) and the best ok value so far.

    A flagged trial (:func:`~cubicml_lab.trials.figure_flag`: a ``contended`` column > 0,
    other work shared the cores while it was timed; a ``stopped_early`` column > 0, a timing
    stopped once it could not beat the best; or a stored ``{objective}_rel_ci`` that is
    NaN or inf, a figure without an interval) keeps its value but does not move the
    best-so-far line while the campaign has an unflagged ok trial, as
    :meth:`~cubicml_lab.Campaign.best` passes over it.

    Args:
        df: A campaign's trials (``store.to_dataframe(name)``).
        objective: Metric column to follow.
        direction: ``"maximize"`` or ``"minimize"``.

    Returns:
        DataFrame with columns trial (1-based position), trial_id, status, value, best,
        contended (bool), rel_ci (the value's relative 95% CI from ``{objective}_rel_ci``,
        NaN where none was stored) and spent_s (device-seconds spent up to and including the
        trial: ``duration_s`` x ``hw.devices``, 1 device where none was stored, a trial
        without both ends 0).
    """
    import numpy as np
    import pandas as pd

    df = df.sort_values("trial_id")
    ok = df["status"].eq("ok").to_numpy()
    raw = float_column(df, objective)
    value = np.where(ok, raw, np.nan)
    contended = ok & (np.nan_to_num(float_column(df, "contended")) > 0)
    ci = f"{objective}_rel_ci" if f"{objective}_rel_ci" in df else "step_time_rel_ci"
    stopped = ok & (np.nan_to_num(float_column(df, "stopped_early")) > 0)
    flagged = contended | stopped | (ok & (ci in df) & ~np.isfinite(float_column(df, ci)))
    counted = np.where(flagged, np.nan, value) if (ok & ~flagged).any() else value
    signed = counted if direction == "maximize" else -counted
    best = np.fmax.accumulate(signed)  # NaN (failed trials) carry the best so far forward
    best = best if direction == "maximize" else -best
    return pd.DataFrame({"trial": np.arange(1, len(df) + 1), "trial_id": df["trial_id"].to_numpy(),
                         "status": df["status"].to_numpy(), "value": value, "best": best,
                         "contended": contended,
                         "rel_ci": np.where(ok, float_column(df, f"{objective}_rel_ci"), np.nan),
                         "spent_s": np.cumsum(np.nan_to_num(float_column(df, "duration_s"))
                                              * _devices(df))})


def _devices(df: pd.DataFrame) -> Any:
    """Devices per trial: the ``hw.devices`` column where a whole number >= 1, else 1."""
    import numpy as np

    n = float_column(df, "hw.devices")
    return np.where(np.isfinite(n) & (n >= 1), np.floor(n), 1.0)


def plot_best_so_far(df: pd.DataFrame, objective: str = "throughput", direction: str = "maximize",
                     *, reference: float | None = None, reference_label: str = "default config",
                     unit: str | None = None, ax: matplotlib.axes.Axes | None = None,
                     spend: bool = True) -> matplotlib.figure.Figure:
    """Best-so-far curve of a campaign: each trial a dot with its 95% CI where one was stored,
    a trial flagged contended an open dot (not counted as best), failures on the x axis; with
    ``spend`` and a stored duration, the device time spent so far on a right-hand axis
    (:func:`best_so_far_data`'s ``spent_s``)."""
    import numpy as np

    data = best_so_far_data(df, objective, direction)
    fig, ax = figure_axes(ax)
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
    ax.set_ylabel(axis_label(objective, unit))
    ax.set_title("search progress")
    integer_x_ticks(ax, 1, max(len(data), 1))
    if spend and float(data["spent_s"].iloc[-1] if len(data) else 0.0) > 0:
        _plot_spend(ax, data)
    place_legend(ax)
    return fig


def _plot_spend(ax: Any, data: pd.DataFrame) -> None:
    """The device time spent so far, on a second y axis at the right (grey steps)."""
    total = float(data["spent_s"].iloc[-1])
    scale, label = ((3600.0, "device-hours") if total >= 7200 else
                    (60.0, "device-minutes") if total >= 120 else (1.0, "device-seconds"))
    right = ax.twinx()
    right.plot(data["trial"], data["spent_s"] / scale, drawstyle="steps-post", color="0.5",
               ls=":", lw=1.5)
    right.set_ylabel(f"spent, {label}", color="0.4")
    right.set_ylim(bottom=0)
    right.tick_params(axis="y", colors="0.4")
    ax.plot([], [], color="0.5", ls=":", lw=1.5, label=f"spent ({label}, right)")


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

    need_columns(repeats, ["config", "status", metric], "plot_repeats")
    ok = repeats[repeats["status"] == "ok"]
    groups = sorted(ok["config"].unique())
    data = [ok.loc[ok["config"] == g, metric].to_numpy(dtype=float) for g in groups]
    fig, ax = figure_axes(ax, (6, 3.2))
    if data:
        ax.boxplot(data, widths=0.5, showfliers=False)
    for i, values in enumerate(data, start=1):
        ax.scatter(np.full(len(values), i), values, s=14, color="C0", alpha=0.6, zorder=3)
    ax.set_xticks(range(1, len(groups) + 1),
                  [str(labels[g]) if labels is not None else str(g) for g in groups],
                  fontsize=8, rotation=12 if labels is not None else 0)
    ax.set_xlabel("configuration")
    ax.set_ylabel(axis_label(metric, unit))
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
    from ..surrogate.metrics import quartiles

    grouped = runs.groupby(["searcher", "trial"], sort=False)["regret"]
    out = grouped.agg(median="median", q25=lambda r: quartiles(r)[0],
                      q75=lambda r: quartiles(r)[2], seeds="count")
    return out.reset_index()


def plot_regret_curves(runs: pd.DataFrame, *, title: str = "regret of the best found",
                       ax: matplotlib.axes.Axes | None = None) -> matplotlib.figure.Figure:
    """Regret (% slower than the table's best) against trials: median line and interquartile
    band per searcher (:func:`regret_curves_data`)."""
    data = regret_curves_data(runs)
    fig, ax = figure_axes(ax)
    for i, (name, d) in enumerate(data.groupby("searcher", sort=False)):
        ax.plot(d["trial"], 100 * d["median"], color=f"C{i}", label=f"{name} (median)")
        ax.fill_between(d["trial"], 100 * d["q25"], 100 * d["q75"], color=f"C{i}", alpha=0.15,
                        lw=0)
    ax.set_xlabel("trials")
    ax.set_ylabel(PERCENT["regret"])
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    integer_x_ticks(ax, data["trial"].min(), data["trial"].max())
    place_legend(ax)
    return fig


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
    need_columns(df, [objective, second_objective], "pareto_data")
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
    fig, ax = figure_axes(ax, (5.5, 4))
    rest, front = data[~data["on_front"]], data[data["on_front"]]
    ax.scatter(rest[second_objective], rest[objective], s=14, color="0.65", label="trial")
    front = front.sort_values(second_objective)
    ax.plot(front[second_objective], front[objective], drawstyle="steps-post", color="C1", lw=1)
    ax.scatter(front[second_objective], front[objective], s=30, color="C1", zorder=3,
               label=f"Pareto front ({len(front)})")
    ax.set_xlabel(axis_label(second_objective, second_unit))
    ax.set_ylabel(axis_label(objective, unit))
    ax.set_title(title or f"{objective} against {second_objective}")
    place_legend(ax)
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
