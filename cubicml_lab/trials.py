"""The trial, in one place: its statuses, its two records, their JSON codec, and running one.

Every other module imports the trial's vocabulary from here:

* :data:`STATUSES` (a trial's whole life: ``pending``, ``running``, then one of
  :data:`FINISHED`: ``ok``, ``oom``, ``failed``, ``timeout``).
* :class:`TrialResult`: what one run of a trial produced, as a launcher returns it.
* :class:`Trial`: one trial as the store keeps it (its campaign, id, times and status).
* The JSON codec both records use: strict JSON (never pickle), non-finite floats written as the
  strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (:func:`json_safe`, :func:`restore`,
  :func:`dumps`).
* :func:`run_trial`: one measured trial in this process, which every launcher ends up calling.
  It resolves the config (:mod:`cubicml_lab.workloads`), builds the job, times it in steady
  state (:func:`cubicml_lab.timing.time_steps`) and returns a :class:`TrialResult`. A trial's
  own failure (a bad config, an exception, running out of memory, a non-finite loss) is a
  result with status ``"failed"`` or ``"oom"``, never an exception.

A config travels down once (launcher -> :func:`run_trial` -> workload -> timing) and its result
travels back up once. Importing this module imports no torch.

Example:
    >>> from cubicml_lab.trials import FINISHED, TrialResult
    >>> r = TrialResult(status="ok", metrics={"tokens_per_s": float("nan")}, hardware={})
    >>> TrialResult.from_json(r.to_json()).status in FINISHED
    True
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import ConfigError, MeasurementError

__all__ = ["FINISHED", "STATUSES", "Trial", "TrialResult", "contention_note", "dumps",
           "failure_result", "figure_flag", "is_contended", "trial_log",
           "json_safe", "restore", "run_trial"]

#: Every trial status, in lifecycle order.
STATUSES = ("pending", "running", "ok", "oom", "failed", "timeout")
#: The statuses a trial ends in (a :class:`TrialResult` has one); it never changes again.
FINISHED = ("ok", "oom", "failed", "timeout")
#: How non-finite floats are written in JSON, and read back.
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_contended(metrics: Mapping[str, Any]) -> bool:
    """Whether the contention guard flagged this measurement (``metrics["contended"]`` > 0:
    other work shared the cores while it was timed, so its figure is not to be trusted)."""
    flag = metrics.get("contended", 0)
    return isinstance(flag, (int, float)) and flag > 0


def figure_flag(metrics: Mapping[str, Any], objective: str = "throughput") -> str | None:
    """Why a measured figure must not set the best alone, or None where nothing flags it:
    ``"contended"`` (:func:`is_contended`) or ``"no interval"`` (its 95% CI,
    ``{objective}_rel_ci`` else ``step_time_rel_ci``, is NaN or inf: unknown, a figure from
    a single window, shown ``±?``). A figure told without any CI is not flagged (its
    workload reports none).

    Example:
        >>> figure_flag({"throughput": 9.0, "throughput_rel_ci": float("inf")})
        'no interval'
        >>> figure_flag({"throughput": 9.0, "throughput_rel_ci": 0.02}) is None
        True
    """
    if is_contended(metrics):
        return "contended"
    ci = metrics.get(f"{objective}_rel_ci", metrics.get("step_time_rel_ci"))
    if isinstance(ci, (int, float)) and not isinstance(ci, bool) and not math.isfinite(ci):
        return "no interval"
    return None


#: The wait :func:`contention_note` suggests (``MeasureOptions.wait_for_idle_s``), in seconds.
SUGGESTED_IDLE_WAIT_S = 60


def contention_note(trials: Any, *, cores: int | None = None,
                    wait_option: str | None = None) -> str | None:
    """One plain line on the measurements the contention guard flagged, and what to do about
    them; ``None`` when none was flagged. The dashboard, the demo, a :class:`TrialResult`
    and the notebooks all say it with this line.

    Args:
        trials: The measurements: one :class:`TrialResult` or metrics mapping (a single
            measurement), or an iterable of :class:`Trial`, :class:`TrialResult`, metrics
            mappings or rows with a ``status`` (a campaign's table: a pandas DataFrame is read
            row by row); only ``"ok"`` ones count.
        cores: The machine's cores (default: this machine's).
        wait_option: What the reader does to wait for idle cores where they are (default:
            ``'pass measure_options={..., "wait_for_idle_s": 60}'``).

    Example:
        >>> contention_note([{"contended": 1.0, "others_cpu": 1.9}, {"contended": 0.0}],
        ...                 cores=2)[:75]
        '1 of 2 trials shared the CPU with other processes (other work used 1.9 of 2'
        >>> contention_note({"contended": 0.0}) is None
        True
    """
    if hasattr(trials, "to_dict") and not isinstance(trials, Mapping):
        trials = trials.to_dict("records")  # a DataFrame
    if isinstance(trials, (Trial, TrialResult)):
        trials = trials.metrics
    single = isinstance(trials, Mapping)
    rows = [trials] if single else [
        {"status": r.status, **r.metrics} if isinstance(r, (Trial, TrialResult)) else r
        for r in trials]
    rows = [r for r in rows if isinstance(r, Mapping) and r.get("status", "ok") == "ok"]
    flagged = [r for r in rows if is_contended(r)]
    if not flagged:
        return None
    others = sorted(float(r["others_cpu"]) for r in flagged
                    if _finite(r.get("others_cpu")))
    used = (f"other work used {others[len(others) // 2]:.1f} of {cores or _cores()} cores"
            if others else f"on {cores or _cores()} cores")
    if single:
        beside = trials.get("contended_windows")
        used += f"; {_windows(beside)} timed beside them" if _finite(beside) else ""
        head = (f"This measurement shared the CPU with other processes ({used}): its figure "
                "is flagged and weighs less in a search")
    elif len(flagged) == len(rows):
        head = (f"{len(flagged)} of {len(rows)} trials shared the CPU with other processes "
                f"({used}): every figure is flagged, so the best and any speed-up are rough "
                "guesses")
    else:
        head = (f"{len(flagged)} of {len(rows)} trials shared the CPU with other processes "
                f"({used}): their figures are flagged, weigh less in the search and are not "
                "counted as best")
    return f"{head}; {_idle_advice(flagged, wait_option, 'it' if single else 'of them')}."


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


def _idle_advice(flagged: list[Mapping[str, Any]], wait_option: str | None, who: str) -> str:
    """What to do about flagged measurements: close other programs or wait for idle cores;
    where they already waited in vain, find what keeps the cores busy (``who``: "it" for a
    single measurement, else "of them", after their count)."""
    waited = [r for r in flagged if _finite(r.get("idle_wait_s"))]
    vain = [r for r in waited if r.get("idle_timed_out") == 1.0]
    if vain:
        longest = max(float(r["idle_wait_s"]) for r in vain)
        waited = "it" if who == "it" else f"{len(vain)} {who}"
        return (f"{waited} waited {longest:.0f} s for idle cores in vain: stop what keeps the "
                "cores busy (see `top`) or wait longer")
    option = wait_option or ('pass measure_options={..., "wait_for_idle_s": '
                             f'{SUGGESTED_IDLE_WAIT_S}}}')
    return (f"close other programs, or {option} to wait up to {SUGGESTED_IDLE_WAIT_S} s for "
            "idle cores before each trial")


# -- the JSON codec ---------------------------------------------------------------------------
def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats replaced by ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
    (mappings and sequences walked; keys made strings), ready for strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def restore(value: Any) -> Any:
    """The inverse of :func:`json_safe`: the strings it wrote become floats again."""
    if isinstance(value, str):
        return NONFINITE.get(value, value)
    if isinstance(value, Mapping):
        return {key: restore(item) for key, item in value.items()}
    if isinstance(value, list):
        return [restore(item) for item in value]
    return value


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """Compact strict JSON text of ``value`` (through :func:`json_safe`; never NaN tokens)."""
    return json.dumps(json_safe(value), allow_nan=False, ensure_ascii=False,
                      separators=(",", ":"), sort_keys=sort_keys)


# -- the records ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TrialResult:
    """What one trial produced; failures are data (a status and an error), never exceptions.

    Attributes:
        status: One of :data:`FINISHED`: ``"ok"``, ``"oom"``, ``"failed"``, ``"timeout"``.
        metrics: Measured values by name (see :func:`cubicml_lab.timing.summarize`; plus
            ``peak_mem_gib`` and ``loss``); empty unless something was measured.
        hardware: Description of the machine (see :func:`cubicml_lab.hardware.hardware_info`).
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
        if self.status not in FINISHED:
            raise MeasurementError(f"TrialResult status = {self.status!r} is not one of "
                                   f"{', '.join(FINISHED)}", hint="use one of the listed statuses")

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
        kw["metrics"] = restore(dict(d.get("metrics") or {}))
        kw["hardware"] = dict(d.get("hardware") or {})
        kw["config"] = dict(d.get("config") or {})
        return cls(**kw)

    def _facts(self) -> list[tuple[str, Any]]:
        return trial_facts(self.status, self.metrics, self.hardware, self.config, self.error,
                           wall_s=self.wall_s)

    def __str__(self) -> str:
        head = f"TrialResult {self.workload}".rstrip()
        return head + "\n" + "\n".join(f"  {k}: {v}" for k, v in self._facts())

    def _repr_html_(self) -> str:
        from ._html import card

        return card(f"TrialResult · {self.workload or 'trial'}", self._facts(),
                    note="all metrics: result.metrics; the machine: result.hardware")

    def to_json(self) -> str:
        """Strict JSON text (no bare NaN/Infinity: they are written as strings)."""
        return dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> TrialResult:
        """Parse :meth:`to_json` output."""
        return cls.from_dict(json.loads(s))


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One trial as the store keeps it: a configuration, what became of it, where it ran.

    Attributes:
        campaign: Name of the campaign the trial belongs to.
        id: Store-wide trial id (unique in one store file, assigned on insert).
        config: Knob name -> JSON scalar (the searched parameters, not derived values).
        status: One of :data:`STATUSES`.
        metrics: Measured values, e.g. ``tokens_per_s``, ``step_time_s``, ``peak_mem_gib``.
        hardware: Description of the machine the trial ran on (may be nested).
        workload: Workload name, e.g. ``"gpt"``.
        workload_version: Version string of the workload code.
        created_at: When the trial was added, unix seconds.
        started_at: When it started running, unix seconds; None if it never ran.
        ended_at: When it reached a final status, unix seconds; None until then.
        error: Error text of a failed trial; None otherwise.
    """

    campaign: str
    id: int
    config: dict[str, Any]
    status: str
    metrics: dict[str, Any]
    hardware: dict[str, Any]
    workload: str
    workload_version: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    error: str | None

    @property
    def duration_s(self) -> float | None:
        """Wall-clock seconds from start to end; None unless both are known."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    def _facts(self) -> list[tuple[str, Any]]:
        return trial_facts(self.status, self.metrics, self.hardware, self.config, self.error,
                           duration_s=self.duration_s)

    def __str__(self) -> str:
        head = f"Trial {self.id} of {self.campaign!r} · {self.workload}".rstrip(" ·")
        return head + "\n" + "\n".join(f"  {k}: {v}" for k, v in self._facts())

    def _repr_html_(self) -> str:
        from ._html import card

        return card(f"Trial {self.id} · {self.campaign} · {self.workload}", self._facts(),
                    note="all metrics: trial.metrics; the machine: trial.hardware")


def failure_result(spec: Mapping[str, Any], status: str, error: str, *, wall_s: float = 0.0,
                   hardware: Mapping[str, Any] | None = None) -> TrialResult:
    """The result of a trial that measured nothing: ``status`` and ``error``, no metrics.

    Args:
        spec: The trial spec (``workload``, ``config``, ``device``).
        status: ``"failed"``, ``"oom"`` or ``"timeout"``.
        error: What happened, for a person.
        wall_s: Seconds the trial took.
        hardware: The machine record; default :func:`~cubicml_lab.hardware.host_record` of this
            host *as a CPU* (never a CUDA query, which would create a CUDA context here), with
            the spec's device.
    """
    if hardware is None:
        from .hardware import host_record

        hardware = {**host_record("cpu"), "device": spec.get("device") or "cpu"}
    config = spec.get("config")
    return TrialResult(status=status, metrics={}, hardware=dict(hardware), error=error,
                       workload=str(spec.get("workload") or ""),
                       config=dict(config) if isinstance(config, Mapping) else {}, wall_s=wall_s)


def error_summary(error: str | None, width: int = 120) -> str:
    """The line of a trial's ``error`` a person reads first: its first line, which the
    launchers and :func:`failure_result` write as the summary (what happened, then the stderr
    tail or traceback), or the last line of an error that is a bare Python traceback (its
    exception); ``""`` for none. Cut to ``width`` characters.

    Example:
        >>> error_summary("timed out after 8.0 s (timeout_s = 8)\\n--- last lines of stderr "
        ...               "---\\nstep 12")
        'timed out after 8.0 s (timeout_s = 8)'
        >>> error_summary("Traceback (most recent call last):\\n  File ...\\nValueError: bad")
        'ValueError: bad'
    """
    lines = [line for line in (error or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return line.strip()[:width]



def trial_log(error: str | None, hardware: Mapping[str, Any] | None) -> str:
    """What a person reads to learn why a trial ended as it did: its ``error`` (summary line,
    then the stderr tail or traceback) and, for a command workload, the last lines its job
    printed (``hardware["job"]["log_tail"]``) and the argv it ran; ``""`` when there is neither.

    Example:
        >>> print(trial_log("failed: exit 1", {"job": {"argv": ["python", "t.py"],
        ...                                             "log_tail": "OSError: disk full"}}))
        failed: exit 1
        --- the job: python t.py ---
        OSError: disk full
    """
    parts = [(error or "").strip()]
    job = (hardware or {}).get("job")
    if isinstance(job, Mapping):
        argv = job.get("argv")
        tail = str(job.get("log_tail") or "").strip()
        cmd = " ".join(str(a) for a in argv) if isinstance(argv, list) else "its output"
        parts.append(f"--- the job: {cmd} ---")
        if tail and tail not in parts[0]:  # the error may hold the tail already
            parts.append(tail)
    return "\n".join(p for p in parts if p)

# -- running one trial in this process --------------------------------------------------------
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

    from .hardware import (
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
    from .hardware import StepReference

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
    from .hardware import REFERENCE_PRECISIONS

    return precision if precision in REFERENCE_PRECISIONS else "fp32"


def _corrects(reference: Any, precision: str) -> bool:
    """Whether a trial whose matmuls run in ``precision`` takes its drift-corrected figure as
    its default one (:data:`~cubicml_lab.timing.DRIFT_CORRECTED_DEFAULT`): only over a
    reference that runs in the same precision. On a 2-core AVX2 VM (2026-11-27, 3 runs of
    ``benchmarks/measure_repeatability.py``, 5 fresh processes each), gpt's bf16 configuration
    spread 3.1%, 8.4% and 4.6% raw but 4.6%, 14.6% and 10.8% over the fp32 reference, whose
    drift it followed with a slope of -0.24 to 0.31; ``throughput_corrected`` is still stored.
    Until 2026-11-28 the MLP ran in fp32 only, so bf16 trials kept their raw figures. On a
    2-core VM whose CPU has bf16 instructions (AMD EPYC with AVX512_BF16), that cost them: a
    demo trial's two fresh processes lay a median 9.6% apart raw, 2.8% over their fp32
    reference (16 bf16 trials). Over the MLP in bf16 (:func:`_mlp_precision`), 4 bf16 gpt
    configurations x 5 fresh processes, interleaved with the code before, spread a median
    2.4% (1.1-3.8%) against 7.2% raw (5.5-19.3%) and 4.0% over the fp32 reference
    (``benchmarks/ab_revisions.py --configs``). In 4 demo campaigns interleaved with 4 of the code
    before (``benchmarks/ab_revisions.py --demo 4``), a bf16 configuration measured in 3 or
    more of them varied less across them (standard deviation of the log figure 2.2% against
    3.0% raw, lower for 7 of 8), but the leave-one-out tau did not rise: 0.848, 0.733, 0.758,
    0.745 against 0.818, 0.818, 0.758, 0.939, its top configurations lying 1-3% apart.
    """
    from .timing import DRIFT_CORRECTED_DEFAULT

    return DRIFT_CORRECTED_DEFAULT and getattr(reference, "precision", "fp32") == precision


def _build_and_time(workload: Any, config: dict[str, Any], options: Any, device: str,
                    world: Any, hardware: dict[str, Any]
                    ) -> tuple[str, dict[str, float], str | None]:
    """Build the job, time it in steady state, and summarise: ``(status, metrics, error)``.

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

    from .hardware import (
        GpuTelemetry,
        ReferenceWork,
        establish_reference_scale,
        mlp_reference_gauges,
        reference_nominal,
        reference_rows,
        reference_usual,
        resident_gib,
    )
    from .timing import (
        device_peak_flops,
        make_timer,
        peak_memory_gib,
        reference_metrics,
        reset_peak_memory,
        summarize,
        time_steps,
    )

    peak_flops = device_peak_flops(device, config.get("precision", "fp32"))
    threads = torch.get_num_threads()
    ref_config = workload.drift_reference_for(config)  # None: the MLP
    mlp_precision = _mlp_precision(config.get("precision", "fp32"))
    if not device.startswith("cuda") and options.reference_share > 0:
        # the nominal speeds of every reference on this trial's reference's scale, where any is
        # missing (once per machine and thread count), before the trial's peak-memory period
        if ref_config is None:  # the MLP's sizes (and its fp32 ones: one scale)
            establish_reference_scale(threads, gauges=mlp_reference_gauges(mlp_precision))
        elif len(workload.drift_references) > 1:
            establish_reference_scale(threads, gauges={
                _reference_name(workload, c): functools.partial(_step_reference, workload, c)
                for c in workload.drift_references})
    reset_peak_memory(device)
    built = workload.build(config, device, world)
    hardware["parallel"] = dict(built.parallel)
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
    loss = world.mean(float(last[0]))
    if not math.isfinite(loss):
        return "failed", {}, (f"loss is not finite ({loss}) after {timing.warmup_steps} warm-up "
                              f"and {timing.steps_timed} timed steps: training diverged (lr = "
                              f"{config.get('lr')!r}?); the step time of a diverged run is not "
                              "reported")
    speed = reference_metrics(timing)["reference_speed"]
    nominal = (reference_nominal(speed, threads, rows=scale, first=not timing.contended,
                                 record=world.rank == 0 and not timing.contended)
               if math.isfinite(speed) else math.nan)  # a contended figure sets no scale
    nominal = nominal if math.isfinite(nominal) else None
    metrics = summarize(timing, built.units_per_step, built.flops_per_step, peak_flops,
                        built.n_devices, units=workload.units, reference_nominal=nominal,
                        drift_corrected=_corrects(reference, built.precision))
    metrics.update(peak_mem_gib=world.max(peak_memory_gib(device) - reference_gib), loss=loss,
                   model_params=float(built.model_params),
                   reference_rows=(float(rows) if isinstance(reference, ReferenceWork)
                                   else math.nan))
    if reference is not None:
        hardware["drift_reference"] = (reference.name if isinstance(reference.name, str)
                                       else f"mlp rows={rows}")  # the fp32 MLP's key: rows
    return "ok", metrics, None


def trial_facts(status: str, metrics: Mapping[str, Any], hardware: Mapping[str, Any],
                config: Mapping[str, Any], error: str | None, **last: Any
                ) -> list[tuple[str, Any]]:
    """What a person looks at first of a trial, as ``(label, value)`` pairs: status, the
    figures and their CIs, whether the guard flagged it, how a drift-corrected figure came
    from the raw one, a repeated trial's processes, the configuration, then ``last`` (e.g.
    ``wall_s``) and the error's last line."""
    m = metrics
    facts: list[tuple[str, Any]] = [("status", status)]
    for key in ("tokens_per_s", "samples_per_s", "throughput_rel_ci", "step_time_s",
                "step_time_rel_ci", "peak_mem_gib", "achieved_tflops", "mfu"):
        if key in m:
            unknown = isinstance(m[key], (int, float)) and not math.isfinite(m[key])
            if unknown and key.endswith("_rel_ci"):
                facts.append((key, f"unknown ({_windows(m.get('windows'))}: too few for a CI)"))
            elif unknown and key == "mfu":
                facts.append((key, "unknown (no peak FLOP/s for this device: on a CPU it is "
                                   "measured on idle cores only)"))
            else:
                facts.append((key, m[key]))
    if _finite(m.get("windows")):
        facts.append(("timed", f"{_windows(m.get('steps_timed'), 'step')} in "
                               f"{_windows(m['windows'])}"))
    if is_contended(m):
        facts.append(("contended", contention_note(m)))
    if _finite(m.get("idle_wait_s")) and m["idle_wait_s"] >= 1:
        facts.append(("waited", f"{m['idle_wait_s']:.0f} s for idle cores"
                      + (" in vain" if m.get("idle_timed_out") == 1.0 else "")))
    drift = _drift_fact(m)
    if drift:
        facts.append(("drift", drift))
    each = hardware.get("processes")
    if isinstance(each, list) and len(each) > 1:
        facts.append(("processes", _processes_fact(each)))
    if config:
        facts.append(("config", ", ".join(f"{k}={v}" for k, v in config.items())))
    facts.extend((k, round(v, 2) if isinstance(v, float) else v)
                 for k, v in last.items() if v is not None)
    if error:
        facts.append(("error", error.strip().splitlines()[-1][:200]))
    return facts


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _drift_fact(m: Mapping[str, Any]) -> str | None:
    """How a drift-corrected figure came from the raw one, for a person; None where the figure
    is raw."""
    raw, figure = m.get("throughput_raw"), m.get("throughput")
    if m.get("drift_corrected") != 1.0 or not (_finite(raw) and _finite(figure)):
        return None
    k = figure / raw  # from windows each corrected by the reference samples next to it
    ran = "slower than" if k > 1.005 else "faster than" if k < 0.995 else "at"
    return (f"corrected x{k:.2f} from the raw {raw:,.0f}/s to the machine's nominal speed "
            f"(its drift reference ran {ran} nominal)")


def _processes_fact(each: list[Any]) -> str:
    """A repeated trial's processes, for a person: each one's figure, how far apart, which kept."""
    figs = [p.get("throughput") if isinstance(p, Mapping) else None for p in each]
    shown = ", ".join((f"{x:,.0f}" if _finite(x) else "?")
                      + (" (kept)" if isinstance(p, Mapping) and p.get("kept") else "")
                      for x, p in zip(figs, each))
    ok = [x for x in figs if _finite(x)]
    apart = (f"; {100 * (max(ok) - min(ok)) / min(ok):.1f}% apart" if len(ok) > 1 else "")
    return f"{len(each)} fresh processes: {shown}{apart}"


def _windows(n: Any, word: str = "window") -> str:
    """``n`` timed windows (or other words) in words: "1 window", "3 windows", "2 steps"."""
    n = n if isinstance(n, (int, float)) and math.isfinite(n) else 0
    return f"{n:.0f} {word}{'' if n == 1 else 's'}"


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
    from .hardware import tune_cpu_allocator
    from .timing import MeasureOptions, hardware_info, host_record, peak_memory_gib
    from .workloads import get
    from .workloads.parallel import World, close_world, init_world

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
                                                 hardware)
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
        gc.collect()  # the model and its tensors went with _build_and_time's frame
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
