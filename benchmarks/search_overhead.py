"""Seconds per ``BayesianSearch.ask()`` with 100 and 1,000 observations over 50,000 candidates.

The space is the ``gpt`` CPU sweep's (12 knobs, 21 encoded columns); the candidates are 50,000
distinct valid configurations of it; the observations are configurations of the pool told with a
smooth made-up throughput plus 3 % noise (what is timed is the search's own work: the GP fit, the
feasibility model when failures are told, and the acquisition over the untried pool, not a
workload). For each size it tells the observations (with 5 % of them out-of-memory, so the
feasibility model is fitted too), then times ``--asks`` asks, telling each proposal before the
next, and prints the median, with the split into model fitting and acquisition.

Target (issue 5, 2 cores): at most 1 s with 100 and 5 s with 1,000 observations.

Run:
    .venv/bin/python benchmarks/search_overhead.py                # about 2 minutes
    .venv/bin/python benchmarks/search_overhead.py --sizes 100 --asks 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

import cubicml_lab as cml
from cubicml_lab import datasets


def made_up_throughput(cfg: dict, rng: np.random.Generator) -> float:
    tokens = cfg["micro_batch"] * cfg["seq_len"] * cfg["grad_accum"]
    cost = cfg["n_layers"] * cfg["d_model"] ** 2 * (1 + 0.3 * (cfg["recompute"] != "none"))
    speed = math.log(tokens) - 0.5 * math.log(cost) + 0.2 * (cfg["precision"] == "bf16")
    return float(math.exp(speed + rng.normal(0, 0.03)) * 1e3)


def pool_of(space: cml.Space, n: int) -> list[dict]:
    seen: dict[str, dict] = {}
    seed = 0
    while len(seen) < n:
        for c in space.sample(n, seed=seed):
            seen.setdefault(space.key(c), c)
        seed += 1
    return list(seen.values())[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", type=int, default=[100, 1000])
    parser.add_argument("--candidates", type=int, default=50_000)
    parser.add_argument("--asks", type=int, default=5)
    args = parser.parse_args()
    import torch

    space = datasets.load("gpt_cpu_sweep").space
    t0 = time.perf_counter()
    pool = pool_of(space, args.candidates)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(pool)} candidates "
          f"({len(space.encoded_names)} encoded columns) drawn in {time.perf_counter() - t0:.1f} s")
    targets = {100: 1.0, 1000: 5.0}
    for n_obs in args.sizes:
        rng = np.random.default_rng(n_obs)
        search = cml.BayesianSearch(space, candidates=pool, seed=0)
        for i in rng.permutation(len(pool))[:n_obs]:
            cfg = pool[int(i)]
            if rng.random() < 0.05:
                search.tell(cfg, None, status="oom")
            else:
                search.tell(cfg, {"throughput": made_up_throughput(cfg, rng)})
        times, fits = [], []
        for _ in range(args.asks):
            t = time.perf_counter()
            [cfg] = search.ask()
            times.append(time.perf_counter() - t)
            fits.append(search.last_ask_info["fit_s"])
            search.tell(cfg, {"throughput": made_up_throughput(cfg, rng)})
        med, fit = statistics.median(times), statistics.median(fits)
        target = targets.get(n_obs)
        verdict = "" if target is None else (f"; target <= {target:g} s: "
                                             f"{'met' if med <= target else 'MISSED'}")
        print(f"{n_obs:>5} observations: ask() median {med:.2f} s (fit {fit:.2f} s, acquisition "
              f"{med - fit:.2f} s; min {min(times):.2f}, max {max(times):.2f}; phase "
              f"{search.last_ask_info['phase']}){verdict}")


if __name__ == "__main__":
    main()
