"""Real training workloads, by name, and :func:`run_trial`: one measured trial in this process.

``get("gpt")`` returns a :class:`~cubicml_lab.workloads.base.Workload`; ``names()`` lists them.
:func:`run_trial` is what every launcher ends up calling: it resolves the config, builds the job,
times it in steady state (:func:`cubicml_lab.measure.time_steps`) and returns a
:class:`~cubicml_lab.measure.TrialResult`. It never raises for a trial's own failure: a bad
config, an exception, running out of memory or a non-finite loss become a result with status
``"failed"`` or ``"oom"``. Importing this package imports no torch.

Example:
    >>> from cubicml_lab import workloads
    >>> workloads.names()
    ['dlrm', 'gpt']
    >>> workloads.get("gpt").default_config()["d_model"]
    128
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import math
import sys
import time
import traceback
from typing import Any

from ..errors import ConfigError
from ..hardware import GpuTelemetry, tune_cpu_allocator
from ..measure import (
    MeasureOptions,
    TrialResult,
    device_peak_flops,
    hardware_info,
    host_record,
    make_timer,
    peak_memory_gib,
    reset_peak_memory,
    summarize,
    time_steps,
)
from .base import Built, Knob, Workload
from .parallel import World, close_world, init_world

__all__ = ["Built", "Knob", "Workload", "get", "names", "run_trial"]

_REGISTRY: dict[str, tuple[str, str]] = {"dlrm": ("cubicml_lab.workloads.dlrm", "DLRMWorkload"),
                                         "gpt": ("cubicml_lab.workloads.gpt", "GPTWorkload")}
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def names() -> list[str]:
    """Registered workload names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Workload:
    """A fresh instance of the workload called ``name``.

    Raises:
        ConfigError: No such workload (the message lists the known ones).
    """
    if name not in _REGISTRY:
        raise ConfigError(f"unknown workload {name!r}",
                          hint=f"known workloads: {', '.join(names())}")
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)()


def _check_device(device: Any) -> str:
    ok = isinstance(device, str) and (
        device in ("cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit()))
    if not ok:
        raise ConfigError(f"device = {device!r} is not 'cpu', 'cuda' or 'cuda:N'",
                          hint="e.g. device='cpu'")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device = {device!r} but torch sees no CUDA device",
                              hint="use device='cpu' on this machine")
    return device


def _is_oom(err: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if isinstance(err, MemoryError) or (oom_type is not None and isinstance(err, oom_type)):
        return True
    return isinstance(err, RuntimeError) and any(t in str(err).lower() for t in _OOM_TEXT)


def _error_text(err: BaseException, tail_lines: int = 12) -> str:
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip()
    tail = "\n".join(tb.splitlines()[-tail_lines:])
    return f"{type(err).__name__}: {err}\ntraceback (last {tail_lines} lines):\n{tail}"


def run_trial(spec: dict[str, Any]) -> TrialResult:
    """Run one trial in this process and return its result; never raises for the trial's failure.

    Args:
        spec: ``{"workload": str, "config": dict, "device": "cpu" | "cuda" | "cuda:N",
            "measure": dict of MeasureOptions fields}``; ``config``, ``device`` (default
            ``"cpu"``) and ``measure`` are optional.

    Returns:
        ``status="ok"`` with :func:`~cubicml_lab.measure.summarize` metrics (``units`` named by
        the workload, e.g. ``tokens_per_s``) plus ``peak_mem_gib``, ``loss`` (last step's) and
        ``model_params``; ``"oom"`` with the error and the ``peak_mem_gib`` known so far;
        ``"failed"`` for a bad config or measure option, a non-finite loss or any other
        exception (type, message and traceback tail in ``error``). ``config`` is the resolved
        config (as given when it could not be resolved); ``wall_s`` the whole trial's seconds.
    """
    t0 = time.perf_counter()
    ok_spec = isinstance(spec, dict)
    name = str(spec.get("workload", "")) if ok_spec else ""
    device = (spec.get("device") or "cpu") if ok_spec else "cpu"
    config: Any = spec.get("config") if ok_spec else None
    version, hardware, saved_threads = "", {}, None
    status, metrics, error = "failed", {}, None
    world = World(device=str(device))
    try:
        if not ok_spec or not isinstance(config if config is not None else {}, dict):
            raise ConfigError(f"a trial spec is a dict with a 'config' dict, got {spec!r:.200}",
                              hint='e.g. {"workload": "gpt", "config": {"d_model": 64}}')
        config = dict(config or {})
        workload = get(name)
        version = workload.version
        config = workload.resolve(config)
        options = MeasureOptions.from_dict(spec.get("measure"))
        device = _check_device(device)
        world = init_world(device)
        device = world.device
        workload.check_world(config, world.world_size)
        import torch

        if config.get("threads"):
            saved_threads = torch.get_num_threads()
            torch.set_num_threads(int(config["threads"]))
        hardware = {**hardware_info(device), **world.describe(), "rank": world.rank,
                    "cpu_malloc": tune_cpu_allocator()}
        peak_flops = device_peak_flops(device, config.get("precision", "fp32"))
        reset_peak_memory(device)
        built = workload.build(config, device, world)
        hardware["parallel"] = dict(built.parallel)
        last: list[Any] = [None]

        def step() -> None:
            last[0] = built.step()

        telemetry = GpuTelemetry(device) if device.startswith("cuda") else contextlib.nullcontext()
        with telemetry:
            timing = time_steps(step, sync=built.sync, options=options,
                                timer=make_timer(device, built.sync),
                                reduce=world.max if world.distributed else None)
        if isinstance(telemetry, GpuTelemetry):
            hardware.update(telemetry.summary())
        loss = world.mean(float(last[0]))
        if not math.isfinite(loss):
            error = (f"loss is not finite ({loss}) after {timing.warmup_steps} warm-up and "
                     f"{timing.steps_timed} timed steps: training diverged (lr = "
                     f"{config.get('lr')!r}?); the step time of a diverged run is not reported")
        else:
            metrics = summarize(timing, built.units_per_step, built.flops_per_step, peak_flops,
                                built.n_devices, units=workload.units)
            metrics.update(peak_mem_gib=world.max(peak_memory_gib(device)), loss=loss,
                           model_params=float(built.model_params))
            status = "ok"
    except Exception as err:  # noqa: BLE001 - a trial's failure is data, never an exception
        error = _error_text(err)
        if world.distributed:
            error = f"rank {world.rank} of {world.world_size}: {error}"
        if _is_oom(err):
            status = "oom"
            try:
                metrics = {"peak_mem_gib": peak_memory_gib(device)}
            except Exception:  # noqa: BLE001 - the figure is optional
                metrics = {}
        del err
    finally:
        built = last = None  # free the model and its tensors before reporting
        gc.collect()
        torch_mod = sys.modules.get("torch")
        on_cuda = str(device).startswith("cuda")
        if torch_mod is not None and on_cuda and torch_mod.cuda.is_available():
            torch_mod.cuda.empty_cache()
        if saved_threads is not None:
            torch_mod.set_num_threads(saved_threads)
        if status == "ok":  # after a failure, peers may be stuck in a collective: do not wait
            close_world(world)
    if not hardware:
        hardware = host_record(device)
    return TrialResult(status=status, metrics=metrics, hardware=hardware, error=error,
                       workload=name, workload_version=version,
                       config=config if isinstance(config, dict) else {},
                       wall_s=time.perf_counter() - t0)
