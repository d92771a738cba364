"""The cubicml-lab command, run as a user would: a real subprocess."""

from __future__ import annotations

import csv
import json
import sqlite3
import subprocess
import sys

import pytest


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "cubicml_lab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=900)


@pytest.mark.slow
def test_demo_report_export(tmp_path):
    store, out = tmp_path / "demo.sqlite", tmp_path / "runs"
    run = cli("demo", "--budget", "4", "--store", str(store), "--out", str(out), "--campaign", "d",
              "--launcher", "inprocess", "--no-progress", "--max-time-s", "0.5")
    assert run.returncode == 0, run.stderr[-2000:]
    text = run.stdout
    assert "all trials:" in text and "tokens_per_s" in text
    assert "Kendall tau = " in text
    assert "best configuration: {" in text and "speed-up" in text
    assert (out / "demo.png").stat().st_size > 10_000
    assert text.count(" ok ") >= 3 or text.count("  ok  ") >= 3
    # the first trial is the stated default configuration
    first = [line for line in text.splitlines() if line.startswith("trial ")][0]
    assert "micro_batch=8" in first and "precision=fp32" in first
    with sqlite3.connect(store) as db:  # the 0.5-s budget is the campaign's measure option
        (meta,) = db.execute("SELECT metadata FROM campaigns WHERE name = 'd'").fetchone()
    assert json.loads(meta)["measure_options"] == {"max_time_s": 0.5}

    report = cli("report", "d", "--store", str(store))
    assert report.returncode == 0, report.stderr
    assert "4 trials" in report.stdout and "best:" in report.stdout

    exported = tmp_path / "d.csv"
    exp = cli("export", "d", str(exported), "--store", str(store))
    assert exp.returncode == 0, exp.stderr
    with open(exported, newline="") as f:
        assert len(list(csv.DictReader(f))) == 4


def test_errors_are_one_clear_line(tmp_path):
    run = cli("report", "nope", "--store", str(tmp_path / "missing.sqlite"))
    assert run.returncode == 2
    assert "no store at" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "missing.sqlite").exists()
    run = cli("demo", "--max-time-s", "0", "--store", str(tmp_path / "demo.sqlite"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "max_time_s = 0.0 must be a number of seconds > 0" in run.stderr
    assert not (tmp_path / "demo.sqlite").exists()  # refused before any trial
    run = cli("demo", "--processes", "0", "--store", str(tmp_path / "demo.sqlite"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "Repeated processes = 0 must be an int >= 1" in run.stderr
    assert not (tmp_path / "demo.sqlite").exists()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_in_run_exits_130_with_one_line(tmp_path):
    """Ctrl-C during ``cubicml-lab run``: the trial goes back to pending, its process ends, and
    the command exits 130 with one line on stderr, no traceback, and prints nothing after."""
    import os
    import signal
    import time

    from interrupting import campaign

    camp = campaign(tmp_path / "lab.sqlite", "cli-int")
    store = camp.store
    path = camp.to_yaml(tmp_path / "c.yaml", budget=2)
    # SIGINT as a terminal delivers it (a pytest started in the background ignores it)
    proc = subprocess.Popen([sys.executable, "-m", "cubicml_lab.cli", "run", str(path),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                        signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not store.trials("cli-int", status="running"):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.3)
    pid = store.trials("cli-int", status="running")[0].hardware["process"]["pid"]
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines() == [
        "cubicml-lab run: cli-int: interrupted; 1 trial in flight was stopped and re-queued "
        "(run again to resume)"], err
    assert "Campaign 'cli-int'" not in out  # the card printed after run() never came
    [trial] = store.trials("cli-int")
    assert trial.status == "pending"
    assert not os.path.exists(f"/proc/{pid}") or \
        open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


LANDS_IN_DEL = """
import os, signal, sys, time
from cubicml_lab import cli

class Lands:
    def __del__(self):  # a real SIGINT, taken while Python runs a __del__, where it only prints
        os.kill(os.getpid(), signal.SIGINT)  # what is raised ("Exception ignored in ...")
        for _ in range(1000):
            pass

def dispatch(args):
    Lands()
    time.sleep(5)
    print("finished", flush=True)

cli._dispatch = dispatch
sys.exit(cli.main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")
def test_a_ctrl_c_that_lands_in_a_del_still_ends_the_command(tmp_path):
    """CI saw ``report`` take a Ctrl-C inside the import system's module-lock callback, print
    "Exception ignored", finish and exit 0. The command must still end at once, with 130 and
    its one line."""
    import signal

    proc = subprocess.run([sys.executable, "-c", LANDS_IN_DEL, "report", "c", "--store",
                           str(tmp_path / "lab.sqlite")], capture_output=True, text=True,
                          timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                       signal.SIG_DFL))
    assert proc.returncode == 130, (proc.stdout, proc.stderr)
    assert proc.stderr.strip().splitlines() == ["cubicml-lab report: interrupted"], proc.stderr
    assert "finished" not in proc.stdout
