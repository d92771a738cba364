"""Tests for cubicml_lab.store across real processes: one new file created by several at once,
and several processes starting the trials of one campaign (each trial is started once).

Each worker is a fresh Python process (subprocess) that the test releases through its stdin,
all at the same moment, once per round: a barrier without threads or shared memory."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from cubicml_lab.store import TrialStore

#: For each store path given: say "ready", wait for "go", then create and write ``n`` trials.
_WRITER = textwrap.dedent("""
    import sys, traceback
    from cubicml_lab.store import TrialStore
    worker, n, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    for path in paths:
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            with TrialStore(path) as store:
                store.create_campaign("race", workload="gpt")
                for i in range(n):
                    tid = store.add_trial("race", {"worker": worker, "i": i}, workload="gpt")
                    store.mark_running(tid)
                    store.finish_trial(tid, status="ok",
                                       metrics={"throughput": float(worker * 100 + i)})
        except Exception:
            print("FAILED", path, traceback.format_exc().replace("\\n", " | "), flush=True)
""")


def _run_in_lockstep(script: str, workers: list[list[str]], rounds: int) -> list[str]:
    """Run ``script`` once per argument list; release all of them together ``rounds`` times
    (each waits for "go" after printing "ready"). Returns every line they printed otherwise."""
    procs = [subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for args in workers]
    lines: list[str] = []
    try:
        for _ in range(rounds):
            for p in procs:  # a barrier: every worker is ready ...
                while (line := p.stdout.readline()) and not line.startswith("ready"):
                    lines.append(line.strip())
                assert line, f"a worker ended early: {lines}"
            for p in procs:  # ... then all go at once
                p.stdin.write("go\n")
                p.stdin.flush()
        for p in procs:
            out, _ = p.communicate(timeout=120)
            lines += out.splitlines()
            assert p.returncode == 0, lines
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return lines


def test_four_processes_create_and_write_one_new_store_at_once(tmp_path: Path):
    rounds, n = 25, 4  # every round a brand-new store file: the race is at its creation
    paths = [str(tmp_path / f"round{r}" / "lab.sqlite") for r in range(rounds)]
    lines = _run_in_lockstep(_WRITER, [[str(w), str(n), *paths] for w in range(4)], rounds)
    failed = [line for line in lines if line.startswith("FAILED")]
    assert not failed, f"{len(failed)} of {4 * rounds} opens failed:\n" + "\n".join(failed[:4])
    for path in paths:
        with TrialStore(path) as store:
            trials = store.trials("race")
            assert sorted((t.config["worker"], t.config["i"]) for t in trials) == [
                (w, i) for w in range(4) for i in range(n)]
            assert {t.status for t in trials} == {"ok"}
            assert all(t.metrics["throughput"] == t.config["worker"] * 100 + t.config["i"]
                       for t in trials)
        with sqlite3.connect(path) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


#: Tries to start every pending trial of campaign "c" together with the others (worker k from
#: the k-th quarter on, so that they meet); prints the ids it got, then its StoreErrors.
_CLAIMER = textwrap.dedent("""
    import sys, time
    from cubicml_lab.errors import StoreError
    from cubicml_lab.store import TrialStore
    store, worker = TrialStore(sys.argv[1]), int(sys.argv[2])
    ids = [t.id for t in store.trials("c", status="pending")]
    ids = ids[worker * len(ids) // 4:] + ids[:worker * len(ids) // 4]
    print("ready", flush=True)
    sys.stdin.readline()
    got, refused = [], []
    for tid in ids:
        try:
            store.mark_running(tid)
            got.append(tid)
        except StoreError as err:
            refused.append(str(err).splitlines()[0])
        time.sleep(0.002)  # a little work between claims, so that the workers interleave
    for tid in got:
        store.finish_trial(tid, status="ok", metrics={"throughput": 1.0})
    print("got", *got, flush=True)
    for message in refused:
        print("refused", message, flush=True)
""")


def test_each_trial_is_started_by_exactly_one_of_four_processes(tmp_path: Path):
    path, n = tmp_path / "lab.sqlite", 40
    with TrialStore(path) as store:
        store.create_campaign("c", workload="gpt")
        ids = [store.add_trial("c", {"i": i}, workload="gpt") for i in range(n)]
    lines = _run_in_lockstep(_CLAIMER, [[str(path), str(w)] for w in range(4)], rounds=1)
    got = [int(tid) for line in lines if line.startswith("got") for tid in line.split()[1:]]
    refused = [line for line in lines if line.startswith("refused")]
    assert sorted(got) == ids  # every trial started once, none twice
    assert len(refused) == 3 * n  # and every other attempt was a clear StoreError
    assert all(re.match(r"refused mark_running: trial \d+ is '(running|ok)'", line)
               for line in refused), refused[:3]
    with TrialStore(path) as store:
        assert [t.status for t in store.trials("c")] == ["ok"] * n
