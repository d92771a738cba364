"""What running a script as a ``Command`` costs, and whether the lab's figure is the job's own.

The job is ``examples/plain_torch_report.py`` (a small causal LM reporting each step through
``cubicml_lab.report``), with ``--own-timings``: the script's own ``perf_counter`` time of each
optimizer step, written by the script itself. For each configuration and launcher, each repeat:

* **alone**: the script run by hand (``subprocess``) for as many steps as the lab ran it; its
  start-up is the time from starting it to its first step report.
* **under the lab**: one trial (``launcher.run(spec)``), timed from the caller.

Printed per configuration (medians over repeats):

* the gaps: the lab's step time (``step_time_s``: the median of its windows, warm-up dropped)
  against the job's own clock over the same steps (target: within 3% for steps of 20 ms or
  more): its steps' median, the median of its windows grouped as the lab's (same arithmetic,
  the job's clock), and its mean (what a trainer's ``train_samples_per_second`` says; a median
  and a mean part where some steps are slow, as on a shared CPU);
* ``added s``: the seconds the lab adds to a trial beyond the job's own start-up and training:
  the trial's wall time less the job's start-up under the lab (``job_startup_s``, which ends at
  its first step report, after step 1) and the sum of its own times of the steps after the first
  (target: at most 1 s). It holds the worker's interpreter (Subprocess), the
  guard, the polling, stopping the job, reading the job's package versions and the machine record.
* ``start-up``: the job's start-up under the lab and alone (the lab should not slow it).

Measured figures, with the machine and date: ``docs/results.md``.

Run:
    .venv/bin/python benchmarks/command_overhead.py                      # about 3.5 minutes
    .venv/bin/python benchmarks/command_overhead.py --repeats 1 --launchers subprocess
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cubicml_lab.launch import InProcess, Subprocess
from cubicml_lab.workloads import Command

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "plain_torch_report.py"
#: Configurations: (batch, width); on a 2-core VM about 33 ms and 112 ms a step.
CONFIGS = ((4, 64), (8, 128))
MEASURE = {"max_time_s": 3.0, "min_steps": 10, "target_rel_ci": 0.02}
LAUNCHERS = {"inprocess": InProcess, "subprocess": lambda: Subprocess(timeout_s=300)}


def own_times(path: Path) -> list[float]:
    return [json.loads(x)["seconds"] for x in path.read_text().splitlines()]


def own_windows(times: list[float], k: int) -> list[float]:
    """Mean seconds per step of consecutive groups of ``k`` steps (a partial last one dropped)."""
    return [statistics.fmean(times[i:i + k]) for i in range(0, len(times) - k + 1, k)]


def under_the_lab(launcher: str, batch: int, width: int, folder: Path,
                  repeat: int) -> dict[str, float]:
    """One trial; the figures of this module's docstring."""
    own = folder / f"lab-{launcher}-{batch}-{width}-{repeat}.jsonl"
    own.unlink(missing_ok=True)
    job = Command("plain-lm", argv=[sys.executable, str(SCRIPT), "--batch={batch}",
                                    "--width={width}", "--steps=2000", f"--own-timings={own}"],
                  units="tokens", timeout_s=240)
    config = {"batch": batch, "width": width}
    spec = {"workload": job.name, "config": config, "command": job.to_spec(), "measure": MEASURE}
    t0 = time.perf_counter()
    result = LAUNCHERS[launcher]().run(spec)
    wall = time.perf_counter() - t0
    if result.status != "ok":
        raise SystemExit(f"{launcher} {config}: {result.status}: {result.error}")
    m, times = result.metrics, own_times(own)
    first = int(m["warmup_steps"]) + 1  # the lab's first timed step (0-based)
    timed = times[first:first + int(m["steps_timed"])]
    k = max(1, round(m["steps_timed"] / m["windows"]))  # the lab's steps per window
    return {"step_s": m["step_time_s"], "own_median_s": statistics.median(timed),
            "own_windows_s": statistics.median(own_windows(timed, k)),
            "own_mean_s": statistics.fmean(timed),
            # job_startup_s runs to the first report, after step 1: step 1 is counted there
            "added_s": wall - m["job_startup_s"] - sum(times[1:]),
            "startup_s": m["job_startup_s"],
            "steps": float(len(times)), "wall_s": wall}


def alone(batch: int, width: int, steps: int, folder: Path) -> float:
    """The job's start-up run by hand: seconds from starting it to its first step report."""
    metrics = folder / f"alone-{batch}-{width}.jsonl"
    metrics.unlink(missing_ok=True)
    env = {**os.environ, "CUBICML_LAB_METRICS": str(metrics)}
    t0 = time.time()
    subprocess.run([sys.executable, str(SCRIPT), f"--batch={batch}", f"--width={width}",
                    f"--steps={steps}"], env=env, check=True, stdout=subprocess.DEVNULL,
                   timeout=300)
    first = json.loads(metrics.read_text().splitlines()[0])
    return first["wall"] - t0


GAPS = {"own_median_s": "steps' median", "own_windows_s": "its windows", "own_mean_s": "mean"}


def row(launcher: str, batch: int, width: int, runs: list[dict[str, float]],
        solo: list[float]) -> str:
    """Two lines: the medians over repeats, then each repeat's gaps and added seconds."""
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    gaps = {k: [r["step_s"] / r[k] - 1 for r in runs] for k in GAPS}
    cells = " ".join(f"{100 * statistics.median(g):>+13.2f}%" for g in gaps.values())
    each = "; ".join(f"{GAPS[k]} " + ", ".join(f"{100 * x:+.1f}%" for x in g)
                     for k, g in gaps.items())
    return (f"{launcher:<11} {batch:>5} {width:>5} {1e3 * med('step_s'):>8.1f} {cells} "
            f"{med('added_s'):>8.2f} {med('startup_s'):>9.2f} / {statistics.median(solo):.2f}\n"
            f"{'':<11} each run: {each}; added s "
            + ", ".join(f"{r['added_s']:.2f}" for r in runs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--launchers", nargs="+", default=list(LAUNCHERS), choices=list(LAUNCHERS))
    a = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="command-overhead-"))
    heads = " ".join(f"{'vs ' + w:>14}" for w in GAPS.values())
    print(f"{'launcher':<11} {'batch':>5} {'width':>5} {'step ms':>8} {heads} {'added s':>8} "
          f"{'start-up lab / alone s':>22}")
    for launcher in a.launchers:
        for batch, width in CONFIGS:
            runs = [under_the_lab(launcher, batch, width, folder, i) for i in range(a.repeats)]
            solo = [alone(batch, width, int(r["steps"]), folder) for r in runs]
            print(row(launcher, batch, width, runs, solo), flush=True)
    print(f"(gaps: the lab's step time against the job's own clock over the steps the lab timed; "
          f"medians of {a.repeats} repeats; per-run files in {folder})")


if __name__ == "__main__":
    main()
