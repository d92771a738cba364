"""The measurement policy: how long a trial is timed, in how many fresh processes, and how their
figures are combined. One home for the rule the demo, ``launch.Repeated``'s defaults and the
benchmarks all read; the measurements behind each figure are in ``docs/results.md``.

* :data:`MEASURE`: :class:`~cubicml_lab.timing.MeasureOptions` overrides. 6 s of timed steps
  (``max_time_s``, seconds): most trials stop earlier, at the 1.5% CI target
  (``target_rel_ci``), and a budget of 3 s left more than half of the demo's trials at the
  budget, with a wider CI and a lower rank correlation. The warm-up takes ``MeasureOptions``'
  default, half of ``max_time_s`` at most.
* :data:`PROCESSES`: fresh processes per trial (2), each with the whole budget
  (:data:`SHARE_BUDGET` False). A process has a speed level of its own that timing longer in it
  does not average away; a shared budget leaves each process too few steps of a 0.1-0.4-s step.
* :data:`COMBINE`: how a trial combines its processes (``Repeated``'s ``keep``):
  ``"drift_fit"``, every process's raw figure corrected at the drift slope they show together
  (:func:`~cubicml_lab.hardware.drift.own_drift_fit`), its prior's mean pooled over the
  campaign's earlier trials of the same workload and drift reference. Keeping the fastest
  process kept the one whose reference read slowest, corrected most, also for a configuration
  that feels less of the machine's moves.

* :func:`losing_step_s`: when a trial of a campaign run with ``early_stop`` is stopped: its
  step slower, for sure, than what would tie the best so far less a margin
  (:func:`early_stop_margin`: 10% on the CPU, 3% on CUDA).

To compare a change to these: edit the line, then ``benchmarks/ab_revisions.py --base HEAD
--demo 5``. Importing this module imports nothing of the lab's.

Example:
    >>> from cubicml_lab.timing.policy import COMBINE, MEASURE, PROCESSES, SHARE_BUDGET
    >>> MEASURE, PROCESSES, SHARE_BUDGET, COMBINE
    ({'max_time_s': 6.0}, 2, False, 'drift_fit')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["COMBINE", "EARLY_STOP_MARGIN", "EARLY_STOP_MARGIN_CUDA", "MEASURE", "PROCESSES",
           "SHARE_BUDGET", "early_stop_margin", "losing_step_s"]

#: ``MeasureOptions`` overrides of a trial: ``max_time_s`` seconds of timed steps.
MEASURE: dict[str, Any] = {"max_time_s": 6.0}
#: Fresh processes per trial (``launch.Repeated(processes=)``).
PROCESSES = 2
#: Whether the processes share the timing budget (False: each has all of it).
SHARE_BUDGET = False
#: How the processes' figures are combined (``launch.Repeated(keep=)``).
COMBINE = "drift_fit"


#: How far below the best so far a trial's best case must be before it is stopped, on the CPU:
#: the best is a drift-corrected figure and the trial's windows are raw, and on a drifting
#: machine one configuration's figures spread by up to ~7% between processes (a 2-core VM:
#: ``benchmarks/ab_revisions.py``'s module doc), so a trial is stopped only when even 10%
#: more speed would not make it the best.
EARLY_STOP_MARGIN = 0.10
#: The same on CUDA: fresh-process repeats of one configuration spread 0.0-0.7% on one H100
#: and 0.2-2.0% on one H200 (``data/gpu_repeatability_*.json``, nothing drift-corrected), so
#: 3% covers what separates two processes of one configuration there.
EARLY_STOP_MARGIN_CUDA = 0.03


def early_stop_margin(device: str | None) -> float:
    """The margin (:data:`EARLY_STOP_MARGIN`, :data:`EARLY_STOP_MARGIN_CUDA`) by which a
    trial on ``device`` must lose before it is stopped, by default.

    Example:
        >>> early_stop_margin("cuda:0"), early_stop_margin("cpu")
        (0.03, 0.1)
    """
    return EARLY_STOP_MARGIN_CUDA if str(device or "cpu").startswith("cuda") \
        else EARLY_STOP_MARGIN


def losing_step_s(beat: Any, units_per_step: float, units: str) -> float | None:
    """The step time above which a trial cannot beat ``beat`` (``{"objective", "value",
    "direction", "margin"}``: the campaign's best so far, and how far a trial must lose,
    default :data:`EARLY_STOP_MARGIN`); None where
    there is nothing to beat or the objective is not a step time or a rate of the workload's
    units (``throughput``, ``<units>_per_s``: ``units_per_step / step_time``).

    Example:
        >>> losing_step_s({"objective": "throughput", "value": 100.0}, 50.0, "tokens")
        0.5555555555555556
        >>> losing_step_s({"objective": "step_time_s", "value": 2.0, "direction": "minimize"},
        ...               50.0, "tokens")
        2.2
        >>> losing_step_s({"objective": "throughput", "value": 100.0, "margin": 0.03}, 50.0,
        ...               "tokens")
        0.5154639175257731
        >>> losing_step_s({"objective": "mfu", "value": 0.4}, 50.0, "tokens") is None
        True
    """
    if not isinstance(beat, Mapping):
        return None
    value, objective = beat.get("value"), beat.get("objective")
    direction = beat.get("direction", "maximize")
    margin = beat.get("margin", EARLY_STOP_MARGIN)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) \
            or not 0 <= margin < 0.5:
        margin = EARLY_STOP_MARGIN
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value < math.inf:
        return None
    if direction == "maximize" and objective in ("throughput", f"{units}_per_s") \
            and units_per_step > 0:
        return float(units_per_step) / (value * (1.0 - margin))
    if direction == "minimize" and objective == "step_time_s":
        return float(value) * (1.0 + margin)
    return None
