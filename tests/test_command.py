"""A user's command as a workload: definition checks, rendering, figures from its reports, real
jobs under the launchers, campaigns, and its bad inputs.

The jobs are real programs under ``tests/jobs/``: ``toy_job.py`` (standard library only, for the
failure modes) and ``plain_loop.py`` (a PyTorch loop reporting through ``cubicml_lab.report``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import pytest

import cubicml_lab as cml
from cubicml_lab.errors import ConfigError
from cubicml_lab.launch import InProcess, Subprocess
from cubicml_lab.launch.process import is_running, process_start
from cubicml_lab.timing import MeasureOptions
from cubicml_lab.workloads import Command
from cubicml_lab.workloads.job_reports import MEGATRON, JobReports, check_sources

JOBS = Path(__file__).resolve().parent / "jobs"
TOY = str(JOBS / "toy_job.py")
LOOP = str(JOBS / "plain_loop.py")
QUICK = {"max_time_s": 1.5, "min_steps": 5}


def toy(mode: str, *extra: str, **kw) -> Command:
    return Command(f"toy-{mode}", argv=[sys.executable, TOY, mode, *extra],
                   **{"units": "samples", **kw})


def run(cmd: Command, config=None, launcher=None, measure=QUICK):
    spec = {"workload": cmd.name, "config": config or {}, "command": cmd.to_spec(),
            "measure": measure}
    return (launcher or InProcess()).run(spec)


# -- definition -------------------------------------------------------------------------------
def test_placeholders_render_and_metacharacters_stay_one_argument():
    job = Command("j", argv=["python", "t.py", "--tp={tp}", "{name}", "{{literal}}"],
                  env={"MY_FLAG": "{tp}x"})
    nasty = "a b; rm -rf / $(whoami) `id` | cat > x && echo '\"'"
    out = job.render({"tp": 2, "name": nasty})
    assert out.argv == ["python", "t.py", "--tp=2", nasty, "{literal}"]
    assert out.env == {"MY_FLAG": "2x"}
    assert job.placeholders() == ["tp", "name"]
    assert job.render({"tp": True, "name": 1.5}).argv[2:4] == ["--tp=true", "1.5"]


@pytest.mark.parametrize("argv, words", [
    (["python", "{tp.x}"], "not a knob name"),
    (["python", "{0}"], "not a knob name"),
    (["python", "{tp!r}"], "not a knob name"),
    (["python", "{tp"], r"argv\[1\]"),
    (["python", "line\nbreak"], "control character"),
    ("python train.py", "list of strings"),
    ([], "non-empty list"),
    (["python", 3], "must be a string"),
])
def test_bad_argv_is_refused_naming_the_field(argv, words):
    with pytest.raises(ConfigError, match=words):
        Command("j", argv=argv)


def test_bad_values_env_and_pattern_are_refused():
    job = Command("j", argv=["python", "{a}"])
    for value, words in ([[1, 2], "not a plain scalar"], [{"x": 1}, "not a plain scalar"],
                         [math.nan, "not finite"], ["a\x00b", "control character"]):
        with pytest.raises(ConfigError, match=words):
            job.render({"a": value})
    with pytest.raises(ConfigError, match="needs a value"):
        job.render({})
    with pytest.raises(ConfigError, match="environment variable name"):
        Command("j", argv=["x"], env={"1BAD": "v"})
    with pytest.raises(ConfigError, match="no named group the lab reads"):
        Command("j", argv=["x"], metrics=[r"step (\d+) took (?P<secs>[\d.]+)"])
    with pytest.raises(ConfigError, match="not a regular expression"):
        check_sources(["(?P<step_time_s>"])
    with pytest.raises(ConfigError, match="units"):
        Command("j", argv=["x"], units="images")


def test_bind_checks_placeholders_against_the_space(tmp_store):
    space = cml.Space([cml.Int("mb", 1, 4), cml.Choice("opt", ["sgd", "adam"])],
                      constants={"world": 2}, derived={"gb": "mb * world"})
    job = Command("j", argv=["python", "t.py", "--mb={mb}", "--gb={gb}", "--opt={opt}"])
    bound = job.bind(space)
    assert set(bound.knobs()) == {"mb", "opt", "world", "gb"}
    with pytest.raises(ConfigError, match=r"\['tp'\].*not knobs of the space"):
        Command("j", argv=["python", "--tp={tp}"]).bind(space)
    bad = cml.Space([cml.Choice("name", ["ok", "new\nline"])])
    with pytest.raises(ConfigError, match="control character"):
        cml.Campaign("bad", bad, workload=Command("j", argv=["x", "{name}"]),
                     store=tmp_store)


@pytest.mark.parametrize("suffix, template", [
    (".toml", '[parallelism]\ntensor_parallel_degree = 1\n[training]\nsteps = 10\n'),
    (".yaml", "parallelism:\n  tensor_parallel_degree: 1\ntraining:\n  steps: 10\n"),
    (".json", '{"parallelism": {"tensor_parallel_degree": 1}, "training": {"steps": 10}}'),
])
def test_config_file_from_a_template(tmp_path, suffix, template):
    path = tmp_path / f"train{suffix}"
    path.write_text(template)
    job = Command("j", argv=["python", "t.py", "--job.config_file", "{config_file}"],
                  config_file=path, config_keys={"parallelism.tensor_parallel_degree": "tp",
                                                 "model.flavor": "flavor"})
    out = job.render({"tp": 4, "flavor": "debug"}, trial_dir="/trial")
    assert out.argv[-1] == f"/trial/train{suffix}" and out.config_name == f"train{suffix}"
    written = tmp_path / f"out{suffix}"
    written.write_text(out.config_text)
    from cubicml_lab.workloads.config_files import load_config

    data = load_config(written)
    assert data["parallelism"]["tensor_parallel_degree"] == 4
    assert data["model"]["flavor"] == "debug" and data["training"]["steps"] == 10
    again = Command.from_spec(json.loads(json.dumps(job.to_spec())))
    assert again.render({"tp": 4, "flavor": "debug"}, "/trial") == out


def test_config_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[x\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Command("j", argv=["x"], config_file=bad)
    with pytest.raises(ConfigError, match="unknown format"):
        Command("j", argv=["x"], config_file=tmp_path / "a.ini")
    with pytest.raises(ConfigError, match="cannot read"):
        Command("j", argv=["x"], config_file=tmp_path / "missing.json")
    ok = tmp_path / "ok.json"
    ok.write_text('{"a": 1}')
    with pytest.raises(ConfigError, match="is a int in the template"):
        Command("j", argv=["x"], config_file=ok, config_keys={"a.b": "k"}).render({"k": 1})


def test_repr_html_shows_template_rendered_argv_and_sources():
    job = Command("llama", argv=["torchrun", "train.py", "--tp={tp}"], metrics=["torchtitan"])
    html = job._repr_html_()
    assert "--tp={tp}" in html and "--tp=&lt;tp&gt;" in html and "torchtitan log lines" in html
    bound = job.bind(cml.Space([cml.PowerOfTwo("tp", 1, 4)]))
    assert f"--tp={bound.knobs()['tp'].default}" in bound._repr_html_()


# -- reading reports --------------------------------------------------------------------------
def test_metrics_file_with_junk_lines_is_read_and_junk_counted(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = []
    for i in range(60):
        lines.append(json.dumps({"v": 1, "event": "step", "rank": 0, "t": 0.1 * i,
                                 "wall": 0.0, "step": i, "tokens": 512, "loss": 1.0}))
        lines += ["garbage", '{"v": 9, "event": "step", "t": 1}', "[1]", ""]
    lines.append(json.dumps({"v": 1, "event": "memory", "rank": 0, "t": 9, "wall": 0,
                             "peak_gib": 1.5}))
    path.write_text("\n".join(lines) + '\n{"v": 1, "event": "st')
    reports = JobReports(["report"], str(path), [])
    assert reports.poll() == 60
    reports.finish()
    assert reports.junk == 3 * 60 + 1
    m = reports.figures("tokens", MeasureOptions(min_steps=5), 6.0)
    assert m["step_time_s"] == pytest.approx(0.1) and m["tokens_per_s"] == pytest.approx(5120)
    assert m["peak_mem_gib"] == 1.5 and m["junk_lines"] == 181 and m["warmup_steps"] >= 2


def test_megatron_pattern_reads_its_log_line(tmp_path):
    # the line as megatron/training/training.py's training_log prints it
    line = (" [2026-12-05 10:00:00.000000] iteration       20/    1000 | consumed samples: "
            "       160 | elapsed time per iteration (ms): 250.5 | throughput per GPU "
            "(TFLOP/s/GPU): 80.1 | learning rate: 1.000000E-04 | global batch size:     8 | "
            "lm loss: 2.345600E+00 | loss scale: 1.0 |")
    import re

    found = re.search(MEGATRON, line).groupdict()
    assert found == {"step": "20", "step_time_ms": "250.5", "samples": "8", "loss": "2.345600E+00"}


def test_torchtitan_and_hf_patterns_read_their_log_lines():
    import re

    from cubicml_lab.workloads.job_reports import _ANSI, HF_TRAINER, TORCHTITAN

    # torchtitan/components/metrics.py: colour codes around each field
    titan = ("\x1b[31mstep:  5  \x1b[32mloss:  7.12345  \x1b[38;2;180;60;0mgrad_norm:  1.2345  "
             "\x1b[38;2;54;234;195mmemory: 12.34GiB(15.60%)  \x1b[34mtps: 12,345  "
             "\x1b[36mtflops: 123.45  \x1b[35mmfu: 12.48%\x1b[39m")
    got = re.search(TORCHTITAN, _ANSI.sub("", titan)).groupdict()
    assert got == {"step": "5", "loss": "7.12345", "peak_mem_gib": "12.34",
                   "tokens_per_s_per_device": "12,345"}
    assert re.search(TORCHTITAN, "validate step:  5  loss:  7.1  memory: 1.00GiB(1%)  tps: 9") \
        is None
    hf = "{'loss': 2.3456, 'grad_norm': 1.23, 'learning_rate': 5e-05, 'epoch': 0.12}"
    assert re.search(HF_TRAINER, hf).group("loss") == "2.3456"


# -- real jobs --------------------------------------------------------------------------------
def test_toy_job_in_process_gives_figures_and_a_record():
    nasty = "x; touch /tmp/cubicml-pwned $(id) `id`"
    res = run(toy("steps", "{arg}"), {"arg": nasty})
    assert res.status == "ok", res.error
    m = res.metrics
    assert 0.015 < m["step_time_s"] < 0.05 and m["samples_per_s"] == pytest.approx(
        4 / m["step_time_s"])
    assert m["windows"] >= 6 and m["warmup_steps"] >= 2 and m["job_startup_s"] < 2
    job = res.hardware["job"]
    assert job["argv"][-1] == nasty and job["ended"] in ("target met", "max_time_s")
    assert "torch" in job["packages"] and res.hardware.get("hostname")
    assert not os.path.exists("/tmp/cubicml-pwned")


def test_junk_lines_in_a_real_metrics_file_are_counted():
    res = run(toy("junk"))
    assert res.status == "ok", res.error
    assert res.metrics["junk_lines"] >= 3 and res.hardware["job"]["junk_lines"] >= 3


def test_log_pattern_figures_from_a_jobs_stdout():
    res = run(toy("megatron", metrics=["megatron"]))
    assert res.status == "ok", res.error
    assert res.metrics["step_time_s"] == pytest.approx(0.02)
    assert res.metrics["samples_per_s"] == pytest.approx(400, rel=0.01)


def test_torchtitan_lines_give_a_rate_and_hf_lines_are_timed_as_they_come():
    res = run(toy("titan", metrics=["torchtitan"], units="tokens"))
    assert res.status == "ok", res.error
    assert res.metrics["tokens_per_s"] == pytest.approx(2048 / 0.02, rel=0.01)
    assert res.metrics["peak_mem_gib"] == 1.5 and math.isnan(res.metrics["step_time_s"])
    res = run(toy("hf", metrics=["hf_trainer"]))
    assert res.status == "ok", res.error
    assert 0.018 <= res.metrics["step_time_s"] < 0.04  # timed as read: arrival jitter
    assert res.metrics["steps_per_s"] > 0 and res.metrics["loss"] < 0.5


@pytest.mark.parametrize("mode, status, words", [
    ("fail", "failed", "exited with code 3"),
    ("oom", "oom", "out of memory"),
])
def test_a_failing_job_is_data(mode, status, words):
    res = run(toy(mode))
    assert res.status == status and words in res.error
    assert "ValueError: bad learning rate" in res.error or mode == "oom"


def test_missing_executable_and_silent_job():
    res = run(Command("nope", argv=["no-such-program-xyz", "--a"]))
    assert res.status == "failed" and "not found on PATH" in res.error
    t = time.monotonic()
    res = run(toy("silent", timeout_s=1.5))
    assert res.status == "timeout" and "no step reported within timeout_s = 1.5 s" in res.error
    assert time.monotonic() - t < 15


def test_a_hung_job_is_a_timeout():
    res = run(toy("hang", stall_s=1.0), measure={"max_time_s": 30, "min_steps": 50})
    assert res.status == "timeout" and "hung" in res.error


def test_a_job_that_forks_and_exits_leaves_nothing_running():
    res = run(toy("fork"))
    assert res.status == "failed" and "without reporting a step" in res.error
    left = res.hardware["job"]["left_running"]
    assert left and "killed with its group" in res.error
    deadline = time.monotonic() + 5
    while any(process_start(p) is not None for p in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(process_start(p) is None for p in left)


@pytest.mark.slow
def test_subprocess_runs_a_pytorch_loop_and_the_job_dies_with_its_trial():
    job = Command("loop", argv=[sys.executable, LOOP, "--batch={batch}"], units="samples")
    res = run(job, {"batch": 16}, launcher=Subprocess(timeout_s=120))
    assert res.status == "ok", res.error
    assert res.metrics["samples_per_s"] > 0, res.metrics
    assert math.isfinite(res.metrics["throughput_rel_ci"]), res.metrics
    # it reports no memory: its largest process's resident set (torch and the model: > 0.1 GiB)
    assert 0.1 < res.metrics["peak_mem_gib"] < 4
    assert res.hardware["job"]["peak_mem_from"] == "the largest resident set of its processes"
    assert res.hardware["job"]["packages"]["torch"]
    assert not is_running(-1, 0)


# -- campaigns --------------------------------------------------------------------------------
@pytest.mark.slow
def test_campaign_over_a_command_with_subprocess_then_resume(tmp_store):
    space = cml.Space([cml.PowerOfTwo("batch", 8, 64)])
    job = Command("loop", argv=[sys.executable, LOOP, "--batch={batch}", "--label={batch}"],
                  units="samples")
    camp = cml.Campaign("cmd", space, workload=job, launcher=Subprocess(timeout_s=120),
                        searcher=cml.RandomSearch(space, seed=0), store=tmp_store,
                        measure_options=QUICK)
    camp.run(budget=3)
    trials = camp.trials()
    assert [t.status for t in trials] == ["ok"] * 3, [t.error for t in trials]
    for t in trials:
        assert t.workload == "loop" and t.metrics["samples_per_s"] > 0
        assert t.hardware["job"]["argv"][-1] == f"--label={t.config['batch']}"
    again = cml.Campaign.from_store(tmp_store, "cmd", launcher=Subprocess(timeout_s=120),
                                    searcher=cml.RandomSearch(space, seed=1))
    assert isinstance(again.workload, Command) and again.workload.argv == job.argv
    again.run(budget=4)
    assert len(again.trials()) == 4 and again.trials()[-1].status == "ok"


def test_a_campaign_whose_program_is_missing_stores_failures(tmp_store):
    space = cml.Space([cml.Int("a", 1, 3)])
    job = Command("gone", argv=["/no/such/dir/train", "--a={a}"])
    camp = cml.Campaign("gone", space, workload=job, launcher=InProcess(),
                        searcher=cml.RandomSearch(space, seed=0), store=tmp_store)
    camp.run(budget=2)
    trials = tmp_store.trials("gone")
    assert [t.status for t in trials] == ["failed", "failed"]
    assert all("executable '/no/such/dir/train' not found" in t.error for t in trials)


@pytest.mark.slow
def test_torchrun_runs_the_jobs_script_on_two_cpu_processes():
    from cubicml_lab.launch import Torchrun

    job = Command("ddp", argv=[sys.executable, LOOP, "--batch={batch}"], units="samples")
    res = run(job, {"batch": 8}, launcher=Torchrun(nproc_per_node=2, timeout_s=180))
    assert res.status == "ok", res.error
    argv = res.hardware["job"]["argv"]
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node" in argv
    assert res.metrics["ranks_reported"] == 2 and res.metrics["units_per_step"] == 16
    assert res.metrics["slowest_rank"] in (0, 1) and res.metrics["samples_per_s"] > 0


# -- the headless path ------------------------------------------------------------------------
def _campaign_file(tmp_path, argv) -> Path:
    import yaml

    space = cml.Space([cml.Choice("arg", ["plain", "semi;colon $(id)"])])
    (tmp_path / "tmpl.json").write_text('{"job": {"arg": "x"}}')
    data = {"name": "cli-cmd", "workload": "toy-cli", "space": space.to_dict(),
            "launcher": {"kind": "inprocess"}, "searcher": {"kind": "random", "seed": 0},
            "store": str(tmp_path / "lab.sqlite"), "budget": 2, "measure_options": QUICK,
            "command": {"argv": argv, "units": "samples", "config_file": "tmpl.json",
                        "config_keys": {"job.arg": "arg"}}}
    path = tmp_path / "camp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
def test_cli_runs_a_command_only_with_consent(tmp_path, capsys):
    from cubicml_lab.cli import main

    path = _campaign_file(tmp_path, [sys.executable, TOY, "steps", "{config_file}"])
    assert main(["run", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "names programs to run" in err and "it would run" in err and "toy_job.py" in err
    assert "--allow-commands" in err and not (tmp_path / "lab.sqlite").exists()
    assert main(["run", str(path), "--no-progress", "--allow-commands"]) == 0
    with cml.TrialStore(tmp_path / "lab.sqlite") as store:
        trials = store.trials("cli-cmd")
        assert [t.status for t in trials] == ["ok", "ok"], [t.error for t in trials]
        written = trials[0].hardware["job"]["config_file"]
        assert json.loads(written["text"]) == {"job": {"arg": trials[0].config["arg"]}}
        assert trials[0].hardware["job"]["argv"][-1].endswith("tmpl.json")


def test_campaign_file_checks_the_command_like_every_field(tmp_path):
    path = _campaign_file(tmp_path, [sys.executable, "{nope}"])
    with pytest.raises(ConfigError, match=r"\['nope'\].*not knobs of the space"):
        cml.Campaign.from_yaml(path)
    path = _campaign_file(tmp_path, "python train.py")
    with pytest.raises(ConfigError, match="camp.yaml: command: .*list of strings"):
        cml.Campaign.from_yaml(path, allow_commands=True)


def test_a_command_campaign_round_trips_through_its_file(tmp_path):
    path = _campaign_file(tmp_path, [sys.executable, TOY, "steps", "{arg}"])
    camp = cml.Campaign.from_yaml(path, allow_commands=True)
    again = cml.Campaign.from_yaml(camp.to_yaml(tmp_path / "again.yaml"), allow_commands=True)
    assert again.workload.to_spec() == camp.workload.to_spec()


@pytest.mark.slow
def test_the_job_dies_with_its_campaign(tmp_path):
    """SIGKILL the process running the campaign's launcher: the trial process dies with it
    (its guard), and the job with the trial process (the job's own guard)."""
    import signal
    import subprocess

    pidfile = tmp_path / "job.pid"
    job = toy("pidfile", str(pidfile))
    spec = {"workload": job.name, "command": job.to_spec(),
            "measure": {"max_time_s": 600, "min_steps": 10**6, "max_steps": 10**7}}
    code = ("import json, sys; from cubicml_lab.launch import Subprocess; "
            "Subprocess(timeout_s=600).run(json.loads(sys.argv[1]))")
    owner = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)])
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        job_pid = int(pidfile.read_text())
        start = process_start(job_pid)
        assert start is not None
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 15
        while is_running(job_pid, start) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_running(job_pid, start)
    finally:
        owner.kill()


# -- the physics prior on the user's own job --------------------------------------------------
@pytest.mark.slow
def test_llm_physics_prior_on_a_commands_own_knob_names(tmp_store):
    """The user's knob names map onto LLMTrainingModel's vocabulary; the model is the search's
    cost and memory model over a Command campaign (here a toy job stands in for the LLM)."""
    from cubicml_lab.physics import LLMTrainingModel

    space = cml.Space([cml.PowerOfTwo("tensor_par", 1, 8), cml.PowerOfTwo("micro_bs", 1, 8),
                       cml.Bool("act_ckpt")])
    physics = LLMTrainingModel(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000,
                               global_batch=256, n_gpus=8, gpu="H100-80GB",
                               names={"tensor_par": "tp", "micro_bs": "micro_batch",
                                      "act_ckpt": "recompute"},
                               values={"act_ckpt": {True: "full", False: "none"}})
    search = cml.BayesianSearch(space, seed=0, cost_model=physics.cost_terms,
                                memory_model=physics.memory_gib, memory_limit_gib=80)
    job = Command("llama-toy", argv=[sys.executable, TOY, "steps", "--tp={tensor_par}",
                                     "--mb={micro_bs}", "--ckpt={act_ckpt}"])
    camp = cml.Campaign("physics", space, workload=job, launcher=InProcess(), searcher=search,
                        store=tmp_store, measure_options=QUICK)
    first = camp.propose(1)[0]
    assert "prior" in first.reason and first.phase == "prior", first
    assert physics.memory_gib(first.config) <= 80  # the prior's pick fits under the limit
    big = {"tensor_par": 1, "micro_bs": 8, "act_ckpt": False}
    assert physics.memory_gib(big) > physics.memory_gib({**big, "tensor_par": 8,
                                                         "act_ckpt": True})
    camp.launch(first)
    trial = camp.trials()[0]
    assert trial.status == "ok", trial.error
    assert trial.hardware["job"]["argv"][3:] == [
        f"--tp={trial.config['tensor_par']}", f"--mb={trial.config['micro_bs']}",
        f"--ckpt={'true' if trial.config['act_ckpt'] else 'false'}"]


@pytest.mark.slow
def test_a_pytorch_job_over_the_memory_limit_is_oom():
    job = Command("big", argv=[sys.executable, LOOP, "--width={width}"], units="samples")
    res = run(job, {"width": 40_000}, launcher=Subprocess(timeout_s=120, memory_limit_gib=3))
    assert res.status == "oom", res.error
    assert "out-of-memory words" in res.error and "can't allocate memory" in res.error


@pytest.mark.slow
def test_local_pool_runs_a_command_pinned_to_its_slot():
    from cubicml_lab.launch import LocalPool

    pool = LocalPool(devices_per_trial=1, timeout_s=60)
    res = run(toy("steps"), launcher=pool)
    assert res.status == "ok", res.error
    assert len(res.hardware["cpu_affinity"].split(",")) == 1  # the trial's slot: one core


# -- torchtitan (needs a GPU, torchtitan installed and a checkout for its test assets) ---------
@pytest.mark.gpu
def test_torchtitan_recipe_on_a_gpu(tmp_store):
    """The torchtitan recipe over tp x local batch, under Torchrun on this node's GPUs. Run
    where a GPU is lent: ``TORCHTITAN_REPO=/path/to/torchtitan pytest -m gpu -k torchtitan``."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchtitan")
    repo = os.environ.get("TORCHTITAN_REPO")
    if not torch.cuda.is_available() or not repo:
        pytest.skip("needs CUDA and TORCHTITAN_REPO (a torchtitan checkout, for its assets)")
    from cubicml_lab.launch import Torchrun
    from cubicml_lab.workloads.recipes import TORCHTITAN_KEYS, torchtitan

    gpus = torch.cuda.device_count()
    space = cml.Space([cml.PowerOfTwo("tp", 1, min(2, gpus)),
                       cml.PowerOfTwo("micro_batch", 1, 4)])
    job = torchtitan("llama3-debug", Path(__file__).parents[1] / "examples" / "torchtitan" /
                     "llama3_debug.toml", {TORCHTITAN_KEYS[k]: k for k in space.names}, cwd=repo)
    camp = cml.Campaign("titan", space, workload=job, store=tmp_store,
                        launcher=Torchrun(nproc_per_node=gpus, timeout_s=600),
                        searcher=cml.RandomSearch(space, seed=0), device="cuda",
                        measure_options={"max_time_s": 20, "min_steps": 10})
    camp.run(budget=2)
    for t in camp.trials():
        assert t.status == "ok", t.error
        assert t.metrics["tokens_per_s"] > 0 and t.metrics["peak_mem_gib"] > 0
        assert "torchtitan" in t.hardware["job"]["packages"]


def test_torchtitan_recipe_writes_its_toml_per_trial():
    import tomllib

    from cubicml_lab.workloads.recipes import TORCHTITAN_KEYS, torchtitan

    toml = Path(__file__).parents[1] / "examples" / "torchtitan" / "llama3_debug.toml"
    job = torchtitan("t", toml, {TORCHTITAN_KEYS["tp"]: "tp", TORCHTITAN_KEYS["recompute"]: "ac"})
    out = job.render({"tp": 4, "ac": "full"}, trial_dir="/trial")
    data = tomllib.loads(out.config_text)
    assert data["parallelism"]["tensor_parallel_degree"] == 4
    assert data["activation_checkpoint"]["mode"] == "full"
    assert data["metrics"] == {"log_freq": 1, "disable_color_printing": True}
    assert data["model"]["flavor"] == "debugmodel" and job.metrics == ["torchtitan"]


# -- Slurm (a real one-node cluster: tests/slurm_cluster.py) ----------------------------------
@pytest.mark.slurm
@pytest.mark.timeout(400)
def test_command_trials_through_slurm(tmp_path, monkeypatch):
    """One Slurm job per trial: a single process, then two srun tasks whose torchrun agents
    start the job's two ranks (the multi-node path, on one node)."""
    from slurm_cluster import PACKAGES, missing_binaries, start_cluster

    from cubicml_lab.launch import Slurm

    if missing_binaries() or os.geteuid() != 0:
        pytest.skip(f"needs root and apt-get install {PACKAGES}")
    cluster = start_cluster()
    try:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        res = run(toy("steps"), launcher=Slurm(time_limit_min=5, folder=tmp_path, mem_gib=1))
        assert res.status == "ok", res.error
        assert res.metrics["samples_per_s"] > 0 and res.hardware["slurm"]["job_id"]
        job = Command("ddp", argv=[sys.executable, LOOP, "--batch=8"], units="samples")
        two = Slurm(time_limit_min=5, folder=tmp_path, mem_gib=2, nproc_per_node=2,
                    tasks_per_node=2)
        res = run(job, launcher=two)
        assert res.status == "ok", res.error
        argv = res.hardware["job"]["argv"]
        assert "--nnodes" in argv and argv[argv.index("--nnodes") + 1] == "2"
        assert res.metrics["samples_per_s"] > 0
        # node 0 reads its own rank; the two "nodes" are alike: 2 x 8 samples per step
        assert res.metrics["ranks_reported"] == 1 and res.metrics["units_per_step"] == 16
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_job_that_finishes_on_its_own_keeps_its_figure():
    job = Command("short", argv=[sys.executable, TOY, "junk"], units="samples")  # 400 steps
    res = run(job, measure={"max_time_s": 60, "min_steps": 5, "target_rel_ci": 1e-9,
                            "max_steps": 10**6})
    assert res.status == "ok", res.error
    assert res.hardware["job"]["ended"] == "exited" and res.hardware["job"]["exit_code"] == 0
    assert res.metrics["steps_timed"] > 300 and res.metrics["target_met"] == 0


def test_torchrun_wraps_a_script_a_module_or_a_program():
    from cubicml_lab.errors import LaunchError
    from cubicml_lab.launch.job import _under_torchrun

    opts = ["--nproc-per-node", "2"]
    assert _under_torchrun(["python", "train.py", "--a"], opts) == [
        "python", "-m", "torch.distributed.run", *opts, "train.py", "--a"]
    assert _under_torchrun(["/v/bin/python3", "-m", "torchtitan.train", "--x"], opts) == [
        "/v/bin/python3", "-m", "torch.distributed.run", *opts, "-m", "torchtitan.train", "--x"]
    assert _under_torchrun(["./run.sh", "a"], opts)[-4:] == [*opts[1:], "--no-python",
                                                              "./run.sh", "a"][-4:]
    with pytest.raises(LaunchError, match="already starts torchrun"):
        _under_torchrun(["torchrun", "--nproc-per-node=2", "train.py"], opts)
    with pytest.raises(LaunchError, match="script or -m module"):
        _under_torchrun(["python", "-u", "train.py"], opts)
    from cubicml_lab.launch import Torchrun

    res = run(Command("tr", argv=["torchrun", "x.py"]),
              launcher=Torchrun(nproc_per_node=2, timeout_s=60))
    assert res.status == "failed" and "already starts torchrun" in res.error


def test_measure_runs_one_command_trial():
    res = cml.measure(toy("steps", "{arg}"), {"arg": "x"}, measure_options=QUICK)
    assert res.status == "ok" and res.workload == "toy-steps", res.error
    with pytest.raises(ConfigError, match="needs a value"):
        cml.measure(toy("steps", "{arg}"), {})


def test_a_command_that_starts_torchrun_itself_counts_its_devices():
    from cubicml_lab.launch.job import _own_torchrun

    assert _own_torchrun(["torchrun", "--nproc_per_node=4", "--nnodes", "2", "t.py"]) == (8, 2)
    assert _own_torchrun(["python", "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--nnodes=1:3", "t.py"]) == (2, 1)
    assert _own_torchrun(["torchrun", "--nproc-per-node=gpu", "t.py"]) == (1, 1)
    assert _own_torchrun(["python", "t.py", "--nproc-per-node=4"]) == (1, 1)


@pytest.mark.slow
def test_subprocess_runs_a_jobs_own_torchrun_and_the_slowest_rank_counts():
    job = Command("own", argv=[sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2", LOOP, "--batch=4"], units="samples")
    res = run(job, launcher=Subprocess(timeout_s=180))
    assert res.status == "ok", res.error
    assert res.metrics["ranks_reported"] == 2 and res.metrics["units_per_step"] == 8
    assert res.metrics["n_devices"] == 2
