"""The one style of :mod:`cubicml_lab.plots`: axis labels and units, where a legend goes, whole
trial numbers on the x axis, short tick labels, and the check that a frame has the columns a
figure reads.

Fractions (regret, MAPE, coverage, recall) are stored as fractions (0.05 = 5 %) and drawn in
percent; :data:`PERCENT` names their axes. Nothing here imports matplotlib at import time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import DataError

if TYPE_CHECKING:
    import matplotlib.axes
    import matplotlib.figure
    import numpy as np
    import pandas as pd

__all__ = ["METRICS", "PERCENT", "axis_label", "figure_axes", "float_column", "hides_data",
           "integer_x_ticks", "need_columns", "place_legend", "tick_label"]


_LABELS = {"throughput": "throughput (units/s)", "tokens_per_s": "tokens/s",
           "samples_per_s": "samples/s", "step_time_s": "step time (s)",
           "peak_mem_gib": "peak memory (GiB)", "mfu": "MFU (0-1)"}


def axis_label(objective: str, unit: str | None = None) -> str:
    if unit is not None:
        return f"{objective} ({unit})"
    return _LABELS.get(objective, objective)


#: Metrics stored as fractions (0.05 = 5 %) and drawn in percent.
PERCENT = {"regret": "regret (% below the best)", "mape": "MAPE (%)",
            "coverage95": "95% interval coverage (%)", "top5_recall": "top-5% recall (%)"}
METRICS = {"kendall_tau": "Kendall tau", "spearman": "Spearman rho", **PERCENT}


def figure_axes(ax: matplotlib.axes.Axes | None, size: tuple[float, float] = (5, 4)
          ) -> tuple[matplotlib.figure.Figure, matplotlib.axes.Axes]:
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=size)
        return fig, ax
    return ax.figure, ax


def place_legend(ax: matplotlib.axes.Axes, where: str = "best") -> None:
    """The one legend style: inside the axes on a translucent frame, where matplotlib finds it
    hides least or else in a corner, as long as it hides no data point or line; otherwise below
    the axes (always there with ``where="below"``)."""
    if where != "below":
        for loc in ("best", "lower right", "upper right", "lower left", "upper left"):
            legend = ax.legend(loc=loc, fontsize=8, framealpha=0.8)
            if not hides_data(ax, legend):
                return
            legend.remove()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8,
              frameon=False)


def hides_data(ax: matplotlib.axes.Axes, legend: Any, pad_px: float = 3.0) -> bool:
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


def integer_x_ticks(ax: matplotlib.axes.Axes, first: float | None = None,
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


def need_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"{what} needs column(s) {missing}; got {list(df.columns)[:12]}",
                        hint=f"pass the output of the function {what} documents")


def float_column(df: pd.DataFrame, name: str) -> np.ndarray:
    """``df[name]`` as floats, all NaN when the column is missing."""
    import numpy as np
    import pandas as pd

    if name not in df:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)


def tick_label(value: Any) -> str:
    """A short tick label: 1000000 -> 1M, 32768 -> 32768, 0.001 -> 0.001, True -> True."""
    value = value.item() if hasattr(value, "item") and not isinstance(value, str) else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if abs(value) >= size and value % size == 0:
            return f"{value // size:g}{suffix}"
    return f"{value:g}"
