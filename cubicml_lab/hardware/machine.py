"""This machine: its description, peak memory, the CPU allocator and the device's peak FLOP/s
(measured once per machine and kept in :func:`~cubicml_lab.hardware.cache.locked_json_cache`).
Importing it imports no torch.
"""

from __future__ import annotations

import math
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import MeasurementError
from .cache import cache_dir, cpu_model, locked_json_cache  # noqa: F401 (importable from here)

__all__ = ["address_layout", "attention_score_seconds", "cpu_model", "default_device",
           "device_peak_flops", "hardware_info", "host_record", "locked_json_cache",
           "peak_memory_gib", "reset_peak_memory", "resident_gib", "tune_cpu_allocator"]


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


def resident_gib() -> float:
    """This process's resident set size now, in GiB (``/proc/self/statm``); NaN where it
    cannot be read (not Linux)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return math.nan
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def reset_peak_memory(device: str = "cpu") -> bool:
    """Start a new peak-memory period; return whether the platform allowed it.

    CUDA: ``torch.cuda.reset_peak_memory_stats``. CPU (Linux): gives the memory malloc holds
    free back to the kernel (glibc's ``malloc_trim``: :func:`tune_cpu_allocator` keeps freed
    blocks, so an earlier trial's buffers would otherwise count in this one's peak), then writes
    ``5`` to ``/proc/self/clear_refs``, which resets the high-water RSS to the current RSS;
    elsewhere the peak stays the process's lifetime peak and ``False`` is returned.
    """
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(torch.device(device))
        return True
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


# glibc mallopt parameters (malloc.h) and the values tune_cpu_allocator sets.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_TRIM_THRESHOLD = 2**31 - 1


@lru_cache(maxsize=1)
def _glibc() -> Any:
    """This process's C library through ctypes where it is glibc (Linux), else None."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both must exist
    except (OSError, AttributeError):
        return None
    return libc


@lru_cache(maxsize=1)
def tune_cpu_allocator() -> str:
    """Make glibc's malloc keep freed training buffers instead of unmapping them; say what it did.

    By default glibc serves large blocks (the activations and gradients of a step) with ``mmap`` and
    gives them back with ``munmap`` when torch frees them, so every step page-faults its buffers in
    again: thousands of faults per step, a large share of a small model's step time and most of
    its run-to-run noise. This turns ``mmap`` off for blocks (``M_MMAP_MAX`` = 0: every block
    comes from the heap and is reused) and sets ``M_TRIM_THRESHOLD`` to 2 GiB, as the
    jemalloc/tcmalloc advice for CPU training does by other means. ``M_MMAP_THRESHOLD`` is not
    raised instead: glibc caps it at 32 MiB, which a larger micro-batch's buffers pass (``gpt`` at
    32 sequences: 32 MiB of fp32 logits, plus malloc's header). Freed memory stays with the
    process, so its resident size stays at its peak, and the peak includes the heap's holes
    (:func:`reset_peak_memory` gives free memory back first, so one trial's holes do not count in
    the next one's peak); it applies to the whole process (for an in-process trial, the
    caller's). Set ``CUBICML_LAB_MALLOC=default`` to leave malloc alone. Huge pages (glibc's
    ``hugetlb`` tunable, torch's ``THP_MEM_ALLOC_ENABLE``) are left off: they did not steady the
    figures (``docs/results.md``).

    Returns:
        What the trial ran with, for the hardware record: ``"glibc mmap=off
        trim_threshold=2GiB"``, or ``"default"`` (opted out, not Linux/glibc, or refused).
    """
    if os.environ.get("CUBICML_LAB_MALLOC", "").lower() == "default":
        return "default"
    libc = _glibc()
    if libc is None:
        return "default"
    ok = (libc.mallopt(_M_MMAP_MAX, 0) == 1
          and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1)
    return "glibc mmap=off trim_threshold=2GiB" if ok else "default"


@lru_cache(maxsize=1)
def _nvidia_driver() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def host_facts(device: str = "cpu") -> dict[str, Any]:
    """:func:`hardware_info` without torch (no import, no CUDA context): ``device, cpu_model,
    cpu_count, cpu_affinity, python_version, hostname, platform, address_layout``; for
    ``cuda[:N]`` also ``gpu_name, gpu_count, gpu_mem_gib, driver`` from ``nvidia-smi`` where it
    answers. For a process that only launches a job (a user's command), whose torch is the
    job's own."""
    info: dict[str, Any] = {
        "device": str(device), "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
        "cpu_affinity": ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        if hasattr(os, "sched_getaffinity") else None,  # the cores it may run on, "0,1"
        "python_version": platform.python_version(), "hostname": socket.gethostname(),
        "platform": platform.platform(), "address_layout": address_layout(),
    }
    if str(device).startswith("cuda"):
        info.update(_nvidia_gpus())
    return info


def _nvidia_gpus() -> dict[str, Any]:
    """``gpu_name`` (the first GPU's), ``gpu_count``, ``gpu_mem_gib`` and ``driver`` from
    ``nvidia-smi``; empty where it does not answer."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True)
        rows = [r.rsplit(",", 1) for r in out.stdout.strip().splitlines() if "," in r]
        return {"gpu_name": rows[0][0].strip(), "gpu_count": len(rows),
                "gpu_mem_gib": float(rows[0][1]) / 1024, "driver": _nvidia_driver()}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {}


def default_device() -> str:
    """``"cuda"`` when this process sees a CUDA device, else ``"cpu"`` (imports torch)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


_ADDR_NO_RANDOMIZE = 0x0040000  # personality(2) flag: no address-space layout randomisation


def address_layout() -> str | None:
    """Whether this process's address-space layout is ``"fixed"`` (the kernel's randomisation
    is off for it, as :func:`~cubicml_lab.launch.worker.fix_address_layout` asks, or for the
    whole machine) or ``"randomized"``; None where it cannot be read (not Linux)."""
    try:
        persona = int(Path("/proc/self/personality").read_text(), 16)
        machine_wide = Path("/proc/sys/kernel/randomize_va_space").read_text().strip()
    except (OSError, ValueError):
        return None
    return "fixed" if persona & _ADDR_NO_RANDOMIZE or machine_wide == "0" else "randomized"


def hardware_info(device: str = "cpu") -> dict[str, Any]:
    """Describe this machine: CPU, threads, versions and, for a CUDA device, the GPU.

    Returns:
        ``device, cpu_model, cpu_count, cpu_affinity`` (the cores this process may run on, as
        ``"0,1"``), ``torch_threads, torch_version, python_version, hostname, platform``,
        ``address_layout`` (:func:`address_layout`); for
        ``cuda[:N]`` also ``gpu_name, gpu_count, gpu_mem_gib, cuda_version,
        driver`` (``None`` when nvidia-smi is not available).
    """
    import torch

    info = {**host_facts(device), "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__}
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


def _bench_size(per_flop: float, n: int, seconds: float) -> int:
    """The side of the benchmark's matmuls: ``n``, or where one would take longer than a fifth
    of ``seconds`` at ``per_flop`` seconds per FLOP, the multiple of 64 (at least 128) whose
    matmul takes about a tenth."""
    if per_flop * 2.0 * n**3 <= seconds / 5:
        return n
    return max(128, int((seconds / 10 / per_flop / 2.0) ** (1 / 3)) // 64 * 64)


def _bench_matmul_flops(precision: str, n: int = 1024, seconds: float = 0.5) -> float | None:
    """Best FLOP/s of ``n x n`` matmuls over 5 slices of ``seconds / 5``, current torch threads.

    Where one such matmul would take more than a slice (a dtype this CPU has no fast kernel
    for, such as bf16 on a CPU without bf16 instructions, where it can be ~100x slower than
    fp32), ``n`` shrinks (a multiple of 64, at
    least 128) until one fits in half a slice, as a 256-square probe predicts.

    A slice whose threads waited for a core (:class:`~cubicml_lab.hardware.CpuContention`) is
    discarded: a peak measured beside other work is too low (a fraction of the idle one), every
    MFU from it too high (above 1), and the cache would keep it. None where fewer than 3 slices
    were clean within ``5 x seconds`` (a busy machine: MFU is NaN, and the next call measures
    again)."""
    import torch

    from .contention import CpuContention

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    gen = torch.Generator().manual_seed(0)
    probe = torch.randn(256, 256, generator=gen).to(dtype)
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        torch.mm(probe, probe)
        times.append(time.perf_counter() - t0)
    n = _bench_size(min(times[1:]) / (2.0 * 256**3), n, seconds)
    a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
    c = torch.empty(n, n, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=c)
    guard, rates, began = CpuContention(threads=torch.get_num_threads()), [], time.perf_counter()
    while len(rates) < 5 and time.perf_counter() - began < 5 * seconds:
        count, t0 = 0, time.perf_counter()
        guard.start()
        while (elapsed := time.perf_counter() - t0) < seconds / 5:
            torch.mm(a, b, out=c)
            count += 1
        if not guard.stop()[0]:
            rates.append(2.0 * n**3 * count / elapsed)
    return max(rates) if len(rates) >= 3 else None


def device_peak_flops(device: str = "cpu", precision: str = "fp32") -> float | None:
    """Peak FLOP/s of one device at ``precision`` ("fp32", "tf32", "bf16", "fp16"), or None.

    CUDA: the datasheet table above for A100/H100/H200 (None for other GPUs, so MFU is NaN).
    CPU: *measured*, not a datasheet figure: the best rate of 1024 x 1024 matmuls (smaller where
    one would take over 0.1 s) in that dtype
    ("tf32" means fp32) over about 0.5 s with the current torch thread count, run once and cached
    in ``$CUBICML_LAB_CACHE_DIR/cpu_peak.json`` (default ``~/.cache/cubicml_lab``) keyed by CPU
    model, threads and precision. CPU MFU is therefore relative to what torch's own matmul
    reaches on this machine, and can be compared across configs on the same machine only.
    Timed slices that shared the cores with other work are discarded; None (MFU NaN, nothing
    cached) where too few were clean.
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
    return _measured_once(f"{cpu_model()}|threads={torch.get_num_threads()}|{prec}", "flops",
                          lambda: _bench_matmul_flops(prec))


def _measured_once(key: str, field: str, bench: Callable[[], float | None]) -> float | None:
    """``cpu_peak.json``'s ``key[field]``, or ``bench()`` run (one benchmark at a time, under
    the cache's lock) and stored there with the torch version and time; a None result is not
    stored, so the next call measures again."""
    import torch

    with locked_json_cache("cpu_peak.json") as cache:
        if isinstance(cache.get(key), dict):
            return float(cache[key][field])
        value = bench()
        if value is not None:
            cache[key] = {field: value, "torch_version": torch.__version__,
                          "measured_at": time.time()}
    return value


def _bench_attention_score_seconds(precision: str, seq_len: int, d_model: int,
                                   seconds: float = 1.0) -> float | None:
    """Seconds one more attention score costs in a causal ``scaled_dot_product_attention``
    forward and backward at ``precision``, current torch threads: 8 sequences at 8 heads against
    2 heads (``d_model`` split over them, so the FLOPs stay the same), timed in turn for about
    ``seconds``, the median of the pairs' differences over the 6 extra score matrices' elements.
    A pair whose threads waited for a core (:class:`~cubicml_lab.hardware.CpuContention`) is
    discarded. None where fewer than 8 pairs were clean within ``5 x seconds`` (a busy machine:
    the next call measures again), or 8 heads were not slower."""
    import torch
    import torch.nn.functional as F

    from .contention import CpuContention

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    gen = torch.Generator().manual_seed(0)
    batch, steps = 8, {}
    for heads in (2, 8):
        q, k, v = (torch.randn(batch, heads, seq_len, d_model // heads, generator=gen)
                   .to(dtype).requires_grad_() for _ in range(3))
        steps[heads] = lambda q=q, k=k, v=v: (
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward())
        steps[heads]()
    guard = CpuContention(torch.get_num_threads()) if CpuContention.available() else None
    diffs: list[float] = []
    t0 = time.perf_counter()
    while (now := time.perf_counter() - t0) < 5 * seconds and (
            len(diffs) < 8 or (now < seconds and len(diffs) < 200)):
        took = {}
        for heads, step in steps.items():
            if guard is not None:
                guard.start()
            start = time.perf_counter()
            step()
            took[heads] = time.perf_counter() - start
            if guard is not None and guard.stop()[0]:
                break
        else:
            diffs.append(took[8] - took[2])
    if len(diffs) < 8:
        return None
    extra = sorted(diffs)[len(diffs) // 2]
    return extra / (batch * seq_len * seq_len * 6) if extra > 0 else None


def attention_score_seconds(precision: str = "fp32", seq_len: int = 128,
                            d_model: int = 128) -> float | None:
    """Seconds of one attention score (an element of one head's ``seq_len x seq_len`` score
    matrix, forward and backward of a causal ``scaled_dot_product_attention``) on this CPU at
    ``precision``, with the current torch thread count; None where it cannot be told apart.

    *Measured*, as :func:`device_peak_flops` is on a CPU: the same attention split over 8 heads
    against 2 (the same FLOPs, 4x the score elements), timed in turn for about 1 s with the
    pairs whose threads waited for a core discarded, run once and cached in ``cpu_peak.json``
    keyed by CPU model, threads, shape and precision (not cached where too few pairs were
    clean). What it prices is the per-head softmax and masking that a FLOP count does not see.
    A CPU's bf16 score may cost several fp32 ones (the kernel converting each to fp32 and
    back) while a plain bf16 softmax is the faster, so a softmax alone could price it the wrong
    way round; probes whose threads waited for a core are discarded, or the ratio would measure
    the other work.
    """
    if precision not in ("fp32", "bf16", "fp16"):
        raise MeasurementError(f"precision = {precision!r} is not one of fp32, bf16, fp16",
                               hint="pass the precision the attention runs in")
    if d_model % 8:
        return None  # 8 heads must divide the width
    import torch

    key = (f"{cpu_model()}|threads={torch.get_num_threads()}|attention_score seq={seq_len} "
           f"d={d_model}|{precision}")
    return _measured_once(key, "seconds",
                          lambda: _bench_attention_score_seconds(precision, seq_len, d_model))
