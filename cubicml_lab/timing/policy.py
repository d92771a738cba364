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

To compare a change to these: edit the line, then ``benchmarks/ab_revisions.py --base HEAD
--demo 5``. Importing this module imports nothing else.

Example:
    >>> from cubicml_lab.timing.policy import COMBINE, MEASURE, PROCESSES, SHARE_BUDGET
    >>> MEASURE, PROCESSES, SHARE_BUDGET, COMBINE
    ({'max_time_s': 6.0}, 2, False, 'drift_fit')
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMBINE", "MEASURE", "PROCESSES", "SHARE_BUDGET"]

#: ``MeasureOptions`` overrides of a trial: ``max_time_s`` seconds of timed steps.
MEASURE: dict[str, Any] = {"max_time_s": 6.0}
#: Fresh processes per trial (``launch.Repeated(processes=)``).
PROCESSES = 2
#: Whether the processes share the timing budget (False: each has all of it).
SHARE_BUDGET = False
#: How the processes' figures are combined (``launch.Repeated(keep=)``).
COMBINE = "drift_fit"
