"""End-to-end: real campaigns of real GPT training trials on the CPU, stored in SQLite."""

from __future__ import annotations

import math
import os
import sys

import pytest
from interrupting import CAMPAIGN_SOURCE, trial_running

import cubicml_lab as cml
from cubicml_lab.errors import ConfigError, StoreError
from cubicml_lab.trials import figure_flag

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
def test_real_four_trial_campaign_end_to_end(gpt_space, tmp_path):
    """Four real trials, each in a fresh subprocess, BO after an initial design of three, all
    stored."""
    path = tmp_path / "lab.sqlite"
    store = cml.TrialStore(path)
    camp = make("e2e", gpt_space, store, launcher=cml.launch.Subprocess(timeout_s=120),
                searcher=cml.BayesianSearch(gpt_space, seed=0, n_init=3))
    df = camp.run(budget=4, progress=False, full=True)  # every field: fixed knobs, hardware
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert camp.searcher.last_ask_info["phase"] == "bo"  # the fourth is the GP's
    keys = [gpt_space.key({n: r[n] for n in gpt_space.names}) for _, r in df.iterrows()]
    assert len(set(keys)) == 4, "a configuration was measured twice"
    assert (df["tokens_per_s"] > 0).all() and (df["step_time_s"] > 0).all()
    assert (df["d_model"] == 32).all(), "fixed knobs must reach the workload and the record"
    assert df["hw.hostname"].notna().all()
    # tokens/s is consistent with the measured step time and the tokens per step
    tokens = df["micro_batch"] * 32
    assert ((df["tokens_per_s"] * df["step_time_s"] / tokens - 1).abs() < 1e-6).all()
    best_cfg, best_value = camp.best()
    # the best unflagged trial: one the guard flagged (measured beside other work, as on a VM
    # whose host takes its CPUs) or timed in too few windows for an interval is not taken as
    # the best while a clean one exists
    trials = store.trials("e2e")
    clean = [t for t in trials if figure_flag(t.metrics) is None] or trials
    assert best_value == max(t.metrics["throughput"] for t in clean)
    store.close()
    # the file on disk holds the same, for a fresh reader
    with cml.TrialStore(path) as again:
        assert len(again.trials("e2e")) == 4


@pytest.mark.slow
@pytest.mark.timeout(300)  # the bug this guards against was a trial started again and again
def test_a_campaign_stores_trials_measured_in_two_processes_each(gpt_space, tmp_store):
    launcher = cml.launch.Repeated(cml.launch.Subprocess(timeout_s=120), processes=2)
    camp = make("twice", gpt_space, tmp_store, launcher=launcher)
    df = camp.run(budget=2, progress=False, verbose=False, full=True)
    assert list(df["status"]) == ["ok", "ok"] and (df["processes"] == 2).all()
    for trial in tmp_store.trials("twice"):
        first, second = trial.hardware["processes"]
        assert first["pid"] != second["pid"]
        assert trial.hardware["process"]["pid"] == second["pid"]  # the record followed it
    again = cml.Campaign.from_yaml(camp.to_yaml(tmp_store.path.parent / "twice.yaml"))
    assert again.launcher.describe() == launcher.describe()


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
    # three configurations (d_model 1024 with micro_batch 1 only: a second timeout would add 15 s
    # and show nothing more); all three run, so a failure told and proposed again would leave
    # one of them out. The sequence grows with the width, so the small trials stay cheap and the
    # large one is heavy on any CPU.
    space = cml.Space([cml.Ordinal("d_model", [32, 1024]), cml.PowerOfTwo("micro_batch", 1, 2)],
                      derived={"seq_len": "4 * d_model"},
                      constraints=["d_model * micro_batch <= 1024"])
    # 100 timed steps: a second or two for d_model 32 (the interpreter's start dominates, and a
    # loaded machine gets 15 s for it). d_model 1024 at 4,096 tokens is about 4 TFLOP a step
    # (6 x 100M parameters x 4,096 tokens, plus attention),
    # 400 TFLOP in all: minutes even on a CPU server that does several TFLOP/s (a
    # sequence of 512 took under 15 s on one), so it times out
    launcher = cml.launch.Subprocess(timeout_s=15)
    camp = cml.Campaign("fail", space, workload="gpt", launcher=launcher,
                        searcher=cml.RandomSearch(space, seed=0), store=tmp_store,
                        measure_options={"max_time_s": 0.3, "warmup_max_s": 0.5, "min_steps": 100,
                                         "max_steps": 100},
                        fixed={"n_layers": 8, "vocab": 128, "n_heads": 2})
    df = camp.run(budget=3, progress=False, verbose=False)
    status = dict(zip(df["d_model"].astype(str) + "/" + df["micro_batch"].astype(str), df["status"]))
    assert status == {"1024/1": "timeout", "32/1": "ok", "32/2": "ok"}, status
    assert len(df) == 3 and camp.stop_reason == "budget reached"
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


def test_a_bar_stopped_by_the_campaigns_rule_ends_green_at_the_trials_it_ran():
    """tqdm's notebook bar turns red when closed short of its total, as after a failure: a
    campaign that stops by its own rule ends its bar at the trials it ran, and says why."""
    pytest.importorskip("ipywidgets")
    from tqdm.notebook import tqdm as notebook_bar

    from cubicml_lab.campaign.loop import _end_bar_early

    stopped = notebook_bar(total=16, desc="rule", leave=True)
    stopped.update(11)
    _end_bar_early(stopped, "the searcher's stopping rule fired: no expected improvement")
    stopped.close()
    _, bar, text = stopped.container.children
    shown = text.value.replace("\u2007", " ")  # tqdm pads the HTML with figure spaces
    assert (bar.bar_style, bar.max, bar.value) == ("success", 11, 11)
    assert "11/11" in shown and "stopped: the searcher" in shown
    failed = notebook_bar(total=16, desc="interrupted", leave=True)  # left alone: red
    failed.update(3)
    failed.close()
    assert failed.container.children[1].bar_style == "danger"


@pytest.mark.slow
def test_an_exhausted_space_ends_the_text_bar_at_its_trials(tmp_store, capfd):
    space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 2)])
    camp = cml.Campaign("bar", space, workload="gpt", launcher=cml.launch.InProcess(),
                        searcher=cml.RandomSearch(space, seed=0), store=tmp_store,
                        measure_options=FAST, fixed=TINY)
    camp.run(budget=5, verbose=False)
    last = capfd.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "2/2" in last and "stopped: search space exhausted" in last, last


# -- steering by hand: propose, launch, skip, edit; interrupts ----------------------------------
@pytest.mark.slow
def test_review_loop_launch_skip_edit_and_resume(gpt_space, tmp_store):
    """The loop a person steers: each proposal is launched, skipped or edited before it runs."""
    default = {"micro_batch": 1, "precision": "fp32", "recompute": "none"}
    camp = cml.Campaign("steer", gpt_space, workload="gpt", launcher=cml.launch.InProcess(),
                        searcher=cml.BayesianSearch(gpt_space, seed=0, n_init=3),
                        store=tmp_store, measure_options=FAST, fixed=TINY, reference=default)
    events = []
    camp.observe(lambda event, payload: events.append(event))
    [first] = camp.propose()
    assert first.phase == "enqueued" and first.config == default and camp.proposals == [first]
    trial = camp.launch(first, verbose=False)
    assert trial.status == "ok" and camp.proposals == []
    assert events == ["proposed", "started", "finished"]
    [skipped] = camp.propose()
    camp.skip(skipped)
    assert tmp_store.trials("steer")[-1].id == trial.id, "a skip runs nothing"
    [p] = camp.propose()
    edited = {**p.config, "recompute": "full" if p.config["recompute"] == "none" else "none"}
    if gpt_space.key(edited) == gpt_space.key(skipped.config):
        edited["precision"] = "bf16" if edited["precision"] == "fp32" else "fp32"
    ran = camp.launch(p, config=edited, verbose=False)
    assert {n: ran.config[n] for n in gpt_space.names} == edited
    with pytest.raises(ConfigError, match="micro_batch"):
        camp.launch({**edited, "micro_batch": 3})
    df = camp.run(budget=6, progress=False, verbose=False)
    keys = {gpt_space.key({n: r[n] for n in gpt_space.names}) for _, r in df.iterrows()}
    assert len(df) == 6 and gpt_space.key(skipped.config) not in keys
    assert camp.summary()["reference"] == df.loc[df["trial_id"] == trial.id, "throughput"].item()
    # read back from the store: the skip and the reference survive, every trial is told
    again = cml.Campaign.from_store(tmp_store, "steer", launcher=cml.launch.InProcess())
    assert again.searcher.n_told == 6 and again.reference == default
    assert again.searcher.skipped == [gpt_space.key(skipped.config)]
    for p in again.searcher.propose(gpt_space.size() - 6 - 1):
        assert gpt_space.key(p.config) != gpt_space.key(skipped.config)
    assert "steer" in again._repr_html_() and "speed-up" in str(again)


def test_bayesian_proposals_carry_prediction_interval_and_feasibility():
    space = cml.Space([cml.Int("micro_batch", 1, 32), cml.Choice("recompute", ["none", "full"])])
    search = cml.BayesianSearch(space, seed=0, n_init=4)
    [p] = search.propose()
    assert p.phase == "initial" and p.predicted is None and "space-filling" in p.reason
    for cfg in [p.config] + search.ask(5):
        if cfg["micro_batch"] > 28:
            search.tell(cfg, None, status="oom")
        else:
            speed = 100.0 * cfg["micro_batch"] * (0.7 if cfg["recompute"] == "full" else 1.0)
            search.tell(cfg, {"throughput": speed})
    [p] = search.propose()
    assert p.phase == "bo" and p.acquisition is not None
    assert p.lower < p.predicted < p.upper
    assert 0.0 <= p.p_feasible <= 1.0, "an oom was told: P(fits) must be given"
    assert "expected improvement" in p.reason and "P(runs)" in p.reason
    assert p.summary()["P(fits)"] == p.p_feasible and "P(fits)" in p._repr_html_()


def test_resumed_trial_is_pending_for_the_searcher(gpt_space, tmp_store):
    """An interrupted trial is run again first and never proposed a second time beside it."""
    camp = make("resume2", gpt_space, tmp_store, searcher=cml.RandomSearch(gpt_space, seed=0))
    orphan = tmp_store.add_trial("resume2", {**TINY, "micro_batch": 8, "precision": "fp32",
                                             "recompute": "none"}, workload="gpt")
    tmp_store.mark_running(orphan)
    proposals = camp.propose(gpt_space.size())
    assert proposals[0].trial_id == orphan and proposals[0].phase == "resumed"
    keys = [gpt_space.key(p.config) for p in proposals]
    assert len(keys) == len(set(keys)) == gpt_space.size()
    assert tmp_store.get_trial(orphan).status == "pending"


INTERRUPT_SCRIPT = """
import signal, sys
# as in a terminal or a Jupyter kernel: a pytest started in the background (`make test &` in a
# shell without job control) ignores SIGINT, and its children inherit that
signal.signal(signal.SIGINT, signal.default_int_handler)
""" + CAMPAIGN_SOURCE.replace("STORE_PATH", "sys.argv[1]") + """
df = camp.run(budget=2, progress=False)
print("the next statement ran", len(df), camp.stop_reason)
"""


def _descendants(pid):
    """Live processes below ``pid`` (read from /proc)."""
    import pathlib

    parent = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, ppid in parent.items() if ppid in frontier}
        found += sorted(frontier)
    return [str(p) for p in found]


@pytest.mark.slow
def test_interrupt_stops_the_script_after_requeueing(tmp_path):
    """SIGINT (Ctrl-C) during a trial: the trial's process is killed, the trial is back to
    pending (to run first on the next run), and run() raises KeyboardInterrupt with one line,
    so the statement after it never runs."""
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "lab.sqlite"
    script = tmp_path / "run.py"
    script.write_text(INTERRUPT_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not trial_running(path):
        time.sleep(0.5)
    time.sleep(3)  # the trial process is importing torch or training now
    children = _descendants(proc.pid)  # this campaign's trial guard and worker, no other's
    assert children, "the trial process should be running"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT, (proc.returncode, out, err)  # as after any Ctrl-C
    assert "the next statement ran" not in out
    assert err.strip().splitlines()[-1] == (
        "KeyboardInterrupt: int: interrupted; 1 trial in flight was "
        "stopped and re-queued (run again to resume)"), err
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().split()[2] == "Z", "the trial process survived"
    with cml.TrialStore(path) as store:
        [trial] = store.trials("int")
        assert trial.status == "pending"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kernel_interrupt_stops_run_all(tmp_path):
    """Kernel -> Interrupt in a real Jupyter kernel while ``camp.run()`` runs, with the next
    cell queued as *Run All* queues it: neither the rest of the cell nor the next cell runs, the
    cell's error is one line, and the trial is back to pending in the store."""
    import time

    jupyter_client = pytest.importorskip("jupyter_client")
    pytest.importorskip("ipykernel")
    path, after, next_cell = (tmp_path / "lab.sqlite", tmp_path / "after-run",
                              tmp_path / "next-cell")
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        setup = kc.execute_interactive(CAMPAIGN_SOURCE.replace("STORE_PATH", repr(str(path))),
                                       timeout=60)
        assert setup["content"]["status"] == "ok", setup["content"]
        run_id = kc.execute(f"df = camp.run(budget=2, progress=False)\n"
                            f"open({str(after)!r}, 'w').close()")
        next_id = kc.execute(f"open({str(next_cell)!r}, 'w').close()")  # queued, as by Run All
        deadline = time.monotonic() + 120
        while not trial_running(path):
            assert time.monotonic() < deadline, "the trial never started"
            time.sleep(0.5)
        time.sleep(2)
        km.interrupt_kernel()
        replies = {}
        while len(replies) < 2:
            msg = kc.get_shell_msg(timeout=60)
            replies[msg["parent_header"]["msg_id"]] = msg["content"]
        assert replies[run_id]["status"] == "error"
        assert replies[run_id]["ename"] == "KeyboardInterrupt"
        assert replies[run_id]["traceback"] == [
            "KeyboardInterrupt: int: interrupted; 1 trial in flight was stopped and re-queued "
            "(run again to resume)"]
        assert replies[next_id]["status"] == "aborted"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert not after.exists() and not next_cell.exists()
    with cml.TrialStore(path) as store:
        [trial] = store.trials("int")
        assert trial.status == "pending"


# -- nothing lost: a killed campaign, orphaned trial processes, resume at any parallel ----------
FAKE_TRIAL = """\
#!{python}
import json, os, sys, time
argv = sys.argv[1:]
spec = json.load(open(argv[argv.index("--spec") + 1]))
mb = spec["config"]["micro_batch"]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(f"start {{mb}} {{os.getpid()}} {{time.time()}}\\n")
time.sleep(600 if os.path.exists(os.environ["FAKE_HANG"]) else 0.4)
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(f"end {{mb}} {{os.getpid()}} {{time.time()}}\\n")
json.dump({{"status": "ok", "metrics": {{"throughput": 100.0 * mb}}, "hardware": {{}},
           "workload": "gpt", "config": spec["config"]}},
          open(argv[argv.index("--result") + 1], "w"))
"""
KILLED_CAMPAIGN = """
import sys, cubicml_lab as cml
path, budget, parallel, fake = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 64)])
camp = cml.Campaign("k", space, workload="gpt", store=cml.TrialStore(path),
                    launcher=cml.launch.Subprocess(python=fake, timeout_s=600),
                    searcher=cml.RandomSearch(space, seed=0))  # same seed: same first proposals
camp.run(budget, parallel, progress=False, verbose=False)
"""


def _alive(pid):
    """True if ``pid`` exists and is not a zombie (pid 1 here may never reap orphans)."""
    import pathlib

    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _log(path):
    """``[(event, micro_batch, pid, time)]`` written by FAKE_TRIAL."""
    if not path.exists():
        return []
    return [(e, int(mb), int(pid), float(t)) for e, mb, pid, t in
            (line.split() for line in path.read_text().splitlines())]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("parallel", [2, 3])
def test_killed_campaign_ends_its_trials_and_resumes_each_one_once(tmp_path, parallel):
    """SIGKILL a campaign while its trials hang: the trial processes are gone within a couple
    of seconds and leave no folder; the resumed campaign (same seed: its searcher would propose
    the interrupted configurations first) runs each interrupted configuration once."""
    import os
    import pathlib
    import subprocess
    import time

    fake, hang, log, tmp = (tmp_path / "py", tmp_path / "hang", tmp_path / "log",
                            tmp_path / "tmp")
    fake.write_text(FAKE_TRIAL.format(python=sys.executable))
    fake.chmod(0o755)
    hang.touch()
    tmp.mkdir()
    env = {**os.environ, "FAKE_LOG": str(log), "FAKE_HANG": str(hang), "TMPDIR": str(tmp)}
    args = [sys.executable, "-c", KILLED_CAMPAIGN, str(tmp_path / "lab.sqlite"), "6",
            str(parallel), str(fake)]
    proc = subprocess.Popen(args, env=env)
    deadline = time.monotonic() + 120
    while len(_log(log)) < parallel:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    hung = [pid for _, _, pid, _ in _log(log)]
    guards = [int(pathlib.Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
              for p in hung]
    proc.kill()
    proc.wait()
    killed_at = time.time()
    while any(map(_alive, hung + guards)) or list(tmp.iterdir()):
        assert time.time() - killed_at < 2.0, "a trial process or its folder outlived the kill"
        time.sleep(0.02)
    interrupted = {mb for _, mb, _, _ in _log(log)}
    assert len(interrupted) == parallel
    hang.unlink()
    subprocess.run(args, env=env, check=True, timeout=300)
    events = _log(log)
    resumed = [mb for e, mb, _, t in events if e == "start" and t > killed_at]
    assert sorted(m for m in resumed if m in interrupted) == sorted(interrupted)
    assert len(resumed) == len(set(resumed)) == 6
    spans = {}  # pid -> [mb, start, end]; a killed trial ended when its campaign was killed
    for e, mb, pid, t in events:
        spans.setdefault(pid, [mb, t, killed_at])[1 if e == "start" else 2] = t
    runs = sorted(spans.values(), key=lambda s: s[1])
    for i, (mb, start, end) in enumerate(runs):
        assert all(other[0] != mb or other[1] >= end for other in runs[i + 1:]), \
            f"micro_batch={mb} ran twice at once"
    with cml.TrialStore(tmp_path / "lab.sqlite") as store:
        trials = store.trials("k")
        assert [t.status for t in trials] == ["ok"] * 6
        assert list(tmp.iterdir()) == []


def _dead_process():
    """Identity of a process that has exited."""
    import subprocess

    from cubicml_lab.launch.process import process_start

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(proc.pid)
    proc.wait()
    return proc.pid, start


def _running_trial(store, name, config, *, pid, start, owner, token=None):
    """A trial marked running by the process ``pid`` for a campaign process ``owner`` (with the
    guard's secret ``token``, where given)."""
    import socket

    tid = store.add_trial(name, {**TINY, **config}, workload="gpt")
    record = {"host": socket.gethostname(), "pid": pid, "start": start,
              "owner_pid": owner[0], "owner_start": owner[1]}
    if token is not None:
        record["token"] = token
    store.mark_running(tid, hardware={"process": record})
    return tid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_resume_ends_a_trial_process_whose_campaign_died_then_runs_it_first(gpt_space,
                                                                             tmp_store):
    import subprocess

    from cubicml_lab.launch.process import process_start

    from cubicml_lab.launch.process import OWNER_ENV, TOKEN_ENV, new_token

    owner, token = _dead_process(), new_token()
    # what a guard of the dead campaign carries: its secret and its owner
    ours = {**os.environ, TOKEN_ENV: token, OWNER_ENV: f"{owner[0]}:{owner[1]}"}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              start_new_session=True, env=ours)
    recycled = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                start_new_session=True, env=ours)
    try:
        camp = make("orphans", gpt_space, tmp_store, searcher=cml.RandomSearch(gpt_space, seed=0))
        config = {"micro_batch": 8, "precision": "fp32", "recompute": "none"}
        tid = _running_trial(tmp_store, "orphans", config, pid=orphan.pid,
                             start=process_start(orphan.pid), owner=owner, token=token)
        # a record whose pid now belongs to another process (another start time)
        other = {"micro_batch": 4, "precision": "bf16", "recompute": "full"}
        tid2 = _running_trial(tmp_store, "orphans", other, pid=recycled.pid,
                              start=process_start(recycled.pid) - 1, owner=owner)
        proposals = camp.propose(gpt_space.size())
        assert orphan.wait(timeout=5) == -9, "the orphaned trial process must be ended"
        assert recycled.poll() is None, "a recycled pid must never be signalled"
        assert [p.trial_id for p in proposals[:2]] == [tid, tid2]
        assert tmp_store.get_trial(tid).status == tmp_store.get_trial(tid2).status == "pending"
        keys = [gpt_space.key(p.config) for p in proposals]
        assert len(keys) == len(set(keys)) == gpt_space.size()
    finally:
        orphan.kill()
        recycled.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_trial_of_a_live_campaign_elsewhere_is_left_to_it_and_never_proposed(gpt_space,
                                                                             tmp_store):
    import subprocess

    from cubicml_lab.launch.process import process_start

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    try:
        identity = (other.pid, process_start(other.pid))
        config = {"micro_batch": 2, "precision": "bf16", "recompute": "none"}
        camp = make("shared", gpt_space, tmp_store, searcher=cml.RandomSearch(gpt_space, seed=0))
        tid = _running_trial(tmp_store, "shared", config, pid=identity[0], start=identity[1],
                             owner=identity)
        proposals = camp.propose(gpt_space.size() - 1)
        assert other.poll() is None and tmp_store.get_trial(tid).status == "running"
        assert gpt_space.key(config) not in {gpt_space.key(p.config) for p in proposals}
        # when the other campaign finishes it, this one is told
        tmp_store.finish_trial(tid, status="ok", metrics={"throughput": 1.0})
        for p in proposals:
            camp.skip(p)
        with pytest.raises(cml.errors.SearchError):
            camp.propose(1)
        assert camp.searcher.n_told == 1
    finally:
        other.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_trial_another_process_claims_first_is_left_to_it(gpt_space, tmp_store):
    """Two processes resuming one campaign both queue its pending trial; the store lets one
    claim it: the other runs nothing, leaves the trial alone and never proposes its config."""
    import socket
    import subprocess

    from cubicml_lab.launch.process import process_start

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    try:
        config = {"micro_batch": 4, "precision": "fp32", "recompute": "full"}
        camp = make("race", gpt_space, tmp_store, searcher=cml.RandomSearch(gpt_space, seed=0))
        tid = tmp_store.add_trial("race", {**TINY, **config}, workload="gpt")  # left pending
        [p] = camp.propose(1)
        assert p.trial_id == tid
        record = {"host": socket.gethostname(), "pid": other.pid,
                  "start": process_start(other.pid), "owner_pid": other.pid,
                  "owner_start": process_start(other.pid)}
        tmp_store.mark_running(tid, hardware={"process": record})  # the other one got there
        assert camp.launch(p, verbose=False) is None
        trial = tmp_store.get_trial(tid)
        assert trial.status == "running" and trial.hardware["process"]["pid"] == other.pid
        proposals = camp.propose(gpt_space.size() - 1)
        assert gpt_space.key(config) not in {gpt_space.key(q.config) for q in proposals}
    finally:
        other.kill()


@pytest.mark.slow
def test_resumed_trial_is_launched_once_when_review_skips_beside_it(gpt_space, tmp_store):
    """A skip makes run() ask again while an interrupted trial is already taken: the second ask
    must not hand out that trial a second time."""
    camp = make("skip2", gpt_space, tmp_store, searcher=cml.RandomSearch(gpt_space, seed=0))
    config = {"micro_batch": 2, "precision": "fp32", "recompute": "none"}
    tid = tmp_store.add_trial("skip2", {**TINY, **config}, workload="gpt")  # left pending
    skipped = []

    def review(p):
        if p.trial_id is None and not skipped:
            skipped.append(p)
            return None
        return p.config

    df = camp.run(budget=3, parallel=2, progress=False, verbose=False, review=review)
    assert len(df) == 3 and set(df["status"]) == {"ok"}
    keys = [gpt_space.key({n: r[n] for n in gpt_space.names}) for _, r in df.iterrows()]
    assert len(set(keys)) == 3 and tmp_store.get_trial(tid).status == "ok"


def test_a_wide_int_knob_is_checked_without_listing_it(tmp_store):
    import time

    t0 = time.perf_counter()
    make("wide", cml.Space([cml.Int("seed", 0, 10**9)]), tmp_store)  # every seed is a valid seed
    assert time.perf_counter() - t0 < 5.0  # 10**9 resolves would take hours
    with pytest.raises(ConfigError, match="micro_batch"):  # its low end is checked
        make("wide-bad", cml.Space([cml.Int("micro_batch", 0, 10**6)]), tmp_store)


@pytest.mark.slow
def test_a_campaign_keeps_a_local_pool_full(gpt_space, tmp_store):
    import os

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores this process may run on")
    cores = sorted(os.sched_getaffinity(0))[:2]
    pool = cml.launch.LocalPool(1, devices=cores, timeout_s=120)
    df = make("pool", gpt_space, tmp_store, launcher=pool).run(budget=4, parallel=pool.slots,
                                                                progress=False, verbose=False,
                                                                full=True)
    assert list(df["status"]) == ["ok"] * 4
    assert set(df["hw.cpu_affinity"]) == {str(c) for c in cores}  # one core per trial
    assert "local_pool" in str(tmp_store.campaign_info("pool")["metadata"]["launcher"])


# -- campaign files ---------------------------------------------------------------------------
def test_a_campaign_file_round_trips_and_sets_run_defaults(gpt_space, tmp_path):
    store = cml.TrialStore(tmp_path / "lab.sqlite")
    searcher = cml.BayesianSearch(gpt_space, seed=3, n_init=4, memory_limit_gib=2.0)
    camp = cml.Campaign("file", gpt_space, workload="gpt", store=store, searcher=searcher,
                        launcher=cml.launch.LocalPool(1, devices=[0], timeout_s=60),
                        measure_options=FAST, fixed=TINY,
                        reference=gpt_space.sample(1, seed=0)[0])
    path = camp.to_yaml(tmp_path / "c.yaml", budget=3, parallel=1)
    back = cml.Campaign.from_yaml(path)
    assert back.to_dict() == camp.to_dict(budget=3, parallel=1)
    assert back.budget == 3 and back.parallel == 1 and back.searcher.n_init == 4
    assert back.launcher.describe() == camp.launcher.describe()
    with pytest.raises(ConfigError, match="cost_model"):
        cml.Campaign("costed", gpt_space, workload="gpt", store=store, searcher=cml.BayesianSearch(
            gpt_space, cost_model=lambda c: [1.0])).to_yaml(tmp_path / "x.yaml")


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(budgett=3), r"unknown key\(s\) \['budgett'\]"),
    (lambda d: d.pop("space"), r"missing key\(s\) \['space'\]"),
    (lambda d: d.update(launcher={"kind": "ssh"}), "launcher kind 'ssh'"),
    (lambda d: d.update(launcher={"kind": "subprocess", "timeout": 5}), r"\['timeout'\]"),
    (lambda d: d.update(searcher={"kind": "bayesian", "sed": 1}), r"\['sed'\]"),
    (lambda d: d.update(budget=0), "budget = 0"),
    (lambda d: d.update(fixed=[1, 2]), "fixed must be a mapping"),
    (lambda d: d["space"].update(constraints=["__import__('os').getpid() > 0"]), "space"),
    (lambda d: d.update(workload="bert"), "unknown workload 'bert'"),
])
def test_a_bad_campaign_file_is_refused_naming_the_field(gpt_space, tmp_path, edit, match):
    import yaml

    camp = make("file", gpt_space, cml.TrialStore(tmp_path / "lab.sqlite"))
    data = camp.to_dict(budget=2)
    data["launcher"] = {"kind": "inprocess"}
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(cml.CubicMLError, match=match):
        cml.Campaign.from_yaml(path)


def test_campaign_files_that_are_not_yaml_mappings_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_bytes(b"name: \xff\xfe")
    (tmp_path / "b.yaml").write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="not UTF-8 YAML"):
        cml.Campaign.from_yaml(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="a mapping, got list"):
        cml.Campaign.from_yaml(tmp_path / "b.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        cml.Campaign.from_yaml(tmp_path / "missing.yaml")


@pytest.mark.slow
def test_cubicml_lab_run_starts_and_resumes_a_campaign_file(gpt_space, tmp_path):
    import subprocess

    store_path = tmp_path / "lab.sqlite"
    camp = make("headless", gpt_space, cml.TrialStore(store_path))
    camp.to_yaml(tmp_path / "c.yaml", budget=2)
    cmd = [sys.executable, "-m", "cubicml_lab.cli", "run", str(tmp_path / "c.yaml"),
           "--no-progress"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert [t.status for t in cml.TrialStore(store_path).trials("headless")] == ["ok", "ok"]
    more = subprocess.run([*cmd, "--budget", "3"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert more.returncode == 0 and len(cml.TrialStore(store_path).trials("headless")) == 3
    (tmp_path / "bad.yaml").write_text("name: x\n")
    bad = subprocess.run([*cmd[:4], str(tmp_path / "bad.yaml")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "missing key(s)" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_best_passes_over_a_figure_the_contention_guard_flagged(gpt_space, tmp_store):
    camp = make("flagged", gpt_space, tmp_store)
    cfg = {**TINY, "precision": "fp32", "recompute": "none"}
    tmp_store.record_trial("flagged", {**cfg, "micro_batch": 2}, status="ok",
                           metrics={"throughput": 900.0, "contended": 1.0})
    assert camp.best() == ({"micro_batch": 2, "precision": "fp32", "recompute": "none"}, 900.0)
    tmp_store.record_trial("flagged", {**cfg, "micro_batch": 4}, status="ok",
                           metrics={"throughput": 500.0, "contended": 0.0})
    # the flagged trial is faster on paper, but its figure is noise: the clean one is the best
    assert camp.best() == ({"micro_batch": 4, "precision": "fp32", "recompute": "none"}, 500.0)
    assert camp.summary()["best"] == 500.0


def test_measured_value_is_the_median_of_a_configurations_ok_trials(gpt_space, tmp_store):
    camp = make("values", gpt_space, tmp_store)
    cfg = {**TINY, "precision": "fp32", "recompute": "none"}
    for value in (500.0, 700.0, 520.0):
        tmp_store.record_trial("values", {**cfg, "micro_batch": 4}, status="ok",
                               metrics={"throughput": value})
    tmp_store.record_trial("values", {**cfg, "micro_batch": 4}, status="oom", metrics={})
    knobs = {"micro_batch": 4, "precision": "fp32", "recompute": "none"}
    assert camp.measured_value(knobs) == 520.0 and not camp.measured_flagged(knobs)
    assert camp.measured_value({**knobs, "micro_batch": 2}) is None
    # a figure the guard flagged does not move the value while a clean one exists; a
    # configuration measured only while the machine was busy keeps its figure, and says so
    tmp_store.record_trial("values", {**cfg, "micro_batch": 4}, status="ok",
                           metrics={"throughput": 9000.0, "contended": 1.0})
    assert camp.measured_value(knobs) == 520.0 and not camp.measured_flagged(knobs)
    tmp_store.record_trial("values", {**cfg, "micro_batch": 8}, status="ok",
                           metrics={"throughput": 300.0, "contended": 1.0})
    busy = {**knobs, "micro_batch": 8}
    assert camp.measured_value(busy) == 300.0 and camp.measured_flagged(busy)
    assert not camp.measured_flagged({**knobs, "micro_batch": 2})
    # the demo's speed-up line says when the default it is measured against was flagged
    from cubicml_lab.demo import speedup_line

    camp.reference = busy
    line = speedup_line(camp, knobs, 300.0, 520.0 / 300.0)
    assert line.startswith("default configuration: 300 tokens/s  ->  speed-up 1.73x (the "
                           "default's measurement flagged contended")
    assert "not to be trusted" in line
    camp.reference = knobs
    assert speedup_line(camp, knobs, 520.0, 1.0).endswith("speed-up 1.00x")


def test_a_contended_trial_is_counted_and_named_wherever_the_campaign_shows_its_trials(
        gpt_space, tmp_store):
    from cubicml_lab.campaign import format_trial
    from cubicml_lab.trials import TrialResult

    camp = make("flags", gpt_space, tmp_store)
    cfg = {**TINY, "precision": "fp32", "recompute": "none"}
    for mb, value, flag in ((2, 500.0, 0.0), (4, 900.0, 1.0), (8, 600.0, 0.0)):
        tmp_store.record_trial("flags", {**cfg, "micro_batch": mb}, status="ok",
                               metrics={"throughput": value, "contended": flag})
    tmp_store.record_trial("flags", {**cfg, "micro_batch": 16}, status="oom", metrics={})
    s = camp.summary()
    assert s["contended"] == 1 and s["best"] == 600.0
    assert "3 ok (1 contended), 1 oom" in str(camp)
    assert "3 ok (1 contended)" in camp._repr_html_()
    result = TrialResult(status="ok", metrics={"throughput": 900.0, "contended": 1.0,
                                               "step_time_s": 0.1, "step_time_rel_ci": 0.02},
                         hardware={})
    line = format_trial(7, camp.space, {**cfg, "micro_batch": 4}, result, "throughput")
    assert "contended" in line and "not trusted" in line
    assert "±2.0%" in line  # no throughput_rel_ci: the step time's CI
    told = TrialResult(status="ok", metrics={**result.metrics, "throughput_rel_ci": 0.014},
                       hardware={})
    assert "900 units/s ±1.4%" in format_trial(7, camp.space, {**cfg, "micro_batch": 4}, told,
                                                 "throughput")
    unknown = TrialResult(status="ok", metrics={**result.metrics, "throughput_rel_ci": math.nan},
                          hardware={})  # one window: no CI, and not the step time's either
    assert "900 units/s ±?  step" in format_trial(7, camp.space, {**cfg, "micro_batch": 4},
                                                  unknown, "throughput")
    clean = TrialResult(status="ok", metrics={**result.metrics, "contended": 0.0}, hardware={})
    assert "contended" not in format_trial(7, camp.space, {**cfg, "micro_batch": 4}, clean,
                                           "throughput")


def test_the_card_recommends_the_searchers_pick_over_a_lucky_single_figure(gpt_space,
                                                                           tmp_store):
    make("rec", gpt_space, tmp_store)
    lucky = {"micro_batch": 1, "precision": "fp32", "recompute": "none"}
    steady = {"micro_batch": 8, "precision": "bf16", "recompute": "full"}
    for knobs, values in ((lucky, (900.0, 500.0, 520.0)), (steady, (700.0, 690.0, 710.0))):
        for value in values:
            tmp_store.record_trial("rec", {**TINY, **knobs}, status="ok",
                                   metrics={"throughput": value})
    camp = cml.Campaign.from_store(tmp_store, "rec")  # its searcher told every stored trial
    assert camp.best() == (lucky, 900.0)
    assert camp.recommend() == (steady, 700.0)  # the median of its three figures
    s = camp.summary()
    assert (s["best"], s["recommended"], s["recommended_config"]) == (900.0, 700.0, steady)
    card = str(camp)
    assert "recommended: micro_batch=8, precision=bf16, recompute=full: 700 measured" in card
    pytest.importorskip("ipywidgets")
    from cubicml_lab import widgets

    status = widgets.CampaignDashboard(camp).status.value
    assert "best 900 throughput" in status
    assert "recommended 700 (micro_batch=8, precision=bf16, recompute=full: the model" in status
    # a campaign whose searcher has no model recommends its best single figure
    plain = cml.Campaign.from_store(tmp_store, "rec", searcher=cml.RandomSearch(gpt_space))
    assert plain.recommend() == plain.best() == (lucky, 900.0)
    assert "recommended" not in str(plain)


# -- a flagged figure never steers alone; all skipped is not exhausted --------------------
def test_best_passes_over_a_figure_without_an_interval(gpt_space, tmp_store):
    """A figure from a single window (CI unknown, shown ±?) is not the best a review rule
    compares with while a figure with an interval exists."""
    camp = make("no-ci", gpt_space, tmp_store)
    cfg = {**TINY, "precision": "fp32", "recompute": "none"}
    tmp_store.record_trial("no-ci", {**cfg, "micro_batch": 2}, status="ok",
                           metrics={"throughput": 21558.0, "throughput_rel_ci": math.inf})
    tmp_store.record_trial("no-ci", {**cfg, "micro_batch": 4}, status="ok",
                           metrics={"throughput": 16000.0, "throughput_rel_ci": 0.02})
    assert camp.best() == ({"micro_batch": 4, "precision": "fp32", "recompute": "none"}, 16000.0)
    assert camp.measured_value({"micro_batch": 2, "precision": "fp32",
                                "recompute": "none"}) == 21558.0  # its only figure


@pytest.mark.slow
def test_a_rule_that_skipped_everything_left_says_so_and_unskip_runs_them(tmp_store):
    space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 4)])
    camp = make("rule", space, tmp_store, searcher=cml.RandomSearch(space, seed=0))
    df = camp.run(budget=3, progress=False, verbose=False,
                  review=lambda p: None if camp.trials() else p.config)
    assert len(df) == 1
    assert camp.stop_reason.startswith("everything left was skipped: the 2 configurations")
    assert "exhausted" not in camp.stop_reason and "campaign.unskip()" in camp.stop_reason
    assert camp.unskip() == 2
    again = cml.Campaign.from_store(tmp_store, "rule", launcher=cml.launch.InProcess())
    assert again.searcher.skipped == []  # forgotten in the store too
    df = camp.run(budget=3, progress=False, verbose=False)
    assert len(df) == 3 and camp.stop_reason == "budget reached"
    df = camp.run(budget=4, progress=False, verbose=False)
    assert camp.stop_reason.startswith("search space exhausted")


def test_table_is_what_a_person_reads_and_full_is_every_field(gpt_space, tmp_store):
    """Campaign.table(): status, knobs, objective, unit-named metrics, datetimes, a handful of
    columns; table(full=True) is the whole record, the frame run() returned before."""
    import pandas as pd

    camp = make("table", gpt_space, tmp_store)
    cfg = {**TINY, "precision": "fp32", "recompute": "none"}
    t0 = 1_796_444_000.0
    ok = tmp_store.record_trial("table", {**cfg, "micro_batch": 2}, status="ok",
                                metrics={"throughput": 9000.0, "tokens_per_s": 9000.0,
                                         "throughput_rel_ci": 0.02, "step_time_s": 0.0071,
                                         "peak_mem_gib": 0.4, "mfu": 0.3, "contended": 1.0,
                                         "windows": 12.0, "reference_speed": 57.0},
                                hardware={"hostname": "h", "cpu_count": 2},
                                started_at=t0, ended_at=t0 + 7.5)
    oom = tmp_store.record_trial("table", {**cfg, "micro_batch": 8}, status="oom",
                                 error="Traceback ...\nRuntimeError: out of memory",
                                 started_at=t0 + 8, ended_at=t0 + 9)
    table = camp.table()
    assert list(table.columns) == [
        "trial_id", "status", "micro_batch", "precision", "recompute", "throughput",
        "throughput_rel_ci", "tokens_per_s", "step_time_s", "peak_mem_gib", "mfu", "contended",
        "started_at", "duration_s", "device_s", "error"]
    assert table["trial_id"].tolist() == [ok, oom]
    assert table["contended"].tolist() == [True, False]
    assert table["error"].tolist() == [None, "RuntimeError: out of memory"]
    assert pd.api.types.is_datetime64_any_dtype(table["started_at"])
    assert table["started_at"].iloc[0] == pd.Timestamp.fromtimestamp(t0)  # local time
    assert table["duration_s"].tolist() == [7.5, 1.0]
    full = camp.table(full=True)
    assert full.equals(camp.dataframe()) and len(full.columns) > len(table.columns)
    assert {"windows", "reference_speed", "hw.hostname", "d_model"} <= set(full.columns)
    assert full["started_at"].iloc[0] == t0  # unix seconds, as before


def test_a_launcher_that_cannot_start_trials_raises_after_requeueing(gpt_space, tmp_store,
                                                                     tmp_path):
    from cubicml_lab.errors import LaunchError

    missing = tmp_path / "no-such-python"
    camp = make("nopython", gpt_space, tmp_store,
                launcher=cml.launch.Subprocess(python=missing),
                searcher=cml.RandomSearch(gpt_space, seed=0))
    with pytest.raises(LaunchError, match="no-such-python"):
        camp.run(budget=2, progress=False)
    [trial] = tmp_store.trials("nopython")
    assert trial.status == "pending" and camp.stop_reason.startswith("the launcher failed")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_in_a_kernel_a_run_that_exhausts_its_space_ends_its_bar_green(tmp_path):
    """In a real Jupyter kernel (tqdm's notebook bar): a run stopped by an exhausted space
    leaves its bar at the trials it ran, styled 'success', where it turned red ('danger')."""
    jupyter_client = pytest.importorskip("jupyter_client")
    code = f"""
import cubicml_lab as cml
space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 2)])
camp = cml.Campaign("bar", space, workload="gpt", launcher=cml.launch.InProcess(),
                    searcher=cml.RandomSearch(space, seed=0),
                    store=cml.TrialStore({str(tmp_path / 'lab.sqlite')!r}),
                    measure_options={FAST!r}, fixed={TINY!r})
camp.run(budget=5, verbose=False)
"""
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    msgs = []
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive(code, timeout=240, output_hook=msgs.append)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok"
    bar = {}  # the progress bar's widget state, as the browser would hold it
    for m in (m for m in msgs if m["msg_type"] in ("comm_open", "comm_msg")):
        state, comm = m["content"]["data"].get("state", {}), m["content"]["comm_id"]
        if state.get("_model_name") == "FloatProgressModel" or bar.get("id") == comm:
            bar.update(state, id=comm)
    assert (bar["bar_style"], bar["max"], bar["value"]) == ("success", 2, 2), bar
