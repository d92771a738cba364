"""The machine a trial runs on: its description, peak memory, and the device's peak FLOP/s.

* :func:`hardware_info`: CPU model and threads, torch/Python versions, host name and, on CUDA,
  the GPU's name, count, memory, CUDA version and driver.
* :class:`GpuTelemetry`: samples SM clock, power draw and throttle reasons of a CUDA device in a
  background thread while steps are timed (read-only: the device's settings are never changed).
* :func:`peak_memory_gib` / :func:`reset_peak_memory`: CUDA allocator statistics, or the
  process's high-water resident set size on CPU.
* :func:`tune_cpu_allocator`: keeps glibc's malloc from returning training-step buffers to the
  kernel, so CPU step times measure the model rather than page faults.
* :func:`device_peak_flops`: a datasheet table for A100/H100/H200 by precision; on CPU a matmul
  micro-benchmark run once and cached.
* :class:`CpuContention`: whether a timed window shared its cores with other processes (its
  threads' run-queue wait, its CPU time, the rest of the machine's); :class:`ThrottleGuard`, the
  same question for a CUDA device (throttle reasons seen by :class:`GpuTelemetry`).
* :class:`ReferenceWork`: a fixed small training step whose speed, measured next to a trial,
  gauges how fast the machine runs at that moment (drift correction); :func:`reference_nominal`
  keeps the machine's nominal speed, the scale of corrected figures.

Importing this module imports no torch.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import MeasurementError

__all__ = ["CpuContention", "GpuTelemetry", "ReferenceWork", "ThrottleGuard", "default_device",
           "device_peak_flops", "hardware_info", "host_record", "parse_smi_sample",
           "peak_memory_gib", "reference_nominal", "reset_peak_memory", "summarize_telemetry",
           "tune_cpu_allocator"]


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


# glibc mallopt parameters (malloc.h) and the values tune_cpu_allocator sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 * 2**20  # glibc's upper limit for this parameter on 64-bit
_TRIM_THRESHOLD = 2**31 - 1


@lru_cache(maxsize=1)
def tune_cpu_allocator() -> str:
    """Make glibc's malloc keep freed training buffers instead of unmapping them; say what it did.

    By default glibc serves large blocks (the activations and gradients of a step) with ``mmap``
    and gives them back with ``munmap`` when torch frees them, so every step page-faults its
    buffers in again: thousands of faults per step, which on a virtual machine cost 10-25% of a
    small model's step time and most of its run-to-run noise (measured: ``gpt`` defaults, one
    thread, 7,000 faults and 66-123 ms per step before; 16 faults and 62-77 ms after). This sets
    ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's maximum) and ``M_TRIM_THRESHOLD`` to 2 GiB, as the
    jemalloc/tcmalloc advice for CPU training does by other means. Freed memory stays with the
    process, so its resident size stays at its peak; it applies to the whole process (for an
    in-process trial, the caller's). Set ``CUBICML_LAB_MALLOC=default`` to leave malloc alone.

    Returns:
        What the trial ran with, for the hardware record: ``"glibc mmap_threshold=32MiB
        trim_threshold=2GiB"``, or ``"default"`` (opted out, not Linux/glibc, or refused).
    """
    if os.environ.get("CUBICML_LAB_MALLOC", "").lower() == "default":
        return "default"
    if not sys.platform.startswith("linux") or not platform.libc_ver()[0] == "glibc":
        return "default"
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = (libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1
              and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1)
    except (OSError, AttributeError):
        return "default"
    return "glibc mmap_threshold=32MiB trim_threshold=2GiB" if ok else "default"


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


def default_device() -> str:
    """``"cuda"`` when this process sees a CUDA device, else ``"cpu"`` (imports torch)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def hardware_info(device: str = "cpu") -> dict[str, Any]:
    """Describe this machine: CPU, threads, versions and, for a CUDA device, the GPU.

    Returns:
        ``device, cpu_model, cpu_count, cpu_affinity`` (the cores this process may run on, as
        ``"0,1"``), ``torch_threads, torch_version, python_version, hostname, platform``; for
        ``cuda[:N]`` also ``gpu_name, gpu_count, gpu_mem_gib, cuda_version,
        driver`` (``None`` when nvidia-smi is not available).
    """
    import torch

    info: dict[str, Any] = {
        "device": str(device), "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(),
        "cpu_affinity": ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        if hasattr(os, "sched_getaffinity") else None,  # the cores it may run on, "0,1"
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


def host_record(device: str = "cpu") -> dict[str, Any]:
    """:func:`hardware_info`, or at least the host name (and why) when that fails."""
    try:
        return hardware_info(device if isinstance(device, str) else "cpu")
    except Exception as err:  # noqa: BLE001 - the host name still identifies the machine
        return {"hostname": socket.gethostname(), "device": str(device),
                "hardware_error": repr(err)}


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


# ----------------------------------------------------------------------- GPU telemetry
# NVML clock-event ("throttle") reason bits, as nvidia-smi's clocks_event_reasons.active prints.
_THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                  0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                  0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
                  0x100: "display_clock_setting"}
_SMI_FIELDS = "clocks.sm,power.draw,clocks_throttle_reasons.active,temperature.gpu"


def parse_smi_sample(line: str) -> dict[str, Any] | None:
    """One line of ``nvidia-smi --query-gpu=<_SMI_FIELDS> --format=csv,noheader,nounits``.

    Returns:
        ``{"sm_clock_mhz", "power_w", "throttle_mask", "temperature_c"}`` (a field nvidia-smi
        reports as ``[N/A]`` is ``None``), or ``None`` for a line that is not such a sample.

    Example:
        >>> parse_smi_sample("1980, 512.31, 0x0000000000000004, 41")["throttle_mask"]
        4
    """
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None

    def num(text: str, cast: Any) -> Any:
        try:
            return cast(text)
        except ValueError:
            return None

    sample = {"sm_clock_mhz": num(parts[0], float), "power_w": num(parts[1], float),
              "throttle_mask": num(parts[2], lambda t: int(t, 16)),
              "temperature_c": num(parts[3], float)}
    return sample if any(v is not None for v in sample.values()) else None


def summarize_telemetry(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Min/median/max SM clock, median/max power, max temperature and every throttle reason seen.

    Returns:
        ``gpu_samples`` and, where measured, ``gpu_sm_clock_mhz_{min,median,max}``,
        ``gpu_power_w_{median,max}``, ``gpu_temperature_c_max`` and ``gpu_throttle_reasons`` (the
        names of every reason bit seen in any sample, ``"gpu_idle"`` included, sorted).
    """
    out: dict[str, Any] = {"gpu_samples": len(samples)}

    def col(key: str) -> list[float]:
        return sorted(s[key] for s in samples if s.get(key) is not None)

    if clocks := col("sm_clock_mhz"):
        out.update(gpu_sm_clock_mhz_min=clocks[0], gpu_sm_clock_mhz_max=clocks[-1],
                   gpu_sm_clock_mhz_median=clocks[len(clocks) // 2])
    if power := col("power_w"):
        out.update(gpu_power_w_median=power[len(power) // 2], gpu_power_w_max=power[-1])
    if temps := col("temperature_c"):
        out["gpu_temperature_c_max"] = temps[-1]
    mask = 0
    for s in samples:
        mask |= s.get("throttle_mask") or 0
    out["gpu_throttle_reasons"] = sorted(n for bit, n in _THROTTLE_BITS.items() if mask & bit)
    return out


class GpuTelemetry:
    """Sample a CUDA device's SM clock, power and throttle reasons while a block of code runs.

    A background thread runs ``nvidia-smi`` every ``interval_s`` (read-only queries: the device's
    settings are never changed). Without nvidia-smi it records nothing and :meth:`summary` says
    ``gpu_samples: 0``. Use as a context manager around the timed phase.

    Args:
        device: ``"cuda"`` or ``"cuda:N"`` (as torch numbers devices; mapped to nvidia-smi by UUID).
        interval_s: Seconds between samples.
    """

    def __init__(self, device: str = "cuda", interval_s: float = 0.5) -> None:
        self.device, self.interval_s = device, interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop: Any = None
        self._thread: Any = None

    def _target(self) -> str:
        import torch

        props = torch.cuda.get_device_properties(torch.device(self.device))
        uuid = str(getattr(props, "uuid", "") or "")
        if uuid:
            return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        return str(torch.device(self.device).index or 0)

    def _run(self, target: str) -> None:
        import subprocess

        cmd = ["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits",
               "-i", target]
        while not self._stop.is_set():
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, check=True)
            except (OSError, subprocess.SubprocessError):
                return  # no nvidia-smi, or it fails: no telemetry
            for line in out.stdout.splitlines():
                if (sample := parse_smi_sample(line)) is not None:
                    self.samples.append({**sample, "t": time.perf_counter()})
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GpuTelemetry:
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._target(),), daemon=True,
                                        name="cubicml-gpu-telemetry")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict[str, Any]:
        """:func:`summarize_telemetry` of the samples taken so far."""
        return summarize_telemetry(list(self.samples))

    def throttled_between(self, t0: float, t1: float) -> bool:
        """Whether a sample taken in ``[t0 - interval_s, t1]`` (``time.perf_counter`` seconds)
        shows a slowdown reason: thermal or hardware slowdown, power brake.

        Untested on a GPU so far (none where this was written): a throttled timed window is
        treated like a contended one by :class:`ThrottleGuard`.
        """
        for sample in list(self.samples):
            at = sample.get("t", -1.0)
            if t0 - self.interval_s <= at <= t1 and (sample.get("throttle_mask") or 0) & _SLOWDOWN:
                return True
        return False


#: Throttle reasons that mark a window as slowed by the machine rather than by the job: hardware
#: slowdown, software and hardware thermal slowdown, power brake. Not ``sw_power_cap``: a GPU
#: under full load sits at its power cap as its steady state, which the figure should include.
_SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80


class ThrottleGuard:
    """A window guard for CUDA (see :class:`CpuContention`): a window during which
    :class:`GpuTelemetry` saw the device throttled is contended. Never run on a GPU yet."""

    def __init__(self, telemetry: GpuTelemetry) -> None:
        self.telemetry = telemetry
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> tuple[bool, dict[str, float]]:
        throttled = self.telemetry.throttled_between(self._t0, time.perf_counter())
        return throttled, {"throttled": 1.0 if throttled else 0.0}


# ----------------------------------------------------------------------- CPU contention
def _threads_wait_s() -> float | None:
    """Seconds this process's threads spent runnable but waiting for a CPU, summed over its
    threads (Linux ``/proc/self/task/*/schedstat``, second field); None where unavailable."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    total, seen = 0, 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
            seen += 1
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9 if seen else None


def _machine_busy_s() -> float | None:
    """CPU seconds all cores spent busy since boot (``/proc/stat``: user, nice, system, irq,
    softirq and steal; 10 ms resolution), or None where unavailable."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()[1:9]
        ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6, 7))
    except (OSError, IndexError, ValueError):
        return None
    return ticks / _CLK_TCK


_CLK_TCK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


class CpuContention:
    """Tells whether a timed window of a CPU trial shared its cores with other work.

    Between :meth:`start` and :meth:`stop` it reads, for the window:

    * ``cpu_wait``: time this process's threads waited, runnable, for a CPU (Linux
      ``schedstat`` run-queue delay, summed over threads) over ``wall x threads``. On an idle
      machine it stays near 0 whatever the trial does; when other processes compete for the
      cores it grows with the share they take (with two CPU-bound competitors on 2 cores and a
      2-thread trial, about 0.5).
    * ``cpu_util``: the process's CPU time over ``wall x threads`` (below 1 when threads wait,
      for a CPU or for each other).
    * ``others_cpu``: CPU the rest of the machine used, in cores (``/proc/stat`` busy time minus
      this process's).

    A window is contended when ``cpu_wait > max_wait``; where ``schedstat`` is missing, when the
    others used more than the cores this trial leaves free plus ``max_wait x threads``. Where
    neither can be read (not Linux), no window is ever contended.

    Args:
        threads: Threads the trial computes with (torch's intra-op threads).
        max_wait: Largest ``cpu_wait`` of a clean window (0.1: the threads may have waited
            10% of the window; a compute-bound step then runs at most about 10% slow).
        cores: Cores the trial may run on; default: this process's affinity.
    """

    def __init__(self, threads: int, max_wait: float = 0.10, cores: int | None = None) -> None:
        self.threads = max(1, int(threads))
        self.max_wait = max_wait
        if cores is None:
            cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else os.cpu_count() or 1)
        self.cores = cores
        self._start: tuple[float, float, float | None, float | None] = (0.0, 0.0, None, None)

    @staticmethod
    def available() -> bool:
        """Whether this platform lets the guard see contention (Linux ``/proc``)."""
        return _threads_wait_s() is not None or _machine_busy_s() is not None

    def start(self) -> None:
        """Mark the start of a window."""
        self._start = (time.perf_counter(), time.process_time(), _threads_wait_s(),
                       _machine_busy_s())

    def stop(self) -> tuple[bool, dict[str, float]]:
        """End the window: ``(contended, {"cpu_wait", "cpu_util", "others_cpu"})``."""
        wall1, cpu1, wait1, busy1 = (time.perf_counter(), time.process_time(),
                                     _threads_wait_s(), _machine_busy_s())
        wall0, cpu0, wait0, busy0 = self._start
        wall = max(wall1 - wall0, 1e-9)
        own = cpu1 - cpu0
        fig = {"cpu_util": own / (wall * self.threads), "cpu_wait": math.nan,
               "others_cpu": math.nan}
        if wait0 is not None and wait1 is not None:
            fig["cpu_wait"] = max(0.0, wait1 - wait0) / (wall * self.threads)
        if busy0 is not None and busy1 is not None:
            fig["others_cpu"] = max(0.0, busy1 - busy0 - own) / wall
        if not math.isnan(fig["cpu_wait"]):
            contended = fig["cpu_wait"] > self.max_wait
        elif not math.isnan(fig["others_cpu"]):
            free = max(0, self.cores - self.threads)
            contended = fig["others_cpu"] > free + self.max_wait * self.threads
        else:
            contended = False
        return contended, fig


# ----------------------------------------------------------------------- drift reference
class ReferenceWork:
    """A fixed small training step that gauges how fast the machine runs now.

    The forward and backward pass of a fixed two-layer MLP (256 -> 1024 -> 256, GELU, batch
    256, fp32; 0.8 GFLOP per step), run with torch's current thread count: its matmuls and
    elementwise ops are large enough to use every thread, as a trial's do (a smaller one ran on
    one thread and did not feel what a 2-thread trial felt). :meth:`sample`
    runs a fixed number of these steps (chosen on the first call so that a sample lasts about
    ``sample_s``) and returns seconds per step. A trial's figures divided by this figure, taken
    in the same process next to its windows, cancel what slows both alike: clock changes,
    other tenants of a virtual machine, cache and memory state.

    Args:
        sample_s: Seconds one sample lasts, about.
    """

    #: Relative spread (IQR / median) of clean samples in one process on an idle machine, at
    #: most (measured on a 2-core VM: about 0.04 with :func:`tune_cpu_allocator`, 0.16 without).
    tolerance = 0.08

    def __init__(self, sample_s: float = 0.02) -> None:
        import torch

        gen = torch.Generator().manual_seed(0)
        self._w1 = torch.randn(256, 1024, generator=gen).mul_(0.05).requires_grad_()
        self._w2 = torch.randn(1024, 256, generator=gen).mul_(0.05).requires_grad_()
        self._x = torch.randn(256, 256, generator=gen)
        self.sample_s = sample_s
        self.steps = 0  # steps per sample, set by the first sample

    def _step(self) -> None:
        import torch.nn.functional as F

        y = F.gelu(self._x @ self._w1) @ self._w2
        y.square().mean().backward()
        self._w1.grad = self._w2.grad = None

    def sample(self) -> float:
        """Seconds per reference step over one sample (the first call also calibrates)."""
        if self.steps == 0:
            for _ in range(3):
                self._step()
            t0 = time.perf_counter()
            self._step()
            self.steps = max(1, round(self.sample_s / max(time.perf_counter() - t0, 1e-6)))
        t0 = time.perf_counter()
        for _ in range(self.steps):
            self._step()
        return (time.perf_counter() - t0) / self.steps


def reference_nominal(speed: float, threads: int) -> float:
    """This machine's nominal :class:`ReferenceWork` speed (reference steps/s) at ``threads``.

    The first figure offered for this CPU model and thread count is kept, in
    ``$CUBICML_LAB_CACHE_DIR/reference.json`` (default ``~/.cache/cubicml_lab``), and returned
    ever after, so that drift-corrected throughputs (``raw * nominal / reference_speed``) of all
    trials on this machine share one scale, in the workload's units per second. Delete the file
    to start a new scale (figures stored before then keep the old one; ``throughput_rel`` and
    ``reference_speed`` are stored too, so any trial can be put on any scale).

    Args:
        speed: This trial's reference speed, offered as the nominal if none is kept yet.
        threads: Threads the reference ran with.
    """
    key = f"{_cpu_model()}|threads={threads}"
    path = _cache_dir() / "reference.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:
            pass
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            cache = {}
        cache = cache if isinstance(cache, dict) else {}
        if isinstance(cache.get(key), dict):
            return float(cache[key]["steps_per_s"])
        cache[key] = {"steps_per_s": float(speed), "measured_at": time.time()}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, path)
    return float(speed)
