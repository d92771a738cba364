"""Plots: data first (tested as numbers), figures drawn on the Agg backend."""

from __future__ import annotations

import math

import matplotlib
import pytest

matplotlib.use("Agg")
import pandas as pd  # noqa: E402

from cubicml_lab import errors as cml_errors  # noqa: E402
from cubicml_lab import plots  # noqa: E402


def frame():
    return pd.DataFrame({"trial_id": [3, 1, 2, 4], "status": ["ok", "ok", "oom", "ok"],
                         "throughput": [50.0, 20.0, None, 40.0]})


def test_best_so_far_data_orders_by_id_and_skips_failures():
    data = plots.best_so_far_data(frame())
    assert data["trial_id"].tolist() == [1, 2, 3, 4]
    assert data["best"].tolist() == [20.0, 20.0, 50.0, 50.0]
    assert math.isnan(data["value"].iloc[1])
    low = plots.best_so_far_data(frame(), direction="minimize")
    assert low["best"].tolist() == [20.0, 20.0, 20.0, 20.0]


def test_a_figure_without_an_interval_does_not_move_the_best_so_far_either():
    """As Campaign.best(): a figure whose CI is unknown (NaN or inf: one window, shown ±?) is
    drawn but is not the best so far while a figure with an interval exists."""
    df = frame().assign(throughput_rel_ci=[math.inf, 0.05, None, 0.01])
    assert plots.best_so_far_data(df)["best"].tolist() == [20.0, 20.0, 20.0, 40.0]
    alone = plots.best_so_far_data(df.assign(throughput_rel_ci=math.nan))
    assert alone["best"].tolist() == [20.0, 20.0, 50.0, 50.0]


def test_a_contended_figure_does_not_move_the_best_so_far_while_a_clean_one_exists():
    df = frame().assign(contended=[1.0, 0.0, None, 0.0],
                        throughput_rel_ci=[0.02, 0.05, None, 0.01])
    data = plots.best_so_far_data(df)
    assert data["best"].tolist() == [20.0, 20.0, 20.0, 40.0]  # trial 3's 50 was flagged
    assert data["contended"].tolist() == [False, False, True, False]
    assert data["rel_ci"].tolist()[0] == 0.05 and math.isnan(data["rel_ci"].iloc[1])
    everything_flagged = plots.best_so_far_data(df.assign(contended=[1.0, 1.0, None, 1.0]))
    assert everything_flagged["best"].tolist() == [20.0, 20.0, 50.0, 50.0]
    ax = plots.plot_best_so_far(df).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "contended (not trusted)" in labels and "95% CI" in labels
    assert "95% CI" not in [t.get_text() for t in
                            plots.plot_best_so_far(frame()).axes[0].get_legend().get_texts()]
    import matplotlib.pyplot as plt

    plt.close("all")


def test_campaign_figure_draws_both_panels(tmp_path):
    cv = {"measured": [20.0, 50.0, 40.0], "mean": [22.0, 45.0, 41.0], "lo": [15.0, 35.0, 30.0],
          "hi": [30.0, 60.0, 50.0], "kendall_tau": 1.0}
    fig = plots.campaign_figure(frame(), cv, reference=20.0, title="t")
    assert len(fig.axes) == 2
    left, right = fig.axes
    assert left.get_ylabel() == "throughput (units/s)"
    labelled = plots.campaign_figure(frame(), unit="tokens/s").axes[0]
    assert labelled.get_ylabel() == "throughput (tokens/s)"
    assert "Kendall tau = 1.00" in right.get_title()
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "oom / failed / timeout" in labels and "default config" in labels
    fig.savefig(tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000
    assert len(plots.campaign_figure(frame()).axes) == 1


def test_regret_curves_data_and_figure():
    runs = pd.DataFrame({"searcher": ["bo"] * 4 + ["random"] * 4, "seed": [0, 0, 1, 1] * 2,
                         "trial": [1, 2] * 4, "regret": [0.4, 0.0, 0.2, 0.1, 0.5, 0.5, 0.3, 0.3]})
    data = plots.regret_curves_data(runs)
    bo = data[data["searcher"] == "bo"]
    assert bo["median"].round(6).tolist() == [0.3, 0.05]
    assert (data["q25"] <= data["median"]).all() and (data["median"] <= data["q75"]).all()
    assert data["seeds"].tolist() == [2, 2, 2, 2]
    fig = plots.plot_regret_curves(runs)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["bo (median)",
                                                                    "random (median)"]
    assert ax.get_ylim()[0] == 0


def test_best_so_far_and_regret_count_whole_trials_and_regret_is_in_percent():
    ax = plots.plot_best_so_far(frame()).axes[0]
    assert list(ax.get_xticks()) == [1, 2, 3, 4]  # few trials: one tick each, whole numbers
    runs = pd.DataFrame({"searcher": ["bo"] * 6, "seed": [0, 0, 0, 1, 1, 1],
                         "trial": [1, 2, 3] * 2, "regret": [0.2, 0.1, 0.0, 0.4, 0.1, 0.05]})
    ax = plots.plot_regret_curves(runs).axes[0]
    assert "%" in ax.get_ylabel()
    assert all(float(t).is_integer() for t in ax.get_xticks())
    median = ax.get_lines()[0].get_ydata()
    assert [round(v, 9) for v in median] == [30.0, 10.0, 2.5]  # the fractions drawn as %
    assert ax.get_legend().get_frame().get_alpha() < 1  # translucent: data show through


def curve_rows():
    rows = []
    for name, base in (("GP", 0.3), ("MLP", 0.1)):
        for n in (10, 20, 50):
            for r in range(3):
                rows.append({"predictor": name, "n": n, "repeat": r,
                             "kendall_tau": base + n / 100 + r / 100, "regret": 0.1 - r / 100})
    return rows


def test_learning_curve_data_and_figure():
    data = plots.learning_curve_data(curve_rows())
    assert data["predictor"].tolist() == ["GP"] * 3 + ["MLP"] * 3
    assert data["n"].tolist() == [10, 20, 50] * 2
    assert data["median"].round(6).tolist()[:3] == [0.41, 0.51, 0.81]
    assert (data["q25"] <= data["median"]).all() and data["repeats"].eq(3).all()
    fig = plots.plot_learning_curve(pd.DataFrame(curve_rows()))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["GP", "MLP"]
    assert list(ax.get_xticks()) == [10, 20, 50]
    assert "Kendall tau" in ax.get_ylabel()
    ax = plots.plot_learning_curve(curve_rows(), "regret").axes[0]
    assert "%" in ax.get_ylabel() and max(ax.get_lines()[0].get_ydata()) > 1  # percent


def test_plots_name_the_missing_column():
    from cubicml_lab.errors import DataError

    with pytest.raises(DataError, match="top5_recall"):
        plots.learning_curve_data(curve_rows(), "top5_recall")
    with pytest.raises(DataError, match="peak_mem_gib"):
        plots.pareto_data(frame())
    with pytest.raises(DataError, match="'maximize' or 'minimize'"):
        plots.pareto_data(pareto_frame(), directions=("up", "down"))
    with pytest.raises(DataError, match="mean"):
        plots.plot_partial_dependence(pd.DataFrame({"knob": ["a"], "value": [1]}))
    with pytest.raises(DataError, match="p_runs"):
        plots.plot_feasibility_map(pd.DataFrame({"a": [1], "b": [2]}))


def pdp_frame(reference=False):
    rows = []
    for knob, values in (("micro_batch", [1, 2, 4, 1_000_000]), ("recompute", ["none", "full"]),
                         ("compile", [False, True])):
        for pos, v in enumerate(values):
            rows.append({"knob": knob, "position": pos, "value": v, "mean": 10.0 + pos,
                         "lo": 8.0 + pos, "hi": 12.0 + pos, "n": 5, "reference": pos == 0})
    df = pd.DataFrame(rows)
    return df if reference else df.drop(columns="reference")


def test_partial_dependence_figure_has_one_panel_per_knob():
    from matplotlib.collections import PolyCollection

    fig = plots.plot_partial_dependence(pdp_frame(), ncols=2, unit="samples/s", log_y=True)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["micro_batch", "recompute", "compile"]
    assert len(fig.axes) == 4 and not fig.axes[3].get_visible()
    assert [t.get_text() for t in shown[0].get_xticklabels()] == ["1", "2", "4", "1M"]
    assert any(isinstance(c, PolyCollection) for c in shown[0].collections)  # the band
    assert shown[0].get_ylabel() == "throughput (samples/s)" and shown[0].get_yscale() == "log"
    assert [t.get_text() for t in shown[1].get_xticklabels()] == ["none", "full"]
    slices = plots.plot_slices(pdp_frame(reference=True))
    stars = [ln for ln in slices.axes[0].get_lines() if ln.get_marker() == "*"]
    assert len(stars) == 1 and list(stars[0].get_xdata()) == [0]


def test_importance_bars_most_important_on_top():
    imp = pd.DataFrame({"importance": [0.1, 0.9, 0.4], "max_over_min": [1.2, 6.0, 2.2]},
                       index=["b", "a", "c"])
    ax = plots.plot_importance(imp).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "c", "a"]  # top = last
    assert [round(p.get_width(), 6) for p in ax.patches] == [0.1, 0.4, 0.9]
    assert "6x" in [t.get_text() for t in ax.texts]
    rel = pd.Series([2.0, 0.5], index=["x", "y"], name="relevance")
    ax = plots.plot_importance(rel, top=1).axes[0]
    assert len(ax.patches) == 1 and "lengthscale" in ax.get_xlabel()


def pareto_frame():
    return pd.DataFrame({"status": ["ok", "ok", "ok", "oom", "ok"],
                         "throughput": [10.0, 20.0, 15.0, None, 5.0],
                         "peak_mem_gib": [1.0, 3.0, 4.0, 9.0, 0.5]})


def test_pareto_data_and_figure():
    data = plots.pareto_data(pareto_frame())
    assert data["throughput"].tolist() == [20.0, 15.0, 10.0, 5.0]  # ok rows, best first
    assert data["on_front"].tolist() == [True, False, True, True]
    both_max = plots.pareto_data(pareto_frame(), directions=("maximize", "maximize"))
    assert both_max["on_front"].tolist() == [True, True, False, False]
    from_search = [{"config": {"a": 1}, "throughput": 20.0, "peak_mem_gib": 3.0},
                   {"config": {"a": 2}, "throughput": 10.0, "peak_mem_gib": 1.0}]
    assert plots.pareto_data(from_search)["on_front"].all()
    ax = plots.plot_pareto(pareto_frame(), unit="samples/s").axes[0]
    assert ax.get_xlabel() == "peak memory (GiB)" and ax.get_ylabel() == "throughput (samples/s)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["trial", "Pareto front (3)"]


def test_feasibility_map_heatmap_and_measured_points():
    grid = pd.DataFrame([{"rows": r, "tables": t, "p_runs": 1.0 / (1 + r * t / 1e6), "n": 4}
                         for r in (1000, 10_000, 1_000_000) for t in (4, 32)])
    measured = pd.DataFrame({"rows": [1000, 1_000_000, 1_000_000, 77], "tables": [4, 32, 32, 4],
                             "status": ["ok", "oom", "ok", "ok"]})
    fig = plots.plot_feasibility_map(grid, measured)
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    assert image.shape == (2, 3)  # y values x x values
    assert image[1, 2] == pytest.approx(1.0 / (1 + 32))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1k", "10k", "1M"]
    points = [len(c.get_offsets()) for c in ax.collections]
    assert points == [2, 1]  # ok, oom; the row outside the grid (77) is left out
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["measured: ok",
                                                                    "measured: oom / failed"]
    assert fig.axes[1].get_ylabel() == "P(runs)"
    assert len(plots.plot_feasibility_map(grid).axes[0].collections) == 0


def _markers_under_legend(ax) -> int:
    """Scatter markers that the legend's box covers, even in part (display pixels)."""
    import numpy as np

    ax.figure.canvas.draw()
    box = ax.get_legend().get_window_extent().padded(3)  # a marker's radius
    xy = np.concatenate([c.get_offset_transform().transform(c.get_offsets())
                         for c in ax.collections if len(c.get_offsets())])
    return int(((xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0)
                & (xy[:, 1] <= box.y1)).sum())


@pytest.mark.parametrize("points", [
    # a campaign seen in the browser: the front's lightest point sat under matplotlib's "best"
    [(17276, 0.516), (15835, 0.324), (12703, 0.327), (12808, 0.337), (11496, 0.395),
     (3556, 0.384)],
    # data in every corner and the middle: no place inside the axes is free
    [(y, x) for y in (1, 5.5, 10) for x in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)],
])
def test_legends_never_hide_a_marker(points):
    df = pd.DataFrame({"throughput": [p[0] for p in points],
                       "peak_mem_gib": [p[1] for p in points], "status": "ok"})
    ax = plots.plot_pareto(df).axes[0]
    assert _markers_under_legend(ax) == 0
    best = plots.plot_best_so_far(df.assign(trial_id=range(len(df))), reference=4000).axes[0]
    assert _markers_under_legend(best) == 0


def test_repeats_one_box_per_configuration_and_failures_left_out():
    repeats = pd.DataFrame({"config": [0, 1, 0, 1, 0, 1], "status": ["ok", "ok", "ok", "oom",
                                                                     "ok", "ok"],
                            "tokens_per_s": [10.0, 20.0, 11.0, None, 12.0, 22.0]})
    ax = plots.plot_repeats(repeats, "tokens_per_s", labels=["mb 4", "mb 16"],
                            unit="tokens/s").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["mb 4", "mb 16"]
    dots = sorted(y for c in ax.collections for _, y in c.get_offsets())
    assert dots == [10.0, 11.0, 12.0, 20.0, 22.0]  # the oom run is not drawn
    assert ax.get_title() == "2-3 ok fresh-process repeats per configuration"
    assert ax.get_ylabel() == "tokens_per_s (tokens/s)"
    with pytest.raises(cml_errors.DataError, match="config"):
        plots.plot_repeats(repeats.drop(columns="config"), "tokens_per_s")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_campaign_of_few_trials_gets_a_whole_number_trial_axis(n):
    df = pd.DataFrame({"trial_id": list(range(1, n + 1)), "status": ["ok"] * n,
                       "throughput": [100.0 + i for i in range(n)]})
    ax = plots.plot_best_so_far(df).axes[0]
    ax.figure.canvas.draw()
    assert ax.get_xlim() == (0.5, n + 0.5)  # not 0.945-1.055 for one trial
    assert [t for t in ax.get_xticks() if 0.5 <= t <= n + 0.5] == list(range(1, n + 1))
    many = pd.DataFrame({"trial_id": range(1, 31), "status": ["ok"] * 30,
                         "throughput": [float(i) for i in range(30)]})
    lo, hi = plots.plot_best_so_far(many).axes[0].get_xlim()
    assert lo < 1 and 30 < hi < 33  # matplotlib's own margins where there are many


def test_regret_curves_of_one_trial_get_a_whole_number_axis():
    runs = pd.DataFrame({"searcher": ["a", "a"], "seed": [0, 1], "trial": [1, 1],
                         "regret": [0.2, 0.1]})
    ax = plots.plot_regret_curves(runs).axes[0]
    assert ax.get_xlim() == (0.5, 1.5)
