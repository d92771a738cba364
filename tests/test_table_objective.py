"""Tests for cubicml_lab.search.table: replaying searches against measured tables (fast)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import cubicml_lab as cml
from cubicml_lab import datasets
from cubicml_lab.errors import SearchError
from cubicml_lab.search import RandomSearch, TableObjective, TableResult


@pytest.fixture(scope="module")
def lucie() -> datasets.Dataset:
    return datasets.load("lucie7b_seq2k")


@pytest.fixture(scope="module")
def bloom() -> datasets.Dataset:
    return datasets.load("bigscience_tr11")


def _repeats() -> pd.DataFrame:
    """Configuration tp=1 measured three times (ok, ok, oom), tp=2 twice (oom, ok), tp=4 once."""
    return pd.DataFrame({
        "tp": [1, 1, 2, 1, 2, 4],
        "recompute": ["none"] * 6,
        "throughput": [100.0, 120.0, math.nan, math.nan, 90.0, 50.0],
        "step_time_s": [1.0, 0.8, math.nan, math.nan, 1.2, 2.0],
        "status": ["ok", "ok", "oom", "oom", "ok", "ok"],
    })


def test_exported_from_the_package():
    assert cml.TableObjective is TableObjective
    assert "TableObjective" in cml.__all__


@pytest.mark.parametrize("name", ["lucie7b_seq2k", "bigscience_tr11"])
def test_round_trip_every_row(request, name):
    ds = request.getfixturevalue("lucie" if name.startswith("lucie") else "bloom")
    obj = TableObjective.from_dataset(ds)
    first: dict[str, int] = {}
    for i, config in enumerate(ds.configs()):
        first.setdefault(ds.space.key(config), i)
    assert len(obj) == len(obj.configs()) == len(first)
    assert obj.n_ok + obj.n_failed == len(first)
    assert all(ds.space.contains(c) for c in obj.configs())
    for key, i in first.items():
        config = ds.configs()[i]
        row = ds.table.iloc[i]
        result = obj(config)
        assert isinstance(result, TableResult)
        assert result.status == row["status"]
        assert result.config == ds.space.project(config)
        if row["status"] == "ok":
            assert result.values[ds.objective] == pytest.approx(row[ds.objective])
            assert all(isinstance(v, float) and math.isfinite(v) for v in result.values.values())
            assert not set(result.values) & set(ds.knobs)
        else:
            assert result.values is None


def test_oom_row_answers_oom(bloom):
    obj = TableObjective.from_dataset(bloom)
    answered = [obj(c).status for c in bloom.configs(status="oom")]
    assert "oom" in answered
    oom = next(c for c in bloom.configs(status="oom") if obj(c).status == "oom")
    assert obj(oom).values is None


def test_keys_ignore_order_and_int_vs_float(lucie):
    obj = TableObjective.from_dataset(lucie)
    config = lucie.configs()[0]
    shuffled = {k: float(v) if isinstance(v, int) else v for k, v in reversed(config.items())}
    assert obj(shuffled).values == obj(config).values


def test_random_search_replay_of_20_asks(bloom):
    obj = TableObjective.from_dataset(bloom)
    search = RandomSearch(obj.space, objective=obj.objective, candidates=obj.configs(), seed=0)
    for _ in range(20):
        [config] = search.ask()
        result = obj(config)
        search.tell(config, result.values, status=result.status)
    assert search.n_told == obj.n_calls == 20
    best_config, best_value = obj.best()
    assert obj.regret(best_value) == 0.0
    assert 0.0 <= obj.regret(search.best()[1]) <= 1.0
    assert obj(best_config).values[obj.objective] == best_value
    ok = bloom.table[bloom.table.status == "ok"]
    assert best_value <= ok[bloom.objective].max()


def test_unknown_config_names_it_and_the_fix(lucie):
    obj = TableObjective.from_dataset(lucie)
    measured = {obj.space.key(c) for c in obj.configs()}
    missing = next(c for c in obj.space.sample(500, seed=0) if obj.space.key(c) not in measured)
    with pytest.raises(SearchError) as err:
        obj(missing)
    assert str(missing["n_gpus"]) in err.value.message and "never measured" in err.value.message
    assert "candidates=obj.configs()" in err.value.hint
    with pytest.raises(SearchError, match="not a configuration"):
        obj({**lucie.configs()[0], "tp": 3})
    with pytest.raises(ValueError):  # SearchError is a ValueError
        obj({"nope": 1})


def test_reduce_first_median_random():
    df = _repeats()
    first = TableObjective(df, reduce="first")
    assert first({"tp": 1, "recompute": "none"}).values == {"throughput": 100.0,
                                                            "step_time_s": 1.0}
    assert first({"tp": 2, "recompute": "none"}).status == "oom"
    assert first.best() == ({"tp": 1, "recompute": "none"}, 100.0)
    assert (first.n_ok, first.n_failed) == (2, 1)

    median = TableObjective(df, reduce="median")
    assert median({"tp": 1, "recompute": "none"}).values == {"throughput": 110.0,
                                                             "step_time_s": 0.9}
    assert median({"tp": 2, "recompute": "none"}).status == "oom"  # tie: the first seen
    assert median.best() == ({"tp": 1, "recompute": "none"}, 110.0)
    assert median.best("minimize") == ({"tp": 4, "recompute": "none"}, 50.0)

    def draws(obj: TableObjective, config: dict, n: int = 30) -> list:
        out = []
        for _ in range(n):
            r = obj(config)
            out.append(r.values["throughput"] if r.status == "ok" else r.status)
        return out

    tp1 = {"tp": 1, "recompute": "none"}
    a, b = TableObjective(df, reduce="random", seed=3), TableObjective(df, reduce="random", seed=3)
    b({"tp": 4, "recompute": "none"})  # other calls in between do not change tp=1's draws
    seq = draws(a, tp1)
    assert seq == draws(b, tp1)
    assert set(seq) == {100.0, 120.0, "oom"}
    assert draws(TableObjective(df, reduce="random", seed=4), tp1) != seq
    assert a.best() == median.best()  # the reference of a random replay is the median
    assert draws(a, {"tp": 4, "recompute": "none"}, 3) == [50.0] * 3


def test_regret_both_directions():
    obj = TableObjective(pd.DataFrame({"mb": [1, 2, 4], "throughput": [50.0, 200.0, 100.0],
                                       "status": ["ok"] * 3}))
    assert obj.regret(150.0) == pytest.approx(0.25)
    assert obj.regret(200) == 0.0
    assert obj.regret(100.0, direction="minimize") == pytest.approx(1.0)
    with pytest.raises(SearchError, match="finite"):
        obj.regret(None)
    with pytest.raises(SearchError, match="direction"):
        obj.best("up")


def test_default_knobs_space_and_metrics():
    df = pd.DataFrame({"tp": np.array([1, 2], dtype=np.int64), "compile": [True, False],
                       "opt": ["adam", "sgd"], "throughput": [1.0, 2.0],
                       "peak_mem_gib": [3.0, 4.0], "status": ["ok", "ok"]})
    obj = TableObjective(df)
    assert obj.knobs == ["tp", "compile", "opt"]  # float columns are metrics
    assert obj.space.names == ["tp", "compile", "opt"]
    assert obj({"tp": 2, "compile": False, "opt": "sgd"}).values == {"throughput": 2.0,
                                                                     "peak_mem_gib": 4.0}
    explicit = TableObjective(df, knobs=["tp"], metrics=["peak_mem_gib"])
    assert explicit({"tp": 1}).values == {"throughput": 1.0, "peak_mem_gib": 3.0}


def test_status_col_none_uses_the_objective():
    df = pd.DataFrame({"mb": [1, 2], "throughput": [5.0, math.nan]})
    obj = TableObjective(df, status_col=None)
    assert obj({"mb": 2}).status == "failed" and obj({"mb": 1}).status == "ok"


def test_caller_space_must_hold_every_row():
    space = cml.Space([cml.PowerOfTwo("mb", 1, 4)], constraints=["mb <= 2"])
    df = pd.DataFrame({"mb": [1, 4], "throughput": [1.0, 2.0], "status": ["ok", "ok"]})
    with pytest.raises(SearchError, match="row 1"):
        TableObjective(df, space=space)
    obj = TableObjective(df.iloc[:1], space=space)
    assert obj.space is space and obj.knobs == ["mb"]


@pytest.mark.parametrize("kwargs, df, match", [
    ({"objective": "tokens_per_s"}, None, "no objective column 'tokens_per_s'"),
    ({"status_col": "state"}, None, "no status column 'state'"),
    ({}, pd.DataFrame({"mb": [], "throughput": [], "status": []}), "empty"),
    ({}, pd.DataFrame({"mb": [1], "throughput": [1.0], "status": ["crashed"]}), "crashed"),
    ({}, pd.DataFrame({"mb": [1], "throughput": [math.nan], "status": ["ok"]}), "no finite"),
    ({"knobs": ["mb", "nope"]}, None, "not in the table"),
    ({"reduce": "mean"}, None, "reduce"),
    ({"metrics": ["nope"]}, None, "metrics"),
])
def test_bad_tables_raise_search_error_with_a_hint(kwargs, df, match):
    if df is None:
        df = pd.DataFrame({"mb": [1, 2], "throughput": [1.0, 2.0], "status": ["ok", "oom"]})
    with pytest.raises(SearchError, match=match) as err:
        TableObjective(df, **kwargs)
    assert err.value.hint
    with pytest.raises(SearchError, match="DataFrame"):
        TableObjective([{"mb": 1}])


def test_blank_knob_cells_are_refused():
    df = pd.DataFrame({"opt": ["a", None], "throughput": [1.0, 2.0], "status": ["ok", "ok"]})
    with pytest.raises(SearchError, match="blank") as err:
        TableObjective(df)
    assert "placeholder" in err.value.hint


def test_replay_costs_a_trial_per_oom_and_tracks_regret(bloom):
    obj = TableObjective.from_dataset(bloom)
    s = RandomSearch(obj.space, objective=obj.objective, candidates=obj.configs(), seed=3)
    df = obj.replay(s, budget=len(obj) + 10, batch=4)
    assert len(df) == len(obj)  # the table ran out: every configuration once
    assert df["trial"].tolist() == list(range(1, len(obj) + 1))
    assert (df["status"] != "ok").sum() == obj.n_failed
    assert df["regret"].iloc[-1] == 0.0 and df["regret"].is_monotonic_decreasing
    ok = df[df["status"] == "ok"]
    assert (ok["best"].cummax() == ok["best"]).all() and df.loc[df["status"] != "ok",
                                                               "value"].isna().all()
    with pytest.raises(SearchError, match=r"budget = 0 is outside 1\.\."):
        obj.replay(s, budget=0)
    assert np.allclose(df["regret_pct"], 100 * df["regret"])
    assert (df["elapsed_s"] >= 0).all() and df["elapsed_s"].is_monotonic_increasing


def test_reset_restarts_the_random_draws():
    obj = TableObjective(_repeats(), reduce="random", seed=5)
    first = [obj({"tp": 1, "recompute": "none"}).status for _ in range(12)]
    obj.reset()
    assert obj.n_calls == 0
    assert [obj({"tp": 1, "recompute": "none"}).status for _ in range(12)] == first


@pytest.mark.slow
@pytest.mark.parametrize("table", ["dlrm_cpu_sweep", "gpt_cpu_sweep"])
def test_bayesian_search_with_the_sweeps_cost_model_replays_a_table(table):
    from cubicml_lab.search import BayesianSearch

    ds = datasets.load(table)  # gpt's also has shape features
    obj = TableObjective.from_dataset(ds)
    search = BayesianSearch(obj.space, objective=obj.objective, candidates=obj.configs(),
                            seed=0, n_init=6, cost_model=ds.cost_model, features=ds.features)
    for _ in range(9):
        [config] = search.ask()
        result = obj(config)
        search.tell(config, result.values, status=result.status)
    assert search.last_ask_info["phase"] == "bo", search.last_ask_info["reason"]
    assert search.predictor.cost_model is ds.cost_model
    assert search.predictor.features is ds.features
    assert search.n_told == 9 and len({obj.space.key(h["config"]) for h in search.history}) == 9
    with pytest.raises(SearchError, match="second_objective"):
        BayesianSearch(obj.space, features=ds.cost_model, second_objective="peak_mem_gib")
    with pytest.raises(SearchError, match="not callable"):
        BayesianSearch(obj.space, cost_model="flops")
