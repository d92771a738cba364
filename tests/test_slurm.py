"""launch.Slurm against a real one-node Slurm cluster (tests/slurm_cluster.py), through submitit.

Exercised for real: a tiny gpt trial that ends ``ok`` (with the overhead of going through Slurm
printed), one past its 1-minute time limit (``TIMEOUT`` -> ``timeout``; Slurm checks limits
about every 30 s, so it ends after 60-90 s and runs in the background while the others run), one
over its cgroup memory limit (``OUT_OF_MEMORY``, or ``FAILED`` by SIGKILL, -> ``oom``) and one
cancelled (``failed``).
Needs root and ``apt-get install slurm-wlm slurmdbd munge mariadb-server``; skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import PACKAGES, SlurmCluster, missing_binaries, node_state, start_cluster
from test_launch import FAST, TINY

from cubicml_lab.launch import Slurm
from cubicml_lab.launch.describe import launcher_from_dict
from cubicml_lab.launch.slurm import missed_oom
from cubicml_lab.trials import TrialResult

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

TINY_SPEC = {"workload": "gpt", "config": TINY, "device": "cpu", "measure": FAST}
LONG = {"max_time_s": 600, "min_steps": 10**6, "max_steps": 10**6, "warmup_max_s": 0.5}
LONG_SPEC = {"workload": "gpt", "config": TINY, "device": "cpu", "measure": LONG}
BIG = {"d_model": 1024, "n_layers": 4, "n_heads": 8, "seq_len": 256, "vocab": 32768,
       "micro_batch": 16}  # well over 1 GiB of weights, gradients, Adam state and activations


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (no {', '.join(missing)}): "
                    f"apt-get install {PACKAGES}")
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs its daemons as root (SlurmUser=root)")
    c = start_cluster()
    print(f"\nSlurm cluster up in {c.startup_s:.1f} s")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(c.conf))  # for sbatch/sacct run by submitit and the launcher
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture(scope="module")
def jobs_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slurm-jobs")


@pytest.fixture(scope="module")
def timed_out(cluster: SlurmCluster, jobs_folder: Path) -> Iterator[Future[TrialResult]]:
    """A trial past its 1-minute limit, started first and left running while others run: the
    tests that need the whole node (a node failure, two srun tasks) come last in this module."""
    with ThreadPoolExecutor(1) as pool:
        launcher = Slurm(time_limit_min=1, folder=jobs_folder, mem_gib=1)
        started = time.monotonic()
        future = pool.submit(launcher.run, LONG_SPEC)
        future.started = started  # type: ignore[attr-defined]
        yield future
        launcher.cancel()


def _wait_running(job_ids: list[str], cluster: SlurmCluster, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job_ids:
            out = cluster.command("squeue", "-h", "-j", job_ids[0], "-o", "%T").stdout.strip()
            if out == "RUNNING":
                return
        time.sleep(0.5)
    state = _sacct_state(cluster, job_ids[0]) if job_ids else "no job"
    raise AssertionError(f"job {job_ids} did not start in {timeout_s} s ({state}); slurmctld:\n"
                         f"{cluster.log_tail('slurmctld', 15)}\nslurmd:\n"
                         f"{cluster.log_tail('slurmd', 15)}")


def test_trial_through_slurm_ends_ok_with_metrics(cluster: SlurmCluster, jobs_folder: Path,
                                                   timed_out: Future[TrialResult]) -> None:
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    res = Slurm(time_limit_min=5, folder=jobs_folder, mem_gib=2).run(TINY_SPEC,
                                                                       on_start=records.append)
    took = time.monotonic() - t0
    assert res.status == "ok", res.error
    assert res.metrics["tokens_per_s"] > 0 and res.metrics["step_time_s"] > 0
    assert {k: res.config[k] for k in TINY} == TINY
    slurm = res.hardware["slurm"]
    assert slurm["job_id"] == records[0]["slurm_job_id"] and slurm["state"] == "COMPLETED"
    assert Path(slurm["stdout"]).exists() and Path(slurm["stderr"]).exists()
    assert TrialResult.from_json(res.to_json()).hardware["slurm"]["job_id"] == slurm["job_id"]
    print(f"\nSlurm trial ok in {took:.1f} s: submit to start {slurm['submit_to_start_s']:.2f} s, "
          f"end to result {slurm['end_to_result_s']:.2f} s, trial {res.wall_s:.2f} s")
    assert slurm["submit_to_start_s"] > 0 and slurm["end_to_result_s"] > 0


def test_trial_over_its_memory_limit_ends_oom(cluster: SlurmCluster, jobs_folder: Path) -> None:
    # A cgroup is charged for the page-cache pages its processes read first. Were torch's
    # libraries not cached yet (a cold machine, this test alone), the job would be charged for
    # them, and at its limit the kernel would drop and re-read their pages for minutes instead
    # of killing it (seen once here after a reboot); importing torch out here caches them.
    subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=120)
    spec = {"workload": "gpt", "config": BIG, "device": "cpu", "measure": FAST}
    res = Slurm(time_limit_min=5, folder=jobs_folder, mem_gib=0.5).run(spec)
    steps = res.hardware["slurm"]["steps"]
    assert res.status == "oom", (res.error, steps)
    # Slurm records OUT_OF_MEMORY when its cgroup v1 OOM event wins the race with the step's end;
    # when it loses (seen once in CI), the launcher reads the kill from sacct's exit codes or logs
    evidence = res.hardware["slurm"].get("oom_evidence")
    assert ("OUT_OF_MEMORY" in steps.values()) != bool(evidence), (steps, evidence)
    assert res.metrics == {}
    print(f"\nOOM job states: {steps}" + (f"; Slurm missed the OOM event: {evidence}"
                                           if evidence else ""))


def test_cancelled_trial_ends_failed(cluster: SlurmCluster, jobs_folder: Path) -> None:
    launcher = Slurm(time_limit_min=5, folder=jobs_folder, mem_gib=1)
    job_ids: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(launcher.run, LONG_SPEC,
                             on_start=lambda rec: job_ids.append(rec["slurm_job_id"]))
        _wait_running(job_ids, cluster)
        threading.Timer(0, launcher.cancel).start()
        res = future.result(timeout=60)
    assert res.status == "failed" and "CANCELLED" in res.error
    assert res.hardware["slurm"]["job_id"] == job_ids[0]


def test_a_losing_command_trial_ends_its_slurm_job_early(cluster: SlurmCluster,
                                                         jobs_folder: Path,
                                                         tmp_path: Path) -> None:
    """A user's command given a best it cannot beat (``spec["beat"]``, as
    ``Campaign.run(early_stop=True)`` gives it): its trial, inside the allocation, stops the job
    as losing after 6 windows instead of its 30 s, and the Slurm job ends with it."""
    from cubicml_lab.launch.process import process_start
    from cubicml_lab.workloads import Command

    toy = str(Path(__file__).resolve().parent / "jobs" / "toy_job.py")
    pidfile = tmp_path / "job.pid"
    job = Command("toy-pid", argv=[sys.executable, toy, "pidfile", str(pidfile)],
                  units="samples", env={"TOY_STEP_S": "0.02"})
    spec = {"workload": job.name, "config": {}, "command": job.to_spec(),
            "measure": {"max_time_s": 30, "target_rel_ci": 1e-9, "min_steps": 5,
                        "max_steps": 10**5},
            "beat": {"objective": "step_time_s", "value": 0.005, "direction": "minimize"}}
    res = Slurm(time_limit_min=5, folder=jobs_folder, mem_gib=1).run(spec)
    assert res.status == "ok", res.error
    assert res.hardware["job"]["ended"] == "losing" and res.metrics["stopped_early"] == 1.0
    slurm = res.hardware["slurm"]
    assert slurm["state"] == "COMPLETED" and _sacct_state(cluster, slurm["job_id"]) == "COMPLETED"
    assert res.metrics["job_wall_s"] < 10 and slurm["trial_ended_at"] - slurm["job_started_at"] < 20
    pid = int(pidfile.read_text())
    assert process_start(pid) is None, f"the job's process {pid} outlived its Slurm job"


def test_a_failed_job_is_oom_only_on_slurms_oom_notice_or_a_sigkill() -> None:
    # the notice slurmstepd printed for a real OOM job of the test above
    notice = ("slurmstepd-localhost: error: Detected 1 oom-kill event(s) in StepId=45919464.0. "
              "Some of your processes may have been killed by the cgroup out-of-memory handler.")
    why = missed_oom(f"loading\n{notice}\n", {"7": "1:0", "7.batch": "1:0", "7.0": "0:125"})
    assert why is not None and "oom-kill event" in why
    # Slurm missed the event: no notice, and the step died by signal 9 (as in CI's run)
    why = missed_oom("srun: error: localhost: task 0: Killed\n",
                     {"7": "1:0", "7.batch": "1:0", "7.0": "0:9"})
    assert why is not None and "7.0" in why and "SIGKILL" in why
    # a trial that crashed on its own, by an exception or a segfault, stays failed
    assert missed_oom("Traceback (most recent call last):\nValueError: bad\n",
                      {"7": "1:0", "7.batch": "1:0", "7.0": "1:0"}) is None
    assert missed_oom("srun: error: localhost: task 0: Segmentation fault\n",
                      {"7": "1:0", "7.batch": "1:0", "7.0": "0:11"}) is None
    assert missed_oom("", {}) is None


def test_describe_round_trips_and_bad_options_fail() -> None:
    launcher = Slurm(partition="gpu", account="lab", qos="high", time_limit_min=30,
                     gpus_per_node=8, cpus_per_node=32, mem_gib=64,
                     extra_sbatch={"constraint": "a100"}, setup=["module load cuda"])
    assert launcher_from_dict(launcher.describe()).describe() == launcher.describe()
    params = launcher.sbatch_parameters()
    assert params["mem"] == "65536M" and params["gpus_per_node"] == 8
    assert params["additional_parameters"] == {"constraint": "a100", "no_requeue": True}
    from cubicml_lab.errors import ConfigError

    with pytest.raises(ConfigError, match="time_limit_min"):
        Slurm(time_limit_min=0)
    with pytest.raises(ConfigError, match="setup"):
        Slurm(setup="module load cuda")  # type: ignore[arg-type]


def test_missing_submitit_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from cubicml_lab.errors import DependencyError

    monkeypatch.setitem(sys.modules, "submitit", None)  # what an absent package looks like
    with pytest.raises(DependencyError, match="submitit") as info:
        Slurm().run(TINY_SPEC)
    assert "pip install -e '.[slurm]'" in str(info.value.hint)


def test_importing_the_package_does_not_import_submitit() -> None:
    import subprocess
    import sys

    code = "import sys, cubicml_lab.launch; print('submitit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------- campaigns through Slurm
# about 10 s of timing: never stopped early by its CI target (1e-9), nor by max_steps
MID = {"max_time_s": 10, "target_rel_ci": 1e-9, "max_steps": 10**6, "warmup_max_s": 0.5}
CAMPAIGN_SCRIPT = """
import sys
import cubicml_lab as cml
from cubicml_lab.launch import Slurm
space = cml.Space([cml.Choice("micro_batch", [1, 2, 4, 8])])
camp = cml.Campaign("slurm-kill", space, workload="gpt", searcher=cml.RandomSearch(space, seed=0),
                    launcher=Slurm(time_limit_min=5, folder=sys.argv[2], mem_gib=1),
                    store=cml.TrialStore(sys.argv[1]), fixed=%r, measure_options=%r)
camp.run(budget=1, progress=False)
""" % ({k: v for k, v in TINY.items() if k != "micro_batch"}, MID)


def _campaign(store_path: Path, folder: Path, name: str, measure: dict[str, Any],
              **slurm: Any) -> Any:
    import cubicml_lab as cml

    space = cml.Space([cml.Choice("micro_batch", [1, 2, 4, 8])])
    return cml.Campaign(name, space, workload="gpt", searcher=cml.RandomSearch(space, seed=0),
                        launcher=Slurm(time_limit_min=5, folder=folder, mem_gib=1, **slurm),
                        store=cml.TrialStore(store_path),
                        fixed={k: v for k, v in TINY.items() if k != "micro_batch"},
                        measure_options=measure)


def _sacct_state(cluster: SlurmCluster, job_id: str) -> str:
    """The job's state: squeue's while it is queued or running, then sacct's."""
    out = cluster.command("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip()
    if not out:
        out = cluster.command("sacct", "-j", job_id, "-n", "-X", "-P", "-o", "State").stdout
    return (out.split() or [""])[0]


def _running_trial(store_path: Path, timeout_s: float = 60) -> Any:
    """The campaign's trial once the store says it runs as a Slurm job."""
    import cubicml_lab as cml

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if store_path.exists():
            with cml.TrialStore(store_path) as store:
                for t in store.trials():
                    if t.status == "running" and "slurm_job_id" in (t.hardware or {}).get(
                            "process", {}):
                        return t
        time.sleep(0.2)
    raise AssertionError(f"no trial running as a Slurm job in {timeout_s} s")


def test_campaign_of_four_trials_runs_through_slurm(cluster: SlurmCluster, jobs_folder: Path,
                                                    tmp_path: Path) -> None:
    camp = _campaign(tmp_path / "lab.sqlite", jobs_folder, "slurm-four", FAST)
    t0 = time.monotonic()
    df = camp.run(budget=4, parallel=2, progress=False)
    took = time.monotonic() - t0
    assert list(df["status"]) == ["ok"] * 4, df.get("error")
    jobs = [t.hardware["slurm"]["job_id"] for t in camp.trials()]
    assert len(set(jobs)) == 4
    assert sorted(t.config["micro_batch"] for t in camp.trials()) == [1, 2, 4, 8]
    assert {_sacct_state(cluster, j) for j in jobs} == {"COMPLETED"}
    print(f"\n4 trials through Slurm, 2 at a time, in {took:.1f} s (jobs {jobs})")


def _start_and_kill_campaign(store_path: Path, folder: Path, cluster: SlurmCluster) -> Any:
    """Run CAMPAIGN_SCRIPT, SIGKILL it once its trial runs as a job; the job must live on."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", CAMPAIGN_SCRIPT, str(store_path),
                             str(folder)], env={**os.environ})
    try:
        trial = _running_trial(store_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    job_id = trial.hardware["process"]["slurm_job_id"]
    time.sleep(1)
    assert _sacct_state(cluster, job_id) in ("PENDING", "RUNNING"), "the job died with its caller"
    return trial


def test_restarted_campaign_collects_the_job_its_killed_run_left(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    trial = _start_and_kill_campaign(tmp_path / "lab.sqlite", folder, cluster)
    job_id = trial.hardware["process"]["slurm_job_id"]
    camp = _campaign(tmp_path / "lab.sqlite", folder, "slurm-kill", MID)
    assert [p.phase for p in camp.propose(1)] == ["resumed"]
    df = camp.run(budget=1, progress=False)
    assert list(df["status"]) == ["ok"], df.get("error")
    done = camp.trials()[0]
    assert done.id == trial.id and done.hardware["slurm"]["job_id"] == job_id
    assert done.hardware["slurm"]["attached"] is True
    assert done.hardware["process"]["pid"] == os.getpid()  # taken over by this process
    jobs = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert jobs == [job_id], "a job was launched again"


def test_stop_cancels_a_running_campaigns_job_and_a_dead_runs_job(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    store_path, folder = tmp_path / "lab.sqlite", tmp_path / "jobs"
    camp = _campaign(store_path, folder, "slurm-stop", LONG)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(camp.run, 1, progress=False)
        trial = _running_trial(store_path)
        job_id = trial.hardware["process"]["slurm_job_id"]
        _wait_running([job_id], cluster)
        camp.stop()
        future.result(timeout=60)
    assert camp.stop_reason == "stopped by Campaign.stop()"
    assert camp.store.get_trial(trial.id).status == "pending"
    deadline = time.monotonic() + 30
    while _sacct_state(cluster, job_id) != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _sacct_state(cluster, job_id) == "CANCELLED"

    # a run killed while its job runs; stop() on the campaign read back cancels that job
    killed = _start_and_kill_campaign(tmp_path / "killed.sqlite", folder, cluster)
    orphan = killed.hardware["process"]["slurm_job_id"]
    again = _campaign(tmp_path / "killed.sqlite", folder, "slurm-kill", MID)
    again.stop()
    assert again.store.get_trial(killed.id).status == "pending"
    deadline = time.monotonic() + 30
    while _sacct_state(cluster, orphan) != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _sacct_state(cluster, orphan) == "CANCELLED"


def test_trial_past_its_time_limit_ends_timeout(timed_out: Future[TrialResult]) -> None:
    res = timed_out.result(timeout=150)
    took = time.monotonic() - timed_out.started  # type: ignore[attr-defined]
    assert res.status == "timeout", res.error
    assert res.hardware["slurm"]["state"] == "TIMEOUT" and "time limit" in res.error
    print(f"\n1-minute limit: timeout after {took:.0f} s")
    assert 55 < took < 150


def _running_job(cluster: SlurmCluster, seen: list[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = cluster.command("squeue", "-h", "-t", "RUNNING", "-o", "%i").stdout.split()
        fresh = [j for j in out if j not in seen]
        if fresh:
            return fresh[0]
        time.sleep(0.5)
    raise AssertionError(f"no new running job in {timeout_s} s (seen {seen})")


def _fail_node(cluster: SlurmCluster) -> None:
    """Mark the node down (its jobs end NODE_FAIL) and wait until it takes jobs again."""
    cluster.command("scontrol", "update", "nodename=localhost", "state=down",
                    "reason=cubicml test")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = node_state(cluster)
        if state in ("idle", "mixed", "allocated", "planned"):
            return
        if time.monotonic() > deadline - 15:
            cluster.command("scontrol", "update", "nodename=localhost", "state=resume")
        time.sleep(0.5)
    raise AssertionError(f"node still {state} after a failure")


def test_node_failure_is_submitted_again_up_to_the_limit(
        cluster: SlurmCluster, jobs_folder: Path, timed_out: Future[TrialResult]) -> None:
    timed_out.result(timeout=150)  # a node failure ends every job on the node: let it end first
    launcher = Slurm(time_limit_min=5, folder=jobs_folder, mem_gib=1, max_requeue=1)
    seen = cluster.command("squeue", "-h", "-o", "%i").stdout.split()  # jobs not ours
    others = len(seen)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(launcher.run, LONG_SPEC)
        try:
            for _ in range(2):  # the first failure is submitted again, the second is final
                seen.append(_running_job(cluster, seen))
                _fail_node(cluster)
            res = future.result(timeout=60)
        finally:
            launcher.cancel()
    slurm = res.hardware["slurm"]
    assert res.status == "failed" and slurm["state"] == "NODE_FAIL", res.error
    assert slurm["attempts"] == 2 and slurm["job_id"] == seen[others + 1]
    time.sleep(2)  # Slurm's own requeue of a failed node's job would show it pending again
    left = cluster.command("squeue", "-h", "-o", "%i").stdout.split()
    assert not set(left) & set(seen[others:]), f"a failed job came back: {left}"


GPT2 = {"d_model": 32, "n_layers": 2, "n_heads": 4, "seq_len": 16, "vocab": 128,
        "micro_batch": 2, "threads": 1, "lr": 1e-2}


def test_two_srun_tasks_each_start_torchrun(cluster: SlurmCluster, jobs_folder: Path) -> None:
    from cubicml_lab.launch import measure

    launcher = Slurm(time_limit_min=5, folder=jobs_folder, mem_gib=2, nproc_per_node=2,
                     tasks_per_node=2)
    assert launcher.sbatch_parameters()["ntasks_per_node"] == 2 and launcher.world_size == 2
    res = measure("gpt", {**GPT2, "dp_shard": -1}, launcher=launcher, measure_options=FAST)
    assert res.status == "ok", res.error
    assert res.hardware["world_size"] == 2 and res.hardware["parallel"]["strategy"] == "fsdp"
    assert res.metrics["n_devices"] == 2
    slurm = res.hardware["slurm"]
    job = slurm["job_id"]
    assert slurm["steps"].get(f"{job}.0") == "COMPLETED", slurm["steps"]
    logs = sorted(p.name for p in (jobs_folder / job).glob("*_log.out"))
    assert logs == [f"{job}_0_log.out", f"{job}_1_log.out"]  # one per srun task
    print(f"\n2 srun tasks x torchrun: {res.metrics['tokens_per_s']:.0f} tokens/s, "
          f"submit to start {slurm['submit_to_start_s']:.2f} s")


def test_interrupt_cancels_the_job_requeues_the_trial_and_stops_the_script(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    """Ctrl-C while a campaign's trial runs as a Slurm job: the job is cancelled, the trial is
    pending again, and run() raises KeyboardInterrupt, so the statement after it never runs."""
    import signal
    import subprocess
    import sys

    import cubicml_lab as cml

    script = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              + CAMPAIGN_SCRIPT.replace('"slurm-kill"', '"slurm-int"').replace(repr(MID),
                                                                              repr(LONG))
              + "print('the next statement ran')\n")
    store_path = tmp_path / "lab.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", script, str(store_path),
                             str(tmp_path / "jobs")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        trial = _running_trial(store_path)
        job_id = trial.hardware["process"]["slurm_job_id"]
        _wait_running([job_id], cluster)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGINT, (out, err[-2000:])
    assert "the next statement ran" not in out
    assert err.strip().splitlines()[-1] == (
        "KeyboardInterrupt: slurm-int: interrupted; 1 trial in flight was stopped and re-queued "
        "(run again to resume)"), err[-2000:]
    deadline = time.monotonic() + 30
    while _sacct_state(cluster, job_id) != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _sacct_state(cluster, job_id) == "CANCELLED"
    with cml.TrialStore(store_path) as store:
        assert store.get_trial(trial.id).status == "pending"
