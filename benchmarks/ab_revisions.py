"""A/B of the measurement code of two revisions, interleaved, on the same machine at the same time.

On a machine whose speed wanders, two runs of ``measure_repeatability.py`` one after the other
compare the machine's two moods, not the two versions (on a 2-core VM, 2026-11-26: the same code
spread 3.0% at 04:09 and 6.8% at 04:19). This measures each (repeat, configuration) once with the
code of ``--base`` (a git revision, checked out into a temporary worktree) and once with the
working tree, in fresh processes, alternating which goes first, so that drift hits both alike.
Per arm it prints the spread of the stored figure (``throughput``) across repeats ((max - min) /
median) of each configuration, its median, how many configurations stay within 3%, seconds per
measurement, the stored CI (``throughput_rel_ci``) and the reference samples per trial.

The base arm's trials run under this interpreter with the base tree first on ``sys.path`` (a
small shim in the temporary folder); both arms share the reference cache, as two versions on one
machine would.

``--work-env KEY=VALUE`` (repeatable) adds to the working tree arm's environment: with ``--base
HEAD`` and a clean tree, an A/B of a process setting (an allocator's, OpenMP's). Its reference
may then run at another speed, so each arm gets its own copy of the reference cache.
``--work-python EXE`` does the same for an interpreter wrapper (the arm's trials run ``EXE -m
cubicml_lab.launch.worker ...``): e.g. a script that execs ``setarch -R python``, which is how
the fixed address layout of today's trial processes was first measured.

Run (idle machine; ~17 min for 4 repeats of the 10 configurations):
    .venv/bin/python benchmarks/ab_revisions.py --base HEAD --repeats 4
    .venv/bin/python benchmarks/ab_revisions.py --base HEAD~3 --workloads gpt --repeats 3
    .venv/bin/python benchmarks/ab_revisions.py --work-env GLIBC_TUNABLES=glibc.malloc.hugetlb=1
    .venv/bin/python benchmarks/ab_revisions.py --base HEAD --demo 5  # ~35 min
    .venv/bin/python benchmarks/ab_revisions.py --base 3062052 --repeats 4 --configs '{"gpt": [
        {"micro_batch": 8, "precision": "bf16"}, {"micro_batch": 16, "precision": "bf16"},
        {"micro_batch": 32, "n_heads": 2, "precision": "bf16"}, {"micro_batch": 8}]}'

``--configs JSON`` measures the configurations given (``{workload: [config, ...]}``) instead
of ``measure_repeatability.py``'s. Each arm's line is followed by the spreads of the raw figure
(``throughput_raw``) and of the drift-corrected one (``throughput_corrected``). The bf16
reference was first measured so (2026-11-28, an AVX512_BF16 EPYC VM, base 3062052, 4 repeats,
by a separate script since folded in here, with 2 more configurations): bf16 configurations
spread a median 2.3% over the bf16 reference against 19.9% raw, and 9.1% over the fp32 one
(``cubicml_lab.launch.runner._corrects``).

``--demo RUNS`` compares ``make demo``'s campaign instead: RUNS campaigns per arm, interleaved,
printing each one's leave-one-out Kendall tau, best configuration and seconds. The base arm's
whole process tree, the trials' own interpreters included, imports the base tree (through
``PYTHONPATH``): a shim around the parent alone would leave the trials on the working tree.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import cubicml_lab as cml
from cubicml_lab.hardware.cache import cache_dir

sys.path.insert(0, str(Path(__file__).parent))
from measure_repeatability import CONFIGS, rel_spread  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

_SHIM = """import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, {tree!r})
assert sys.argv[1] == "-m", sys.argv
module = sys.argv[2]
sys.argv = [module] + sys.argv[3:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def base_tree(rev: str, folder: Path) -> Path:
    """A worktree of ``rev`` at ``folder / "tree"``."""
    tree = folder / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                   check=True, capture_output=True)
    return tree


def remove_tree(folder: Path) -> None:
    """Remove the worktree :func:`base_tree` made in ``folder``."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                    str(folder / "tree")], check=False, capture_output=True)


def base_interpreter(rev: str, folder: Path) -> str:
    """A worktree of ``rev`` in ``folder`` and an executable that runs ``python -m MODULE`` with
    that tree's ``cubicml_lab`` (not the installed one); returns the executable's path."""
    tree = base_tree(rev, folder)
    shim = folder / "shim.py"
    shim.write_text(_SHIM.format(tree=str(tree)))
    exe = folder / "python"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{shim}" "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def spreads(rows: list[dict], arm: str, configs: dict[str, list[dict]],
            figure: str = "throughput") -> list[float]:
    """The arm's spread across repeats of ``figure`` for each configuration (unflagged ok)."""
    return [rel_spread([x[figure] for x in rows if x["arm"] == arm and x["workload"] == name
                        and x["config"] == i and x["status"] == "ok" and not x["contended"]])
            for name, cfgs in configs.items() for i in range(len(cfgs))]


def report(rows: list[dict], arm: str, configs: dict[str, list[dict]]) -> str:
    """The arm's spreads per configuration and what a measurement cost; then the same spreads
    of the raw and the drift-corrected figure."""
    spread = spreads(rows, arm, configs)
    mine = [x for x in rows if x["arm"] == arm]
    finite = [s for s in spread if math.isfinite(s)]
    others = "".join(f"\n{arm:>4} {figure}: " + " ".join(
        f"{100 * s:.1f}" for s in spreads(rows, arm, configs, figure))
        for figure in ("throughput_raw", "throughput_corrected"))
    return (f"{arm:>4}: spread per config {' '.join(f'{100 * s:.1f}' for s in spread)}; "
            f"median {100 * statistics.median(finite):.1f}%, within 3%: "
            f"{sum(s <= 0.03 for s in finite)}/{len(spread)}; "
            f"{statistics.mean(x['secs'] for x in mine):.1f} s per measurement (max "
            f"{max(x['secs'] for x in mine):.1f}); stored CI median "
            f"{100 * statistics.median(x['throughput_rel_ci'] for x in mine):.1f}%; reference "
            f"samples median {statistics.median(x['reference_samples'] for x in mine):.0f}"
            + others)


def demo_ab(rev: str, runs: int, folder: Path, keep: Path | None = None) -> None:
    """``runs`` demo campaigns per arm, interleaved (the arm that goes first alternates): the
    base arm's process tree, its trials' interpreters included, imports ``rev``'s tree first
    (``PYTHONPATH``, which comes before the editable install); per run and per arm the
    leave-one-out Kendall tau, the best configuration and the campaign's seconds. ``keep``: a
    folder whose ``demo.sqlite`` gets every campaign (named ``base1-HHMMSS``, ``work1-...``),
    for rescoring later (``demo_report_noise.py``)."""
    tree = base_tree(rev, folder)
    found: dict[str, list[tuple[float, str, str]]] = {"base": [], "work": []}
    for r in range(runs):
        for arm in (("base", "work") if r % 2 == 0 else ("work", "base")):
            out = folder / f"{arm}{r + 1}"
            env = dict(os.environ)
            if arm == "base":
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(tree)] + [p for p in [env.get("PYTHONPATH")] if p])
            store = str((keep or out) / "demo.sqlite")  # one store: campaigns keep their names
            out.mkdir(parents=True, exist_ok=True)
            done = subprocess.run([sys.executable, "-m", "cubicml_lab.cli", "demo", "--store",
                                   store, "--out", str(out), "--no-progress",
                                   "--campaign", f"{arm}{r + 1}-{time.strftime('%H%M%S')}"],
                                  env=env, capture_output=True, text=True, check=False,
                                  cwd=out)  # not the checkout: `-m` puts the cwd first
            text = done.stdout
            tau = re.search(r"Kendall tau = ([-0-9.na]+)", text)
            best = re.search(r"best configuration: (\{.*?\})", text)
            took = re.search(r"campaign took (\d+) s", text)
            if done.returncode != 0 or not (tau and best and took):
                print(f"{arm} run {r + 1} failed (rc {done.returncode}):\n{done.stderr[-2000:]}")
                continue
            found[arm].append((float(tau.group(1)), best.group(1), took.group(1)))
            print(f"  {arm} run {r + 1} ({time.strftime('%H:%M UTC', time.gmtime())}): tau "
                  f"{tau.group(1)}, {took.group(1)} s, best {best.group(1)}", flush=True)
    for arm, rows in found.items():
        if not rows:
            continue
        common, n = Counter(b for _, b, _ in rows).most_common(1)[0]
        print(f"{arm:>4}: tau {', '.join(f'{t:.3f}' for t, _, _ in rows)} "
              f"({sum(t >= 0.8 for t, _, _ in rows)} of {len(rows)} at 0.8 or more); "
              f"campaigns {', '.join(s for _, _, s in rows)} s; the same best configuration in "
              f"{n} of {len(rows)}: {common}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the base arm")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--max-time-s", type=float, default=10.0)
    parser.add_argument("--workloads", nargs="*", default=list(CONFIGS))
    parser.add_argument("--configs", default=None, metavar="JSON",
                        help='configurations instead of --workloads\', e.g. '
                             '\'{"gpt": [{"micro_batch": 8, "precision": "bf16"}]}\'')
    parser.add_argument("--work-env", action="append", default=[], metavar="KEY=VALUE",
                        help="add to the working tree arm's environment (repeatable)")
    parser.add_argument("--work-python", default=None, metavar="EXE",
                        help="the working tree arm's interpreter: a wrapper such as a script "
                             "that execs `setarch -R python`")
    parser.add_argument("--demo", type=int, default=0, metavar="RUNS",
                        help="instead: RUNS `cubicml-lab demo` campaigns per arm, interleaved "
                             "(~2.5 min each)")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="with --demo: store every campaign in DIR/demo.sqlite")
    args = parser.parse_args()
    if args.demo:
        with tempfile.TemporaryDirectory(prefix="cubicml-ab-") as tmp:
            print(f"demo: base {args.base} against the working tree, {args.demo} runs each; "
                  f"{time.strftime('%H:%M UTC', time.gmtime())}", flush=True)
            try:
                keep = None if args.keep is None else Path(args.keep)
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                demo_ab(args.base, args.demo, Path(tmp), keep)
            finally:
                remove_tree(Path(tmp))
        return
    configs = (json.loads(args.configs) if args.configs
               else {k: CONFIGS[k] for k in args.workloads})
    options = {"max_time_s": args.max_time_s}
    with tempfile.TemporaryDirectory(prefix="cubicml-ab-") as tmp:
        envs: dict[str, dict[str, str]] = {"base": {}, "work": {}}
        if args.work_env or args.work_python:
            envs["work"] = dict(kv.split("=", 1) for kv in args.work_env)
            for arm, env in envs.items():  # own reference cache each, seeded with the machine's
                env["CUBICML_LAB_CACHE_DIR"] = str(Path(tmp) / f"cache-{arm}")
                shutil.copytree(cache_dir(), env["CUBICML_LAB_CACHE_DIR"], dirs_exist_ok=True)
        arms = {"base": cml.launch.Subprocess(timeout_s=300, env=envs["base"],
                                              python=base_interpreter(args.base, Path(tmp))),
                "work": cml.launch.Subprocess(timeout_s=300, env=envs["work"],
                                              python=args.work_python or sys.executable)}
        print(f"base {args.base} against the working tree {args.work_env or ''}"
              f"{args.work_python or ''}; "
              f"{args.repeats} repeats, measure "
              f"options {options}; load average {open('/proc/loadavg').read().split()[:3]}; "
              f"{time.strftime('%H:%M UTC', time.gmtime())}", flush=True)
        rows = []
        try:
            for r in range(args.repeats):
                for name, cfgs in configs.items():
                    for i, cfg in enumerate(cfgs):
                        for arm in (("base", "work") if (r + i) % 2 == 0 else ("work", "base")):
                            t0 = time.perf_counter()
                            res = cml.measure(name, cfg, launcher=arms[arm],
                                              measure_options=options)
                            m = res.metrics
                            rows.append({"arm": arm, "workload": name, "config": i,
                                         "status": res.status, "secs": time.perf_counter() - t0,
                                         **{k: m.get(k, math.nan) for k in (
                                             "throughput", "throughput_raw",
                                             "throughput_corrected", "throughput_rel_ci",
                                             "reference_samples", "contended")}})
                            print(f"  {arm} {name} {i} repeat {r}: {res.status} "
                                  f"{m.get('throughput', math.nan):.0f}/s, "
                                  f"{rows[-1]['secs']:.1f} s", file=sys.stderr, flush=True)
        finally:
            remove_tree(Path(tmp))
        for arm in arms:
            print(report(rows, arm, configs))


if __name__ == "__main__":
    main()
