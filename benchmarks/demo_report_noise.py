"""Does telling the GP each trial's measured noise, and learning the drift exponent, rank a demo
campaign better? Rescored offline.

Every demo campaign found in the given stores (SQLite trial stores or CSV exports; campaigns of
``demo_space()`` on the ``gpt`` workload with at least 6 ok trials, each counted once however
many stores hold it) is scored three times by :func:`cubicml_lab.demo.predictor_report` with the
demo's prior, leave-one-out over its ok trials: as the search ranks (the default: the GP told
each trial's noise and learning how much of the drift correction to keep), on the stored figures
(``learn_drift=False``), and inferring one noise level (``observed_noise=False``). It prints
each campaign's Kendall taus and MAPEs and the learned exponent, then per arm the mean tau and
how many reach 0.8 (the demo's target), and how many campaigns rank higher or lower by default.
Last, an independent check of the learned exponent: for every configuration measured ok in 4 or
more campaigns, the standard deviation across them of its raw figure, its stored figure and its
figure at the exponent its campaign learned. The stores are only read.

Run (each stored campaign takes ~30 s on 2 cores):
    .venv/bin/python benchmarks/demo_report_noise.py data/demo.sqlite
    .venv/bin/python benchmarks/demo_report_noise.py data/demo_trials.csv /tmp/*/demo.sqlite
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

from cubicml_lab.demo import demo_prior, demo_space, predictor_report
from cubicml_lab.store import TrialStore


def campaigns(paths: list[str]) -> list[tuple[str, str, object]]:
    """(store, campaign, DataFrame) of every demo campaign in ``paths``, first copy kept."""
    names = demo_space().names
    seen, out = set(), []
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(paths):
            if path.endswith(".csv"):
                store = TrialStore(Path(tmp) / f"import{i}.sqlite")
                store.import_(path)
            else:  # read a copy: the store is left as it is
                copy = Path(tmp) / f"copy{i}.sqlite"
                src, dst = sqlite3.connect(f"file:{path}?mode=ro", uri=True), sqlite3.connect(copy)
                src.backup(dst)
                src.close()
                dst.close()
                store = TrialStore(copy)
            for name in store.campaigns():
                info = store.campaign_info(name)
                params = [p["name"] for p in (info.get("space") or {}).get("parameters", [])]
                df = store.to_dataframe(name)
                if info.get("workload") != "gpt" or params != names or df.empty:
                    continue
                key = (name, float(df["created_at"].min()))
                if key not in seen and int(df["status"].eq("ok").sum()) >= 6:
                    seen.add(key)
                    out.append((path, name, df))
            store.close()
    return sorted(out, key=lambda c: float(c[2]["created_at"].min()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+", help="SQLite trial stores or CSV exports")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    space, prior = demo_space(), demo_prior()
    found = campaigns(args.stores)
    if not found:
        sys.exit("no demo campaign with 6 ok trials in " + ", ".join(args.stores))
    arms = {"default": {}, "stored figures": {"learn_drift": False},
            "inferred noise": {"observed_noise": False}}
    print(f"{len(found)} demo campaigns; leave-one-out tau (MAPE) of each arm: "
          + " | ".join(arms) + "; the drift exponent the default learned")
    taus: dict[str, list[float]] = {arm: [] for arm in arms}
    repeats: dict[tuple, list[tuple[float, float, float]]] = {}
    for path, name, df in found:
        reports = {arm: predictor_report(df, space, **opts, **prior) for arm, opts in arms.items()}
        for arm, r in reports.items():
            taus[arm].append(r["kendall_tau"])
        drift = reports["default"]["drift_exponent"]
        for _, row in df[df["status"].eq("ok")].iterrows():
            raw, stored = float(row.get("throughput_raw", math.nan)), float(row["throughput"])
            if math.isfinite(raw) and raw > 0:
                learned = raw * (stored / raw) ** (1.0 if drift is None else drift)
                repeats.setdefault(tuple(row[n] for n in space.names), []).append(
                    (raw, stored, learned))
        print(f"  {name:<24} n={reports['default']['n']:<3} " + " | ".join(
            f"{r['kendall_tau']:.3f} ({100 * r['mape']:.1f}%)" for r in reports.values())
            + f"   {'-' if drift is None else format(drift, '.2f')}   {path}", flush=True)
    for arm, t in taus.items():
        print(f"{arm}: mean tau {statistics.mean(t):.3f}, at 0.8 or more in "
              f"{sum(x >= 0.8 - 1e-9 for x in t)} of {len(t)}")
    for arm in list(arms)[1:]:
        gaps = [x - y for x, y in zip(taus["default"], taus[arm])]
        print(f"default against {arm}: higher in {sum(g > 1e-9 for g in gaps)}, lower in "
              f"{sum(g < -1e-9 for g in gaps)}")
    # an independent check: the same configuration measured in several campaigns (fresh
    # processes, minutes apart) should agree better at the exponent each campaign learned
    many = {k: v for k, v in repeats.items() if len(v) >= 4}
    if many:
        print("configurations measured in 4 or more campaigns: standard deviation of the log "
              "figure across them (%), raw | stored | at each campaign's learned exponent")
        sds = []
        for key, v in many.items():
            sd = [100 * statistics.pstdev(math.log(x[i]) for x in v) for i in range(3)]
            sds.append(sd)
            print(f"  {key} x{len(v)}: " + " | ".join(f"{x:.2f}" for x in sd))
        print("median: " + " | ".join(f"{statistics.median(x[i] for x in sds):.2f}"
                                        for i in range(3))
              + f"; learned below stored in {sum(x[2] < x[1] for x in sds)} of {len(sds)}")


if __name__ == "__main__":
    main()
