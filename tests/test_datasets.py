"""Tests for cubicml_lab.datasets: the shipped public tables and sweep Parquet files, no mocks."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import cubicml_lab as cml
from cubicml_lab import datasets
from cubicml_lab.errors import CubicMLError, DataError
from cubicml_lab.store import TrialStore

PUBLIC = Path(__file__).resolve().parents[1] / "data" / "public"
FILES = {"bigscience_tr11": "real_bigscience_tr11_a100.csv",
         "lucie7b_seq2k": "real_lucie7b_seq2k_a100.csv",
         "lucie7b_seq4k": "real_lucie7b_seq4k_a100.csv",
         "mpt_llmfoundry": "real_mpt_llmfoundry.csv"}
STATUS_COUNTS = {"bigscience_tr11": {"ok": 120, "oom": 6, "failed": 1},
                 "lucie7b_seq2k": {"ok": 52}, "lucie7b_seq4k": {"ok": 44},
                 "mpt_llmfoundry": {"ok": 216}}


@pytest.fixture(scope="module")
def public() -> dict[str, datasets.Dataset]:
    return {name: datasets.load(name) for name in FILES}


def test_names_lists_public_tables_then_sweeps():
    assert datasets.names() == [*FILES, "gpt_cpu_sweep", "dlrm_cpu_sweep", "gpt_h100_campaign",
                                "gpt_h200_campaign"]
    assert cml.datasets is datasets


def test_public_files_ship_with_their_sources():
    text = (PUBLIC / "SOURCES.md").read_text(encoding="utf-8")
    for name, file in FILES.items():
        assert (PUBLIC / file).is_file()
        assert f"`{file}`" in text


@pytest.mark.parametrize("name", list(FILES))
def test_public_table_loads_whole(public, name):
    ds = public[name]
    csv = pd.read_csv(PUBLIC / FILES[name])
    assert ds.name == name
    assert len(ds.table) == len(csv)
    assert ds.objective == "tokens_per_s_per_gpu"
    assert ds.knobs == ds.space.names
    assert list(ds.table.columns[:len(ds.knobs) + 2]) == [*ds.knobs, ds.objective, "status"]
    assert set(csv.columns) <= set(ds.table.columns)  # the source's columns are all kept
    assert ds.table["status"].value_counts().to_dict() == STATUS_COUNTS[name]
    assert not ds.table[ds.knobs].isna().any().any()
    assert ds.source and ds.notes
    commit = ds.source.split(" @ ")[1].split(",")[0]
    assert len(commit) == 40 and commit in (PUBLIC / "SOURCES.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", list(FILES))
def test_every_row_is_in_the_space(public, name):
    ds = public[name]
    configs = ds.configs()
    assert len(configs) == len(ds.table)
    assert all(ds.space.contains(c) for c in configs)
    for param in ds.space.parameters:  # at least two observed values: a knob varies
        assert len(param.values()) >= 2, param.name


@pytest.mark.parametrize("name", list(FILES))
def test_objective_positive_where_ok(public, name):
    ds = public[name]
    ok = ds.table[ds.table["status"] == "ok"][ds.objective]
    assert len(ok) and (ok > 0).all() and ok.map(math.isfinite).all()


def test_bloom_oom_and_no_result_rows(public):
    ds = public["bigscience_tr11"]
    csv = pd.read_csv(PUBLIC / FILES["bigscience_tr11"])
    t = ds.table
    assert (t["status"] == "oom").sum() == (csv["status"] == "oom").sum() == 6
    assert t.loc[t["status"] == "oom", ds.objective].isna().all()
    failed = t[t["status"] == "failed"]
    assert list(failed["source_status"]) == ["no_result"]
    assert failed[ds.objective].isna().all()
    assert len(ds.configs(status="oom")) == 6


def test_bloom_objective_is_derived_tokens_per_gpu(public):
    t = public["bigscience_tr11"].table
    ok = t[t["status"] == "ok"]
    expected = ok["tokens_per_s_derived"] / ok["n_gpus"]
    assert (ok["tokens_per_s_per_gpu"] - expected).abs().max() < 1e-9


def test_mpt_objective_and_model_order(public):
    ds = public["mpt_llmfoundry"]
    t = ds.table
    assert ((t["tokens_per_s_per_gpu"] - t["throughput_tok_s"] / t["n_gpus"]).abs() < 1e-9).all()
    assert (t["tokens_per_s_per_gpu"] - t["throughput_tok_s_per_gpu"]).abs().max() < 1.0
    assert ds.space["model"].values() == ["125m", "350m", "760m", "1b", "3b", "7b", "13b",
                                          "30b", "70b"]


def test_blank_knob_cells_get_the_placeholder(public):
    ds = public["bigscience_tr11"]
    csv = pd.read_csv(PUBLIC / FILES["bigscience_tr11"])
    for knob in ("n_layers", "n_heads"):
        blanks = int(csv[knob].isna().sum())
        assert blanks > 0
        assert (ds.table[knob] == datasets.UNKNOWN_NUMBER).sum() == blanks
        assert datasets.UNKNOWN_NUMBER in ds.space[knob].values()
        assert f"{knob} {blanks} -> -1" in ds.notes
        assert ds.table[knob].dtype == "int64"


def test_unknown_name_names_the_known_ones():
    with pytest.raises(DataError) as info:
        datasets.load("bloom")
    for name in datasets.names():
        assert name in str(info.value)
    assert isinstance(info.value, CubicMLError)


@pytest.mark.parametrize("name", ["gpt_cpu_sweep", "dlrm_cpu_sweep"])
def test_missing_sweep_parquet_says_how_to_make_it(tmp_path, monkeypatch, name):
    with pytest.raises(DataError) as info:
        datasets.load(name, data_dir=tmp_path)
    assert str(tmp_path / f"{name}.parquet") in info.value.message
    assert ".venv/bin/python benchmarks/collect_cpu_sweeps.py" in info.value.hint
    monkeypatch.setenv("CUBICML_LAB_DATA", str(tmp_path))  # the default data_dir follows it
    assert datasets.default_data_dir() == tmp_path
    with pytest.raises(DataError, match="collect_cpu_sweeps"):
        datasets.load(name)


@pytest.mark.parametrize(("name", "gpu"), [("gpt_h100_campaign", "NVIDIA H100 80GB HBM3"),
                                         ("gpt_h200_campaign", "NVIDIA H200")])
def test_gpu_campaigns_ship_and_say_how_they_were_measured(tmp_path, name, gpu):
    ds = datasets.load(name)
    assert ds.objective == "throughput" and set(ds.knobs) == {
        "micro_batch", "n_heads", "precision", "recompute", "fused_optimizer"}
    t = ds.table
    assert (t["hw.gpu_name"] == gpu).all() and (t["hw.device"] == "cuda").all()
    assert t["campaign"].nunique() == 2 and (t["status"] == "ok").all()
    assert "benchmarks/gpu_campaign.py" in ds.source and "CUDA events" in ds.notes
    assert "collect_cpu_sweeps" not in ds.notes  # the CPU sweeps' method is theirs
    # each campaign starts at the default (fp32) and finds bf16 several times faster
    first = t.groupby("campaign").head(1)
    assert (first["precision"] == "fp32").all()
    assert t["throughput"].max() > 4 * first["throughput"].max()
    with pytest.raises(DataError) as info:  # elsewhere, the hint says where it comes from
        datasets.load(name, data_dir=tmp_path)
    assert "gpu_campaign.py" in info.value.hint


def test_missing_public_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="real_mpt_llmfoundry.csv"):
        datasets.load("mpt_llmfoundry", data_dir=tmp_path)


def _record_sweep(store: TrialStore) -> None:
    """Five finished gpt trials: micro_batch, precision and fused_optimizer vary, d_model/lr not."""
    store.create_campaign("gpt-cpu-sweep", workload="gpt")
    store.create_campaign("gpt-cpu-sweep-repeats", workload="gpt")
    rows = [("gpt-cpu-sweep", 1, "fp32", True, "ok"), ("gpt-cpu-sweep", 2, "bf16", False, "ok"),
            ("gpt-cpu-sweep", 4, "fp32", True, "ok"), ("gpt-cpu-sweep", 32, "bf16", True, "oom"),
            ("gpt-cpu-sweep-repeats", 2, "bf16", False, "ok")]
    for campaign, mb, precision, fused, status in rows:
        config = {"d_model": 256, "micro_batch": mb, "precision": precision,
                  "fused_optimizer": fused, "lr": 3e-4}
        metrics = {"throughput": 1000.0 * mb, "step_time_s": 0.5 / mb} if status == "ok" else {}
        store.record_trial(campaign, config, status=status, metrics=metrics,
                           hardware={"device": "cpu", "cpu_count": 2}, workload="gpt",
                           workload_version="2")


def test_sweep_parquet_from_a_real_store(tmp_path):
    with TrialStore(tmp_path / "lab.sqlite") as store:
        _record_sweep(store)
        store.to_dataframe().to_parquet(tmp_path / "gpt_cpu_sweep.parquet", index=False)
    ds = datasets.load("gpt_cpu_sweep", data_dir=tmp_path)
    assert ds.knobs == ["micro_batch", "precision", "fused_optimizer"]
    assert ds.objective == "throughput"
    t = ds.table
    assert len(t) == 5
    assert t["status"].value_counts().to_dict() == {"ok": 4, "oom": 1}
    assert t.loc[t["status"] == "oom", "throughput"].isna().all()
    assert list(t.loc[t["status"] == "ok", "throughput"]) == [1000.0, 2000.0, 4000.0, 2000.0]
    assert ds.space["micro_batch"].values() == [1, 2, 4, 32]
    assert isinstance(ds.space["fused_optimizer"], cml.Bool)
    assert all(ds.space.contains(c) for c in ds.configs())
    assert {"d_model", "lr", "step_time_s", "hw.device", "campaign"} <= set(t.columns)
    assert "rows share their knob values" in ds.notes  # the repeat
    # the workload's cost model, the sweep's constant knobs (d_model) and defaults filled in
    from cubicml_lab.workloads import get
    from cubicml_lab.workloads.gpt import cost_terms

    defaults = get("gpt").default_config()
    config = ds.configs()[0]
    assert ds.cost_model(config) == cost_terms({**defaults, "d_model": 256, **config})
    assert ds.cost_model(config) != cost_terms({**defaults, **config})  # not the default 128
    assert datasets.load("bigscience_tr11").cost_model is None
    # and its shape features for the GP's kernel, the same constants filled in
    from cubicml_lab.workloads.gpt import shape_features

    assert ds.features(config) == shape_features({**defaults, "d_model": 256, **config})
    assert ds.features(config)[1] == 256 * ds.features(config)[0]
    assert datasets.load("mpt_llmfoundry").features is None


def test_mpt_cost_model_reproduces_the_sources_model_flops():
    ds = datasets.load("mpt_llmfoundry")
    t = ds.table
    source = t["model_tflops_per_gpu"] * 1e12 / t["throughput_tok_s_per_gpu"]  # FLOPs per token
    ours = [ds.cost_model(c)[0] / (4 / 3 if c["activation_checkpointing"] else 1)
            for c in ds.configs()]
    np.testing.assert_allclose(ours, source, rtol=0.01)  # the source rounds to 3 digits
    full, grad_op = ({**ds.configs()[0], "fsdp_sharding": s} for s in ("FULL_SHARD",
                                                                     "SHARD_GRAD_OP"))
    assert ds.cost_model(full)[1] == 1.5 * ds.cost_model(grad_op)[1]


@pytest.mark.parametrize("name", ["lucie7b_seq2k", "lucie7b_seq4k"])
def test_lucie_tables_cost_model_is_the_shared_physics(name):
    from cubicml_lab.physics import TERMS, table_physics

    ds = datasets.load(name)
    physics = table_physics(name)
    configs = ds.configs()
    assert list(ds.cost_model.term_names) == list(TERMS)
    for config in (configs[0], configs[-1]):
        assert ds.cost_model(config) == physics.cost_terms(config)


def test_lucie_cost_model_is_zero_where_a_parallelism_is_off():
    ds = datasets.load("lucie7b_seq4k")
    base = {**ds.configs()[0], "n_gpus": 32, "tp": 2, "pp": 2, "micro_batch": 1,
            "global_batch_seqs": 256, "activation_recompute": 0}
    terms = ds.cost_model(base)
    assert min(terms[k] for k in ("compute", "pipeline", "tp_comm", "dp_comm")) > 0
    assert ds.cost_model({**base, "pp": 1})["pipeline"] == 0
    assert ds.cost_model({**base, "tp": 1})["tp_comm"] == 0
    assert ds.cost_model({**base, "n_gpus": 4})["dp_comm"] == 0  # dp = 1: no gradient traffic
    assert ds.cost_model(base)["recompute"] == 0
    assert ds.cost_model({**base, "activation_recompute": 1})["recompute"] > 0


def test_sweep_parquet_in_raw_form_loads_the_same(tmp_path):
    (tmp_path / "tidy").mkdir()
    (tmp_path / "raw").mkdir()
    with TrialStore(tmp_path / "lab.sqlite") as store:
        _record_sweep(store)
        store.to_dataframe().to_parquet(tmp_path / "tidy" / "gpt_cpu_sweep.parquet", index=False)
        store.export(tmp_path / "raw" / "gpt_cpu_sweep.parquet")  # config etc. as JSON text
    assert pd.read_parquet(tmp_path / "raw" / "gpt_cpu_sweep.parquet")["config"].map(
        lambda v: isinstance(v, str)).all()
    tidy = datasets.load("gpt_cpu_sweep", data_dir=tmp_path / "tidy")
    raw = datasets.load("gpt_cpu_sweep", data_dir=tmp_path / "raw")
    assert raw.knobs == tidy.knobs == ["micro_batch", "precision", "fused_optimizer"]
    assert raw.configs() == tidy.configs()
    for column in ("status", "throughput"):
        assert raw.table[column].fillna(-1).tolist() == tidy.table[column].fillna(-1).tolist()
    assert {"d_model", "step_time_s", "hw.cpu_count"} <= set(raw.table.columns)
    assert "config" not in raw.table.columns


def test_sweep_of_another_workload_is_refused(tmp_path):
    with TrialStore(tmp_path / "lab.sqlite") as store:
        _record_sweep(store)
        store.to_dataframe().to_parquet(tmp_path / "dlrm_cpu_sweep.parquet", index=False)
    with pytest.raises(DataError, match="not only 'dlrm'"):
        datasets.load("dlrm_cpu_sweep", data_dir=tmp_path)


def test_import_loads_no_torch():
    code = "import sys, cubicml_lab.datasets; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
