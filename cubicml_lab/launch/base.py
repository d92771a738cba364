"""The launcher interface: where and how one trial runs.

A :class:`Launcher` takes a trial *spec* (a JSON-able dict naming the workload, its config, the
device and the measurement options) and returns a :class:`~cubicml_lab.trials.TrialResult`.
It blocks until the trial is done, and every process it starts dies with the process that called
it: a campaign killed at any moment leaves no trial running and no temporary folder behind. A
trial that fails, runs out of memory or times out is data, not an exception: it comes back as a
result whose ``status`` says so. A launcher raises only when it cannot start the trial at all
(:class:`~cubicml_lab.errors.LaunchError`) or when the spec or its own options are invalid
(:class:`~cubicml_lab.errors.ConfigError`).

The spec, shared by every launcher and by ``python -m cubicml_lab.launch.worker``::

    {"workload": "gpt",                      # name for cubicml_lab.workloads.get
     "config": {"d_model": 128},             # knobs; unspecified ones take the defaults
     "device": "cpu",                        # "cpu", "cuda", "cuda:1", ...
     "measure": {"max_time_s": 1.0},         # optional MeasureOptions fields
     "command": {...}}                       # a user's command (Command.to_spec()), optional

Limits every launcher checks its sizes against when it is built (:func:`local_process_limit`,
:data:`MAX_PROCS_PER_NODE`, :data:`MAX_NODES`), and :meth:`Launcher.recipe`: what a launcher runs
besides the lab's own trial worker (an interpreter of its own, environment variables, Slurm setup
lines and sbatch options), which a campaign file may name only with the user's consent (see
``docs/threat-model.md``).

This module imports no torch.
"""

from __future__ import annotations

import abc
import glob
import json
import os
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._params import brief
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..trials import TrialResult

__all__ = ["MAX_NODES", "MAX_PROCS_PER_NODE", "Launcher", "check_spec", "local_process_limit",
           "recipe_lines", "sbatch_line"]

#: Most processes one node may run for a trial: a generous cap for a cluster's largest nodes.
MAX_PROCS_PER_NODE = 1024
#: Most nodes one trial may span.
MAX_NODES = 4096

_SPEC_KEYS = ("workload", "config", "device", "measure", "command", "beat")


def check_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Check the shape of a trial spec and return a plain-JSON copy of it.

    Only the shape is checked here (keys, types, JSON-ability); whether the workload exists and its
    knobs are known is the workload's business (:func:`cubicml_lab.workloads.get`).

    Args:
        spec: ``{"workload": str, "config": dict, "device": str, "measure": dict}``; ``config``,
            ``device`` and ``measure`` are optional.

    Returns:
        A deep copy made through JSON, so the launcher never shares mutable state with the caller.

    Raises:
        ConfigError: A key is unknown, ``workload`` is missing, a value has the wrong type, or the
            spec cannot be written as JSON.

    Example:
        >>> check_spec({"workload": "gpt", "config": {"d_model": 64}})
        {'workload': 'gpt', 'config': {'d_model': 64}}
    """
    if not isinstance(spec, dict):
        raise ConfigError(
            f"spec must be a dict, got {type(spec).__name__}",
            hint='pass {"workload": "gpt", "config": {...}, "device": "cpu"}',
        )
    unknown = sorted(set(spec) - set(_SPEC_KEYS))
    if unknown:
        raise ConfigError(
            f"spec has unknown key(s) {unknown}", hint=f"allowed keys: {list(_SPEC_KEYS)}"
        )
    if not isinstance(spec.get("workload"), str) or not spec["workload"]:
        raise ConfigError(
            f"spec['workload'] must be a non-empty string, got {brief(spec.get('workload'))}",
            hint="name a registered workload, e.g. 'gpt'",
        )
    for key, kind in (("config", dict), ("device", str), ("measure", dict), ("command", dict),
                      ("beat", dict)):
        if key in spec and spec[key] is not None and not isinstance(spec[key], kind):
            raise ConfigError(
                f"spec[{key!r}] must be a {kind.__name__}, got {type(spec[key]).__name__}",
                hint=f"pass spec[{key!r}] as a {kind.__name__} or leave it out",
            )
    try:
        copied: dict[str, Any] = json.loads(json.dumps(spec, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"spec cannot be written as JSON: {err}",
            hint="configs hold only str, int, float, bool, None, lists and dicts",
        ) from None
    return copied


class Launcher(abc.ABC):
    """Runs one trial somewhere and returns its :class:`~cubicml_lab.trials.TrialResult`.

    Subclasses implement :meth:`run` and :meth:`describe`. ``describe()`` is stored with each
    campaign, so it must be plain JSON and say enough to rebuild an equivalent launcher.
    """

    @abc.abstractmethod
    def run(self, spec: dict[str, Any], *,
            on_start: Callable[[dict[str, Any]], None] | None = None) -> TrialResult:
        """Run one trial and block until it is done.

        Args:
            spec: The trial spec (see the module docstring).
            on_start: Called once the trial's process exists and before the trial runs, with
                its record (:func:`~cubicml_lab.launch.process.trial_record`: host, pid and
                start time of the process and of its owner, this process). A campaign stores
                it with the running trial, so that a later campaign can find and end a trial
                whose campaign died. If it raises, the trial does not run and the exception
                propagates. A launcher that runs the trial in several processes one after
                another (:class:`~cubicml_lab.launch.Repeated`) calls it for each, so that
                the stored record follows the live process.

        Returns:
            The trial's result; failures, OOM and timeouts are statuses, not exceptions.

        Raises:
            ConfigError: The spec or the launcher's options are invalid.
            LaunchError: The trial could not be started at all.
        """

    @property
    def world_size(self) -> int:
        """Processes (devices) each trial runs on; 1 unless the launcher starts a job."""
        return 1

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """Return ``{"kind": <name>, **options}`` as plain JSON, for the campaign record."""

    def __repr__(self) -> str:
        options = {k: v for k, v in self.describe().items() if k != "kind"}
        args = ", ".join(f"{k}={v!r}" for k, v in options.items())
        return f"{type(self).__name__}({args})"

    def recipe(self) -> list[str]:
        """What this launcher runs besides the lab's own trial worker, one line each: an
        interpreter of its own, environment variables with their values, Slurm setup lines and
        sbatch options. Empty for a launcher with default options. A campaign file that names
        any of these is run only with the user's consent (``cubicml-lab run --allow-programs``).

        Example:
            >>> from cubicml_lab.launch import Subprocess
            >>> Subprocess(env={"OMP_NUM_THREADS": "2"}).recipe()
            ['launcher.env: OMP_NUM_THREADS=2']
        """
        return recipe_lines(self.describe())


def recipe_lines(description: Mapping[str, Any], where: str = "launcher") -> list[str]:
    """The recipe parts of a launcher description (``Launcher.describe()``, nested launchers
    included), one line each, prefixed by where they sit (``launcher.env``, ...)."""
    lines = []
    if description.get("python") is not None:
        lines.append(f"{where}.python: runs the trials with the interpreter "
                     f"{shlex.quote(str(description['python']))}")
    for key, value in (description.get("env") or {}).items():
        lines.append(f"{where}.env: {key}={shlex.quote(str(value))}")
    for key, value in (description.get("extra_sbatch") or {}).items():
        lines.append(f"{where}.extra_sbatch: {sbatch_line(key, value)}")
    for line in description.get("setup") or []:
        lines.append(f"{where}.setup: runs the shell line {line}")
    inner = description.get("launcher")
    if isinstance(inner, Mapping):
        lines += recipe_lines(inner, f"{where}.launcher")
    return lines


def sbatch_line(key: str, value: Any) -> str:
    """The ``#SBATCH`` line an option becomes, as submitit writes it (``True``: a bare flag;
    otherwise the value as one quoted word)."""
    flag = f"#SBATCH --{key.replace('_', '-')}"
    return flag if value is True else f"{flag}={shlex.quote(str(value))}"


def _gpus_visible() -> int:
    """GPUs this process may see, without importing torch: ``CUDA_VISIBLE_DEVICES`` when set,
    else the NVIDIA device files."""
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        return len([d for d in named.split(",") if d.strip() and not d.strip().startswith("-")])
    return len(glob.glob("/dev/nvidia[0-9]*"))


def local_process_limit() -> tuple[int, str]:
    """Most processes a trial may start on this machine, and why, for a size check's message:
    the larger of 8, four per CPU core this process may use, and one per visible GPU, at most
    :data:`MAX_PROCS_PER_NODE`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    gpus = _gpus_visible()
    limit = min(MAX_PROCS_PER_NODE, max(8, 4 * cores, gpus))
    return limit, (f"this machine lets this process use {cores} CPU core(s) and shows {gpus} "
                   f"GPU(s): a job on it runs at most max(8, 4 per core, 1 per GPU) = {limit} "
                   "processes")
