"""Record how a machine's speed moved under real trials, then replay measurement rules on it.

Every A/B of a measurement rule on a machine whose speed wanders compares two arms that met two
different machines: even interleaved, one arm's trial may meet a slow episode the other's missed.
This script takes the machine out of the comparison. ``record`` runs the configurations of
``benchmarks/measure_repeatability.py`` (``--repeats`` fresh processes each, interleaved), each
timed by :func:`cubicml_lab.timing.time_steps` under a long budget (the speed-state gate waits up
to ``--record-budget`` x ``--max-time-s`` and the CI target is never met), and keeps every clock
reading in order: warm-up steps, windows (with the contention guard's verdict) and drift-reference
samples (with the seconds each took). ``replay`` then feeds each trace back through the real
``time_steps`` (a clock that returns the recorded readings, a virtual ``perf_counter`` that
advances by them) under each rule, and prints, per rule, what ``measure_repeatability.py``
prints: the spread across repeats of the stored figure ((max - min) / median), how many
configurations are within 3%, and the seconds a measurement's timed phase lasted. Every rule
meets the same machine, so the differences are the rules'.

A trace that a rule asks more of than it holds is left out of that rule's figures (counted as
``short``); a rule that asks for a reference sample where the trace has none gets the next one
recorded. As a check of the replay itself, the recording's own options must give back, trace by
trace, the figure each trial stored (it prints how many do).

The rules replayed besides the installed code (each window corrected by the reference samples on
either side of it, no gate, a 1.5% CI target): other CI targets, one correction for all windows,
the speed-state gate that was the default before (``drift_tol`` 0.08, ``drift_budget`` 2, a 2%
target) with and without each window corrected, ``--tols`` and ``--budgets`` values of the gate,
any options for all rules (``--set``), and the gate's rule diffs in ``benchmarks/gate_rules/``
(``--patches``): ``usual_only`` (when the wait runs out with 6 windows at the usual speed, stop
with those instead of joining the set-aside ones), ``matched`` (when it runs out, correct by the
reference samples next to the kept windows, not by all).

Replayed on the four trace sets in ``data/`` (2-core VM, 2026-11-26; the speed wandered in all
four): per set the median spread over its 10 configurations and the mean seconds of the timed
phase, and over all 40 configurations the geometric mean of the spreads:

=================================  ===========  ===========  ===========  ===========  ======
rule                               10:02        11:10        13:15        13:50        gmean
=================================  ===========  ===========  ===========  ===========  ======
as shipped                         9.5%, 6.3    5.7%, 8.2    10.6%, 6.2   9.4%, 5.2    8.8%
at a 2% target                     8.1%, 4.5    11.0%, 5.8   10.8%, 4.3   9.5%, 3.6    9.7%
one correction for all windows     14.9%, 6.6   8.1%, 8.4    13.0%, 6.5   12.7%, 5.7   12.5%
the gate (default before)          9.7%, 12.9   7.2%, 14.2   11.0%, 9.4   8.2%, 6.3    8.7%
=================================  ===========  ===========  ===========  ===========  ======

Correcting each window by its own neighbours spreads as the gate did in 60% of its time; one
correction for all windows without the gate spreads 1.4 times as much. No rule reaches 3%: windows
taken at one reference speed still spread by a median of 4.8-12.1% across repeats, drift that the
reference does not see.

Run (on an otherwise idle machine):
    .venv/bin/python benchmarks/gate_replay.py record --out runs/gate_traces.json.gz  # ~25 min
    .venv/bin/python benchmarks/gate_replay.py replay data/gate_traces_cpu_20261126T*.json.gz
    # ~30 s per file; --tols 0.05 0.12 --budgets 1.5 3: more rules of the gate
"""

from __future__ import annotations

import argparse
import glob
import gzip
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure_repeatability import CONFIGS, rel_spread

# ------------------------------------------------------------------------------ recording
_CHILD = r"""
import json, sys, time
import cubicml_lab as cml
import cubicml_lab.timing as T

spec = json.loads(sys.argv[1])
orig, events, seen = T.time_steps, [], {}

def recording(step, *, timer=None, reference=None, guard=None, reference_usual=None, **kw):
    class Timer:
        def start(self):
            timer.start()
        def stop(self):
            s = timer.stop()
            events.append(["t", s])
            return s
    class Guard:  # a reference sample's seconds: as time_steps counts them, guard included
        def start(self):
            self.t0 = time.perf_counter()
            guard.start()
        def stop(self):
            contended, fig = guard.stop()
            if events[-1][0] == "r":
                events[-1][2] = time.perf_counter() - self.t0
            events[-1].append(bool(contended))
            return contended, fig
    def ref():
        t0 = time.perf_counter()
        s = reference()
        events.append(["r", s, time.perf_counter() - t0])
        return s
    seen["usual"] = reference_usual
    return orig(step, timer=Timer(), reference=ref if reference else None,
                guard=Guard() if guard is not None else None,
                reference_usual=reference_usual, **kw)

T.time_steps = recording
res = cml.measure(spec["workload"], spec["config"], launcher=cml.launch.InProcess(),
                  measure_options=spec["measure"])
m = res.metrics
nominal = None  # the machine's kept nominal reference speed, which the figure was scaled to
if m.get("reference_rows") and m.get("reference_speed", 0) > 0:
    from cubicml_lab.hardware import reference_nominal
    nominal = reference_nominal(m["reference_speed"], int(res.hardware["torch_threads"]),
                                rows=int(m["reference_rows"]))
warm = int(res.metrics.get("warmup_steps", 0))  # without a guard, windows carry no verdict yet
for e in [e for e in events if e[0] == "t"][warm:]:
    if len(e) == 2:
        e.append(False)
print(json.dumps({"status": res.status, "metrics": res.metrics, "events": events,
                  "usual_s": seen.get("usual"), "nominal": nominal, "error": res.error}))
"""


def record(args: argparse.Namespace) -> None:
    """Run every (repeat, workload, config) in a fresh interpreter; write the traces."""
    from cubicml_lab.timing import MeasureOptions

    # the gate on and waiting long, the reference after every window, so that every rule finds
    # the readings it asks for; stored in full, so that a replay knows the recording's rule
    # whatever the defaults are by then
    options = MeasureOptions.from_dict({**GATE, "drift_per_window": True,
                                        "max_time_s": args.max_time_s,
                                        "drift_budget": args.record_budget,
                                        "target_rel_ci": 1e-6}).to_dict()
    jobs = [(r, n, i) for r in range(args.repeats) for n in args.workloads
            for i in range(len(CONFIGS[n]))]
    traces = []
    for j, (r, name, i) in enumerate(jobs):
        spec = {"workload": name, "config": CONFIGS[name][i], "measure": options}
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)],
                             capture_output=True, text=True, check=False)
        secs = time.perf_counter() - t0
        try:
            row = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            print(out.stderr[-3000:], file=sys.stderr)
            raise
        m = row["metrics"]
        row.update(workload=name, config=i, knobs=CONFIGS[name][i], repeat=r, secs=secs,
                   metrics={k: m.get(k) for k in (
                       "step_time_raw_s", "step_time_corrected_s", "units_per_step",
                       "flops_per_step", "reference_speed", "reference_usual", "measure_s",
                       "throughput", "reference_rows", "offstate_windows", "drift_gated")})
        traces.append(row)
        n_ref = sum(e[0] == "r" for e in row["events"])
        print(f"[{j + 1}/{len(jobs)}] {name} {i} repeat {r}: {row['status']}, "
              f"{len(row['events']) - n_ref} clock readings, {n_ref} reference samples, "
              f"{secs:.1f} s", flush=True)
        save(args.out, {"options": options, "traces": traces})


def _rounded(x: Any) -> Any:
    """``x`` with its floats to 6 significant digits (a reading's noise is far larger)."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def save(path: str, data: dict[str, Any]) -> None:
    """Write the traces as JSON (gzipped where ``path`` ends in ``.gz``)."""
    with (gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w")) as f:
        json.dump(_rounded(data), f)


def load(path: str) -> dict[str, Any]:
    """Read traces written by :func:`save`."""
    if not os.path.isfile(path):
        sys.exit(f"no traces at {path}: write some with `gate_replay.py record --out {path}`")
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)


# -------------------------------------------------------------------------------- replay
class Short(Exception):
    """The rule asked for more than the trace holds."""


class _Tape:
    """One trace, consumed by a replayed ``time_steps``: clock readings in order, reference
    samples in order (the next recorded one when the rule asks where none was), and a virtual
    clock that advances by each reading and each sample's recorded seconds."""

    def __init__(self, events: list[list[Any]], reference_guard_s: float = 0.0) -> None:
        self.events = [list(e) for e in events]
        self.guard_s = reference_guard_s  # added to each sample's seconds (older traces)
        self.pos = 0
        self.now = 0.0
        self.verdict = False

    def clock(self) -> float:
        return self.now

    def next_reading(self) -> float:
        while self.pos < len(self.events) and self.events[self.pos][0] != "t":
            self.pos += 1  # a reference sample this rule did not take
        if self.pos >= len(self.events):
            raise Short
        e = self.events[self.pos]
        self.pos += 1
        self.now += e[1]
        self.verdict = bool(e[2]) if len(e) > 2 else False
        return e[1]

    def reference(self) -> float:
        for j in range(self.pos, len(self.events)):
            if self.events[j][0] == "r":
                e = self.events.pop(j)
                self.now += e[2] + self.guard_s
                self.verdict = bool(e[3]) if len(e) > 3 else False
                return e[1]
        raise Short


class _Timer:
    def __init__(self, tape: _Tape) -> None:
        self.tape = tape

    def start(self) -> None:
        pass

    def stop(self) -> float:
        return self.tape.next_reading()


class _Guard:
    def __init__(self, tape: _Tape) -> None:
        self.tape = tape

    def start(self) -> None:
        pass

    def stop(self) -> tuple[bool, dict[str, float]]:
        return self.tape.verdict, {}


@contextmanager
def _virtual_clock(steps: types.ModuleType, tape: _Tape):
    """``time.perf_counter`` inside ``steps`` reads the tape's clock."""
    real = steps.time
    steps.time = types.SimpleNamespace(perf_counter=tape.clock)
    try:
        yield
    finally:
        steps.time = real


def steps_module(patch: str | None) -> types.ModuleType:
    """:mod:`cubicml_lab.timing.steps`, or a copy of it changed by the unified diff ``patch``
    (loaded inside the package, so that its relative imports resolve)."""
    from cubicml_lab.timing import steps

    if patch is None:
        return steps
    stem = os.path.basename(patch).removesuffix(".patch")
    name = f"cubicml_lab.timing._replayed_{stem}"
    with tempfile.TemporaryDirectory(prefix="gate_rule_") as tmp:
        path = os.path.join(tmp, f"{stem}.py")
        done = subprocess.run(["patch", "--quiet", "-o", path, steps.__file__, patch],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{patch} does not apply to {steps.__file__}: {done.stdout}{done.stderr}")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def replay_one(trace: dict[str, Any], options: dict[str, Any], steps: types.ModuleType,
               reference_guard_s: float = 0.0) -> dict[str, float] | None:
    """The stored figure and the timed seconds one trace gives under ``options`` and the
    ``time_steps`` of ``steps``; None if it ran short. ``reference_guard_s``: seconds the
    contention guard added to each reference sample, where the trace's do not count them."""
    from cubicml_lab.timing import summarize

    m = trace["metrics"]
    tape = _Tape(trace["events"], reference_guard_s)
    usual = trace["usual_s"]
    nominal = trace.get("nominal") or (  # traces of before: one correction for all windows
        m["reference_speed"] * m["step_time_raw_s"] / m["step_time_corrected_s"])
    with _virtual_clock(steps, tape):
        try:
            timing = steps.time_steps(lambda: None,
                                      options=steps.MeasureOptions.from_dict(options),
                                      timer=_Timer(tape),
                                      guard=_Guard(tape), reference=tape.reference,
                                      reference_usual=usual)
        except Short:
            return None
    out = summarize(timing, m["units_per_step"], m["flops_per_step"], None,
                    reference_nominal=nominal)
    return {"throughput": out["throughput"], "phase_s": timing.elapsed_s,
            "gated": out["drift_gated"], "rel_ci": out["throughput_rel_ci"],
            "steps_per_window": timing.steps_per_window}


def paired_windows(trace: dict[str, Any], steps_per_window: int) -> list[tuple[float, float]]:
    """``(log seconds per step, log reference step time)`` of each clean window of a trace
    with a reference sample on both sides (the reference: their geometric mean)."""
    ev, out = trace["events"], []
    for j, e in enumerate(ev):
        if e[0] != "t" or len(e) < 3 or e[2]:
            continue  # a warm-up step (no guard verdict) or a contended window
        before = next((ev[i][1] for i in range(j - 1, -1, -1) if ev[i][0] == "r"), None)
        after = next((ev[i][1] for i in range(j + 1, len(ev)) if ev[i][0] == "r"), None)
        if before and after:
            out.append((math.log(e[1] / steps_per_window),
                        0.5 * (math.log(before) + math.log(after))))
    return out


def equal_reference_spread(traces: list[tuple[dict[str, Any], int]],
                           band: float = 0.04) -> dict[tuple[str, int], float]:
    """Per configuration: the spread across repeats of the median window over its reference,
    from windows whose reference read within ``band`` (in log) of the configuration's median
    over all its repeats (NaN: a repeat had fewer than 6 such windows). By the reference, the
    machine ran at one speed in all of them: what still spreads is drift this reference does not
    see, which a rule that reads it can only average out, not correct."""
    by_config: dict[tuple[str, int], list[list[tuple[float, float]]]] = {}
    for t, k in traces:  # (trace, its steps per window)
        by_config.setdefault((t["workload"], t["config"]), []).append(paired_windows(t, k))
    out = {}
    for key, repeats in by_config.items():
        centre = statistics.median(r for pairs in repeats for _, r in pairs)
        figures = []
        for pairs in repeats:
            kept = [w - r for w, r in pairs if abs(r - centre) <= band]
            figures.append(math.exp(statistics.median(kept)) if len(kept) >= 6 else math.nan)
        out[key] = rel_spread(figures) if all(map(math.isfinite, figures)) else math.nan
    return out


Results = dict[str, tuple[dict[tuple[str, int], float], list[float]]]


def replay(args: argparse.Namespace) -> None:
    """Print each rule's spread across repeats and seconds on each trace file; with several,
    then pooled over all their configurations."""
    rules = dict(RULES)
    for path in args.patches:  # rules of the gate: with the gate's options
        stem = os.path.basename(path).removesuffix(".patch")
        rules[stem] = (GATE, path)
        for tol in args.tols:
            rules[f"{stem}, drift_tol {tol}"] = ({**GATE, "drift_tol": tol}, path)
    for tol in args.tols:
        rules[f"gate, drift_tol {tol}"] = ({**GATE, "drift_tol": tol}, None)
    for budget in args.budgets:
        rules[f"gate, drift_budget {budget}"] = ({**GATE, "drift_budget": budget}, None)
    pooled: dict[str, tuple[dict[tuple[str, str, int], float], list[float]]] = {}
    for path in args.traces:
        print(f"== {path}")
        for name, (by_config, phases) in replay_set(path, args, rules).items():
            spreads, all_phases = pooled.setdefault(name, ({}, []))
            spreads.update({(path, *key): v for key, v in by_config.items()})
            all_phases += phases
    if len(args.traces) < 2:
        return
    print(f"== pooled over {len(args.traces)} files: geometric mean of the spreads, how many "
          "configurations are within 3%, seconds of the timed phase, and against as shipped "
          "how many spread less and the mean log ratio of the spreads")
    first = next(iter(pooled.values()))[0]
    for name, (spreads, phases) in pooled.items():
        ratios = [math.log(v / first[k]) for k, v in spreads.items() if k in first and v > 0
                  and first[k] > 0]
        gmean = math.exp(statistics.mean(math.log(v) for v in spreads.values() if v > 0))
        print(f"{name:34s} {100 * gmean:5.1f}% {sum(v <= 0.03 for v in spreads.values()):3d}/"
              f"{len(spreads):<3d} phase {statistics.mean(phases):5.1f} s (max "
              f"{max(phases):4.1f}) less {sum(r < 0 for r in ratios):3d}/{len(ratios):<3d} "
              f"log ratio {statistics.mean(ratios):+.3f}")


def replay_set(path: str, args: argparse.Namespace,
               rules: dict[str, tuple[dict[str, Any], str | None]]) -> Results:
    """Print each rule's figures on one trace file; return per rule its spread per
    configuration and the seconds of each replayed timed phase."""
    data = load(path)
    traces = [t for t in data["traces"] if t["status"] == "ok"]
    guard_s = float(data.get("reference_guard_s", 0.0))
    recorded = {**RECORDED_BEFORE, **data["options"]}
    base = {"max_time_s": data["options"]["max_time_s"], **dict(args.set)}
    print(f"{len(traces)} traces; recorded with {recorded}")
    shipped = steps_module(None)
    # self-check: the recording's own options must give back each trial's stored figure
    same = sum(r is not None and math.isclose(r["throughput"], t["metrics"]["throughput"],
                                              rel_tol=1e-4)
               for t in traces for r in [replay_one(t, recorded, shipped, guard_s)])
    print(f"replayed under the recording's own options, {same} of {len(traces)} traces give "
          "back the figure their trial stored")
    replayed = [(t, replay_one(t, base, shipped, guard_s)) for t in traces]
    floor = equal_reference_spread([(t, r["steps_per_window"]) for t, r in replayed if r])
    finite = [v for v in floor.values() if math.isfinite(v)]
    print("windows at one reference speed (within 4% of each configuration's median), their "
          "median over the reference, spread across repeats: "
          + ", ".join(f"{w} {i} " + (f"{100 * v:.1f}%" if math.isfinite(v) else "n/a")
                      for (w, i), v in floor.items())
          + (f"; median {100 * statistics.median(finite):.1f}%" if finite else ""))
    print(f"{'rule':34s} {'spread median':>13s} {'<=3%':>5s} {'worst':>6s} "
          f"{'phase s mean':>12s} {'max':>5s} {'gated':>5s} {'short':>5s} "
          f"{'less spread than as shipped':>27s}")
    first: dict[tuple[str, int], float] = {}
    results: Results = {}
    for name, (options, patch) in rules.items():
        steps = steps_module(patch)
        groups: dict[tuple[str, int], list[float]] = {}
        phases, gated, short = [], 0, 0
        for t in traces:
            r = replay_one(t, {**base, **options}, steps, guard_s)
            if r is None:
                short += 1
                continue
            groups.setdefault((t["workload"], t["config"]), []).append(r["throughput"])
            phases.append(r["phase_s"])
            gated += r["gated"] > 0
        by_config = {key: rel_spread(v) for key, v in groups.items() if len(v) > 1}
        spreads = list(by_config.values())
        first = first or by_config  # the first rule is the installed code as it is
        less = sum(v < first[key] for key, v in by_config.items() if key in first)
        print(f"{name:34s} {100 * statistics.median(spreads):12.1f}% "
              f"{sum(s <= 0.03 for s in spreads):2d}/{len(spreads):<2d} "
              f"{100 * max(spreads):5.1f}% {statistics.mean(phases):12.1f} "
              f"{max(phases):5.1f} {gated:5d} {short:5d} {less:21d} of {len(by_config)}")
        if args.per_config:
            for (w, i), v in groups.items():
                print(f"    {w} {i}: {100 * rel_spread(v):5.1f}%  "
                      + " ".join(f"{x:8.0f}" for x in v))
        results[name] = (by_config, phases)
    return results


#: The speed-state gate as it was the default until 2026-11-26 (with the 2% CI target).
GATE: dict[str, Any] = {"drift_tol": 0.08, "drift_per_window": False, "target_rel_ci": 0.02}
#: What a recording that stored only the options it set ran under for the rest: the defaults of
#: its day (the first three sets in ``data/``).
RECORDED_BEFORE: dict[str, Any] = {"drift_tol": 0.08, "drift_per_window": False}
#: The rules compared: name -> (measure options over the recorded ``max_time_s``, a unified diff
#: of ``cubicml_lab/timing/steps.py`` or None for the installed one).
RULES: dict[str, tuple[dict[str, Any], str | None]] = {
    "as shipped": ({}, None),
    "at 2%": ({"target_rel_ci": 0.02}, None),
    "at 1%": ({"target_rel_ci": 0.01}, None),
    "one correction for all windows": ({"drift_per_window": False}, None),
    "the gate (default before)": (GATE, None),
    "the gate, each window corrected": ({**GATE, "drift_per_window": True}, None),
}


def _option(text: str) -> tuple[str, Any]:
    """``OPTION=VALUE`` (VALUE read as JSON) -> ``(OPTION, value)``."""
    key, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected OPTION=VALUE, e.g. "
                                         "target_rel_ci=0.01") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run the trials and keep their clock readings")
    rec.add_argument("--out", required=True)
    rec.add_argument("--repeats", type=int, default=5)
    rec.add_argument("--workloads", nargs="*", default=list(CONFIGS))
    rec.add_argument("--max-time-s", type=float, default=10.0)
    rec.add_argument("--record-budget", type=float, default=3.0,
                     help="drift_budget of the recording (x max_time_s; longer traces)")
    rep = sub.add_parser("replay", help="replay the rules on recorded traces")
    rep.add_argument("traces", nargs="+", help="files written by record (.json or .json.gz), "
                     "e.g. data/gate_traces_cpu_20261126T*.json.gz; with several, also pooled")
    rep.add_argument("--patches", nargs="*", default=sorted(glob.glob(os.path.join(
                         os.path.dirname(os.path.abspath(__file__)), "gate_rules", "*.patch"))),
                     help="rules to replay too: unified diffs of cubicml_lab/timing/steps.py "
                          "(default: benchmarks/gate_rules/*.patch)")
    rep.add_argument("--tols", nargs="*", type=float, default=[], help="drift_tol values")
    rep.add_argument("--budgets", nargs="*", type=float, default=[], help="drift_budget values")
    rep.add_argument("--set", nargs="*", type=_option, default=[], metavar="OPTION=VALUE",
                     help="measure options every rule runs under (a JSON value), e.g. "
                          "target_rel_ci=0.01 max_time_s=5; at most the recorded max_time_s")
    rep.add_argument("--per-config", action="store_true",
                     help="also print each configuration's spread and figures under each rule")
    args = parser.parse_args()
    record(args) if args.cmd == "record" else replay(args)


if __name__ == "__main__":
    main()
