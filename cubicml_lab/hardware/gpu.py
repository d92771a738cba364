"""GPU telemetry: SM clock, power and throttle reasons sampled by ``nvidia-smi`` while steps are
timed (read-only), and :class:`ThrottleGuard`, which treats a throttled window like a contended
one. Importing it imports no torch.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["GpuTelemetry", "ThrottleGuard", "parse_smi_sample", "summarize_telemetry"]


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
    :class:`GpuTelemetry` saw the device throttled is contended. A GPU held at its power cap is
    not throttled (its steady state)."""

    def __init__(self, telemetry: GpuTelemetry) -> None:
        self.telemetry = telemetry
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> tuple[bool, dict[str, float]]:
        throttled = self.telemetry.throttled_between(self._t0, time.perf_counter())
        return throttled, {"throttled": 1.0 if throttled else 0.0}
