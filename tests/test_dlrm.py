"""Tests for the ``dlrm`` workload on one CPU process: the real model, real optimizer steps.

The multi-process shardings (replicated DDP, table-wise all-to-all) are in test_distributed.py.
"""

from __future__ import annotations

import math

import pytest

from cubicml_lab.errors import ConfigError
from cubicml_lab.launch.runner import run_trial
from cubicml_lab.workloads import get
from cubicml_lab.workloads.dlrm import flops_per_step, mlp_widths

TINY = {"num_tables": 3, "rows": 50, "emb_dim": 8, "pooling": 4, "dense_features": 5,
        "bottom_width": 16, "top_width": 16, "batch_size": 32, "lr": 0.05}


def losses(config: dict, steps: int) -> list[float]:
    built = get("dlrm").build({**TINY, **config}, "cpu")
    return [float(built.step()) for _ in range(steps)]


@pytest.mark.parametrize("config", [
    {}, {"interaction": "cat"}, {"optimizer": "sgd"}, {"optimizer": "adam"},
    {"sparse_grads": True}, {"sparse_grads": True, "optimizer": "sgd"},
    {"sparse_grads": True, "optimizer": "adam"}, {"bottom_layers": 0, "top_layers": 0},
])
def test_dlrm_learns_its_fixed_batch(config) -> None:
    trace = losses(config, 15)
    assert all(math.isfinite(x) for x in trace)
    if "top_layers" not in config:  # (without hidden layers the raw dot products reach the
        assert abs(trace[0] - math.log(2)) < 0.2, "a fresh model predicts about 1/2"  # logit)
    assert trace[-1] < trace[0] - 0.02, trace


def test_sparse_gradients_train_like_dense_ones_under_sgd() -> None:
    # SGD applies the same update whether a table's gradient is stored sparse or dense; adagrad
    # and adam do not (their state of untouched rows differs), so they are not compared here.
    dense = losses({"optimizer": "sgd"}, 5)
    assert losses({"optimizer": "sgd", "sparse_grads": True}, 5) == pytest.approx(dense, rel=1e-5)


def test_sparse_adam_uses_sparse_adam_for_the_tables() -> None:
    import torch

    from cubicml_lab.workloads.dlrm import _optimizers, _tables

    cfg = get("dlrm").resolve({**TINY, "optimizer": "adam", "sparse_grads": True})
    tables = _tables(cfg, [0, 1, 2], torch.device("cpu"))
    dense = [torch.nn.Parameter(torch.zeros(3))]
    kinds = [type(o).__name__ for o in _optimizers(cfg, tables, dense)]
    assert kinds == ["Adam", "SparseAdam"]
    cfg = get("dlrm").resolve({**TINY, "optimizer": "adagrad", "sparse_grads": True})
    assert [type(o).__name__ for o in _optimizers(cfg, tables, dense)] == ["Adagrad"]


def test_seed_fixes_weights_and_data() -> None:
    assert losses({"seed": 3}, 2) == losses({"seed": 3}, 2) != losses({"seed": 4}, 2)


def test_build_reports_units_flops_and_params() -> None:
    built = get("dlrm").build(TINY, "cpu")
    cfg = get("dlrm").resolve(TINY)
    assert built.units_per_step == 32 and built.n_devices == 1 and built.sync is None
    assert built.parallel == {"embedding_sharding": "local", "tables_here": 3}
    bottom, top = mlp_widths(cfg)
    assert bottom == [5, 16, 16, 8] and top == [8 + 6, 16, 16, 1]  # 4 vectors: 6 dot products
    mlp_params = sum(a * b + b for w in (bottom, top) for a, b in zip(w, w[1:], strict=False))
    assert built.model_params == 3 * 50 * 8 + mlp_params
    assert built.flops_per_step == flops_per_step(cfg) and "embedding lookups" in \
        built.flops_convention
    assert flops_per_step(cfg, world_size=4) == 4 * flops_per_step(cfg)


@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_flop_formula_matches_flop_counter_mode(interaction) -> None:
    """One whole optimizer step counted by torch: the MLPs' addmm/mm and the dot bmm."""
    from torch.utils.flop_counter import FlopCounterMode

    config = {**TINY, "num_tables": 5, "emb_dim": 16, "interaction": interaction,
              "bottom_width": 24, "top_width": 40, "top_layers": 3}
    built = get("dlrm").build(config, "cpu")
    with FlopCounterMode(display=False) as counter:
        built.step()
    counts = counter.get_flop_counts()["Global"]
    assert any("bmm" in str(op) for op in counts) == (interaction == "dot")
    assert counter.get_total_flops() == pytest.approx(built.flops_per_step, rel=0.05)


@pytest.mark.parametrize(("config", "needle"), [
    ({"interaction": "sum"}, "interaction"),
    ({"optimizer": "lamb"}, "optimizer"),
    ({"num_tables": 0}, "num_tables"),
    ({"embeding_dim": 8}, "embeding_dim"),
])
def test_bad_knobs_name_the_knob(config, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        get("dlrm").resolve(config)


def test_table_wise_needs_a_table_per_rank() -> None:
    wl = get("dlrm")
    wl.check_world({"num_tables": 2, "embedding_sharding": "table_wise"}, 2)
    wl.check_world({"num_tables": 1, "embedding_sharding": "replicated"}, 4)
    with pytest.raises(ConfigError, match=r"num_tables = 2 < world size 4") as err:
        wl.check_world({"num_tables": 2, "embedding_sharding": "table_wise"}, 4)
    assert "replicated" in err.value.hint


def test_run_trial_measures_a_tiny_dlrm() -> None:
    res = run_trial({"workload": "dlrm", "config": {**TINY, "threads": 1}, "device": "cpu",
                     "measure": {"max_time_s": 0.3, "min_steps": 3, "warmup_max_s": 0.5}})
    assert res.status == "ok", res.error
    m = res.metrics
    assert m["samples_per_s"] == m["throughput"] and "tokens_per_s" not in m
    assert m["samples_per_s"] * m["step_time_s"] == pytest.approx(32)
    assert m["samples_per_s_per_device"] == pytest.approx(m["samples_per_s"])
    assert m["flops_per_step"] == flops_per_step(get("dlrm").resolve(TINY)) and m["mfu"] > 0
    assert res.workload == "dlrm" and res.config["num_tables"] == 3


def test_cost_terms_tell_dense_from_sparse_table_updates():
    from cubicml_lab.workloads.dlrm import cost_terms

    cfg = get("dlrm").resolve({"num_tables": 4, "rows": 5000, "emb_dim": 16, "pooling": 2,
                               "batch_size": 100, "sparse_grads": False})
    flops, lookups, updates, overhead = cost_terms(cfg)
    assert flops == flops_per_step(cfg) / 100 and overhead == 1 / 100
    assert lookups == 4 * 2 * 16
    assert updates == 4 * 5000 * 16 / 100  # every row of every table, shared by the batch
    assert cost_terms({**cfg, "sparse_grads": True})[2] == lookups  # only the rows looked up
