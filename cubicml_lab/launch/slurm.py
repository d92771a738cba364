"""Run each trial as its own Slurm job, through submitit.

:class:`Slurm` submits one job per trial with submitit's Slurm executor (no sbatch templating of
our own): the job calls :func:`cubicml_lab.launch.runner.run_trial` on the spec and writes the
:class:`~cubicml_lab.trials.TrialResult` as JSON in its folder, which the launcher parses back
with ``TrialResult.from_json``; no result is ever unpickled here. The launcher waits
for the job by asking ``sacct`` (Slurm's accounting, which the cluster must run: submitit needs it
too), reading the job line *and* its steps, since under ``srun`` only step ``.0`` may say
``OUT_OF_MEMORY``. Slurm's end states become statuses:

* ``COMPLETED``: the trial's own result (``ok``, or ``oom``/``failed`` as the trial found);
* ``OUT_OF_MEMORY`` (the job or any step; a cgroup memory limit, ``mem_gib``) -> ``oom``;
  so is a ``FAILED`` job whose stderr holds slurmstepd's "oom-kill event" line or whose step was
  killed by ``SIGKILL`` (sacct's ``ExitCode`` ``0:9``): Slurm's cgroup v1 OOM notice races the
  step's end, and a kill it misses is recorded as ``FAILED``;
* ``TIMEOUT`` (past ``time_limit_min``; Slurm checks limits about every 30 s) -> ``timeout``;
* ``FAILED``, ``CANCELLED``, ``BOOT_FAIL``, ``DEADLINE`` -> ``failed`` with the logs' tail;
* ``NODE_FAIL``, ``PREEMPTED`` -> submitted again, up to ``max_requeue`` times, then ``failed``.

The result's ``hardware["slurm"]`` holds the job id, its log paths, its end state, the attempts,
and the overhead the trial paid to go through Slurm: ``submit_to_start_s`` (from ``sbatch`` to the
job's Python calling the trial) and ``end_to_result_s`` (from the trial's end to its result back
here). Unlike the local launchers, a job outlives a caller that is killed (Slurm owns it); the
caller's :meth:`Slurm.cancel`, or a ``KeyboardInterrupt`` while it waits, cancels it, and
:meth:`Slurm.attach` follows a job that an earlier caller submitted (a campaign restarted after
its notebook died collects its jobs instead of launching them again).

Multi-process trials (``nodes * nproc_per_node > 1``): the job runs ``tasks_per_node`` srun tasks
on each node (default one), and each task starts ``torchrun`` with
``nproc_per_node / tasks_per_node`` workers, its task rank as torchrun's node rank, and a static
rendezvous on the job's first node (the port follows from the job id). The workers agree on the
slowest rank's figures as under :class:`~cubicml_lab.launch.Torchrun`, and task 0 writes the
result.

submitit is imported only when a trial is submitted: ``pip install -e '.[slurm]'``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._bounds import check_count, check_word
from .._params import brief
from ..errors import ConfigError, DependencyError, LaunchError
from ._sacct import last_stderr, log_tail, missed_oom, sacct_states
from ._slurm_job import RESULT_FILE, job_main
from .base import MAX_NODES, MAX_PROCS_PER_NODE, Launcher, check_spec

if TYPE_CHECKING:
    from ..trials import TrialResult

__all__ = ["Slurm"]

# A queued job's pickle names the function it runs by module and name: keep this one importable.
_job_main = job_main

_RUNNING = {"PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "COMPLETING",
            "CONFIGURING", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", ""}
_REQUEUE = {"NODE_FAIL", "PREEMPTED"}
_SACCT_PATIENCE_S = 300.0  # a job whose state sacct cannot tell for this long is an error
REQUEUED_FILE = "cubicml_requeued_as.json"  # in a failed job's folder: the job that replaced it
_SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")  # an sbatch long option's name
_MAX_LINES = 1000  # setup lines, extra sbatch options
_MAX_MINUTES = 366 * 24 * 60  # a job's time limit: a year
_MAX_CPUS = 65536  # CPUs per node
_MAX_MEM_GIB = float(1 << 20)  # memory per node: 1 PiB


def _submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise DependencyError("launch.Slurm submits jobs through submitit, which is not "
                              "installed", hint="pip install -e '.[slurm]'") from None
    return submitit


def _int(name: str, value: Any, low: int, high: int, *, none_ok: bool = False,
         why: str = "") -> Any:
    if value is None and none_ok:
        return None
    return check_count(f"Slurm {name}", value, low=low, high=high, error=ConfigError, why=why)


def _word(name: str, value: Any, *, none_ok: bool = True) -> str | None:
    """A value that becomes a word of the sbatch script: a non-empty str with no control
    character (submitit quotes it where it becomes a word)."""
    if value is None and none_ok:
        return None
    if not check_word(f"Slurm {name}", value, error=ConfigError):
        raise ConfigError(f"Slurm {name} = '' must be a non-empty string",
                          hint=f"give {name} a value or leave it out")
    return value


def _extra_sbatch(options: Any) -> dict[str, Any]:
    """``extra_sbatch`` checked: option names as sbatch spells them, values that stay on their
    ``#SBATCH`` line (a str without control characters, a number, or ``True`` for a flag)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ConfigError(f"Slurm extra_sbatch = {brief(options)} must be a dict of sbatch "
                          "options", hint='e.g. {"constraint": "a100"}')
    _int("extra_sbatch (number of options)", len(options), 0, _MAX_LINES)
    for key, value in options.items():
        if not (isinstance(key, str) and _SBATCH_OPTION.fullmatch(key)):
            raise ConfigError(f"Slurm extra_sbatch: {brief(key)} is not an sbatch option name",
                              hint="letters, digits, - and _, e.g. constraint or mail_type")
        if isinstance(value, str):
            _word(f"extra_sbatch[{key!r}]", value)
        elif value is not True and (isinstance(value, bool) or not isinstance(
                value, (int, float)) or not math.isfinite(value)):
            raise ConfigError(f"Slurm extra_sbatch[{key!r}] = {brief(value)} must be a string, "
                              "a number or True (a flag)", hint='e.g. {"exclusive": True}')
    return dict(options)


def _setup(lines: Any) -> list[str]:
    """``setup`` checked: a list of shell lines, each one line (no control character)."""
    if lines is None:
        return []
    if not isinstance(lines, list):
        raise ConfigError(f"Slurm setup = {brief(lines)} must be a list of shell lines",
                          hint='e.g. ["module load cuda", "conda activate lab"]')
    _int("setup (number of lines)", len(lines), 0, _MAX_LINES)
    for i, line in enumerate(lines):
        check_word(f"Slurm setup[{i}]", line, error=ConfigError,
                   hint="one shell line per item, e.g. \"module load cuda\"")
    return list(lines)


class Slurm(Launcher):
    """Run each trial as one Slurm job (submitit), and map Slurm's end state to its status.

    Args:
        partition, account, qos: ``sbatch --partition/--account/--qos``; ``None``: the
            cluster's default.
        time_limit_min: The job's time limit in minutes; past it the trial is ``timeout``.
        nodes: Nodes per job; more than one runs torchrun on each, rendezvous on the first.
        gpus_per_node: GPUs per node (``--gpus-per-node``); 0 for none.
        cpus_per_node: CPUs per node, split over its tasks (``--cpus-per-task``); ``None``: the
            cluster's default.
        mem_gib: Memory per node in GiB (``--mem``); past it the trial is ``oom``. ``None``:
            the cluster's default.
        nproc_per_node: Trial processes per node (torchrun workers when ``nodes *
            nproc_per_node > 1``; on GPUs one per GPU).
        tasks_per_node: srun tasks per node, each a torchrun agent with ``nproc_per_node /
            tasks_per_node`` workers (default 1: one agent per node).
        extra_sbatch: Further sbatch options, e.g. ``{"constraint": "a100"}``: names of
            letters, digits, ``-`` and ``_``; values a string, a number or ``True`` (a flag).
        setup: Shell lines run before the trial, e.g. ``["module load cuda"]``: a recipe,
            which a campaign file names only with the user's consent.
        folder: Where submitit writes job scripts, logs and results (one folder per job id).
        max_requeue: Times a trial is submitted again after ``NODE_FAIL`` or ``PREEMPTED``.
        poll_s: Seconds between two ``sacct`` queries while a job runs.

    Every value that becomes part of the generated sbatch script (partition, account, qos,
    folder, extra options, setup lines) is refused here if it holds a control character (a
    line break would start a line of its own), and submitit quotes each option's value as one
    word; every count is bounded (nodes 4096, processes or GPUs per node 1024).

    Raises:
        ConfigError: A bad or out-of-range option; the message names it and the limit.

    Example:
        >>> Slurm(partition="gpu", time_limit_min=30, mem_gib=16).describe()["partition"]
        'gpu'
    """

    def __init__(self, partition: str | None = None, account: str | None = None,
                 qos: str | None = None, time_limit_min: int = 60, nodes: int = 1,
                 gpus_per_node: int = 0, cpus_per_node: int | None = None,
                 mem_gib: float | None = None, nproc_per_node: int = 1,
                 tasks_per_node: int = 1, extra_sbatch: dict[str, Any] | None = None,
                 setup: list[str] | None = None,
                 folder: str | Path = "runs/slurm", max_requeue: int = 2,
                 poll_s: float = 1.0) -> None:
        self.partition = _word("partition", partition)
        self.account = _word("account", account)
        self.qos = _word("qos", qos)
        self.time_limit_min = _int("time_limit_min", time_limit_min, 1, _MAX_MINUTES,
                                   why="a year")
        self.nodes = _int("nodes", nodes, 1, MAX_NODES)
        self.gpus_per_node = _int("gpus_per_node", gpus_per_node, 0, MAX_PROCS_PER_NODE)
        self.cpus_per_node = _int("cpus_per_node", cpus_per_node, 1, _MAX_CPUS, none_ok=True)
        self.nproc_per_node = _int("nproc_per_node", nproc_per_node, 1, MAX_PROCS_PER_NODE,
                                   why="the most one cluster node may run")
        self.tasks_per_node = _int("tasks_per_node", tasks_per_node, 1, self.nproc_per_node,
                                   why="at most one task per process")
        self.max_requeue = _int("max_requeue", max_requeue, 0, 100)
        _int("nodes * tasks_per_node", self.nodes * self.tasks_per_node, 1, MAX_NODES,
             why="each task is one torchrun agent, and a job has at most that many")
        if self.nproc_per_node % self.tasks_per_node:
            raise ConfigError(
                f"Slurm nproc_per_node = {nproc_per_node} must be a multiple of tasks_per_node = "
                f"{tasks_per_node}", hint="each srun task starts the same number of workers, "
                "e.g. nproc_per_node=8, tasks_per_node=1")
        if mem_gib is not None and (isinstance(mem_gib, bool) or not isinstance(
                mem_gib, (int, float)) or not 0 < mem_gib <= _MAX_MEM_GIB):
            raise ConfigError(f"Slurm mem_gib = {brief(mem_gib)} must be a number in "
                              f"(0, {_MAX_MEM_GIB:,.0f}] or None", hint="e.g. Slurm(mem_gib=16)")
        self.mem_gib = mem_gib
        self.extra_sbatch = _extra_sbatch(extra_sbatch)
        self.setup = _setup(setup)
        if isinstance(poll_s, bool) or not isinstance(poll_s, (int, float)) \
                or not 0 < poll_s < math.inf:
            raise ConfigError(f"Slurm poll_s = {brief(poll_s)} must be a number > 0",
                              hint="e.g. poll_s=1")
        self.poll_s = float(poll_s)
        if not isinstance(folder, (str, os.PathLike)):
            raise ConfigError(f"Slurm folder = {brief(folder)} must be a path",
                              hint="e.g. folder='runs/slurm'")
        self.folder = Path(str(_word("folder", os.fspath(folder), none_ok=False)))
        self._lock = threading.Lock()
        self._jobs: dict[str, Any] = {}

    @property
    def world_size(self) -> int:
        """Processes in each job: ``nodes * nproc_per_node``."""
        return self.nodes * self.nproc_per_node

    def describe(self) -> dict[str, Any]:
        """The launcher kind and its options as plain JSON."""
        return {"kind": "slurm", "partition": self.partition, "account": self.account,
                "qos": self.qos, "time_limit_min": self.time_limit_min, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "cpus_per_node": self.cpus_per_node,
                "mem_gib": self.mem_gib, "nproc_per_node": self.nproc_per_node,
                "tasks_per_node": self.tasks_per_node, "extra_sbatch": dict(self.extra_sbatch),
                "setup": list(self.setup),
                "folder": str(self.folder), "max_requeue": self.max_requeue,
                "poll_s": self.poll_s}

    def sbatch_parameters(self) -> dict[str, Any]:
        """The parameters given to submitit's ``SlurmExecutor.update_parameters``."""
        params: dict[str, Any] = {"job_name": "cubicml-trial", "time": self.time_limit_min,
                                  "nodes": self.nodes, "ntasks_per_node": self.tasks_per_node,
                                  "signal_delay_s": 0}  # past the limit: TIMEOUT, not FAILED
        for key in ("partition", "account", "qos"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        if self.cpus_per_node:
            params["cpus_per_task"] = max(1, self.cpus_per_node // self.tasks_per_node)
        if self.mem_gib is not None:
            params["mem"] = f"{max(1, round(self.mem_gib * 1024))}M"
        if self.setup:
            params["setup"] = list(self.setup)
        # Slurm's own requeue of a failed node's job would run the trial twice: this launcher
        # submits it again itself (up to max_requeue) and follows the new job
        params["additional_parameters"] = {"no_requeue": True, **self.extra_sbatch}
        return params

    def cancel(self) -> None:
        """Cancel the jobs of the trials this launcher is running or following (``scancel``)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel(check=False)

    def cancel_job(self, job_id: str) -> None:
        """Cancel one job by id (and the job that replaced it after a node failure, if any)."""
        subprocess.run(["scancel", self._latest(str(job_id))[0]], capture_output=True,
                       timeout=30, check=False)

    def run(self, spec: dict[str, Any], *,
            on_start: Callable[[dict[str, Any]], None] | None = None) -> TrialResult:
        """Submit the trial as a job, wait for it, and return its result.

        Args:
            spec: The trial spec (see :mod:`cubicml_lab.launch.base`).
            on_start: Called once the job is submitted, with this process's record
                (:func:`~cubicml_lab.launch.process.trial_record`) and ``slurm_job_id``; if it
                raises, the job is cancelled and the exception propagates.

        Raises:
            ConfigError: The spec is invalid.
            DependencyError: submitit is not installed.
            LaunchError: ``sbatch`` refused the job (the message says why).
        """
        spec = check_spec(spec)
        _submitit()
        submitted_at = time.time()
        job = self._submit(spec)
        return self._see_through(spec, job, 0, submitted_at, on_start)

    def attach(self, job_id: str, spec: dict[str, Any], *,
               on_start: Callable[[dict[str, Any]], None] | None = None) -> TrialResult:
        """Follow a job an earlier caller submitted for ``spec``, and return its result.

        A job still queued or running is waited for; one that has ended is collected (a node
        failure is submitted again, as :meth:`run` does, counting the attempts already made).
        Nothing is submitted for a job that ran.

        Args:
            job_id: The job's id, as ``on_start`` gave it to the earlier caller.
            spec: The trial spec that job runs.
            on_start: Called at once with this process's record and ``slurm_job_id``.
        """
        spec = check_spec(spec)
        submitit = _submitit()
        job_id, attempt = self._latest(str(job_id))
        job = submitit.SlurmJob(folder=self.folder / "%j", job_id=job_id)
        with self._lock:
            self._jobs[job_id] = job
        return self._see_through(spec, job, attempt, None, on_start)

    def _latest(self, job_id: str) -> tuple[str, int]:
        """The job that last replaced ``job_id`` after node failures, and how many did."""
        attempt = 0
        while (path := self.folder / job_id / REQUEUED_FILE).exists() and attempt < 100:
            job_id, attempt = str(json.loads(path.read_text())["job_id"]), attempt + 1
        return job_id, attempt

    def _see_through(self, spec: dict[str, Any], job: Any, attempt: int,
                     submitted_at: float | None,
                     on_start: Callable[[dict[str, Any]], None] | None) -> TrialResult:
        """Wait for ``job``; submit it again after a node failure (up to ``max_requeue``)."""
        while True:
            try:
                if on_start is not None:
                    from .process import trial_record

                    on_start({**trial_record(), "slurm_job_id": str(job.job_id)})
                    on_start = None
                states = self._wait(job)
            except BaseException:
                job.cancel(check=False)
                raise
            finally:
                with self._lock:
                    self._jobs.pop(str(job.job_id), None)
            if states[str(job.job_id)] not in _REQUEUE or attempt >= self.max_requeue:
                return self._result(spec, job, states, attempt, submitted_at)
            old, job, attempt = job, self._submit(spec), attempt + 1
            marker = self.folder / str(old.job_id) / REQUEUED_FILE
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({"job_id": str(job.job_id), "attempt": attempt}))

    def _executor(self) -> Any:
        """submitit's Slurm executor with this launcher's sbatch parameters."""
        executor = _submitit().SlurmExecutor(folder=self.folder / "%j", max_num_timeout=0)
        executor.update_parameters(**self.sbatch_parameters())
        return executor

    def sbatch_script(self) -> str:
        """The sbatch script a trial's job is submitted with, as submitit writes it (the job id
        left as ``%j``); nothing is submitted.

        Example:
            >>> script = Slurm(partition="gpu", setup=["module load cuda"]).sbatch_script()
            >>> [line for line in script.splitlines() if "partition" in line or "module" in line]
            ['#SBATCH --partition=gpu', 'module load cuda']
        """
        executor = self._executor()
        return executor._make_submission_file_text(executor._submitit_command_str, "preview")

    def _submit(self, spec: dict[str, Any]) -> Any:
        executor = self._executor()
        plan = {"world_size": self.world_size, "folder": str(self.folder.resolve()),
                "procs_per_task": self.nproc_per_node // self.tasks_per_node,
                "timeout_s": self.time_limit_min * 60}
        try:
            job = executor.submit(job_main, json.dumps(spec), json.dumps(plan))
        except (OSError, subprocess.SubprocessError) as err:  # sbatch missing or refused
            raise LaunchError(f"sbatch could not submit the trial: {err}",
                              hint="check the partition, account, qos and limits with sinfo; "
                                   "SLURM_CONF must name the cluster's config") from None
        with self._lock:
            self._jobs[str(job.job_id)] = job
        return job

    def _wait(self, job: Any) -> dict[str, str]:
        """Poll ``sacct`` until the job has ended; its lines' states, by job or step id."""
        job_id = str(job.job_id)
        last_answer = time.monotonic()
        while True:
            states = sacct_states(job_id)
            if states is None or job_id not in states:
                if time.monotonic() - last_answer > _SACCT_PATIENCE_S:
                    raise LaunchError(
                        f"sacct gave no state of Slurm job {job_id} for {_SACCT_PATIENCE_S:.0f} "
                        "s", hint="the cluster needs accounting (slurmdbd); check `sacct -j "
                        f"{job_id}` and that SLURM_CONF names the cluster's config")
            elif states[job_id] not in _RUNNING:
                return states
            else:
                last_answer = time.monotonic()
            time.sleep(self.poll_s)

    def _result(self, spec: dict[str, Any], job: Any, states: dict[str, str], attempt: int,
                submitted_at: float | None) -> TrialResult:
        from ..trials import TrialResult, failure_result

        job_id = str(job.job_id)
        state = states[job_id]
        record: dict[str, Any] = {"job_id": job_id, "state": state, "steps": states,
                                  "attempts": attempt + 1, "attached": submitted_at is None,
                                  "stdout": str(job.paths.stdout),
                                  "stderr": str(job.paths.stderr)}
        wall_s = 0.0 if submitted_at is None else time.time() - submitted_at

        def failed(status: str, why: str) -> TrialResult:
            return failure_result(spec, status, f"{why}:\n{log_tail(job)}", wall_s=wall_s,
                                  hardware={"device": spec.get("device") or "cpu",
                                            "slurm": record})

        if "OUT_OF_MEMORY" in states.values():
            return failed("oom", f"Slurm job {job_id} ran out of memory (mem_gib = "
                          f"{self.mem_gib})")
        if state == "FAILED":
            why = missed_oom(last_stderr(job), sacct_states(job_id, "ExitCode") or {})
            if why:
                record["oom_evidence"] = why
                return failed("oom", f"Slurm job {job_id} ran out of memory (mem_gib = "
                              f"{self.mem_gib}); Slurm recorded FAILED, but {why}")
        if state == "TIMEOUT":
            return failed("timeout", f"Slurm job {job_id} passed its time limit of "
                          f"{self.time_limit_min} min")
        if state != "COMPLETED":
            return failed("failed", f"Slurm job {job_id} ended {state}")
        path = self.folder / job_id / RESULT_FILE
        try:
            result = TrialResult.from_json(path.read_text())
        except (OSError, ValueError, TypeError, KeyError) as err:
            return failed("failed", f"Slurm job {job_id} completed without a result in {path} "
                          f"({err})")
        stamps = dict(result.hardware.get("slurm") or {})
        if stamps and submitted_at is not None:
            record["submit_to_start_s"] = stamps["job_started_at"] - submitted_at
        if stamps:
            record["end_to_result_s"] = time.time() - stamps["trial_ended_at"]
        return dataclasses.replace(result, hardware={**result.hardware,
                                                     "slurm": {**stamps, **record}})
