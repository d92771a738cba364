"""The trial, in one place: its statuses, its two records, their JSON codec, and their words.

Every other module imports the trial's vocabulary from here:

* :data:`STATUSES` (a trial's whole life: ``pending``, ``running``, then one of
  :data:`FINISHED`: ``ok``, ``oom``, ``failed``, ``timeout``).
* :class:`TrialResult`: what one run of a trial produced, as a launcher returns it
  (:func:`failure_result` builds one that measured nothing).
* :class:`Trial`: one trial as the store keeps it (its campaign, id, times and status).
* The JSON codec both records use: strict JSON (never pickle), non-finite floats written as the
  strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (:func:`json_safe`, :func:`restore`,
  :func:`dumps`).
* What a record says to a person: its flags (:func:`is_contended`, :func:`figure_flag`), notes
  (:func:`contention_note`, :func:`error_summary`, :func:`trial_log`) and facts
  (:func:`trial_facts`).

Running a trial is not here: the runner lives beside the launchers
(:func:`cubicml_lab.launch.runner.run_trial`), and its result comes back as a record of this
module. Importing this module imports no torch.

Example:
    >>> from cubicml_lab.trials import FINISHED, TrialResult
    >>> r = TrialResult(status="ok", metrics={"tokens_per_s": float("nan")}, hardware={})
    >>> TrialResult.from_json(r.to_json()).status in FINISHED
    True
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import MeasurementError
from .hardware.drift import applied_factor

__all__ = ["FINISHED", "STATUSES", "Trial", "TrialResult", "contention_note", "dumps",
           "failure_result", "figure_flag", "is_contended", "is_stopped_early", "trial_log",
           "json_safe", "restore"]

#: Every trial status, in lifecycle order.
STATUSES = ("pending", "running", "ok", "oom", "failed", "timeout")
#: The statuses a trial ends in (a :class:`TrialResult` has one); it never changes again.
FINISHED = ("ok", "oom", "failed", "timeout")
#: How non-finite floats are written in JSON, and read back.
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def is_contended(metrics: Mapping[str, Any]) -> bool:
    """Whether the contention guard flagged this measurement (``metrics["contended"]`` > 0:
    other work shared the cores while it was timed, so its figure is not to be trusted)."""
    flag = metrics.get("contended", 0)
    return isinstance(flag, (int, float)) and flag > 0


def is_stopped_early(metrics: Mapping[str, Any]) -> bool:
    """Whether the trial's timing stopped once it could not beat the best so far
    (``metrics["stopped_early"]`` > 0; ``Campaign.run(early_stop=True)``): its figure is an
    upper bound on its speed from fewer windows, not a full measurement."""
    flag = metrics.get("stopped_early", 0)
    return isinstance(flag, (int, float)) and not isinstance(flag, bool) and flag > 0


def figure_flag(metrics: Mapping[str, Any], objective: str = "throughput") -> str | None:
    """Why a measured figure must not set the best alone, or None where nothing flags it:
    ``"contended"`` (:func:`is_contended`), ``"stopped early"`` (:func:`is_stopped_early`) or
    ``"no interval"`` (its 95% CI,
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
    if is_stopped_early(metrics):
        return "stopped early"
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
    middle = others[len(others) // 2] if others else 0.0
    # a share that rounds to 0.0 would contradict the flag (windows slowed in short bursts)
    used = (f"other work used {middle:.1f} of {cores or _cores()} cores" if middle >= 0.05
            else f"on {cores or _cores()} cores")
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

    @property
    def devices(self) -> int:
        """Devices the trial held: the launcher's ``world_size`` stored when it started
        (``hardware["devices"]``; GPUs on CUDA, processes on the CPU); 1 where none was stored
        or the stored value is not a positive whole number."""
        n = self.hardware.get("devices") if isinstance(self.hardware, Mapping) else None
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1

    @property
    def device_seconds(self) -> float | None:
        """What the trial cost: :attr:`devices` x its wall-clock seconds from start to end
        (start-up, build, warm-up and timing included); None unless both ends are known."""
        d = self.duration_s
        return None if d is None else self.devices * max(0.0, d)

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
    k = applied_factor(raw, figure)  # from windows each corrected by the references beside them
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
