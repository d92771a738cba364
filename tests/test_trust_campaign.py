"""Trust boundaries of a campaign: stored and imported data never causes a signal, concurrent
runs share one budget, sizes and options are checked when built, damaged rows and formula cells
are handled. Real processes, a real SQLite file, real signals."""

from __future__ import annotations

import csv
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cubicml_lab as cml
from cubicml_lab.errors import ConfigError, StoreError
from cubicml_lab.launch.process import (OWNER_ENV, TOKEN_ENV, end_trial_process, hold_token,
                                        new_token, process_start, release_token)
from cubicml_lab.store.tables import FORMULA_STARTS, csv_cell, from_csv_cell
from test_campaign import FAKE_TRIAL, _log  # the cheapest real trial process

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
SPACE = cml.Space([cml.PowerOfTwo("micro_batch", 1, 64)])
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _dead_owner() -> tuple[int, int]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = process_start(proc.pid)
    proc.wait()
    return proc.pid, start


@pytest.fixture
def sleeper():
    """A live process in its own process group, started by the test (not by the lab)."""
    proc = subprocess.Popen(SLEEP, start_new_session=True)
    time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


def _record(pid: int, owner: tuple[int, int], token: str | None = None) -> dict:
    record = {"host": socket.gethostname(), "pid": pid, "start": process_start(pid),
              "owner_pid": owner[0], "owner_start": owner[1]}
    return record if token is None else {**record, "token": token}


def _campaign(store, name="trust", **kwargs):
    return cml.Campaign(name, SPACE, workload="gpt", store=store,
                        searcher=cml.RandomSearch(SPACE, seed=0), **kwargs)


# -- 1. signals only to what this lab started ---------------------------------------------------
@LINUX
def test_a_forged_running_row_naming_a_live_process_never_signals_it(tmp_store, sleeper):
    camp = _campaign(tmp_store)
    tid = tmp_store.add_trial("trust", {"micro_batch": 4}, workload="gpt")
    # a hand edit: a guessed secret, the sleeper's true pid and start time, a dead owner
    tmp_store.mark_running(tid, hardware={"process": _record(sleeper.pid, _dead_owner(),
                                                             new_token())})
    with pytest.warns(UserWarning, match=f"trial {tid}'s stored process record"):
        proposals = camp.propose(1)
    time.sleep(0.2)
    assert sleeper.poll() is None and _alive(sleeper.pid), "a forged record was signalled"
    assert proposals[0].trial_id == tid and tmp_store.get_trial(tid).status == "pending"


@LINUX
def test_an_imported_running_row_is_interrupted_and_never_signals(tmp_path, tmp_store, sleeper):
    _campaign(tmp_store)
    path = tmp_path / "forged.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["campaign", "status", "config", "hardware", "started_at"])
        for status, mb in (("running", 8), ("pending", 16)):
            writer.writerow(["trust", status, json.dumps({"micro_batch": mb}), json.dumps(
                {"process": _record(sleeper.pid, _dead_owner(), new_token()), "cpu": "x"}),
                "1.0"])
    assert tmp_store.import_(path) == 2
    imported = tmp_store.trials("trust")
    assert [t.status for t in imported] == ["pending", "pending"]
    assert all(t.hardware == {"cpu": "x"} and t.started_at is None for t in imported)
    camp = _campaign(tmp_store)  # resumed: the imported trials are run again first
    assert {p.trial_id for p in camp.propose(2)} == {t.id for t in imported}
    assert sleeper.poll() is None


@LINUX
def test_a_copied_record_of_a_trial_this_process_runs_never_ends_it(tmp_store):
    """A secret held by a guard of this process proves nothing: a record copied onto another
    trial (same secret, same owner) leaves the running trial alone."""
    owner, token = _dead_owner(), new_token()
    env = {**os.environ, TOKEN_ENV: token, OWNER_ENV: f"{owner[0]}:{owner[1]}"}
    ours = subprocess.Popen(SLEEP, start_new_session=True, env=env)
    hold_token(token)
    try:
        time.sleep(0.05)
        assert end_trial_process(_record(ours.pid, owner, token)) == "not ours"
        assert ours.poll() is None
        release_token(token)  # the guard is gone from this process: now a real orphan
        assert end_trial_process(_record(ours.pid, owner, token)) == "ended"
        assert ours.wait(timeout=5) == -9
    finally:
        release_token(token)
        ours.kill()


@LINUX
def test_a_genuine_orphan_of_a_killed_campaign_is_still_ended(tmp_store):
    """The environment a lab guard carries (secret and dead owner) is proof: it is ended."""
    owner, token = _dead_owner(), new_token()
    env = {**os.environ, TOKEN_ENV: token, OWNER_ENV: f"{owner[0]}:{owner[1]}"}
    orphan = subprocess.Popen(SLEEP, start_new_session=True, env=env)
    try:
        time.sleep(0.05)
        camp = _campaign(tmp_store)
        tid = tmp_store.add_trial("trust", {"micro_batch": 2}, workload="gpt")
        tmp_store.mark_running(tid, hardware={"process": _record(orphan.pid, owner, token)})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # proven: no warning
            camp.propose(1)
        assert orphan.wait(timeout=5) == -9
        assert tmp_store.get_trial(tid).status == "pending"
    finally:
        orphan.kill()


_TOKEN = new_token()
_OWNER = _dead_owner()
_SLEEPER: list[subprocess.Popen] = []


def _shared_sleeper() -> subprocess.Popen:
    """One sleeper carrying ``_TOKEN`` and ``_OWNER`` for every example."""
    if not _SLEEPER or _SLEEPER[0].poll() is not None:
        env = {**os.environ, TOKEN_ENV: _TOKEN, OWNER_ENV: f"{_OWNER[0]}:{_OWNER[1]}"}
        _SLEEPER[:] = [subprocess.Popen(SLEEP, start_new_session=True, env=env)]
        time.sleep(0.05)
    return _SLEEPER[0]


@LINUX
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(token=st.one_of(st.none(), st.text(max_size=40), st.from_regex(r"\A[0-9a-f]{32}\Z")),
       owner_pid=st.integers(2, 2**22), owner_start=st.integers(2, 2**40),
       host=st.sampled_from(["this", "other"]), extra=st.dictionaries(
           st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=2))
def test_forged_process_records_never_cause_a_signal(token, owner_pid, owner_start, host, extra):
    proc = _shared_sleeper()
    if token == _TOKEN and (owner_pid, owner_start) == _OWNER:
        return  # the one true record
    record = {**extra, **_record(proc.pid, (owner_pid, owner_start), token)}
    if host == "other":
        record["host"] = "elsewhere.example"
    if token is None:
        record.pop("token", None)
    assert end_trial_process(record, timeout_s=0.1) in ("not ours", "elsewhere", "gone")
    assert proc.poll() is None, f"signalled on a forged record {record}"


def teardown_module() -> None:
    for proc in _SLEEPER:
        proc.kill()
        proc.wait()


# -- 2. concurrent runs share one budget --------------------------------------------------------
SHARED_RUN = """
import sys, cubicml_lab as cml
path, fake = sys.argv[1], sys.argv[2]
space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 64)])
camp = cml.Campaign("shared", space, workload="gpt", store=cml.TrialStore(path),
                    launcher=cml.launch.Subprocess(python=fake, timeout_s=120),
                    searcher=cml.RandomSearch(space, seed=0))  # same seed: same proposals
camp.run(5, 2, progress=False, verbose=False)
"""


@LINUX
def test_three_processes_running_one_campaign_share_its_budget_exactly(tmp_path):
    fake, log = tmp_path / "py", tmp_path / "log"
    fake.write_text(FAKE_TRIAL.format(python=sys.executable))
    fake.chmod(0o755)
    store_path = tmp_path / "lab.sqlite"
    cml.TrialStore(store_path).close()
    env = {**os.environ, "FAKE_LOG": str(log), "FAKE_HANG": str(tmp_path / "no-hang")}
    procs = [subprocess.Popen([sys.executable, "-c", SHARED_RUN, str(store_path), str(fake)],
                              env=env, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
    with cml.TrialStore(store_path) as store:
        trials = store.trials("shared")
    assert [t.status for t in trials] == ["ok"] * 5, "the budget of 5 is shared exactly"
    configs = [t.config["micro_batch"] for t in trials]
    assert len(set(configs)) == 5, f"a configuration was measured twice: {configs}"
    runs = _log(log)
    assert sorted(mb for event, mb, _, _ in runs if event == "start") == sorted(configs), \
        f"trials measured: {runs}"


# -- 3. checked when built ----------------------------------------------------------------------
def test_device_options_and_sizes_are_checked_when_built(tmp_store, tmp_path):
    import importlib.util

    gpu = importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available()
    bad = [({"device": "tpu"}, "device = 'tpu'"),
           ({"device": "cuda:9999"}, "device = 'cuda:9999'"),
           ({"measure_options": {"max_stepz": 3}}, "measure_options: unknown"),
           ({"measure_options": {"max_steps": "many"}}, "max_steps"),
           ({"measure_options": {"min_steps": 0}}, "min_steps"),
           ({"measure_options": {"max_steps": 10**30}}, "max_steps"),
           ({"measure_options": [1]}, "measure_options must be a dict")]
    if not gpu:
        bad.append(({"device": "cuda"}, "has 0 usable CUDA"))
    for kwargs, match in bad:
        with pytest.raises(ConfigError, match=match.replace("(", r"\(")):
            _campaign(tmp_store, **kwargs)
    camp = _campaign(tmp_store, measure_options={"max_time_s": 1, "min_steps": 3})
    for field, value in (("parallel", 10**9), ("budget", 10**12), ("budget", 0),
                         ("parallel", True)):
        with pytest.raises(ConfigError, match=field):
            setattr(camp, field, value)
    camp.budget, camp.parallel = 12, 2
    with pytest.raises(ConfigError, match="parallel"):
        camp.run(3, 10**9)
    # a campaign file's values are checked when it is loaded, naming the field
    path = camp.to_yaml(tmp_path / "c.yaml", budget=3)
    text = path.read_text()
    for old, new, match in (("parallel: 2", "parallel: 1000000000", "parallel"),
                            ("budget: 3", "budget: 1000000000000", "budget"),
                            ("device: cpu", "device: tpu", "device")):
        assert old in text
        path.write_text(text.replace(old, new))
        with pytest.raises(ConfigError, match=match):
            cml.Campaign.from_yaml(path)


# -- 4. clear errors ----------------------------------------------------------------------------
def test_a_damaged_json_row_names_table_row_and_column_and_the_rest_stays(tmp_path):
    path = tmp_path / "lab.sqlite"
    with cml.TrialStore(path) as store:
        _campaign(store)
        good = store.record_trial("trust", {"micro_batch": 1}, status="ok",
                                  metrics={"throughput": 1.0})
        bad = store.record_trial("trust", {"micro_batch": 2}, status="ok",
                                 metrics={"throughput": 2.0})
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE trials SET metrics = '{not json' WHERE id = ?", (bad,))
    with cml.TrialStore(path) as store:
        with pytest.raises(StoreError, match=f"table 'trials', row {bad}, column 'metrics'"):
            store.get_trial(bad)
        with pytest.warns(UserWarning, match=f"row {bad}"):
            assert [t.id for t in store.trials("trust")] == [good]
        camp = _campaign(store)
        with pytest.warns(UserWarning, match=f"row {bad}"):
            camp.propose(1)  # resumes over the damaged row
        assert camp.searcher.n_told == 1
        assert store.counts("trust") == {"ok": 2}  # nothing stored was lost
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE campaigns SET metadata = '[' WHERE name = 'trust'")
    with cml.TrialStore(path) as store:
        with pytest.raises(StoreError, match="table 'campaigns', row 'trust', column 'metadata'"):
            store.campaign_info("trust")


def test_a_store_path_over_the_os_limits_is_a_store_error(tmp_path):
    with pytest.raises(StoreError, match="more than the 255"):
        cml.TrialStore(tmp_path / ("x" * 300 + ".sqlite"))
    with pytest.raises(StoreError, match="more than the 4096"):
        cml.TrialStore(tmp_path.joinpath(*["d" * 200] * 25, "lab.sqlite"))



def test_a_fifo_or_device_as_the_store_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "lab.sqlite"
    os.mkfifo(fifo)  # opening it to read the SQLite header would block forever
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(StoreError, match="not a regular file"):
            cml.TrialStore(path)

_CELL = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=12)
_FORMULA = st.builds(lambda a, b: a + b, st.sampled_from([*FORMULA_STARTS, "'", "''", "'="]),
                     _CELL)


@given(st.one_of(_CELL, _FORMULA))
def test_csv_cell_escapes_formulas_and_undoes_exactly_that(text):
    cell = csv_cell(text)
    assert cell[:1] not in FORMULA_STARTS
    assert from_csv_cell(cell) == text


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(_FORMULA, _CELL).filter(lambda s: s.strip()), min_size=1, max_size=3))
def test_export_import_of_formula_text_is_lossless_and_escaped(errors):
    with tempfile.TemporaryDirectory() as folder:
        with cml.TrialStore(Path(folder) / "a.sqlite") as store:
            store.create_campaign("=cmd|' /C calc'!A0", workload="gpt")
            for i, error in enumerate(errors):
                store.record_trial("=cmd|' /C calc'!A0", {"micro_batch": i}, status="failed",
                                   error=error, workload_version=error)
            out = store.export(Path(folder) / "t.csv")
            before = [(t.campaign, t.error, t.workload_version) for t in store.trials()]
        with out.open(newline="", encoding="utf-8") as fh:
            cells = [c for row in csv.reader(fh) for c in row]
        assert not [c for c in cells if c[:1] in FORMULA_STARTS]
        with cml.TrialStore(Path(folder) / "b.sqlite") as copy:
            copy.import_(out)
            assert [(t.campaign, t.error, t.workload_version) for t in copy.trials()] == before
