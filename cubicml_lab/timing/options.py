"""What :func:`~cubicml_lab.timing.time_steps` is told: :class:`MeasureOptions` (how long and
how precisely a step is timed: step counts, budgets in seconds, targets as fractions) and the
bounds a trial may ask for (:data:`MAX_IDLE_WAIT_S`, :data:`MAX_STEPS`, :data:`MAX_PHASE_S`).
Importing this module imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import MeasurementError
from ..hardware import MAX_CPU_WAIT

__all__ = ["MAX_IDLE_WAIT_S", "MAX_PHASE_S", "MAX_STEPS", "MeasureOptions"]

#: Longest wait for idle cores a trial may ask for (``MeasureOptions.wait_for_idle_s``): an hour.
MAX_IDLE_WAIT_S = 3600.0
#: Most steps a trial may ask for (``min_steps``, ``max_steps``, warm-up steps).
MAX_STEPS = 10_000_000
#: Longest phase a trial may ask for, in seconds (``max_time_s``, ``warmup_max_s``, windows): a week.
MAX_PHASE_S = 7 * 24 * 3600.0


@dataclass(frozen=True, kw_only=True)
class MeasureOptions:
    """How long and how precisely :func:`time_steps` measures.

    Attributes:
        target_rel_ci: Stop once the 95% CI half-width of the median step time, divided by the
            median, is at most this (a fraction; 0.015 = 1.5%); with ``drift_per_window``, of
            the median of the drift-corrected windows.
        min_steps: Timed steps at least (steps, not windows), even past ``max_time_s``.
        max_steps: Timed steps at most (steps, not windows).
        max_time_s: Budget of the timed phase in seconds (a window that would overrun it is not
            started once ``min_steps`` are timed).
        warmup_min_steps: Untimed warm-up steps at least (>= 1: the first step is never timed).
        warmup_max_steps: Warm-up steps at most.
        warmup_max_s: Warm-up budget in seconds (ends it once ``warmup_min_steps`` ran);
            ``None`` (the default): half of ``max_time_s``, at most 20 s, so that a long
            step's warm-up does not cost more than its timing (a step of seconds runs steady from
            the first, but 3 of them must agree before the warm-up ends).
        settle_rel: Warm-up ends when the last 3 step times (not counting the first step) are
            within this fraction of their median.
        window_min_s: Seconds a timed window lasts at least; steps are grouped so, and the
            device is synchronised only at window edges. Windows are shorter where
            ``max_steps`` would otherwise leave fewer than 8 of them (a 95% CI needs 6).
        guard: Discard and re-time windows that shared the machine (on CPU: the trial's
            threads waited for a core more than ``max_cpu_wait`` of the window; on CUDA: the
            device throttled); see :class:`~cubicml_lab.hardware.CpuContention`.
        max_cpu_wait: Largest fraction of a window the trial's threads may have waited,
            runnable, for a CPU before the window counts as contended (see
            :data:`~cubicml_lab.hardware.MAX_CPU_WAIT` for what a wait costs).
        contended_budget: Seconds of discarded windows after which timing stops, as a
            multiple of ``max_time_s``; the trial is then flagged ``contended`` unless it
            already has 6 clean windows.
        reference_share: Fraction of the timed seconds spent on the drift reference
            (:class:`~cubicml_lab.hardware.ReferenceWork`, at least 5 samples of ~20 ms,
            between windows); 0 for none.
        drift_tol: Given the machine's usual reference speed (``time_steps(reference_usual=)``),
            a window next to a reference sample that puts the machine further than this
            from it (``|log(speed / usual)|``) ran while the machine was in another speed
            state; it is set aside and re-timed, and the reference is then sampled after every
            window (the speed-state gate). 0, the default: keep every window.
        drift_budget: Seconds the timed phase may last while the gate waits, as a multiple of
            ``max_time_s``: once its windows (kept, set aside or contended) and reference
            samples add up to more, timing stops waiting for the usual speed and keeps every
            window, so that a measurement on a machine that does not come back stays bounded.
        drift_per_window: Correct each window by the reference samples on either side of it
            (the reference is then sampled after every window), and take the median of the
            corrected windows, instead of correcting the windows' median by the median of all
            samples; the CI the timing stops on is then the corrected windows'. It follows
            drift that moves within a trial, which one median of the samples averages over.
            Without a reference (``reference_share`` 0, or none given) it does nothing.
        wait_for_idle_s: Before the warm-up, wait up to this many seconds for other work to
            leave the trial's cores idle (:func:`~cubicml_lab.hardware.wait_for_idle`; a
            progress bar shows the wait), then run whatever it found; 0, the default: no wait.
            The trial records ``idle_wait_s``, ``idle_others_cpu`` and ``idle_timed_out``.
            A busy machine otherwise gets ``contended`` (flagged) figures; the subprocess
            launchers add this wait to their ``timeout_s``.
        losing_step_s: Stop timing once at least 6 windows are timed and the lower end of
            the median step time's 95% CI is above this many seconds: the trial cannot beat
            the best so far (``Timing.stop_reason == "losing"``; the trial is stored with the
            figures it has and ``stopped_early = 1``). None, the default: never. A campaign
            run with ``early_stop=True`` sets it per trial from its best so far.
    """

    target_rel_ci: float = 0.015
    min_steps: int = 5
    max_steps: int = 200
    max_time_s: float = 20.0
    warmup_min_steps: int = 2
    warmup_max_steps: int = 20
    warmup_max_s: float | None = None
    settle_rel: float = 0.10
    window_min_s: float = 0.05
    guard: bool = True
    max_cpu_wait: float = MAX_CPU_WAIT
    contended_budget: float = 0.5
    reference_share: float = 0.10
    # Timing stops on the windows' CI alone, not the stored figure's (the windows' combined
    # with the reference median's): what moves a figure between processes is not the reference
    # median's sampling noise. The gate never ends its wait early (docs/results.md).
    # The speed-state gate is off (drift_tol 0): each window corrected by its own neighbouring
    # reference samples (drift_per_window) spreads as little across repeats in less time.
    drift_tol: float = 0.0
    # drift_budget bounds the whole timed phase, kept and set-aside windows together.
    drift_budget: float = 2.0
    # drift_per_window: each window corrected by the reference samples next to it, no gate, a
    # 1.5% CI target; drift the reference does not see is left, which no rule inside one trial
    # takes out.
    drift_per_window: bool = True
    wait_for_idle_s: float = 0.0
    losing_step_s: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and "None" in str(f.type):
                continue
            ok_type = (isinstance(value, int) if f.type == "int"
                       else isinstance(value, (int, float)) and math.isfinite(value))
            if (f.type == "bool") != isinstance(value, bool) or not ok_type:
                raise MeasurementError(f"MeasureOptions.{f.name} = {value!r} must be a "
                                       f"{'' if f.type == 'bool' else 'finite '}{f.type}",
                                       hint=f"default: {f.default!r}")
        checks = [("target_rel_ci", self.target_rel_ci > 0, "> 0"),
                  ("min_steps", self.min_steps >= 1, ">= 1"),
                  ("max_steps", self.max_steps >= self.min_steps, ">= min_steps"),
                  ("max_time_s", self.max_time_s > 0, "> 0"),
                  ("warmup_min_steps", self.warmup_min_steps >= 1, ">= 1 (never time step 1)"),
                  ("warmup_max_steps", self.warmup_max_steps >= self.warmup_min_steps,
                   ">= warmup_min_steps"),
                  ("warmup_max_s", self.warmup_max_s is None or self.warmup_max_s >= 0,
                   ">= 0, or None for half of max_time_s"),
                  ("settle_rel", self.settle_rel > 0, "> 0"),
                  ("window_min_s", self.window_min_s >= 0, ">= 0"),
                  ("max_cpu_wait", self.max_cpu_wait > 0, "> 0"),
                  ("contended_budget", self.contended_budget >= 0, ">= 0"),
                  ("reference_share", 0 <= self.reference_share < 1, "in [0, 1)"),
                  ("drift_tol", self.drift_tol >= 0, ">= 0 (0: off)"),
                  ("drift_budget", self.drift_budget >= 0, ">= 0"),
                  ("wait_for_idle_s", 0 <= self.wait_for_idle_s <= MAX_IDLE_WAIT_S,
                   f"in [0, {MAX_IDLE_WAIT_S:g}] seconds (0: no wait)"),
                  ("losing_step_s", self.losing_step_s is None or self.losing_step_s > 0,
                   "> 0 seconds, or None (never stop early)")]
        checks += [(name, getattr(self, name) <= MAX_STEPS, f"at most {MAX_STEPS:,} steps")
                   for name in ("min_steps", "max_steps", "warmup_min_steps", "warmup_max_steps")]
        checks += [(name, (getattr(self, name) or 0) <= MAX_PHASE_S,
                    f"at most {MAX_PHASE_S:g} seconds (a week)")
                   for name in ("max_time_s", "warmup_max_s", "window_min_s")]
        for name, ok, rule in checks:
            if not ok:
                raise MeasurementError(
                    f"MeasureOptions.{name} = {getattr(self, name)!r} must be {rule}",
                    hint=f"default: {getattr(MeasureOptions, name)!r}")

    @property
    def warmup_budget_s(self) -> float:
        """Seconds the warm-up may last once ``warmup_min_steps`` ran: ``warmup_max_s``, or
        where that is ``None`` half of ``max_time_s``, at most 20 s.

        Example:
            >>> [MeasureOptions(max_time_s=t).warmup_budget_s for t in (5.0, 100.0)]
            [2.5, 20.0]
            >>> MeasureOptions(max_time_s=5.0, warmup_max_s=8.0).warmup_budget_s
            8.0
        """
        if self.warmup_max_s is not None:
            return self.warmup_max_s
        return min(20.0, self.max_time_s / 2)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> MeasureOptions:
        """Options from a dict of field values; an unknown key raises naming the known ones."""
        d = dict(d or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise MeasurementError(f"unknown measure option(s) {unknown}",
                                   hint=f"known options: {', '.join(known)}")
        for f in fields(cls):  # JSON may carry 1.0 for an int or 1 for a float
            v = d.get(f.name)
            if f.type == "float" and isinstance(v, int) and not isinstance(v, bool):
                d[f.name] = float(v)
            elif f.type == "int" and isinstance(v, float) and v.is_integer():
                d[f.name] = int(v)
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Every field with its value."""
        return asdict(self)
