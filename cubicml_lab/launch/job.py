"""Running a user's command as one trial: start it, read its reports, stop it, judge its end.

Every launcher's trial process calls :func:`cubicml_lab.launch.runner.run_spec` (``InProcess``,
the ``Subprocess``/``Torchrun``/``LocalPool`` worker, a Slurm job): a spec carrying a
``"command"`` (:meth:`~cubicml_lab.workloads.Command.to_spec`) comes here, to
:func:`run_command`, any other to :func:`cubicml_lab.launch.runner.run_trial`. It renders the
job for the trial's config, writes its config file, and starts it under a guard
(:class:`~cubicml_lab.launch.guarded.GuardedProcess`): the job leads its own process group, and
the guard ends that group when the trial process dies, however it dies, so the job never
outlives its trial. While the job runs its
reports are read (:class:`~cubicml_lab.workloads.job_reports.JobReports`); once the figure's CI
target, ``max_steps`` or ``max_time_s`` of timed steps is met, or (a spec with a ``"beat"``: the
campaign's best so far, ``Campaign.run(early_stop=True)``) once its windows show it cannot beat
that (``"losing"``: :func:`~cubicml_lab.timing.policy.losing_step_s`'s bound, by the rule
:func:`~cubicml_lab.timing.steps.is_losing` a built-in workload's timing stops by), the job gets
SIGTERM to its group, then SIGKILL after ``grace_s``, and the trial is ``ok`` (a losing one with
``stopped_early = 1``); on several nodes only node 0's trial stops the job. Otherwise its end is
read from the job itself: out-of-memory words in its output, or SIGKILL with the cgroup's OOM-kill
count up -> ``oom``; a non-zero exit -> ``failed`` with its log tail; no step within ``timeout_s``
or none for ``stall_s`` after the last -> ``timeout``. The record (``hardware["job"]``) keeps the
rendered argv, the config file written, the job's package versions and how it ended; the machine
record is :func:`~cubicml_lab.hardware.host_facts`. Peak memory is what the job reported, else on
the CPU the largest resident set of its processes (when it sets this process's high for its
children). Imports no torch (the job's torch is its own).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CubicMLError, LaunchError
from ..report import ENV_VAR
from .guarded import GuardedProcess
from .process import group_members, new_trial_dir
from .subprocess import log_tail

if TYPE_CHECKING:
    from ..timing import MeasureOptions
    from ..trials import TrialResult

__all__ = ["METRICS_ENV", "PACKAGES", "run_command"]

#: The environment variable naming the metrics file: :data:`cubicml_lab.report.ENV_VAR`.
METRICS_ENV = ENV_VAR
#: Packages whose versions a command trial records, where the job's Python has them.
PACKAGES = ("torch", "transformers", "accelerate", "torchtitan", "lightning",
            "pytorch-lightning", "megatron-core", "nemo-toolkit", "deepspeed", "cubicml-lab")
_POLL_S = 0.02  # how often the job's reports are read
_TAIL_LINES = 40
_OOM_WORDS = re.compile(r"out of memory|OutOfMemoryError|MemoryError|cannot allocate memory|"
                        r"can.t allocate memory|std::bad_alloc|oom-kill", re.IGNORECASE)
_PYTHON = re.compile(r"^python[\d.]*$")


def _is_python(arg: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(arg)))


def _under_torchrun(argv: list[str], options: list[str]) -> list[str]:
    """``argv`` as torchrun's workers: ``python X.py ...`` and ``python -m mod ...`` become
    torchrun's script or module; another program runs with ``--no-python``.

    Raises:
        LaunchError: ``argv`` starts with torchrun itself, or with Python flags.
    """
    head = os.path.basename(argv[0])
    if head in ("torchrun", "torch.distributed.run"):
        raise LaunchError(f"argv {argv[:3]} already starts torchrun, and the Torchrun launcher "
                          "adds it", hint="drop torchrun and its options from argv, or run the "
                                          "command with launch.Subprocess")
    if not _is_python(argv[0]):
        return [sys.executable, "-m", "torch.distributed.run", *options, "--no-python", *argv]
    rest = argv[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return [argv[0], "-m", "torch.distributed.run", *options, "-m", *rest[1:]]
    if not rest or rest[0].startswith("-"):
        raise LaunchError(f"argv {argv[:4]} under Torchrun: python must be followed by a script "
                          "or -m module", hint="e.g. ['python', 'train.py', ...]")
    return [argv[0], "-m", "torch.distributed.run", *options, *rest]


def _own_torchrun(argv: list[str]) -> tuple[int, int]:
    """``(devices, nodes)`` of a command that starts torchrun itself (``torchrun ...`` or
    ``python -m torch.distributed.run ...``), from its ``--nproc-per-node`` and ``--nnodes``
    (the first number of a range); ``(1, 1)`` otherwise or where they are not numbers."""
    head = os.path.basename(argv[0])
    if head != "torchrun" and argv[1:3] != ["-m", "torch.distributed.run"]:
        return 1, 1
    found: dict[str, int] = {}
    for i, arg in enumerate(argv):
        key, _, value = arg.partition("=")
        key = key.replace("_", "-")
        if key in ("--nproc-per-node", "--nnodes"):
            text = value if value else (argv[i + 1] if i + 1 < len(argv) else "")
            first = text.split(":")[0]
            if first.isdigit():
                found.setdefault(key, int(first))
    nodes = found.get("--nnodes", 1)
    return found.get("--nproc-per-node", 1) * nodes, nodes


def _executable(argv0: str, env: dict[str, str], cwd: str | None) -> str | None:
    """Where ``argv0`` is, as the job will look for it; None when there is no such program."""
    if os.sep in argv0:
        path = argv0 if os.path.isabs(argv0) else os.path.join(cwd or os.getcwd(), argv0)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(argv0, path=env.get("PATH", os.defpath))


def _job_python(argv: list[str], env: dict[str, str], cwd: str | None) -> str:
    """The Python the job runs on: ``argv[0]`` if it is one, a ``python`` beside it (a
    virtual environment's ``bin/``), else this one."""
    exe = _executable(argv[0], env, cwd)
    if exe and _is_python(exe):
        return exe
    beside = os.path.join(os.path.dirname(exe), "python") if exe else ""
    return beside if beside and os.access(beside, os.X_OK) else sys.executable


class _Packages:
    """Versions of :data:`PACKAGES` installed for the job's Python, asked in the background (a
    process at the lowest CPU priority, started with the job: it finishes during the job's own
    start-up instead of adding its ~0.4 s after it)."""

    _SCRIPT = ("import importlib.metadata as m, json, sys\nout = {}\nfor n in sys.argv[1:]:\n"
               "    try: out[n] = m.version(n)\n    except Exception: pass\n"
               "print(json.dumps(out))")

    def __init__(self, python: str, env: dict[str, str], cwd: str | None) -> None:
        try:
            self.proc: subprocess.Popen[str] | None = subprocess.Popen(
                [python, "-c", self._SCRIPT, *PACKAGES], stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True, env=env,
                cwd=cwd)
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, 19)
        except OSError:  # no such Python, or the priority could not be lowered
            self.proc = getattr(self, "proc", None)

    def result(self) -> dict[str, str]:
        """The versions found, by package name (those the job's Python has)."""
        if self.proc is None:
            return {}
        try:
            out, _ = self.proc.communicate(timeout=30)
            found = json.loads(out or "{}")
        except (subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait()
            return {}
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def _children_rss_gib() -> float:
    """The largest resident set of any finished (reaped) descendant of this process, in GiB
    (``RUSAGE_CHILDREN``; Linux counts KiB); NaN where unknown."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    except (ImportError, OSError):
        return math.nan


def _oom_kills() -> int | None:
    """This process's cgroup's OOM-kill count (cgroup v2 ``memory.events``), or None."""
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
        events = Path("/sys/fs/cgroup", line.split(":", 2)[2].lstrip("/"), "memory.events")
        for row in events.read_text().splitlines():
            if row.startswith("oom_kill "):
                return int(row.split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return None



class _JobRun:
    """One start of a command's job under its guard, and what became of it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from ..timing import MeasureOptions
        from ..workloads.command import Command
        from ..workloads.job_reports import JobReports

        command = dict(spec["command"]) if isinstance(spec["command"], dict) else {}
        torchrun = command.pop("torchrun", None)
        self.job = Command.from_spec(command)
        self.config = self.job.resolve(spec.get("config"))
        self.options = MeasureOptions.from_dict(spec.get("measure"))
        self.beat = spec.get("beat")  # the best so far, to stop a losing job (or None)
        self.folder = new_trial_dir()
        self.rendered = self.job.render(self.config, trial_dir=self.folder)
        argv = self.rendered.argv
        self.n_devices, self.nodes = _own_torchrun(argv)  # a job that starts torchrun itself
        # on several nodes only node 0 stops the job (the others' jobs end with it): a node
        # that stopped first on its own figures would fail node 0's collectives
        self.lead = not torchrun or int(torchrun.get("node_rank", 0)) == 0
        if torchrun:
            argv = _under_torchrun(argv, [str(o) for o in torchrun.get("options", [])])
            self.n_devices = int(torchrun.get("devices", 1))
            options = [str(o) for o in torchrun.get("options", [])]
            if "--nnodes" in options[:-1]:
                self.nodes = int(options[options.index("--nnodes") + 1])
        self.argv = argv
        self.env = {**os.environ, **self.rendered.env, "PYTHONUNBUFFERED": "1",
                    METRICS_ENV: os.path.join(self.folder, "metrics.jsonl"),
                    "CUBICML_LAB_TRIAL_DIR": self.folder}
        cwd = self.job.cwd
        if cwd is not None and not os.path.isdir(cwd):
            raise LaunchError(f"Command {self.job.name!r}: cwd = {cwd!r} is not a directory",
                              hint="pass cwd= an existing folder, or leave it out")
        if _executable(argv[0], self.env, cwd) is None:
            raise LaunchError(f"Command {self.job.name!r}: executable {argv[0]!r} not found"
                              + ("" if os.sep in argv[0] else " on PATH"),
                              hint="give its full path, or install it; argv[0] is the program")
        self.reports = JobReports(self.job.metrics, self.env[METRICS_ENV],
                                  [os.path.join(self.folder, n) for n in ("stdout.txt",
                                                                          "stderr.txt")],
                                  self.n_devices)
        self.proc: GuardedProcess | None = None
        self.packages: _Packages | None = None  # asked once the job started
        self.left_running: list[int] = []

    def start(self, spec: dict[str, Any]) -> None:
        """Start the job; its config file is written once the guard made the folder."""
        self.proc = GuardedProcess(self.argv, self.folder, self.env, cwd=self.job.cwd)

        def write_config(_record: dict[str, Any]) -> None:
            if self.rendered.config_name and self.rendered.config_text is not None:
                Path(self.folder, self.rendered.config_name).write_text(
                    self.rendered.config_text, encoding="utf-8")

        self.proc.hand_over(json.dumps(spec), write_config)
        self.started = time.monotonic()
        self.packages = _Packages(_job_python(self.argv, self.env, self.job.cwd), self.env,
                                  self.job.cwd)

    def watch(self) -> str:
        """Wait for the job to end or for a reason to stop it: ``"exited"``, ``"gone"``,
        ``"target met"``, ``"max_steps"``, ``"max_time_s"``, ``"losing"`` (it cannot beat the
        spec's ``beat``), ``"no step"``, ``"timeout"`` or ``"stalled"``. Only the lead node
        stops the job on its figures."""
        from ..timing.reported import reported_stop

        assert self.proc is not None
        seen, found = 0, None
        budget = self.options.warmup_budget_s + self.options.max_time_s  # after the 1st step
        while True:
            outcome = self.proc.wait(_POLL_S)
            self.reports.poll()
            if outcome != "timeout":
                return outcome
            now = time.monotonic()
            if self.reports.n_steps != seen:
                seen = self.reports.n_steps
                found = self.reports.slowest(self.options, now - self.started)
                why = reported_stop(found[1], self.judged_by(found[2])) if found else None
                if why and self.lead:
                    return why
            first = self.reports.first_report
            if found and self.lead and now - first > budget:
                return "max_time_s"  # by the clock (a log of rates has no step time to add up)
            if now - self.started > self.job.timeout_s:
                return "timeout" if seen else "no step"
            if seen and now - self.reports.last_report > self.job.stall_s:
                return "stalled"

    def judged_by(self, kind: str) -> MeasureOptions:
        """The options the reports are judged by: :attr:`options` with ``losing_step_s`` from
        the spec's ``beat`` (None without one), in the unit of the windows of ``kind``
        (:meth:`~cubicml_lab.workloads.job_reports.JobReports.durations`), with the units per
        step the job reported so far (all its nodes', as its figures count them)."""
        if self.beat is None:
            return replace(self.options, losing_step_s=None)
        units = self.job.units
        per_step = self.reports.units_per_step(units) * max(1, self.nodes)
        return replace(self.options, losing_step_s=losing_window_s(self.beat, kind, per_step,
                                                                   units))

    def stop(self) -> None:
        """SIGTERM to the job's group, SIGKILL after ``grace_s`` if it still runs."""
        assert self.proc is not None
        if self.proc.exit_code is None:
            self.proc.signal(signal.SIGTERM)
            if self.proc.wait(self.job.grace_s) == "timeout":
                self.proc.signal(signal.SIGKILL)
                self.proc.wait(5.0)
        members = [p for p in group_members(self.proc.pid) if p != self.proc.pid]
        self.left_running = members

    def logs(self) -> str:
        """The last lines of the job's stdout and stderr."""
        out, err = (log_tail(os.path.join(self.folder, n), _TAIL_LINES)
                    for n in ("stdout.txt", "stderr.txt"))
        return "\n".join(t for t in (f"--- stdout ---\n{out}" if out else "",
                                     f"--- stderr ---\n{err}" if err else "") if t)

    def close(self) -> None:
        """The guard removes the folder and ends what is left of the group."""
        if self.proc is not None:
            self.proc.stop()
            self.proc.reap()
        shutil.rmtree(self.folder, ignore_errors=True)


_STOPPED = ("target met", "max_steps", "max_time_s", "losing")


def losing_window_s(beat: Any, kind: str, units_per_step: float, units: str) -> float | None:
    """The window time above which a job cannot beat ``beat`` (the spec's best so far), in the
    unit of its windows: seconds per step, or for a log of rates (``kind == "per_unit"``)
    seconds per token or sample; None where its reports cannot tell (a rate objective with
    ``units_per_step`` unknown, NaN, for step windows; a step-time objective with it unknown,
    for rate windows) or there is nothing to beat. The bound is
    :func:`~cubicml_lab.timing.policy.losing_step_s`'s.

    Example:
        >>> beat = {"objective": "throughput", "value": 100.0}
        >>> losing_window_s(beat, "step_time", 50.0, "samples")  # 50 / (100 * 0.9) s per step
        0.5555555555555556
        >>> losing_window_s(beat, "step_time", float("nan"), "samples") is None
        True
        >>> losing_window_s(beat, "per_unit", float("nan"), "samples")  # 1 / (100 * 0.9)
        0.011111111111111112
    """
    from ..timing.policy import losing_step_s

    if kind != "per_unit":
        return losing_step_s(beat, units_per_step, units)
    per_step = losing_step_s(beat, math.nan, units)  # a step-time objective's bound, or None
    if per_step is not None:
        return per_step / units_per_step if units_per_step > 0 else None
    return losing_step_s(beat, 1.0, units)  # a rate's: one unit per "step"


def _verdict(run: _JobRun, why: str, kills_before: int | None,
             figure: bool) -> tuple[str, str | None]:
    """``(status, error)`` of a job that ended (or was stopped) for ``why``; ``figure``: its
    reports hold a timed window."""
    n, limit = run.reports.n_steps, run.job.timeout_s
    code = run.proc.exit_code if run.proc is not None else None
    left = (f"; process(es) {run.left_running} it left running were killed with its group"
            if run.left_running else "")
    if why in _STOPPED or (figure and (why == "timeout" or (why == "exited" and code == 0))):
        return "ok", None  # stopped on its figure, at its time limit, or it finished
    if why == "no step":
        return "timeout", (f"no step reported within timeout_s = {limit:g} s (the job was still "
                           f"running; is metrics={run.job.metrics} what it writes?)")
    if why == "stalled":
        return "timeout", (f"the job hung: no new step for stall_s = {run.job.stall_s:g} s "
                           f"after {n} step reports")
    if why == "timeout":
        return "timeout", f"{n} step reports within timeout_s = {limit:g} s: too few for a figure"
    if why == "gone" or code is None:
        return "failed", "the job's guard process died" + left
    logs = run.logs()
    if code != 0:
        kills = _oom_kills()
        oom_killed = code == -signal.SIGKILL and None not in (kills, kills_before) \
            and kills > kills_before  # type: ignore[operator]
        how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0
               else f"exited with code {code}")
        if _OOM_WORDS.search(logs) or oom_killed:
            why_oom = "the OOM killer" if oom_killed else "out-of-memory words in its output"
            return "oom", f"the job ran out of memory ({why_oom}); it {how}{left}\n{logs}"
        return "failed", f"the job {how} after {n} step reports{left}\n{logs}"
    if n == 0:
        return "failed", (f"the job exited with code 0 without reporting a step{left} (is "
                          f"metrics={run.job.metrics} what it writes?)\n{logs}")
    return "failed", (f"the job exited with code 0 after {n} step reports: too few for a "
                      f"figure (warm-up, then a window of >= {run.options.window_min_s:g} s)"
                      f"{left}")


def run_command(spec: dict[str, Any]) -> TrialResult:
    """Run a command trial here (see the module docstring); never raises for the trial's own
    failure: a bad spec, a missing program, a job that fails are results with a status."""
    from ..trials import TrialResult, failure_result

    t0 = time.perf_counter()
    try:
        run = _JobRun(spec)
    except CubicMLError as err:
        return failure_result(spec, "failed", str(err), wall_s=time.perf_counter() - t0)
    kills, rss_before = _oom_kills(), _children_rss_gib()
    try:
        run.start(spec)
        why = run.watch()
        run.stop()
        run.reports.finish()
        elapsed = time.monotonic() - run.started
        metrics = run.reports.figures(run.job.units, run.options, elapsed, run.n_devices,
                                      run.nodes)
        status, error = _verdict(run, why, kills, bool(metrics.get("windows")))
        if why == "losing":
            metrics["stopped_early"] = 1.0  # as run_trial marks a built-in workload's
        first = run.reports.first_report
        metrics.update(job_wall_s=elapsed, job_startup_s=first - run.started
                       if math.isfinite(first) else math.nan)
    except (CubicMLError, OSError) as err:  # the guard, or writing the config file, failed
        return failure_result(spec, "failed", f"{type(err).__name__}: {err}",
                              wall_s=time.perf_counter() - t0)
    finally:
        config_text, logs = run.rendered.config_text, run.logs()  # before the folder goes
        run.close()
        rss = _children_rss_gib()  # the job's processes are reaped now; the probe is not yet
        packages = run.packages.result() if run.packages is not None else {}
    peak_from = "reported by the job" if math.isfinite(metrics.get("peak_mem_gib", math.nan)) \
        else None
    if peak_from is None and metrics and str(spec.get("device") or "cpu") == "cpu" \
            and rss > rss_before:  # a new high: this job's largest process set it
        metrics["peak_mem_gib"], peak_from = rss, "the largest resident set of its processes"
    if status == "ok" and not metrics.get("windows"):
        status, error = "failed", f"stopped ({why}) with no timed window"
    from ..hardware import host_facts

    hardware = {**host_facts(str(spec.get("device") or "cpu")), "job": {
        "argv": run.argv, "env": run.rendered.env, "cwd": run.job.cwd,
        "config_file": ({"name": run.rendered.config_name, "text": config_text}
                        if run.rendered.config_name else None),
        "packages": packages,
        "figures_from": run.job.metrics, "ended": why,
        "exit_code": run.proc.exit_code if run.proc is not None else None,
        "left_running": run.left_running, "junk_lines": run.reports.junk,
        "peak_mem_from": peak_from, "log_tail": logs[-4000:]}}
    return TrialResult(status=status, metrics=metrics if status != "failed" else
                       {k: v for k, v in metrics.items() if k.startswith("job_")},
                       hardware=hardware, error=error, workload=run.job.name,
                       workload_version=run.job.version, config=run.config,
                       wall_s=time.perf_counter() - t0)
