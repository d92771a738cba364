"""Tests for cubicml_lab.launch and the trial entry point, with real interpreters and processes.

Crashes, hangs and bad results are produced by real means: a gpt config too big for the timeout or
the memory limit, an unknown workload, or ``python=`` pointing at a small executable script written
here that behaves like a broken interpreter (exits non-zero, segfaults, hangs with a grandchild,
writes garbage). Nothing in the library has a test hook.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from cubicml_lab.errors import ConfigError, LaunchError
from cubicml_lab.launch import (InProcess, Launcher, Repeated, Subprocess, measure,
                                measure_repeats, repeat_spread)
from cubicml_lab.launch.describe import launcher_from_dict
from cubicml_lab.launch.repeated import combine, share_of_budget
from cubicml_lab.launch.process import (end_trial_process, new_trial_dir, process_start,
                                        sweep_trial_dirs, trial_record)
from cubicml_lab.trials import TrialResult

ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 16, "vocab": 64, "micro_batch": 2}
FAST = {"max_time_s": 0.5, "min_steps": 3, "max_steps": 20, "warmup_max_s": 0.5}
TINY_SPEC = {"workload": "gpt", "config": TINY, "device": "cpu", "measure": FAST}
# One step of this takes tens of seconds on a laptop CPU (about 3 TFLOP), with ~1 GiB resident.
SLOW = {"d_model": 1024, "n_layers": 4, "n_heads": 8, "seq_len": 1024, "vocab": 8192,
        "micro_batch": 8}
# Its token embedding alone (2**20 x 1024 fp32 = 4 GiB) exceeds a 3 GiB address space.
HUGE = {"d_model": 1024, "n_layers": 1, "n_heads": 8, "seq_len": 16, "vocab": 2**20,
        "micro_batch": 1}
METRIC_KEYS = ("tokens_per_s", "step_time_s", "peak_mem_gib")


def fake_python(tmp_path: Path, name: str, body: str) -> Path:
    """Write an executable script that stands in for the trial interpreter.

    It is called exactly like Python would be
    (``-m cubicml_lab.launch.worker --spec S --result R ...``),
    and its body sees ``argv``, ``spec_path`` and ``result_path``.
    """
    head = f"""\
        #!{sys.executable}
        import json, os, signal, subprocess, sys, time
        argv = sys.argv[1:]
        spec_path = argv[argv.index("--spec") + 1]
        result_path = argv[argv.index("--result") + 1]
        """
    path = tmp_path / name
    path.write_text(textwrap.dedent(head) + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (pid 1 here may never reap orphans)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def live_pids_with_env(tag: str) -> list[int]:
    """Live processes whose environment holds ``CUBICML_TEST_TAG=<tag>``."""
    needle = f"CUBICML_TEST_TAG={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in environ and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def check_ok(res: TrialResult) -> None:
    assert res.status == "ok", res.error
    assert res.error is None
    for key in METRIC_KEYS:
        assert res.metrics[key] > 0, (key, res.metrics)
    assert res.hardware["hostname"] == socket.gethostname()
    assert res.workload == "gpt"
    assert {k: res.config[k] for k in TINY} == TINY


# ---------------------------------------------------------------- import cost and arguments


def test_importing_launch_and_trial_loads_no_torch() -> None:
    code = ("import sys, cubicml_lab.launch, cubicml_lab.launch.worker; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": -5}, "timeout_s"),
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"timeout_s": "60"}, "timeout_s"),
        ({"timeout_s": True}, "timeout_s"),
        ({"memory_limit_gib": 0}, "memory_limit_gib"),
        ({"memory_limit_gib": -1.5}, "memory_limit_gib"),
        ({"memory_limit_gib": float("inf")}, "memory_limit_gib"),
        ({"env": {"OMP_NUM_THREADS": 2}}, "env"),
        ({"python": 3}, "python"),
    ],
)
def test_subprocess_rejects_bad_options_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Subprocess(**kwargs)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"config": {}}, "workload"),
        ({"workload": "gpt", "confg": {}}, "confg"),
        ({"workload": "gpt", "config": [1, 2]}, "config"),
        ({"workload": "gpt", "config": {"d_model": object()}}, "JSON"),
        ({"workload": "gpt", "config": {"x": float("nan")}}, "JSON"),
    ],
)
def test_launchers_reject_malformed_specs(spec: dict, words: str, tmp_path: Path) -> None:
    # python= a script that would leave a mark: a rejected spec must never start a process.
    marker = tmp_path / "started"
    script = fake_python(tmp_path, "py", f"open({str(marker)!r}, 'w').close()\n")
    for launcher in (InProcess(), Subprocess(python=script)):
        with pytest.raises(ConfigError, match=words):
            launcher.run(spec)
    assert not marker.exists()


def test_missing_or_unexecutable_python_is_a_launch_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    with pytest.raises(LaunchError, match="no-such-python"):
        Subprocess(python=missing).run(TINY_SPEC)
    not_executable = tmp_path / "python-no-x"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(LaunchError, match="python-no-x"):
        Subprocess(python=not_executable).run(TINY_SPEC)


def test_describe_is_json_and_names_every_option() -> None:
    assert InProcess().describe() == {"kind": "inprocess"}
    launcher = Subprocess(timeout_s=30, memory_limit_gib=2, python="/usr/bin/python3",
                          env={"OMP_NUM_THREADS": "1"})
    described = json.loads(json.dumps(launcher.describe()))
    assert described == {"kind": "subprocess", "timeout_s": 30.0, "memory_limit_gib": 2.0,
                         "python": "/usr/bin/python3", "env": {"OMP_NUM_THREADS": "1"}}
    assert isinstance(launcher, Launcher)
    assert "timeout_s=30.0" in repr(launcher)


def test_measure_rejects_unknown_knob_before_starting_anything(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    script = fake_python(tmp_path, "py", f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(ConfigError, match="d_modle"):
        measure("gpt", {"d_modle": 64}, launcher=Subprocess(python=script))
    with pytest.raises(ConfigError, match="launcher"):
        measure("gpt", TINY, launcher="subprocess")  # type: ignore[arg-type]
    assert not marker.exists()


# ---------------------------------------------------------------- what the child reports


def test_subprocess_returns_exactly_the_result_the_child_wrote(tmp_path: Path) -> None:
    written = TrialResult(
        status="oom", metrics={"step_time_s": 0.25, "tokens_per_s": 4096.0},
        hardware={"hostname": "node-17", "cpu_count": 96}, error="ran out at step 3",
        workload="gpt", workload_version="7", config={"d_model": 96}, wall_s=12.5,
    )
    seen = tmp_path / "seen.json"
    script = fake_python(tmp_path, "py", f"""\
        with open({str(seen)!r}, "w") as f:
            json.dump({{"argv": argv, "spec": json.load(open(spec_path))}}, f)
        with open(result_path, "w") as f:
            f.write({written.to_json()!r})
        """)
    spec = {"workload": "gpt", "config": {"d_model": 96}, "device": "cpu", "measure": FAST}
    got = Subprocess(python=script, memory_limit_gib=1.5, timeout_s=30).run(spec)
    assert got == written
    record = json.loads(seen.read_text())
    assert record["spec"] == spec
    assert record["argv"][:2] == ["-m", "cubicml_lab.launch.worker"]
    assert record["argv"][-2:] == ["--memory-limit-gib", "1.5"]


def test_result_file_that_is_not_json_is_a_failure(tmp_path: Path) -> None:
    script = fake_python(tmp_path, "py", "open(result_path, 'w').write('{\"status\": ')\n")
    res = Subprocess(python=script).run(TINY_SPEC)
    assert res.status == "failed"
    assert "not valid JSON" in res.error
    assert res.workload == "gpt" and res.config == TINY and res.metrics == {}


def test_nonzero_exit_is_failed_with_the_exit_code_and_stderr_tail(tmp_path: Path) -> None:
    script = fake_python(tmp_path, "py", """\
        for i in range(100):
            print(f"stderr line {i}", file=sys.stderr)
        sys.exit(3)
        """)
    res = Subprocess(python=script).run(TINY_SPEC)
    assert res.status == "failed"
    assert "exited with code 3" in res.error
    assert "stderr line 99" in res.error and "stderr line 60" in res.error
    assert "stderr line 59\n" not in res.error  # only the last 40 lines
    assert res.hardware["hostname"] == socket.gethostname()
    assert res.wall_s > 0


def test_death_by_signal_is_failed_naming_the_signal(tmp_path: Path) -> None:
    script = fake_python(tmp_path, "py", """\
        print("about to dereference a null pointer", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
        """)
    res = Subprocess(python=script).run(TINY_SPEC)
    assert res.status == "failed"
    assert "SIGSEGV" in res.error
    assert "about to dereference a null pointer" in res.error


def test_unknown_workload_in_the_child_is_a_failed_result() -> None:
    res = Subprocess(timeout_s=60).run({"workload": "no_such_workload", "config": {}})
    assert res.status == "failed"
    assert "no_such_workload" in res.error
    assert res.workload == "no_such_workload"


def test_trial_entry_point_reports_a_missing_or_broken_spec(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "cubicml_lab.launch.worker", "--result", str(result), "--spec"]
    out = subprocess.run([*cmd, str(tmp_path / "absent.json")], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 2 and "absent.json" in out.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{workload: gpt")
    out = subprocess.run([*cmd, str(broken)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "not valid JSON" in out.stderr
    assert not result.exists()


# ---------------------------------------------------------------- timeouts and process groups


def test_timeout_terminates_then_kills_the_whole_process_group(tmp_path: Path) -> None:
    # The "interpreter" starts two grandchildren, then hangs. One notes SIGTERM and exits; the
    # other ignores SIGTERM, so only the SIGKILL that follows can end it.
    pids, termed = tmp_path / "grandchildren.pid", tmp_path / "termed"
    script = fake_python(tmp_path, "py", f"""\
        notes_term = (
            "import signal, sys, time\\n"
            "def on_term(*_):\\n"
            "    open({str(termed)!r}, 'w').close(); sys.exit(0)\\n"
            "signal.signal(signal.SIGTERM, on_term)\\n"
            "time.sleep(120)\\n")
        ignores_term = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                        "time.sleep(120)")
        kids = [subprocess.Popen([sys.executable, "-c", c]) for c in (notes_term, ignores_term)]
        open({str(pids)!r}, "w").write(" ".join(str(k.pid) for k in kids))
        time.sleep(0.5)  # let both install their handlers
        print("hanging now", file=sys.stderr, flush=True)
        time.sleep(120)
        """)
    start = time.perf_counter()
    res = Subprocess(python=script, timeout_s=1.5).run(TINY_SPEC)
    elapsed = time.perf_counter() - start
    assert res.status == "timeout"
    assert "timed out after 1." in res.error and "hanging now" in res.error
    assert 1.5 <= res.wall_s <= elapsed < 5
    grandchildren = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 2
    while any(map(alive, grandchildren)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(alive, grandchildren))
    assert termed.exists()  # SIGTERM reached the group before SIGKILL


def test_death_under_a_memory_limit_is_oom_only_when_a_limit_was_set(tmp_path: Path) -> None:
    # An "interpreter" that applies the limit it is given, then allocates past it and dies of
    # the uncaught MemoryError without writing a result.
    script = fake_python(tmp_path, "py", """\
        import resource
        if "--memory-limit-gib" in argv:
            limit = int(float(argv[argv.index("--memory-limit-gib") + 1]) * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        else:
            print("MemoryError: pretend", file=sys.stderr)
            sys.exit(1)
        block = bytearray(2 * limit)
        """)
    res = Subprocess(python=script, memory_limit_gib=0.5).run(TINY_SPEC)
    assert res.status == "oom"
    assert "memory_limit_gib = 0.5" in res.error and "MemoryError" in res.error
    res = Subprocess(python=script).run(TINY_SPEC)
    assert res.status == "failed"
    assert "exited with code 1" in res.error


def test_interrupting_the_caller_kills_the_trial(tmp_path: Path) -> None:
    # Ctrl-C in a notebook (SIGINT -> KeyboardInterrupt while run() waits) must not orphan it.
    pid_file = tmp_path / "trial.pid"
    script = fake_python(tmp_path, "py", f"""\
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
        """)
    # a shell that starts pytest in the background (`make test &`) leaves SIGINT ignored, and
    # Python then raises no KeyboardInterrupt: restore the handler a terminal or kernel has
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            Subprocess(python=script, timeout_s=60).run(TINY_SPEC)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert not alive(int(pid_file.read_text()))


def test_concurrent_runs_keep_their_own_specs_and_results(tmp_path: Path) -> None:
    # Campaign(parallel=n) calls run() from several threads at once.
    script = fake_python(tmp_path, "py", """\
        spec = json.load(open(spec_path))
        time.sleep(0.2)
        json.dump({"status": "ok", "metrics": {"step_time_s": spec["config"]["d_model"] / 1000},
                   "hardware": {"hostname": "h"}, "workload": spec["workload"],
                   "config": spec["config"]}, open(result_path, "w"))
        """)
    launcher = Subprocess(python=script, timeout_s=30)
    specs = [{"workload": "gpt", "config": {"d_model": 8 * (i + 1)}} for i in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(launcher.run, specs))
    assert [r.config for r in results] == [s["config"] for s in specs]
    times = [r.metrics["step_time_s"] for r in results]
    assert times == pytest.approx([0.008 * (i + 1) for i in range(6)])


@pytest.mark.slow
def test_real_trial_slower_than_its_timeout_times_out_and_leaves_nothing() -> None:
    tag = uuid.uuid4().hex
    launcher = Subprocess(timeout_s=4, env={"CUBICML_TEST_TAG": tag})
    # a thousand steps (3,000 TFLOP, an estimate): no CPU ends them in 4 s, however fast
    many = {**FAST, "min_steps": 1000, "max_steps": 1000}
    res = launcher.run({"workload": "gpt", "config": SLOW, "device": "cpu", "measure": many})
    assert res.status == "timeout", res.error
    assert "timeout_s = 4" in res.error
    assert 4 <= res.wall_s < 10
    assert res.metrics == {} and res.config == SLOW
    assert live_pids_with_env(tag) == []


# ---------------------------------------------------------------- real gpt trials


@pytest.mark.slow
def test_inprocess_measures_a_tiny_gpt() -> None:
    check_ok(measure("gpt", TINY, measure_options=FAST))


def _kernel_lets_a_process_fix_its_layout() -> bool:
    """Whether personality(ADDR_NO_RANDOMIZE) is allowed here (a container's seccomp profile
    may refuse it), asked of a throwaway interpreter."""
    probe = ("import ctypes; p = ctypes.CDLL(None).personality; "
             "print(p(p(0xFFFFFFFF) | 0x0040000))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    return int(out) != -1


LAYOUT_PROBE = """import ctypes, sys
from cubicml_lab.launch.worker import fix_address_layout
fix_address_layout()
buf = ctypes.create_string_buffer(1 << 20)  # a malloc'd block, a shared library, the stack
print(ctypes.addressof(buf), ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value,
      id(sys))
"""


@pytest.mark.skipif(not Path("/proc/self/personality").exists(), reason="Linux only")
def test_a_trial_process_gets_the_same_address_layout_every_time(tmp_path: Path) -> None:
    """fix_address_layout re-executes the process without layout randomisation: two fresh
    processes put the same allocations at the same addresses (with randomisation they never
    do), unless CUBICML_LAB_ADDRESS_LAYOUT=randomized asks to keep it."""
    script = tmp_path / "probe.py"
    script.write_text(LAYOUT_PROBE)

    def addresses(**env: str) -> str:
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              check=True, env={**os.environ, **env}).stdout

    randomized = [addresses(CUBICML_LAB_ADDRESS_LAYOUT="randomized") for _ in range(2)]
    assert randomized[0] != randomized[1]
    if not _kernel_lets_a_process_fix_its_layout():
        pytest.skip("this kernel refuses personality(ADDR_NO_RANDOMIZE) (a container?): "
                    "trials keep a randomised layout")
    fixed = [addresses() for _ in range(2)]
    assert fixed[0] == fixed[1]


@pytest.mark.skipif(not Path("/proc/self/personality").exists(), reason="Linux only")
def test_the_guard_starts_the_trial_with_a_fixed_layout_unless_told_otherwise(
        tmp_path: Path) -> None:
    """The guard sets the flag itself, so the worker need not execute the trial twice: a
    trial interpreter that is not the worker sees it from its first instruction."""
    script = fake_python(tmp_path, "py", """\
        persona = int(open("/proc/self/personality").read(), 16)
        json.dump({"status": "ok", "metrics": {"persona": persona}, "hardware": {},
                   "workload": "gpt", "config": {}}, open(result_path, "w"))
        """)
    fixed = Subprocess(python=script, timeout_s=30).run(TINY_SPEC).metrics["persona"]
    kept = Subprocess(python=script, timeout_s=30, env={
        "CUBICML_LAB_ADDRESS_LAYOUT": "randomized"}).run(TINY_SPEC).metrics["persona"]
    assert not int(kept) & 0x0040000
    if _kernel_lets_a_process_fix_its_layout():
        assert int(fixed) & 0x0040000
    else:
        assert fixed == kept


@pytest.mark.slow
def test_subprocess_measures_a_tiny_gpt_and_leaves_nothing() -> None:
    tag = uuid.uuid4().hex
    res = measure("gpt", TINY, launcher=Subprocess(timeout_s=120, env={"CUBICML_TEST_TAG": tag}),
                  measure_options=FAST)
    check_ok(res)
    assert live_pids_with_env(tag) == []
    if Path("/proc/self/personality").exists():  # what the trial's process ran with
        assert res.hardware["address_layout"] == (
            "fixed" if _kernel_lets_a_process_fix_its_layout() else "randomized")
    kept = measure("gpt", TINY, measure_options=FAST, launcher=Subprocess(
        timeout_s=120, env={"CUBICML_LAB_ADDRESS_LAYOUT": "randomized"}))
    check_ok(kept)
    assert kept.hardware["address_layout"] in ("randomized", None)


@pytest.mark.slow
def test_memory_limit_passes_a_tiny_config_and_stops_a_huge_one_as_oom() -> None:
    # 3 GiB is well above the floor of torch + a tiny step (~0.7 GiB here), so under the very same
    # limit the tiny config runs and only the huge one's 4 GiB embedding runs out of memory.
    launcher = Subprocess(timeout_s=120, memory_limit_gib=3)
    check_ok(launcher.run(TINY_SPEC))
    res = launcher.run({"workload": "gpt", "config": HUGE, "device": "cpu", "measure": FAST})
    assert res.status == "oom", res.error
    assert "allocate memory" in res.error
    assert "tokens_per_s" not in res.metrics
    assert res.config["vocab"] == 2**20


@pytest.mark.slow
def test_measure_repeats_interleaves_and_sums_up():
    configs = [{**TINY, "micro_batch": 2}, {**TINY, "micro_batch": 4}]
    df = measure_repeats("gpt", configs, repeats=2, progress=False,
                                    measure_options={"max_time_s": 0.2, "warmup_max_s": 0.3,
                                                     "min_steps": 3})
    assert df["config"].tolist() == [0, 1, 0, 1] and df["repeat"].tolist() == [0, 0, 1, 1]
    assert (df["status"] == "ok").all() and (df["micro_batch"] == [2, 4, 2, 4]).all()
    spread = repeat_spread(df)
    assert spread["ok_runs"].tolist() == [2, 2]
    for i, row in spread.iterrows():
        times = df.loc[df["config"] == i, "step_time_s"]
        assert row["spread_pct"] == pytest.approx(100 * (times.max() - times.min())
                                                  / times.median())


def test_measure_repeats_refuses_bad_input_before_running():
    with pytest.raises(ConfigError, match="repeats"):
        measure_repeats("gpt", [{}], repeats=0)
    with pytest.raises(ConfigError, match="non-empty list"):
        measure_repeats("gpt", [], repeats=2)
    with pytest.raises(ConfigError, match="micro_bach"):
        measure_repeats("gpt", [{"micro_batch": 2}, {"micro_bach": 2}], repeats=2)
    import pandas as pd

    with pytest.raises(ConfigError, match="tokens_per_s"):
        repeat_spread(pd.DataFrame({"config": [0], "status": ["ok"]}), "tokens_per_s")


# ---------------------------------------------------------------- a trial dies with its caller

# A caller that runs one trial from a worker thread (as Campaign(parallel=n) does) and is then
# killed. argv: python= script, private temp dir.
KILLED_CALLER = """
import sys, tempfile, threading
tempfile.tempdir = sys.argv[2]
from cubicml_lab.launch import Subprocess
spec = {"workload": "gpt", "config": {"d_model": 32}}
worker = threading.Thread(target=Subprocess(python=sys.argv[1], timeout_s=600).run, args=(spec,))
worker.start()
worker.join()
"""


def _wait_for(path: Path, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


def _wait_dead(pids: list[int], timeout_s: float) -> float:
    """Seconds until none of ``pids`` is alive (fails after ``timeout_s``)."""
    start = time.monotonic()
    while any(map(alive, pids)):
        assert time.monotonic() - start < timeout_s, [p for p in pids if alive(p)]
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkilled_caller_leaves_no_trial_process_and_no_folder(tmp_path: Path) -> None:
    # The trial hangs (and starts a helper that ignores SIGTERM); its caller gets SIGKILL, so no
    # code of the caller runs again: the guard must end the trial and remove its folder.
    pids, tmp = tmp_path / "pids", tmp_path / "tmp"
    tmp.mkdir()
    script = fake_python(tmp_path, "py", f"""\
        helper = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                   "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        open({str(pids)!r}, "w").write(f"{{os.getppid()}} {{os.getpid()}} {{helper.pid}}")
        time.sleep(600)
        """)
    caller = subprocess.Popen([sys.executable, "-c", KILLED_CALLER, str(script), str(tmp)],
                              cwd=ROOT)
    try:
        guard, trial, helper = map(int, _wait_for(pids).split())
        assert next(tmp.iterdir()).name.startswith("cubicml-trial-")
        caller.kill()
        caller.wait()
        assert _wait_dead([guard, trial, helper], timeout_s=2.0) < 2.0
        deadline = time.monotonic() + 2
        while list(tmp.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert list(tmp.iterdir()) == [], "the trial's temporary folder was left behind"
    finally:
        caller.kill()


def test_guard_keeps_the_trial_when_its_launching_thread_ends(tmp_path: Path) -> None:
    # PR_SET_PDEATHSIG fires when the parent *thread* exits: the guard must take it as a wake-up
    # and check its parent process, not kill a trial whose caller is alive.
    from cubicml_lab.launch.guarded import GUARD

    done = tmp_path / "done"
    folder = new_trial_dir(str(tmp_path))
    cmd = [sys.executable, "-c", f"import time; time.sleep(1.0); open({str(done)!r}, 'w')"]
    guard = [sys.executable, "-I", "-S", GUARD, "--parent", str(os.getpid()),
             "--dir", folder, "--", *cmd]
    box: list[subprocess.Popen] = []
    thread = threading.Thread(target=lambda: box.append(subprocess.Popen(
        guard, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)))
    thread.start()
    thread.join()  # the thread that forked the guard is gone now
    proc = box[0]
    assert proc.stdout.readline() == b"ready\n"
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().startswith(b"started ")
    assert proc.stdout.readline() == b"exited 0\n" and done.exists()
    assert Path(folder).is_dir()  # kept until the launcher has read it
    proc.stdin.close()  # done: the guard removes the folder and ends its group
    proc.wait(timeout=10)
    assert not Path(folder).exists()
    proc.stdout.close()


def test_on_start_gets_the_trial_process_and_a_refusal_runs_nothing(tmp_path: Path) -> None:
    marker, tmp = tmp_path / "started", tmp_path / "tmp"
    tmp.mkdir()
    script = fake_python(tmp_path, "py", f"""\
        open({str(marker)!r}, "w").write(str(os.getppid()))
        json.dump({{"status": "ok", "metrics": {{}}, "hardware": {{}}, "workload": "gpt",
                   "config": {{}}}}, open(result_path, "w"))
        """)
    records: list[dict] = []
    launcher = Subprocess(python=script, timeout_s=30)
    import tempfile

    old, tempfile.tempdir = tempfile.tempdir, str(tmp)
    try:
        assert launcher.run(TINY_SPEC, on_start=records.append).status == "ok"
        [record] = records
        assert record["pid"] == int(marker.read_text())  # the guard, parent of the trial
        assert record["owner_pid"] == os.getpid() and record["start"] > 0
        marker.unlink()

        def refuse(record: dict) -> None:
            raise RuntimeError("claimed elsewhere")

        with pytest.raises(RuntimeError, match="claimed elsewhere"):
            launcher.run(TINY_SPEC, on_start=refuse)
        assert not marker.exists(), "a refused trial must never run"
        assert list(tmp.iterdir()) == []
    finally:
        tempfile.tempdir = old
    seen: list[dict] = []
    InProcess().run({"workload": "no_such_workload"}, on_start=seen.append)
    assert seen[0]["pid"] == seen[0]["owner_pid"] == os.getpid()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_end_trial_process_ends_a_group_by_identity_only(tmp_path: Path) -> None:
    from cubicml_lab.launch.process import OWNER_ENV, TOKEN_ENV, new_token

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = process_start(dead.pid)
    dead.wait()
    token = new_token()
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \
           "'import time; time.sleep(600)']); time.sleep(600)"
    orphan = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                              env={**os.environ, TOKEN_ENV: token,
                                   OWNER_ENV: f"{dead.pid}:{dead_start}"})
    try:
        time.sleep(0.3)
        record = {**trial_record(orphan.pid, token=token), "owner_pid": dead.pid,
                  "owner_start": dead_start}
        wrong = {**record, "start": record["start"] + 1}  # the same pid, another process
        assert end_trial_process(wrong) == "gone"  # nothing of *that* process is left
        assert alive(orphan.pid)
        assert end_trial_process({**record, "host": "elsewhere"}) == "elsewhere"
        assert end_trial_process({**record, "token": new_token()}) == "not ours"
        assert alive(orphan.pid)
        assert end_trial_process(record) == "ended"
        orphan.wait(timeout=5)
        group = subprocess.run(["pgrep", "-g", str(orphan.pid)], capture_output=True, text=True,
                               check=False).stdout.split()
        assert not any(alive(int(p)) for p in group)
        assert end_trial_process(record) == "gone"  # gone: nothing to do
        assert end_trial_process({"pid": 1}) == "gone"  # not a record: never signals anything
        assert end_trial_process(trial_record()) == "gone"  # in-process: never this process
    finally:
        orphan.kill()


def test_sweep_removes_only_the_folders_of_dead_owners(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = process_start(dead.pid)
    dead.wait()
    orphaned = tmp_path / f"cubicml-trial-{dead.pid}-{dead_start}-00ab"
    mine = Path(new_trial_dir(str(tmp_path)))
    other = tmp_path / "cubicml-trial-q1w2e3"  # an older naming: not ours to judge
    for folder in (orphaned, mine, other):
        folder.mkdir()
        (folder / "stderr.txt").write_text("x")
    assert sweep_trial_dirs(str(tmp_path)) == [str(orphaned)]
    assert not orphaned.exists() and mine.exists() and other.exists()


# -- LocalPool --------------------------------------------------------------------------------
def test_local_pool_splits_the_cores_into_slots_and_refuses_too_few():
    from cubicml_lab.launch import LocalPool

    pool = LocalPool(2, devices=[0, 1, 2, 3, 4])
    assert pool.slots == 2 and pool.describe()["slot_devices"] == [[0, 1], [2, 3]]
    assert pool.describe()["env"] == {}  # the pinning is per slot, not an option
    with pytest.raises(ConfigError, match="2 cpu device"):
        LocalPool(3, devices=[0, 1])
    with pytest.raises(ConfigError, match="distinct"):
        LocalPool(1, devices=[0, 0])
    with pytest.raises(ConfigError, match="devices_per_trial"):
        LocalPool(0)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs 2 cores this process may run on")
def test_local_pool_runs_two_trials_at_once_each_on_its_own_core():
    from cubicml_lab.launch import LocalPool

    cores = sorted(os.sched_getaffinity(0))[:2]
    pool = LocalPool(1, devices=cores, timeout_s=120)
    spec = {**TINY_SPEC, "measure": {**FAST, "min_steps": 30, "max_steps": 60, "max_time_s": 2.0}}
    results, spans = [None, None], [None, None]

    def one(i: int) -> None:
        t0 = time.monotonic()
        results[i] = pool.run(spec)
        spans[i] = (t0, time.monotonic())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    seen = sorted(r.hardware["cpu_affinity"] for r in results)  # read inside each trial
    assert seen == [str(c) for c in cores]  # one core each, never the same one
    assert all(r.hardware["torch_threads"] == 1 for r in results)
    assert max(s[0] for s in spans) < min(s[1] for s in spans)  # they ran at the same time


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs 2 cores this process may run on")
def test_local_pool_runs_a_two_process_torchrun_trial_on_its_slot():
    from cubicml_lab.launch import LocalPool

    cores = sorted(os.sched_getaffinity(0))[:2]
    pool = LocalPool(2, nproc_per_node=2, devices=cores, timeout_s=180)
    res = pool.run({**TINY_SPEC, "config": {**TINY, "dp_shard": -1}})
    assert res.status == "ok", res.error
    assert res.hardware["world_size"] == 2
    assert res.hardware["cpu_affinity"] == ",".join(str(c) for c in cores)


# ------------------------------------------------------------------ Repeated: several processes
def test_repeated_shares_the_budget_and_round_trips_through_its_description() -> None:
    one = share_of_budget({"max_time_s": 6.0, "warmup_max_s": 3.0}, 2)
    assert one["max_time_s"] == pytest.approx(3.0)
    assert one["target_rel_ci"] == pytest.approx(0.015 * 2**0.5)  # MeasureOptions' default
    assert one["warmup_max_s"] == 3.0  # every process warms up in full
    assert (one["min_steps"], one["max_steps"]) == (3, 100)  # of 5 and 200
    launcher = Repeated(Subprocess(timeout_s=90, env={"A": "1"}), processes=3)
    back = launcher_from_dict(launcher.describe())
    assert isinstance(back, Repeated) and back.processes == 3
    assert back.launcher.describe() == launcher.launcher.describe()
    whole = launcher_from_dict(Repeated(processes=2, share_budget=False).describe())
    assert isinstance(whole, Repeated) and whole.share_budget is False
    assert launcher.skip_long_steps is True and "skip_long_steps=True" in repr(launcher)
    strict = launcher_from_dict(Repeated(processes=2, skip_long_steps=False).describe())
    assert isinstance(strict, Repeated) and strict.skip_long_steps is False
    for bad in ({"processes": 0}, {"processes": 1.5}, {"launcher": InProcess()},
                {"share_budget": "no"}, {"skip_long_steps": 1}):
        with pytest.raises(ConfigError, match="Repeated"):
            Repeated(**bad)
    with pytest.raises(ConfigError, match="measure"):
        share_of_budget({"max_tme_s": 1.0}, 2)


def _result(throughput: float, **metrics: float) -> TrialResult:
    return TrialResult(status="ok", metrics={"throughput": throughput, **metrics},
                       hardware={"hostname": "h"}, workload="gpt", config={"a": 1}, wall_s=2.0)


def test_combined_figures_are_geometric_means_and_counts_add_up() -> None:
    a = _result(100.0, throughput_raw=90.0, step_time_s=0.4, steps_timed=10.0,
                peak_mem_gib=1.0, contended=0.0, throughput_rel_ci=0.03, target_met=1.0)
    b = _result(121.0, throughput_raw=99.0, step_time_s=0.1, steps_timed=7.0,
                peak_mem_gib=1.5, contended=1.0, throughput_rel_ci=0.04, target_met=0.0)
    out = combine([a, b], [{"pid": 11, "start": 5}, {"pid": 12, "start": 6}], keep="median")
    m = out.metrics
    assert m["throughput"] == pytest.approx(110.0)  # sqrt(100 * 121)
    assert m["throughput"] / m["throughput_raw"] == pytest.approx(
        (100 / 90 * 121 / 99) ** 0.5)  # the ratios stay as they were
    assert m["step_time_s"] == pytest.approx(0.2)
    assert m["steps_timed"] == 17.0 and m["peak_mem_gib"] == 1.5 and m["contended"] == 1.0
    assert m["target_met"] == 0.0
    assert m["throughput_rel_ci"] == pytest.approx(0.025)  # sqrt(0.03^2 + 0.04^2) / 2
    assert m["process_spread"] == pytest.approx(21 / 110)
    assert m["processes"] == 2.0 and out.wall_s == 4.0
    assert [(p["pid"], p["throughput"]) for p in out.hardware["processes"]] == [
        (11, 100.0), (12, 121.0)]
    # three: the median process's figures; the slow one out of them, in the counts and CI
    slow = _result(60.0, throughput_raw=50.0, step_time_s=0.9, steps_timed=3.0, peak_mem_gib=2.0,
                   contended=1.0, throughput_rel_ci=0.05, target_met=1.0)
    three = combine([a, slow, replace(b, metrics={**b.metrics, "contended": 0.0})],
                    keep="median").metrics
    assert [three[k] for k in ("throughput", "throughput_raw", "step_time_s")] == pytest.approx(
        [100.0, 90.0, 0.4])
    assert three["contended"] == 0.0 and three["target_met"] == 1.0
    assert three["steps_timed"] == 20.0 and three["peak_mem_gib"] == 2.0
    assert three["throughput_rel_ci"] == pytest.approx((0.03**2 + 0.05**2 + 0.04**2) ** 0.5 / 3)
    assert three["process_spread"] == pytest.approx(61 / 100)


def test_drift_fit_redoes_the_correction_at_the_slope_the_trials_own_processes_show() -> None:
    """Process a ran while the reference read 33% slow (shift 0.4) and its raw figure only 23%
    slow; process b ran at the nominal speed. Corrected in full, a came out 15% above b;
    ``keep="drift_fit"`` re-corrects both at the slope between them (shrunk towards 1) and
    combines them, the default figures and the corrected ones alike; the raw ones stay."""
    from cubicml_lab.timing.figures import own_drift_slope

    def proc(raw: float, shift: float, contended: float = 0.0) -> TrialResult:
        fig = raw * math.exp(shift)
        return _result(fig, throughput_raw=raw, throughput_corrected=fig, tokens_per_s=fig,
                       step_time_s=1000.0 / fig, step_time_corrected_s=1000.0 / fig,
                       drift_corrected=1.0, contended=contended, throughput_rel_ci=0.02)

    a, b = proc(100.0, 0.4), proc(130.0, 0.0)
    m = combine([a, b], keep="drift_fit").metrics
    slope = own_drift_slope([100.0, 130.0], [0.4, 0.0])
    assert 0.6 < m["drift_slope"] == slope < 0.7
    expect = math.exp((math.log(100.0) + slope * 0.4 + math.log(130.0)) / 2)
    for name in ("throughput", "throughput_corrected", "tokens_per_s"):
        assert m[name] == pytest.approx(expect)
    assert m["step_time_s"] * m["throughput"] == pytest.approx(1000.0)
    assert m["step_time_corrected_s"] == pytest.approx(m["step_time_s"])
    assert m["throughput_raw"] == pytest.approx(math.sqrt(100.0 * 130.0))
    full = combine([a, b], keep="median").metrics  # every reference move taken out
    assert full["throughput"] == pytest.approx(math.sqrt(100 * math.exp(0.4) * 130.0))
    assert full["throughput"] > 1.06 * m["throughput"] and "drift_slope" not in full
    assert m["throughput_rel_ci"] == full["throughput_rel_ci"]  # of both processes
    # a flagged process, or figures with no reference (a GPU's): combined as they are
    flagged = combine([a, proc(130.0, 0.0, contended=1.0)], keep="drift_fit").metrics
    assert "drift_slope" not in flagged and flagged["throughput"] == full["throughput"]
    gpu = [_result(100.0, throughput_raw=100.0), _result(121.0, throughput_raw=121.0)]
    assert combine(gpu, keep="drift_fit").metrics["throughput"] == pytest.approx(110.0)
    assert Repeated(keep="drift_fit").keep == "drift_fit"


class _Recorded(Launcher):
    """Hands back process results given in advance, one per run: the figures of processes
    whose references read what a test needs, which a real trial cannot be made to read."""

    def __init__(self, results: list[TrialResult]) -> None:
        self.results = list(results)

    def run(self, spec: dict, *, on_start=None) -> TrialResult:  # type: ignore[no-untyped-def]
        return self.results.pop(0)

    def describe(self) -> dict:
        return {"kind": "recorded"}


def test_drift_fit_learns_the_slope_of_a_workloads_trials_for_one_whose_references_agree() -> None:
    """A configuration at 100/s that feels half of its reference's moves (slope 0.5). Two
    trials whose processes read their references apart show that; a third ran both processes
    while the reference read 18% slow (shift 0.2), which alone says nothing of the slope: the
    full correction puts it 10% high, the slope its launcher learned puts it within 1%."""

    def proc(shift: float, contended: float = 0.0, reference: str = "mlp rows=256",
             workload: str = "gpt") -> TrialResult:
        raw = 100.0 * math.exp(-0.5 * shift)
        fig = raw * math.exp(shift)
        return replace(_result(fig, throughput_raw=raw, throughput_corrected=fig,
                               drift_corrected=1.0, contended=contended),
                       hardware={"drift_reference": reference}, workload=workload)

    spec = {**TINY_SPEC, "workload": "gpt"}
    trials = [(0.3, 0.0), (0.0, 0.25), (0.2, 0.2)]
    launcher = Repeated(_Recorded([proc(x) for t in trials for x in t]), keep="drift_fit",
                        share_budget=False)
    first, second, third = (launcher.run(spec) for _ in trials)
    assert first.metrics["drift_slope_prior"] == 1.0  # nothing learned yet
    learned = second.metrics["drift_slope_prior"]
    assert 0.5 < learned < 0.6 and learned == pytest.approx(first.metrics["drift_slope"])
    assert third.metrics["drift_slope_prior"] < learned  # both trials pooled
    assert third.metrics["drift_slope"] == pytest.approx(third.metrics["drift_slope_prior"])
    assert third.metrics["throughput"] == pytest.approx(100.0, rel=0.01)
    alone = combine([proc(0.2), proc(0.2)], keep="drift_fit").metrics  # with no history
    assert alone["throughput"] == pytest.approx(100.0 * math.exp(0.1))
    slopes = launcher.drift_slopes()
    assert list(slopes) == [("gpt", "mlp rows=256")] and slopes[("gpt", "mlp rows=256")] < 0.6
    # another reference, or another workload, learns apart; a flagged trial teaches nothing
    other = [proc(0.0, reference="mlp bf16 rows=256"), proc(0.3, reference="mlp bf16 rows=256"),
             proc(0.3, contended=1.0), proc(0.0)]
    launcher.launcher = _Recorded(other)
    bf16 = launcher.run(spec)
    assert bf16.metrics["drift_slope_prior"] == 1.0
    flagged = launcher.run(spec)
    assert "drift_slope" not in flagged.metrics
    assert launcher.drift_slopes()[("gpt", "mlp rows=256")] == slopes[("gpt", "mlp rows=256")]
    assert set(launcher.drift_slopes()) == {("gpt", "mlp rows=256"),
                                            ("gpt", "mlp bf16 rows=256")}


def test_keep_fastest_takes_every_rate_from_the_fastest_process() -> None:
    slow = _result(90.0, throughput_raw=80.0, step_time_s=0.5, steps_timed=9.0, contended=1.0,
                   throughput_rel_ci=0.05, throughput_log_var=0.004, peak_mem_gib=2.0)
    fast = _result(100.0, throughput_raw=95.0, step_time_s=0.45, steps_timed=11.0, contended=0.0,
                   throughput_rel_ci=0.01, throughput_log_var=0.001, peak_mem_gib=1.0)
    out = combine([slow, fast], keep="fastest")
    m = out.metrics
    # every rate and its CI from the fast process, so their ratios stay its own
    assert [m[k] for k in ("throughput", "throughput_raw", "step_time_s", "contended",
                           "throughput_rel_ci", "throughput_log_var")] == [
        100.0, 95.0, 0.45, 0.0, 0.01, 0.001]
    assert m["steps_timed"] == 20.0 and m["peak_mem_gib"] == 2.0  # over every process
    assert m["process_spread"] == pytest.approx(0.1)
    assert [p["kept"] for p in out.hardware["processes"]] == [False, True]
    assert [(p["throughput_rel_ci"], p["throughput_raw"], p["contended"])
            for p in out.hardware["processes"]] == [(0.05, 80.0, 1.0), (0.01, 95.0, 0.0)]
    from cubicml_lab.timing import policy

    launcher = Repeated(processes=2)  # the library's default is the measurement policy's rule
    assert launcher.keep == policy.COMBINE == "drift_fit" and "keep='drift_fit'" in repr(launcher)
    assert launcher.share_budget is policy.SHARE_BUDGET
    back = launcher_from_dict(Repeated(processes=3, keep="median").describe())
    assert isinstance(back, Repeated) and back.keep == "median"
    with pytest.raises(ConfigError, match="keep = 'mean' is not one of fastest, median, drift"):
        Repeated(keep="mean")


@pytest.mark.slow
def test_repeated_measures_a_trial_in_fresh_processes_and_stops_at_a_failed_one() -> None:
    started: list[dict] = []
    res = Repeated(Subprocess(timeout_s=120), processes=2, keep="fastest").run(
        TINY_SPEC, on_start=started.append)
    check_ok(res)
    pids = [p["pid"] for p in res.hardware["processes"]]
    assert len(pids) == 2 and pids[0] != pids[1] and pids == [r["pid"] for r in started]
    figures = [p["throughput"] for p in res.hardware["processes"]]
    assert res.metrics["throughput"] == max(figures)  # the faster process's figure, exactly
    assert res.metrics["processes"] == 2.0
    started.clear()
    oom = Repeated(Subprocess(timeout_s=120, memory_limit_gib=3), processes=2).run(
        {**TINY_SPEC, "config": HUGE}, on_start=started.append)
    assert oom.status == "oom" and len(started) == 1  # no second process after the first failed
    started.clear()  # a budget its first process's minimum steps overran: no second process
    long = Repeated(Subprocess(timeout_s=120), processes=2).run(
        {**TINY_SPEC, "measure": {**FAST, "max_time_s": 0.001}}, on_start=started.append)
    check_ok(long)
    assert len(started) == 1 and long.metrics["processes"] == 1.0
    assert long.hardware["processes_skipped"] == 1 and len(long.hardware["processes"]) == 1
