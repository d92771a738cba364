"""Multi-process training under a real ``torchrun`` (2 CPU processes, gloo).

The parallel versions of a workload must train the same model as one process does, so these tests
compare losses rather than just "it ran": tensor parallelism splits each matmul but sees the same
batch, so its losses equal the single-process ones step for step; DDP and FSDP2 see one batch per
rank and average gradients, so they equal each other, and their first loss (before any update)
equals the single process's; table-wise sharded DLRM equals replicated DLRM step for step. Then the
:class:`Torchrun` launcher end to end: a result from rank 0, degrees checked before launching,
and a timeout that leaves no worker behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from cubicml_lab.errors import ConfigError
from cubicml_lab.launch import Torchrun, measure

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("dist_worker.py")
GPT = {"d_model": 32, "n_layers": 2, "n_heads": 4, "seq_len": 16, "vocab": 128, "micro_batch": 2,
       "threads": 1, "lr": 1e-2}
DLRM = {"num_tables": 4, "rows": 200, "emb_dim": 8, "pooling": 3, "bottom_width": 16,
        "top_width": 16, "batch_size": 32, "threads": 1, "lr": 0.05}
FAST = {"max_time_s": 0.5, "min_steps": 3, "max_steps": 20, "warmup_max_s": 1.0}
STEPS = 3

pytestmark = pytest.mark.slow


def run_losses(tmp_path: Path, workload: str, config: dict | list[dict], nproc: int) -> Any:
    """Rank 0's record after STEPS steps, under torchrun (nproc > 1) or as one plain process;
    a list of records for a list of configs, run one after another in the same processes."""
    out = tmp_path / f"{uuid.uuid4().hex}.json"
    args = [str(WORKER), workload, json.dumps(config), str(STEPS), str(out)]
    if nproc > 1:
        args = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                *args]
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[:4000] + "\n...\n" + proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def gpt_single(tmp_path_factory) -> list[float]:
    return run_losses(tmp_path_factory.mktemp("single"), "gpt", GPT, 1)["losses"]


def test_gpt_tensor_parallel_trains_exactly_like_one_process(tmp_path, gpt_single) -> None:
    rec = run_losses(tmp_path, "gpt", {**GPT, "tp": 2}, 2)
    assert rec["parallel"]["strategy"] == "tp" and rec["parallel"]["dp_shard"] == 1
    assert rec["losses"] == pytest.approx(gpt_single, rel=1e-4)
    assert gpt_single[-1] < gpt_single[0], "and the model learns"
    # One batch for the whole tensor-parallel group: the tokens are not doubled.
    assert rec["units_per_step"] == GPT["micro_batch"] * GPT["seq_len"]


def test_gpt_ddp_and_fsdp2_train_the_same_model(tmp_path, gpt_single) -> None:
    ddp = run_losses(tmp_path, "gpt", {**GPT, "dp_replicate": 2, "dp_shard": 1}, 2)
    fsdp = run_losses(tmp_path, "gpt", {**GPT, "dp_shard": -1, "reshard_after_forward": True}, 2)
    assert ddp["parallel"]["strategy"] == "ddp" and fsdp["parallel"]["strategy"] == "fsdp"
    assert fsdp["parallel"]["dp_shard"] == 2
    assert ddp["losses"][0] == pytest.approx(gpt_single[0], rel=1e-5)
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=1e-4)
    # Rank 1 had its own batch, so averaged gradients move rank 0 off the single-process path.
    assert ddp["losses"][1:] != pytest.approx(gpt_single[1:], rel=1e-4)
    assert ddp["units_per_step"] == fsdp["units_per_step"] == 2 * GPT["micro_batch"] * 16
    assert ddp["flops_per_step"] == 2 * run_flops(GPT)


def run_flops(config: dict) -> float:
    from cubicml_lab.workloads import get
    from cubicml_lab.workloads.gpt import flops_per_step

    return flops_per_step(get("gpt").resolve(config))


DLRM_EXTRAS = [{"optimizer": "adagrad"}, {"optimizer": "sgd", "sparse_grads": True},
               {"optimizer": "adam", "sparse_grads": True, "interaction": "cat"}]


@pytest.fixture(scope="module")
def dlrm_runs(tmp_path_factory) -> dict[str, list[dict]]:
    """Every DLRM_EXTRAS config as one process, replicated over 2 and table-wise over 2: three
    launches, each training the configs one after another."""
    tmp = tmp_path_factory.mktemp("dlrm")
    cfgs = [{**DLRM, **extra} for extra in DLRM_EXTRAS]
    return {"single": run_losses(tmp, "dlrm", cfgs, 1),
            **{way: run_losses(tmp, "dlrm", [{**c, "embedding_sharding": way} for c in cfgs], 2)
               for way in ("replicated", "table_wise")}}


@pytest.mark.parametrize("i", range(len(DLRM_EXTRAS)),
                         ids=[",".join(f"{k}={v}" for k, v in e.items()) for e in DLRM_EXTRAS])
def test_dlrm_table_wise_sharding_trains_like_replicated(dlrm_runs, i) -> None:
    single, replicated, sharded = (dlrm_runs[k][i] for k in ("single", "replicated",
                                                              "table_wise"))
    assert sharded["parallel"] == {"embedding_sharding": "table_wise", "tables_here": 2}
    assert replicated["parallel"]["tables_here"] == DLRM["num_tables"]
    assert replicated["losses"][0] == pytest.approx(single["losses"][0], rel=1e-5)
    assert sharded["losses"] == pytest.approx(replicated["losses"], rel=1e-4)
    assert sharded["units_per_step"] == 2 * DLRM["batch_size"]


# ------------------------------------------------------------------------ the Torchrun launcher
def test_torchrun_launcher_measures_fsdp_gpt_from_rank_0() -> None:
    res = measure("gpt", {**GPT, "dp_shard": -1}, launcher=Torchrun(2, timeout_s=180),
                  measure_options=FAST)
    assert res.status == "ok", res.error
    assert res.hardware["world_size"] == 2 and res.hardware["backend"] == "gloo"
    assert res.hardware["parallel"]["strategy"] == "fsdp"
    m = res.metrics
    assert m["n_devices"] == 2
    assert m["tokens_per_s"] * m["step_time_s"] == pytest.approx(2 * 2 * 16)
    assert m["tokens_per_s_per_device"] == pytest.approx(m["tokens_per_s"] / 2)


def test_torchrun_launcher_measures_table_wise_dlrm() -> None:
    res = measure("dlrm", {**DLRM, "embedding_sharding": "table_wise"},
                  launcher=Torchrun(2, timeout_s=180), measure_options=FAST)
    assert res.status == "ok", res.error
    assert res.metrics["samples_per_s"] * res.metrics["step_time_s"] == pytest.approx(64)
    assert res.hardware["parallel"]["embedding_sharding"] == "table_wise"


@pytest.mark.parametrize(("workload", "config", "needle"), [
    ("gpt", {"dp_replicate": 3}, "dp_replicate 3 x tp 1 = 3 does not divide"),
    ("gpt", {"tp": 2, "dp_shard": 2}, "dp_replicate 1 x dp_shard 2 x tp 2 = 4"),
    ("dlrm", {"num_tables": 1, "embedding_sharding": "table_wise"}, "num_tables = 1 < world"),
])
def test_degrees_that_do_not_fit_the_world_fail_before_launch(tmp_path, workload, config,
                                                               needle) -> None:
    marker = tmp_path / "started"
    script = tmp_path / "py"
    script.write_text(f"#!{sys.executable}\nopen({str(marker)!r}, 'w').close()\n")
    script.chmod(0o755)
    with pytest.raises(ConfigError, match=needle):
        measure(workload, config, launcher=Torchrun(2, python=script))
    assert not marker.exists()


def test_torchrun_timeout_kills_every_worker() -> None:
    from test_launch import live_pids_with_env

    tag = uuid.uuid4().hex
    big = {"d_model": 1024, "n_layers": 4, "n_heads": 8, "seq_len": 1024, "vocab": 8192,
           "micro_batch": 8, "dp_shard": -1}
    launcher = Torchrun(2, timeout_s=8, env={"CUBICML_TEST_TAG": tag})
    # a thousand steps, each over a TFLOP per rank (6 x 67M parameters x its tokens): no CPU
    # finishes them inside 8 s
    res = measure("gpt", big, launcher=launcher,
                  measure_options={**FAST, "min_steps": 1000, "max_steps": 1000})
    assert res.status == "timeout", res.error
    assert 8 <= res.wall_s < 30
    assert live_pids_with_env(tag) == []


def test_torchrun_oom_on_one_rank_is_recorded_as_oom() -> None:
    # A 4 GiB token table does not fit a 3 GiB address space per worker.
    huge = {"d_model": 1024, "n_layers": 1, "n_heads": 8, "seq_len": 16, "vocab": 2**20,
            "micro_batch": 1, "dp_replicate": 2, "dp_shard": 1}
    res = measure("gpt", huge, launcher=Torchrun(2, timeout_s=180, memory_limit_gib=3),
                  measure_options=FAST)
    assert res.status == "oom", res.error
    assert "allocate" in res.error.lower()
