"""Which drift reference follows a trial best: every size, timed beside the same windows.

Each configuration of the ``gpt`` workload runs in ``--repeats`` fresh interpreters, one after
another (configurations interleaved). In each, the trial's step is timed in windows of about
50 ms, and before every window one sample of every :data:`~cubicml_lab.hardware.REFERENCE_ROWS`
size of :class:`~cubicml_lab.hardware.ReferenceWork` is taken, so every reference sees the
same moments of the machine as the windows. Per configuration it prints the spread across the
processes ((max - min) / median) of the raw throughput (median window) and of the throughput
over each reference's speed (median of window-by-window ratios), and marks the size
:func:`~cubicml_lab.hardware.reference_rows` picks for the trial (``*``). For the picked size it
then sets that paired estimator beside the ratio of medians (median window over median reference
sample, over all samples, and over every 5th one, about as sparse as a trial's 10% share).
On the 2-core VM, 2026-11-26 03:51 UTC (raw spreads 28.3, 2.5, 18.9, 5.2%), the three were alike:
paired 6.1, 1.4, 6.7, 1.9%; ratio of medians 6.2, 1.2, 6.0, 1.7%; every 5th sample 6.2, 0.5, 5.4,
1.9%. Trials keep the ratio of medians (``timing.summarize``): pairing windows with their own
samples gains nothing here. A reference that
follows the trial leaves a small spread; the raw spread is what the machine's drift did.

Run (idle machine; ~6 min):
    .venv/bin/python benchmarks/reference_sizing.py
    .venv/bin/python benchmarks/reference_sizing.py --repeats 3 --seconds 10   # ~2 min
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CONFIGS = [
    {"micro_batch": 2},
    {"micro_batch": 8},
    {"micro_batch": 8, "recompute": "full", "precision": "bf16"},
    {"micro_batch": 32, "n_heads": 2, "precision": "bf16"},
]


def child(config: dict, seconds: float) -> dict:
    """Run in a fresh interpreter: the windows and reference samples of one configuration."""
    import gc

    import torch

    from cubicml_lab.hardware import REFERENCE_ROWS, ReferenceWork, tune_cpu_allocator
    from cubicml_lab.workloads import get
    from cubicml_lab.workloads.parallel import init_world

    torch.set_num_threads(int(config.get("threads", torch.get_num_threads())))
    tune_cpu_allocator()
    workload = get("gpt")
    built = workload.build(workload.resolve(config), "cpu", init_world("cpu"))
    refs = {rows: ReferenceWork(rows=rows) for rows in REFERENCE_ROWS}
    for _ in range(5):
        built.step()
    t0 = time.perf_counter()
    built.step()
    k = max(1, round(0.05 / (time.perf_counter() - t0)))
    for ref in refs.values():
        ref.sample()  # calibrates
    windows, samples = [], {rows: [] for rows in refs}
    gc.collect()
    gc.disable()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for rows, ref in refs.items():
            samples[rows].append(ref.sample())
        t0 = time.perf_counter()
        for _ in range(k):
            built.step()
        windows.append((time.perf_counter() - t0) / k)
    return {"units": built.units_per_step, "rows": built.matmul_rows, "windows": windows,
            "samples": {str(r): s for r, s in samples.items()}}


def spread(values: list[float]) -> float:
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=4, help="fresh processes per config")
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds per process")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child), args.seconds)))
        return
    from cubicml_lab.hardware import REFERENCE_ROWS, cpu_model, reference_rows

    print(f"{cpu_model()}; {args.repeats} fresh processes per config, {args.seconds:.0f} s each; "
          f"load average {open('/proc/loadavg').read().split()[:3]}; "
          f"{time.strftime('%H:%M UTC', time.gmtime())}")
    runs: dict[int, list[dict]] = {i: [] for i in range(len(CONFIGS))}
    for _ in range(args.repeats):
        for i, config in enumerate(CONFIGS):
            out = subprocess.run([sys.executable, __file__, "--child", json.dumps(config),
                                  "--seconds", str(args.seconds)],
                                 capture_output=True, text=True, check=True)
            runs[i].append(json.loads(out.stdout.strip().splitlines()[-1]))
    head = "  ".join(f"/{r:>5}" for r in REFERENCE_ROWS)
    print(f"{'config':58s} rows    raw  {head}   (spread across processes; * reference_rows())"
          "   picked size: paired | ratio of medians, all samples | every 5th sample")
    for i, config in enumerate(CONFIGS):
        rs = runs[i]
        raw = [r["units"] / statistics.median(r["windows"]) for r in rs]
        cells = []
        for rows in REFERENCE_ROWS:
            rel = [statistics.median([w / s for w, s in zip(r["windows"], r["samples"][str(rows)])])
                   for r in rs]
            mark = "*" if rows == reference_rows(rs[0]["rows"]) else " "
            cells.append(f"{100 * spread(rel):5.1f}%{mark}")
        picked = str(reference_rows(rs[0]["rows"]))
        ratio_all = [statistics.median(r["windows"]) / statistics.median(r["samples"][picked])
                     for r in rs]
        ratio_5th = [statistics.median(r["windows"]) / statistics.median(r["samples"][picked][::5])
                     for r in rs]
        paired = [statistics.median([w / s for w, s in zip(r["windows"], r["samples"][picked])])
                  for r in rs]
        print(f"{json.dumps(config):58s} {rs[0]['rows']:5d} {100 * spread(raw):5.1f}%  "
              + " ".join(cells) + f"   {100 * spread(paired):5.1f}% | "
              f"{100 * spread(ratio_all):5.1f}% | {100 * spread(ratio_5th):5.1f}%")


if __name__ == "__main__":
    main()
