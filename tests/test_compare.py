"""Tests for cubicml_lab.search.compare: replaying several searchers and seeds, and the summary."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cubicml_lab import datasets
from cubicml_lab.errors import SearchError
from cubicml_lab.search import (RandomSearch, TableObjective, compare_searchers, searcher_factory,
                                summarize_searches)


@pytest.fixture(scope="module")
def lucie() -> datasets.Dataset:
    return datasets.load("lucie7b_seq2k")


@pytest.fixture
def obj(lucie) -> TableObjective:
    return TableObjective.from_dataset(lucie)


def _random(obj: TableObjective):
    return lambda seed: RandomSearch(obj.space, objective=obj.objective,
                                     candidates=obj.configs(), seed=seed)


def test_stacks_every_searcher_and_seed_as_the_loop_would(obj):
    guided = searcher_factory(obj, "PredictorGuidedSearch", n_init=3)
    runs = compare_searchers(obj, {"random": "RandomSearch", "guided": guided,
                                   "bo": "BayesianSearch"}, budget=5, seeds=[3, 1],
                             progress=False)
    assert list(runs.columns[:3]) == ["searcher", "seed", "trial"]
    assert set(obj.knobs) <= set(runs.columns)
    keys = runs[["searcher", "seed"]].drop_duplicates().values.tolist()
    assert keys == [["random", 3], ["random", 1], ["guided", 3], ["guided", 1], ["bo", 3],
                    ["bo", 1]]
    assert (runs.groupby(["searcher", "seed"])["trial"].apply(list)
            == [[1, 2, 3, 4, 5]] * 6).all()
    assert np.allclose(runs["regret_pct"], 100 * runs["regret"])
    best = obj.best()[1]
    assert np.allclose(runs["regret"], (best - runs["best"]) / best)
    # the same replay as building the searcher by hand
    searcher = guided(1)
    by_hand = obj.replay(searcher, 5)
    assert searcher.last_ask_info["phase"] == "guided"  # past its 3 initial draws
    got = runs[(runs.searcher == "guided") & (runs.seed == 1)].reset_index(drop=True)
    pd.testing.assert_frame_equal(got[by_hand.columns].drop(columns="elapsed_s"),
                                  by_hand.drop(columns="elapsed_s"))


def test_worker_processes_give_the_same_replays(obj):
    searchers = {"random": _random(obj), "guided": searcher_factory(
        obj, "PredictorGuidedSearch", n_init=3)}  # a lambda travels to forked workers
    one = compare_searchers(obj, searchers, budget=4, seeds=2, progress=False)
    two = compare_searchers(obj, searchers, budget=4, seeds=2, progress=False, workers=2)
    pd.testing.assert_frame_equal(one.drop(columns="elapsed_s"), two.drop(columns="elapsed_s"))


def test_random_reduce_replays_do_not_depend_on_what_ran_before():
    df = pd.DataFrame({"tp": [1, 1, 1, 2, 2, 4], "throughput": [100.0, 50.0, math.nan,
                                                                 80.0, 90.0, 60.0],
                       "status": ["ok", "ok", "oom", "ok", "ok", "ok"]})
    obj = TableObjective(df, reduce="random", seed=2)
    alone = compare_searchers(obj, {"b": _random(obj)}, budget=3, seeds=[4], progress=False)
    after = compare_searchers(obj, {"a": _random(obj), "b": _random(obj)}, budget=3,
                              seeds=[4], progress=False)
    cols = ["trial", "status", "value", "best"]
    pd.testing.assert_frame_equal(after[after.searcher == "b"][cols].reset_index(drop=True),
                                  alone[cols])


def test_summary_matches_the_replays(obj):
    runs = compare_searchers(obj, ["RandomSearch"], budget=12, seeds=3, progress=False)
    s = summarize_searches(runs, within_pct=(5, 1), after=(4, 10, 50))
    row = s.loc["RandomSearch"]
    assert row["seeds"] == 3 and row["trials"] == 12
    assert "regret_pct_at_50" not in s.columns  # past every replay's length
    at4 = [g["regret_pct"].iloc[3] for _, g in runs.groupby("seed")]
    assert row["regret_pct_at_4"] == pytest.approx(np.median(at4))
    assert row["regret_pct_at_10_q25"] <= row["regret_pct_at_10"] <= row["regret_pct_at_10_q75"]
    for p in (5, 1):
        firsts = [next((t for t, r in zip(g["trial"], g["regret_pct"]) if r <= p), 13)
                  for _, g in runs.groupby("seed")]
        assert row[f"to_{p}pct"] == pytest.approx(np.median(firsts))
        assert row[f"to_{p}pct_reached"] == sum(f <= 12 for f in firsts)
    assert row["search_s"] >= 0
    base = float(obj.table[obj.objective].median())
    with_base = summarize_searches(runs, baseline=base).loc["RandomSearch"]
    found = [g["best"].max() for _, g in runs.groupby("seed")]
    assert with_base["speedup_x"] == pytest.approx(np.median(np.array(found) / base))
    assert with_base["best_found"] == pytest.approx(np.median(found))


def test_summary_of_a_hand_made_table():
    runs = pd.DataFrame({"searcher": ["x"] * 6, "seed": [0, 0, 0, 1, 1, 1],
                         "trial": [1, 2, 3] * 2, "regret_pct": [9.0, 4.0, 0.5, 20.0, 8.0, 6.0]})
    row = summarize_searches(runs, within_pct=(5, 0.5), after=(2,)).loc["x"]
    assert row["to_5pct"] == 3.0  # seeds: 2 and never (3 trials + 1 = 4) -> median 3
    assert row["to_5pct_reached"] == 1 and row["to_0.5pct_reached"] == 1
    assert row["regret_pct_at_2"] == 6.0


@pytest.mark.parametrize("kwargs, match", [
    ({"searchers": "RandomSearch"}, "must be a list of names or a mapping"),
    ({"searchers": []}, "searchers is empty"),
    ({"searchers": ["RandomSearch", "RandomSearch"]}, "more than once"),
    ({"searchers": ["Hyperband"]}, "not a known searcher"),
    ({"searchers": {"x": 3}}, "neither a known name nor"),
    ({"searchers": {"x": RandomSearch}}, "neither a known name nor"),
    ({"budget": 0}, "budget = 0 is outside 1\\.\\."),
    ({"seeds": 0}, "seeds = 0 is outside 1\\.\\."),
    ({"seeds": []}, "non-empty list"),
    ({"seeds": [1, 1]}, "repeats a seed"),
    ({"seeds": [-1]}, "are not ints in 0\\.\\.2\\*\\*63 - 1"),
    ({"seeds": "3"}, "positive int or a non-empty list"),
    ({"batch": 1.5}, "batch = 1.5 must be an int from 1"),
    ({"workers": 0}, "workers = 0 is outside 1\\.\\."),
])
def test_bad_arguments_name_the_field_and_the_fix(obj, kwargs, match):
    args = {"searchers": ["RandomSearch"], "budget": 3, "seeds": 1, **kwargs}
    with pytest.raises(SearchError, match=match) as err:
        compare_searchers(obj, args.pop("searchers"), args.pop("budget"), args.pop("seeds"),
                          progress=False, **args)
    assert err.value.hint


def test_bad_objective_and_factories(obj, lucie):
    with pytest.raises(SearchError, match="must be a TableObjective") as err:
        compare_searchers(lucie, ["RandomSearch"], 3, 1, progress=False)
    assert "from_dataset" in err.value.hint

    def broken(seed):
        raise RuntimeError("no GPU here")

    with pytest.raises(SearchError, match="'b'.*failed for seed 0.*no GPU here"):
        compare_searchers(obj, {"b": broken}, 3, 1, progress=False)
    with pytest.raises(SearchError, match="'b'.*failed for seed") as err:
        compare_searchers(obj, {"b": broken}, 3, 2, progress=False, workers=2)
    assert "searcher_factory" in err.value.hint
    with pytest.raises(SearchError, match="has no ask/tell"):
        compare_searchers(obj, {"s": lambda seed: "searcher"}, 3, 1, progress=False)
    with pytest.raises(SearchError, match="not a known searcher"):
        searcher_factory(obj, "bo")
    with pytest.raises(SearchError, match="must be a TableObjective"):
        searcher_factory(lucie, "RandomSearch")


@pytest.mark.parametrize("kwargs, match", [
    ({"runs": pd.DataFrame({"searcher": ["a"]})}, r"lacks column\(s\)"),
    ({"runs": [1, 2]}, "must be a DataFrame"),
    ({"within_pct": (100,)}, r"percentage in \[0, 100\)"),
    ({"after": (0,)}, "after = 0 is outside 1\\.\\."),
    ({"baseline": -1.0}, "positive finite number"),
])
def test_summary_errors(kwargs, match):
    runs = pd.DataFrame({"searcher": ["a", "a"], "seed": [0, 0], "trial": [1, 2],
                         "regret_pct": [3.0, 0.0], "best": [1.0, 2.0]})
    args = {"runs": runs, **kwargs}
    with pytest.raises(SearchError, match=match):
        summarize_searches(args.pop("runs"), **args)
