"""What a trial costs is data: devices x wall time, a campaign's total, a budget in device-hours."""

from __future__ import annotations

import pytest

import cubicml_lab as cml
from cubicml_lab.errors import ConfigError
from cubicml_lab.store import Trial

TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32, "vocab": 128}
FAST = {"max_time_s": 0.3, "warmup_max_s": 0.5, "min_steps": 3}


def trial(hardware: dict, started: float | None = 100.0, ended: float | None = 130.0) -> Trial:
    return Trial(campaign="c", id=1, config={}, status="ok", metrics={}, hardware=hardware,
                 workload="gpt", workload_version="1", created_at=90.0, started_at=started,
                 ended_at=ended, error=None)


def test_a_trial_costs_its_devices_times_its_wall_time():
    assert trial({"devices": 8}).device_seconds == 240.0
    assert trial({}).devices == 1 and trial({}).device_seconds == 30.0
    assert trial({"devices": 8}, ended=None).device_seconds is None
    # a store's odd values never break a reader: one device
    for odd in ("8", True, -2, 0, 2.5, None, [8]):
        assert trial({"devices": odd}).devices == 1, odd


@pytest.fixture
def space():
    return cml.Space([cml.PowerOfTwo("micro_batch", 1, 8), cml.Choice("precision", ["fp32"]),
                      cml.Choice("recompute", ["none", "full"])])


def test_a_campaign_stops_on_its_device_hour_budget(space, tmp_store):
    camp = cml.Campaign("cost", space, workload="gpt", launcher=cml.launch.InProcess(),
                        searcher=cml.RandomSearch(space, seed=0), store=tmp_store,
                        measure_options=FAST, fixed=TINY)
    camp.run(budget=1, progress=False, verbose=False)
    first = camp.device_seconds()
    (t,) = camp.trials()
    assert t.devices == 1 and first == pytest.approx(t.duration_s) and first > 0
    # a cap of a little more than the first trial: the run stops at the trial that crosses it
    cap_s = 1.5 * first
    df = camp.run(budget_device_hours=cap_s / 3600, progress=False, verbose=False)
    costs = [t.device_seconds for t in camp.trials()]
    assert len(df) >= 2 and sum(costs[:-1]) < cap_s <= sum(costs), costs
    assert camp.stop_reason.startswith("device-hour budget reached"), camp.stop_reason
    summary = camp.summary()
    assert summary["device_s"] == pytest.approx(camp.device_seconds()) and \
        summary["device_s"] > 1.5 * first
    assert df["device_s"].sum() == pytest.approx(summary["device_s"])
    assert "spent" in camp._repr_html_()
    # the searcher learns each trial's price, and what the run may spend
    told = [h["values"].get("device_s") for h in camp.searcher.history]
    assert told == pytest.approx(costs), (told, costs)
    assert camp.searcher.budget_plan["device_s"] == pytest.approx(cap_s - first)
    # the count budget still holds alongside
    n = len(df)
    assert n < space.size()  # room for one more
    camp.run(budget=n + 1, budget_device_hours=1.0, progress=False, verbose=False)
    assert len(camp.trials()) == n + 1 and camp.stop_reason == "budget reached"
    assert camp.searcher.budget_plan["device_s"] == pytest.approx(3600.0 - sum(costs))
    camp.run(budget=n + 2, progress=False, verbose=False)
    assert camp.searcher.budget_plan == {"trials": 1, "n_told_at_start": n + 1}


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "2", True])
def test_a_bad_device_hour_budget_names_the_field(space, tmp_store, bad):
    camp = cml.Campaign("bad", space, workload="gpt", launcher=cml.launch.InProcess(),
                        store=tmp_store, measure_options=FAST, fixed=TINY)
    with pytest.raises(ConfigError, match="budget_device_hours"):
        camp.run(budget_device_hours=bad, progress=False, verbose=False)
    assert camp.trials() == []
