"""Tests for cubicml_lab.timing: real clocks on real (sleeping or computing) steps.

Steps that sleep keep the timing tests meaningful on a busy, shared CPU: a sleep lasts at least
its duration whatever else runs, while compute-bound steps slow down under contention.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cubicml_lab.errors import MeasurementError
from cubicml_lab.timing import (
    MeasureOptions,
    Timing,
    device_peak_flops,
    hardware_info,
    make_timer,
    peak_memory_gib,
    reset_peak_memory,
    summarize,
    time_steps,
)
from cubicml_lab.timing.reported import reported_timing

ROOT = Path(__file__).resolve().parents[1]


def sleeper(seconds: float):
    return lambda: time.sleep(seconds)


# ------------------------------------------------------------------------------- time_steps
def test_median_of_a_20ms_step() -> None:
    t = time_steps(sleeper(0.02), options=MeasureOptions(max_time_s=0.6, window_min_s=0.0))
    assert abs(t.median_step_time_s / 0.02 - 1) < 0.15, t
    assert t.steps_per_window == 1 and t.windows == t.steps_timed == len(t.step_times_s)
    assert t.warmup_steps >= 2 and len(t.warmup_step_times_s) == t.warmup_steps
    assert t.steps_timed >= 5
    assert t.elapsed_s >= sum(t.step_times_s) + sum(t.warmup_step_times_s) - 1e-6


def test_warmup_discards_slow_first_steps() -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        time.sleep(0.06 if len(calls) <= 3 else 0.005)

    t = time_steps(step, options=MeasureOptions(max_time_s=0.5, window_min_s=0.0,
                                                warmup_max_s=5.0))
    assert t.warmup_steps >= 6, "warm-up ends only once 3 step times agree"
    assert all(x >= 0.06 for x in t.warmup_step_times_s[:3])
    assert max(t.step_times_s) < 0.03, "a slow warm-up step leaked into the timed windows"
    assert abs(t.median_step_time_s / 0.005 - 1) < 0.5
    assert len(calls) == t.warmup_steps + t.steps_timed


def test_a_long_step_warms_up_for_at_most_half_the_timing_budget() -> None:
    # 0.1-s steps and 0.3 s of timing: 2 warm-up steps (0.2 s > 0.15 s), not the 4 that
    # settling needs, unless the caller gives the warm-up its own budget
    opts = {"max_time_s": 0.3, "min_steps": 1, "window_min_s": 0.0}
    assert time_steps(sleeper(0.1), options=MeasureOptions(**opts)).warmup_steps == 2
    own = time_steps(sleeper(0.1), options=MeasureOptions(**opts, warmup_max_s=5.0))
    assert own.warmup_steps >= 4


def test_first_step_is_never_timed_even_when_settled() -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        time.sleep(0.05 if len(calls) == 1 else 0.002)

    t = time_steps(step, options=MeasureOptions(warmup_min_steps=1, warmup_max_steps=1,
                                                max_time_s=0.2, window_min_s=0.0))
    assert t.warmup_steps == 1 and t.warmup_step_times_s[0] >= 0.05
    assert max(t.step_times_s) < 0.04


def test_steady_step_stops_early_on_target() -> None:
    opts = MeasureOptions(target_rel_ci=0.05, max_steps=100_000, max_time_s=10.0,
                          window_min_s=0.01)
    t = time_steps(sleeper(0.002), options=opts)
    assert t.target_met and t.stop_reason == "target met", t
    assert t.rel_ci <= 0.05 and t.windows >= 6
    assert t.elapsed_s < 5.0 and t.steps_timed < 100_000


def test_noisy_step_does_not_claim_the_target() -> None:
    rng = random.Random(0)
    opts = MeasureOptions(target_rel_ci=0.02, min_steps=5, max_steps=12, max_time_s=10.0,
                          window_min_s=0.0)
    t = time_steps(lambda: time.sleep(rng.uniform(0.01, 0.04)), options=opts)
    assert not t.target_met and t.stop_reason == "max_steps"
    assert t.steps_timed == 12 and t.rel_ci > 0.02
    assert t.rel_spread > 0.1


def test_time_budget_stops_timing() -> None:
    opts = MeasureOptions(target_rel_ci=1e-6, max_steps=100_000, max_time_s=0.3, window_min_s=0.0)
    t = time_steps(sleeper(0.01), options=opts)
    assert t.stop_reason == "max_time_s" and not t.target_met
    assert 0.2 < sum(t.step_times_s) < 0.45


def test_min_steps_are_timed_past_the_time_budget() -> None:
    opts = MeasureOptions(min_steps=4, max_time_s=0.01, window_min_s=0.0, warmup_max_s=0.0)
    t = time_steps(sleeper(0.02), options=opts)
    assert t.steps_timed >= 4


def test_fast_steps_are_grouped_into_windows() -> None:
    opts = MeasureOptions(max_steps=100_000, max_time_s=0.5, window_min_s=0.05)
    t = time_steps(sleeper(0.001), options=opts)
    # a sleep(1 ms) step lasts >= 1 ms, so a window of >= 50 ms holds at most ~50 of them
    assert 10 <= t.steps_per_window <= 50, t.steps_per_window  # >= 10: grouped (a busy host
    # oversleeps a 1 ms sleep)
    assert t.steps_timed == t.windows * t.steps_per_window
    assert min(x * t.steps_per_window for x in t.step_times_s) >= 0.045
    assert 0.001 <= t.median_step_time_s < 0.003


def test_windows_shrink_to_fit_eight_into_max_steps() -> None:
    opts = MeasureOptions(target_rel_ci=1e-9, max_steps=80, window_min_s=0.05)
    t = time_steps(sleeper(0.001), options=opts)
    assert t.steps_per_window == 10 and t.windows == 8 and t.steps_timed == 80


def test_a_jobs_fast_reported_steps_get_windows_enough_for_an_interval() -> None:
    """A job reporting 1 ms steps up to max_steps = 80: windows of 50 ms would hold 50 steps
    and leave one window (no CI); they shrink to 10 steps, as :func:`time_steps`'s do."""
    opts = MeasureOptions(max_steps=80, window_min_s=0.05)
    t = reported_timing([(1, 0.004)] + [(1, 0.001)] * 90, opts)
    assert t.steps_per_window == 10 and t.windows >= 8, (t.steps_per_window, t.windows)
    assert math.isfinite(t.rel_ci) and t.median_step_time_s == pytest.approx(0.001)


def test_gc_is_off_in_windows_and_restored_when_the_step_raises() -> None:
    seen = []

    def step() -> None:
        seen.append(gc.isenabled())
        if not seen[-1]:
            raise RuntimeError("boom inside a timed window")
        time.sleep(0.001)

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="boom"):
        time_steps(step, options=MeasureOptions(max_time_s=1.0, window_min_s=0.0))
    assert gc.isenabled()
    assert seen[0] is True and seen[-1] is False  # warm-up with gc on; timed window with gc off
    gc.disable()
    try:
        time_steps(sleeper(0.001), options=MeasureOptions(max_time_s=0.05))
        assert not gc.isenabled(), "a caller's disabled gc must stay disabled"
    finally:
        gc.enable()


def test_outlier_windows_are_counted_not_dropped() -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        time.sleep(0.1 if len(calls) in (9, 12) else 0.005)  # two hiccups after warm-up

    t = time_steps(step, options=MeasureOptions(min_steps=20, max_steps=20, window_min_s=0.0,
                                                warmup_min_steps=5, warmup_max_steps=5))
    assert t.warmup_steps == 5 and t.steps_timed == 20
    assert t.outlier_steps >= 2  # the two hiccups at least (sleep jitter may add some)
    assert sum(x > 0.09 for x in t.step_times_s) == 2


def test_median_ci_ranks_match_the_binomial_table() -> None:
    from cubicml_lab.timing.figures import _median_ci_rank

    # n=5: no order statistic interval reaches 95%; n=6: (min, max); n=100: x(40)..x(61)
    assert _median_ci_rank(5) == 0 and _median_ci_rank(6) == 1
    assert _median_ci_rank(12) == 3 and _median_ci_rank(100) == 40


@pytest.mark.gpu
def test_cuda_event_timer_agrees_with_a_synchronised_wall_clock() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    a = torch.randn(4096, 4096, device="cuda")

    def step() -> None:
        a @ a

    t = time_steps(step, options=MeasureOptions(max_time_s=1.0), timer=make_timer("cuda"))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 50
    assert abs(t.median_step_time_s / wall - 1) < 0.2


# ------------------------------------------------------------------------------ options
def test_measure_options_unknown_key_names_it_and_the_known_ones() -> None:
    with pytest.raises(MeasurementError, match="max_tme_s") as err:
        MeasureOptions.from_dict({"max_tme_s": 1.0})
    assert "max_time_s" in str(err.value) and "target_rel_ci" in str(err.value)


def test_measure_options_from_dict_round_trip_and_checks() -> None:
    opts = MeasureOptions.from_dict({"max_time_s": 1, "min_steps": 3.0})
    assert opts.max_time_s == 1.0 and isinstance(opts.max_time_s, float)
    assert opts.min_steps == 3 and isinstance(opts.min_steps, int)
    assert MeasureOptions.from_dict(opts.to_dict()) == opts
    assert MeasureOptions.from_dict(None) == MeasureOptions()
    with pytest.raises(MeasurementError, match="warmup_min_steps = 0"):
        MeasureOptions(warmup_min_steps=0)
    with pytest.raises(MeasurementError, match="max_steps = 2 must be >= min_steps"):
        MeasureOptions(min_steps=5, max_steps=2)
    with pytest.raises(MeasurementError, match="max_time_s = 'soon'"):
        MeasureOptions.from_dict({"max_time_s": "soon"})


# ------------------------------------------------------------------- guard and reference
class FakeGuard:
    """Calls the windows whose (0-based) index is in ``bad`` contended."""

    def __init__(self, bad) -> None:
        self.bad, self.n = bad, -1

    def start(self) -> None:
        self.n += 1

    def stop(self):
        contended = self.n in self.bad
        return contended, {"cpu_wait": 0.5 if contended else 0.0, "cpu_util": 1.0}


def test_contended_windows_are_discarded_and_retimed() -> None:
    opts = MeasureOptions(target_rel_ci=1e-9, min_steps=10, max_steps=10, window_min_s=0.0,
                          reference_share=0.0)
    guard = FakeGuard(bad={2, 3, 4})
    t = time_steps(sleeper(0.002), options=opts, guard=guard)
    assert t.windows == 10 and t.steps_timed == 10 and t.contended_windows == 3
    assert not t.contended and len(t.guard_figures) == 13
    assert [f["contended"] for f in t.guard_figures[:6]] == [0, 0, 1, 1, 1, 0]
    m = summarize(t, 100, 1e6, None)
    assert m["contended"] == 0.0 and m["contended_windows"] == 3.0 and m["cpu_wait"] == 0.0


def test_a_trial_without_clean_windows_is_flagged_within_its_budget() -> None:
    opts = MeasureOptions(max_time_s=5.0, window_min_s=0.0, contended_budget=0.04,
                          reference_share=0.0)
    t0 = time.perf_counter()
    t = time_steps(sleeper(0.01), options=opts, guard=FakeGuard(bad=range(10**6)))
    assert time.perf_counter() - t0 < 1.5, "the contention budget did not stop timing"
    assert t.contended and t.stop_reason == "contended" and not t.target_met
    assert t.contended_windows == t.windows >= 10 and 0.2 < t.contended_s < 0.5
    assert abs(t.median_step_time_s / 0.01 - 1) < 0.5  # the figure is kept, flagged
    m = summarize(t, 100, 1e6, None)
    assert m["contended"] == 1.0 and m["throughput_log_var"] >= 1.0 and m["cpu_wait"] == 0.5


def test_contended_reference_samples_never_leave_no_window() -> None:
    opts = MeasureOptions(max_time_s=1.0, window_min_s=0.0, contended_budget=0.01)

    def reference() -> float:
        time.sleep(0.02)
        return 0.02

    t = time_steps(sleeper(0.002), options=opts, guard=FakeGuard(bad=range(10**6)),
                   reference=reference)
    assert t.contended and t.windows >= 1 and t.median_step_time_s > 0


def test_guard_off_keeps_every_window() -> None:
    opts = MeasureOptions(min_steps=8, max_steps=8, window_min_s=0.0, guard=False)
    t = time_steps(sleeper(0.001), options=opts, guard=FakeGuard(bad=range(10**6)))
    assert t.windows == 8 and t.contended_windows == 0 and t.guard_figures == []


def test_reference_is_sampled_between_windows() -> None:
    calls = []

    def reference() -> float:
        calls.append(time.perf_counter())
        time.sleep(0.004)
        return 0.001

    opts = MeasureOptions(target_rel_ci=1e-9, max_time_s=0.5, window_min_s=0.02,
                          reference_share=0.05, drift_per_window=False)
    t = time_steps(sleeper(0.002), options=opts, reference=reference)
    assert len(t.reference_times_s) == len(calls) >= 3
    assert sum(0.004 for _ in calls) <= 0.05 * 0.5 + 0.004 * 3 + 0.01
    m = summarize(t, 100, 1e6, None)
    assert m["reference_speed"] == pytest.approx(1000.0) and m["reference_samples"] >= 3
    assert m["throughput_rel"] == pytest.approx(m["throughput_raw"] / 1000.0)
    assert m["throughput"] == m["throughput_raw"]
    from cubicml_lab.timing import REPEAT_LOG_SD

    assert m["throughput_log_var"] == pytest.approx(
        (m["throughput_rel_ci"] / 1.96) ** 2 + REPEAT_LOG_SD**2)


def test_drift_corrected_throughput_is_on_the_machine_scale(tmp_path, monkeypatch) -> None:
    from cubicml_lab.hardware import reference_nominal

    monkeypatch.setenv("CUBICML_LAB_CACHE_DIR", str(tmp_path))
    assert reference_nominal(250.0, 2) == 250.0 and reference_nominal(300.0, 2) == 250.0
    assert reference_nominal(100.0, 1) == 100.0  # one scale per thread count
    t = Timing(step_times_s=[0.1] * 8, warmup_steps=2, warmup_step_times_s=[0.2, 0.1],
               steps_per_window=1, steps_timed=8, windows=8, median_step_time_s=0.1,
               rel_spread=0.0, rel_ci=0.01, target_met=True, outlier_steps=0,
               stop_reason="target met", elapsed_s=1.0,
               reference_times_s=[0.0049, 0.005, 0.005, 0.005, 0.005, 0.0051])
    m = summarize(t, 100, 1e6, None, units="tokens", reference_nominal=250.0)
    assert m["throughput_raw"] == pytest.approx(1000.0) and m["reference_speed"] == 200.0
    from cubicml_lab.timing import DRIFT_CORRECTED_DEFAULT, DRIFT_EXPONENT

    # both figures are stored; DRIFT_CORRECTED_DEFAULT picks the default one
    assert m["throughput_corrected"] == pytest.approx(1000.0 * 1.25**DRIFT_EXPONENT)
    assert m["throughput_corrected"] * m["step_time_corrected_s"] == pytest.approx(100)
    assert m["step_time_raw_s"] == 0.1 and m["throughput_raw"] * 0.1 == pytest.approx(100)
    assert m["throughput_rel"] == pytest.approx(5.0)
    assert m["drift_corrected"] == (1.0 if DRIFT_CORRECTED_DEFAULT else 0.0)
    c = summarize(t, 100, 1e6, None, units="tokens", reference_nominal=250.0,
                  drift_corrected=True)
    r = summarize(t, 100, 1e6, None, units="tokens", reference_nominal=250.0,
                  drift_corrected=False)
    assert c["drift_corrected"] == 1.0 and c["throughput"] == m["throughput_corrected"]
    assert r["drift_corrected"] == 0.0 and r["throughput"] == m["throughput_raw"]
    for x in (c, r):
        assert x["throughput"] * x["step_time_s"] == pytest.approx(100)
        assert x["tokens_per_s"] == x["throughput"]
    assert c["throughput_rel_ci"] > r["throughput_rel_ci"]  # the reference's noise joins it
    raw = summarize(t, 100, 1e6, None, drift_corrected=True)  # no nominal: nothing to correct
    assert raw["drift_corrected"] == 0.0 and raw["throughput"] == raw["throughput_raw"]
    assert math.isnan(raw["throughput_corrected"])


class SpeedStates:
    """A machine that runs slow (``factor`` x) while ``slow(reference samples so far)``: the
    step and the reference both slow down, unequally, as configurations do on a shared VM."""

    def __init__(self, slow, factor: float = 1.5) -> None:
        self.slow, self.factor, self.samples, self.slow_steps = slow, factor, 0, 0

    def step(self) -> None:
        slow = self.slow(self.samples)
        self.slow_steps += slow
        time.sleep(0.002 * (self.factor if slow else 1.0))

    def reference(self) -> float:
        self.samples += 1
        return 0.001 * (1.25 if self.slow(self.samples) else 1.0)


def test_windows_off_the_usual_speed_are_set_aside_and_retimed() -> None:
    opts = MeasureOptions(target_rel_ci=1e-9, min_steps=12, max_steps=12, window_min_s=0.0,
                          max_time_s=5.0, drift_tol=0.08, drift_budget=0.4)
    # the 2nd to 7th windows run slow: 6 ms sleeps against 2 ms, so that a usual window
    # overslept by the scheduler (2.87 ms seen once on a busy 2-core VM) is not taken for one
    machine = SpeedStates(lambda i: 3 <= i <= 8, factor=3.0)
    t = time_steps(machine.step, options=opts, reference=machine.reference,
                   reference_usual=0.001)
    assert t.drift_gated and t.steps_per_window == 1 and t.windows == 12
    # every step the machine ran slow fell in a set-aside window (a slow step's window has a
    # slow reference before it), and the kept windows are the usual 2 ms ones: a gate that
    # kept the slow windows would keep all six 6-ms ones. A few usual windows may still read
    # over 5 ms where the host oversleeps (8.5 and 16 ms seen on a CI runner)
    assert machine.slow_steps >= 5 and t.offstate_windows >= machine.slow_steps
    assert sum(x > 0.005 for x in t.step_times_s) <= 3, t.step_times_s
    assert t.reference_times_s and max(t.reference_times_s) == 0.001
    m = summarize(t, 100, 1e6, None)
    assert m["drift_gated"] == 1.0 and m["offstate_windows"] == t.offstate_windows
    assert m["reference_usual"] == pytest.approx(1000.0) and m["offstate_s"] > 0
    # without the usual speed every window counts: the slow ones are in the figure
    machine = SpeedStates(lambda i: 3 <= i <= 8)
    t = time_steps(machine.step, options=opts, reference=machine.reference)
    assert not t.drift_gated and t.offstate_windows == 0 and max(t.step_times_s) > 0.0027
    assert summarize(t, 100, 1e6, None)["drift_gated"] == 0.0


def test_the_gate_waits_within_one_budget_for_the_whole_timed_phase() -> None:
    # usual for the first ~12 windows of 50 ms (0.6 s), then slow for good: the kept windows
    # count against the wait, so the timed phase ends near drift_budget * max_time_s (1.0 s),
    # not 0.6 s of kept windows plus 1.0 s of set-aside ones
    opts = MeasureOptions(target_rel_ci=1e-9, max_steps=10_000, window_min_s=0.05,
                          max_time_s=1.0, drift_tol=0.08, drift_budget=1.0)
    machine = SpeedStates(lambda i: i > 13)
    t = time_steps(machine.step, options=opts, reference=machine.reference,
                   reference_usual=0.001)
    assert t.offstate_windows >= 3 and not t.drift_gated
    # the windows' own measured seconds (the set-aside ones joined the figure when the wait
    # ended): the clock between windows (a full gc in a large test process) is not the budget's
    windows_s = sum(t.step_times_s) * t.steps_per_window
    assert 0.9 < windows_s < 1.3, windows_s  # before: 1.6-1.65 s


def test_timing_stops_waiting_for_the_usual_speed_after_its_budget() -> None:
    opts = MeasureOptions(target_rel_ci=1e-9, min_steps=10, max_steps=10, window_min_s=0.0,
                          max_time_s=5.0, drift_tol=0.08, drift_budget=0.02)
    machine = SpeedStates(lambda i: True)  # slow for good: the usual speed never returns
    t0 = time.perf_counter()
    t = time_steps(machine.step, options=opts, reference=machine.reference,
                   reference_usual=0.001)
    assert time.perf_counter() - t0 < 2.0
    # it waited about its budget (0.1 s of the timed phase, which the reference samples before
    # the first window open: the set-aside seconds alone may fall a few ms short of it)
    assert not t.drift_gated and t.offstate_s > 0.09 and t.offstate_windows >= 1
    assert t.steps_timed == 10 and min(t.step_times_s) > 0.0027  # kept, as measured
    assert t.reference_times_s and min(t.reference_times_s) == 0.00125
    # a tolerance of 0 turns the gate off
    machine = SpeedStates(lambda i: True)
    t = time_steps(machine.step, options=MeasureOptions(
        min_steps=10, max_steps=10, window_min_s=0.0, drift_tol=0.0),
        reference=machine.reference, reference_usual=0.001)
    assert t.offstate_windows == 0 and t.offstate_s == 0.0 and not t.drift_gated


class Ramp:
    """A machine slowing steadily, the step and the reference alike: the i-th window or
    reference sample runs ``1 + rate * i`` times slower than the first (a virtual clock)."""

    def __init__(self, rate: float = 0.02) -> None:
        self.rate, self.i, self.steps = rate, 0, 0

    def _factor(self) -> float:
        self.i += 1
        return 1.0 + self.rate * (self.i - 1)

    def step(self) -> None:
        self.steps += 1

    def reference(self) -> float:
        return 0.001 * self._factor()

    def start(self) -> None:  # the timer
        self.steps = 0

    def stop(self) -> float:
        return 0.01 * self.steps * self._factor()


def test_each_window_corrected_by_its_neighbours_follows_drift_within_the_trial() -> None:
    opts = MeasureOptions(target_rel_ci=0.01, min_steps=8, max_steps=60, window_min_s=0.0,
                          max_time_s=100.0, drift_tol=0.0, drift_per_window=True)
    ramp = Ramp()
    t = time_steps(ramp.step, options=opts, timer=ramp, reference=ramp.reference)
    assert t.stop_reason == "target met" and t.target_met and t.windows < 20
    assert len(t.window_reference_s) == t.windows == len(t.reference_times_s) - 1
    # each window sits between two samples: corrected, every window reads the first speed
    m = summarize(t, 100, 1e6, None, reference_nominal=1000.0, drift_corrected=True)
    assert m["step_time_corrected_s"] == pytest.approx(0.01, rel=1e-3)
    assert m["throughput"] == pytest.approx(10_000, rel=1e-3) and m["throughput_rel_ci"] < 1e-3
    assert m["step_time_raw_s"] > 0.0105  # the raw median ran on a slowed machine
    # one median of the samples for the windows' median: the ramp is the windows' noise, and
    # the 1% target is never met
    ramp = Ramp()
    t = time_steps(ramp.step, options=MeasureOptions(**{**opts.to_dict(),
                                                        "drift_per_window": False}),
                   timer=ramp, reference=ramp.reference)
    assert t.stop_reason == "max_steps" and not t.target_met and t.window_reference_s == []
    m = summarize(t, 100, 1e6, None, reference_nominal=1000.0, drift_corrected=True)
    assert m["throughput_rel_ci"] > 0.05


def test_the_usual_speed_is_the_most_common_state_not_the_median(tmp_path, monkeypatch) -> None:
    from cubicml_lab.hardware import reference_nominal, reference_usual, usual_speed
    from cubicml_lab.hardware.contention import USUAL_HISTORY, USUAL_MIN, USUAL_MOVED

    states = [200, 201, 202, 240, 241, 279, 280, 281, 282]  # median 241, most often ~280
    assert usual_speed(states, 0.08) == pytest.approx(281)
    assert usual_speed(states[:USUAL_MIN - 1], 0.08) is None
    monkeypatch.setenv("CUBICML_LAB_CACHE_DIR", str(tmp_path))
    for speed in states[:USUAL_MIN - 1]:
        reference_nominal(speed, 2, record=True)
    assert reference_usual(2, 0.08) is None and reference_usual(1, 0.08) is None
    reference_nominal(float("nan"), 2, record=True)  # ignored
    assert reference_usual(2, 0.08) is None
    for speed in states[USUAL_MIN - 1:]:
        reference_nominal(speed, 2, record=True)
    assert reference_usual(2, 0.08) == pytest.approx(281)
    for _ in range(USUAL_MOVED - 1):  # a few trials elsewhere: a passing state
        reference_nominal(150.0, 2, record=True)
    assert reference_usual(2, 0.08) == pytest.approx(281)
    reference_nominal(150.0, 2, record=True)  # as many as USUAL_MOVED in a row: the machine moved
    assert reference_usual(2, 0.08) == pytest.approx(150.0)
    for _ in range(USUAL_HISTORY):
        reference_nominal(150.0, 2, record=True)
    cache = json.loads((tmp_path / "reference.json").read_text())
    assert [len(v["recent"]) for v in cache.values()] == [USUAL_HISTORY]


def test_guard_options_are_checked() -> None:
    with pytest.raises(MeasurementError, match="guard = 1 must be a bool"):
        MeasureOptions(guard=1)
    with pytest.raises(MeasurementError, match="reference_share = 1.0 must be in"):
        MeasureOptions(reference_share=1.0)
    with pytest.raises(MeasurementError, match="drift_tol = -0.1 must be >= 0"):
        MeasureOptions(drift_tol=-0.1)
    assert MeasureOptions.from_dict({"guard": False}).guard is False


# ------------------------------------------------------------------------------ the record




# ------------------------------------------------------------------------------ summarize
def test_summarize_arithmetic() -> None:
    times = [0.10, 0.11, 0.09, 0.10, 0.12, 0.10]
    t = Timing(step_times_s=times, warmup_steps=3, warmup_step_times_s=[0.5, 0.1, 0.1],
               steps_per_window=2, steps_timed=12, windows=6, median_step_time_s=0.1,
               rel_spread=0.05, rel_ci=0.2, target_met=False, outlier_steps=1,
               stop_reason="max_steps", elapsed_s=2.0)
    units, flops, peak, n_dev = 4096, 3.0e11, 2.0e12, 2
    m = summarize(t, units, flops, peak, n_dev, units="tokens")
    assert m["step_time_s"] == 0.1 and m["steps_timed"] == 12 and m["warmup_steps"] == 3
    assert m["throughput"] == pytest.approx(units / 0.1) == m["tokens_per_s"]
    assert m["throughput_per_device"] == pytest.approx(units / 0.1 / n_dev)
    assert m["achieved_tflops"] == pytest.approx(flops / 0.1 / 1e12)
    assert m["mfu"] == pytest.approx(flops / 0.1 / (peak * n_dev))
    assert m["peak_tflops"] == pytest.approx(peak / 1e12)
    assert m["target_met"] == 0.0 and m["outlier_steps"] == 1.0 and m["n_devices"] == 2.0
    assert m["step_time_rel_ci"] == 0.2 and m["step_time_rel_spread"] == 0.05
    assert m["units_per_step"] == units and m["flops_per_step"] == flops
    no_peak = summarize(t, units, flops, None)
    assert math.isnan(no_peak["mfu"]) and "tokens_per_s" not in no_peak
    assert all(isinstance(v, float) for v in m.values())


@pytest.mark.parametrize("corrected", [False, True])
def test_a_figure_from_one_window_has_an_unknown_ci_not_zero(corrected) -> None:
    """One window (a long step, or a trial whose budget ran out) or one reference sample
    carries no spread: the figure's CI is NaN (the search then treats it as the noisiest of its
    campaign), not the 0 an interquartile range of one value gives; two windows give one."""
    def timing(times: list[float], refs: list[float]) -> Timing:
        return Timing(step_times_s=times, warmup_steps=1, warmup_step_times_s=[0.2],
                      steps_per_window=1, steps_timed=len(times), windows=len(times),
                      median_step_time_s=sorted(times)[len(times) // 2], rel_spread=0.0,
                      rel_ci=math.inf, target_met=False, outlier_steps=0,
                      stop_reason="max_time", elapsed_s=1.0, reference_times_s=refs)

    nominal = 100.0 if corrected else None
    one = summarize(timing([0.2], [0.01, 0.011]), 1.0, 1.0, None, reference_nominal=nominal)
    assert math.isnan(one["throughput_rel_ci"]) and one["throughput_log_var"] > 0.05
    assert one["drift_corrected"] == float(corrected)
    two = summarize(timing([0.2, 0.22], [0.01, 0.011]), 1.0, 1.0, None,
                    reference_nominal=nominal)
    assert 0 < two["throughput_rel_ci"] < 0.2
    one_ref = summarize(timing([0.2, 0.22], [0.01]), 1.0, 1.0, None, reference_nominal=nominal)
    assert math.isnan(one_ref["throughput_rel_ci"]) == corrected


# ------------------------------------------------------------------------------ hardware
def test_hardware_info_on_cpu() -> None:
    import torch

    hw = hardware_info("cpu")
    for key in ("cpu_model", "cpu_count", "torch_threads", "torch_version", "python_version",
                "hostname", "platform"):
        assert key in hw, key
    assert hw["hostname"] == socket.gethostname() and hw["cpu_count"] == os.cpu_count()
    assert hw["torch_threads"] == torch.get_num_threads()
    assert hw["torch_version"] == torch.__version__
    assert "gpu_name" not in hw
    json.dumps(hw)


def test_peak_memory_on_cpu_rises_and_resets() -> None:
    """With malloc keeping freed blocks, as in every trial (tune_cpu_allocator), a reset still
    starts from what the process holds in use: a freed 300 MiB tensor does not count."""
    import torch

    from cubicml_lab.hardware import tune_cpu_allocator

    tune_cpu_allocator()
    reset_peak_memory("cpu")
    before = peak_memory_gib("cpu")
    x = torch.ones(300 * 2**20 // 4)  # 300 MiB, touched
    assert peak_memory_gib("cpu") - before > 0.25
    del x
    if not reset_peak_memory("cpu"):
        pytest.skip("this platform cannot reset the peak RSS")
    assert peak_memory_gib("cpu") - before < 0.15


def test_gpu_table_lookup_by_device_name() -> None:
    from cubicml_lab.hardware.machine import _GPU_PEAK_TFLOPS, _gpu_family

    assert _gpu_family("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert _gpu_family("NVIDIA H100 PCIe") == "H100 PCIe"
    assert _gpu_family("NVIDIA H100 NVL") == "H100 NVL"
    assert _gpu_family("NVIDIA H200") == "H200 SXM"
    assert _gpu_family("NVIDIA A100-SXM4-80GB") == _gpu_family("NVIDIA A100 80GB PCIe") == "A100"
    assert _gpu_family("Tesla V100-SXM2-16GB") is None
    for row in _GPU_PEAK_TFLOPS.values():
        assert row["bf16"] == row["fp16"] > row["tf32"] > row["fp32"]
    with pytest.raises(MeasurementError, match="'int8'"):
        device_peak_flops("cpu", "int8")


def measured_or_skip(measure, path: Path, why_none: str) -> float:
    """A once-measured CPU figure, tried up to 3 times: a None (documented, where ``why_none``)
    must leave nothing cached; 3 Nones skip the test with a notice that says why."""
    for _ in range(3):
        value = measure()
        if value is not None:
            return value
        assert not path.exists() or json.loads(path.read_text()) == {}
    pytest.skip(f"every try gave None, as documented where {why_none}: run the test on an "
                "idle machine")


def test_cpu_peak_flops_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch) -> None:
    import torch

    monkeypatch.setenv("CUBICML_LAB_CACHE_DIR", str(tmp_path))
    path = tmp_path / "cpu_peak.json"

    def timed() -> float | None:
        t0 = time.perf_counter()
        flops = device_peak_flops("cpu", "fp32")
        assert time.perf_counter() - t0 >= 0.4, "the micro-benchmark runs about 0.5 s"
        return flops

    first = measured_or_skip(timed, path, "the measurement shared the cores with other work")
    assert 1e8 < first < 1e14  # 0.1 GFLOP/s .. 100 TFLOP/s
    cache = json.loads(path.read_text())
    (key,) = cache
    assert f"threads={torch.get_num_threads()}" in key and key.endswith("|fp32")
    t0 = time.perf_counter()
    assert device_peak_flops("cpu", "tf32") == first  # tf32 means fp32 on a CPU
    assert time.perf_counter() - t0 < 0.1
    cache[key]["flops"] = 1234.5
    path.write_text(json.dumps(cache))
    assert device_peak_flops("cpu", "fp32") == 1234.5, "the second call must read the file"


def test_an_attention_scores_cost_is_measured_once_per_shape_then_read_from_the_cache(
        tmp_path, monkeypatch) -> None:
    """The probe times the same attention over 8 heads against 2: more score elements, the same
    FLOPs, so 8 heads must come out slower and the score's cost positive."""
    import torch

    from cubicml_lab.hardware import attention_score_seconds

    monkeypatch.setenv("CUBICML_LAB_CACHE_DIR", str(tmp_path))
    path = tmp_path / "cpu_peak.json"
    first = measured_or_skip(lambda: attention_score_seconds("fp32", seq_len=64, d_model=64),
                             path, "other work shared the cores, or 8 heads did not time slower "
                             "than 2")
    assert 1e-13 < first < 1e-5, first
    cache = json.loads(path.read_text())
    (key,) = cache
    assert f"threads={torch.get_num_threads()}" in key and "seq=64 d=64" in key
    assert key.endswith("|fp32")
    cache[key]["seconds"] = 2.5e-9
    path.write_text(json.dumps(cache))
    assert attention_score_seconds("fp32", 64, 64) == 2.5e-9, "the second call reads the file"
    assert attention_score_seconds("fp32", 64, 36) is None  # 8 heads do not divide the width
    with pytest.raises(MeasurementError, match="'int8'"):
        attention_score_seconds("int8")


def test_the_peak_benchmark_shrinks_its_matmuls_where_a_dtype_is_slow() -> None:
    """bf16 on a CPU without bf16 kernels ran at 0.74 GFLOP/s (2.9 s per 1024-square matmul,
    about 20 s of benchmark): the matmul shrinks to about a tenth of the 0.5 s; a fast dtype
    keeps 1024."""
    from cubicml_lab.hardware.machine import _bench_size

    assert _bench_size(1 / 68e9, 1024, 0.5) == 1024  # fp32 on that CPU: 32 ms per matmul
    slow = _bench_size(1 / 0.74e9, 1024, 0.5)
    assert slow % 64 == 0 and 128 <= slow < 1024
    assert 0.02 < 2.0 * slow**3 / 0.74e9 <= 0.05  # about a tenth of the 0.5 s, not 2.9 s
    assert _bench_size(1e-3, 1024, 0.5) == 128  # never below 128


def test_importing_timing_loads_no_torch() -> None:
    code = "import sys, cubicml_lab.timing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# -------------------------------------------------------------------------- GPU telemetry
def test_parse_smi_sample_reads_numbers_hex_masks_and_not_available() -> None:
    from cubicml_lab.hardware import parse_smi_sample

    assert parse_smi_sample("1980, 512.31, 0x0000000000000004, 41") == {
        "sm_clock_mhz": 1980.0, "power_w": 512.31, "throttle_mask": 4, "temperature_c": 41.0}
    got = parse_smi_sample("1755, [N/A], 0x0000000000000000, 38")
    assert got["power_w"] is None and got["throttle_mask"] == 0
    for junk in ("", "No devices were found", "1, 2, 3", "[N/A], [N/A], [N/A], [N/A]"):
        assert parse_smi_sample(junk) is None, junk


def test_summarize_telemetry_reports_the_range_and_every_throttle_reason() -> None:
    from cubicml_lab.hardware import summarize_telemetry

    samples = [{"sm_clock_mhz": c, "power_w": p, "throttle_mask": m, "temperature_c": t}
               for c, p, m, t in [(1980, 300, 0x0, 40), (1755, 690, 0x4, 52),
                                  (1900, 650, 0x20, 55), (1980, None, None, None)]]
    s = summarize_telemetry(samples)
    assert s["gpu_samples"] == 4
    assert (s["gpu_sm_clock_mhz_min"], s["gpu_sm_clock_mhz_median"],
            s["gpu_sm_clock_mhz_max"]) == (1755, 1980, 1980)
    assert (s["gpu_power_w_median"], s["gpu_power_w_max"]) == (650, 690)
    assert s["gpu_temperature_c_max"] == 55
    assert s["gpu_throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert summarize_telemetry([]) == {"gpu_samples": 0, "gpu_throttle_reasons": []}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux's")
@pytest.mark.parametrize("mode", ["tuned", "default"])
def test_tuned_allocator_stops_page_faulting_freed_step_buffers(mode) -> None:
    """Eight 8 MiB buffers and one of 40 MiB (a step's activations and a large micro-batch's
    logits, above the 32 MiB that glibc's mmap threshold can be raised to) allocated, filled
    and freed 20 times: glibc's default gives the freed memory back to the kernel and faults
    its pages in again next time; after tune_cpu_allocator the same memory is reused."""
    code = ("import resource, numpy as np\n"
            "from cubicml_lab.hardware import tune_cpu_allocator\n"
            "print(tune_cpu_allocator())\n"
            "step = lambda: [np.ones(n, np.float32) for n in [2**21] * 8 + [10 * 2**20]]\n"
            "step()\n"
            "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(20):\n"
            "    step()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)\n")
    env = {**os.environ, "CUBICML_LAB_MALLOC": "default" if mode == "default" else ""}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    what, faults = out.stdout.split("\n")[:2]
    if mode == "tuned":
        assert what == "glibc mmap=off trim_threshold=2GiB" and int(faults) < 200, faults
    else:
        assert what == "default" and int(faults) > 20 * 2000  # thousands a step

