"""What a campaign checks when it is built: its device, measure options, budget and parallel.

Each check names the field and the fix in its :class:`~cubicml_lab.errors.ConfigError`, in the
cell that built the campaign, not at its first trial. A launcher that runs trials on other
machines (Slurm) is told apart by its description (:func:`runs_remotely`): its device is not
this machine's, and its trials in flight are bounded by :data:`MAX_PARALLEL_REMOTE`.

Example:
    >>> from cubicml_lab.campaign.checks import check_device
    >>> check_device("cpu", launcher=None)
    'cpu'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .._bounds import check_count
from .._params import brief
from ..errors import ConfigError

__all__ = ["MAX_BUDGET", "MAX_PARALLEL_REMOTE", "check_device", "check_measure_options",
           "check_run_size", "runs_remotely"]

#: Most trials one campaign may hold (``budget``): far more than any search measures.
MAX_BUDGET = 1_000_000
#: Most trials in flight at once (``parallel``) where the launcher runs trials elsewhere (Slurm).
MAX_PARALLEL_REMOTE = 1024
_DEVICE = re.compile(r"^(cpu|cuda(:[0-9]{1,3})?)$")


def runs_remotely(launcher: Any) -> bool:
    """True for a launcher whose trials run on other machines (Slurm)."""
    try:
        return launcher.describe().get("kind") == "slurm"
    except Exception:  # noqa: BLE001 - a user's launcher: assume it runs here
        return False


def check_device(device: object, launcher: Any) -> str:
    """``device`` if it names a device trials can use: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``,
    and, where the launcher runs trials on this machine, one this machine has.

    Raises:
        ConfigError: Naming ``device``, what this machine has and what to pass instead.
    """
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise ConfigError(f"device = {brief(device)} is not a device trials can run on",
                          hint="pass device='cpu', 'cuda' or 'cuda:N'")
    if device == "cpu" or runs_remotely(launcher):
        return device
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        count = 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        raise ConfigError(f"device = {device!r}, but this machine has {count} usable CUDA "
                          "device(s), and the launcher runs trials here",
                          hint="pass device='cpu', or run on a GPU machine (e.g. "
                               "launcher=cml.launch.Slurm(...))")
    return device


def check_measure_options(options: object) -> dict[str, Any]:
    """``options`` as a dict of :class:`~cubicml_lab.timing.MeasureOptions` fields, checked by
    the options' own rules (unknown keys, types, ranges).

    Raises:
        ConfigError: Naming ``measure_options`` and the field.
    """
    from ..errors import MeasurementError
    from ..timing import MeasureOptions

    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"measure_options must be a dict, got {type(options).__name__}",
                          hint='e.g. measure_options={"max_time_s": 5}')
    try:
        MeasureOptions.from_dict(options)
    except MeasurementError as err:
        raise ConfigError(f"measure_options: {err.message}", hint=err.hint or "") from None
    except TypeError as err:
        raise ConfigError(f"measure_options: {err}", hint="pass field names as strings") from None
    return dict(options)


def check_run_size(field: str, value: object, launcher: Any) -> int:
    """``budget`` or ``parallel`` as a checked int: a budget up to :data:`MAX_BUDGET`; trials in
    flight up to what the machine runs at once (or :data:`MAX_PARALLEL_REMOTE` on Slurm)."""
    if field == "budget":
        return check_count("budget", value, high=MAX_BUDGET, error=ConfigError,
                           why="more trials than any search measures")
    if runs_remotely(launcher):
        return check_count("parallel", value, high=MAX_PARALLEL_REMOTE, error=ConfigError,
                           why="trials in flight on a cluster, one thread each here")
    from ..launch.base import local_process_limit

    high, why = local_process_limit()
    return check_count("parallel", value, high=high, error=ConfigError, why=why)


def check_device_hours(value: object) -> float:
    """``budget_device_hours`` as a float: a finite number > 0."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value < math.inf:
        raise ConfigError(f"budget_device_hours = {brief(value)} is not a number > 0",
                          hint="device-hours the campaign may spend, e.g. "
                               "run(budget_device_hours=2.0); on the CPU 0.05 is 3 minutes")
    return float(value)


def check_early_stop(value: object, device: str | None) -> float | None:
    """``run(early_stop=...)`` as the margin a trial must lose by before it is stopped, or None
    (off): True takes the device's default (``timing.policy.early_stop_margin``), a number in
    (0, 0.5) is the margin itself."""
    if value is False:
        return None
    if value is True:
        from ..timing.policy import early_stop_margin

        return early_stop_margin(device)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 0.5:
        return float(value)
    raise ConfigError(f"early_stop = {brief(value)} is not True, False or a margin in (0, 0.5)",
                      hint="run(early_stop=True) stops trials that cannot win by the device's "
                           "margin; early_stop=0.05 by 5%")
