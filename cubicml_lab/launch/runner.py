"""The runner: one measured trial in this process, which every launcher's trial process calls.

:func:`run_spec` is the one entry: a spec carrying a ``"command"``
(:meth:`~cubicml_lab.workloads.Command.to_spec`) goes to
:func:`~cubicml_lab.launch.job.run_command`, any other to :func:`run_trial`. :func:`run_trial`
resolves the config (:mod:`cubicml_lab.workloads`), builds the job, times it in steady state
(:func:`cubicml_lab.timing.time_steps`, beside the contention guard and the drift reference) and
returns a :class:`~cubicml_lab.trials.TrialResult`. A trial's own failure (a bad config, an
exception, running out of memory, a non-finite loss) is a result with status ``"failed"`` or
``"oom"``, never an exception.

A config travels down once (campaign -> launcher -> :func:`run_spec` -> workload -> timing) and
its result travels back up once, as a record of :mod:`cubicml_lab.trials`. Importing this module
imports no torch; the workload imports it when the trial runs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from ..timing.policy import losing_step_s
from ..trials import TrialResult

__all__ = ["run_spec", "run_trial"]

_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def run_spec(spec: dict[str, Any]) -> TrialResult:
    """Run the trial a spec describes in this process: a command or a built-in workload."""
    if isinstance(spec, dict) and spec.get("command") is not None:
        from .job import run_command

        return run_command(spec)
    return run_trial(spec)


def run_trial(spec: dict[str, Any]) -> TrialResult:
    """Run one trial in this process and return its result; never raises for the trial's failure.

    Args:
        spec: ``{"workload": str, "config": dict, "device": "cpu" | "cuda" | "cuda:N",
            "measure": dict of MeasureOptions fields}``; ``config``, ``device`` (default
            ``"cpu"``) and ``measure`` are optional.

    Returns:
        ``status="ok"`` with :func:`~cubicml_lab.timing.summarize` metrics (``units`` named by
        the workload, e.g. ``tokens_per_s``) plus ``peak_mem_gib``, ``loss`` (last step's) and
        ``model_params``; a trial that shared its cores with other processes for most of its
        windows stays ``"ok"`` but carries ``contended = 1.0`` (see
        :func:`~cubicml_lab.timing.guard_metrics`) and a large ``throughput_log_var``;
        ``"oom"`` with the error and the ``peak_mem_gib`` known so far;
        ``"failed"`` for a bad config or measure option, a non-finite loss or any other
        exception (type, message and traceback tail in ``error``). ``config`` is the resolved
        config (as given when it could not be resolved); ``wall_s`` the whole trial's seconds.
    """
    from ..hardware import tune_cpu_allocator
    from ..timing import MeasureOptions, hardware_info, host_record
    from ..workloads import get
    from ..workloads.parallel import World, init_world

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
                    "cpu_malloc": tune_cpu_allocator(), "omp_env": _omp_env()}
        status, metrics, error = _build_and_time(workload, config, options, device, world,
                                                 hardware, spec.get("beat"))
    except Exception as err:  # noqa: BLE001 - a trial's failure is data, never an exception
        status, metrics, error = _failure(err, world, device)
        del err
    finally:
        _tidy(device, saved_threads, world, closing=status == "ok")
    if not hardware:
        hardware = host_record(device)
    return TrialResult(status=status, metrics=metrics, hardware=hardware, error=error,
                       workload=name, workload_version=version,
                       config=config if isinstance(config, dict) else {},
                       wall_s=time.perf_counter() - t0)


def _failure(err: BaseException, world: Any, device: Any) -> tuple[str, dict[str, float], str]:
    """A trial's exception as data: ``("oom", {"peak_mem_gib": ...}, error)`` where it ran out
    of memory (the figure where it can be read), else ``("failed", {}, error)``; ``error`` holds
    the type, message and traceback tail, and the rank in a distributed trial."""
    from ..timing import peak_memory_gib

    error = _error_text(err)
    if world.distributed:
        error = f"rank {world.rank} of {world.world_size}: {error}"
    if not _is_oom(err):
        return "failed", {}, error
    try:
        return "oom", {"peak_mem_gib": peak_memory_gib(device)}, error
    except Exception:  # noqa: BLE001 - the figure is optional
        return "oom", {}, error


def _tidy(device: Any, saved_threads: int | None, world: Any, *, closing: bool) -> None:
    """After a trial, failed or not: free its model and CUDA cache, give back the thread count,
    and (``closing``: it ended ok) close its process group; after a failure, peers may be stuck
    in a collective, so it is not waited for."""
    from ..workloads.parallel import close_world

    gc.collect()  # the model and its tensors went with _build_and_time's frame
    torch_mod = sys.modules.get("torch")
    on_cuda = str(device).startswith("cuda")
    if torch_mod is not None and on_cuda and torch_mod.cuda.is_available():
        torch_mod.cuda.empty_cache()
    if saved_threads is not None:
        torch_mod.set_num_threads(saved_threads)
    if closing:
        close_world(world)


# -- the pieces of one trial ------------------------------------------------------------------
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


def _omp_env() -> str:
    """The OpenMP settings the trial's threads run with, e.g. ``"GOMP_SPINCOUNT=10000"``."""
    import os

    keys = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
    return " ".join(f"{k}={os.environ[k]}" for k in keys if k in os.environ)


def _guard_and_reference(device: str, options: Any, telemetry: Any, rows: int,
                         workload: Any, ref_config: Mapping[str, Any] | None,
                         precision: str = "fp32") -> tuple[Any, Any]:
    """The contention guard and drift reference of a trial on ``device``: on CPU the run-queue
    wait of the trial's threads and, at the trial's thread count, the workload's own
    :class:`~cubicml_lab.hardware.StepReference` at ``ref_config`` (the one
    ``workload.drift_reference_for`` picked for the trial), or with ``None`` a
    :class:`~cubicml_lab.hardware.ReferenceWork` of ``rows`` in ``precision`` (the trial's where
    the MLP runs in it, :func:`_mlp_precision`); on CUDA the throttle reasons
    :class:`GpuTelemetry` sees (no reference: a CPU workload says nothing of a GPU's speed).
    No CPU guard when the trial's own threads (all local ranks') outnumber its cores: their
    waiting is the config's, not the machine's. The reference (``None``: none) has ``sample``
    and ``name``, the key of its scale."""
    import os

    import torch

    from ..hardware import (
        CpuContention,
        GpuTelemetry,
        ReferenceWork,
        ThrottleGuard,
    )

    if isinstance(telemetry, GpuTelemetry):
        return ThrottleGuard(telemetry), None
    threads = torch.get_num_threads()
    guard = CpuContention(threads, options.max_cpu_wait) if CpuContention.available() else None
    if guard is not None and threads * int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > guard.cores:
        guard = None
    if options.reference_share <= 0:
        return guard, None
    if ref_config is None:
        return guard, ReferenceWork(rows=rows, precision=precision)
    return guard, _step_reference(workload, ref_config)


def _step_reference(workload: Any, ref_config: Mapping[str, Any]) -> Any:
    """A :class:`~cubicml_lab.hardware.StepReference` of ``workload`` at ``ref_config`` (one of
    its ``drift_references``), built on the CPU in this process, at its thread count; its name,
    the key of its nominal speed, is the workload's name, version and ``ref_config``."""
    from ..hardware import StepReference

    ref = workload.build(workload.resolve(ref_config), "cpu")
    return StepReference(ref.step, _reference_name(workload, ref_config), precision=ref.precision)


def _reference_name(workload: Any, ref_config: Mapping[str, Any]) -> str:
    """The name of ``workload``'s drift reference at ``ref_config``: e.g.
    ``"dlrm v1 batch_size=256,rows=1000"``."""
    knobs = ",".join(f"{k}={v}" for k, v in sorted(ref_config.items()))
    return f"{workload.name} v{workload.version} {knobs}"


def _mlp_precision(precision: Any) -> str:
    """The precision a trial in ``precision`` has its :class:`~cubicml_lab.hardware.ReferenceWork`
    run in: its own where the MLP comes in it (:data:`~cubicml_lab.hardware.REFERENCE_PRECISIONS`),
    else fp32 (and the trial keeps its raw figure, :func:`_corrects`)."""
    from ..hardware import REFERENCE_PRECISIONS

    return precision if precision in REFERENCE_PRECISIONS else "fp32"


def _corrects(reference: Any, precision: str) -> bool:
    """Whether a trial whose matmuls run in ``precision`` takes its drift-corrected figure as
    its default one (:data:`~cubicml_lab.timing.DRIFT_CORRECTED_DEFAULT`): only over a
    reference that runs in the same precision. Over another precision's reference a
    figure spreads more than raw (the reference does not follow it);
    ``throughput_corrected`` is still stored. The MLP reference runs in bf16 too
    (:func:`_mlp_precision`), so bf16 trials are corrected over one of their own precision.
    """
    from ..timing import DRIFT_CORRECTED_DEFAULT

    return DRIFT_CORRECTED_DEFAULT and getattr(reference, "precision", "fp32") == precision



def _build_and_time(workload: Any, config: dict[str, Any], options: Any, device: str,
                    world: Any, hardware: dict[str, Any], beat: Any = None
                    ) -> tuple[str, dict[str, float], str | None]:
    """Build the job, time it in steady state, and summarise: ``(status, metrics, error)``.

    With ``beat`` (the spec's best so far, :func:`losing_step_s`) timing stops early once the
    trial cannot beat it, and the metrics carry ``stopped_early = 1``.

    ``hardware`` gains the parallel layout and, on CUDA, the telemetry of the timed windows.
    On CPU the peak memory is the process's high-water resident size less what building the
    drift reference added to it (``hardware["drift_reference_gib"]``: its model and optimizer
    state, about 39 MiB for dlrm's larger one), measured once the references' scale is known
    (:func:`~cubicml_lab.hardware.establish_reference_scale`, before the peak-memory period).
    Its gradients, allocated by its first step, still count where the trial's own steps do not
    reuse their memory (up to 20 MiB for dlrm's larger one): taken together with that step,
    they could not be told from what any process's first backward pass allocates (about 50
    MiB, which subtracting it would have taken from every trial's figure).
    Exceptions propagate to :func:`run_trial`, which turns them into a result.
    """
    import torch

    from ..timing import device_peak_flops, reset_peak_memory

    peak_flops = device_peak_flops(device, config.get("precision", "fp32"))
    threads = torch.get_num_threads()
    ref_config = workload.drift_reference_for(config)  # None: the MLP
    mlp_precision = _mlp_precision(config.get("precision", "fp32"))
    if not device.startswith("cuda") and options.reference_share > 0:
        _establish_scales(workload, ref_config, mlp_precision, threads)
    reset_peak_memory(device)
    built = workload.build(config, device, world)
    hardware["parallel"] = dict(built.parallel)
    options = replace(options, losing_step_s=losing_step_s(beat, built.units_per_step,
                                                           workload.units))
    timed = _time_built(built, workload, ref_config, mlp_precision, options, device, world,
                        threads, hardware)
    if not math.isfinite(timed.loss):
        t = timed.timing
        return "failed", {}, (f"loss is not finite ({timed.loss}) after {t.warmup_steps} warm-up "
                              f"and {t.steps_timed} timed steps: training diverged (lr = "
                              f"{config.get('lr')!r}?); the step time of a diverged run is not "
                              "reported")
    metrics = _ok_metrics(timed, built, workload, world, device, peak_flops, threads, hardware)
    if timed.timing.stop_reason == "losing":
        metrics["stopped_early"] = 1.0
    return "ok", metrics, None


@dataclass(frozen=True)
class _Timed:
    """What timing a built job gave: the steady-state timing, its drift reference (None: none)
    with the memory it took (GiB) and the key of its scale, the reference rows, the last loss."""

    timing: Any
    reference: Any
    reference_gib: float
    rows: int
    scale: Any
    loss: float


def _establish_scales(workload: Any, ref_config: Mapping[str, Any] | None, mlp_precision: str,
                      threads: int) -> None:
    """The nominal speeds of every reference on this trial's reference's scale, where any is
    missing (once per machine and thread count), before the trial's peak-memory period."""
    from ..hardware import establish_reference_scale, mlp_reference_gauges

    if ref_config is None:  # the MLP's sizes (and its fp32 ones: one scale)
        establish_reference_scale(threads, gauges=mlp_reference_gauges(mlp_precision))
    elif len(workload.drift_references) > 1:
        establish_reference_scale(threads, gauges={
            _reference_name(workload, c): functools.partial(_step_reference, workload, c)
            for c in workload.drift_references})


def _time_built(built: Any, workload: Any, ref_config: Mapping[str, Any] | None,
                mlp_precision: str, options: Any, device: str, world: Any, threads: int,
                hardware: dict[str, Any]) -> _Timed:
    """Time the built job in steady state beside its contention guard and drift reference
    (:func:`_guard_and_reference`); ``hardware`` gains the reference's memory, the guard's
    name and, on CUDA, the telemetry of the timed windows."""
    from ..hardware import GpuTelemetry, reference_rows, reference_usual, resident_gib
    from ..timing import make_timer, time_steps

    last: list[Any] = [None]

    def step() -> None:
        last[0] = built.step()

    telemetry = GpuTelemetry(device) if device.startswith("cuda") else contextlib.nullcontext()
    with telemetry:
        rows = reference_rows(built.matmul_rows)
        before_gib = resident_gib()
        guard, reference = _guard_and_reference(device, options, telemetry, rows, workload,
                                                ref_config, mlp_precision)
        # the reference's own memory (its model and optimizer state), left out of the peak
        reference_gib = max(0.0, resident_gib() - before_gib) if reference is not None else 0.0
        reference_gib = reference_gib if math.isfinite(reference_gib) else 0.0
        if reference is not None:
            hardware["drift_reference_gib"] = round(reference_gib, 4)
        scale = reference.name if reference is not None else rows  # its nominal's key
        usual = (reference_usual(threads, options.drift_tol, scale)
                 if reference is not None and options.drift_tol > 0 else None)
        hardware["contention_guard"] = (type(guard).__name__ if guard is not None and
                                        options.guard else "off")
        timing = time_steps(step, sync=built.sync, options=options,
                            timer=make_timer(device, built.sync),
                            reduce=world.max if world.distributed else None,
                            guard=guard,
                            reference=reference.sample if reference is not None else None,
                            reference_usual=1.0 / usual if usual else None)
    if isinstance(telemetry, GpuTelemetry):
        hardware.update(telemetry.summary())
    return _Timed(timing=timing, reference=reference, reference_gib=reference_gib, rows=rows,
                  scale=scale, loss=world.mean(float(last[0])))


def _ok_metrics(timed: _Timed, built: Any, workload: Any, world: Any, device: str,
                peak_flops: float, threads: int, hardware: dict[str, Any]) -> dict[str, float]:
    """The metrics of a trial that trained: :func:`~cubicml_lab.timing.summarize` on the
    machine's nominal speed (a contended figure sets no scale), then peak memory less the
    reference's, the loss, the model's size and the reference rows; ``hardware`` gains the
    reference's name."""
    from ..hardware import ReferenceWork, reference_nominal
    from ..timing import peak_memory_gib, reference_metrics, summarize

    timing, reference, rows, scale = timed.timing, timed.reference, timed.rows, timed.scale
    speed = reference_metrics(timing)["reference_speed"]
    nominal = (reference_nominal(speed, threads, rows=scale, first=not timing.contended,
                                 record=world.rank == 0 and not timing.contended)
               if math.isfinite(speed) else math.nan)  # a contended figure sets no scale
    nominal = nominal if math.isfinite(nominal) else None
    metrics = summarize(timing, built.units_per_step, built.flops_per_step, peak_flops,
                        built.n_devices, units=workload.units, reference_nominal=nominal,
                        drift_corrected=_corrects(reference, built.precision))
    metrics.update(peak_mem_gib=world.max(peak_memory_gib(device) - timed.reference_gib),
                   loss=timed.loss, model_params=float(built.model_params),
                   reference_rows=(float(rows) if isinstance(reference, ReferenceWork)
                                   else math.nan))
    if reference is not None:
        hardware["drift_reference"] = (reference.name if isinstance(reference.name, str)
                                       else f"mlp rows={rows}")  # the fp32 MLP's key: rows
    return metrics
