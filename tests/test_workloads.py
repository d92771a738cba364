"""Tests for cubicml_lab.workloads: the registry, knobs, the gpt model and run_trial, for real.

Every gpt test builds the real model and runs real optimizer steps at tiny sizes on the CPU.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cubicml_lab.errors import ConfigError
from cubicml_lab.trials import TrialResult
from cubicml_lab.launch.runner import run_trial
from cubicml_lab.workloads import get, names
from cubicml_lab.workloads.gpt import KNOBS, flops_per_step

ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 32, "n_layers": 2, "n_heads": 2, "seq_len": 16, "vocab": 64, "micro_batch": 2}
FAST = {"max_time_s": 0.3, "min_steps": 3, "warmup_max_s": 0.5}


def losses(config: dict, steps: int) -> list[float]:
    built = get("gpt").build({**TINY, **config}, "cpu")
    return [float(built.step()) for _ in range(steps)]


# ------------------------------------------------------------------------- registry and knobs
def test_registry() -> None:
    assert names() == ["dlrm", "gpt"]
    assert get("gpt").name == "gpt" and get("gpt").units == "tokens" and get("gpt").version
    assert get("dlrm").name == "dlrm" and get("dlrm").units == "samples"
    with pytest.raises(ConfigError, match="'bert'") as err:
        get("bert")
    assert "gpt" in str(err.value) and "dlrm" in str(err.value)


def test_default_config_lists_every_knob() -> None:
    wl = get("gpt")
    defaults = wl.default_config()
    assert set(defaults) == set(wl.knobs()) == set(KNOBS)
    expected = {"d_model": 128, "n_layers": 2, "n_heads": 4, "seq_len": 128, "vocab": 2048,
                "mlp_ratio": 4, "micro_batch": 8, "grad_accum": 1, "precision": "fp32",
                "recompute": "none", "compile": False, "fused_optimizer": False, "dp_replicate": 1,
                "dp_shard": -1, "tp": 1, "reshard_after_forward": True, "threads": 0,
                "lr": 3e-4, "seed": 0}
    assert defaults == expected
    assert wl.resolve({}) == defaults and wl.resolve(None) == defaults
    assert all(knob.doc for knob in wl.knobs().values())
    assert "recompute" in wl.describe() and "'selective'" in wl.describe()


def test_unknown_knob_names_it_and_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown knob\(s\) \['dmodel'\]") as err:
        get("gpt").resolve({"dmodel": 64})
    for knob in KNOBS:
        assert knob in str(err.value)


@pytest.mark.parametrize(("knob", "value", "allowed"), [
    ("precision", "fp16", "one of 'fp32', 'bf16'"),
    ("recompute", "some", "one of 'none', 'selective', 'full'"),
    ("micro_batch", 0, "int >= 1"),
    ("micro_batch", 2.5, "int >= 1"),
    ("compile", "yes", "bool"),
    ("d_model", True, "int >= 1"),
    ("lr", float("nan"), "float >= 0.0"),
    ("threads", -1, "int >= 0"),
])
def test_bad_knob_value_names_the_knob_and_what_is_allowed(knob, value, allowed) -> None:
    with pytest.raises(ConfigError, match=f"knob '{knob}'") as err:
        get("gpt").resolve({knob: value})
    assert allowed in str(err.value)


def test_values_are_coerced_to_the_knob_type() -> None:
    cfg = get("gpt").resolve({"micro_batch": 4.0, "lr": 1})
    assert cfg["micro_batch"] == 4 and isinstance(cfg["micro_batch"], int)
    assert cfg["lr"] == 1.0 and isinstance(cfg["lr"], float)


def test_heads_must_divide_the_width() -> None:
    with pytest.raises(ConfigError, match="n_heads = 3 does not divide d_model = 128") as err:
        get("gpt").resolve({"n_heads": 3})
    assert "[1, 2, 4, 8, 16, 32, 64]" in str(err.value)


def test_importing_workloads_loads_no_torch() -> None:
    code = ("import sys, cubicml_lab.workloads as w, cubicml_lab.workloads.gpt as g, "
            "cubicml_lab.workloads.dlrm as d; g.flops_per_step(w.get('gpt').resolve({})); "
            "d.flops_per_step(w.get('dlrm').resolve({})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------- the model
def test_gpt_trains_on_its_fixed_batch() -> None:
    trace = losses({"lr": 3e-3}, 20)
    assert all(math.isfinite(x) for x in trace)
    assert abs(trace[0] - math.log(64)) < 0.3, "a fresh model predicts about uniformly"
    assert trace[-1] < trace[0] - 0.5, trace


def test_build_reports_units_flops_and_params() -> None:
    built = get("gpt").build({**TINY, "grad_accum": 2}, "cpu")
    assert built.units_per_step == 2 * 16 * 2
    assert built.flops_per_step == 2 * flops_per_step({**get("gpt").resolve(TINY)})
    assert "no causal halving" in built.flops_convention and built.sync is None
    d, layers, v, s = 32, 2, 64, 16
    # embeddings (tied head) + positions + per block 12 d^2 weights and 2 LayerNorms + final LN
    assert built.model_params == v * d + s * d + layers * (12 * d * d + 4 * d) + 2 * d


@pytest.mark.parametrize("config", [{"precision": "bf16"}, {"recompute": "full"},
                                    {"recompute": "selective"}, {"grad_accum": 2},
                                    {"precision": "bf16", "recompute": "full", "grad_accum": 2}])
def test_variants_run(config) -> None:
    trace = losses({"lr": 3e-3, **config}, 4)
    assert all(math.isfinite(x) for x in trace) and trace[-1] < trace[0]


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_recompute_does_not_change_the_math(recompute) -> None:
    plain = losses({"lr": 3e-3}, 3)
    again = losses({"lr": 3e-3, "recompute": recompute}, 3)
    assert again == pytest.approx(plain, rel=1e-5)


def test_seed_fixes_weights_and_data_and_leaves_the_global_rng_alone() -> None:
    import torch

    state = torch.random.get_rng_state()
    assert losses({"seed": 1}, 2) == losses({"seed": 1}, 2) != losses({"seed": 2}, 2)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_seeded_on_makes_modules_on_the_device_and_restores_the_rng() -> None:
    """Weights are created where they will live (on a GPU they never pass through host memory):
    torch's meta device stands in for one here, as it is no CPU."""
    import torch

    from cubicml_lab.workloads.base import seeded_on

    state = torch.random.get_rng_state()
    with seeded_on("meta", 3):
        meta = torch.nn.Linear(4, 4)
    with seeded_on("cpu", 3):
        a = torch.nn.Linear(4, 4)
    with seeded_on("cpu", 3):
        b = torch.nn.Linear(4, 4)
    assert meta.weight.device.type == "meta" and a.weight.device.type == "cpu"
    assert torch.equal(a.weight, b.weight)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.empty(1).device.type == "cpu", "the default device is restored"


def test_flop_formula_matches_flop_counter_mode() -> None:
    """Forward + backward of one micro-batch, fp32, no recompute, counted by torch itself.

    FlopCounterMode counts matmuls (mm, bmm, ...) and fused attention kernels it knows; on CPU the
    fused SDPA kernel is not among them (counted 0). So: (1) with SDPA's math backend, attention
    is plain bmm and the whole formula is checked; (2) with the default kernel, the matmul part.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from cubicml_lab.workloads.gpt import GPT

    cfg = get("gpt").resolve({"d_model": 64, "n_layers": 3, "n_heads": 4, "seq_len": 32,
                              "vocab": 256, "micro_batch": 2, "mlp_ratio": 3})
    model = GPT(cfg)
    seq = torch.randint(0, cfg["vocab"], (cfg["micro_batch"], cfg["seq_len"] + 1))
    tokens = cfg["micro_batch"] * cfg["seq_len"]
    d, layers = cfg["d_model"], cfg["n_layers"]
    attention = 12 * layers * cfg["seq_len"] * d * tokens
    matmul = 6 * (layers * (4 + 2 * cfg["mlp_ratio"]) * d * d + d * cfg["vocab"]) * tokens
    assert flops_per_step(cfg) == matmul + attention

    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(seq[:, :-1], seq[:, 1:]).backward()
    assert counter.get_total_flops() == pytest.approx(flops_per_step(cfg), rel=0.05)

    with FlopCounterMode(display=False) as counter:
        model(seq[:, :-1], seq[:, 1:]).backward()
    counts = counter.get_flop_counts()["Global"]
    plain = sum(v for op, v in counts.items() if "attention" not in str(op))
    assert plain == pytest.approx(matmul, rel=0.05)


# ------------------------------------------------------------------------------- run_trial
def test_run_trial_measures_a_tiny_gpt() -> None:
    import torch

    threads = torch.get_num_threads()
    res = run_trial({"workload": "gpt", "config": {**TINY, "threads": 1}, "device": "cpu",
                     "measure": FAST})
    assert res.status == "ok", res.error
    m = res.metrics
    assert m["throughput"] > 0 and m["step_time_s"] > 0 and m["peak_mem_gib"] > 0
    assert m["tokens_per_s"] == m["throughput"]
    assert m["tokens_per_s"] * m["step_time_s"] == pytest.approx(2 * 16)
    assert m["flops_per_step"] == flops_per_step(get("gpt").resolve(TINY))
    assert 0 < m["mfu"] and m["steps_timed"] >= 3 and m["warmup_steps"] >= 2
    assert math.isfinite(m["loss"]) and m["model_params"] > 0
    assert res.config == get("gpt").resolve({**TINY, "threads": 1})
    assert res.workload == "gpt" and res.workload_version == get("gpt").version
    assert res.hardware["hostname"] == socket.gethostname()
    assert res.hardware["torch_threads"] == 1, "the trial ran with the configured threads"
    assert torch.get_num_threads() == threads, "and put the caller's thread count back"
    assert res.wall_s >= m["measure_s"] > 0
    assert TrialResult.from_json(res.to_json()).metrics == pytest.approx(m, nan_ok=True)


@pytest.mark.parametrize(("spec", "needle"), [
    ({"workload": "gpt", "config": {"d_modle": 64}}, "d_modle"),
    ({"workload": "gpt", "config": {"n_heads": 3}}, "n_heads = 3 does not divide"),
    ({"workload": "nope"}, "unknown workload 'nope'"),
    ({"workload": "gpt", "device": "tpu"}, "device = 'tpu'"),
    ({"workload": "gpt", "measure": {"budget": 3}}, "unknown measure option(s) ['budget']"),
    ({"workload": "gpt", "config": [1, 2]}, "a trial spec is a dict with a 'config' dict"),
])
def test_run_trial_returns_failed_for_a_bad_spec(spec, needle) -> None:
    res = run_trial(spec)
    assert res.status == "failed" and res.metrics == {}
    assert needle in res.error
    assert res.hardware["hostname"] == socket.gethostname()
    json.loads(res.to_json())


def test_run_trial_reports_a_diverging_run_as_failed() -> None:
    res = run_trial({"workload": "gpt", "config": {**TINY, "lr": 1e30},
                     "measure": {**FAST, "warmup_max_steps": 4, "max_steps": 8}})
    assert res.status == "failed" and res.metrics == {}
    assert "loss is not finite" in res.error and "lr = 1e+30" in res.error


def test_run_trial_on_a_missing_cuda_device_fails_with_type_and_traceback() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = run_trial({"workload": "gpt", "config": TINY, "device": "cuda"})
    assert res.status == "failed" and "torch sees no CUDA device" in res.error
    assert "ConfigError" in res.error and "traceback" in res.error


@pytest.mark.slow
def test_run_trial_out_of_memory_is_oom() -> None:
    """A real allocation failure: the weights of this config exceed a 3 GiB address space."""
    code = textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
        from cubicml_lab.launch.runner import run_trial
        res = run_trial({"workload": "gpt", "config": {"d_model": 4096, "n_layers": 8,
                         "n_heads": 8, "seq_len": 16, "vocab": 64, "micro_batch": 1}})
        sys.stdout.write(res.to_json())
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    res = TrialResult.from_json(out.stdout)
    assert res.status == "oom", res.error
    assert "allocate" in res.error.lower()
    assert set(res.metrics) <= {"peak_mem_gib"}


@pytest.mark.slow
def test_compiled_gpt_runs() -> None:
    res = run_trial({"workload": "gpt", "config": {**TINY, "n_layers": 1, "compile": True},
                     "measure": FAST})
    assert res.status == "ok", res.error
    assert res.config["compile"] is True and res.metrics["step_time_s"] > 0


def test_gpt_cost_terms_follow_recompute_and_batching():
    from cubicml_lab.workloads.gpt import cost_terms

    cfg = get("gpt").resolve({**TINY, "precision": "fp32"})
    flops, low, weights, activations, overhead, scores, low_scores = cost_terms(cfg)
    tokens = cfg["micro_batch"] * cfg["seq_len"] * cfg["grad_accum"]
    assert flops == pytest.approx(flops_per_step(cfg) / tokens) and low == 0.0
    assert scores > 0 and low_scores == 0.0
    assert cost_terms({**cfg, "recompute": "full"})[0] == pytest.approx(flops * 4 / 3)
    assert cost_terms({**cfg, "recompute": "full"})[5] == pytest.approx(scores * 4 / 3)
    assert flops < cost_terms({**cfg, "recompute": "selective"})[0] < flops * 4 / 3
    # recomputation launches a block's forward again: a third more of each block's launches
    launches = cfg["n_layers"] + 1
    assert cost_terms({**cfg, "recompute": "full"})[4] == pytest.approx(
        overhead * (cfg["n_layers"] * 4 / 3 + 1) / launches)
    assert overhead < cost_terms({**cfg, "recompute": "selective"})[4] < overhead * (
        cfg["n_layers"] * 4 / 3 + 1) / launches
    more = cost_terms({**cfg, "grad_accum": 2 * cfg["grad_accum"]})
    assert more[2] == pytest.approx(weights / 2)  # one optimizer step for twice the tokens
    assert more[3] == activations and more[4] == overhead  # per micro-batch: unchanged
    assert cost_terms({**cfg, "micro_batch": 2 * cfg["micro_batch"]})[4] == overhead / 2
    one, two = cost_terms({**cfg, "threads": 1}), cost_terms({**cfg, "threads": 2})
    assert two[0] == one[0] / 2 and two[3] == one[3] / 2 and two[5] == one[5] / 2  # threads
    assert two[2] == one[2] and two[4] == one[4]  # not the per-step costs
    slower = cost_terms({**cfg, "threads": 2, "thread_scaling": 0.5})  # 2 threads: 2 ** 0.5
    assert slower[0] == pytest.approx(one[0] / 2**0.5) and slower[4] == one[4]
    assert cost_terms({**cfg, "threads": 1, "thread_scaling": 0.5}) == one
    # bf16: the same FLOPs and scores in the low-precision terms, half the activation bytes
    half = cost_terms({**cfg, "precision": "bf16"})
    assert half[:2] == [0.0, flops] and half[3] == activations / 2 and half[2] == weights
    assert half[5:] == [0.0, scores] and len(half) == len(cost_terms.term_names)
    assert cost_terms.term_units[5] == cost_terms.term_units[6] == "score"
    # more heads: more score elements, the same FLOPs
    heads = cost_terms({**cfg, "n_heads": 2 * cfg["n_heads"]})
    assert heads[5] == 2 * scores and heads[0] == flops
    # an fp32 FLOP's cost relative to a bf16 one scales the fp32 term only
    slow = cost_terms({**cfg, "fp32_flop_cost": 4.0})
    assert slow[0] == pytest.approx(4 * flops) and slow[1:] == cost_terms(cfg)[1:]
    assert cost_terms({**cfg, "precision": "bf16", "fp32_flop_cost": 4.0}) == half
    # and an fp32 attention score's cost relative to a bf16 one the fp32 score term only
    cheap = cost_terms({**cfg, "fp32_score_cost": 0.25})
    assert cheap[5] == pytest.approx(scores / 4) and cheap[:5] == cost_terms(cfg)[:5]
    assert cost_terms({**cfg, "precision": "bf16", "fp32_score_cost": 0.25}) == half


def test_gpt_shape_features_are_the_micro_batch_gemm_sizes():
    from cubicml_lab.workloads.gpt import shape_features

    cfg = get("gpt").resolve(TINY)
    tokens, hidden, logits, scores, working_set = shape_features(cfg)
    assert tokens == cfg["micro_batch"] * cfg["seq_len"]
    assert (hidden, logits) == (tokens * cfg["d_model"], tokens * cfg["vocab"])
    assert scores == 1 + cfg["seq_len"] * cfg["n_heads"] * cfg["n_layers"]
    longer = shape_features({**cfg, "seq_len": 2 * cfg["seq_len"],
                             "grad_accum": 2 * cfg["grad_accum"]})
    assert longer[0] == 2 * tokens and longer[3] == 2 * scores - 1  # grad_accum: unchanged
    assert working_set == tokens * (8 + cfg["mlp_ratio"]) * cfg["d_model"] * (
        2 if cfg["precision"] == "bf16" else 4)
    assert shape_features({**cfg, "precision": "bf16"})[4] == 2 * tokens * (
        8 + cfg["mlp_ratio"]) * cfg["d_model"]
