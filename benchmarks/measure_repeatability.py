"""How repeatable is a measurement? Each configuration measured several times in fresh processes.

For each workload, a handful of configurations are measured ``--repeats`` times, each in a fresh
interpreter (``cml.launch.Subprocess``), interleaved so that slow drifts of the machine hit every
configuration alike. It prints, per configuration: the median step time, the relative spread of the
median across repeats ((max - min) / median), the mean seconds spent per measurement (process start
included) and how often the adaptive stop met its CI target. The targets (issue 3): spread at most
3% on CPU for steps of at least 50 ms, at most 30 s per measurement.

Run:
    .venv/bin/python benchmarks/measure_repeatability.py                 # gpt and dlrm
    .venv/bin/python benchmarks/measure_repeatability.py --repeats 3 --workloads gpt

Results depend on the machine and on what else it runs: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from tqdm.auto import tqdm

import cubicml_lab as cml

CONFIGS = {
    "gpt": [
        {"micro_batch": 8},
        {"micro_batch": 16, "precision": "bf16"},
        {"micro_batch": 4, "n_layers": 4},
        {"micro_batch": 8, "recompute": "full"},
        {"micro_batch": 32, "d_model": 64, "n_heads": 2},
    ],
    "dlrm": [
        {"batch_size": 1024},
        {"batch_size": 4096},
        {"batch_size": 4096, "interaction": "cat"},
        {"batch_size": 4096, "sparse_grads": True, "optimizer": "sgd"},
        {"batch_size": 8192, "num_tables": 16},
    ],
}


#: The machine's own drift is measured with this fixed configuration, in the benchmark's process,
#: right before every measurement: if it moves as much as the measurements do, the machine (other
#: tenants of a shared host, clocks) and not the harness is what varies.
REFERENCE = ("gpt", {"micro_batch": 8, "threads": 1})


def rel_spread(values: list[float]) -> float:
    """(max - min) / median; 0 for fewer than two values."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="*", default=None)
    parser.add_argument("--max-time-s", type=float, default=10.0,
                        help="timed-phase budget per measurement (MeasureOptions.max_time_s)")
    parser.add_argument("--reference-s", type=float, default=2.0,
                        help="timed-phase budget of the machine reference before each measurement "
                             "(0: no reference)")
    args = parser.parse_args()
    known = set(cml.workloads.names())
    names = args.workloads or [w for w in CONFIGS if w in known]
    launcher = cml.launch.Subprocess(timeout_s=300)
    options = {"max_time_s": args.max_time_s}
    from cubicml_lab.timing import hardware_info

    def reference() -> float:
        if args.reference_s <= 0:
            return float("nan")
        res = cml.measure(*REFERENCE, measure_options={"max_time_s": args.reference_s})
        return res.metrics["step_time_s"] if res.status == "ok" else float("nan")

    hw = hardware_info("cpu")
    print(f"{hw['cpu_model']} ({hw['cpu_count']} CPUs), torch {hw['torch_version']}; "
          f"{args.repeats} repeats per configuration, fresh process each, interleaved, "
          f"max_time_s={args.max_time_s}; machine reference {REFERENCE} before each")
    print("spread = (max - min) / median of the repeats' median step times; ref = the same for "
          "the reference measured before each; /ref = spread of step time / reference")
    print(f"{'workload':<6} {'config':<62} {'median step':>11} {'spread':>7} {'ref':>6} "
          f"{'/ref':>6} {'s/meas':>7} {'target met':>10}  repeats (ms)")
    total: dict[str, Any] = {"long": 0, "long_within": 0, "met": 0, "ok": 0, "secs": [],
                             "spreads": [], "refs": []}
    bar = tqdm(total=args.repeats * sum(len(CONFIGS[n]) for n in names), unit="measurement",
               file=sys.stderr)
    for name in names:
        runs: dict[int, list[tuple[cml.TrialResult, float, float]]] = {
            i: [] for i in range(len(CONFIGS[name]))}
        for _ in range(args.repeats):
            for i, cfg in enumerate(CONFIGS[name]):
                ref = reference()
                t0 = time.perf_counter()
                res = cml.measure(name, cfg, launcher=launcher, measure_options=options)
                runs[i].append((res, time.perf_counter() - t0, ref))
                bar.update()
        for i, cfg in enumerate(CONFIGS[name]):
            ok = [(r, ref) for r, _, ref in runs[i] if r.status == "ok"]
            secs = [s for _, s, _ in runs[i]]
            total["secs"] += secs
            if not ok:
                tqdm.write(f"{name:<6} {str(cfg):<62} all failed: {runs[i][0][0].status}",
                           file=sys.stdout)
                continue
            steps = [r.metrics["step_time_s"] for r, _ in ok]
            refs = [ref for _, ref in ok]
            med, spread, ref_spread = statistics.median(steps), rel_spread(steps), rel_spread(refs)
            normed = rel_spread([s / r for s, r in zip(steps, refs, strict=True)])
            met = sum(r.metrics.get("target_met", 0.0) >= 1.0 for r, _ in ok)
            tqdm.write(f"{name:<6} {str(cfg):<62} {med * 1000:>9.1f}ms {100 * spread:>6.1f}% "
                       f"{100 * ref_spread:>5.1f}% {100 * normed:>5.1f}% "
                       f"{statistics.mean(secs):>7.1f} {met:>4}/{len(ok):<5}  "
                       f"{' '.join(f'{1000 * x:.1f}' for x in steps)}", file=sys.stdout)
            total["ok"] += len(ok)
            total["met"] += met
            total["spreads"].append(spread)
            total["refs"].append(ref_spread)
            if med >= 0.05:
                total["long"] += 1
                total["long_within"] += spread <= 0.03
    bar.close()
    print(f"summary: {total['long_within']}/{total['long']} configurations with steps >= 50 ms "
          f"within 3% across repeats (median spread of all configurations "
          f"{100 * statistics.median(total['spreads']):.1f}%, of the machine reference "
          f"{100 * statistics.median(total['refs']):.1f}%); "
          f"{statistics.mean(total['secs']):.1f} s per measurement on average (max "
          f"{max(total['secs']):.1f} s); adaptive stop met its target in "
          f"{total['met']}/{total['ok']} measurements")


if __name__ == "__main__":
    main()
