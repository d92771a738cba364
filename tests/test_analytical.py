"""Tests for cubicml_lab.analytical: the analytical (modelled, not measured) LLM cluster table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cubicml_lab.analytical import GPUS, MODELS, llm_cluster_model
from cubicml_lab.errors import ConfigError
from cubicml_lab.search import RandomSearch, TableObjective

KNOBS = ["hidden", "tp", "pp", "virtual_stages", "micro_batch", "recompute", "zero_stage",
         "sequence_parallel"]


@pytest.fixture(scope="module")
def ds():
    return llm_cluster_model(n_gpus=64, model="13b", gpu="H100-80GB", seed=0)


@pytest.fixture(scope="module")
def bare():
    """The same model without noise, for monotonicity checks."""
    return llm_cluster_model(n_gpus=64, model="13b", noise=0.0)


def test_labelled_as_a_model(ds):
    assert ds.name == "llm_cluster_model"
    assert ds.source == "analytical model (not measured)"
    assert "NOT MEASURED" in ds.notes and "Korthikanti" in ds.notes and "Narayanan" in ds.notes
    assert ds.objective == "tokens_per_s_per_gpu" and ds.knobs == KNOBS


@pytest.mark.parametrize("n_gpus, model", [(64, "13b"), (256, "70b"), (64, "7b")])
def test_size_and_status_mix(n_gpus, model):
    table = llm_cluster_model(n_gpus=n_gpus, model=model).table
    counts = table["status"].value_counts()
    assert 3000 <= len(table) <= 30000
    assert set(counts.index) == {"ok", "oom"}
    assert counts["ok"] >= 1000 and 0.05 <= counts["oom"] / len(table) <= 0.8
    ok = table[table.status == "ok"]
    assert (ok["tokens_per_s_per_gpu"] > 0).all() and ok["step_time_s"].notna().all()
    assert ok["mfu"].between(0.01, 0.7).all()
    oom = table[table.status == "oom"]
    assert oom["tokens_per_s_per_gpu"].isna().all()
    assert (oom["peak_mem_gib"] > GPUS["H100-80GB"].memory_gib).all()
    assert (ok["peak_mem_gib"] <= GPUS["H100-80GB"].memory_gib).all()


def test_table_is_the_whole_space(ds):
    configs = ds.configs()
    assert len(configs) == ds.space.size() == len({ds.space.key(c) for c in configs})
    assert all(ds.space.contains(c) for c in configs)
    for i in (0, len(configs) // 2, len(configs) - 1):
        resolved = ds.space.resolve(configs[i])
        row = ds.table.iloc[i]
        assert (resolved["dp"], resolved["grad_accum"], resolved["n_layers"]) == \
            (row["dp"], row["grad_accum"], row["n_layers"])
        assert row["dp"] * row["tp"] * row["pp"] == 64
        assert row["dp"] * row["micro_batch"] * row["grad_accum"] == 1024


def _pairs(table: pd.DataFrame, knob: str, low, high) -> pd.DataFrame:
    """Rows that differ only in ``knob`` (``low`` vs ``high``), joined side by side."""
    others = [k for k in KNOBS if k != knob]
    a = table[table[knob] == low].set_index(others)
    b = table[table[knob] == high].set_index(others)
    return a.merge(b, left_index=True, right_index=True, suffixes=("_low", "_high"))


def test_full_recompute_is_slower_and_smaller(bare):
    pairs = _pairs(bare.table, "recompute", "none", "full")
    assert len(pairs) > 100
    assert (pairs["peak_mem_gib_high"] < pairs["peak_mem_gib_low"]).all()
    both = pairs[(pairs.status_low == "ok") & (pairs.status_high == "ok")]
    assert len(both) > 50
    assert (both["step_time_s_high"] > both["step_time_s_low"]).all()
    slowdown = both["step_time_s_high"] / both["step_time_s_low"]
    assert slowdown.median() == pytest.approx(1.25, abs=0.1)  # ~+33% compute, diluted by comm
    rescued = pairs[(pairs.status_low == "oom") & (pairs.status_high == "ok")]
    assert len(rescued) > 0  # recompute turns some out-of-memory configurations into ok ones


def test_selective_recompute_sits_between(bare):
    sel = _pairs(bare.table, "recompute", "none", "selective")
    both = sel[(sel.status_low == "ok") & (sel.status_high == "ok")]
    assert (sel["peak_mem_gib_high"] < sel["peak_mem_gib_low"]).all()
    assert (both["step_time_s_high"] / both["step_time_s_low"]).between(1.0, 1.1).all()


@pytest.mark.parametrize("low, high", [(0, 1), (1, 2), (2, 3)])
def test_higher_zero_stage_lowers_memory(bare, low, high):
    pairs = _pairs(bare.table, "zero_stage", low, high)
    assert len(pairs) > 20
    assert (pairs["peak_mem_gib_high"] < pairs["peak_mem_gib_low"]).all()


def test_sequence_parallel_and_micro_batch_memory(bare):
    sp = _pairs(bare.table, "sequence_parallel", False, True)
    assert len(sp) > 100 and (sp["peak_mem_gib_high"] < sp["peak_mem_gib_low"]).all()
    mb = _pairs(bare.table, "micro_batch", 1, 4)
    assert (mb["peak_mem_gib_high"] > mb["peak_mem_gib_low"]).all()


def test_interleaving_shrinks_the_bubble(bare):
    pairs = _pairs(bare.table, "virtual_stages", 1, 2)
    assert len(pairs) > 20
    assert np.allclose(pairs["bubble_fraction_high"], pairs["bubble_fraction_low"] / 2)


def test_deterministic_with_seed_and_noise_is_small(ds, bare):
    again = llm_cluster_model(n_gpus=64, model="13b", seed=0)
    pd.testing.assert_frame_equal(ds.table, again.table)
    other = llm_cluster_model(n_gpus=64, model="13b", seed=1)
    assert not np.allclose(other.table["step_time_s"].dropna(), ds.table["step_time_s"].dropna())
    pd.testing.assert_series_equal(other.table["peak_mem_gib"], ds.table["peak_mem_gib"])
    ratio = (ds.table["step_time_s"] / bare.table["step_time_s"]).dropna()
    assert 0.005 < ratio.std() < 0.03 and abs(ratio.median() - 1) < 0.01


def test_table_objective_replays_it(ds):
    obj = TableObjective.from_dataset(ds)
    assert len(obj) == len(ds.table) and obj.n_failed == int((ds.table.status == "oom").sum())
    oom = ds.configs(status="oom")[0]
    assert obj(oom).status == "oom" and obj(oom).values is None
    search = RandomSearch(obj.space, objective=obj.objective, candidates=obj.configs(), seed=0)
    for _ in range(20):
        [config] = search.ask()
        result = obj(config)
        search.tell(config, result.values, status=result.status)
    assert obj.best()[1] == ds.table[ds.objective].max()
    assert 0 <= obj.regret(search.best()[1]) < 1
    assert {"step_time_s", "peak_mem_gib", "mfu"} <= set(obj(obj.best()[0]).values)


def test_shapes_have_similar_parameter_counts():
    for shapes in MODELS.values():
        counts = [s.n_params for s in shapes]
        assert max(counts) / min(counts) < 1.06


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "1t"}, "model"), ({"gpu": "TPU"}, "gpu"), ({"n_gpus": 0}, "n_gpus"),
    ({"noise": -0.1}, "noise"), ({"seq_len": 2.5}, "seq_len"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match) as err:
        llm_cluster_model(**kwargs)
    assert err.value.hint
