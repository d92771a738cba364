"""Cost-aware choice: the search weighs a candidate's predicted price (told device-seconds)
against its expected improvement where prices differ, cooled over its budget, and changes
nothing where they do not."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cubicml_lab as cml
from cubicml_lab.errors import ConfigError, SearchError
from cubicml_lab.search.cost import (COST_MATTERS, cooling, cost_log_weights,
                                     cost_observations)

SPACE = cml.Space([cml.Int("micro_batch", 1, 64), cml.Int("gpus", 1, 16)])


def per_gpu_speed(c: dict) -> float:
    """Per-device throughput: peaks at micro-batch 16, whatever the device count."""
    return 100.0 * (1.0 - (math.log2(c["micro_batch"]) - 4.0) ** 2 / 40.0)


def run(cost_aware: bool, price, trials: int = 14, seed: int = 0, **kw) -> cml.BayesianSearch:
    s = cml.BayesianSearch(SPACE, seed=seed, n_init=4, cost_aware=cost_aware, **kw)
    s.plan_budget(trials=40)
    for _ in range(trials):
        [c] = s.ask()
        s.tell(c, {"throughput": per_gpu_speed(c), "device_s": price(c)})
    return s


def bo_gpus(s: cml.BayesianSearch) -> list[int]:
    return [h["config"]["gpus"] for h in s.history[4:]]


def test_where_prices_differ_the_search_buys_the_same_answer_cheaper():
    def price(c):  # every device held for the same minutes
        return 60.0 * c["gpus"]
    priced, blind = run(True, price), run(False, price)
    assert "price weighed" in priced.last_ask_info["price"]
    assert 0 < priced.last_ask_info["alpha"] < 1
    assert len(priced.last_ask_info["price_weight_of_picks"]) == 1
    assert np.mean(bo_gpus(priced)) < 0.6 * np.mean(bo_gpus(blind)), (bo_gpus(priced),
                                                                      bo_gpus(blind))
    spent = [sum(h["values"]["device_s"] for h in s.history) for s in (priced, blind)]
    assert spent[0] < 0.75 * spent[1], spent
    # what it finds is as good: the objective does not depend on the device count
    assert priced.best()[1] >= 0.97 * blind.best()[1]
    assert "price" not in blind.last_ask_info
    assert "price weighed" in priced.propose()[0].reason


def test_the_initial_design_covers_the_space_per_device_second_once_prices_are_known():
    gpus = {}
    for cost_aware in (True, False):
        s = cml.BayesianSearch(SPACE, seed=0, n_init=12, cost_aware=cost_aware)
        for _ in range(12):
            [c] = s.ask()
            assert s.last_ask_info["phase"] == "initial"
            s.tell(c, {"throughput": per_gpu_speed(c), "device_s": 60.0 * c["gpus"]})
        gpus[cost_aware] = [h["config"]["gpus"] for h in s.history]
    # the same first four (no price known yet), then cheaper ones
    assert gpus[True][:4] == gpus[False][:4]
    assert np.mean(gpus[True][4:]) < 0.5 * np.mean(gpus[False][4:]), gpus


def test_where_prices_hardly_differ_it_chooses_as_without_them():
    def price(c):  # within x1.2 of each other
        return 100.0 + 20.0 * (c["gpus"] - 1) / 15
    priced, blind = run(True, price, trials=9), run(False, price, trials=9)
    assert "not weighed" in priced.last_ask_info["price"]
    assert [h["config"] for h in priced.history] == [h["config"] for h in blind.history]


def test_the_price_weight_cools_to_nothing_as_the_budget_is_spent():
    assert cooling({"trials": 10, "n_told_at_start": 5}, n_told=5, spent_s=0) == 1.0
    assert cooling({"trials": 10, "n_told_at_start": 5}, n_told=15, spent_s=0) == 0.0
    assert cooling({"device_s": 100.0, "spent_at_start": 50.0}, 3, 100.0) == 0.5
    assert cooling(None, 0, 0.0) == 1.0 and cooling(None, 500, 0.0) == 0.0
    w, note = cost_log_weights(np.log([1.0, 10.0, 100.0]), alpha=0.0)
    assert not w.any() and "budget spent" in note
    w, note = cost_log_weights(np.log([1.0, 10.0, 100.0]), alpha=0.5)
    assert w[0] > 0 > w[2] and w[1] == 0.0 and "alpha 0.50" in note
    w, note = cost_log_weights(np.log([1.0, COST_MATTERS * 0.9]), alpha=1.0)
    assert not w.any() and "not weighed" in note
    # a search told a budget it has spent weighs nothing
    s = run(True, lambda c: 60.0 * c["gpus"], trials=8)
    s.plan_budget(trials=1)
    [c] = s.ask()
    s.tell(c, {"throughput": per_gpu_speed(c), "device_s": 60.0 * c["gpus"]})
    s.ask()
    assert s.last_ask_info["alpha"] == 0.0 and "budget spent" in s.last_ask_info["price"]


def test_the_price_model_learns_from_full_ok_trials_only():
    history = [{"config": {"a": 1}, "status": "ok", "values": {"device_s": 10.0}},
               {"config": {"a": 2}, "status": "oom", "values": {"device_s": 1.0}},
               {"config": {"a": 3}, "status": "ok",
                "values": {"device_s": 2.0, "stopped_early": 1.0}},
               {"config": {"a": 4}, "status": "ok", "values": {}},
               {"config": {"a": 5}, "status": "ok", "values": {"device_s": math.inf}}]
    configs, costs = cost_observations(history)
    assert configs == [{"a": 1}] and costs.tolist() == [10.0]


@pytest.mark.parametrize("bad", [0, -5.0, math.inf, "1", True])
def test_a_bad_budget_names_the_field(bad):
    s = cml.BayesianSearch(SPACE, seed=0)
    with pytest.raises(SearchError, match="device_s"):
        s.plan_budget(device_s=bad)
    with pytest.raises(SearchError, match="trials"):
        s.plan_budget(trials=0)
    assert s.budget_plan is None


def test_the_early_stop_margin_is_the_devices_or_the_users():
    from cubicml_lab.campaign.checks import check_early_stop

    assert check_early_stop(True, "cuda:0") == 0.03 and check_early_stop(True, "cpu") == 0.10
    assert check_early_stop(0.05, "cpu") == 0.05 and check_early_stop(False, "cuda") is None
    for bad in (0, 0.5, -0.1, "yes", None):
        with pytest.raises(ConfigError, match="early_stop"):
            check_early_stop(bad, "cpu")


def test_a_priced_replay_tells_each_trial_its_price_and_adds_up_the_spend():
    obj = cml.TableObjective.from_dataset(cml.datasets.load("mpt_llmfoundry"))

    def price(config, result):
        return config["n_gpus"] * (180.0 if result.status == "ok" else 60.0)
    s = cml.RandomSearch(obj.space, objective=obj.objective, candidates=obj.configs(), seed=0)
    df = obj.replay(s, budget=12, price=price)
    want = [price(h["config"], obj(h["config"])) for h in s.history]
    assert df["device_s"].tolist() == want
    assert df["spent_s"].tolist() == pytest.approx(np.cumsum(want).tolist())
    assert [h["values"]["device_s"] for h in s.history] == want
    assert "device_s" not in obj.replay(cml.RandomSearch(obj.space, objective=obj.objective,
                                                         candidates=obj.configs()), 2)
    for bad in (lambda c, r: -1.0, lambda c, r: math.nan, lambda c, r: "60", 3.0):
        with pytest.raises(SearchError, match="price"):
            obj.replay(cml.RandomSearch(obj.space, objective=obj.objective,
                                        candidates=obj.configs()), 2, price=bad)
