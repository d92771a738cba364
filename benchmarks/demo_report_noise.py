"""Does telling the GP each trial's measured noise rank a demo campaign better? Rescored offline.

Every demo campaign found in the given stores (SQLite trial stores or CSV exports; campaigns of
``demo_space()`` on the ``gpt`` workload with at least 6 ok trials, each counted once however
many stores hold it) is scored twice by :func:`cubicml_lab.demo.predictor_report` with the demo's
prior: leave-one-out over its ok trials, the GP told each trial's noise as ``BayesianSearch``
tells its own (``observed_noise=True``, the default) and the GP inferring one noise level
(``observed_noise=False``). It prints each campaign's two Kendall taus and MAPEs, then the mean
tau of each, how many campaigns rank higher or lower told the noise, and how many reach a tau of
0.8 (the demo's target) each way. The stores are only read.

Run (each stored campaign takes ~10 s on 2 cores):
    .venv/bin/python benchmarks/demo_report_noise.py data/demo.sqlite
    .venv/bin/python benchmarks/demo_report_noise.py data/demo_trials.csv /tmp/*/demo.sqlite
"""

from __future__ import annotations

import argparse
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
    print(f"{len(found)} demo campaigns; leave-one-out tau (MAPE) told the noise | inferred")
    told, plain = [], []
    for path, name, df in found:
        a = predictor_report(df, space, **prior)
        b = predictor_report(df, space, observed_noise=False, **prior)
        told.append(a["kendall_tau"])
        plain.append(b["kendall_tau"])
        print(f"  {name:<24} n={a['n']:<3} {a['kendall_tau']:.3f} ({100 * a['mape']:.1f}%) | "
              f"{b['kendall_tau']:.3f} ({100 * b['mape']:.1f}%)   {path}", flush=True)
    gaps = [x - y for x, y in zip(told, plain)]
    print(f"mean tau: told the noise {statistics.mean(told):.3f}, inferred "
          f"{statistics.mean(plain):.3f}; higher told the noise in "
          f"{sum(g > 1e-9 for g in gaps)}, lower in {sum(g < -1e-9 for g in gaps)} of "
          f"{len(gaps)}; at 0.8 or more: {sum(t >= 0.8 - 1e-9 for t in told)} told, "
          f"{sum(t >= 0.8 - 1e-9 for t in plain)} inferred")


if __name__ == "__main__":
    main()
