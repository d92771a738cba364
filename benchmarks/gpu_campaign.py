"""A co-design campaign on one GPU: the demo's loop (default configuration first, then the
Bayesian search with the gpt cost model as its prior) over a GPU-sized GPT, with every trial
timed by CUDA events in a fresh process. Then the recommended and the default configurations are
measured again in fresh processes, to see whether the speed-up holds outside the campaign.

It prints the trials, the GP's leave-one-out Kendall tau and MAPE over them, the recommendation
and the re-measurements; the SQLite store is kept (``--store``) for the notebooks and
``data/``. Runs with the GPU machine's own python3 (its torch, botorch, gpytorch), the package by
``PYTHONPATH``::

    PYTHONPATH=$PWD python3 benchmarks/gpu_campaign.py --budget 16 --store $OUT/gpu_campaign.sqlite

The model is fixed (d_model 1024, 8 layers, 1024-token sequences, a 32k vocabulary: steps of
5-150 ms on an H100); the search chooses micro-batch, heads, precision, recomputation and the
fused optimizer. ``fp32_flop_cost`` of the cost model is the card's datasheet bf16 over fp32 rate
(fp32 matmuls run without TF32 here). The search's stopping rule is held off (``stop_patience``
= the budget) so that every campaign has the same number of trials to score.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cubicml_lab as cml  # noqa: E402
from cubicml_lab.demo import demo_prior, predictor_report, summary_table  # noqa: E402
from cubicml_lab.space import Choice, Ordinal, PowerOfTwo, Space  # noqa: E402

MODEL = {"d_model": 1024, "n_layers": 8, "seq_len": 1024, "vocab": 32768}
SMALL = {"d_model": 128, "n_layers": 2, "seq_len": 128, "vocab": 2048}
SPACE = Space([
    PowerOfTwo("micro_batch", 2, 64),
    Ordinal("n_heads", [8, 16, 32]),
    Choice("precision", ["fp32", "bf16"]),
    Choice("recompute", ["none", "selective", "full"]),
    Choice("fused_optimizer", [False, True]),
])
#: What a user would write first: fp32, no recomputation, the optimizer's default loop.
DEFAULT = {"micro_batch": 8, "n_heads": 16, "precision": "fp32", "recompute": "none",
           "fused_optimizer": False}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=16, help="finished trials (default 16)")
    ap.add_argument("--store", default="runs/gpu/gpu_campaign.sqlite")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-time-s", type=float, default=3.0, help="timing budget per trial")
    ap.add_argument("--repeats", type=int, default=2,
                    help="fresh-process re-measurements of the recommended and default configs")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu with --small for a smoke run")
    ap.add_argument("--small", action="store_true", help="a small model (d_model 128, 2 layers, "
                    "128-token sequences): a CPU smoke run of the script")
    args = ap.parse_args()
    model = SMALL if args.small else MODEL

    from cubicml_lab.hardware import device_peak_flops
    from cubicml_lab.search import BayesianSearch

    bf16, fp32 = device_peak_flops(args.device, "bf16"), device_peak_flops(args.device, "fp32")
    flop_cost = bf16 / fp32 if bf16 and fp32 else 1.0
    prior = demo_prior(flop_cost, model, fp32_score_cost=1.0,
                       thread_scaling=1.0)  # no CPU probe for a GPU
    search = BayesianSearch(SPACE, objective="throughput", seed=args.seed,
                            stop_patience=args.budget, **prior)
    store = cml.TrialStore(args.store)
    name = time.strftime("gpu-%Y%m%d-%H%M%S")
    measure = {"max_time_s": args.max_time_s}
    camp = cml.Campaign(name, SPACE, workload="gpt", device=args.device, searcher=search,
                        store=store,
                        launcher=cml.launch.Subprocess(timeout_s=300), fixed=model,
                        measure_options=measure, reference=DEFAULT)
    print(f"campaign {name!r}: {SPACE.size()} configurations of {', '.join(SPACE.names)}; model "
          f"{model}; an fp32 FLOP weighs {flop_cost:.3g} bf16 FLOPs; budget {args.budget}")
    t0 = time.perf_counter()
    df = camp.run(args.budget, progress=False, full=True)
    elapsed = time.perf_counter() - t0
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary_table(df, SPACE).to_string())
    print("statuses:", df["status"].value_counts().to_dict())
    report = predictor_report(df, SPACE, seed=args.seed, **prior)
    print(f"GP leave-one-out over {report['n']} ok trials: Kendall tau {report['kendall_tau']:.3f},"
          f" MAPE {100 * report['mape']:.1f}%; campaign {elapsed:.0f} s")
    best_cfg, estimate = search.recommend()
    best, default = camp.measured_value(best_cfg), camp.reference_value()
    print(f"recommended {best_cfg}: {best:,.0f} tokens/s measured ({estimate:,.0f} estimated); "
          f"default {default:,.0f}: {best / default:.2f}x")
    again: dict[str, list[float]] = {"recommended": [], "default": []}
    for _ in range(args.repeats):
        for key, cfg in (("recommended", best_cfg), ("default", DEFAULT)):
            res = cml.measure("gpt", {**model, **cfg}, device=args.device, measure_options=measure,
                              launcher=cml.launch.Subprocess(timeout_s=300))
            again[key].append(res.metrics.get("throughput", math.nan) if res.status == "ok"
                              else math.nan)
    for key, vals in again.items():
        print(f"re-measured {key}: {', '.join(f'{v:,.0f}' for v in vals)} tokens/s")
    r, d = (sum(v) / len(v) for v in again.values())
    print(f"speed-up on re-measurement: {r / d:.2f}x (in the campaign {best / default:.2f}x)")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
