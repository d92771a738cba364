"""Stopping a losing trial early: the timing rule, the runner's threshold, the campaign and the
search (a censored observation, never the best)."""

from __future__ import annotations

import math
import time

import pytest

import cubicml_lab as cml
from cubicml_lab.errors import MeasurementError
from cubicml_lab.launch.runner import EARLY_STOP_MARGIN, losing_step_s
from cubicml_lab.timing import MeasureOptions, time_steps
from cubicml_lab.trials import figure_flag

TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32, "vocab": 128}
# a full trial times windows for 2 s (its CI target is out of reach); one stopped early, far less
LONG = {"max_time_s": 2.0, "window_min_s": 0.02, "target_rel_ci": 0.0005, "min_steps": 3,
        "warmup_max_s": 0.5, "guard": False}


def test_timing_stops_once_the_step_is_surely_slower_than_it_may_be():
    slow = time_steps(lambda: time.sleep(0.004),
                      options=MeasureOptions(max_time_s=2.0, window_min_s=0.01,
                                             target_rel_ci=0.0005, losing_step_s=0.002))
    assert slow.stop_reason == "losing" and slow.windows >= 6, slow.stop_reason
    assert slow.median_step_time_s * (1 - slow.rel_ci) > 0.002 and slow.elapsed_s < 1.0
    fast = time_steps(lambda: time.sleep(0.004),
                      options=MeasureOptions(max_time_s=0.4, window_min_s=0.01,
                                             target_rel_ci=0.0005, losing_step_s=0.02))
    assert fast.stop_reason != "losing"


def test_the_threshold_follows_the_objective_and_ignores_what_it_cannot_read():
    assert losing_step_s({"objective": "tokens_per_s", "value": 1000.0}, 500, "tokens") == \
        pytest.approx(0.5 / (1 - EARLY_STOP_MARGIN))
    for beat in (None, {}, {"objective": "throughput", "value": "fast"},
                 {"objective": "throughput", "value": math.inf},
                 {"objective": "throughput", "value": -1.0},
                 {"objective": "throughput", "value": True},
                 {"objective": "throughput", "value": 10.0, "direction": "minimize"}):
        assert losing_step_s(beat, 500, "tokens") is None, beat
    with pytest.raises(MeasurementError, match="losing_step_s"):
        MeasureOptions(losing_step_s=0.0)


def test_a_campaign_stops_a_trial_that_cannot_win(tmp_store):
    space = cml.Space([cml.Choice("micro_batch", [16, 1])])
    search = cml.BayesianSearch(space, seed=0)
    search.enqueue({"micro_batch": 16})  # the fast one first: the slow one then cannot win
    search.enqueue({"micro_batch": 1})
    camp = cml.Campaign("es", space, workload="gpt", launcher=cml.launch.InProcess(),
                        searcher=search, store=tmp_store, measure_options=LONG, fixed=TINY)
    table = camp.run(budget=2, early_stop=True, progress=False, verbose=False)
    fast, slow = camp.trials()
    assert fast.config["micro_batch"] == 16 and "stopped_early" not in fast.metrics
    assert slow.status == "ok" and slow.metrics["stopped_early"] == 1.0, slow.metrics
    assert slow.metrics["throughput"] < fast.metrics["throughput"] * (1 - EARLY_STOP_MARGIN)
    assert slow.metrics["windows"] < fast.metrics["windows"], (slow.metrics, fast.metrics)
    # what it is, everywhere: never the best, flagged in the table, a bound to the search
    assert figure_flag(slow.metrics) == "stopped early"
    assert camp.best()[0] == {"micro_batch": 16} and search.best()[0] == {"micro_batch": 16}
    assert table["stopped_early"].tolist() == [False, True]
    assert search._observed(search._history[1]) > slow.metrics["throughput"]
    # without early_stop, nothing is stopped
    camp2 = cml.Campaign("full", space, workload="gpt", launcher=cml.launch.InProcess(),
                         searcher=cml.BayesianSearch(space, seed=0), store=tmp_store,
                         measure_options={**LONG, "max_time_s": 0.5}, fixed=TINY)
    camp2.searcher.enqueue({"micro_batch": 16})
    camp2.searcher.enqueue({"micro_batch": 1})
    camp2.run(budget=2, progress=False, verbose=False)
    assert not any("stopped_early" in t.metrics for t in camp2.trials())
