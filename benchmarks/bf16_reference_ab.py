"""Is a bf16 trial better gauged by the MLP reference in bf16 than by its raw figure or the fp32
reference? The code of ``--base`` against the working tree, interleaved.

Until 2026-11-28 the MLP drift reference (``cubicml_lab.hardware.ReferenceWork``) ran in fp32
only, so a bf16 trial kept its raw figure as the default (``cubicml_lab.trials._corrects``: it
had followed the fp32 reference poorly on a CPU without bf16 instructions). Since then a bf16
trial is gauged by the MLP in bf16. This measures gpt configurations, bf16 ones and two fp32
ones for comparison, ``--repeats`` times with each revision's code, every measurement in a fresh
process (``cml.launch.Subprocess``; the base arm's through the worktree shim of
``ab_revisions.py``), the arms alternating which goes first. Per arm and configuration it
prints the spread across repeats ((max - min) / median) of the stored figure (``throughput``),
the raw one and the drift-corrected one (``throughput_corrected``: in the base arm a bf16
trial's is over the fp32 reference), and the medians over the bf16 and the fp32
configurations; then seconds per measurement and how many the guard flagged.

On a 2-core AMD EPYC VM with AVX512_BF16, 2026-11-28 13:53-14:02 UTC, idle, none flagged,
base 3062052 (run by an ad-hoc form of this script with the same configurations, 5 repeats,
10-s budgets): the bf16 configurations' stored figure spread a median 2.4% (1.1-3.8%) over
the bf16 reference against 7.2% (5.5-19.3%) raw as stored before, and 4.0% over the fp32
reference (1.7-8.2%); the fp32 configurations, measured alike by both arms, 2.8% and 3.6%;
7.8 s per measurement against 7.6 s. This script itself, 15:21-15:29 UTC (``--base 3062052
--repeats 4``, idle, none flagged): bf16 2.3% (0.9-8.7%) against 19.9% raw (12.1-25.7%) and
9.1% over the fp32 reference; fp32 1.1% and 2.5%; 7.0 s per measurement against 6.7 s.

Run (idle machine; ~10 min):
    .venv/bin/python benchmarks/bf16_reference_ab.py --base 3062052
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cubicml_lab as cml

sys.path.insert(0, str(Path(__file__).parent))
from ab_revisions import base_interpreter, remove_tree  # noqa: E402
from measure_repeatability import rel_spread  # noqa: E402

CONFIGS = [{"micro_batch": 8, "precision": "bf16"}, {"micro_batch": 16, "precision": "bf16"},
           {"micro_batch": 32, "n_heads": 2, "precision": "bf16"},
           {"micro_batch": 8, "precision": "bf16", "recompute": "full"},
           {"micro_batch": 8}, {"micro_batch": 32, "n_heads": 2}]
FIGURES = ("throughput", "throughput_raw", "throughput_corrected")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the base arm")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-time-s", type=float, default=10.0)
    args = parser.parse_args()
    bf16 = [i for i, c in enumerate(CONFIGS) if c.get("precision") == "bf16"]
    fp32 = [i for i in range(len(CONFIGS)) if i not in bf16]
    rows = []
    with tempfile.TemporaryDirectory(prefix="cubicml-bf16-") as tmp:
        arms = {"base": cml.launch.Subprocess(timeout_s=300,
                                              python=base_interpreter(args.base, Path(tmp))),
                "work": cml.launch.Subprocess(timeout_s=300)}
        print(f"base {args.base} against the working tree, {args.repeats} repeats, "
              f"max_time_s {args.max_time_s}; {time.strftime('%H:%M UTC', time.gmtime())}",
              flush=True)
        try:
            for r in range(args.repeats):
                for i, cfg in enumerate(CONFIGS):
                    for arm in (("base", "work") if (r + i) % 2 == 0 else ("work", "base")):
                        t0 = time.perf_counter()
                        res = cml.measure("gpt", cfg, launcher=arms[arm],
                                          measure_options={"max_time_s": args.max_time_s})
                        m = res.metrics
                        rows.append({"arm": arm, "config": i, "ok": res.status == "ok",
                                     "secs": time.perf_counter() - t0,
                                     "contended": bool(m.get("contended")),
                                     **{k: m.get(k, math.nan) for k in FIGURES}})
                        print(f"  {arm} {cfg} repeat {r}: {res.status} "
                              f"{m.get('throughput', math.nan):,.0f}/s (raw "
                              f"{m.get('throughput_raw', math.nan):,.0f}; "
                              f"{res.hardware.get('drift_reference')})", file=sys.stderr,
                              flush=True)
        finally:
            remove_tree(Path(tmp))
    for arm in arms:
        for key in FIGURES:
            spread = [rel_spread([x[key] for x in rows if x["arm"] == arm and x["config"] == i
                                  and x["ok"] and not x["contended"]])
                      for i in range(len(CONFIGS))]

            def med(idx: list[int], s: list[float] = spread) -> float:
                finite = [s[i] for i in idx if math.isfinite(s[i])]
                return 100 * statistics.median(finite) if finite else math.nan

            print(f"{arm} {key:>21}: {' '.join(f'{100 * s:5.1f}' for s in spread)}  | median "
                  f"bf16 {med(bf16):.1f}%, fp32 {med(fp32):.1f}%")
        mine = [x for x in rows if x["arm"] == arm]
        print(f"{arm}: {statistics.mean(x['secs'] for x in mine):.1f} s per measurement (max "
              f"{max(x['secs'] for x in mine):.1f}), {sum(x['contended'] for x in mine)} of "
              f"{len(mine)} flagged")


if __name__ == "__main__":
    main()
