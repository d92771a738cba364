"""Workloads of your own: register(), entry points, PythonWorkload timed by the lab's harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cubicml_lab as cml
from cubicml_lab.errors import ConfigError
from cubicml_lab.launch import InProcess, Subprocess
from cubicml_lab.workloads import PythonWorkload, registry

FAST = {"max_time_s": 0.5, "min_steps": 3, "max_steps": 20, "warmup_max_s": 0.5,
        "reference_share": 0.0}
ROOT = Path(__file__).resolve().parents[1]

MODULE = textwrap.dedent('''
    import torch
    from cubicml_lab.workloads import PythonWorkload

    def make(config, device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, config["width"]), torch.nn.ReLU(),
                                    torch.nn.Linear(config["width"], 32)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(config["batch"], 32, device=device)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step, model

    mlp = PythonWorkload("tiny-mlp", make, knobs={"batch": 16, "width": 64},
                         units_per_step="batch", flops_per_step=lambda c: 6 * c["batch"] * 64 * 64)

    def broken(config, device):
        return 42

    not_a_step = PythonWorkload("broken", broken, knobs={"batch": 4})
''')


@pytest.fixture
def own_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """my_models.py in a fresh working directory, importable here and by trial processes;
    registrations undone afterwards."""
    (tmp_path / "my_models.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    yield tmp_path
    for name in list(registry.registered()):
        registry.unregister(name)
    sys.modules.pop("my_models", None)


@pytest.mark.slow
def test_import_path_runs_in_process_and_in_a_fresh_interpreter(own_module: Path) -> None:
    cml.workloads.register("tiny-mlp", "my_models:mlp")
    assert "tiny-mlp" in cml.workloads.names()
    assert json.loads(os.environ[registry.ENV_VAR]) == {"tiny-mlp": "my_models:mlp"}
    here = cml.measure("tiny-mlp", {"batch": 8}, launcher=InProcess(), measure_options=FAST)
    assert here.status == "ok", here.error
    m = here.metrics
    assert m["samples_per_s"] == pytest.approx(8 / m["step_time_s"], rel=0.2)
    assert m["model_params"] == 32 * 64 + 64 + 64 * 32 + 32
    assert m["achieved_tflops"] > 0 and here.workload == "tiny-mlp"
    there = cml.measure("tiny-mlp", {"batch": 8}, launcher=Subprocess(timeout_s=120),
                        measure_options=FAST)
    assert there.status == "ok", there.error
    assert there.workload == "tiny-mlp" and there.config == {"batch": 8, "width": 64}


def test_an_object_runs_in_process_only(own_module: Path) -> None:
    import my_models

    cml.workloads.register("cell-mlp", my_models.mlp)  # as if defined in a notebook cell
    res = cml.measure("cell-mlp", {"width": 32}, measure_options=FAST)
    assert res.status == "ok", res.error
    with pytest.raises(ConfigError, match="fresh interpreter") as err:
        cml.measure("cell-mlp", launcher=Subprocess(timeout_s=60), measure_options=FAST)
    assert "register('cell-mlp', 'my_models:MyWorkload')" in err.value.hint
    space = cml.Space([cml.PowerOfTwo("batch", 4, 8)])
    with pytest.raises(ConfigError, match="fresh interpreter"):
        cml.Campaign("c", space, workload="cell-mlp", launcher=Subprocess(),
                     store=cml.TrialStore(own_module / "s.sqlite"))


def test_a_child_of_a_notebook_says_why_it_cannot_see_an_object(own_module: Path) -> None:
    import my_models

    cml.workloads.register("cell-mlp", my_models.mlp)
    code = "from cubicml_lab.workloads import get; get('cell-mlp')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.returncode != 0
    assert "registered as an object in the process that started this trial" in out.stderr


@pytest.mark.slow
def test_entry_points_of_installed_packages(own_module: Path) -> None:
    dist = own_module / "my_models_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-models-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{registry.GROUP}]\nep-mlp = my_models:mlp\n")
    assert registry.registered()["ep-mlp"] == "entry point my_models:mlp"
    wl = cml.workloads.get("ep-mlp")
    assert isinstance(wl, PythonWorkload) and wl.name == "ep-mlp"
    res = cml.measure("ep-mlp", {"batch": 4}, launcher=Subprocess(timeout_s=120),
                      measure_options=FAST)  # the child finds the entry point itself
    assert res.status == "ok", res.error


def test_a_broken_workload_is_a_failed_trial(own_module: Path) -> None:
    cml.workloads.register("broken", "my_models:not_a_step")
    res = cml.measure("broken", measure_options=FAST)
    assert res.status == "failed" and "not a step function" in res.error


@pytest.mark.parametrize("name, workload, words", [
    ("gpt", "my_models:mlp", "built-in"),
    ("two words", "my_models:mlp", "must be a word"),
    ("x", "my_models.mlp", "is not 'module:attribute'"),
    ("x", "my models:mlp", "is not 'module:attribute'"),
    ("x", 42, "not a workload"),
])
def test_bad_registrations(own_module: Path, name: str, workload: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        cml.workloads.register(name, workload)


def test_lookup_errors_name_the_problem(own_module: Path) -> None:
    cml.workloads.register("a", "no_such_module:x")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        cml.workloads.get("a")
    cml.workloads.register("b", "my_models:nothing_here")
    with pytest.raises(ConfigError, match="has no 'nothing_here'"):
        cml.workloads.get("b")
    cml.workloads.register("c", lambda: "not a workload")
    with pytest.raises(ConfigError, match="gave str, not a Workload"):
        cml.workloads.get("c")
    with pytest.raises(ConfigError, match="already registered"):
        cml.workloads.register("c", "my_models:mlp")
    cml.workloads.register("c", "my_models:mlp", replace=True)
    assert cml.workloads.get("c").name == "c"
    with pytest.raises(ConfigError, match="unknown workload 'nope'") as err:
        cml.workloads.get("nope")
    assert "register" in err.value.hint


def test_python_workload_checks_its_arguments() -> None:
    with pytest.raises(ConfigError, match="is not a knob"):
        PythonWorkload("w", lambda c, d: None, knobs={"batch": 4}, units_per_step="bs")
    with pytest.raises(ConfigError, match="give a default"):
        PythonWorkload("w", lambda c, d: None, knobs={"batch": [4]})
    with pytest.raises(ConfigError, match="units"):
        PythonWorkload("w", lambda c, d: None, knobs={}, units="images")
    wl = PythonWorkload("w", lambda c, d: None, knobs={"batch": 4, "lr": 0.1})
    with pytest.raises(ConfigError, match="knob 'batch' = 0 is not allowed"):
        wl.resolve({"batch": 0})
    assert repr(wl) == "<PythonWorkload 'w' v1 (samples/step; batch=4, lr=0.1)>"


@pytest.mark.gpu
def test_a_python_workload_on_cuda_is_timed_with_device_events(own_module: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (run on a machine with an NVIDIA GPU)")
    cml.workloads.register("tiny-mlp", "my_models:mlp")
    res = cml.measure("tiny-mlp", {"batch": 64, "width": 256}, device="cuda",
                      measure_options={**FAST, "reference_share": 0.1})
    assert res.status == "ok", res.error
    assert res.hardware["device"].startswith("cuda") and res.metrics["peak_mem_gib"] > 0
    assert res.metrics["samples_per_s"] == pytest.approx(64 / res.metrics["step_time_s"],
                                                         rel=0.2)
