"""Kill a running CPU campaign at random moments, restart it each time, and count what was lost.

A real campaign (the ``gpt`` workload, tiny models, ~0.6 s of measurement per trial, each trial in
a fresh interpreter through the ``Subprocess`` launcher, ``BayesianSearch``, a SQLite store in a
temporary folder) runs in a child process. The soak SIGKILLs it, checks, and starts it again:
``--kills-serial`` times with ``parallel=1``, then ``--kills-parallel`` times with ``parallel=2``
(each phase its own campaign), and finally lets each campaign finish a few more trials unharmed.

Kill moments are drawn at random among five kinds, found by watching from outside (the library
has no test hooks): ``random`` (uniform in the first 10 s after the start: importing, reading the
store, ending what the last campaign left, or anywhere later), ``trial`` (while a trial process
runs), ``claim`` (right after a trial's folder appears: the campaign is writing the trial as
running), ``result`` (right after a finished trial's folder is removed: the campaign is storing the
result and telling the searcher) and ``ask`` (20-800 ms later: the searcher's ask, a GP fit once
the initial design is done, and the next trial's start). The soak also notes whether the campaign
process was on the CPU when it was killed (a GP fit, a store write).

After each kill it checks, and at the end prints:

* **lost**: a finished trial that a later check no longer finds (or finds changed), or a trial
  still pending or running after the final unharmed runs;
* **duplicated**: two live trial processes measuring the same configuration at the same moment
  (sampled every 50 ms from ``/proc``), or one configuration finished twice in a campaign;
* **trial processes alive after a kill**: processes of the killed campaign's tree (found by an
  environment tag) still alive 3 s after the kill (they are left running, as they would be);
  and how long the slowest took to go;
* **leftover temp folders**: distinct ``cubicml-trial-*`` folders in the campaign's temp dir once
  the killed tree is gone, or 3 s after the kill (before the next start could sweep them);
* **integrity failures**: ``PRAGMA integrity_check`` not ``ok`` after a kill.

Linux only (``/proc``); the soak makes itself a child subreaper so that the orphans it checks for
are reaped as they die.

Run:
    .venv/bin/python benchmarks/reliability_soak.py          # 50 + 20 kills, ~12-15 min, 2 cores
    .venv/bin/python benchmarks/reliability_soak.py --kills-serial 3 --kills-parallel 2  # ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import BinaryIO

FIXED = {"vocab": 128, "n_heads": 2}
MEASURE = {"max_time_s": 0.3, "warmup_max_s": 0.3, "min_steps": 3}
MOMENTS = {"random": 0.3, "trial": 0.2, "claim": 0.15, "result": 0.15, "ask": 0.2}
SETTLE_S = 3.0


# ---------------------------------------------------------------- the campaign (child process)
def run_campaign(args: argparse.Namespace) -> None:
    """The child: one campaign run, resuming whatever the store holds."""
    import cubicml_lab as cml

    space = cml.Space([cml.PowerOfTwo("micro_batch", 1, 8),
                       cml.Ordinal("d_model", [16, 32, 48, 64]), cml.Int("n_layers", 1, 2),
                       cml.Ordinal("seq_len", [16, 32]), cml.Choice("precision", ["fp32", "bf16"]),
                       cml.Choice("recompute", ["none", "full"])])  # 256 configurations
    search = cml.BayesianSearch(space, seed=0, stop_patience=10**6)  # never stops by itself
    camp = cml.Campaign(args.name, space, workload="gpt", searcher=search,
                        launcher=cml.launch.Subprocess(timeout_s=120),
                        store=cml.TrialStore(args.store), measure_options=MEASURE, fixed=FIXED)
    camp.run(args.budget, args.parallel, progress=False, verbose=False)


# ---------------------------------------------------------------- processes, seen from /proc
def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def cpu_ticks(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[11]) + int(fields[12]) if fields else 0


def tagged(tag: str) -> list[int]:
    """Live processes whose environment holds ``CUBICML_SOAK_TAG=<tag>``."""
    needle, found = f"CUBICML_SOAK_TAG={tag}".encode(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in env and alive(int(entry)):
                found.append(int(entry))
    return found


def trial_processes() -> dict[tuple[int, str], str]:
    """Live trial processes (``python -m cubicml_lab.launch.worker``, not their guards):
    (pid, start) -> path of their spec. A trial's own child between fork and exec (e.g. ``ldconfig`` run by
    ``ctypes.util.find_library``) shows the same command line for a moment: it is left out."""
    out, parents = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        fields = _stat(int(entry))
        if argv[1:3] == ["-m", "cubicml_lab.launch.worker"] and "--spec" in argv and fields \
                and fields[0] not in ("Z", "X"):
            out[(int(entry), fields[19])] = argv[argv.index("--spec") + 1]
            parents[int(entry)] = int(fields[1])
    pids = set(parents)
    return {proc: spec for proc, spec in out.items() if parents[proc[0]] not in pids}


def become_subreaper() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def reap_orphans() -> None:
    """Reap zombie children other than the Popen-managed campaign (orphans adopted by us)."""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields and fields[1] == me and fields[0] == "Z" and int(entry) not in CAMPAIGN_PIDS:
            try:
                os.waitpid(int(entry), os.WNOHANG)
            except ChildProcessError:
                pass


CAMPAIGN_PIDS: set[int] = set()


# ---------------------------------------------------------------- watching a running campaign
class Monitor:
    """Polls the campaign's temp dir and the trial processes; records duplicates as it goes."""

    def __init__(self, tmpdir: Path) -> None:
        self.tmpdir = tmpdir
        self.dirs: set[str] = set()
        self.removed = 0  # trial folders removed since the start (a trial's end)
        self.live: dict[tuple[int, str], str] = {}  # live trial processes -> config key
        self.duplicates: set[frozenset] = set()
        self._keys: dict[tuple[int, str], str] = {}
        self._next_scan = 0.0
        self.campaign = 0  # pid of the campaign process watched
        self._cpu: list[tuple[float, int]] = []  # (time, its CPU ticks)

    def watch(self, pid: int) -> None:
        self.campaign, self._cpu = pid, []

    def on_cpu(self) -> bool:
        """Was the campaign process busy over the last ~50 ms (>= 20 ms of CPU)?"""
        now, ticks = time.monotonic(), cpu_ticks(self.campaign)
        past = [k for t, k in self._cpu if now - t >= 0.05]
        return bool(past) and ticks - past[-1] >= 2

    def poll(self) -> None:
        now = {n for n in os.listdir(self.tmpdir) if n.startswith("cubicml-trial-")}
        self.removed += len(self.dirs - now)
        self.dirs = now
        if self.campaign:
            t = time.monotonic()
            self._cpu = [(s, k) for s, k in self._cpu if t - s < 0.2] + [
                (t, cpu_ticks(self.campaign))]
        if time.monotonic() >= self._next_scan:
            self._next_scan = time.monotonic() + 0.05
            self._scan_trials()

    def key_of(self, proc: tuple[int, str]) -> str:
        return self._keys.get(proc, "?")

    def _scan_trials(self) -> None:
        self.live = {}
        for proc, spec_path in trial_processes().items():
            if proc not in self._keys:
                try:
                    config = json.loads(Path(spec_path).read_text())["config"]
                except (OSError, ValueError, KeyError):
                    continue
                self._keys[proc] = json.dumps(config, sort_keys=True)
            self.live[proc] = self._keys[proc]
        by_key: dict[str, list] = {}
        for proc, key in self.live.items():
            by_key.setdefault(key, []).append(proc)
        for procs in by_key.values():
            if len(procs) > 1:
                self.duplicates.add(frozenset(procs))


def wait_for_moment(kind: str, proc: subprocess.Popen, mon: Monitor, rng: random.Random,
                    limit_s: float = 120.0) -> bool:
    """Wait until a moment of ``kind`` (see the module docstring); False if the campaign ended
    by itself first."""
    t0 = time.monotonic()
    removed = mon.removed
    dirs = set(mon.dirs)
    target = t0 + rng.uniform(0, 10) if kind == "random" else None
    while proc.poll() is None:
        mon.poll()
        now = time.monotonic()
        if target is None:
            if kind == "trial" and mon.live:
                target = now + rng.uniform(0, 1.5)
            elif kind == "claim" and mon.dirs - dirs:
                target = now + rng.uniform(0, 0.03)
            elif kind == "result" and mon.removed > removed:
                target = now + rng.uniform(0, 0.02)
            elif kind == "ask" and mon.removed > removed:
                target = now + rng.uniform(0.02, 0.8)
            elif now - t0 > limit_s:
                target = now
        if target is not None and now >= target:
            return True
        time.sleep(0.002 if target is not None and target - now < 0.05 else 0.01)
    return False


def settle(tag: str, mon: Monitor) -> tuple[int, float, set[str]]:
    """After a kill: (processes of the killed tree alive after SETTLE_S, seconds until all were
    gone, trial folders in the temp dir then). Survivors are left running, as they would be."""
    t0 = time.monotonic()
    while True:
        reap_orphans()
        left = tagged(tag)
        mon.poll()
        if not left or time.monotonic() - t0 > SETTLE_S:
            break
        time.sleep(0.01)
    folders = {n for n in os.listdir(mon.tmpdir) if n.startswith("cubicml-trial-")}
    return len(left), time.monotonic() - t0, folders


# ---------------------------------------------------------------- what the store holds
def read_store(path: Path) -> tuple[bool, dict[int, tuple], list[tuple]]:
    """(integrity ok, finished trials id -> (campaign, status, metrics, config), unfinished
    trials as (id, campaign, status))."""
    if not path.exists():
        return True, {}, []
    with sqlite3.connect(path) as conn:
        ok = conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = conn.execute("SELECT id, campaign, status, metrics, config FROM trials").fetchall()
    conn.close()
    finished = {r[0]: r[1:] for r in rows if r[2] not in ("pending", "running")}
    unfinished = [(r[0], r[1], r[2]) for r in rows if r[2] in ("pending", "running")]
    return ok, finished, unfinished


def lost_between(before: dict[int, tuple], after: dict[int, tuple]) -> int:
    """Finished trials of ``before`` that ``after`` lacks or holds changed."""
    return sum(1 for tid, row in before.items() if after.get(tid) != row)


def twice_finished(finished: dict[int, tuple]) -> dict[tuple[str, str], list[int]]:
    """Configurations finished more than once in one campaign -> their trial ids."""
    seen: dict[tuple[str, str], list[int]] = {}
    for tid, (campaign, _, _, config) in sorted(finished.items()):
        key = (campaign, json.dumps(json.loads(config), sort_keys=True))
        seen.setdefault(key, []).append(tid)
    return {key: ids for key, ids in seen.items() if len(ids) > 1}


# ---------------------------------------------------------------- the soak
class Soak:
    """Runs the kill cycles of both phases and keeps the counts."""

    def __init__(self, root: Path, seed: int, log: BinaryIO) -> None:
        self.root, self.rng, self.log = root, random.Random(seed), log
        self.store = root / "lab.sqlite"
        self.tmpdir = root / "tmp"
        self.tmpdir.mkdir()
        self.mon = Monitor(self.tmpdir)
        self.leftover: set[str] = set()
        self.counts = {"kills": 0, "lost": 0, "alive after a kill": 0,
                       "integrity failures": 0, "kills with a trial running": 0,
                       "kills with the campaign on the CPU": 0, "ended by itself": 0}
        self.moments: dict[str, int] = {}
        self.slowest_gone_s = 0.0
        self.finished: dict[int, tuple] = {}

    def start(self, name: str, parallel: int, budget: int, tag: str) -> subprocess.Popen:
        env = {**os.environ, "TMPDIR": str(self.tmpdir), "CUBICML_SOAK_TAG": tag}
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--store", str(self.store),
               "--name", name, "--parallel", str(parallel), "--budget", str(budget)]
        proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log,
                                stdin=subprocess.DEVNULL)
        CAMPAIGN_PIDS.add(proc.pid)
        return proc

    def kill_cycle(self, name: str, parallel: int) -> None:
        tag = uuid.uuid4().hex
        proc = self.start(name, parallel, 10**6, tag)
        self.mon.watch(proc.pid)
        kind = self.rng.choices(list(MOMENTS), weights=list(MOMENTS.values()))[0]
        if not wait_for_moment(kind, proc, self.mon, self.rng):
            self.counts["ended by itself"] += 1
            if proc.returncode != 0:
                raise SystemExit(f"the campaign failed by itself (rc {proc.returncode}); "
                                 f"see {self.root / 'campaign.log'}")
        busy, running = self.mon.on_cpu(), bool(self.mon.live)
        proc.kill()
        proc.wait()
        self.counts["kills"] += 1
        self.moments[kind] = self.moments.get(kind, 0) + 1
        self.counts["kills with a trial running"] += running
        self.counts["kills with the campaign on the CPU"] += busy
        self.check(*settle(tag, self.mon))

    def check(self, alive_after: int, gone_s: float, folders: set[str]) -> None:
        self.counts["alive after a kill"] += alive_after
        self.leftover |= folders
        self.slowest_gone_s = max(self.slowest_gone_s, gone_s)
        ok, finished, _ = read_store(self.store)
        self.counts["integrity failures"] += not ok
        self.counts["lost"] += lost_between(self.finished, finished)
        self.finished = finished

    def finish(self, name: str, parallel: int) -> None:
        """Let the campaign finish a few more trials unharmed: every trial must end final."""
        done = sum(1 for row in self.finished.values() if row[0] == name)
        proc = self.start(name, parallel, done + parallel + 1, uuid.uuid4().hex)
        while proc.poll() is None:
            self.mon.poll()
            time.sleep(0.01)
        if proc.returncode != 0:
            raise SystemExit(f"the final run of {name} failed (rc {proc.returncode}); "
                             f"see {self.root / 'campaign.log'}")
        ok, finished, unfinished = read_store(self.store)
        self.counts["integrity failures"] += not ok
        self.counts["lost"] += lost_between(self.finished, finished)
        self.counts["lost"] += sum(1 for _, campaign, _ in unfinished if campaign == name)
        self.finished = finished


def report(soak: Soak, args: argparse.Namespace, wall_s: float) -> None:
    c = soak.counts
    twice = twice_finished(soak.finished)
    at_once = len(soak.mon.duplicates)
    duplicated = at_once + sum(len(ids) - 1 for ids in twice.values())
    moments = ", ".join(f"{n} {k}" for k, n in sorted(soak.moments.items()))
    rows = [
        ("kills", c["kills"], (f"{args.kills_serial} at parallel=1, {args.kills_parallel} at "
                               f"parallel=2; moments: {moments}")),
        ("  with a trial process running", c["kills with a trial running"], ""),
        ("  with the campaign on the CPU", c["kills with the campaign on the CPU"],
         "GP fit, store write, start-up"),
        ("trials finished", len(soak.finished), "in the store at the end, both campaigns"),
        ("lost", c["lost"], "finished trials missing later, or unfinished at the end"),
        ("duplicated", duplicated, (f"{at_once} measured twice at once, "
                                    f"{duplicated - at_once} finished twice")),
        ("trial processes alive after a kill", c["alive after a kill"],
         f"{SETTLE_S:g} s after it; slowest to go {soak.slowest_gone_s:.2f} s"),
        ("leftover temp folders", len(soak.leftover), "distinct, seen after a kill"),
        ("integrity failures", c["integrity failures"], "PRAGMA integrity_check"),
    ]
    print(f"\nreliability soak: {wall_s / 60:.1f} min, store {soak.store}")
    for label, value, note in rows:
        print(f"{label:<36}{value:>6}   {note}")
    for procs in soak.mon.duplicates:
        print("  at once:", sorted(procs), soak.mon.key_of(next(iter(procs))))
    for (campaign, config), ids in twice.items():
        print(f"  finished twice in {campaign}: trials {ids}, {config}")
    if c["ended by itself"]:
        print(f"(campaign runs that ended before their kill moment: {c['ended by itself']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills-serial", type=int, default=50)
    parser.add_argument("--kills-parallel", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--parallel", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_campaign(args)
    from tqdm.auto import tqdm

    become_subreaper()
    root = Path(tempfile.mkdtemp(prefix="cubicml-soak-"))
    t0 = time.perf_counter()
    with (open(root / "campaign.log", "ab") as log,
          tqdm(total=args.kills_serial + args.kills_parallel, unit="kill") as bar):
        soak = Soak(root, args.seed, log)
        for parallel, kills in ((1, args.kills_serial), (2, args.kills_parallel)):
            name = f"soak-parallel-{parallel}"
            for _ in range(kills):
                soak.kill_cycle(name, parallel)
                bar.update(1)
                bar.set_postfix(finished=len(soak.finished), lost=soak.counts["lost"],
                                alive=soak.counts["alive after a kill"],
                                folders=len(soak.leftover))
            soak.finish(name, parallel)
    report(soak, args, time.perf_counter() - t0)
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
