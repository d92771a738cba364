"""Plots: data first (tested as numbers), figures drawn on the Agg backend."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402

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


def test_campaign_figure_draws_both_panels(tmp_path):
    cv = {"measured": [20.0, 50.0, 40.0], "mean": [22.0, 45.0, 41.0], "lo": [15.0, 35.0, 30.0],
          "hi": [30.0, 60.0, 50.0], "kendall_tau": 1.0}
    fig = plots.campaign_figure(frame(), cv, reference=20.0, title="t")
    assert len(fig.axes) == 2
    left, right = fig.axes
    assert left.get_ylabel() == "throughput (units/s)"
    assert plots.campaign_figure(frame(), unit="tokens/s").axes[0].get_ylabel() == "throughput (tokens/s)"
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
