"""Measurement: steady-state step time, throughput, peak memory, FLOPs, MFU; the result record.

This module owns how a training step is timed and what a trial reports:

* :func:`time_steps` runs a step function until its time per step has settled (warm-up, never
  timed), then times *windows* of steps, synchronising only at window edges, until the 95%
  confidence interval of the median step time is within ``target_rel_ci`` of it, or a step or
  time budget runs out. Python's garbage collector is kept out of the timed windows (generation 1
  is collected between windows, as torchtitan does; collection is disabled inside them).
* Clocks: :class:`StepTimer` (``time.perf_counter`` with the workload's ``sync`` at the edges) on
  CPU, :class:`CudaEventTimer` (CUDA events recorded at the edges) on GPUs; :func:`make_timer`.
* :func:`summarize` turns a :class:`Timing` into metrics: ``step_time_s`` (median), its relative
  spread and CI, ``throughput`` (units/s), ``achieved_tflops`` and ``mfu`` (0-1).
* :func:`peak_memory_gib`, :func:`reset_peak_memory`, :func:`device_peak_flops` (a datasheet
  table for A100/H100/H200; on CPU a matmul micro-benchmark, cached) and :func:`hardware_info`.
* :class:`TrialResult`, the record every launcher returns (strict JSON, NaN-safe).

The raw step time, units per step and device count are always stored, so MFU can be recomputed
later under another FLOP convention. Multi-process runs (later launchers) report the slowest
rank's step time, as Megatron-LM does. Importing this module imports no torch.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import MeasurementError

__all__ = ["STATUSES", "CudaEventTimer", "MeasureOptions", "StepTimer", "Timing", "TrialResult",
           "device_peak_flops", "hardware_info", "make_timer", "peak_memory_gib",
           "reset_peak_memory", "summarize", "time_steps"]

STATUSES = ("ok", "oom", "failed", "timeout")
_MIN_WINDOWS = 8  # windows shrink below window_min_s if needed so that max_steps holds this many
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# ---------------------------------------------------------------------------------- the record
def _json_safe(value: Any) -> Any:
    """``value`` with non-finite floats replaced by the strings "NaN", "Infinity", "-Infinity"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class TrialResult:
    """What one trial produced; failures are data (a status and an error), never exceptions.

    Attributes:
        status: One of :data:`STATUSES`: ``"ok"``, ``"oom"``, ``"failed"``, ``"timeout"``.
        metrics: Measured values by name (see :func:`summarize`; plus ``peak_mem_gib`` and
            ``loss``); empty unless something was measured.
        hardware: Description of the machine (see :func:`hardware_info`).
        error: What went wrong (message and traceback tail), ``None`` when ok.
        workload: Workload name, e.g. ``"gpt"``.
        workload_version: The workload's version string.
        config: The full resolved config that ran (every knob).
        wall_s: Seconds the whole trial took (build + warm-up + timing).
    """

    status: str
    metrics: dict[str, float]
    hardware: dict[str, Any]
    error: str | None = None
    workload: str = ""
    workload_version: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise MeasurementError(f"TrialResult status = {self.status!r} is not one of "
                                   f"{', '.join(STATUSES)}", hint="use one of the listed statuses")

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of the fields (non-finite floats kept as floats)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialResult:
        """Rebuild from :meth:`to_dict` or parsed :meth:`to_json` output ("NaN" -> float)."""
        if not isinstance(d, Mapping) or "status" not in d:
            raise MeasurementError(f"not a TrialResult (no 'status'): {str(d)[:200]}",
                                   hint="pass what TrialResult.to_dict() or to_json() wrote")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise MeasurementError(f"unknown TrialResult field(s) {unknown}",
                                   hint=f"known fields: {', '.join(sorted(known))}")
        kw = dict(d)
        kw["metrics"] = {k: _NONFINITE.get(v, v) if isinstance(v, str) else v
                         for k, v in (d.get("metrics") or {}).items()}
        kw["hardware"] = dict(d.get("hardware") or {})
        kw["config"] = dict(d.get("config") or {})
        return cls(**kw)

    def to_json(self) -> str:
        """Strict JSON text (no bare NaN/Infinity: they are written as strings)."""
        return json.dumps(_json_safe(self.to_dict()), allow_nan=False, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> TrialResult:
        """Parse :meth:`to_json` output."""
        return cls.from_dict(json.loads(s))


# ----------------------------------------------------------------------------- the options
@dataclass(frozen=True, kw_only=True)
class MeasureOptions:
    """How long and how precisely :func:`time_steps` measures.

    Attributes:
        target_rel_ci: Stop once the 95% CI half-width of the median step time, divided by the
            median, is at most this (a fraction; 0.02 = 2%).
        min_steps: Timed steps at least (steps, not windows), even past ``max_time_s``.
        max_steps: Timed steps at most (steps, not windows).
        max_time_s: Budget of the timed phase in seconds (a window that would overrun it is not
            started once ``min_steps`` are timed).
        warmup_min_steps: Untimed warm-up steps at least (>= 1: the first step is never timed).
        warmup_max_steps: Warm-up steps at most.
        warmup_max_s: Warm-up budget in seconds (ends it once ``warmup_min_steps`` ran).
        settle_rel: Warm-up ends when the last 3 step times (not counting the first step) are
            within this fraction of their median.
        window_min_s: Seconds a timed window lasts at least; steps are grouped so, and the
            device is synchronised only at window edges.
    """

    target_rel_ci: float = 0.02
    min_steps: int = 5
    max_steps: int = 200
    max_time_s: float = 20.0
    warmup_min_steps: int = 2
    warmup_max_steps: int = 20
    warmup_max_s: float = 20.0
    settle_rel: float = 0.10
    window_min_s: float = 0.05

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            ok_type = (isinstance(value, int) if f.type == "int"
                       else isinstance(value, (int, float)) and math.isfinite(value))
            if isinstance(value, bool) or not ok_type:
                raise MeasurementError(f"MeasureOptions.{f.name} = {value!r} must be a finite "
                                       f"{f.type}", hint=f"default: {f.default!r}")
        checks = [("target_rel_ci", self.target_rel_ci > 0, "> 0"),
                  ("min_steps", self.min_steps >= 1, ">= 1"),
                  ("max_steps", self.max_steps >= self.min_steps, ">= min_steps"),
                  ("max_time_s", self.max_time_s > 0, "> 0"),
                  ("warmup_min_steps", self.warmup_min_steps >= 1, ">= 1 (never time step 1)"),
                  ("warmup_max_steps", self.warmup_max_steps >= self.warmup_min_steps,
                   ">= warmup_min_steps"),
                  ("warmup_max_s", self.warmup_max_s >= 0, ">= 0"),
                  ("settle_rel", self.settle_rel > 0, "> 0"),
                  ("window_min_s", self.window_min_s >= 0, ">= 0")]
        for name, ok, rule in checks:
            if not ok:
                raise MeasurementError(
                    f"MeasureOptions.{name} = {getattr(self, name)!r} must be {rule}",
                    hint=f"default: {getattr(MeasureOptions, name)!r}")

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


# ---------------------------------------------------------------------------------- clocks
class StepTimer:
    """Wall clock of a window of steps: ``time.perf_counter``, ``sync()`` called at both edges.

    Args:
        sync: Blocks until queued device work is done (e.g. ``torch.cuda.synchronize``); ``None``
            for eager CPU work.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self._t0 = 0.0

    def start(self) -> None:
        """Mark the start of a window."""
        if self.sync is not None:
            self.sync()
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Mark the end of the window; return its duration in seconds."""
        if self.sync is not None:
            self.sync()
        return time.perf_counter() - self._t0


class CudaEventTimer(StepTimer):
    """Device-side clock: CUDA events recorded at the window edges, synchronised at the end only.

    The elapsed time is the GPU stream's time between the two events, so it includes kernels and
    any idle gaps while the CPU was launching them.

    Args:
        device: A CUDA device, e.g. ``"cuda"`` or ``"cuda:1"``.
    """

    def __init__(self, device: str = "cuda") -> None:
        import torch

        super().__init__(None)
        self.device = torch.device(device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            self._start.record()

    def stop(self) -> float:
        import torch

        with torch.cuda.device(self.device):
            self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3  # ms -> s


def make_timer(device: str = "cpu", sync: Callable[[], None] | None = None) -> StepTimer:
    """The right clock for ``device``: CUDA events on ``cuda[:N]``, else perf_counter + ``sync``."""
    return CudaEventTimer(device) if str(device).startswith("cuda") else StepTimer(sync)


# ------------------------------------------------------------------------------ statistics
def _quantile(sorted_x: list[float], q: float) -> float:
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


def _median_rel_ci(x: list[float]) -> float:
    """95% CI half-width of the median over the median (order-statistic CI; inf if n < 6)."""
    s = sorted(x)
    rank = _median_ci_rank(len(s))
    med = _quantile(s, 0.5)
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
        stop_reason: Why timing stopped: ``"target met"``, ``"max_steps"`` or ``"max_time_s"``.
        elapsed_s: Seconds spent in :func:`time_steps` (warm-up + timing + collection).
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


def _settled(times: list[float], rel: float) -> bool:
    """Whether the last 3 step times (never the first) are within ``rel`` of their median."""
    if len(times) < 4:
        return False
    last = sorted(times[-3:])
    return max(last[2] - last[1], last[1] - last[0]) <= rel * last[1]


def time_steps(step: Callable[[], Any], *, sync: Callable[[], None] | None = None,
               options: MeasureOptions = MeasureOptions(), timer: StepTimer | None = None
               ) -> Timing:
    """Time ``step`` in steady state: warm up until settled, then time windows of steps.

    Warm-up runs single steps, each synchronised and timed, until ``warmup_min_steps`` ran and
    the last 3 (never the first, which carries one-time costs) are within ``settle_rel`` of
    their median, or a warm-up budget is spent: at least 4 steps unless a budget ends it. Timing
    then runs windows of ``k = ceil(window_min_s / warm-up step time)`` steps (at most
    ``max_steps // 8``, so that the budget holds 8 windows: the order-statistic CI of a median
    needs 6), reading the clock and synchronising only at window edges. It stops once
    ``min_steps`` are timed and the median's CI is within ``target_rel_ci``, or when the next
    window would pass ``max_steps`` or ``max_time_s``. Garbage: one full collection before
    timing, generation 1 between windows, none inside them (the caller's gc state is restored,
    also when ``step`` raises).

    Args:
        step: One training step; its return value is ignored.
        sync: Blocks until queued device work is done; used by the default timer only.
        options: Budgets and targets.
        timer: The clock; default ``StepTimer(sync)`` (:func:`make_timer` gives CUDA events).

    Returns:
        The :class:`Timing`.

    Example:
        >>> t = time_steps(lambda: time.sleep(0.002),
        ...                options=MeasureOptions(max_time_s=0.3, window_min_s=0.01))
        >>> 0.0015 < t.median_step_time_s < 0.01 and t.warmup_steps >= 2
        True
    """
    timer = timer if timer is not None else StepTimer(sync)
    o = options
    t_begin = time.perf_counter()
    warm: list[float] = []
    while True:
        timer.start()
        step()
        warm.append(timer.stop())
        n, spent = len(warm), time.perf_counter() - t_begin
        budget_spent = n >= o.warmup_max_steps or spent >= o.warmup_max_s
        if n >= o.warmup_min_steps and (budget_spent or _settled(warm, o.settle_rel)):
            break
    recent = sorted(warm[1:][-3:] or warm)  # the first step (compilation...) says nothing
    est = max(recent[len(recent) // 2], 1e-9)
    k = max(1, min(math.ceil(o.window_min_s / est), o.max_steps // _MIN_WINDOWS))
    times: list[float] = []
    steps, stop_reason, rel_ci = 0, "max_steps", math.inf
    gc_was_enabled = gc.isenabled()
    gc.collect()
    t_timed = time.perf_counter()
    try:
        gc.disable()
        while True:
            n = k if steps + k <= o.max_steps else o.max_steps - steps
            if n <= 0 or (n < k and steps >= o.min_steps):
                break  # max_steps (a short last window only to reach min_steps)
            if steps >= o.min_steps and (time.perf_counter() - t_timed
                                         + k * _quantile(sorted(times), 0.5) > o.max_time_s):
                stop_reason = "max_time_s"
                break
            gc.collect(1)
            timer.start()
            for _ in range(n):
                step()
            times.append(timer.stop() / n)
            steps += n
            rel_ci = _median_rel_ci(times)
            if steps >= o.min_steps and rel_ci <= o.target_rel_ci:
                stop_reason = "target met"
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    s = sorted(times)
    med = _quantile(s, 0.5)
    mad = _quantile(sorted(abs(x - med) for x in s), 0.5)
    iqr = _quantile(s, 0.75) - _quantile(s, 0.25)
    return Timing(step_times_s=times, warmup_steps=len(warm), warmup_step_times_s=warm,
                  steps_per_window=k, steps_timed=steps, windows=len(times),
                  median_step_time_s=med, rel_spread=iqr / med if med > 0 else math.nan,
                  rel_ci=rel_ci, target_met=rel_ci <= o.target_rel_ci,
                  outlier_steps=sum(x > med + 3 * 1.4826 * mad for x in s),
                  stop_reason=stop_reason, elapsed_s=time.perf_counter() - t_begin)


def summarize(timing: Timing, units_per_step: float, flops_per_step: float,
              peak_flops: float | None, n_devices: int = 1, *, units: str | None = None
              ) -> dict[str, float]:
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
        units: If given (e.g. ``"tokens"``), also ``<units>_per_s``, ``<units>_per_s_per_device``.

    Returns:
        ``step_time_s, step_time_rel_spread, step_time_rel_ci, steps_timed, warmup_steps,
        windows, target_met (1.0/0.0), outlier_steps, units_per_step, flops_per_step,
        throughput (units/s), throughput_per_device, achieved_tflops (TFLOP/s, all devices),
        peak_tflops (one device; NaN if unknown), mfu (0-1), n_devices, measure_s``.
    """
    t = timing.median_step_time_s
    throughput = units_per_step / t if t > 0 else math.nan
    achieved = flops_per_step / t if t > 0 else math.nan
    peak = float(peak_flops) if peak_flops else math.nan
    out = {"step_time_s": t, "step_time_rel_spread": timing.rel_spread,
           "step_time_rel_ci": timing.rel_ci, "steps_timed": float(timing.steps_timed),
           "warmup_steps": float(timing.warmup_steps), "windows": float(timing.windows),
           "target_met": 1.0 if timing.target_met else 0.0,
           "outlier_steps": float(timing.outlier_steps), "units_per_step": float(units_per_step),
           "flops_per_step": float(flops_per_step), "throughput": throughput,
           "throughput_per_device": throughput / n_devices, "achieved_tflops": achieved / 1e12,
           "peak_tflops": peak / 1e12, "mfu": achieved / (peak * n_devices),
           "n_devices": float(n_devices), "measure_s": timing.elapsed_s}
    if units:
        out[f"{units}_per_s"] = throughput
        out[f"{units}_per_s_per_device"] = throughput / n_devices
    return out


# ------------------------------------------------------------------------- memory and hardware
def peak_memory_gib(device: str = "cpu") -> float:
    """Peak memory since the last :func:`reset_peak_memory`, in GiB (2**30 bytes).

    CUDA: ``torch.cuda.max_memory_allocated`` (tensors; excludes the allocator's cache and the
    CUDA context). CPU: the process's high-water resident set size (``ru_maxrss``: KiB on Linux,
    bytes on macOS), which counts the interpreter and torch itself (a few hundred MiB).
    """
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated(torch.device(device)) / 2**30
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**30 if sys.platform == "darwin" else rss / 2**20


def reset_peak_memory(device: str = "cpu") -> bool:
    """Start a new peak-memory period; return whether the platform allowed it.

    CUDA: ``torch.cuda.reset_peak_memory_stats``. CPU (Linux): writes ``5`` to
    ``/proc/self/clear_refs``, which resets the high-water RSS to the current RSS; elsewhere the
    peak stays the process's lifetime peak and ``False`` is returned.
    """
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(torch.device(device))
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@lru_cache(maxsize=1)
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@lru_cache(maxsize=1)
def _nvidia_driver() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def hardware_info(device: str = "cpu") -> dict[str, Any]:
    """Describe this machine: CPU, threads, versions and, for a CUDA device, the GPU.

    Returns:
        ``device, cpu_model, cpu_count, torch_threads, torch_version, python_version, hostname,
        platform``; for ``cuda[:N]`` also ``gpu_name, gpu_count, gpu_mem_gib, cuda_version,
        driver`` (``None`` when nvidia-smi is not available).
    """
    import torch

    info: dict[str, Any] = {
        "device": str(device), "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
        "python_version": platform.python_version(), "hostname": socket.gethostname(),
        "platform": platform.platform(),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu_name=props.name, gpu_count=torch.cuda.device_count(),
                    gpu_mem_gib=props.total_memory / 2**30, cuda_version=torch.version.cuda,
                    driver=_nvidia_driver())
    return info


# Dense (no sparsity) peak FLOP/s per GPU from NVIDIA's public datasheets: A100 (SXM4 and PCIe):
# 312 TFLOPS BF16/FP16 tensor, 156 TF32 tensor, 19.5 FP32. H100 SXM5: 989.4 BF16/FP16, 494.7
# TF32, 66.9 FP32; H100 PCIe: 756 / 378 / 51; H100 NVL: 835 / 418 / 60 (the datasheets print
# twice these tensor figures "with sparsity"). H200 SXM: as H100 SXM; H200 NVL: as H100 NVL.
# "fp32" is the non-tensor-core peak: the gpt workload leaves TF32 off (torch's default).
_GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "H100 SXM": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
    "H100 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0},
    "H200 SXM": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0},
}


def _gpu_family(name: str) -> str | None:
    """Table row of a CUDA device name, e.g. 'NVIDIA H100 80GB HBM3' -> 'H100 SXM'."""
    n = name.upper()
    for chip in ("H200", "H100"):
        if chip in n:
            form = "NVL" if "NVL" in n else ("PCIe" if "PCIE" in n else "SXM")
            return f"{chip} {form}"
    return "A100" if "A100" in n else None


def _cache_dir() -> Path:
    return Path(os.environ.get("CUBICML_LAB_CACHE_DIR") or Path.home() / ".cache" / "cubicml_lab")


def _bench_matmul_flops(precision: str, n: int = 1024, seconds: float = 0.5) -> float:
    """Best FLOP/s of ``n x n`` matmuls over 5 slices of ``seconds``, current torch threads."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
    c = torch.empty(n, n, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=c)
    best = 0.0
    for _ in range(5):
        count, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds / 5:
            torch.mm(a, b, out=c)
            count += 1
        best = max(best, 2.0 * n**3 * count / elapsed)
    return best


def device_peak_flops(device: str = "cpu", precision: str = "fp32") -> float | None:
    """Peak FLOP/s of one device at ``precision`` ("fp32", "tf32", "bf16", "fp16"), or None.

    CUDA: the datasheet table above for A100/H100/H200 (None for other GPUs, so MFU is NaN).
    CPU: *measured*, not a datasheet figure: the best rate of 1024 x 1024 matmuls in that dtype
    ("tf32" means fp32) over about 0.5 s with the current torch thread count, run once and cached
    in ``$CUBICML_LAB_CACHE_DIR/cpu_peak.json`` (default ``~/.cache/cubicml_lab``) keyed by CPU
    model, threads and precision. CPU MFU is therefore relative to what torch's own matmul
    reaches on this machine, and can be compared across configs on the same machine only.
    """
    if precision not in ("fp32", "tf32", "bf16", "fp16"):
        raise MeasurementError(f"precision = {precision!r} is not one of fp32, tf32, bf16, fp16",
                               hint="pass the precision the matmuls run in")
    if str(device).startswith("cuda"):
        import torch

        family = _gpu_family(torch.cuda.get_device_name(torch.device(device)))
        return None if family is None else _GPU_PEAK_TFLOPS[family][precision] * 1e12
    import torch

    prec = "fp32" if precision == "tf32" else precision
    key = f"{_cpu_model()}|threads={torch.get_num_threads()}|{prec}"
    path = _cache_dir() / "cpu_peak.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)  # one benchmark at a time; the others read its result
        except ImportError:
            pass
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = {}
        if isinstance(cache, dict) and isinstance(cache.get(key), dict):
            return float(cache[key]["flops"])
        flops = _bench_matmul_flops(prec)
        cache = cache if isinstance(cache, dict) else {}
        cache[key] = {"flops": flops, "torch_version": torch.__version__,
                      "measured_at": time.time()}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, path)
    return flops
