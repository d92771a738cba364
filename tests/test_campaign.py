"""End-to-end: real campaigns of real GPT training trials on the CPU, stored in SQLite."""

from __future__ import annotations

import pytest

import cubicml_lab as cml
from cubicml_lab.errors import ConfigError, StoreError

TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32, "vocab": 128}
FAST = {"max_time_s": 0.3, "warmup_max_s": 0.5, "min_steps": 3}


@pytest.fixture
def gpt_space():
    return cml.Space([cml.PowerOfTwo("micro_batch", 1, 8), cml.Choice("precision", ["fp32", "bf16"]),
                      cml.Choice("recompute", ["none", "full"])])


def make(name, space, store, launcher=None, seed=0, searcher=None):
    searcher = searcher or cml.BayesianSearch(space, seed=seed)
    return cml.Campaign(name, space, workload="gpt", launcher=launcher or cml.launch.InProcess(),
                        searcher=searcher, store=store, measure_options=FAST, fixed=TINY)


@pytest.mark.slow
def test_real_six_trial_campaign_end_to_end(gpt_space, tmp_path):
    """Six real trials, each in a fresh subprocess, BO after the initial design, all stored."""
    path = tmp_path / "lab.sqlite"
    store = cml.TrialStore(path)
    camp = make("e2e", gpt_space, store, launcher=cml.launch.Subprocess(timeout_s=120))
    df = camp.run(budget=6, progress=False)
    assert len(df) == 6 and set(df["status"]) == {"ok"}
    keys = [gpt_space.key({n: r[n] for n in gpt_space.names}) for _, r in df.iterrows()]
    assert len(set(keys)) == 6, "a configuration was measured twice"
    assert (df["tokens_per_s"] > 0).all() and (df["step_time_s"] > 0).all()
    assert (df["d_model"] == 32).all(), "fixed knobs must reach the workload and the record"
    assert df["hw.hostname"].notna().all()
    # tokens/s is consistent with the measured step time and the tokens per step
    tokens = df["micro_batch"] * 32
    assert ((df["tokens_per_s"] * df["step_time_s"] / tokens - 1).abs() < 1e-6).all()
    best_cfg, best_value = camp.best()
    assert best_value == df["throughput"].max()
    store.close()
    # the file on disk holds the same, for a fresh reader
    with cml.TrialStore(path) as again:
        assert len(again.trials("e2e")) == 6


@pytest.mark.slow
def test_resume_continues_without_repeating(gpt_space, tmp_store):
    first = make("resume", gpt_space, tmp_store)
    first.run(budget=3, progress=False, verbose=False)
    # an interrupted run leaves a trial 'running': a new process resumes and runs it again
    orphan = tmp_store.add_trial("resume", {**TINY, "micro_batch": 8, "precision": "fp32",
                                            "recompute": "none"}, workload="gpt")
    tmp_store.mark_running(orphan)
    second = make("resume", gpt_space, tmp_store)
    df = second.run(budget=6, progress=False, verbose=False)
    assert len(df) == 6
    assert tmp_store.get_trial(orphan).status == "ok"
    keys = [gpt_space.key({n: r[n] for n in gpt_space.names}) for _, r in df.iterrows()]
    assert len(set(keys)) == 6
    assert second.run(budget=6, progress=False, verbose=False).shape[0] == 6  # nothing more to do


@pytest.mark.slow
def test_failures_are_data_and_never_reproposed(gpt_space, tmp_store):
    """A trial that times out is stored as 'timeout', told to the searcher, and the campaign goes on."""
    space = cml.Space([cml.Ordinal("d_model", [32, 1024]), cml.PowerOfTwo("micro_batch", 1, 2)])
    launcher = cml.launch.Subprocess(timeout_s=8)
    camp = cml.Campaign("fail", space, workload="gpt", launcher=launcher,
                        searcher=cml.RandomSearch(space, seed=0), store=tmp_store,
                        measure_options={"max_time_s": 0.3, "warmup_max_s": 0.5, "min_steps": 3},
                        fixed={"n_layers": 8, "seq_len": 512, "vocab": 128, "n_heads": 2})
    df = camp.run(budget=4, progress=False, verbose=False)
    status = dict(zip(df["d_model"].astype(str) + "/" + df["micro_batch"].astype(str), df["status"]))
    assert status["1024/2"] == "timeout", status
    assert status["32/1"] == "ok", status
    assert len(df) == 4 and camp.stop_reason == "budget reached"
    assert "timeout" in df.loc[df["status"] == "timeout", "error"].iloc[0]


def test_campaign_checks_knobs_and_space(tmp_store):
    space = cml.Space([cml.Int("micro_bach", 1, 4)])
    with pytest.raises(ConfigError, match="micro_bach"):
        cml.Campaign("bad", space, workload="gpt", store=tmp_store)
    space = cml.Space([cml.Choice("precision", ["fp32", "fp8"])])
    with pytest.raises(ConfigError, match="precision"):
        cml.Campaign("bad", space, workload="gpt", store=tmp_store)
    ok_space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 4)])
    cml.Campaign("c", ok_space, workload="gpt", store=tmp_store, launcher=cml.launch.InProcess())
    other = cml.Space([cml.PowerOfTwo("micro_batch", 1, 8)])
    with pytest.raises(StoreError, match="another space"):
        cml.Campaign("c", other, workload="gpt", store=tmp_store, launcher=cml.launch.InProcess())
    with pytest.raises(ConfigError, match="budget"):
        cml.Campaign("c", ok_space, workload="gpt", store=tmp_store,
                     launcher=cml.launch.InProcess()).run(budget=0)


@pytest.mark.slow
def test_exhausted_space_stops_with_reason(tmp_store):
    space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 2)])
    camp = cml.Campaign("small", space, workload="gpt", launcher=cml.launch.InProcess(),
                        searcher=cml.RandomSearch(space, seed=0), store=tmp_store,
                        measure_options=FAST, fixed=TINY)
    df = camp.run(budget=5, progress=False, verbose=False)
    assert len(df) == 2
    assert "exhausted" in camp.stop_reason
