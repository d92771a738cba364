"""Matplotlib figures of campaigns and predictors, computed as data first, then drawn.

Each ``*_data`` function returns a pandas DataFrame that a notebook can show or test; each
``plot_*`` function draws it on an Axes (a new Figure when none is given) and returns the Figure.
Nothing here changes the store or the model: plots only read the API below them.

Example:
    >>> import pandas as pd
    >>> df = pd.DataFrame({"trial_id": [1, 2, 3], "status": ["ok", "oom", "ok"],
    ...                    "throughput": [10.0, None, 30.0]})
    >>> best_so_far_data(df)["best"].tolist()
    [10.0, 10.0, 30.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import matplotlib.axes
    import matplotlib.figure
    import pandas as pd

__all__ = ["best_so_far_data", "campaign_figure", "plot_best_so_far", "plot_parity",
           "plot_regret_curves", "regret_curves_data"]

_LABELS = {"throughput": "throughput (units/s)", "tokens_per_s": "tokens/s",
           "samples_per_s": "samples/s", "step_time_s": "step time (s)",
           "peak_mem_gib": "peak memory (GiB)", "mfu": "MFU (0-1)"}


def _label(objective: str, unit: str | None = None) -> str:
    if unit is not None:
        return f"{objective} ({unit})"
    return _LABELS.get(objective, objective)


def _axes(ax: matplotlib.axes.Axes | None) -> tuple[matplotlib.figure.Figure, matplotlib.axes.Axes]:
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(5, 4))
        return fig, ax
    return ax.figure, ax


def best_so_far_data(df: pd.DataFrame, objective: str = "throughput",
                     direction: str = "maximize") -> pd.DataFrame:
    """Per trial in id order: its value (NaN unless ok) and the best ok value so far.

    Args:
        df: A campaign's trials (``store.to_dataframe(name)``).
        objective: Metric column to follow.
        direction: ``"maximize"`` or ``"minimize"``.

    Returns:
        DataFrame with columns trial (1-based position), trial_id, status, value, best.
    """
    import numpy as np
    import pandas as pd

    df = df.sort_values("trial_id")
    ok = df["status"].eq("ok").to_numpy()
    raw = df[objective].to_numpy(dtype=float) if objective in df else np.full(len(df), np.nan)
    value = np.where(ok, raw, np.nan)
    signed = value if direction == "maximize" else -value
    best = np.fmax.accumulate(signed)  # NaN (failed trials) carry the best so far forward
    best = best if direction == "maximize" else -best
    return pd.DataFrame({"trial": np.arange(1, len(df) + 1), "trial_id": df["trial_id"].to_numpy(),
                         "status": df["status"].to_numpy(), "value": value, "best": best})


def plot_best_so_far(df: pd.DataFrame, objective: str = "throughput", direction: str = "maximize",
                     *, reference: float | None = None, reference_label: str = "default config",
                     unit: str | None = None, ax: matplotlib.axes.Axes | None = None
                     ) -> matplotlib.figure.Figure:
    """Best-so-far curve of a campaign, each trial as a dot, failures marked on the x axis."""
    data = best_so_far_data(df, objective, direction)
    fig, ax = _axes(ax)
    ok = data["status"] == "ok"
    ax.plot(data["trial"], data["best"], drawstyle="steps-post", color="C0", label="best so far")
    ax.scatter(data.loc[ok, "trial"], data.loc[ok, "value"], s=18, color="C0", alpha=0.6,
               label="trial")
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
    ax.legend(loc="lower right", fontsize=8)
    return fig


def regret_curves_data(runs: pd.DataFrame) -> pd.DataFrame:
    """Median and quartiles of the regret after each trial, per searcher, over seeds.

    Args:
        runs: Replays stacked: columns ``searcher``, ``seed``, ``trial`` and ``regret`` (e.g.
            :meth:`~cubicml_lab.search.TableObjective.replay` outputs with the first two added).

    Returns:
        DataFrame with columns searcher, trial, median, q25, q75, seeds.

    Example:
        >>> import pandas as pd
        >>> runs = pd.DataFrame({"searcher": ["a"] * 4, "seed": [0, 0, 1, 1],
        ...                      "trial": [1, 2, 1, 2], "regret": [0.5, 0.1, 0.3, 0.0]})
        >>> regret_curves_data(runs)["median"].tolist()
        [0.4, 0.05]
    """
    grouped = runs.groupby(["searcher", "trial"], sort=False)["regret"]
    out = grouped.agg(median="median", q25=lambda r: r.quantile(0.25),
                      q75=lambda r: r.quantile(0.75), seeds="count")
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
    ax.set_ylabel("regret (% below the best)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


def plot_parity(measured: Sequence[float], predicted: Sequence[float],
                lo: Sequence[float] | None = None, hi: Sequence[float] | None = None, *,
                objective: str = "throughput", title: str | None = None, unit: str | None = None,
                ax: matplotlib.axes.Axes | None = None) -> matplotlib.figure.Figure:
    """Predicted against measured values with optional interval bars and the y = x line."""
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
    span = [float(np.nanmin(both)) * 0.9, float(np.nanmax(both)) * 1.1]
    ax.plot(span, span, color="0.4", lw=1, ls="--", label="y = x")
    ax.set_xlabel(f"measured {_label(objective, unit)}")
    ax.set_ylabel(f"predicted {_label(objective, unit)}")
    ax.set_title(title or "predictor, out-of-fold")
    ax.legend(loc="upper left", fontsize=8)
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
