"""What a timing's figures are: the :class:`Timing` record, its statistics, and the metrics
:func:`summarize` derives from it (throughput raw and drift-corrected, noise for a GP, MFU, what
the contention guard and the drift reference saw). Importing this module imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

# Drift arithmetic has one home, cubicml_lab.hardware.drift; these names are re-exported for
# callers that import them from here.
from ..hardware.drift import (
    DRIFT_BOUNDS,
    DRIFT_EXPONENT,
    DRIFT_PRIOR_SD,
    REPEAT_LOG_SD,
    DriftSlopePool,
    corrected_step_time,
    drift_shifts,
    drift_slope_sums,
    own_drift_fit,
    own_drift_slope,
    posterior_slope,
)

__all__ = ["CONTENDED_LOG_VAR", "DRIFT_BOUNDS", "DRIFT_CORRECTED_DEFAULT", "DRIFT_EXPONENT",
           "DRIFT_PRIOR_SD", "REPEAT_LOG_SD", "DriftSlopePool", "Timing", "UNTRUSTED_LOG_VAR",
           "drift_shifts",
           "drift_slope_sums", "guard_metrics", "median_rel_ci", "own_drift_fit",
           "own_drift_slope", "posterior_slope", "quantile", "reference_metrics",
           "spread_rel_ci", "summarize"]


# ------------------------------------------------------------------------------ statistics
def quantile(sorted_x: list[float], q: float) -> float:
    """Linear-interpolation quantile of an ascending list (numpy's default method)."""
    pos = q * (len(sorted_x) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_x) - 1)
    return sorted_x[lo] + (sorted_x[hi] - sorted_x[lo]) * (pos - lo)


@lru_cache(maxsize=4096)
def _median_ci_rank(n: int) -> int:
    """Largest 1-based rank ``l`` with P(Binomial(n, 1/2) <= l - 1) <= 2.5%; 0 if none.

    ``[x_(l), x_(n+1-l)]`` is then a distribution-free >= 95% CI of the median.
    """
    total, cdf, rank = 2**n, 0, 0
    for j in range(n):  # exact integer arithmetic: no float underflow
        cdf += math.comb(n, j)
        if cdf * 40 > total:  # P(B <= j) > 0.025
            break
        rank = j + 1
    return rank


def spread_rel_ci(x: list[float]) -> float:
    """A figure's relative 95% CI over its windows ``x``: :func:`median_rel_ci` with 6 or more;
    with 2-5, their interquartile range over their median (a rough stand-in: too few for a
    CI); with fewer, NaN: unknown. One window's spread is not zero, it is not measured; a zero
    here would tell the search that the figure is exact."""
    if len(x) < 2:
        return math.nan
    ci = median_rel_ci(x)
    if math.isfinite(ci):
        return ci
    s = sorted(x)
    med = quantile(s, 0.5)
    return (quantile(s, 0.75) - quantile(s, 0.25)) / med if med > 0 else math.nan


def median_rel_ci(x: list[float]) -> float:
    """95% CI half-width of the median over the median (order-statistic CI; inf if n < 6)."""
    s = sorted(x)
    rank = _median_ci_rank(len(s))
    med = quantile(s, 0.5)
    if rank == 0 or med <= 0:
        return math.inf
    return max(med - s[rank - 1], s[len(s) - rank] - med) / med


@dataclass(frozen=True, kw_only=True)
class Timing:
    """What :func:`time_steps` measured (times in seconds).

    Attributes:
        step_times_s: Time per step of each timed window (window time / steps in it).
        warmup_steps: Untimed steps run before timing.
        warmup_step_times_s: Time of each warm-up step (individually synchronised).
        steps_per_window: Steps in each timed window.
        steps_timed: Timed steps in all (windows x steps_per_window).
        windows: Timed windows.
        median_step_time_s: Median of ``step_times_s``.
        rel_spread: Interquartile range of ``step_times_s`` over its median.
        rel_ci: 95% CI half-width of the median over the median: the larger side of the
            distribution-free order-statistic (binomial) interval; ``inf`` with < 6 windows.
        target_met: ``rel_ci <= options.target_rel_ci``.
        outlier_steps: Windows slower than median + 3 * 1.4826 * MAD (reported, still counted).
        stop_reason: Why timing stopped: ``"target met"``, ``"max_steps"``, ``"max_time_s"``,
            ``"contended"`` (the ``contended_budget`` of discarded windows) or ``"losing"``
            (``MeasureOptions.losing_step_s``: it cannot beat the best so far); a job's own
            reports, summarised by :func:`~cubicml_lab.timing.reported.reported_timing`:
            ``"reported"``.
        elapsed_s: Seconds spent in :func:`time_steps` (warm-up + timing + collection).
        contended: Fewer than 6 clean windows when ``contended_budget`` ran out: the figures
            are not to be trusted (they come from the clean windows if any, else from all).
        contended_windows: Windows the guard discarded (and re-timed).
        contended_s: Seconds of discarded windows and reference samples.
        guard_figures: Per window, clean or discarded, in order: the guard's figures (e.g.
            ``cpu_wait``, ``cpu_util``, ``others_cpu``, ``cpu_steal``) and ``contended``
            (1.0 / 0.0).
        reference_times_s: Seconds per reference step of each clean reference sample behind
            the figure (with ``drift_gated``, those taken at the machine's usual speed).
        offstate_windows: Windows set aside because the machine was off its usual speed (see
            ``MeasureOptions.drift_tol``); they are in the figure unless ``drift_gated``.
        offstate_s: Seconds of those windows and of the reference samples after them.
        drift_gated: The figure comes from windows at the machine's usual speed only.
        reference_usual_s: The usual reference step time the windows were held to (NaN: none).
        window_reference_s: With ``MeasureOptions.drift_per_window``, per window of
            ``step_times_s``, the reference step time it is corrected by (the geometric mean of
            the clean samples on either side of it); empty otherwise.
        idle: With ``MeasureOptions.wait_for_idle_s``, what the wait for idle cores before
            the warm-up found (:func:`~cubicml_lab.hardware.wait_for_idle`: ``idle_wait_s``,
            ``idle_others_cpu``, ``idle_timed_out``); empty otherwise.
    """

    step_times_s: list[float]
    warmup_steps: int
    warmup_step_times_s: list[float]
    steps_per_window: int
    steps_timed: int
    windows: int
    median_step_time_s: float
    rel_spread: float
    rel_ci: float
    target_met: bool
    outlier_steps: int
    stop_reason: str
    elapsed_s: float
    contended: bool = False
    contended_windows: int = 0
    contended_s: float = 0.0
    guard_figures: list[dict[str, float]] = field(default_factory=list)
    reference_times_s: list[float] = field(default_factory=list)
    offstate_windows: int = 0
    offstate_s: float = 0.0
    drift_gated: bool = False
    reference_usual_s: float = math.nan
    window_reference_s: list[float] = field(default_factory=list)
    idle: dict[str, float] = field(default_factory=dict)


#: Whether the default figure (``throughput``, the searchers' default objective) is the
#: drift-corrected one (``throughput_corrected``) or the raw one (``throughput_raw``):
#: corrected, because it ranks configurations at least as well and spreads less across repeats
#: (``docs/results.md``). A trial keeps its raw figure as the default when its reference runs
#: in another precision than its own matmuls (``cubicml_lab.launch.runner._corrects``): the
#: MLP reference comes in fp32 and bf16.
DRIFT_CORRECTED_DEFAULT = True
#: Log-variance given to a flagged (contended) figure: its clean windows were too few.
CONTENDED_LOG_VAR = 0.05
#: ... and to a flagged figure with no clean window at all (taken under contention).
UNTRUSTED_LOG_VAR = 1.0


def _median(x: list[float]) -> float:
    return quantile(sorted(x), 0.5) if x else math.nan


def guard_metrics(timing: Timing) -> dict[str, float]:
    """What the contention guard saw: ``contended`` (1.0 / 0.0), ``contended_windows``,
    ``contended_s``, and medians over the windows of ``cpu_wait`` (all windows), ``cpu_util``
    (clean ones) and ``others_cpu`` (all windows, in cores), and the largest ``cpu_steal`` of
    any window (a rare event: a median would be 0); NaN where not measured."""
    figs = timing.guard_figures
    clean = [f for f in figs if not f.get("contended")]

    def med(rows: list[dict[str, float]], key: str) -> float:
        return _median([f[key] for f in rows if key in f and not math.isnan(f[key])])

    return {"contended": 1.0 if timing.contended else 0.0,
            "contended_windows": float(timing.contended_windows),
            "contended_s": timing.contended_s, "cpu_wait": med(figs, "cpu_wait"),
            "cpu_util": med(clean or figs, "cpu_util"), "others_cpu": med(figs, "others_cpu"),
            "cpu_steal": max((f["cpu_steal"] for f in figs if not math.isnan(
                f.get("cpu_steal", math.nan))), default=math.nan)}


def reference_metrics(timing: Timing) -> dict[str, float]:
    """The drift reference: ``reference_speed`` (reference steps/s, median of the samples
    behind the figure), ``reference_step_s``, ``reference_rel_spread`` (IQR / median),
    ``reference_rel_ci`` (95% CI half-width of the median / median; inf under 6 samples),
    ``reference_samples``; and the speed-state gate: ``reference_usual`` (the usual speed the
    windows were held to, steps/s; NaN: none), ``offstate_windows``, ``offstate_s`` and
    ``drift_gated`` (1.0: the figure comes from windows at the usual speed only)."""
    refs = timing.reference_times_s
    usual = timing.reference_usual_s
    gate = {"reference_usual": 1.0 / usual if usual > 0 else math.nan,
            "offstate_windows": float(timing.offstate_windows), "offstate_s": timing.offstate_s,
            "drift_gated": 1.0 if timing.drift_gated else 0.0}
    if not refs:
        return {"reference_speed": math.nan, "reference_step_s": math.nan,
                "reference_rel_spread": math.nan, "reference_rel_ci": math.nan,
                "reference_samples": 0.0, **gate}
    s = sorted(refs)
    med = quantile(s, 0.5)
    return {"reference_speed": 1.0 / med, "reference_step_s": med,
            "reference_rel_spread": (quantile(s, 0.75) - quantile(s, 0.25)) / med,
            "reference_rel_ci": median_rel_ci(refs), "reference_samples": float(len(refs)),
            **gate}


def _rel_ci(timing: Timing, corrected: bool) -> float:
    """95% CI half-width over the figure: the windows' (:func:`spread_rel_ci`), combined with
    the reference samples' when the figure is drift-corrected; NaN where either is unknown.
    A trial's distance from the machine's usual speed is not added: it did not help the
    search rank trials (``docs/results.md``)."""
    ci = spread_rel_ci(timing.step_times_s)
    if corrected:  # NaN (unknown) stays NaN
        ci = math.hypot(ci, DRIFT_EXPONENT * spread_rel_ci(timing.reference_times_s))
    return ci


def _per_window_corrected(timing: Timing, nominal: float | None) -> list[float]:
    """Sorted step times of each window corrected by its own reference (``drift_per_window``)
    to the machine at ``nominal`` reference steps/s; empty when the timing has no such pairs."""
    refs = timing.window_reference_s
    if not nominal or not refs or len(refs) != len(timing.step_times_s):
        return []
    return sorted(corrected_step_time(t, 1.0 / (r * nominal))
                  for t, r in zip(timing.step_times_s, refs))


def _log_var(timing: Timing, rel_ci: float) -> float:
    """Observed-noise variance of log(throughput): the CI as a standard deviation, plus the
    repeat-to-repeat floor; a flagged figure gets at least a large fixed variance."""
    sd = rel_ci / 1.96 if math.isfinite(rel_ci) else 0.5
    var = sd * sd + REPEAT_LOG_SD**2
    if timing.contended:
        clean = any(not f.get("contended") for f in timing.guard_figures)
        var = max(var, CONTENDED_LOG_VAR if clean else UNTRUSTED_LOG_VAR)
    return var


def summarize(timing: Timing, units_per_step: float, flops_per_step: float,
              peak_flops: float | None, n_devices: int = 1, *, units: str | None = None,
              reference_nominal: float | None = None,
              drift_corrected: bool = DRIFT_CORRECTED_DEFAULT) -> dict[str, float]:
    """Metrics of a timing: step time, its noise, throughput, achieved TFLOP/s and MFU.

    ``units_per_step`` and ``flops_per_step`` are global (all devices); ``peak_flops`` is one
    device's peak FLOP/s. ``mfu = flops_per_step / step_time_s / (peak_flops * n_devices)``;
    NaN when the peak is unknown.

    Args:
        timing: From :func:`time_steps`.
        units_per_step: Tokens or samples per optimizer step.
        flops_per_step: Model FLOPs per optimizer step.
        peak_flops: Peak FLOP/s of one device, or ``None``.
        n_devices: Devices the step ran on.
        units: If given (e.g. ``"tokens"``), also ``<units>_per_s``, ``<units>_per_s_per_device``
            (the same figures as ``throughput`` and ``throughput_per_device``).
        reference_nominal: The machine's nominal reference speed
            (:func:`~cubicml_lab.hardware.reference_nominal`); with it and a reference
            measured, ``throughput_corrected`` is computed.
        drift_corrected: Make the drift-corrected figure the default one (``throughput``);
            default :data:`DRIFT_CORRECTED_DEFAULT` (corrected: it ranked better).

    Drift correction: with ``reference_nominal`` and a measured reference,
    ``step_time_corrected_s`` is the median window step time ``step_time_raw_s`` scaled to the
    machine at its nominal speed, ``* (reference_speed / reference_nominal) ** DRIFT_EXPONENT``
    (with ``timing.window_reference_s``, from ``MeasureOptions.drift_per_window``: the median of
    the windows each scaled so by its own reference, and the CI is theirs), and
    ``throughput_corrected`` is ``units_per_step`` over it (NaN without them). The default
    figures (``step_time_s``, ``throughput``, ``<units>_per_s``, ``achieved_tflops``, ``mfu``)
    are the raw ones, or the corrected ones when ``drift_corrected`` and a correction was
    possible; ``throughput * step_time_s == units_per_step`` always holds, and the metric
    ``drift_corrected`` (1.0 / 0.0) says which they are.

    Returns:
        ``step_time_s, step_time_raw_s, step_time_rel_spread, step_time_rel_ci, steps_timed,
        warmup_steps, windows, target_met (1.0/0.0), outlier_steps, units_per_step,
        flops_per_step, throughput`` (units/s, raw or drift-corrected: see above),
        ``drift_corrected``, ``throughput_raw`` (units / median raw step time),
        ``throughput_corrected`` and ``step_time_corrected_s`` (NaN when not possible),
        ``throughput_rel`` (units per reference step: raw over ``reference_speed``, the full
        ratio; comparable between trials whose references have the same size,
        ``metrics["reference_rows"]``; NaN without a reference),
        ``throughput_rel_ci`` (95% CI half-width of ``throughput`` over it: the windows' and,
        when corrected, the reference's; NaN, unknown, from a single window or reference
        sample), ``throughput_log_var`` (observed-noise variance of log ``throughput``, for a
        GP: ``(rel_ci / 1.96)**2 + REPEAT_LOG_SD**2`` (an unknown CI as 0.5 / 1.96), at least
        ``CONTENDED_LOG_VAR`` or ``UNTRUSTED_LOG_VAR`` when flagged), ``throughput_per_device,
        achieved_tflops (TFLOP/s, all devices), peak_tflops (one device; NaN if unknown), mfu
        (0-1), n_devices, measure_s``, plus :func:`guard_metrics`,
        :func:`reference_metrics` and ``timing.idle`` (the wait for idle cores, if any).
    """
    t_raw = timing.median_step_time_s
    raw = units_per_step / t_raw if t_raw > 0 else math.nan
    peak = float(peak_flops) if peak_flops else math.nan
    ref = reference_metrics(timing)
    can_correct = bool(reference_nominal) and math.isfinite(ref["reference_speed"])
    # the step time this step would take on the machine at its nominal speed
    t_corr, per_window = math.nan, _per_window_corrected(timing, reference_nominal)
    if per_window:
        t_corr = quantile(per_window, 0.5)
    elif can_correct:
        t_corr = corrected_step_time(t_raw, ref["reference_speed"] / reference_nominal)
    corrected = drift_corrected and can_correct
    t = t_corr if corrected else t_raw
    throughput = units_per_step / t if t > 0 else math.nan
    achieved = flops_per_step / t if t > 0 else math.nan
    if corrected and per_window:  # the corrected windows carry the reference's noise
        rel_ci = spread_rel_ci(per_window)
    else:
        rel_ci = _rel_ci(timing, corrected)
    out = {"step_time_s": t, "step_time_raw_s": t_raw, "step_time_rel_spread": timing.rel_spread,
           "step_time_rel_ci": timing.rel_ci, "steps_timed": float(timing.steps_timed),
           "warmup_steps": float(timing.warmup_steps), "windows": float(timing.windows),
           "target_met": 1.0 if timing.target_met else 0.0,
           "outlier_steps": float(timing.outlier_steps), "units_per_step": float(units_per_step),
           "flops_per_step": float(flops_per_step), "throughput": throughput,
           "throughput_raw": raw, "throughput_rel": raw / ref["reference_speed"],
           "drift_corrected": 1.0 if corrected else 0.0, "step_time_corrected_s": t_corr,
           "throughput_corrected": units_per_step / t_corr if t_corr > 0 else math.nan,
           "throughput_rel_ci": rel_ci,
           "throughput_log_var": _log_var(timing, rel_ci),
           "throughput_per_device": throughput / n_devices, "achieved_tflops": achieved / 1e12,
           "peak_tflops": peak / 1e12, "mfu": achieved / (peak * n_devices),
           "n_devices": float(n_devices), "measure_s": timing.elapsed_s,
           **guard_metrics(timing), **ref, **timing.idle}
    if units:
        out[f"{units}_per_s"] = throughput
        out[f"{units}_per_s_per_device"] = throughput / n_devices
    return out
