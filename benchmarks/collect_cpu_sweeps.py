"""Collect the CPU sweep datasets of ``data/``: real measurements of ``gpt`` and ``dlrm`` trials.

Each sweep is a :class:`cubicml_lab.Campaign` with ``RandomSearch`` over a space of model and
system knobs, every trial in a fresh subprocess under an address-space limit (so configurations
that do not fit become ``oom`` rows, as they would on a device), stored in a SQLite file as it
goes: an interrupted run resumes where it stopped when started again. Then some ``ok``
configurations, drawn at random, are measured once more (campaign ``<name>-repeats``), which gives
the noise floor: how well one measurement ranks configurations against another of the same ones.
Finally every trial of both campaigns is written as Parquet (``data/<workload>_cpu_sweep.parquet``,
columns as ``TrialStore.to_dataframe``: config, metrics and hardware as JSON text).

Run (about 45 minutes for both on a 2-core machine):
    .venv/bin/python benchmarks/collect_cpu_sweeps.py                       # both, full size
    .venv/bin/python benchmarks/collect_cpu_sweeps.py --workloads dlrm --trials 20 --repeats 4

Step times depend on the machine and on what else runs: the hardware record of every trial says
where it ran; run it on an otherwise idle machine. A trial with as many threads as the machine has
cores suffers most when something else runs (its OpenMP threads wait on each other: 10-100x
slower was seen); ``--remeasure-threads 2`` measures such rows of the Parquet files again, in
place (column ``remeasured``), on a machine that is idle this time:
    .venv/bin/python benchmarks/collect_cpu_sweeps.py --remeasure-threads 2 \
        --store data/remeasure.sqlite
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from tqdm.auto import tqdm

import cubicml_lab as cml
from cubicml_lab import Bool, Choice, Ordinal, PowerOfTwo, Space

ROOT = Path(__file__).resolve().parents[1]

#: Model FLOPs of one optimizer step at most (the Megatron count, attention included), which keeps
#: a gpt step under about 2 s on 2 cores.
GPT_MAX_FLOPS = 4e10


def gpt_space() -> Space:
    tokens = "micro_batch * seq_len * grad_accum"
    per_token = ("6 * (n_layers * (4 + 2 * mlp_ratio) * d_model * d_model + d_model * vocab) "
                 "+ 12 * n_layers * seq_len * d_model")
    return Space(
        [Ordinal("d_model", [64, 128, 256, 512]), Ordinal("n_layers", [1, 2, 4, 8]),
         Ordinal("n_heads", [2, 4, 8]), Ordinal("seq_len", [64, 128, 256, 512]),
         Ordinal("vocab", [2048, 8192, 32768]), Ordinal("mlp_ratio", [2, 4]),
         PowerOfTwo("micro_batch", 1, 32), Ordinal("grad_accum", [1, 2]),
         Choice("precision", ["fp32", "bf16"]),
         Choice("recompute", ["none", "selective", "full"]),
         Bool("fused_optimizer"), Ordinal("threads", [1, 2])],
        constraints=["d_model >= 16 * n_heads", f"{tokens} * ({per_token}) <= {GPT_MAX_FLOPS:.0f}"],
    )


def dlrm_space() -> Space:
    return Space(
        [Ordinal("num_tables", [4, 8, 16, 32]), Ordinal("rows", [1000, 10000, 100000, 1000000]),
         Ordinal("emb_dim", [16, 32, 64, 128]), Ordinal("pooling", [1, 4, 16, 32]),
         Ordinal("bottom_width", [64, 128, 256]), Ordinal("bottom_layers", [1, 2, 3]),
         Ordinal("top_width", [128, 256, 512]), Ordinal("top_layers", [1, 2, 3]),
         Choice("interaction", ["dot", "cat"]), PowerOfTwo("batch_size", 128, 4096),
         Bool("sparse_grads"), Choice("optimizer", ["sgd", "adagrad", "adam"]),
         Ordinal("threads", [1, 2])],
        constraints=["batch_size * pooling * num_tables <= 2 ** 21"],
    )


SWEEPS = {"gpt": (gpt_space, 300, 20), "dlrm": (dlrm_space, 150, 12)}


def collect(workload: str, trials: int, repeats: int, store: cml.TrialStore, memory_gib: float,
            options: dict, out_dir: Path, seed: int) -> Path:
    space = SWEEPS[workload][0]()
    name = f"{workload}-cpu-sweep"
    launcher = cml.launch.Subprocess(timeout_s=180, memory_limit_gib=memory_gib)
    camp = cml.Campaign(name, space, workload=workload, launcher=launcher, store=store,
                        searcher=cml.RandomSearch(space, seed=seed), measure_options=options)
    camp.run(budget=trials, verbose=False)

    rep_name = f"{name}-repeats"
    done = {json_key(t.config) for t in store.trials(rep_name)} if rep_name in \
        store.campaigns() else set()
    if rep_name not in store.campaigns():
        store.create_campaign(rep_name, space=space, workload=workload,
                              metadata={"repeats_of": name, "launcher": launcher.describe(),
                                        "measure": options})
    ok = [t for t in store.trials(name) if t.status == "ok"]
    chosen = random.Random(seed).sample(ok, min(repeats, len(ok)))
    for t in tqdm(chosen, desc=f"{workload} repeats", unit="trial"):
        if json_key(t.config) in done:
            continue
        started = time.time()
        res = cml.measure(workload, t.config, launcher=launcher, measure_options=options)
        store.record_trial(rep_name, res.config or t.config, status=res.status,
                           metrics=res.metrics, hardware=res.hardware, workload=workload,
                           workload_version=res.workload_version, error=res.error,
                           started_at=started, ended_at=time.time())
    import pandas as pd

    df = pd.concat([store.to_dataframe(name), store.to_dataframe(rep_name)], ignore_index=True)
    path = out_dir / f"{workload}_cpu_sweep.parquet"
    df.to_parquet(path, index=False)
    print(f"{workload}: {len(df)} rows ({df['status'].value_counts().to_dict()}) -> {path}")
    return path


def remeasure(workload: str, threads: int, store: cml.TrialStore, memory_gib: float,
              options: dict, out_dir: Path) -> Path:
    """Measure again, in place, the main campaign's trials that ran with ``threads`` threads.

    For rows measured while other work loaded the machine: a trial with as many threads as
    cores is slowed down by far more than its share of the CPU (OpenMP threads wait on each
    other), and its figure says more about the load than about the configuration. Each such row
    of ``data/<workload>_cpu_sweep.parquet`` is replaced by a fresh measurement (kept in campaign
    ``<name>-remeasured`` of ``store``, so an interrupted run resumes), keeping its trial id and
    creation time; the column ``remeasured`` marks them.
    """
    import pandas as pd

    name = f"{workload}-cpu-sweep"
    path = out_dir / f"{workload}_cpu_sweep.parquet"
    df = pd.read_parquet(path)
    keys = [k for k in cml.workloads.get(workload).default_config() if k in df.columns]
    todo = df[(df["campaign"] == name) & (df["threads"] == threads)]
    rem = f"{name}-remeasured"
    if rem not in store.campaigns():
        store.create_campaign(rem, space=SWEEPS[workload][0](), workload=workload,
                              metadata={"remeasured_from": str(path), "threads": threads,
                                        "measure": options})
    done = {json_key(t.config) for t in store.trials(rem)}
    launcher = cml.launch.Subprocess(timeout_s=180, memory_limit_gib=memory_gib)
    for _, row in tqdm(list(todo.iterrows()), desc=f"{workload} remeasure", unit="trial"):
        config = {k: _plain(row[k]) for k in keys}
        if json_key(config) in done:
            continue
        started = time.time()
        res = cml.measure(workload, config, launcher=launcher, measure_options=options)
        store.record_trial(rem, config, status=res.status, metrics=res.metrics,
                           hardware=res.hardware, workload=workload,
                           workload_version=res.workload_version, error=res.error,
                           started_at=started, ended_at=time.time())
    new = store.to_dataframe(rem)
    new_key = new[keys].astype(str).agg("|".join, axis=1)
    old_key = todo[keys].astype(str).agg("|".join, axis=1)
    by_key = dict(zip(new_key, new.index, strict=True))
    rows = []
    for i, k in zip(todo.index, old_key, strict=True):
        r = new.loc[by_key[k]].copy()
        r["trial_id"], r["campaign"], r["created_at"] = df.at[i, "trial_id"], name, \
            df.at[i, "created_at"]
        rows.append((i, r))
    if "remeasured" not in df.columns:
        df["remeasured"] = False
    for i, r in rows:
        for col in set(df.columns) - set(r.index) - {"remeasured"}:
            df.at[i, col] = None  # a metric the new measurement did not report
        for col, v in r.items():
            if col not in df.columns:
                df[col] = None
            df.at[i, col] = v
        df.at[i, "remeasured"] = True
    df.to_parquet(path, index=False)
    print(f"{workload}: {len(rows)} rows with threads={threads} measured again -> {path}")
    return path


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def json_key(config: dict) -> str:
    import json

    return json.dumps(config, sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(SWEEPS))
    parser.add_argument("--trials", type=int, default=None, help="per workload (default 300/150)")
    parser.add_argument("--repeats", type=int, default=None, help="configurations measured twice")
    parser.add_argument("--store", default=str(ROOT / "data" / "sweeps.sqlite"))
    parser.add_argument("--out", default=str(ROOT / "data"))
    parser.add_argument("--memory-gib", type=float, default=4.0,
                        help="address-space limit of each trial process (RLIMIT_AS)")
    parser.add_argument("--max-time-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--remeasure-threads", type=int, default=None,
                        help="measure again the sweep's rows with this many threads (remeasure)")
    args = parser.parse_args()
    options = {"max_time_s": args.max_time_s, "warmup_max_s": 5.0}
    store = cml.TrialStore(args.store)
    try:
        for w in args.workloads:
            if args.remeasure_threads is not None:
                remeasure(w, args.remeasure_threads, store, args.memory_gib, options,
                          Path(args.out))
                continue
            _, n, reps = SWEEPS[w]
            collect(w, args.trials or n, args.repeats if args.repeats is not None else reps,
                    store, args.memory_gib, options, Path(args.out), args.seed)
    finally:
        store.close()


if __name__ == "__main__":
    main()
