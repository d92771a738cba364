"""The machine a trial runs on: its description, peak memory, and the device's peak FLOP/s.

* :func:`hardware_info`: CPU model and threads, torch/Python versions, host name and, on CUDA,
  the GPU's name, count, memory, CUDA version and driver.
* :class:`GpuTelemetry`: samples SM clock, power draw and throttle reasons of a CUDA device in a
  background thread while steps are timed (read-only: the device's settings are never changed).
* :func:`peak_memory_gib` / :func:`reset_peak_memory`: CUDA allocator statistics, or the
  process's high-water resident set size on CPU (:func:`resident_gib`: the resident size now).
* :func:`tune_cpu_allocator`: keeps glibc's malloc from returning training-step buffers to the
  kernel, so CPU step times measure the model rather than page faults.
* :func:`device_peak_flops`: a datasheet table for A100/H100/H200 by precision; on CPU a matmul
  micro-benchmark run once and cached; :func:`attention_score_seconds`, the cost of one more
  attention score on this CPU by precision, measured likewise.
* :class:`CpuContention`: whether a timed window shared its cores with other processes (its
  threads' run-queue wait, its CPU time, the rest of the machine's); :class:`ThrottleGuard`, the
  same question for a CUDA device (throttle reasons seen by :class:`GpuTelemetry`).
* :class:`ReferenceWork`: a fixed small training step whose speed, measured next to a trial,
  gauges how fast the machine runs at that moment (drift correction), in a size near the trial's
  rows per matmul (:func:`reference_rows`), or, for a workload that names its own
  (``Workload.drift_references``), a :class:`StepReference`: a fixed small configuration of
  the workload itself. :func:`establish_reference_scale` measures the nominal speeds of every
  size (or every reference a workload names) together, :func:`reference_nominal` keeps them
  (the scale of corrected figures) and the recent speeds, and :func:`reference_usual` reads the
  speed the machine is usually at (a machine that switches between speed states has its
  windows held to that one: ``time_steps``).

Importing this package imports no torch. Its modules, imports pointing down this list (an
import-linter contract): :mod:`~cubicml_lab.hardware.machine`;
:mod:`~cubicml_lab.hardware.gpu`, :mod:`~cubicml_lab.hardware.contention` and
:mod:`~cubicml_lab.hardware.idle` (:func:`wait_for_idle`, before a trial);
:mod:`~cubicml_lab.hardware.cache` (the CPU model and the locked per-machine cache) and
:mod:`~cubicml_lab.hardware.drift` (drift correction's arithmetic, the one home of
``DRIFT_EXPONENT`` and the slope fits).
"""

from __future__ import annotations

from .contention import (
    MAX_CPU_WAIT,
    REFERENCE_PRECISIONS,
    REFERENCE_ROWS,
    CpuContention,
    ReferenceWork,
    StepReference,
    establish_reference_scale,
    mlp_reference_gauges,
    reference_nominal,
    reference_rows,
    reference_usual,
    usual_speed,
)
from .gpu import GpuTelemetry, ThrottleGuard, parse_smi_sample, summarize_telemetry
from .idle import IDLE_MAX_OTHERS, wait_for_idle
from .machine import (
    attention_score_seconds,
    cpu_model,
    default_device,
    device_peak_flops,
    hardware_info,
    host_facts,
    host_record,
    locked_json_cache,
    peak_memory_gib,
    resident_gib,
    reset_peak_memory,
    tune_cpu_allocator,
)

__all__ = ["attention_score_seconds", "CpuContention", "GpuTelemetry", "ReferenceWork",
           "StepReference", "ThrottleGuard",
           "default_device", "device_peak_flops", "establish_reference_scale", "hardware_info",
           "host_facts", "host_record", "locked_json_cache", "MAX_CPU_WAIT", "mlp_reference_gauges",
           "REFERENCE_PRECISIONS",
           "parse_smi_sample", "peak_memory_gib", "REFERENCE_ROWS", "reference_nominal",
           "resident_gib", "reference_rows", "reference_usual", "usual_speed", "reset_peak_memory",
           "summarize_telemetry", "tune_cpu_allocator", "cpu_model", "IDLE_MAX_OTHERS",
           "wait_for_idle"]
