"""Timing: steady-state step time, throughput, peak memory, FLOPs and MFU of a training step.

This package owns how a training step is timed and what its figures are (the record a trial
returns, :class:`~cubicml_lab.trials.TrialResult`, lives in :mod:`cubicml_lab.trials`):

* :func:`time_steps` runs a step function until its time per step has settled (warm-up, never
  timed), then times *windows* of steps, synchronising only at window edges, until the 95%
  confidence interval of the median step time is within ``target_rel_ci`` of it, or a step or
  time budget runs out. Python's garbage collector is kept out of the timed windows (generation 1
  is collected between windows, as torchtitan does; collection is disabled inside them).
* Clocks: :class:`StepTimer` (``time.perf_counter`` with the workload's ``sync`` at the edges) on
  CPU, :class:`CudaEventTimer` (CUDA events recorded at the edges) on GPUs; :func:`make_timer`.
* Contention guard: a :class:`WindowGuard` (on CPU :class:`~cubicml_lab.hardware.CpuContention`:
  the run-queue wait of the trial's threads) judges every window; a contended one is discarded
  and re-timed, and a trial that cannot get 6 clean windows within ``contended_budget`` is
  flagged (``Timing.contended``; ``metrics["contended"] = 1.0``, status stays ``"ok"``).
* Drift reference: a fixed small workload (:class:`~cubicml_lab.hardware.ReferenceWork`, an MLP,
  or the workload's own :class:`~cubicml_lab.hardware.StepReference` where it names one) sampled
  after every window gives the machine's speed at that moment (``reference_speed``); each window
  is corrected by the samples on either side of it (``MeasureOptions.drift_per_window``), and the
  figure is the median of the corrected windows.
* Speed-state gate (off by default): given the machine's usual reference speed
  (:func:`~cubicml_lab.hardware.reference_usual`, from earlier trials) and ``drift_tol > 0``, a
  window timed while the reference read more than ``drift_tol`` off it is set aside and re-timed,
  until the timed phase has lasted ``drift_budget * max_time_s`` seconds (``offstate_windows``,
  ``drift_gated`` in the metrics).
* :func:`summarize` turns a :class:`Timing` into metrics: ``step_time_s`` (median), its relative
  spread and CI, ``throughput`` (units/s; drift-corrected by default), ``throughput_raw``,
  ``throughput_corrected`` (drift-corrected) and ``throughput_rel`` (over the reference),
  ``throughput_log_var`` (noise for a GP), ``achieved_tflops`` and ``mfu`` (0-1),
  and what the guard and the reference saw (:func:`guard_metrics`, :func:`reference_metrics`).
* Re-exported from :mod:`cubicml_lab.hardware`: :func:`peak_memory_gib`,
  :func:`reset_peak_memory`, :func:`device_peak_flops` and :func:`hardware_info`.

The raw step time, units per step and device count are always stored, so MFU can be recomputed
later under another FLOP convention. Multi-process runs report the slowest rank's step time, as
Megatron-LM does (``time_steps(reduce=...)``). Modules: :mod:`~cubicml_lab.timing.steps`
(:func:`time_steps`), :mod:`~cubicml_lab.timing.options` (:class:`MeasureOptions`),
:mod:`~cubicml_lab.timing.clocks` (the clocks) and :mod:`~cubicml_lab.timing.figures` (the
:class:`Timing` record and :func:`summarize`). Importing this package imports no torch.
"""

from __future__ import annotations

from ..hardware import (  # re-exported: timing is where users look for them
    device_peak_flops,
    hardware_info,
    host_record,
    peak_memory_gib,
    reset_peak_memory,
)
from .figures import (
    CONTENDED_LOG_VAR,
    DRIFT_CORRECTED_DEFAULT,
    DRIFT_EXPONENT,
    REPEAT_LOG_SD,
    UNTRUSTED_LOG_VAR,
    Timing,
    guard_metrics,
    reference_metrics,
    summarize,
)
from .steps import CudaEventTimer, MeasureOptions, StepTimer, WindowGuard, make_timer, time_steps

__all__ = ["CudaEventTimer", "MeasureOptions", "StepTimer", "Timing", "device_peak_flops",
           "hardware_info", "host_record", "make_timer", "peak_memory_gib", "reset_peak_memory",
           "guard_metrics", "reference_metrics", "summarize", "time_steps", "WindowGuard",
           "CONTENDED_LOG_VAR", "DRIFT_CORRECTED_DEFAULT", "DRIFT_EXPONENT", "REPEAT_LOG_SD",
           "UNTRUSTED_LOG_VAR"]
