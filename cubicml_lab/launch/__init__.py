"""Where a trial runs: in this process or in a fresh interpreter; and ``measure()``, one trial.

A launcher turns a trial spec into a :class:`~cubicml_lab.trials.TrialResult`. Swapping the
launcher is how the same notebook moves from a laptop to a GPU box or a cluster:

* :class:`InProcess` (the default): calls the workload here. Fast; no timeout, no isolation, and
  peak memory is the process's lifetime high-water mark.
* :class:`Subprocess`: a fresh ``python -m cubicml_lab.launch.worker`` per trial, in its own process
  group, with a timeout and an optional address-space cap; honest per-trial peak memory.
* :class:`Torchrun`: the same, as a multi-process job under ``torchrun`` (gloo on CPU, NCCL on
  CUDA; several nodes through a static rendezvous); the workload parallelises itself.
* :class:`LocalPool`: one machine kept busy, ``floor(devices / devices_per_trial)`` trials at
  once, each pinned to its own cores or GPUs (a ``Subprocess`` or ``Torchrun`` per slot).

* :class:`Slurm`: one Slurm job per trial through submitit (imported only when a trial is
  submitted); Slurm's end states (``OUT_OF_MEMORY``, ``TIMEOUT``, ...) become statuses.
* :class:`Repeated`: each trial in several fresh processes of another launcher, the timing
  budget shared among them and their figures combined: a process's own speed level averages.

Each implements :meth:`Launcher.run` and :meth:`Launcher.describe`.

Every trial process dies with the process that launched it: the subprocess launchers run each
trial under a guard (:mod:`~cubicml_lab.launch.guarded`) that ends the trial and removes its
folder the moment its caller dies, SIGKILL included. :mod:`~cubicml_lab.launch.process` names a
trial process by pid *and* start time, so that a resumed campaign can end what a dead one left
without ever signalling a recycled pid, and sweeps the folders of dead campaigns.

:func:`measure_repeats` measures several configurations several times, interleaved, and
:func:`repeat_spread` says how far the repeats spread: the noise a predictor must live with.

Importing this package imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, MeasurementError
from .base import Launcher
from .inprocess import InProcess
from .pool import LocalPool
from .repeated import Repeated
from .slurm import Slurm
from .subprocess import Subprocess
from .torchrun import Torchrun

if TYPE_CHECKING:
    import pandas as pd

    from ..trials import TrialResult
    from ..workloads import Command

__all__ = ["InProcess", "Launcher", "LocalPool", "Repeated", "Slurm", "Subprocess", "Torchrun",
           "measure", "measure_repeats", "repeat_spread"]


def measure(
    workload: str | Command,
    config: dict[str, Any] | None = None,
    *,
    launcher: Launcher | None = None,
    device: str = "cpu",
    measure_options: dict[str, Any] | None = None,
) -> TrialResult:
    """Measure the training speed of one workload configuration: one trial, one result.

    The config is checked against the workload's knobs *before* anything is launched, so a typo
    fails in the cell that made it. Unspecified knobs take the workload's defaults
    (``cml.workloads.get(workload).default_config()``).

    Args:
        workload: Registered workload name, e.g. ``"gpt"``, or a user's
            :class:`~cubicml_lab.workloads.Command` (``config`` fills its placeholders).
        config: Knob values, e.g. ``{"d_model": 128, "n_layers": 2}``; ``None`` for all defaults.
        launcher: Where the trial runs; default :class:`InProcess`.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        measure_options: Fields of the measurement options (e.g. ``{"max_time_s": 1,
            "min_steps": 3}``); ``None`` for the defaults.

    Returns:
        The trial's :class:`~cubicml_lab.trials.TrialResult`. A trial that fails, runs out of
        memory or times out is a result with that ``status``, not an exception.

    Raises:
        ConfigError: Unknown workload, unknown knob or invalid value, unknown or invalid measure
            option (the message names it), or a launcher that is not a :class:`Launcher`.
        LaunchError: The launcher could not start the trial at all.

    Example:
        >>> import cubicml_lab as cml
        >>> res = cml.measure("gpt", {"d_model": 128, "n_layers": 2},      # doctest: +SKIP
        ...                   launcher=cml.launch.Subprocess(timeout_s=120))
        >>> res.status                                                       # doctest: +SKIP
        'ok'
        >>> res.metrics["tokens_per_s"], res.metrics["step_time_s"]          # doctest: +SKIP
        (48211.3, 0.0106)
    """
    from ..timing import MeasureOptions
    from ..workloads import Command, check_reachable, get

    if launcher is None:
        launcher = InProcess()
    elif not isinstance(launcher, Launcher):
        raise ConfigError(
            f"launcher must be a cubicml_lab.launch.Launcher, got {type(launcher).__name__}",
            hint="pass cml.launch.InProcess() or cml.launch.Subprocess(...)",
        )
    config = dict(config or {})
    command = workload if isinstance(workload, Command) else None
    spec_workload = command or get(str(workload))
    if command is None:
        check_reachable(spec_workload.name, launcher)  # a notebook's object: InProcess only
    spec_workload.resolve(config)  # raises ConfigError naming an unknown knob or a bad value
    spec_workload.check_world(config, launcher.world_size)  # parallel degrees vs processes
    try:
        MeasureOptions.from_dict(measure_options)
    except MeasurementError as err:
        raise ConfigError(f"measure_options: {err.message}", hint=err.hint) from None
    spec: dict[str, Any] = {"workload": workload if command is None else command.name,
                            "config": config, "device": device}
    if command is not None:
        spec["command"] = command.to_spec()
    if measure_options:
        spec["measure"] = dict(measure_options)
    return launcher.run(spec)


def measure_repeats(
    workload: str,
    configs: list[dict[str, Any]],
    *,
    repeats: int = 3,
    launcher: Launcher | None = None,
    device: str = "cpu",
    measure_options: dict[str, Any] | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Measure each configuration ``repeats`` times, interleaved, and return every result.

    Interleaving (config 1, 2, ..., then again) makes a slow drift of the machine hit every
    configuration alike instead of biasing whichever ran last. Each measurement is one
    :func:`measure` call (use ``launcher=Subprocess()`` for a fresh process each time: a
    repeat then includes the process-to-process variation too).

    Args:
        workload: Registered workload name.
        configs: Knob values of each configuration (checked before anything runs).
        repeats: Measurements per configuration (>= 1).
        launcher, device, measure_options: As :func:`measure`.
        progress: Show a tqdm bar.

    Returns:
        One row per measurement: ``config`` (its index), ``repeat``, ``status``, the knob
        values, and every metric (``step_time_s``, ``tokens_per_s`` or ``samples_per_s``,
        ...). :func:`repeat_spread` sums it up.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ..workloads import get

    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"repeats = {repeats!r} must be an int >= 1", hint="e.g. repeats=3")
    if not isinstance(configs, (list, tuple)) or not configs:
        raise ConfigError("configs must be a non-empty list of config dicts",
                          hint='e.g. [{"micro_batch": 8}, {"micro_batch": 16}]')
    for cfg in configs:  # fail in the cell that wrote the typo, before the first measurement
        get(workload).resolve(dict(cfg))
    rows = []
    with tqdm(total=repeats * len(configs), unit="measurement", disable=not progress) as bar:
        for r in range(repeats):
            for i, cfg in enumerate(configs):
                res = measure(workload, dict(cfg), launcher=launcher, device=device,
                              measure_options=measure_options)
                rows.append({"config": i, "repeat": r, "status": res.status, **cfg,
                             **res.metrics})
                bar.update()
    return pd.DataFrame(rows)


def repeat_spread(df: pd.DataFrame, metric: str = "step_time_s") -> pd.DataFrame:
    """Per configuration of :func:`measure_repeats` output: median, spread and count of ok runs.

    The spread is ``(max - min) / median`` in percent: with 5 repeats, the range a sixth
    measurement would likely fall in.

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"config": [0, 0, 0], "status": ["ok"] * 3,
        ...                    "step_time_s": [1.0, 1.02, 0.98]})
        >>> round(float(repeat_spread(df)["spread_pct"].iloc[0]), 1)
        4.0
    """
    if metric not in df:
        raise ConfigError(f"no column {metric!r} in the measurements",
                          hint=f"columns: {', '.join(map(str, df.columns))}")
    ok = df[df["status"] == "ok"]
    grouped = ok.groupby("config")[metric]
    out = grouped.agg(["median", "min", "max", "count"])
    out["spread_pct"] = 100 * (out["max"] - out["min"]) / out["median"]
    return out.rename(columns={"count": "ok_runs"})
