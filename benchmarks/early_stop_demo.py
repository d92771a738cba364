"""Does stopping losing trials early save measurement time without losing the demo's answer?

Runs ``cubicml-lab demo`` campaigns (each in a fresh process, its own store) with and without
``--early-stop``, RUNS of each, interleaved (the arm that goes first alternates), so that a
drifting machine hits both alike. Per campaign it prints:

* ``measure s``: the seconds its trials spent (the sum of their ``duration_s``: start-up,
  build, warm-up and timing), in all and **until the final best configuration was first
  measured** (the campaign's best, :meth:`~cubicml_lab.Campaign.best`: never a trial stopped
  early);
* the best configuration, and how many trials stopped early.

Then per arm the medians, the saving in seconds until the best (target: at least 40% fewer
with early stopping) and in how many of the early-stopping campaigns the best configuration is
the one the campaigns without it found most often (target: at least 4 of 5).

Run (an idle machine; ~5 min a campaign on 2 cores):
    .venv/bin/python benchmarks/early_stop_demo.py --runs 5
    .venv/bin/python benchmarks/early_stop_demo.py --runs 2 --budget 10
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_campaign(folder: Path, name: str, budget: int, early_stop: bool) -> dict:
    """Run one demo campaign in a fresh process and read its trials back."""
    import cubicml_lab as cml

    store = folder / f"{name}.sqlite"
    cmd = [sys.executable, "-m", "cubicml_lab.cli", "demo", "--budget", str(budget),
           "--store", str(store), "--campaign", name, "--out", str(folder), "--no-progress"]
    if early_stop:
        cmd.append("--early-stop")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    with cml.TrialStore(store) as ts:
        trials = [t for t in ts.trials(name) if t.status in cml.store.FINAL_STATUSES]
        camp = cml.Campaign.from_store(ts, name)
        best, _ = camp.best()
    names = sorted(best)
    key = tuple(best[n] for n in names)
    spent, until = 0.0, None
    for t in trials:
        spent += t.duration_s or 0.0
        if until is None and tuple(t.config.get(n) for n in names) == key and \
                not t.metrics.get("stopped_early"):
            until = spent
    return {"wall_s": wall, "measure_s": spent, "until_best_s": until, "best": key,
            "names": names, "stopped": sum(bool(t.metrics.get("stopped_early")) for t in trials),
            "trials": len(trials)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="campaigns per arm (default 5)")
    parser.add_argument("--budget", type=int, default=14, help="trials per campaign (14)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="early-stop-"))
    out: dict[bool, list[dict]] = {False: [], True: []}
    print(f"{args.runs} demo campaigns per arm, budget {args.budget}, interleaved; "
          f"stores in {folder}")
    for i in range(args.runs):
        for early in ((False, True) if i % 2 == 0 else (True, False)):
            r = one_campaign(folder, f"{'es' if early else 'full'}-{i}", args.budget, early)
            out[early].append(r)
            until = "never" if r["until_best_s"] is None else f"{r['until_best_s']:.0f} s"
            print(f"  {'early stop' if early else 'full      '} run {i + 1}: measure "
                  f"{r['measure_s']:.0f} s, until the best {until}, {r['stopped']} of "
                  f"{r['trials']} stopped early; best {dict(zip(r['names'], r['best']))}",
                  flush=True)
    modal = collections.Counter(r["best"] for r in out[False]).most_common(1)[0][0]
    med = {k: statistics.median(r["until_best_s"] or r["measure_s"] for r in v)
           for k, v in out.items()}
    tot = {k: statistics.median(r["measure_s"] for r in v) for k, v in out.items()}
    same = sum(r["best"] == modal for r in out[True])
    saving = 1.0 - med[True] / med[False] if med[False] > 0 else float("nan")
    print(f"\nmedian seconds until the final best was first measured: full {med[False]:.0f}, "
          f"early stop {med[True]:.0f} ({100 * saving:.0f}% fewer; target >= 40%: "
          f"{'met' if saving >= 0.4 else 'MISSED'})")
    print(f"median measurement seconds in all: full {tot[False]:.0f}, early stop {tot[True]:.0f}")
    print(f"early-stop campaigns whose best is the full campaigns' most frequent best: {same} of "
          f"{len(out[True])} (target >= 4 of 5: "
          f"{'met' if same >= 0.8 * len(out[True]) else 'MISSED'})")


if __name__ == "__main__":
    main()
