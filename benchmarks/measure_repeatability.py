"""How repeatable is a measurement? Each configuration measured several times in fresh processes.

For each workload, a handful of configurations are measured ``--repeats`` times, each in a fresh
interpreter (``cml.launch.Subprocess``), interleaved so that slow drifts of the machine hit every
configuration alike. It prints, per configuration: the median step time, the relative spread of the
median across repeats ((max - min) / median), the mean seconds spent per measurement (process start
included) and how often the adaptive stop met its CI target. The targets (issue 3): spread at most
3% on CPU for steps of at least 50 ms, at most 30 s per measurement.

Run:
    .venv/bin/python benchmarks/measure_repeatability.py                 # gpt (and dlrm if present)
    .venv/bin/python benchmarks/measure_repeatability.py --repeats 3 --workloads gpt

Results depend on the machine and on what else it runs: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

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
        {"batch_size": 256},
        {"batch_size": 1024},
        {"batch_size": 512, "interaction": "cat"},
        {"batch_size": 512, "sparse_grad": True},
        {"batch_size": 2048, "n_tables": 16},
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="*", default=None)
    parser.add_argument("--max-time-s", type=float, default=10.0,
                        help="timed-phase budget per measurement (MeasureOptions.max_time_s)")
    args = parser.parse_args()
    known = set(cml.workloads.names())
    names = args.workloads or [w for w in CONFIGS if w in known]
    launcher = cml.launch.Subprocess(timeout_s=300)
    options = {"max_time_s": args.max_time_s}
    from cubicml_lab.measure import hardware_info

    hw = hardware_info("cpu")
    print(f"{hw['cpu_model']} ({hw['cpu_count']} CPUs), torch {hw['torch_version']}; "
          f"{args.repeats} repeats per configuration, fresh process each, max_time_s={args.max_time_s}")
    print(f"{'workload':<6} {'config':<44} {'median step':>11} {'spread':>7} {'s/meas':>7} "
          f"{'target met':>10}")
    for name in names:
        runs: dict[int, list[tuple[cml.TrialResult, float]]] = {i: [] for i in range(len(CONFIGS[name]))}
        for _ in range(args.repeats):
            for i, cfg in enumerate(CONFIGS[name]):
                t0 = time.perf_counter()
                res = cml.measure(name, cfg, launcher=launcher, measure_options=options)
                runs[i].append((res, time.perf_counter() - t0))
        for i, cfg in enumerate(CONFIGS[name]):
            ok = [r for r, _ in runs[i] if r.status == "ok"]
            secs = statistics.mean(s for _, s in runs[i])
            if not ok:
                print(f"{name:<6} {str(cfg):<44} {'-':>11} {'-':>7} {secs:>7.1f}  all failed: "
                      f"{runs[i][0][0].status}")
                continue
            steps = [r.metrics["step_time_s"] for r in ok]
            med = statistics.median(steps)
            spread = (max(steps) - min(steps)) / med
            met = sum(r.metrics.get("target_met", 0.0) >= 1.0 for r in ok)
            print(f"{name:<6} {str(cfg):<44} {med * 1000:>9.1f}ms {100 * spread:>6.1f}% "
                  f"{secs:>7.1f} {met:>4}/{len(ok):<5}")


if __name__ == "__main__":
    main()
