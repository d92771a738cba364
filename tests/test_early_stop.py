"""Stopping a losing trial early: the timing rule, the runner's threshold, the campaign and the
search (a censored observation, never the best), and a user's command stopped on its reports."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

import cubicml_lab as cml
from cubicml_lab.errors import MeasurementError
from cubicml_lab.launch import InProcess
from cubicml_lab.timing.policy import EARLY_STOP_MARGIN, losing_step_s
from cubicml_lab.timing import MeasureOptions, time_steps
from cubicml_lab.trials import figure_flag
from cubicml_lab.workloads import Command

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
    assert camp._spec({"micro_batch": 1})["beat"]["margin"] == EARLY_STOP_MARGIN  # the CPU's
    # without early_stop, nothing is stopped
    camp2 = cml.Campaign("full", space, workload="gpt", launcher=cml.launch.InProcess(),
                         searcher=cml.BayesianSearch(space, seed=0), store=tmp_store,
                         measure_options={**LONG, "max_time_s": 0.5}, fixed=TINY)
    camp2.searcher.enqueue({"micro_batch": 16})
    camp2.searcher.enqueue({"micro_batch": 1})
    camp2.run(budget=2, progress=False, verbose=False)
    assert not any("stopped_early" in t.metrics for t in camp2.trials())


# -- a user's command (tests/jobs/toy_job.py: a step of 0.02 s, 4 samples) ----------------------
TOY = str(Path(__file__).resolve().parent / "jobs" / "toy_job.py")
# with no beat the job runs its 2 s of timed steps (its CI target is out of reach)
STEADY = {"max_time_s": 2.0, "target_rel_ci": 1e-9, "min_steps": 5}
# a log of identical figures meets any CI target at min_steps: a high one leaves room for 6 windows
STEADY_LOG = {**STEADY, "min_steps": 60}
STEP_ONLY = r"elapsed time per iteration \(ms\):\s*(?P<step_time_ms>[\d.]+)"  # no units per step


def command_trial(beat=None, mode="steps", measure=STEADY, **kw):
    job = Command(f"toy-{mode}", argv=[sys.executable, TOY, mode],
                  **{"units": "samples", "env": {"TOY_STEP_S": "0.02"}, **kw})
    spec = {"workload": job.name, "config": {}, "command": job.to_spec(), "measure": measure}
    return InProcess().run(spec if beat is None else {**spec, "beat": beat})


@pytest.fixture(scope="module")
def unbeaten():
    res = command_trial()
    assert res.status == "ok" and res.hardware["job"]["ended"] == "max_time_s", res.error
    return res


@pytest.mark.parametrize("beat", [
    {"objective": "step_time_s", "value": 0.005, "direction": "minimize"},
    {"objective": "throughput", "value": 2000.0, "direction": "maximize"},  # samples/s
    {"objective": "samples_per_s", "value": 2000.0},
])
def test_a_command_job_that_cannot_win_is_stopped_as_losing(unbeaten, beat):
    res = command_trial(beat)
    m, job = res.metrics, res.hardware["job"]
    assert res.status == "ok" and job["ended"] == "losing", (res.error, job["ended"])
    assert m["stopped_early"] == 1.0 and figure_flag(m) == "stopped early"
    assert m["windows"] >= 6 and 0.015 < m["step_time_s"] < 0.05
    full = unbeaten.metrics
    assert m["steps_timed"] < full["steps_timed"] / 2, (m["steps_timed"], full["steps_timed"])
    assert m["job_wall_s"] < full["job_wall_s"] - 0.8, (m["job_wall_s"], full["job_wall_s"])


def test_a_command_job_that_can_win_runs_to_its_normal_stop(unbeaten):
    res = command_trial({"objective": "throughput", "value": 20.0, "direction": "maximize"})
    assert res.status == "ok" and res.hardware["job"]["ended"] == "max_time_s", res.error
    assert "stopped_early" not in res.metrics and "stopped_early" not in unbeaten.metrics
    assert res.metrics["steps_timed"] > unbeaten.metrics["steps_timed"] / 2


@pytest.mark.parametrize("objective, value, stopped", [
    ("step_time_s", 0.005, True),  # a step time is judged without units per step
    ("throughput", 1e6, False),  # a rate is not: unknown samples per step
])
def test_a_job_reporting_only_step_times_is_judged_on_a_step_time_only(objective, value,
                                                                        stopped):
    direction = "minimize" if objective == "step_time_s" else "maximize"
    res = command_trial({"objective": objective, "value": value, "direction": direction},
                        mode="megatron", metrics=[STEP_ONLY], measure=STEADY_LOG)
    assert res.status == "ok", res.error
    # no samples per step: its throughput is in steps/s, 50 of them, far below the beat's 1e6
    assert "samples_per_s" not in res.metrics and res.metrics["steps_per_s"] == 50.0
    assert (res.hardware["job"]["ended"] == "losing") is stopped, res.hardware["job"]["ended"]
    assert res.metrics.get("stopped_early") == (1.0 if stopped else None)


@pytest.mark.parametrize("value, stopped", [(2048 / 0.02 * 10, True), (2048 / 0.02 / 10, False)])
def test_a_log_of_rates_is_judged_per_token(value, stopped):
    res = command_trial({"objective": "tokens_per_s", "value": value}, mode="titan",
                        metrics=["torchtitan"], units="tokens", measure=STEADY_LOG)
    assert res.status == "ok", res.error
    assert (res.hardware["job"]["ended"] == "losing") is stopped, res.hardware["job"]["ended"]
    assert res.metrics.get("stopped_early") == (1.0 if stopped else None)


def test_a_trial_one_process_stopped_early_runs_in_no_further_process():
    spec = {"workload": "gpt", "config": {**TINY, "micro_batch": 1}, "measure": LONG,
            "beat": {"objective": "throughput", "value": 1e12}}  # nothing can beat it
    res = cml.launch.Repeated(cml.launch.Subprocess(), processes=2).run(spec)
    assert res.status == "ok" and res.metrics["stopped_early"] == 1.0, res.metrics
    assert res.hardware["processes_skipped"] == 1 and len(res.hardware["processes"]) == 1
