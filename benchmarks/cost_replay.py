"""Device-hours to the best cluster layout: early stopping and cost-aware choice, replayed.

A search on a cluster pays for each trial in device-hours. This benchmark replays
:class:`cubicml_lab.BayesianSearch` (physics prior and memory model: the project's best search
today, ``prior+mem`` of ``benchmarks/prior_transfer.py``) on cluster tables: the perturbed-constants ones of
``prior_transfer.py`` (13B on 64, 70B on 256, 175B on 1,024 H100s) and three of
``prior_structure.py`` whose truth has other formulas than the prior (``combined``,
``gemm-waves+dp``, ``zero-bubble``), models, not measurements, on all of whose layouts a
trial holds every GPU of the table; and MosaicML's measured MPT table (``mpt_llmfoundry``: 8
to 512 GPUs per row, its own cost model as the prior, no memory model), where the knobs change
what a trial costs by up to 64x. Every trial is priced as a cluster would price it:

* **a trial** holds its GPUs (the table's, or the row's ``n_gpus``) for ``start-up + (warm-up + timed steps) x step time``:
  start-up ``--startup-s`` (default 180 s: process start, NCCL, model build, data), then its
  steps, reported one by one and judged as the lab judges a command job that reports its steps
  (at least 3 warm-up steps, then one-step windows, until the lab's own stopping rule
  (:func:`cubicml_lab.timing.reported.reported_stop` on :class:`~cubicml_lab.timing.MeasureOptions`
  with ``max_time_s=600``: the CI target of 1.5%, or 200 steps, or 10 minutes of timed steps));
  an out-of-memory layout fails in its first step (start-up + one step of the table's median;
  MPT's step time is its ``step_time_s_derived``);
* **its windows** are the table's step time times noise drawn as this machine's windows are
  noisy: each trial's relative spread is drawn from the measured ``step_time_rel_spread`` of
  ``data/gpt_cpu_sweep.parquet`` (320 trials of this 2-core VM), as a normal of
  ``sd = spread / 1.349`` (IQR to sd); the figure is the windows' median, its CI the lab's
  (:func:`~cubicml_lab.timing.figures.median_rel_ci`);
* **early stopping** is the lab's rule (``timing.policy.losing_step_s``, CUDA's margin of 3%,
  ``reported_stop``'s "losing": at least 6 windows, the lower end of the median's 95% CI slower
  than what would tie the best full figure so far, less the margin); a stopped trial is
  told with ``stopped_early = 1`` (censored), as a campaign tells it;
* **cost-aware choice** (:mod:`cubicml_lab.search.cost`: cost-cooled EI) is the search told
  each trial's ``device_s`` and its budget in trials (``plan_budget``).

Four arms, each seed replayed by all: ``today`` (full trials, no prices), ``stop`` (early
stopping), ``price`` (cost-aware), ``both``. Printed per table: the median over seeds of the
device-hours spent until a layout within 1% of the table's best was measured in full, and of
trials to get there (``>B``: most seeds did not within the budget), trials stopped early,
out-of-memory trials, asks whose choice weighed prices (``priced``), then the arms' ratio to
``today`` and the target (at least 30% fewer device-hours).

Run (2 worker processes, one torch thread each):
    .venv/bin/python benchmarks/cost_replay.py              # 5 seeds, budget 50: ~20 min
    .venv/bin/python benchmarks/cost_replay.py --seeds 2 --tables 13b-64xH100   # ~3 min
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARMS = ("today", "stop", "price", "both")
WITHIN = 0.01
WARMUP_STEPS = 3
SPREAD_FILE = os.path.join(os.path.dirname(__file__), "..", "data", "gpt_cpu_sweep.parquet")


def measured_spreads() -> np.ndarray:
    """This machine's windows' relative spreads (IQR / median), one per measured trial."""
    import pandas as pd

    s = pd.read_parquet(SPREAD_FILE)["step_time_rel_spread"].to_numpy(dtype=float)
    return s[np.isfinite(s) & (s > 0)]


def cluster_options():
    from cubicml_lab.timing import MeasureOptions

    return MeasureOptions(max_time_s=600.0, window_min_s=0.0)


def measure(step_s: float, sd: float, rng: np.random.Generator, options):
    """One ok trial's steps, reported one by one and judged as the lab judges a job that
    reports its steps (:func:`~cubicml_lab.timing.reported.reported_timing` and
    :func:`~cubicml_lab.timing.reported.reported_stop`, ``options.losing_step_s`` included):
    ``(every step's seconds, the Timing, why it stopped)``."""
    from cubicml_lab.timing.reported import reported_stop, reported_timing

    reports: list[tuple[int, float]] = []
    while True:
        reports.append((1, step_s * max(0.05, 1.0 + sd * rng.standard_normal())))
        if len(reports) <= WARMUP_STEPS:
            continue
        timing = reported_timing(reports, options)
        why = reported_stop(timing, options)
        if why is not None:
            return [v for _, v in reports], timing, why


def gpus_of(table_name: str, config: dict) -> int:
    """The GPUs a trial holds: the configuration's ``n_gpus`` knob, else the table's size."""
    if "n_gpus" in config:
        return int(config["n_gpus"])
    return int(table_name.split("x")[0].split("-")[-1])


def replay(table_name: str, arm: str, seed: int, budget: int, startup_s: float,
           prior: bool = True) -> dict:
    import torch

    torch.set_num_threads(1)
    import prior_structure as ps

    from cubicml_lab import BayesianSearch, TableObjective
    from cubicml_lab.timing.policy import early_stop_margin, losing_step_s

    ds, cost, mem, limit = ps.table(table_name)
    obj = TableObjective.from_dataset(ds, reduce="first")
    best = obj.best()[1]
    step_col = "step_time_s" if "step_time_s" in ds.table else "step_time_s_derived"
    ok_steps = ds.table.loc[ds.table["status"] == "ok", step_col]
    oom_s = float(ok_steps.median())
    spreads = measured_spreads()
    options = cluster_options()
    stop, price = arm in ("stop", "both"), arm in ("price", "both")
    physics = {"cost_model": cost, "memory_model": mem, "memory_limit_gib": limit} \
        if prior else {}
    search = BayesianSearch(obj.space, obj.objective, candidates=obj.configs(), seed=seed,
                            memory_metric="peak_mem_gib", cost_aware=price, **physics)
    if price:
        search.plan_budget(trials=budget)
    rng = np.random.default_rng([seed, 7])
    spent = 0.0
    best_full = None
    out = {"table": table_name, "arm": arm, "seed": seed, "hours": math.nan, "trials": math.nan,
           "stopped": 0, "oom": 0, "spent_h": 0.0, "weighed": 0}
    t0 = time.perf_counter()
    for trial in range(1, budget + 1):
        [config] = search.ask()
        n_gpus = gpus_of(table_name, config)
        out["weighed"] += "price weighed" in str(search.last_ask_info.get("price", ""))
        res = obj(config)
        if res.status != "ok":
            seconds = startup_s + oom_s
            out["oom"] += 1
            values = {"device_s": n_gpus * seconds} if price else {}
            search.tell(config, values, status=res.status)
            spent += n_gpus * seconds
            continue
        true, step_s = res.values[obj.objective], res.values[step_col]
        sd = float(rng.choice(spreads)) / 1.349
        losing = None
        if stop and best_full is not None:
            losing = losing_step_s({"objective": "throughput", "value": best_full,
                                    "margin": early_stop_margin("cuda")}, true * step_s,
                                   "tokens")
        steps, timing, why = measure(step_s, sd, rng, replace(options, losing_step_s=losing))
        stopped = why == "losing"
        seconds = startup_s + sum(steps)
        spent += n_gpus * seconds
        figure = true * step_s / timing.median_step_time_s
        values = {obj.objective: figure, f"{obj.objective}_rel_ci": timing.rel_ci,
                  **{k: res.values[k] for k in ("peak_mem_gib",) if k in res.values}}
        if price:
            values["device_s"] = n_gpus * seconds
        if stopped:
            values["stopped_early"] = 1.0
            out["stopped"] += 1
        else:
            best_full = figure if best_full is None else max(best_full, figure)
        search.tell(config, values, status="ok")
        if not stopped and true >= best * (1 - WITHIN):
            out["hours"], out["trials"] = spent / 3600.0, trial
            break
    out["spent_h"] = spent / 3600.0
    out["s"] = time.perf_counter() - t0
    return out


#: The perturbed-constants tables of prior_transfer.py and three structurally wrong ones of
#: prior_structure.py (where the prior's favourite is furthest from the best).
DEFAULT_TABLES = ("13b-64xH100", "70b-256xH100", "175b-1024xH100", "13b-64xH100:combined",
                  "13b-64xH100:gemm-waves+dp", "175b-1024xH100:zero-bubble", "mpt_llmfoundry")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", nargs="+", default=list(DEFAULT_TABLES))
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=50)
    ap.add_argument("--startup-s", type=float, default=180.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-prior", action="store_true",
                    help="search without the physics prior and memory model (bo)")
    args = ap.parse_args()
    spreads = measured_spreads()
    from cubicml_lab.timing.policy import early_stop_margin

    print(f"early-stop margin {early_stop_margin('cuda'):.0%} (CUDA's); window noise: this "
          f"machine's relative spread, median {np.median(spreads):.4f} "
          f"(IQR/median of {len(spreads)} trials; sd = spread/1.349); start-up "
          f"{args.startup_s:g} s; budget {args.budget} trials; {args.seeds} seeds")
    jobs = [(t, a, s, args.budget, args.startup_s, not args.no_prior) for t in args.tables
            for s in range(args.seeds) for a in args.arms]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(replay, *zip(*jobs)))
    import pandas as pd

    df = pd.DataFrame(rows)
    print(f"\n{'table':<16} {'arm':<6} {'device-h to 1%':>15} {'trials':>7} {'reached':>8} "
          f"{'stopped':>8} {'oom':>5} {'priced':>7} {'vs today':>9} {'s/run':>6}")
    ratios = {}
    for table in args.tables:
        base = None
        for arm in args.arms:
            d = df[(df.table == table) & (df.arm == arm)]
            reached = d["hours"].notna()
            # a seed that never got there counts as what it spent (a lower bound)
            hours = d["hours"].fillna(d["spent_h"])
            med_h = float(hours.median())
            trials = d["trials"].fillna(args.budget + 1)
            med_t = float(trials.median())
            t_txt = f"{'>' if med_t > args.budget else ''}{min(med_t, args.budget):.0f}"
            base = med_h if arm == "today" else base
            ratio = med_h / base if base else math.nan
            ratios[(table, arm)] = ratio
            print(f"{table:<16} {arm:<6} {med_h:>15,.1f} {t_txt:>7} "
                  f"{int(reached.sum()):>4}/{len(d):<3} {d['stopped'].median():>8.0f} "
                  f"{d['oom'].median():>5.0f} {d['weighed'].median():>7.0f} {ratio:>9.2f} {d['s'].mean():>6.1f}")
    print(f"\n{len(df)} replays in {time.perf_counter() - t0:.0f} s")
    for arm in args.arms:
        if arm == "today":
            continue
        r = [ratios[(t, arm)] for t in args.tables]
        met = all(x <= 0.7 for x in r)
        print(f"target: '{arm}' spends at least 30% fewer device-hours to 1% than today on "
              f"every table: {'MET' if met else 'MISSED'} (ratios "
              + ", ".join(f"{x:.2f}" for x in r) + ")")


if __name__ == "__main__":
    main()
